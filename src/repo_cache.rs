//! The repository cache (issue 11): one bare mirror per repository under
//! `<root>/<owner>/<name>.git`, refreshed by incremental fetches, from which each run gets
//! its own clone without touching the network again.
//!
//! - **Network.** A refresh fetches only the ref the run needs (the default branch, a
//!   branch, or a pull request's head) into the mirror under the same name; the server sends
//!   only the objects the mirror lacks, and nothing at all when the mirror has the commit
//!   the server advertises. The token goes through git2's credential callback
//!   ([`crate::git::fetch_mirror`]): never into a URL, the mirror's configuration or a log.
//! - **History only where a run needs it** ([`git::History`]). An issue's or an `ask`
//!   run needs the tip alone: a mirror it creates is shallow (depth 1: one commit's
//!   objects, not 20,000 commits of history), and later tips come at depth 1 too. A run on
//!   a pull request deepens a shallow mirror to the whole history once; a whole mirror
//!   stays whole. A clone carries its mirror's `shallow` list.
//! - **Runs share nothing mutable.** A run's clone hard-links the mirror's pack files (which
//!   nothing ever writes again) and has its own refs, index and work tree
//!   ([`crate::git::clone_from_mirror`]). Once made, it no longer needs the mirror: the
//!   mirror may be refreshed, evicted or rebuilt meanwhile.
//! - **Concurrency.** Each mirror has a lock file (`<root>/<owner>/<name>.lock`, `flock`)
//!   held while it is checked, fetched into and cloned from; runs on one repository (in
//!   this process or another) take turns for that part, and each sees a consistent tip.
//! - **Crashes.** A marker file is written into the mirror before a fetch and removed after
//!   it. Finding it means a fetch died midway (killed, or the machine stopped): stale
//!   `*.lock` files and unfinished packs are removed, every ref must resolve to a commit
//!   whose tree exists, and otherwise the mirror is rebuilt from scratch.
//! - **Size.** After each use the mirrors are kept under a byte budget: the least recently
//!   used go first (last use is the lock file's mtime), never one whose lock is held.
//!
//! Everything here blocks: callers run it in `spawn_blocking`.

use std::fs::{self, File};
use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use crate::git::{self, Checkout, FetchProgress, GitError, History, MirrorTip};

/// The default byte budget of all mirrors together: 10 GiB.
pub const DEFAULT_MAX_BYTES: u64 = 10 << 30;
/// Written into a mirror before a fetch, removed after it.
const MARKER: &str = "kodx-fetch-in-progress";
/// Where mirrors go to be deleted (a rename is atomic; the deletion may be cut short).
const TRASH: &str = ".trash";
/// Longest owner or repository name accepted.
const MAX_NAME_CHARS: usize = 100;

/// Why the cache could not give a run its clone. One line a maintainer can act on.
#[derive(Debug, thiserror::Error)]
pub enum CacheError {
    #[error(transparent)]
    Git(#[from] GitError),
    #[error("refusing the repository name `{name}`: {why}")]
    InvalidName { name: String, why: String },
    #[error(
        "the repository cache could not {what} {}: {source}; check that the data volume \
         is writable and has free space",
        path.display()
    )]
    Io {
        what: &'static str,
        path: PathBuf,
        source: io::Error,
    },
}

type Result<T> = std::result::Result<T, CacheError>;

fn io_err<'p>(what: &'static str, path: &'p Path) -> impl FnOnce(io::Error) -> CacheError + 'p {
    move |source| CacheError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// A repository's place in the cache: `owner/name`, validated and lower-cased (GitHub's
/// names are case-insensitive, so `Acme/Widgets` and `acme/widgets` share one mirror).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepoKey {
    owner: String,
    name: String,
}

impl RepoKey {
    /// From `owner/name` (a webhook's `full_name`).
    pub fn parse(full_name: &str) -> Result<RepoKey> {
        let invalid = |why: &str| CacheError::InvalidName {
            name: full_name
                .chars()
                .take(200)
                .collect::<String>()
                .escape_debug()
                .to_string(),
            why: why.to_string(),
        };
        let (owner, name) = full_name
            .split_once('/')
            .ok_or_else(|| invalid("it is not of the form owner/name"))?;
        check_segment(owner, false).map_err(|why| invalid(&format!("the owner {why}")))?;
        check_segment(name, true).map_err(|why| invalid(&format!("the name {why}")))?;
        Ok(RepoKey {
            owner: owner.to_ascii_lowercase(),
            name: name.to_ascii_lowercase(),
        })
    }

