//! The setup cache: after a successful setup script the container's filesystem is committed
//! as a local image, and a later run with the same key starts from it and skips the script.
//!
//! The key is SHA-256 over length-prefixed inputs: the base image's id (not its tag), the
//! scope (the repository: a cached image keeps files the setup made from one repository's
//! code, which another must never see), whether the setup had a network, the setup script's
//! text, and the path and contents of each key file (lockfiles and manifests at the root
//! by default, plus the repository's `setup_cache_key_files`).
//!
//! The cached image holds `/workspace/repo` as the setup left it, and the manifest of the
//! checkout the setup ran on ([`MANIFEST_FILE`]). A run that starts from it copies in only
//! the entries its own checkout has different (a file's contents or mode, a symlink's
//! target, an entry's kind), then deletes what its checkout no longer has
//! ([`delta_script`]); `.git` is replaced whole. The workspace is the new checkout plus what
//! the setup made inside it (`node_modules`, `.venv`, …), as a fresh setup would leave it:
//! a tracked file the setup edited keeps the edit while the checkouts agree on it, and
//! takes the new checkout's version when they do not. Files the two checkouts share are
//! not written again, which is most of the copy-in's time on a large repository. Images
//! from before the manifest was kept are cleaned whole ([`CLEAN_SCRIPT`]) and the checkout
//! copied in full.
//!
//! Images are named `kodx-setup:<first 32 hex digits of the key>` and labelled
//! ([`KEY_LABEL`]); only images with that label are ever removed. The last use of an image
//! is its last tag time: a hit tags it again.

use std::collections::HashMap;
use std::io::Read;
use std::path::Path;
use std::time::Duration;

use bollard::models::{ContainerConfig, ImageConfig};
use bollard::query_parameters::{
    ListContainersOptions, ListImagesOptions, RemoveImageOptions, TagImageOptions,
};
use bollard::Docker;
use globset::{GlobBuilder, GlobMatcher};
use sha2::{Digest, Sha256};

use super::archive::{Manifest, ManifestEntry};
use super::owner::{commit_named, image_config};
use super::{Result, SandboxError};

/// The repository name of cached images.
pub const IMAGE_REPO: &str = "kodx-setup";
/// Label every cached image carries: its full key. Eviction touches only these images.
pub const KEY_LABEL: &str = "kodx.setup-cache.key";
/// Label: the scope (repository) the image was made for.
pub const SCOPE_LABEL: &str = "kodx.setup-cache.scope";
/// Label: the id of the image the setup ran on.
pub const BASE_LABEL: &str = "kodx.setup-cache.base";
/// Label: when the image was made (Unix seconds).
pub const CREATED_LABEL: &str = "kodx.setup-cache.created";

/// In a cached image: deletes the files of the checkout the setup ran on.
pub const CLEAN_SCRIPT: &str = "/.kodx-setup/clean.sh";

/// In a cached image: the manifest of the checkout the setup ran on, `.git` left out
/// ([`Manifest::to_bytes`]). A run starting from the image copies in only what its own
/// checkout has different, and deletes what it no longer has ([`delta_script`]). Images
/// made before kodx kept it are cleaned whole ([`CLEAN_SCRIPT`]).
pub const MANIFEST_FILE: &str = "/.kodx-setup/manifest";

/// The most bytes of a cached image's manifest read back (past it, the run cleans the
/// image's checkout and copies its own whole).
pub const MAX_MANIFEST_BYTES: u64 = 128 << 20;

/// Key files used when the repository names none, at the repository's root.
pub const DEFAULT_KEY_FILES: &[&str] = &[
    "package.json",
    "package-lock.json",
    "npm-shrinkwrap.json",
    "yarn.lock",
    "pnpm-lock.yaml",
    "bun.lockb",
    "requirements*.txt",
    "constraints*.txt",
    "poetry.lock",
    "Pipfile",
    "Pipfile.lock",
    "pyproject.toml",
    "uv.lock",
    "setup.py",
    "setup.cfg",
    "Cargo.lock",
    "Cargo.toml",
    "rust-toolchain",
    "rust-toolchain.toml",
    "go.mod",
    "go.sum",
    "Gemfile",
    "Gemfile.lock",
    "composer.json",
    "composer.lock",
    "mix.lock",
    "pom.xml",
    "build.gradle",
    "build.gradle.kts",
    "gradle.lockfile",
    "Makefile",
    ".tool-versions",
    ".nvmrc",
    ".python-version",
];

/// At most this many `setup_cache_key_files` entries.
pub const MAX_KEY_PATTERNS: usize = 64;
/// At most this many files go into a key (over all patterns); past it the cache is off for
/// the run.
pub const MAX_KEY_FILES: usize = 1000;
/// Directory entries a pattern's wildcards may look at, in all.
const MAX_LISTED: usize = 20_000;

/// What the setup cache needs to know of a run ([`super::SandboxSpec::setup_cache`]).
#[derive(Debug, Clone, PartialEq)]
pub struct SetupCacheSpec {
    /// Who may share images: the repository (`owner/name`), or the local checkout's path.
    pub scope: String,
    /// Extra key files: paths or patterns (`*`, `?` within one path component) relative to
    /// the repository root.
    pub key_files: Vec<String>,
    /// Cached images kept at most (0: no bound).
    pub max_images: usize,
    /// Bytes of cached layers kept at most (0: no bound).
    pub max_bytes: u64,
}

