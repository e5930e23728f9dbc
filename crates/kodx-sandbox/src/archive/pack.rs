//! Packing: a host directory (or a few files) into a tar for the container, with the
//! [`Manifest`] of what went in.

use std::fs::{self, File, Metadata};
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use tar::{EntryType, Header};

use super::limits::{io_at, ArchiveLimits};
use super::manifest::{Manifest, ManifestEntry};
use super::names::check_rel;
use super::tip::TipPack;
use super::treecheck::{
    missing, read_blob, refused, symlink_size, symlink_target, tree_path, TreeBudget,
};
use crate::error::{Result, SandboxError};

/// Packs the host directory `src` into a tar written to `out`, whose entries live under
/// `prefix/` (at the top when `prefix` is ""), with a directory entry (mode 0755) for a
/// non-empty `prefix` itself. Files are streamed, never read whole.
///
/// Permission bits (`& 0o7777`) and mtimes are kept, owner is uid/gid 0 ("root"), symlinks
/// are stored as symlinks with their target text verbatim, and sockets, FIFOs and devices
/// are skipped. Entries come in sorted order, so the same tree gives the same tar.
/// Returns the baseline manifest (paths relative to `src`, without `prefix`).
/// Names and symlink targets must be UTF-8. A file that changes size while it is read
/// is an error naming it.
pub fn pack_dir_to<W: Write>(src: &Path, prefix: &str, out: W) -> Result<Manifest> {
    pack_dir_over(src, prefix, None, out).map(|(m, _)| m)
}

/// What a pack over a tree the destination already holds left out ([`pack_over_to`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Skipped {
    /// Entries (files, symlinks, directories) not written.
    pub entries: usize,
    /// Bytes of the files among them.
    pub bytes: u64,
}

/// Which tree [`pack_over_to`] packs: as [`pack_dir_to`], [`pack_checkout_to`] or
/// [`pack_tip_to`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PackSource {
    Dir,
    Checkout,
    Tip,
}

/// Packs as the function `source` names, for a destination that already holds the tree
/// `have` describes: an entry whose manifest entry is the same as `have`'s at its path
/// stays out of the tar (the returned manifest still lists it, as the whole tree's
/// baseline). `.git` always goes in whole. With `have` empty or `None`, this is the plain
/// pack. What was left out is counted in [`Skipped`]. A file on disk the same size and mode
/// as `have`'s is read twice when it differs (hashed first, then streamed).
pub fn pack_over_to<W: Write>(
    src: &Path,
    source: PackSource,
    prefix: &str,
    limits: &ArchiveLimits,
    have: Option<&Manifest>,
    out: W,
) -> Result<(Manifest, Skipped)> {
    match source {
        PackSource::Dir => pack_dir_over(src, prefix, have, out),
        PackSource::Checkout => pack_head(src, prefix, limits, false, have, out),
        PackSource::Tip => pack_head(src, prefix, limits, true, have, out),
    }
}

fn pack_dir_over<W: Write>(
    src: &Path,
    prefix: &str,
    have: Option<&Manifest>,
    out: W,
) -> Result<(Manifest, Skipped)> {
    if !prefix.is_empty() {
        check_rel(prefix).map_err(|why| {
            SandboxError::InvalidInput(format!("bad archive prefix {prefix:?}: {why}"))
        })?;
    }
    let meta = fs::metadata(src).map_err(io_at("reading", src))?;
    if !meta.is_dir() {
        return Err(SandboxError::InvalidInput(format!(
            "{} is not a directory",
            src.display()
        )));
    }
    let mut packer = Packer {
        builder: tar::Builder::new(out),
        manifest: Manifest::default(),
        prefix,
        have,
        skipped: Skipped::default(),
    };
    packer.prefix_dir(mtime(&meta), src)?;
    packer.walk(src, "")?;
    packer
        .builder
        .into_inner()
        .and_then(|mut out| out.flush())
        .map_err(|e| SandboxError::io("finishing the tar", e))?;
    Ok((packer.manifest, packer.skipped))
}

/// As [`pack_dir_to`] for a clone whose files need not be on disk: the tree of the
/// commit `HEAD` points at in the repository at `repo_dir` comes straight from its git
/// objects (one blob in memory at a time), and the repository's own `.git` directory from
/// disk, its config rewritten as [`pack_dir_to`] does. Whatever else is in `repo_dir` is
/// not read. The tar holds what a checkout of that commit packed by [`pack_dir_to`] would
/// (files `0644` or `0755`, directories `0755`, a submodule as an empty directory), with the
/// commit's time as every entry's mtime.
///
/// The tree is untrusted: names must be UTF-8 and single path components, no component
/// may be `.git` (as git refuses to check one out), symlink targets must be UTF-8, and
/// `limits` bound each blob, all blobs together, the number of entries and the bytes of
/// names, checked before a blob is read.
pub fn pack_checkout_to<W: Write>(
    repo_dir: &Path,
    prefix: &str,
    limits: &ArchiveLimits,
    out: W,
) -> Result<Manifest> {
    pack_head(repo_dir, prefix, limits, false, None, out).map(|(m, _)| m)
}

/// As [`pack_checkout_to`], with a `.git` that holds the commit `HEAD` names and nothing
/// older: a shallow repository (`.git/shallow` names that commit) whose objects are the
/// commit, its trees and its blobs, in one pack made while the tree is packed (each blob
/// is read once, for both). `git status`, `git diff`, `git log` and `git commit` work in
/// it; the history does not come along (for runs that need only the tip: issues and
/// `ask`). The rest of the clone's `.git` (`HEAD`, refs, config rewritten, index) goes in
/// as it is; its object store and `shallow` file do not.
pub fn pack_tip_to<W: Write>(
    repo_dir: &Path,
    prefix: &str,
    limits: &ArchiveLimits,
    out: W,
) -> Result<Manifest> {
    pack_head(repo_dir, prefix, limits, true, None, out).map(|(m, _)| m)
}