    pub fn owner(&self) -> &str {
        &self.owner
    }

    pub fn name(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Display for RepoKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.owner, self.name)
    }
}

/// ASCII letters, digits, `-`, `_` and `.`, at most [`MAX_NAME_CHARS`], not `.` or `..`;
/// only a repository name may start with a dot (`.github`).
fn check_segment(s: &str, leading_dot: bool) -> std::result::Result<(), String> {
    if s.is_empty() {
        return Err("is empty".into());
    }
    if s.len() > MAX_NAME_CHARS {
        return Err(format!("is longer than {MAX_NAME_CHARS} characters"));
    }
    if !s
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err("has characters other than letters, digits, `-`, `_` and `.`".into());
    }
    if s == "." || s == ".." || (s.starts_with('.') && !leading_dot) {
        return Err("starts with a dot".into());
    }
    Ok(())
}

/// What happened to a mirror that a fetch left midway.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recovery {
    /// Its stale lock files and unfinished packs were removed; every ref was sound.
    Repaired,
    /// It was unsound, and was fetched again from scratch.
    Rebuilt,
}

/// A run's clone, as [`RepoCache::checkout`] made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckedOut {
    /// The commit checked out.
    pub commit: String,
    /// The local branch checked out (as [`git::clone`] names it).
    pub branch: String,
    /// Whether the refresh downloaded anything (`false`: the mirror was up to date).
    pub fetched: bool,
    /// Objects and bytes the refresh received.
    pub received_objects: usize,
    pub received_bytes: usize,
    /// Whether the mirror, and so the clone, is shallow (holds only the tips it was
    /// asked for).
    pub shallow: bool,
    /// Set when the mirror was found as a crashed fetch left it.
    pub recovery: Option<Recovery>,
    /// Time spent refreshing the mirror (ref list and fetch), and making the clone.
    pub fetch_took: Duration,
    pub clone_took: Duration,
}

/// One mirror on disk, for eviction and reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MirrorInfo {
    pub key: RepoKey,
    pub bytes: u64,
    pub last_used: SystemTime,
}

/// The mirrors under one directory, kept under a byte budget.
#[derive(Debug, Clone)]
pub struct RepoCache {
    root: PathBuf,
    max_bytes: u64,
}

/// An exclusive hold on one mirror: the open, locked lock file (released when dropped).
struct Held {
    _file: File,
}