impl SetupCacheSpec {
    pub fn new(scope: impl Into<String>) -> SetupCacheSpec {
        SetupCacheSpec {
            scope: scope.into(),
            key_files: Vec::new(),
            max_images: DEFAULT_MAX_IMAGES,
            max_bytes: DEFAULT_MAX_BYTES,
        }
    }
}

/// Default bound on cached images.
pub const DEFAULT_MAX_IMAGES: usize = 20;
/// Default bound on their bytes: 20 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 20 << 30;

/// Whether a run's setup came from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetupCacheUse {
    /// No cache for this run (turned off, or no setup script).
    Off,
    /// The setup script ran (and its result was offered to the cache).
    Miss,
    /// The run started from a cached image; the setup script did not run.
    Hit,
}

impl SetupCacheUse {
    pub fn as_str(self) -> &'static str {
        match self {
            SetupCacheUse::Off => "off",
            SetupCacheUse::Miss => "miss",
            SetupCacheUse::Hit => "hit",
        }
    }
}

/// How a sandbox's setup went: whether the cache served it, and how long the setup (the
/// script, or the cached image's cleaning) took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetupReport {
    pub cache: SetupCacheUse,
    pub took: Option<Duration>,
}

impl Default for SetupReport {
    fn default() -> Self {
        SetupReport {
            cache: SetupCacheUse::Off,
            took: None,
        }
    }
}

impl SetupReport {
    /// The run's timing phase: `setup`, or `setup (cached)` on a hit.
    pub fn phase(&self) -> &'static str {
        match self.cache {
            SetupCacheUse::Hit => "setup (cached)",
            _ => "setup",
        }
    }
}

/// Checks one `setup_cache_key_files` entry: relative, no `..`, no empty component, at most
/// 256 bytes, wildcards `*` and `?` only.
pub fn check_pattern(pattern: &str) -> std::result::Result<(), String> {
    if pattern.is_empty() || pattern.len() > 256 {
        return Err("must be a path of 1 to 256 characters".into());
    }
    if pattern.starts_with('/') {
        return Err(format!(
            "{pattern:?} must be relative to the repository root"
        ));
    }
    for part in pattern.split('/') {
        if part.is_empty() || part == "." || part == ".." {
            return Err(format!(
                "{pattern:?} may not have empty, \".\" or \"..\" components"
            ));
        }
        if part.contains("**") || part.contains(['[', ']', '{', '}', '\\']) {
            return Err(format!(
                "{pattern:?}: only the wildcards * and ? are supported, within one path component"
            ));
        }
    }
    Ok(())
}

/// Whether `name` matches the one-component `pattern` (`*` any run, `?` one character).
pub fn matches(pattern: &str, name: &str) -> bool {
    component(pattern).is_ok_and(|m| m.is_match(name))
}

/// The matcher of one pattern component, compiled once for all the names it is tried on:
/// `*` matches any run of characters, `?` one, and every other character itself (brackets,
/// braces and backslashes too). A pattern's components are matched against single names,
/// so whether `*` or `?` would match a `/` never arises; as before, they would.
///
/// `?` matches one byte: one character of an ASCII name, not a character of several bytes
/// in UTF-8.
fn component(pattern: &str) -> std::result::Result<GlobMatcher, String> {
    let mut glob = String::with_capacity(pattern.len());
    let mut chars = pattern.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            // A run of stars is one star: globset would read `**` as any directories.
            '*' => {
                glob.push('*');
                while chars.next_if_eq(&'*').is_some() {}
            }
            '?' => glob.push('?'),
            c => glob.push_str(&globset::escape(c.encode_utf8(&mut [0; 4]))),
        }
    }
    GlobBuilder::new(&glob)
        .literal_separator(false)
        .backslash_escape(false)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| format!("the pattern {pattern:?} cannot be used: {e}"))
}

/// One key file as it goes into the key.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyFile {
    pub path: String,
    /// SHA-256 of the contents (of the link text for a symlink, which is never followed).
    pub digest: [u8; 32],
}