fn pack_head<W: Write>(
    repo_dir: &Path,
    prefix: &str,
    limits: &ArchiveLimits,
    tip_only: bool,
    have: Option<&Manifest>,
    out: W,
) -> Result<(Manifest, Skipped)> {
    if !prefix.is_empty() {
        check_rel(prefix).map_err(|why| {
            SandboxError::InvalidInput(format!("bad archive prefix {prefix:?}: {why}"))
        })?;
    }
    let git = |what: &str, e: git2::Error| {
        SandboxError::InvalidInput(format!("{what} in {}: {}", repo_dir.display(), e.message()))
    };
    let repo = git2::Repository::open(repo_dir).map_err(|e| git("opening the repository", e))?;
    let commit = repo
        .head()
        .and_then(|h| h.peel_to_commit())
        .map_err(|e| git("reading HEAD", e))?;
    let tree = commit.tree().map_err(|e| git("reading HEAD's tree", e))?;
    let mtime = u64::try_from(commit.time().seconds()).unwrap_or(0);
    let mut packer = Packer {
        builder: tar::Builder::new(out),
        manifest: Manifest::default(),
        prefix,
        have,
        skipped: Skipped::default(),
    };
    packer.prefix_dir(mtime, repo_dir)?;
    packer.dot_git(repo.path(), tip_only.then_some((commit.id(), mtime)))?;
    let mut tip = None;
    if tip_only {
        let mut pack = TipPack::new().map_err(|e| SandboxError::io("making the tip's pack", e))?;
        let odb = repo.odb().map_err(|e| git("opening the objects", e))?;
        for id in [commit.id(), tree.id()] {
            let o = odb.read(id).map_err(|e| git("reading HEAD", e))?;
            pack.add(id, o.kind(), o.data())
                .map_err(|e| SandboxError::io("making the tip's pack", e))?;
        }
        tip = Some(pack);
    }
    let mut budget = TreeBudget {
        limits,
        entries: packer.manifest.len(),
        bytes: 0,
        names: 0,
        tip,
    };
    packer.walk_tree(&repo, &tree, "", mtime, &mut budget)?;
    if let Some(pack) = budget.tip.take() {
        packer.append_pack(pack, mtime)?;
    }
    packer
        .builder
        .into_inner()
        .and_then(|mut out| out.flush())
        .map_err(|e| SandboxError::io("finishing the tar", e))?;
    Ok((packer.manifest, packer.skipped))
}

/// [`pack_dir_to`] into memory: the tar and the manifest. For small trees and tests.
pub fn pack_dir(src: &Path, prefix: &str) -> Result<(Vec<u8>, Manifest)> {
    let mut tar = Vec::new();
    let manifest = pack_dir_to(src, prefix, &mut tar)?;
    Ok((tar, manifest))
}

/// A tar holding one regular file at `path` (relative, e.g. "setup.sh") with `mode`,
/// uid/gid 0. It ends with the standard two zero blocks (1024 bytes).
///
/// # Panics
/// If `path` is not a relative path without `..` (a programming error: callers pass constants).
pub fn pack_file(path: &str, contents: &[u8], mode: u32) -> Vec<u8> {
    pack_files(&[(path, contents, mode)])
}

/// A tar holding the given regular files (`(path, contents, mode)`), uid/gid 0. Parent
/// directories are implied (Docker creates them). Panics on a path the tar crate rejects.
pub fn pack_files(files: &[(&str, &[u8], u32)]) -> Vec<u8> {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let mut builder = tar::Builder::new(Vec::new());
    for (path, contents, mode) in files {
        let mut h = header(
            EntryType::Regular,
            mode & 0o7777,
            now,
            contents.len() as u64,
        );
        builder
            .append_data(&mut h, path, *contents)
            .unwrap_or_else(|e| panic!("pack_files({path:?}): {e}"));
    }
    builder.into_inner().expect("writing a tar into memory")
}

pub(super) struct Packer<'p, W: Write> {
    pub(super) builder: tar::Builder<W>,
    pub(super) manifest: Manifest,
    pub(super) prefix: &'p str,
    /// What the destination already holds ([`pack_over_to`]).
    pub(super) have: Option<&'p Manifest>,
    pub(super) skipped: Skipped,
}