impl RepoCache {
    /// The cache in `root` (created when first used), keeping its mirrors under
    /// `max_bytes` in all.
    pub fn new(root: impl Into<PathBuf>, max_bytes: u64) -> RepoCache {
        RepoCache {
            root: root.into(),
            max_bytes,
        }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// `<root>/<owner>/<name>.git`
    pub fn mirror_path(&self, key: &RepoKey) -> PathBuf {
        self.root.join(&key.owner).join(format!("{}.git", key.name))
    }

    fn lock_path(&self, key: &RepoKey) -> PathBuf {
        self.root
            .join(&key.owner)
            .join(format!("{}.lock", key.name))
    }

    /// Waits for, and takes, the mirror's lock; marks the mirror as used now.
    fn hold(&self, key: &RepoKey) -> Result<Held> {
        let path = self.lock_path(key);
        let dir = path.parent().unwrap_or(&self.root);
        fs::create_dir_all(dir).map_err(io_err("create", dir))?;
        let file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .map_err(io_err("open the lock file", &path))?;
        flock(&file, true).map_err(io_err("lock", &path))?;
        // The last use, for eviction; a failure here only makes the mirror look older.
        let _ = file.set_modified(SystemTime::now());
        Ok(Held { _file: file })
    }

    /// Makes `dest` (absent or empty) a clone of `url` at what `want` names now, through
    /// the repository's mirror: the mirror is refreshed (created on first use), `dest` is
    /// cloned from it, and the mirrors are brought back under the budget. `files`: check
    /// the files out on the host; otherwise only the index is written (the tree goes into
    /// the container from the objects, [`crate::sandbox::archive::pack_checkout_to`]).
    ///
    /// `dest` on the cache's filesystem makes the clone cost no bytes (hard links).
    pub fn checkout(
        &self,
        key: &RepoKey,
        url: &str,
        token: &str,
        want: &Checkout,
        dest: &Path,
        files: bool,
    ) -> Result<CheckedOut> {
        self.checkout_for(key, url, token, want, History::Whole, dest, files)
    }

    /// As [`RepoCache::checkout`], with the mirror holding `history` of `want` (see
    /// [`History`]: a run that needs only the tip makes a new mirror shallow, one that
    /// needs the history deepens a shallow mirror). The clone is as shallow as the mirror.
    #[allow(clippy::too_many_arguments)]
    pub fn checkout_for(
        &self,
        key: &RepoKey,
        url: &str,
        token: &str,
        want: &Checkout,
        history: History,
        dest: &Path,
        files: bool,
    ) -> Result<CheckedOut> {
        let held = self.hold(key)?;
        let started = Instant::now();
        let (tip, recovery) = self.refresh_held(key, url, token, want, history, None)?;
        let fetch_took = started.elapsed();
        let started = Instant::now();
        let cloned = git::clone_from_mirror(&self.mirror_path(key), &tip, url, want, dest, files)?;
        let clone_took = started.elapsed();
        drop(held);
        if let Err(e) = self.evict(Some(key)) {
            tracing::warn!("keeping the repository cache under its budget failed: {e}");
        }
        Ok(CheckedOut {
            commit: cloned.head_sha,
            branch: cloned.branch,
            fetched: tip.fetched,
            received_objects: tip.received_objects,
            received_bytes: tip.received_bytes,
            shallow: tip.shallow,
            recovery,
            fetch_took,
            clone_took,
        })
    }

    /// Refreshes the mirror for `want` (creating it on first use), holding its lock.
    /// `progress` hears how the download goes and may stop it.
    pub fn refresh(
        &self,
        key: &RepoKey,
        url: &str,
        token: &str,
        want: &Checkout,
        progress: Option<&mut FetchProgress<'_>>,
    ) -> Result<(MirrorTip, Option<Recovery>)> {
        let _held = self.hold(key)?;
        self.refresh_held(key, url, token, want, History::Whole, progress)
    }

    fn refresh_held(
        &self,
        key: &RepoKey,
        url: &str,
        token: &str,
        want: &Checkout,
        history: History,
        progress: Option<&mut FetchProgress<'_>>,
    ) -> Result<(MirrorTip, Option<Recovery>)> {
        let dir = self.mirror_path(key);
        let mut recovery = None;
        if dir.join(MARKER).exists() {
            let r = self.recover(&dir)?;
            tracing::warn!(repo = %key, ?r, "an earlier fetch into the mirror stopped midway");
            recovery = Some(r);
        } else if dir.exists() && git2::Repository::open_bare(&dir).is_err() {
            self.rebuild(&dir)?;
            tracing::warn!(repo = %key, "the mirror could not be opened: rebuilt");
            recovery = Some(Recovery::Rebuilt);
        }
        if !dir.exists() {
            init_mirror(&dir)?;
        }
        let stopped = std::cell::Cell::new(false);
        let mut progress = progress;
        let mut report = |objects: usize, total: usize, bytes: usize| {
            let go_on = match progress.as_mut() {
                Some(p) => p(objects, total, bytes),
                None => true,
            };
            stopped.set(!go_on);
            go_on
        };
        let marker = dir.join(MARKER);
        File::create(&marker)
            .and_then(|f| f.sync_all())
            .map_err(io_err("write the marker", &marker))?;
        let fetched = git::fetch_mirror_for(&dir, url, token, want, history, Some(&mut report));
        let fetched = match fetched {
            // A local failure (not the network, the server or a stop asked for): the
            // mirror itself is suspect. Fetched again from scratch, once.
            Err(GitError::Other(why)) if !stopped.get() => {
                tracing::warn!(repo = %key, why, "fetching into the mirror failed: rebuilding it");
                self.rebuild(&dir)?;
                init_mirror(&dir)?;
                recovery = Some(Recovery::Rebuilt);
                File::create(&marker)
                    .and_then(|f| f.sync_all())
                    .map_err(io_err("write the marker", &marker))?;
                git::fetch_mirror_for(&dir, url, token, want, history, Some(&mut report))
            }
            other => other,
        };
        if fetched.is_err() {
            // What a failed fetch left (libgit2 cleans up after itself; a stop may not).
            clean_unfinished(&dir).map_err(io_err("clean up", &dir))?;
        }
        fs::remove_file(&marker).map_err(io_err("remove the marker", &marker))?;
        Ok((fetched?, recovery))
    }

    /// After a fetch died midway: removes what it left, then checks every ref; an unsound
    /// mirror is rebuilt (emptied; the next fetch fills it).
    fn recover(&self, dir: &Path) -> Result<Recovery> {
        clean_unfinished(dir).map_err(io_err("clean up", dir))?;
        if mirror_is_sound(dir) {
            let marker = dir.join(MARKER);
            fs::remove_file(&marker).map_err(io_err("remove the marker", &marker))?;
            Ok(Recovery::Repaired)
        } else {
            self.rebuild(dir)?;
            Ok(Recovery::Rebuilt)
        }
    }

    /// Moves the mirror at `dir` out of the way (to the trash) and deletes it.
    fn rebuild(&self, dir: &Path) -> Result<()> {
        self.trash(dir)?;
        self.empty_trash();
        Ok(())
    }

    /// Renames `dir` into the trash: atomic, so no one ever sees half a mirror.
    fn trash(&self, dir: &Path) -> Result<()> {
        let trash = self.root.join(TRASH);
        fs::create_dir_all(&trash).map_err(io_err("create", &trash))?;
        let to = trash.join(format!(
            "{}-{:032x}",
            std::process::id(),
            rand::random::<u128>()
        ));
        fs::rename(dir, &to).map_err(io_err("move away", dir))
    }

    /// Deletes what is in the trash (best effort: a failure is logged and retried later).
    fn empty_trash(&self) {
        let trash = self.root.join(TRASH);
        let Ok(entries) = fs::read_dir(&trash) else {
            return;
        };
        for entry in entries.flatten() {
            if let Err(e) = fs::remove_dir_all(entry.path()) {
                tracing::warn!(path = %entry.path().display(), "could not delete an old mirror: {e}");
            }
        }
    }

    /// Every mirror in the cache, with its size and last use.
    pub fn mirrors(&self) -> Result<Vec<MirrorInfo>> {
        let mut out = Vec::new();
        let owners = match fs::read_dir(&self.root) {
            Ok(o) => o,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(out),
            Err(e) => return Err(io_err("read", &self.root)(e)),
        };
        for owner in owners {
            let owner = owner.map_err(io_err("read", &self.root))?;
            let Ok(owner_name) = owner.file_name().into_string() else {
                continue;
            };
            if check_segment(&owner_name, false).is_err() || !owner.path().is_dir() {
                continue;
            }
            for repo in fs::read_dir(owner.path()).map_err(io_err("read", &owner.path()))? {
                let repo = repo.map_err(io_err("read", &owner.path()))?;
                let Ok(file) = repo.file_name().into_string() else {
                    continue;
                };
                let Some(name) = file.strip_suffix(".git") else {
                    continue;
                };
                let Ok(key) = RepoKey::parse(&format!("{owner_name}/{name}")) else {
                    continue;
                };
                let bytes = dir_bytes(&repo.path());
                let last_used = fs::metadata(self.lock_path(&key))
                    .or_else(|_| fs::metadata(repo.path()))
                    .and_then(|m| m.modified())
                    .unwrap_or(SystemTime::UNIX_EPOCH);
                out.push(MirrorInfo {
                    key,
                    bytes,
                    last_used,
                });
            }
        }
        out.sort_by(|a, b| a.last_used.cmp(&b.last_used).then(a.key.cmp(&b.key)));
        Ok(out)
    }

    /// Deletes least recently used mirrors until all fit in the budget. `keep` (the mirror
    /// just used) and mirrors whose lock someone holds are never deleted. Returns the
    /// mirrors deleted.
    pub fn evict(&self, keep: Option<&RepoKey>) -> Result<Vec<RepoKey>> {
        self.empty_trash();
        let mirrors = self.mirrors()?;
        let mut total: u64 = mirrors.iter().map(|m| m.bytes).sum();
        let mut evicted = Vec::new();
        for m in &mirrors {
            if total <= self.max_bytes {
                break;
            }
            if Some(&m.key) == keep {
                continue;
            }
            let path = self.lock_path(&m.key);
            let Ok(file) = File::options().read(true).write(true).open(&path) else {
                continue;
            };
            match flock(&file, false) {
                Ok(true) => {}
                Ok(false) => continue, // in use
                Err(e) => return Err(io_err("lock", &path)(e)),
            }
            // The lock file stays (deleting it could let two holders in at once).
            self.trash(&self.mirror_path(&m.key))?;
            drop(file);
            tracing::info!(repo = %m.key, bytes = m.bytes, "evicted the mirror (least recently used)");
            total = total.saturating_sub(m.bytes);
            evicted.push(m.key.clone());
        }
        if total > self.max_bytes {
            tracing::warn!(
                total,
                budget = self.max_bytes,
                "the repository cache is over its budget: the rest is in use"
            );
        }
        self.empty_trash();
        Ok(evicted)
    }
}

/// Takes the exclusive `flock` of `file`: waiting for it (`wait`), or not (then `false`
/// when someone else holds it). Released when the file is closed.
fn flock(file: &File, wait: bool) -> io::Result<bool> {
    use std::os::fd::AsRawFd;
    let op = if wait {
        libc::LOCK_EX
    } else {
        libc::LOCK_EX | libc::LOCK_NB
    };
    loop {
        // SAFETY: flock on a descriptor `file` owns and keeps open for the call.
        if unsafe { libc::flock(file.as_raw_fd(), op) } == 0 {
            return Ok(true);
        }
        let e = io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EINTR) => continue,
            Some(libc::EWOULDBLOCK) if !wait => return Ok(false),
            _ => return Err(e),
        }
    }
}