/// The files under `root` the patterns name, sorted by path. Symlinks are hashed as their
/// target text, never followed; directories and missing paths are left out.
pub fn key_files(root: &Path, patterns: &[String]) -> Result<Vec<KeyFile>> {
    let mut found = std::collections::BTreeMap::new();
    let mut listed = 0usize;
    for pattern in patterns {
        check_pattern(pattern).map_err(SandboxError::InvalidInput)?;
        let mut candidates = vec![String::new()];
        let parts: Vec<&str> = pattern.split('/').collect();
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let matcher = if part.contains(['*', '?']) {
                Some(component(part).map_err(SandboxError::InvalidInput)?)
            } else {
                None
            };
            let mut next = Vec::new();
            for dir in &candidates {
                let join = |name: &str| {
                    if dir.is_empty() {
                        name.to_string()
                    } else {
                        format!("{dir}/{name}")
                    }
                };
                let Some(matcher) = &matcher else {
                    next.push(join(part));
                    continue;
                };
                let Ok(entries) = std::fs::read_dir(root.join(dir)) else {
                    continue;
                };
                for entry in entries.flatten() {
                    listed += 1;
                    if listed > MAX_LISTED {
                        return Err(SandboxError::InvalidInput(format!(
                            "setup_cache_key_files: the patterns look at more than {MAX_LISTED} names; name the files more precisely"
                        )));
                    }
                    let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                        continue;
                    };
                    // A wildcard never descends into a symlinked directory.
                    let is_dir = entry.file_type().map(|t| t.is_dir()).unwrap_or(false);
                    if matcher.is_match(&name) && (last || is_dir) {
                        next.push(join(&name));
                    }
                }
            }
            candidates = next;
        }
        for rel in candidates {
            if found.contains_key(&rel) {
                continue;
            }
            let path = root.join(&rel);
            // Only real directories are walked: a symlink on the way is not followed.
            if !rel
                .rsplit_once('/')
                .map(|(parent, _)| real_dir(root, parent))
                .unwrap_or(true)
            {
                continue;
            }
            let Ok(meta) = std::fs::symlink_metadata(&path) else {
                continue;
            };
            let digest = if meta.file_type().is_symlink() {
                let target = std::fs::read_link(&path)
                    .map_err(|e| SandboxError::io(format!("reading {}", path.display()), e))?;
                Sha256::digest(target.as_os_str().as_encoded_bytes()).into()
            } else if meta.is_file() {
                hash_file(&path)?
            } else {
                continue;
            };
            found.insert(rel.clone(), KeyFile { path: rel, digest });
            if found.len() > MAX_KEY_FILES {
                return Err(SandboxError::InvalidInput(format!(
                    "setup_cache_key_files: more than {MAX_KEY_FILES} files match; name fewer"
                )));
            }
        }
    }
    Ok(found.into_values().collect())
}

/// Whether `dir` holds a clone with nothing checked out (only `.git`): its files are in its
/// git objects, and the copy-in takes them from there.
pub fn only_git(dir: &Path) -> bool {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return false;
    };
    let names: Vec<_> = entries.flatten().map(|e| e.file_name()).collect();
    names.len() == 1 && names[0] == ".git"
}

/// As [`key_files`], from the tree of the commit `HEAD` points at in the repository at
/// `repo_dir` (a clone whose files are not on disk). A symlink is its target text, as on
/// disk; submodules and trees are left out.
pub fn key_files_at_head(repo_dir: &Path, patterns: &[String]) -> Result<Vec<KeyFile>> {
    let failed = |e: git2::Error| {
        SandboxError::InvalidInput(format!(
            "reading the key files from {}: {}",
            repo_dir.display(),
            e.message()
        ))
    };
    let repo = git2::Repository::open(repo_dir).map_err(failed)?;
    let tree = repo.head().and_then(|h| h.peel_to_tree()).map_err(failed)?;
    let mut found = std::collections::BTreeMap::new();
    let mut listed = 0usize;
    for pattern in patterns {
        check_pattern(pattern).map_err(SandboxError::InvalidInput)?;
        // (path, tree id) of the directories matched so far.
        let mut dirs = vec![(String::new(), tree.id())];
        let parts: Vec<&str> = pattern.split('/').collect();
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let matcher = component(part).map_err(SandboxError::InvalidInput)?;
            let mut next = Vec::new();
            for (dir, id) in &dirs {
                let t = repo.find_tree(*id).map_err(failed)?;
                for entry in t.iter() {
                    listed += 1;
                    if listed > MAX_LISTED {
                        return Err(SandboxError::InvalidInput(format!(
                            "setup_cache_key_files: the patterns look at more than {MAX_LISTED} names; name the files more precisely"
                        )));
                    }
                    let Ok(name) = entry.name() else { continue };
                    if !matcher.is_match(name) {
                        continue;
                    }
                    let rel = if dir.is_empty() {
                        name.to_string()
                    } else {
                        format!("{dir}/{name}")
                    };
                    let mode = entry.filemode();
                    if !last {
                        if mode == 0o040000 {
                            next.push((rel, entry.id()));
                        }
                    } else if (mode & 0o170000 == 0o100000 || mode == 0o120000)
                        && !found.contains_key(&rel)
                    {
                        let blob = repo.find_blob(entry.id()).map_err(failed)?;
                        let digest: [u8; 32] = Sha256::digest(blob.content()).into();
                        found.insert(rel.clone(), KeyFile { path: rel, digest });
                        if found.len() > MAX_KEY_FILES {
                            return Err(SandboxError::InvalidInput(format!(
                                "setup_cache_key_files: more than {MAX_KEY_FILES} files match; name fewer"
                            )));
                        }
                    }
                }
            }
            dirs = next;
        }
    }
    Ok(found.into_values().collect())
}

/// Whether every component of `rel` (a directory under `root`) is a real directory.
fn real_dir(root: &Path, rel: &str) -> bool {
    let mut path = root.to_path_buf();
    rel.split('/').all(|part| {
        path.push(part);
        std::fs::symlink_metadata(&path).is_ok_and(|m| m.is_dir())
    })
}