impl<W: Write> Packer<'_, W> {
    /// The directory entry (mode 0755) of a non-empty prefix, first in the tar; `from`
    /// names what is packed, in errors.
    pub(super) fn prefix_dir(&mut self, mtime: u64, from: &Path) -> Result<()> {
        if self.prefix.is_empty() {
            return Ok(());
        }
        let mut h = header(EntryType::Directory, 0o755, mtime, 0);
        self.builder
            .append_data(&mut h, format!("{}/", self.prefix), io::empty())
            .map_err(io_at("archiving", from))
    }

    /// Whether the destination already holds `entry` at `rel` (never for `.git`): then it
    /// is counted as skipped and the caller leaves it out of the tar.
    fn already_there(&mut self, rel: &str, entry: &ManifestEntry) -> bool {
        if rel == ".git" || rel.starts_with(".git/") {
            return false;
        }
        let same = self.have.and_then(|h| h.get(rel)) == Some(entry);
        if same {
            self.skipped.entries += 1;
            if let ManifestEntry::File { size, .. } = entry {
                self.skipped.bytes += size;
            }
        }
        same
    }

    /// For a file on disk at `rel` whose mode and size are those `have` lists there: its
    /// entry when its contents are the same too (it stays out of the tar), else `None`.
    fn same_file_as_had(
        &mut self,
        rel: &str,
        path: &Path,
        mode: u32,
        size: u64,
    ) -> Result<Option<ManifestEntry>> {
        match self.have.and_then(|h| h.file(rel)) {
            Some((m, s, _)) if m == mode && s == size => {}
            _ => return Ok(None),
        }
        let mut hashed = Exact {
            inner: File::open(path).map_err(io_at("reading", path))?,
            left: size,
            hasher: Sha256::new(),
        };
        io::copy(&mut hashed, &mut io::sink()).map_err(io_at("reading", path))?;
        let entry = ManifestEntry::File {
            mode,
            size,
            sha256: hashed.hasher.finalize().into(),
        };
        Ok(self.already_there(rel, &entry).then_some(entry))
    }

    /// Appends the contents of the host directory `dir` (at `rel` in the tree), sorted by name.
    pub(super) fn walk(&mut self, dir: &Path, rel: &str) -> Result<()> {
        self.walk_skipping(dir, rel, &[])
    }

    /// As [`Packer::walk`], leaving out the entries of `dir` itself named in `skip`.
    pub(super) fn walk_skipping(&mut self, dir: &Path, rel: &str, skip: &[&str]) -> Result<()> {
        let mut names = fs::read_dir(dir)
            .and_then(|entries| {
                entries
                    .map(|e| e.map(|e| e.file_name()))
                    .collect::<io::Result<Vec<_>>>()
            })
            .map_err(io_at("reading the directory", dir))?;
        names.retain(|n| !skip.iter().any(|s| n.as_os_str() == *s));
        names.sort();
        for name in names {
            let path = dir.join(&name);
            let name = name.to_str().ok_or_else(|| {
                SandboxError::InvalidInput(format!("file name is not UTF-8: {}", path.display()))
            })?;
            let rel = if rel.is_empty() {
                name.to_string()
            } else {
                format!("{rel}/{name}")
            };
            let tar_path = if self.prefix.is_empty() {
                rel.clone()
            } else {
                format!("{}/{rel}", self.prefix)
            };
            let meta = fs::symlink_metadata(&path).map_err(io_at("inspecting", &path))?;
            let mode = meta.mode() & 0o7777;
            let kind = meta.file_type();
            let entry = if kind.is_dir() {
                let entry = ManifestEntry::Dir { mode };
                if !self.already_there(&rel, &entry) {
                    let mut h = header(EntryType::Directory, mode, mtime(&meta), 0);
                    self.builder
                        .append_data(&mut h, format!("{tar_path}/"), io::empty())
                        .map_err(io_at("archiving", &path))?;
                }
                entry
            } else if kind.is_file() && crate::gitconfig::is_config_path(&rel) {
                // Credentials in the git config never enter the sandbox (gitconfig.rs).
                // Read at most one byte past the size sanitize accepts (bigger: a minimal config).
                let mut raw = Vec::new();
                File::open(&path)
                    .and_then(|f| {
                        f.take(crate::gitconfig::MAX_CONFIG_BYTES as u64 + 1)
                            .read_to_end(&mut raw)
                    })
                    .map_err(io_at("reading", &path))?;
                let data = crate::gitconfig::sanitize(&raw);
                let mut h = header(EntryType::Regular, mode, mtime(&meta), data.len() as u64);
                self.builder
                    .append_data(&mut h, &tar_path, data.as_slice())
                    .map_err(io_at("archiving", &path))?;
                ManifestEntry::File {
                    mode,
                    size: data.len() as u64,
                    sha256: sha256_of(&data),
                }
            } else if kind.is_file() {
                let size = meta.len();
                if let Some(entry) = self.same_file_as_had(&rel, &path, mode, size)? {
                    self.manifest.entries.insert(rel, entry);
                    continue;
                }
                let file = File::open(&path).map_err(io_at("reading", &path))?;
                let mut data = Exact {
                    inner: file,
                    left: size,
                    hasher: Sha256::new(),
                };
                let mut h = header(EntryType::Regular, mode, mtime(&meta), size);
                self.builder
                    .append_data(&mut h, &tar_path, &mut data)
                    .map_err(io_at("archiving", &path))?;
                ManifestEntry::File {
                    mode,
                    size,
                    sha256: data.hasher.finalize().into(),
                }
            } else if kind.is_symlink() {
                let target = fs::read_link(&path).map_err(io_at("reading the symlink", &path))?;
                let target = target.into_os_string().into_string().map_err(|t| {
                    SandboxError::InvalidInput(format!(
                        "symlink target is not UTF-8: {} -> {t:?}",
                        path.display()
                    ))
                })?;
                let entry = ManifestEntry::Symlink {
                    target: target.clone(),
                };
                if !self.already_there(&rel, &entry) {
                    self.append_symlink(&tar_path, &target, mode, mtime(&meta))
                        .map_err(io_at("archiving", &path))?;
                }
                entry
            } else {
                continue; // sockets, FIFOs, devices
            };
            self.manifest.entries.insert(rel.clone(), entry);
            if kind.is_dir() {
                self.walk(&path, &rel)?;
            }
        }
        Ok(())
    }

    /// `rel` with the prefix, as the tar names it.
    pub(super) fn path_in_tar(&self, rel: &str) -> String {
        if self.prefix.is_empty() {
            rel.to_string()
        } else {
            format!("{}/{rel}", self.prefix)
        }
    }

    /// Appends the git tree `tree` (at `rel` in the work tree) from the objects of `repo`.
    fn walk_tree(
        &mut self,
        repo: &git2::Repository,
        tree: &git2::Tree<'_>,
        rel: &str,
        mtime: u64,
        budget: &mut TreeBudget<'_>,
    ) -> Result<()> {
        let odb = repo.odb().map_err(|e| {
            SandboxError::InvalidInput(format!("opening the objects: {}", e.message()))
        })?;
        self.walk_tree_in(repo, &odb, tree, rel, mtime, budget)
    }

    fn walk_tree_in(
        &mut self,
        repo: &git2::Repository,
        odb: &git2::Odb<'_>,
        tree: &git2::Tree<'_>,
        rel: &str,
        mtime: u64,
        budget: &mut TreeBudget<'_>,
    ) -> Result<()> {
        for entry in tree.iter() {
            let rel = tree_path(rel, entry.name_bytes())?;
            budget.count(&rel)?;
            let filemode = entry.filemode();
            let out = self.tree_entry(odb, &rel, entry.id(), filemode, mtime, budget)?;
            self.manifest.entries.insert(rel.clone(), out);
            if filemode == 0o040000 {
                let sub = repo.find_tree(entry.id()).map_err(|e| missing(&rel, e))?;
                self.walk_tree_in(repo, odb, &sub, &rel, mtime, budget)?;
            }
        }
        Ok(())
    }

    /// Appends the entry `id` of a git tree (`filemode` as the tree gives it) at `rel`, its
    /// path accepted by [`tree_path`] and counted, with its object into `budget`'s pack;
    /// returns its manifest entry. A directory's contents are the caller's to walk.
    pub(super) fn tree_entry(
        &mut self,
        odb: &git2::Odb<'_>,
        rel: &str,
        id: git2::Oid,
        filemode: i32,
        mtime: u64,
        budget: &mut TreeBudget<'_>,
    ) -> Result<ManifestEntry> {
        let tar_path = self.path_in_tar(rel);
        let archiving = |e: io::Error| SandboxError::io(format!("archiving `{rel}`"), e);
        let packing = |e: io::Error| SandboxError::io("making the tip's pack", e);
        let entry = match filemode {
            0o040000 => {
                if let Some(pack) = budget.tip.as_mut() {
                    let raw = odb.read(id).map_err(|e| missing(rel, e))?;
                    pack.add(id, raw.kind(), raw.data()).map_err(packing)?;
                }
                self.tree_dir(rel, &tar_path, mtime).map_err(archiving)?
            }
            // A submodule: checkout makes an empty directory.
            0o160000 => self.tree_dir(rel, &tar_path, mtime).map_err(archiving)?,
            0o120000 => {
                let (size, _) = odb.read_header(id).map_err(|e| missing(rel, e))?;
                symlink_size(rel, size)?;
                let blob = read_blob(odb, rel, id)?;
                if let Some(pack) = budget.tip.as_mut() {
                    pack.add(id, git2::ObjectType::Blob, blob.data())
                        .map_err(packing)?;
                }
                let target = symlink_target(rel, blob.data())?;
                let entry = ManifestEntry::Symlink {
                    target: target.clone(),
                };
                if !self.already_there(rel, &entry) {
                    self.append_symlink(&tar_path, &target, 0o777, mtime)
                        .map_err(archiving)?;
                }
                entry
            }
            mode @ (0o100644 | 0o100755 | 0o100664) => {
                let mode = if mode == 0o100755 { 0o755 } else { 0o644 };
                let (size, _) = odb.read_header(id).map_err(|e| missing(rel, e))?;
                budget.file(rel, size as u64)?;
                let blob = read_blob(odb, rel, id)?;
                let data = blob.data();
                if let Some(pack) = budget.tip.as_mut() {
                    pack.add(id, git2::ObjectType::Blob, data)
                        .map_err(packing)?;
                }
                let entry = ManifestEntry::File {
                    mode,
                    size: data.len() as u64,
                    sha256: sha256_of(data),
                };
                if !self.already_there(rel, &entry) {
                    let mut h = header(EntryType::Regular, mode, mtime, data.len() as u64);
                    self.builder
                        .append_data(&mut h, &tar_path, data)
                        .map_err(archiving)?;
                }
                entry
            }
            other => return Err(refused(rel, format!("an entry of unknown mode {other:o}"))),
        };
        Ok(entry)
    }

    /// Appends the repository's `.git` directory `dot_git` (a directory entry, then its
    /// contents). For a tip-only checkout of `(commit, mtime)`: without the object store and
    /// `shallow`, and with a `shallow` naming `commit` (the objects are the caller's).
    pub(super) fn dot_git(&mut self, dot_git: &Path, tip: Option<(git2::Oid, u64)>) -> Result<()> {
        let meta = fs::metadata(dot_git).map_err(io_at("reading", dot_git))?;
        let mode = meta.mode() & 0o7777;
        let mut h = header(EntryType::Directory, mode, mtime(&meta), 0);
        self.builder
            .append_data(&mut h, self.path_in_tar(".git") + "/", io::empty())
            .map_err(io_at("archiving", dot_git))?;
        self.manifest
            .entries
            .insert(".git".into(), ManifestEntry::Dir { mode });
        let Some((commit, mtime)) = tip else {
            return self.walk(dot_git, ".git");
        };
        self.walk_skipping(dot_git, ".git", &["objects", "shallow"])?;
        let shallow = format!("{commit}\n");
        self.append_file(".git/shallow", 0o644, mtime, shallow.as_bytes())
            .map_err(io_at("archiving", dot_git))
    }

    /// A directory of a git tree (mode 0755, as a checkout makes it), appended unless the
    /// destination has it already; its manifest entry.
    pub(super) fn tree_dir(
        &mut self,
        rel: &str,
        tar_path: &str,
        mtime: u64,
    ) -> io::Result<ManifestEntry> {
        let entry = ManifestEntry::Dir { mode: 0o755 };
        if !self.already_there(rel, &entry) {
            let mut h = header(EntryType::Directory, 0o755, mtime, 0);
            self.builder
                .append_data(&mut h, format!("{tar_path}/"), io::empty())?;
        }
        Ok(entry)
    }

    /// Appends the regular file `rel` (in the tree) holding `data`, into the manifest too.
    fn append_file(&mut self, rel: &str, mode: u32, mtime: u64, data: &[u8]) -> io::Result<()> {
        let mut h = header(EntryType::Regular, mode, mtime, data.len() as u64);
        let tar_path = self.path_in_tar(rel);
        self.builder.append_data(&mut h, tar_path, data)?;
        self.manifest.entries.insert(
            rel.to_string(),
            ManifestEntry::File {
                mode,
                size: data.len() as u64,
                sha256: sha256_of(data),
            },
        );
        Ok(())
    }

    /// Appends `.git/objects/pack/` with the tip's pack and its index.
    pub(super) fn append_pack(&mut self, pack: TipPack, mtime: u64) -> Result<()> {
        let failed = |e: io::Error| SandboxError::io("archiving the tip's pack", e);
        let done = pack.finish().map_err(failed)?;
        for dir in [".git/objects", ".git/objects/pack"] {
            let mut h = header(EntryType::Directory, 0o755, mtime, 0);
            self.builder
                .append_data(&mut h, self.path_in_tar(dir) + "/", io::empty())
                .map_err(failed)?;
            self.manifest
                .entries
                .insert(dir.to_string(), ManifestEntry::Dir { mode: 0o755 });
        }
        // Packs are read-only, as git leaves them.
        let rel = format!(".git/objects/pack/pack-{}.pack", done.name);
        let mut data = Exact {
            inner: done.pack,
            left: done.pack_len,
            hasher: Sha256::new(),
        };
        let mut h = header(EntryType::Regular, 0o444, mtime, done.pack_len);
        self.builder
            .append_data(&mut h, self.path_in_tar(&rel), &mut data)
            .map_err(failed)?;
        self.manifest.entries.insert(
            rel,
            ManifestEntry::File {
                mode: 0o444,
                size: done.pack_len,
                sha256: data.hasher.finalize().into(),
            },
        );
        let rel = format!(".git/objects/pack/pack-{}.idx", done.name);
        self.append_file(&rel, 0o444, mtime, &done.idx)
            .map_err(failed)
    }

    /// Appends a symlink with its target bytes exactly as given (the tar crate's own
    /// link-name setter normalises "a//b", "./a", "a/"), using a GNU long-link entry for
    /// targets that do not fit the 100-byte header field.
    pub(super) fn append_symlink(
        &mut self,
        path: &str,
        target: &str,
        mode: u32,
        mtime: u64,
    ) -> io::Result<()> {
        let target = target.as_bytes();
        let mut h = header(EntryType::Symlink, mode, mtime, 0);
        if target.len() > h.as_old().linkname.len() {
            let mut long = Header::new_gnu();
            long.set_path("././@LongLink")?;
            long.set_entry_type(EntryType::GNULongLink);
            long.set_size(target.len() as u64 + 1);
            long.set_cksum();
            self.builder
                .append(&long, [target, b"\0"].concat().as_slice())?;
            h.set_link_name_literal(&target[..h.as_old().linkname.len()])?;
        } else {
            h.set_link_name_literal(target)?;
        }
        self.builder.append_data(&mut h, path, io::empty())
    }
}