/// A fresh, empty bare repository at `dir` (no template files, no reflogs).
fn init_mirror(dir: &Path) -> Result<()> {
    let mut opts = git2::RepositoryInitOptions::new();
    opts.bare(true).external_template(false).mkpath(true);
    let repo = git2::Repository::init_opts(dir, &opts)
        .map_err(|e| GitError::Other(e.message().to_string()))?;
    repo.config()
        .and_then(|mut c| c.set_bool("core.logAllRefUpdates", false))
        .map_err(|e| GitError::Other(e.message().to_string()))?;
    Ok(())
}

/// Removes what a fetch stopped midway leaves: `*.lock` files anywhere in the mirror
/// (they would block every later ref update), and in the object store every file that is
/// not a complete pack (`pack-<hex>.pack` with its `.idx`) or a loose object.
fn clean_unfinished(dir: &Path) -> io::Result<()> {
    fn locks(dir: &Path) -> io::Result<()> {
        for entry in fs::read_dir(dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            let path = entry.path();
            if kind.is_dir() {
                if entry.file_name() != "objects" {
                    locks(&path)?;
                }
            } else if path.extension().is_some_and(|e| e == "lock") {
                fs::remove_file(&path)?;
            }
        }
        Ok(())
    }
    locks(dir)?;
    let objects = dir.join("objects");
    let packs = objects.join("pack");
    if packs.is_dir() {
        let names: Vec<String> = fs::read_dir(&packs)?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        let complete = |stem: &str| {
            names.contains(&format!("{stem}.pack")) && names.contains(&format!("{stem}.idx"))
        };
        for name in &names {
            let keep = name
                .strip_suffix(".pack")
                .or_else(|| name.strip_suffix(".idx"))
                .is_some_and(|stem| stem.starts_with("pack-") && complete(stem));
            if !keep {
                fs::remove_file(packs.join(name))?;
            }
        }
    }
    if objects.is_dir() {
        for entry in fs::read_dir(&objects)? {
            let entry = entry?;
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if name.len() != 2 || !entry.file_type()?.is_dir() {
                if entry.file_type()?.is_file() {
                    fs::remove_file(entry.path())?;
                }
                continue;
            }
            for object in fs::read_dir(entry.path())? {
                let object = object?;
                let file = object.file_name();
                let file = file.to_string_lossy();
                if file.len() != 38 || !file.bytes().all(|b| b.is_ascii_hexdigit()) {
                    fs::remove_file(object.path())?;
                }
            }
        }
    }
    Ok(())
}