fn hash_file(path: &Path) -> Result<[u8; 32]> {
    let io = |e| SandboxError::io(format!("reading {}", path.display()), e);
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher.finalize().into())
}

/// What a setup's result depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct KeyInputs<'a> {
    /// The base image's id (`sha256:…`).
    pub image_id: &'a str,
    pub scope: &'a str,
    pub script: &'a str,
    /// The setup ran with a network.
    pub network: bool,
    pub files: &'a [KeyFile],
}

/// The cache key: SHA-256 in hex over the inputs, each length-prefixed.
pub fn cache_key(inputs: &KeyInputs) -> String {
    let mut h = Sha256::new();
    let mut put = |bytes: &[u8]| {
        h.update((bytes.len() as u64).to_be_bytes());
        h.update(bytes);
    };
    put(b"kodx-setup-cache-v1");
    put(inputs.image_id.as_bytes());
    put(inputs.scope.as_bytes());
    put(inputs.script.as_bytes());
    put(if inputs.network { b"net" } else { b"nonet" });
    put(&(inputs.files.len() as u64).to_be_bytes());
    for f in inputs.files {
        put(f.path.as_bytes());
        put(&f.digest);
    }
    hex::encode(h.finalize())
}

/// The image name of a key.
pub fn image_name(key: &str) -> String {
    format!("{IMAGE_REPO}:{}", &key[..32.min(key.len())])
}

/// A shell script that deletes, under `workdir`, what `manifest` lists (the checkout the
/// setup ran on): files and symlinks, the `.git` directory, then the directories left
/// empty, deepest first. What the setup made stays.
pub fn clean_script(workdir: &str, manifest: &Manifest) -> String {
    removal_script(workdir, manifest.entries(), true)
}

/// A shell script that deletes, under `workdir`, what the checkout the cached image holds
/// (`stored`) has and the new one (`new`) does not: files and symlinks, then directories
/// left empty, deepest first. `.git` is not touched. With the new checkout's changed and
/// added entries copied in (an entry of another kind replaces the old one as it goes in),
/// the workspace is the new checkout plus what the setup made.
pub fn delta_script(workdir: &str, stored: &Manifest, new: &Manifest) -> Option<String> {
    // Under a directory the new checkout turned into a file or symlink, nothing is left to
    // delete (the copy-in replaced the directory whole), and a path through that symlink
    // must not be followed.
    let under_a_non_dir = |path: &str| {
        path.match_indices('/').any(|(i, _)| {
            new.get(&path[..i])
                .is_some_and(|e| !matches!(e, ManifestEntry::Dir { .. }))
        })
    };
    let mut gone = stored
        .entries()
        .filter(|(path, _)| new.get(path).is_none() && !under_a_non_dir(path))
        .peekable();
    gone.peek()?;
    Some(removal_script(workdir, gone, false))
}

/// A script removing `paths` (relative to `workdir`, a directory with what it holds),
/// never anything under `.git`; what is already gone is not an error.
pub fn removal_of_paths(workdir: &str, paths: &[String]) -> String {
    let quote = |p: &str| format!("'{}'", p.replace('\'', r"'\''"));
    let mut out = format!("cd {} || exit 1\n", quote(workdir));
    let paths: Vec<&String> = paths
        .iter()
        .filter(|p| !p.is_empty() && *p != ".git" && !p.starts_with(".git/"))
        .collect();
    for chunk in paths.chunks(200) {
        out.push_str("rm -rf --");
        for p in chunk {
            out.push(' ');
            out.push_str(&quote(&format!("./{p}")));
        }
        out.push('\n');
    }
    out
}

fn removal_script<'m>(
    workdir: &str,
    entries: impl Iterator<Item = (&'m str, &'m ManifestEntry)>,
    with_git: bool,
) -> String {
    let quote = |p: &str| format!("'{}'", p.replace('\'', r"'\''"));
    let mut out = format!("cd {} || exit 0\n", quote(workdir));
    if with_git {
        out.push_str("rm -rf -- ./.git\n");
    }
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    for (path, entry) in entries {
        if path == ".git" || path.starts_with(".git/") {
            continue;
        }
        match entry {
            ManifestEntry::Dir { .. } => dirs.push(path),
            _ => files.push(path),
        }
    }
    for chunk in files.chunks(200) {
        out.push_str("rm -f --");
        for p in chunk {
            out.push(' ');
            out.push_str(&quote(&format!("./{p}")));
        }
        out.push_str(" 2>/dev/null\n");
    }
    // Deepest first: a directory is only empty once its subdirectories are gone.
    dirs.sort_by_key(|d| std::cmp::Reverse(d.matches('/').count()));
    for chunk in dirs.chunks(200) {
        out.push_str("rmdir --");
        for p in chunk {
            out.push(' ');
            out.push_str(&quote(&format!("./{p}")));
        }
        out.push_str(" 2>/dev/null\n");
    }
    out.push_str("exit 0\n");
    out
}