/// A file's data as the tar header announced it: exactly `left` bytes, hashed on the way.
/// A file that shrank is an error (the tar would be corrupt); one that grew is cut.
pub(super) struct Exact<R> {
    pub(super) inner: R,
    pub(super) left: u64,
    pub(super) hasher: Sha256,
}

impl<R: Read> Read for Exact<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.left == 0 {
            return Ok(0);
        }
        let max = buf
            .len()
            .min(usize::try_from(self.left).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..max])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the file shrank while it was being read",
            ));
        }
        self.hasher.update(&buf[..n]);
        self.left -= n as u64;
        Ok(n)
    }
}

/// A GNU header owned by root; path, link name and checksum are set when appending.
pub(super) fn header(kind: EntryType, mode: u32, mtime: u64, size: u64) -> Header {
    let mut h = Header::new_gnu();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(mtime);
    h.set_size(size);
    if let Some(gnu) = h.as_gnu_mut() {
        gnu.uname[..4].copy_from_slice(b"root");
        gnu.gname[..4].copy_from_slice(b"root");
    }
    h
}

pub(super) fn mtime(meta: &Metadata) -> u64 {
    u64::try_from(meta.mtime()).unwrap_or(0)
}

pub(super) fn sha256_of(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::extract;
    use crate::archive::testutil::*;
    use std::collections::BTreeMap;
    use tempfile::TempDir;

    /// The names in a tar, in order.
    fn tar_names(tar: &[u8]) -> Vec<String> {
        tar::Archive::new(tar)
            .entries()
            .unwrap()
            .map(|e| String::from_utf8(e.unwrap().path_bytes().to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn a_pack_over_a_tree_leaves_out_what_is_there_and_the_manifest_reads_back() {
        let tmp = TempDir::new().unwrap();
        let src = tmp.path().join("src");
        fs::create_dir(&src).unwrap();
        sample_tree(&src);
        let (_, had) = pack_dir(&src, "repo").unwrap();
        // The manifest survives its bytes, and those bytes are all that is accepted.
        assert_eq!(Manifest::from_bytes(&had.to_bytes()).unwrap(), had);
        assert_eq!(
            Manifest::from_bytes(&Manifest::default().to_bytes()).unwrap(),
            Manifest::default()
        );
        let bytes = had.to_bytes();
        for bad in [
            &bytes[..bytes.len() - 1],
            &bytes[1..],
            b"kodx-manifest 1\nF\0../up\x00644\x001\x0000\0",
            b"kodx-manifest 1\nD\0a\099999\0\0\0",
            b"kodx-manifest 1\nX\0a\0\0\0\0",
        ] {
            assert!(
                Manifest::from_bytes(bad).is_err(),
                "{:?}",
                String::from_utf8_lossy(bad)
            );
        }

        // Nothing changed: only the prefix goes in.
        let limits = ArchiveLimits::default();
        let mut tar = Vec::new();
        let (manifest, skipped) =
            pack_over_to(&src, PackSource::Dir, "repo", &limits, Some(&had), &mut tar).unwrap();
        assert_eq!(manifest, had);
        assert_eq!(tar_names(&tar), ["repo/"]);
        assert_eq!(skipped.entries, had.len());

        // One file edited (same size), one mode changed, one added: those three go in.
        fs::write(src.join("bin/run.sh"), "#!/bin/sh\necho ho\n").unwrap();
        use std::os::unix::fs::PermissionsExt as _;
        fs::set_permissions(src.join("bin"), fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(src.join("new.txt"), "new").unwrap();
        let mut tar = Vec::new();
        let (manifest, skipped) =
            pack_over_to(&src, PackSource::Dir, "repo", &limits, Some(&had), &mut tar).unwrap();
        assert_eq!(
            tar_names(&tar),
            ["repo/", "repo/bin/", "repo/bin/run.sh", "repo/new.txt"]
        );
        assert_eq!(skipped.entries, had.len() - 2);
        assert_eq!(
            manifest,
            pack_dir(&src, "repo").unwrap().1,
            "the whole tree's baseline"
        );
    }

    #[test]
    fn pack_dir_then_extract_round_trips() {
        let tmp = TempDir::new().unwrap();
        let src = tmp.path().join("src");
        fs::create_dir(&src).unwrap();
        sample_tree(&src);
        let want = snapshot(&src);

        let (tar, manifest) = pack_dir(&src, "repo").unwrap();
        let out = tmp.path().join("out");
        let files = extract(&tar, "repo", &out, &ArchiveLimits::default()).unwrap();
        assert_eq!(snapshot(&out), want);
        let file_count = want
            .values()
            .filter(|s| matches!(s, Snap::File(..)))
            .count();
        assert_eq!(files, file_count);

        assert_eq!(manifest.len(), want.len());
        assert_eq!(
            manifest.get("bin/run.sh"),
            Some(&ManifestEntry::File {
                mode: 0o755,
                size: 18,
                sha256: sha256_of(b"#!/bin/sh\necho hi\n"),
            })
        );
        assert_eq!(
            manifest.get("odd-link"),
            Some(&ManifestEntry::Symlink {
                target: "./nested//deep/".into()
            })
        );
        assert_eq!(
            manifest.get("bin"),
            Some(&ManifestEntry::Dir { mode: 0o750 })
        );
        assert!(manifest.get("repo").is_none() && !manifest.is_empty());

        // Deterministic, owned by root, the prefix directory first.
        assert_eq!(pack_dir(&src, "repo").unwrap().0, tar);
        let mut archive = tar::Archive::new(tar.as_slice());
        let mut entries = archive.entries().unwrap().map(|e| e.unwrap());
        let first = entries.next().unwrap();
        assert_eq!(&*first.path_bytes(), b"repo/");
        assert_eq!(first.header().mode().unwrap(), 0o755);
        for entry in entries {
            assert_eq!(entry.header().uid().unwrap(), 0);
            assert_eq!(entry.header().gid().unwrap(), 0);
            assert_eq!(entry.header().username().unwrap(), Some("root"));
        }

        // Without a prefix the entries sit at the top.
        let (tar, _) = pack_dir(&src, "").unwrap();
        let top = tmp.path().join("top");
        extract(&tar, "", &top, &ArchiveLimits::default()).unwrap();
        assert_eq!(snapshot(&top), want);
    }

    #[test]
    fn pack_dir_skips_sockets() {
        let tmp = TempDir::new().unwrap();
        put(tmp.path(), "a", "a", 0o644);
        let _listener = std::os::unix::net::UnixListener::bind(tmp.path().join("sock")).unwrap();
        let (_, manifest) = pack_dir(tmp.path(), "repo").unwrap();
        assert_eq!(manifest.len(), 1);
        assert!(manifest.get("sock").is_none());
    }

    /// A repository at `dir` with one commit of `files` (`(path, contents, git mode)`),
    /// committed by libgit2 into `HEAD` on `main`; the files are not checked out.
    fn committed(dir: &Path, files: &[(&str, &[u8], i32)]) -> git2::Repository {
        let repo = git2::Repository::init(dir).unwrap();
        let mut index = repo.index().unwrap();
        for (path, data, mode) in files {
            let entry = git2::IndexEntry {
                ctime: git2::IndexTime::new(0, 0),
                mtime: git2::IndexTime::new(0, 0),
                dev: 0,
                ino: 0,
                mode: *mode as u32,
                uid: 0,
                gid: 0,
                file_size: data.len() as u32,
                id: repo.blob(data).unwrap(),
                flags: 0,
                flags_extended: 0,
                path: path.as_bytes().to_vec(),
            };
            index.add(&entry).unwrap();
        }
        let tree = index.write_tree().unwrap();
        commit_tree(&repo, tree);
        drop(index);
        repo
    }

    /// Points `HEAD` (branch `main`) at a new commit of `tree`.
    fn commit_tree(repo: &git2::Repository, tree: git2::Oid) {
        let sig =
            git2::Signature::new("T", "t@example.com", &git2::Time::new(1_700_000_000, 0)).unwrap();
        let tree = repo.find_tree(tree).unwrap();
        let parent = repo.head().ok().map(|h| h.peel_to_commit().unwrap());
        let parents: Vec<&git2::Commit<'_>> = parent.iter().collect();
        repo.commit(Some("HEAD"), &sig, &sig, "c", &tree, &parents)
            .unwrap();
    }

    const SAMPLE: &[(&str, &[u8], i32)] = &[
        ("README.md", b"# hi\n", 0o100644),
        ("bin/run.sh", b"#!/bin/sh\necho hi\n", 0o100755),
        ("docs/deep/nested/x.txt", b"x", 0o100644),
        ("docs/link", b"../README.md", 0o120000),
        ("odd-link", b"./docs//deep/", 0o120000),
        ("empty", b"", 0o100644),
    ];

    #[test]
    fn pack_checkout_matches_a_checkout_packed_from_disk() {
        let tmp = TempDir::new().unwrap();
        let repo_dir = tmp.path().join("repo");
        let repo = committed(&repo_dir, SAMPLE);
        // A submodule entry: an empty directory once checked out.
        let head = repo.head().unwrap().peel_to_tree().unwrap();
        let mut builder = repo.treebuilder(Some(&head)).unwrap();
        builder
            .insert(
                "vendor-sub",
                git2::Oid::from_str(&"ab".repeat(20)).unwrap(),
                0o160000,
            )
            .unwrap();
        let tree = builder.write().unwrap();
        commit_tree(&repo, tree);
        let mut index = repo.index().unwrap();
        index.read_tree(&repo.find_tree(tree).unwrap()).unwrap();
        index.write().unwrap();

        // Straight from the objects: nothing but .git is on disk.
        assert_eq!(names(&repo_dir), [".git"]);
        let mut from_objects = Vec::new();
        let manifest = pack_checkout_to(
            &repo_dir,
            "repo",
            &ArchiveLimits::default(),
            &mut from_objects,
        )
        .unwrap();
        assert_eq!(names(&repo_dir), [".git"], "nothing was written");
        // Deterministic.
        let mut again = Vec::new();
        pack_checkout_to(&repo_dir, "repo", &ArchiveLimits::default(), &mut again).unwrap();
        assert!(again == from_objects, "the same tar twice");

        // The same files checked out by libgit2, then packed from disk.
        repo.checkout_head(Some(git2::build::CheckoutBuilder::new().force()))
            .unwrap();
        let (from_disk, disk_manifest) = pack_dir(&repo_dir, "repo").unwrap();

        assert_eq!(manifest.without_git(), disk_manifest.without_git());
        assert_eq!(
            manifest.without_git().len(),
            11,
            "{:?}",
            manifest
                .without_git()
                .entries()
                .map(|(p, _)| p)
                .collect::<Vec<_>>()
        );
        // .git went in as well, its config rewritten (the same as from disk).
        assert!(matches!(
            manifest.get(".git"),
            Some(ManifestEntry::Dir { .. })
        ));
        assert_eq!(
            manifest.get(".git/config"),
            disk_manifest.get(".git/config")
        );
        assert_eq!(manifest.get(".git/HEAD"), disk_manifest.get(".git/HEAD"));

        // Extracted, both tars give the same tree (the index aside: its stat data differs).
        let out_a = tmp.path().join("a");
        let out_b = tmp.path().join("b");
        extract(&from_objects, "repo", &out_a, &ArchiveLimits::default()).unwrap();
        extract(&from_disk, "repo", &out_b, &ArchiveLimits::default()).unwrap();
        let mut a = snapshot(&out_a);
        let mut b = snapshot(&out_b);
        a.remove(".git/index");
        b.remove(".git/index");
        assert_eq!(a, b);
        assert_eq!(
            a.get("bin/run.sh"),
            Some(&Snap::File(0o755, b"#!/bin/sh\necho hi\n".to_vec()))
        );
        assert_eq!(a.get("vendor-sub"), Some(&Snap::Dir(0o755)));
    }

    /// The tip-only `.git`: the same work tree as with the whole `.git`, and a shallow
    /// repository that holds the commit, its trees and blobs (each once), nothing older.
    #[test]
    fn pack_tip_holds_the_commit_alone() {
        let tmp = TempDir::new().unwrap();
        let repo_dir = tmp.path().join("repo");
        let repo = committed(&repo_dir, &[("old.txt", b"old\n", 0o100644)]);
        let old_blob = repo.blob(b"old\n").unwrap();
        let first = repo.head().unwrap().peel_to_commit().unwrap().id();
        let mut files = SAMPLE.to_vec();
        files.push(("copy/README.md", b"# hi\n", 0o100644)); // the same blob twice
        let second = committed(&tmp.path().join("scratch"), &files);
        let tree = second.head().unwrap().peel_to_tree().unwrap();
        // The same objects in `repo`, as a second commit over the first.
        let odb = repo.odb().unwrap();
        let second_odb = second.odb().unwrap();
        for id in [tree.id()] {
            let mut stack = vec![id];
            while let Some(id) = stack.pop() {
                let o = second_odb.read(id).unwrap();
                odb.write(o.kind(), o.data()).unwrap();
                if o.kind() == git2::ObjectType::Tree {
                    let t = second.find_tree(id).unwrap();
                    stack.extend(t.iter().map(|e| e.id()));
                }
            }
        }
        commit_tree(&repo, tree.id());
        let head = repo.head().unwrap().peel_to_commit().unwrap();
        assert_eq!(head.parent_id(0).unwrap(), first);
        let mut index = repo.index().unwrap();
        index.read_tree(&tree).unwrap();
        index.write().unwrap();

        let mut tip_tar = Vec::new();
        let manifest =
            pack_tip_to(&repo_dir, "repo", &ArchiveLimits::default(), &mut tip_tar).unwrap();
        let mut whole_tar = Vec::new();
        let whole =
            pack_checkout_to(&repo_dir, "repo", &ArchiveLimits::default(), &mut whole_tar).unwrap();
        assert_eq!(manifest.without_git(), whole.without_git());
        assert_eq!(manifest.get(".git/index"), whole.get(".git/index"));
        assert_eq!(manifest.get(".git/HEAD"), whole.get(".git/HEAD"));
        let packs: Vec<&String> = manifest
            .entries
            .keys()
            .filter(|p| p.starts_with(".git/objects/"))
            .collect();
        assert_eq!(packs.len(), 3, "{packs:?}"); // pack/, .pack, .idx
                                                 // Deterministic.
        let mut again = Vec::new();
        pack_tip_to(&repo_dir, "repo", &ArchiveLimits::default(), &mut again).unwrap();
        assert!(again == tip_tar, "the same tar twice");

        let out = tmp.path().join("out");
        extract(&tip_tar, "repo", &out, &ArchiveLimits::default()).unwrap();
        assert_eq!(
            fs::read_to_string(out.join(".git/shallow")).unwrap(),
            format!("{}\n", head.id())
        );
        let copy = git2::Repository::open(&out).unwrap();
        assert!(copy.is_shallow());
        let tip = copy.head().unwrap().peel_to_commit().unwrap();
        assert_eq!(tip.id(), head.id());
        assert_eq!(tip.parent_count(), 0, "the history stops at the tip");
        assert!(copy.find_commit(first).is_err());
        assert!(copy.find_blob(old_blob).is_err());
        // Every object of the tip's tree reads back; the work tree is clean against it.
        tip.tree()
            .unwrap()
            .walk(git2::TreeWalkMode::PreOrder, |_, e| {
                let o = copy.find_object(e.id(), None);
                assert!(o.is_ok() || e.filemode() == 0o160000, "{:?}", e.name());
                git2::TreeWalkResult::Ok
            })
            .unwrap();
        let statuses = copy
            .statuses(Some(git2::StatusOptions::new().include_untracked(true)))
            .unwrap();
        let dirty: Vec<String> = statuses
            .iter()
            .map(|s| format!("{:?} {:?}", s.path(), s.status()))
            .collect();
        assert!(dirty.is_empty(), "{dirty:?}");
        // Six blobs (one of them at two paths), six trees, the commit.
        let odb = copy.odb().unwrap();
        let mut count = 0;
        odb.foreach(|_| {
            count += 1;
            true
        })
        .unwrap();
        assert_eq!(count, 6 + 6 + 1, "objects in the pack");
    }

    /// A commit of a hand-written tree object: `entries` as `(mode, name, object)`.
    fn raw_tree(repo: &git2::Repository, entries: &[(&str, &[u8], git2::Oid)]) -> git2::Oid {
        let mut raw = Vec::new();
        for (mode, name, id) in entries {
            raw.extend_from_slice(mode.as_bytes());
            raw.push(b' ');
            raw.extend_from_slice(name);
            raw.push(0);
            raw.extend_from_slice(id.as_bytes());
        }
        repo.odb()
            .unwrap()
            .write(git2::ObjectType::Tree, &raw)
            .unwrap()
    }

    #[test]
    fn pack_checkout_refuses_hostile_trees() {
        let tmp = TempDir::new().unwrap();
        let dir = tmp.path().join("repo");
        let repo = committed(&dir, &[("ok.txt", b"ok", 0o100644)]);
        let blob = repo.blob(b"data").unwrap();
        let empty = raw_tree(&repo, &[("100644", b"f", blob)]);
        type Entries<'a> = Vec<(&'a str, &'a [u8], git2::Oid)>;
        let cases: Vec<(Entries<'_>, &str)> = vec![
            (vec![("40000", b".git", empty)], "`.git` entry"),
            (vec![("40000", b".GIT", empty)], "`.git` entry"),
            (vec![("100644", b".git. ", blob)], "`.git` entry"),
            (vec![("40000", b"GIT~1", empty)], "`.git` entry"),
            (vec![("100644", b"..", blob)], "`..`"),
            (vec![("100644", b"a/b", blob)], "with `/`"),
            (vec![("100644", b"caf\xe9", blob)], "not UTF-8"),
            (
                vec![("120000", b"l", repo.blob(b"\xff").unwrap())],
                "not UTF-8",
            ),
            (
                vec![("120000", b"l", repo.blob(b"").unwrap())],
                "empty symlink",
            ),
            (
                vec![("100644", b"big", repo.blob(&[7; 2000]).unwrap())],
                "over the limit",
            ),
        ];
        let limits = ArchiveLimits {
            max_file_bytes: 1000,
            ..ArchiveLimits::default()
        };
        for (entries, want) in cases {
            let sub = raw_tree(&repo, &entries);
            let top = raw_tree(&repo, &[("40000", b"sub", sub)]);
            commit_tree(&repo, top);
            let Err(err) = pack_checkout_to(&dir, "repo", &limits, io::sink()) else {
                panic!("accepted: {entries:?}");
            };
            let msg = err.to_string();
            assert!(matches!(err, SandboxError::InvalidInput(_)), "{msg}");
            assert!(msg.contains(want), "{entries:?}: {msg}");
            assert!(msg.contains("`sub/"), "{msg}");
            assert!(!msg.contains('\n'), "{msg}");
        }

        // Counts and totals are bounded too.
        let many: Vec<(String, git2::Oid)> = (0..20).map(|i| (format!("f{i:02}"), blob)).collect();
        let many: Vec<(&str, &[u8], git2::Oid)> = many
            .iter()
            .map(|(n, id)| ("100644", n.as_bytes(), *id))
            .collect();
        commit_tree(&repo, raw_tree(&repo, &many));
        let few = ArchiveLimits {
            max_entries: 10,
            ..ArchiveLimits::default()
        };
        let msg = pack_checkout_to(&dir, "", &few, io::sink())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("entries"), "{msg}");
        let small = ArchiveLimits {
            max_total_bytes: 50,
            ..ArchiveLimits::default()
        };
        let msg = pack_checkout_to(&dir, "", &small, io::sink())
            .unwrap_err()
            .to_string();
        assert!(msg.contains("adding up to"), "{msg}");
        assert!(pack_checkout_to(&dir, "", &ArchiveLimits::default(), io::sink()).is_ok());
    }

    #[test]
    fn pack_file_holds_one_file() {
        let tar = pack_file("setup.sh", b"echo hi\n", 0o755);
        assert!(tar.ends_with(&[0; 1024]));
        let tmp = TempDir::new().unwrap();
        let out = tmp.path().join("out");
        assert_eq!(
            extract(&tar, "", &out, &ArchiveLimits::default()).unwrap(),
            1
        );
        assert_eq!(
            snapshot(&out),
            BTreeMap::from([("setup.sh".into(), Snap::File(0o755, b"echo hi\n".to_vec()))])
        );
        let mut archive = tar::Archive::new(tar.as_slice());
        let entry = archive.entries().unwrap().next().unwrap().unwrap();
        assert_eq!(entry.header().uid().unwrap(), 0);
    }
}