/// Whether the mirror opens and every ref resolves to a commit whose tree exists.
fn mirror_is_sound(dir: &Path) -> bool {
    let Ok(repo) = git2::Repository::open_bare(dir) else {
        return false;
    };
    let Ok(refs) = repo.references() else {
        return false;
    };
    for r in refs {
        let ok = r
            .and_then(|r| r.peel_to_commit())
            .and_then(|c| c.tree().map(|_| ()));
        if ok.is_err() {
            return false;
        }
    }
    true
}

/// Bytes of the files under `dir` (0 for what cannot be read).
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
            _ => 0,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        let k = RepoKey::parse("Acme/Widgets").unwrap();
        assert_eq!((k.owner(), k.name()), ("acme", "widgets"));
        assert_eq!(k, RepoKey::parse("acme/widgets").unwrap());
        assert_eq!(k.to_string(), "acme/widgets");
        assert!(RepoKey::parse("acme/.github").is_ok());
        assert!(RepoKey::parse("my_org/a.b-c_d").is_ok());
        for bad in [
            "",
            "acme",
            "acme/",
            "/widgets",
            "acme/widgets/x",
            "../widgets",
            "acme/..",
            "acme/.",
            ".acme/widgets",
            "acme/wid gets",
            "acme/wid\0gets",
            "acme/widgets\n",
            "acme/wïdgets",
            "acme\\x/widgets",
        ] {
            let e = RepoKey::parse(bad).unwrap_err();
            assert!(
                matches!(e, CacheError::InvalidName { .. }),
                "{bad:?} accepted"
            );
            assert!(!e.to_string().contains('\n'), "{e}");
        }
        let long = format!("acme/{}", "a".repeat(101));
        assert!(RepoKey::parse(&long).is_err());
        assert!(RepoKey::parse(&format!("acme/{}", "a".repeat(100))).is_ok());
    }

    #[test]
    fn paths_stay_under_the_root() {
        let cache = RepoCache::new("/data/mirrors", DEFAULT_MAX_BYTES);
        let k = RepoKey::parse("Acme/.github").unwrap();
        assert_eq!(
            cache.mirror_path(&k),
            Path::new("/data/mirrors/acme/.github.git")
        );
        assert_eq!(
            cache.lock_path(&k),
            Path::new("/data/mirrors/acme/.github.lock")
        );
    }

    #[test]
    fn unfinished_fetches_are_cleaned() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("m.git");
        init_mirror(&dir).unwrap();
        let packs = dir.join("objects/pack");
        fs::create_dir_all(&packs).unwrap();
        for f in [
            "pack-ab12.pack",
            "pack-ab12.idx",
            "pack-cd34.pack", // no index: unfinished
            "pack_git2_XyZ",  // libgit2's temporary pack
        ] {
            fs::write(packs.join(f), b"x").unwrap();
        }
        fs::create_dir_all(dir.join("objects/ab")).unwrap();
        fs::write(dir.join("objects/ab").join("c".repeat(38)), b"x").unwrap();
        fs::write(dir.join("objects/ab/tmp_object_git2_1"), b"x").unwrap();
        fs::create_dir_all(dir.join("refs/heads")).unwrap();
        fs::write(dir.join("refs/heads/main.lock"), b"x").unwrap();
        fs::write(dir.join("packed-refs.lock"), b"x").unwrap();
        clean_unfinished(&dir).unwrap();
        let mut left: Vec<String> = fs::read_dir(&packs)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, ["pack-ab12.idx", "pack-ab12.pack"]);
        assert!(dir.join("objects/ab").join("c".repeat(38)).exists());
        assert!(!dir.join("objects/ab/tmp_object_git2_1").exists());
        assert!(!dir.join("refs/heads/main.lock").exists());
        assert!(!dir.join("packed-refs.lock").exists());
        assert!(dir.join("HEAD").exists());
        // An empty mirror is sound; one with a ref to a missing commit is not.
        let clean = tmp.path().join("clean.git");
        init_mirror(&clean).unwrap();
        assert!(mirror_is_sound(&clean));
        fs::create_dir_all(clean.join("refs/heads")).unwrap();
        fs::write(
            clean.join("refs/heads/main"),
            format!("{}\n", "1".repeat(40)),
        )
        .unwrap();
        assert!(!mirror_is_sound(&clean));
    }
}