/// The cached image for `key`, if there is one: its id.
pub async fn lookup(docker: &Docker, key: &str) -> Option<String> {
    let image = docker.inspect_image(&image_name(key)).await.ok()?;
    let labels = image.config.as_ref()?.labels.as_ref()?;
    (labels.get(KEY_LABEL).map(String::as_str) == Some(key)).then_some(image.id?)
}

/// Marks the image of `key` as used now (its last tag time, which eviction reads).
pub async fn touch(docker: &Docker, key: &str) {
    let name = image_name(key);
    let (repo, tag) = name.split_once(':').expect("image names have a tag");
    let options = TagImageOptions {
        repo: Some(repo.to_string()),
        tag: Some(tag.to_string()),
    };
    if let Err(e) = docker.tag_image(&name, Some(options)).await {
        tracing::warn!("could not mark the setup cache image {name} as used: {e}");
    }
}

/// The base image's config, as the cached image must carry it: nothing of the container
/// (its command, working directory, kodx labels) may end up in the image.
pub fn committed_config(
    base: &ImageConfig,
    key: &str,
    scope: &str,
    base_id: &str,
    created: u64,
) -> ContainerConfig {
    let scope: String = scope.chars().take(200).collect();
    image_config(
        base,
        [
            (KEY_LABEL, key.to_string()),
            (SCOPE_LABEL, scope),
            (BASE_LABEL, base_id.to_string()),
            (CREATED_LABEL, created.to_string()),
        ],
    )
}

/// Commits container `id` as the image of `key`. When another run committed the same key
/// first, that one stays and this commit is dropped. Returns the image's id.
pub async fn commit(
    docker: &Docker,
    id: &str,
    key: &str,
    config: ContainerConfig,
) -> Result<String> {
    if let Some(existing) = lookup(docker, key).await {
        return Ok(existing);
    }
    let name = image_name(key);
    commit_named(
        docker,
        id,
        config,
        (&name, "kodx setup cache", true),
        |image| {
            image
                .config
                .as_ref()
                .and_then(|c| c.labels.as_ref())
                .and_then(|l| l.get(KEY_LABEL))
                .is_some_and(|k| k == key)
        },
    )
    .await
}

/// One cached image as eviction sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Cached {
    pub id: String,
    /// Tagged as `kodx-setup:…` (an untagged one lost a race, or its tag moved).
    pub tagged: bool,
    /// Last use, in nanoseconds since the epoch (last tag time, else creation).
    pub used: i128,
    /// Bytes of its own layers (its size less its base image's).
    pub bytes: u64,
    /// A container (running or not) uses it.
    pub in_use: bool,
    /// Seconds since it was made.
    pub age_secs: u64,
}

/// Which images to remove so that at most `max_images` and `max_bytes` stay (0: no bound),
/// least recently used first. Images in use are never chosen (but count); untagged ones
/// older than a minute always are.
pub fn to_evict(images: &[Cached], max_images: usize, max_bytes: u64) -> Vec<String> {
    let mut out = Vec::new();
    let mut kept: Vec<&Cached> = Vec::new();
    for c in images {
        if !c.tagged && !c.in_use && c.age_secs > 60 {
            out.push(c.id.clone());
        } else {
            kept.push(c);
        }
    }
    kept.sort_by_key(|c| c.used);
    let mut count = kept.len();
    let mut bytes: u64 = kept.iter().map(|c| c.bytes).sum();
    for c in kept {
        let over_count = max_images > 0 && count > max_images;
        let over_bytes = max_bytes > 0 && bytes > max_bytes;
        if !(over_count || over_bytes) {
            break;
        }
        if c.in_use {
            continue;
        }
        out.push(c.id.clone());
        count -= 1;
        bytes = bytes.saturating_sub(c.bytes);
    }
    out
}

fn rfc3339_nanos(s: &str) -> Option<i128> {
    let t = chrono::DateTime::parse_from_rfc3339(s).ok()?;
    Some(i128::from(t.timestamp()) * 1_000_000_000 + i128::from(t.timestamp_subsec_nanos()))
}

/// Reads the cached images and removes what is over the bounds. Returns how many were
/// removed. Only images with [`KEY_LABEL`] are looked at.
pub async fn evict(docker: &Docker, max_images: usize, max_bytes: u64) -> Result<usize> {
    let listed = docker
        .list_images(Some(ListImagesOptions {
            all: false,
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![KEY_LABEL.to_string()],
            )])),
            ..Default::default()
        }))
        .await
        .map_err(|e| SandboxError::docker("listing the setup cache images", e))?;
    let containers = docker
        .list_containers(Some(ListContainersOptions {
            all: true,
            ..Default::default()
        }))
        .await
        .map_err(|e| SandboxError::docker("listing containers", e))?;
    let used: std::collections::HashSet<String> =
        containers.into_iter().filter_map(|c| c.image_id).collect();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs() as i64;
    let mut base_sizes: HashMap<String, i64> = HashMap::new();
    let mut images = Vec::new();
    for summary in listed {
        let base = summary.labels.get(BASE_LABEL).cloned().unwrap_or_default();
        let base_size = match base_sizes.get(&base) {
            Some(s) => *s,
            None => {
                let s = docker
                    .inspect_image(&base)
                    .await
                    .ok()
                    .and_then(|i| i.size)
                    .unwrap_or(0);
                base_sizes.insert(base.clone(), s);
                s
            }
        };
        let last_tag = docker
            .inspect_image(&summary.id)
            .await
            .ok()
            .and_then(|i| i.metadata)
            .and_then(|m| m.last_tag_time)
            .and_then(|t| rfc3339_nanos(&t));
        let tagged = summary
            .repo_tags
            .iter()
            .any(|t| t.starts_with(&format!("{IMAGE_REPO}:")));
        images.push(Cached {
            tagged,
            used: last_tag.unwrap_or(i128::from(summary.created) * 1_000_000_000),
            bytes: (summary.size - base_size).max(0) as u64,
            in_use: used.contains(&summary.id),
            age_secs: (now - summary.created).max(0) as u64,
            id: summary.id,
        });
    }
    let mut removed = 0;
    for id in to_evict(&images, max_images, max_bytes) {
        // Not forced: the engine refuses an image a container was made from meanwhile.
        match docker
            .remove_image(&id, None::<RemoveImageOptions>, None)
            .await
        {
            Ok(_) => {
                tracing::info!(image = %id, "removed a setup cache image");
                removed += 1;
            }
            Err(e) => tracing::info!(image = %id, "kept a setup cache image: {e}"),
        }
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(path: &str, data: &[u8]) -> KeyFile {
        KeyFile {
            path: path.into(),
            digest: Sha256::digest(data).into(),
        }
    }

    #[test]
    fn key_changes_with_every_input_and_inputs_cannot_run_together() {
        let files = [file("Cargo.lock", b"a")];
        let base = KeyInputs {
            image_id: "sha256:1",
            scope: "acme/widgets",
            script: "make deps",
            network: true,
            files: &files,
        };
        let k = cache_key(&base);
        assert_eq!(k.len(), 64);
        assert_eq!(k, cache_key(&base.clone()));
        let other_files = [file("Cargo.lock", b"b")];
        let renamed = [file("Cargo.toml", b"a")];
        for changed in [
            KeyInputs {
                image_id: "sha256:2",
                ..base.clone()
            },
            KeyInputs {
                scope: "acme/other",
                ..base.clone()
            },
            KeyInputs {
                script: "make deps ",
                ..base.clone()
            },
            KeyInputs {
                network: false,
                ..base.clone()
            },
            KeyInputs {
                files: &other_files,
                ..base.clone()
            },
            KeyInputs {
                files: &renamed,
                ..base.clone()
            },
            KeyInputs {
                files: &[],
                ..base.clone()
            },
        ] {
            assert_ne!(cache_key(&changed), k, "{changed:?}");
        }
        // Length prefixes: moving a byte from one input to the next changes the key.
        let a = KeyInputs {
            scope: "ab",
            script: "c",
            ..base.clone()
        };
        let b = KeyInputs {
            scope: "a",
            script: "bc",
            ..base.clone()
        };
        assert_ne!(cache_key(&a), cache_key(&b));
    }

    #[test]
    fn patterns_match_within_one_component() {
        assert!(matches("requirements*.txt", "requirements.txt"));
        assert!(matches("requirements*.txt", "requirements-dev.txt"));
        assert!(!matches("requirements*.txt", "requirements.txt.bak"));
        assert!(matches("?.lock", "a.lock"));
        assert!(!matches("?.lock", "ab.lock"));
        assert!(matches("*", ""));
        assert!(check_pattern("packages/*/package.json").is_ok());
        for bad in [
            "",
            "/etc/passwd",
            "../x",
            "a//b",
            "a/./b",
            "**/x",
            "[ab]",
            "a\\b",
        ] {
            assert!(check_pattern(bad).is_err(), "{bad:?}");
        }
        assert!(check_pattern(&"a".repeat(257)).is_err());
    }

    #[test]
    fn patterns_keep_their_meaning_on_globset() {
        // Every character but `*` and `?` stands for itself.
        assert!(matches("a[b]", "a[b]"));
        assert!(!matches("a[b]", "ab"));
        assert!(matches("{a,b}.lock", "{a,b}.lock"));
        assert!(!matches("{a,b}.lock", "a.lock"));
        assert!(matches(r"a\*", r"a\xyz"));
        assert!(!matches(r"a\*", "a*"));
        assert!(matches("a!b", "a!b"));
        // A run of stars is one star, nothing recursive.
        assert!(matches("**.lock", "x.lock"));
        assert!(matches("a**", "a"));
        assert!(matches("**", ""));
        // `*` and `?` would match a `/` (names never hold one), and a leading dot.
        assert!(matches("a*b", "a/b"));
        assert!(matches("a?b", "a/b"));
        assert!(matches("*", ".nvmrc"));
        assert!(matches(".*rc", ".nvmrc"));
        // Case matters; other scripts are literal.
        assert!(!matches("Cargo.*", "cargo.lock"));
        assert!(matches("ré*.txt", "résumé.txt"));
        assert!(!matches("?", "ab"));
        assert!(!matches("", "a"));
        assert!(matches("", ""));
    }

    #[test]
    fn a_pattern_full_of_stars_is_matched_without_backtracking() {
        // The matcher globset replaced tried every split of the name at each star: this
        // pattern, which a repository may write, against a long name never ended.
        let pattern = "*a*a*a*a*a*a*a*a*a*a*b";
        assert!(check_pattern(pattern).is_ok());
        let name = "a".repeat(200);
        assert!(!matches(pattern, &name));
        assert!(matches(pattern, &format!("{name}b")));
        assert!(!matches(pattern, &format!("{}b", "a".repeat(9))));
        assert!(matches(pattern, &format!("{}b", "a".repeat(10))));
    }

    #[test]
    fn key_files_are_found_hashed_and_symlinks_never_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::write(root.join("requirements.txt"), "flask\n").unwrap();
        std::fs::write(root.join("requirements-dev.txt"), "pytest\n").unwrap();
        std::fs::write(root.join("README.md"), "hi\n").unwrap();
        std::fs::create_dir_all(root.join("packages/a")).unwrap();
        std::fs::create_dir_all(root.join("packages/b")).unwrap();
        std::fs::write(root.join("packages/a/package.json"), "{}").unwrap();
        std::fs::create_dir(root.join("outside")).unwrap();
        std::fs::write(root.join("outside/package.json"), "secret").unwrap();
        std::os::unix::fs::symlink(root.join("outside"), root.join("packages/c")).unwrap();
        std::os::unix::fs::symlink("/etc/hostname", root.join("Cargo.lock")).unwrap();
        let mut patterns: Vec<String> = DEFAULT_KEY_FILES.iter().map(|s| s.to_string()).collect();
        patterns.push("packages/*/package.json".into());
        patterns.push("packages/c/package.json".into());
        let found = key_files(root, &patterns).unwrap();
        let paths: Vec<&str> = found.iter().map(|f| f.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "Cargo.lock",
                "packages/a/package.json",
                "requirements-dev.txt",
                "requirements.txt"
            ]
        );
        // The symlink is its target text, not the file it names.
        let expected: [u8; 32] = Sha256::digest(b"/etc/hostname").into();
        assert_eq!(found[0].digest, expected);
        let flask: [u8; 32] = Sha256::digest(b"flask\n").into();
        assert_eq!(found[3].digest, flask);
        assert!(key_files(root, &["../x".to_string()]).is_err());
    }

    #[test]
    fn key_files_from_head_match_those_on_disk() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("work");
        std::fs::create_dir_all(root.join("packages/a")).unwrap();
        std::fs::write(root.join("requirements.txt"), "flask\n").unwrap();
        std::fs::write(root.join("Cargo.lock"), "lock\n").unwrap();
        std::fs::write(root.join("packages/a/package.json"), "{}").unwrap();
        std::fs::write(root.join("other.txt"), "x").unwrap();
        std::os::unix::fs::symlink("Cargo.lock", root.join("Cargo.toml")).unwrap();
        let git = |args: &[&str], dir: &Path| {
            let ok = std::process::Command::new("git")
                .args(["-c", "user.name=t", "-c", "user.email=t@e"])
                .args(args)
                .current_dir(dir)
                .output()
                .unwrap();
            assert!(ok.status.success(), "{ok:?}");
        };
        git(&["init", "-q"], &root);
        git(&["add", "-A"], &root);
        git(&["commit", "-qm", "c"], &root);
        let mut patterns: Vec<String> = DEFAULT_KEY_FILES.iter().map(|s| s.to_string()).collect();
        patterns.push("packages/*/package.json".into());
        let on_disk = key_files(&root, &patterns).unwrap();
        assert_eq!(on_disk.len(), 4);
        // A clone with nothing checked out.
        let bare = tmp.path().join("clone");
        git(
            &[
                "clone",
                "-q",
                "--no-checkout",
                root.to_str().unwrap(),
                bare.to_str().unwrap(),
            ],
            tmp.path(),
        );
        assert!(only_git(&bare));
        assert!(!only_git(&root));
        assert_eq!(key_files(&bare, &patterns).unwrap(), []);
        assert_eq!(key_files_at_head(&bare, &patterns).unwrap(), on_disk);
    }

    fn run_sh(script: &str) {
        let ok = std::process::Command::new("sh")
            .arg("-c")
            .arg(script)
            .status()
            .unwrap();
        assert!(ok.success(), "{script}");
    }

    #[test]
    fn clean_script_deletes_the_old_checkout_deepest_first() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("repo");
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("a/b/it's.txt"), "x").unwrap();
        std::fs::write(dir.join("top"), "y").unwrap();
        let (_, manifest) = super::super::archive::pack_dir(&dir, "repo").unwrap();
        let script = clean_script("/workspace/repo", &manifest);
        assert!(
            script.starts_with("cd '/workspace/repo' || exit 0\n"),
            "{script}"
        );
        assert!(script.contains(r"'./a/b/it'\''s.txt'"), "{script}");
        let rmdir = script.lines().find(|l| l.starts_with("rmdir")).unwrap();
        assert_eq!(rmdir, "rmdir -- './a/b' './a' 2>/dev/null", "{script}");
        // Run it for real on a copy with something the setup made.
        std::fs::create_dir_all(dir.join("a/node_modules")).unwrap();
        std::fs::write(dir.join("a/node_modules/m.js"), "m").unwrap();
        run_sh(&clean_script(dir.to_str().unwrap(), &manifest));
        assert!(!dir.join("top").exists());
        assert!(!dir.join("a/b").exists());
        assert!(dir.join("a/node_modules/m.js").exists());
    }

    #[test]
    fn delta_script_deletes_only_what_the_new_checkout_lacks() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("repo");
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::create_dir_all(dir.join(".git")).unwrap();
        std::fs::write(dir.join("a/b/gone.txt"), "x").unwrap();
        std::fs::write(dir.join("kept"), "y").unwrap();
        let (_, old) = super::super::archive::pack_dir(&dir, "repo").unwrap();
        assert_eq!(delta_script("/w", &old, &old), None, "nothing to delete");
        std::fs::remove_dir_all(dir.join("a")).unwrap();
        let (_, new) = super::super::archive::pack_dir(&dir, "repo").unwrap();
        // What the setup made inside a/ keeps a/ there.
        std::fs::create_dir_all(dir.join("a/b")).unwrap();
        std::fs::write(dir.join("a/b/gone.txt"), "x").unwrap();
        std::fs::write(dir.join("a/setup-made"), "s").unwrap();
        let script = delta_script(dir.to_str().unwrap(), &old, &new).unwrap();
        assert!(!script.contains(".git"), "{script}");
        run_sh(&script);
        assert!(!dir.join("a/b").exists());
        assert!(dir.join("a/setup-made").exists() && dir.join("kept").exists());
        assert!(dir.join(".git").exists());
    }

    /// Names as a repository may have them (a quote, spaces, a newline, a leading dash)
    /// are removed, a directory with what it holds, and nothing under `.git` ever.
    #[test]
    fn removal_of_paths_removes_exactly_the_paths_named() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("repo");
        let odd = ["it's here", "-rf", "two words", "line\nbreak"];
        for name in odd {
            std::fs::create_dir_all(dir.join("d")).unwrap();
            std::fs::write(dir.join(name), "x").unwrap();
        }
        std::fs::create_dir_all(dir.join("gone/deep")).unwrap();
        std::fs::write(dir.join("gone/deep/f"), "x").unwrap();
        std::fs::create_dir_all(dir.join(".git/refs")).unwrap();
        std::fs::write(dir.join("kept"), "k").unwrap();
        let mut paths: Vec<String> = odd.iter().map(|s| s.to_string()).collect();
        paths.extend([
            "gone".into(),
            ".git".into(),
            ".git/refs".into(),
            "absent".into(),
        ]);
        run_sh(&removal_of_paths(dir.to_str().unwrap(), &paths));
        for name in odd.iter().chain(&["gone"]) {
            assert!(!dir.join(name).exists(), "{name:?} is left");
        }
        assert!(dir.join(".git/refs").exists() && dir.join("kept").exists());
        assert!(dir.join("d").exists());
    }

    #[test]
    fn delta_script_never_deletes_through_a_directory_turned_into_a_symlink() {
        let pack = |make: &dyn Fn(&std::path::Path)| {
            let tmp = tempfile::tempdir().unwrap();
            let dir = tmp.path().join("repo");
            std::fs::create_dir_all(&dir).unwrap();
            make(&dir);
            super::super::archive::pack_dir(&dir, "repo").unwrap().1
        };
        let old = pack(&|d| {
            std::fs::create_dir_all(d.join("lib/deep")).unwrap();
            std::fs::write(d.join("lib/deep/passwd"), "x").unwrap();
            std::fs::write(d.join("gone"), "g").unwrap();
        });
        let new = pack(&|d| std::os::unix::fs::symlink("/etc", d.join("lib")).unwrap());
        let script = delta_script("/w", &old, &new).unwrap();
        assert!(script.contains("'./gone'"), "{script}");
        assert!(!script.contains("lib/"), "{script}");
    }

    #[test]
    fn eviction_is_lru_within_both_bounds_and_spares_images_in_use() {
        let img = |id: &str, used: i128, bytes: u64, in_use: bool| Cached {
            id: id.into(),
            tagged: true,
            used,
            bytes,
            in_use,
            age_secs: 1000,
        };
        let images = vec![
            img("c", 3, 10, false),
            img("a", 1, 10, false),
            img("b", 2, 10, true),
            img("d", 4, 10, false),
        ];
        assert_eq!(to_evict(&images, 0, 0), Vec::<String>::new());
        assert_eq!(to_evict(&images, 4, 40), Vec::<String>::new());
        assert_eq!(to_evict(&images, 3, 0), ["a"]);
        // b is older than c but in use: c goes.
        assert_eq!(to_evict(&images, 2, 0), ["a", "c"]);
        assert_eq!(to_evict(&images, 0, 25), ["a", "c"]);
        let mut stray = img("x", 9, 5, false);
        stray.tagged = false;
        let mut fresh = stray.clone();
        fresh.id = "y".into();
        fresh.age_secs = 5;
        assert_eq!(to_evict(&[stray, fresh], 0, 0), ["x"]);
    }
}
