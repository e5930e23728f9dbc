//! The ready checkout (issue 27, the warm start): the packed tar of a repository's tip, as
//! [`crate::RepoSource::GitTip`] copies it into a container (the tree and a tip-only `.git`),
//! kept on disk with its [`Manifest`] so that the next run on the same tip streams a file
//! instead of packing thousands of blobs again.
//!
//! - **Key.** SHA-256 over what makes the bytes: kodx's version and this file's format,
//!   the tar's prefix, the [`ArchiveLimits`], the commit `HEAD` names and the contents of
//!   the clone's `.git` that go into the tar (refs, `HEAD`, config, index; not the object
//!   store, which the tip's pack replaces, nor the reflogs, whose only difference between
//!   two clones is the time they were made: a hit carries the first clone's). A run on a
//!   new tip, branch or remote computes another key, so it never gets an older tip's tar.
//! - **Place.** `<root>/<owner>/<name>/<key>.ready`: the tar, then the manifest, then a
//!   32-byte trailer (both lengths and a magic). One file, so a reader that opened it has
//!   both halves even if it is evicted meanwhile.
//! - **Writes.** A pack is teed into a temporary file in the same directory and renamed
//!   into place only once the pack succeeded and the file is synced: a failed or cut pack
//!   leaves nothing, and another process (runs sharing the data directory) never opens a
//!   half-written file.
//! - **Bounds.** A tar over a quarter of the byte budget is not kept; each repository
//!   keeps its [`KEEP_PER_REPO`] most recently used entries (a new tip evicts the oldest
//!   past that), and all entries together stay under the byte budget
//!   ([`DEFAULT_MAX_BYTES`]), the least recently used going first.
//!
//! Everything here blocks: it runs on the pack's blocking thread. The cache never fails a
//! run it could not help: any error reading or writing it is logged and the repository is
//! packed as without it. Only a read that fails midway through a hit's stream, when the
//! bytes are already in the container's upload, fails the start.

use std::fs::{self, File};
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::archive::{ArchiveLimits, Manifest};

/// The byte budget of all ready checkouts together: 2 GiB (a cargo-sized tip is ~60 MiB).
pub const DEFAULT_MAX_BYTES: u64 = 2 << 30;
/// Ready checkouts kept per repository: the tips of the last few runs (a branch and the
/// default branch moving between them).
pub const KEEP_PER_REPO: usize = 3;
/// The file name's extension of a committed entry; temporary files start with a dot.
const EXT: &str = "ready";
const TEMP_PREFIX: &str = ".spool-";
/// A temporary file this old was left by a process that died while packing.
const STALE_TEMP: Duration = Duration::from_secs(3600);
/// The last bytes of an entry: the tar's and the manifest's lengths, then this magic.
const MAGIC: &[u8; 16] = b"kodx-ready-v1\0\0\0";
const TRAILER_BYTES: u64 = 32;
/// Largest manifest read back (a manifest of the archive limits' 500,000 entries is
/// ~60 MiB).
const MAX_MANIFEST_BYTES: u64 = 128 << 20;
/// Most bytes and entries of `.git` (outside its objects) hashed into a key; a bigger
/// `.git` is not cached.
const MAX_GIT_BYTES: u64 = 64 << 20;
const MAX_GIT_ENTRIES: usize = 100_000;
/// What one read of a hit hands on.
const READ_CHUNK: usize = 64 << 10;

/// The ready checkouts under one directory, kept under a byte budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyCache {
    root: PathBuf,
    max_bytes: u64,
    keep: usize,
}

/// One repository's place in a [`ReadyCache`]: what a [`super::SandboxSpec`] carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyRepo {
    cache: ReadyCache,
    owner: String,
    name: String,
}

/// A committed entry, for eviction and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyEntry {
    pub path: PathBuf,
    pub bytes: u64,
    pub last_used: SystemTime,
}

impl ReadyCache {
    /// The cache in `root` (created when first written), keeping its entries under
    /// `max_bytes` in all and [`KEEP_PER_REPO`] per repository.
    pub fn new(root: impl Into<PathBuf>, max_bytes: u64) -> ReadyCache {
        ReadyCache {
            root: root.into(),
            max_bytes,
            keep: KEEP_PER_REPO,
        }
    }

    /// As [`ReadyCache::new`], keeping `keep` entries per repository.
    pub fn keeping(mut self, keep: usize) -> ReadyCache {
        self.keep = keep.max(1);
        self
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The repository `owner/name` (each a single path segment of letters, digits, `-`,
    /// `_` and `.`, as the repository cache's keys are; only a name may start with a dot).
    pub fn repository(&self, owner: &str, name: &str) -> Result<ReadyRepo, String> {
        for (what, s) in [("owner", owner), ("name", name)] {
            let ok = !s.is_empty()
                && s.len() <= 100
                && s != "."
                && s != ".."
                && (what == "name" || !s.starts_with('.'))
                && s.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
            if !ok {
                return Err(format!(
                    "the ready checkouts refuse the repository {what} {s:?}"
                ));
            }
        }
        Ok(ReadyRepo {
            cache: self.clone(),
            owner: owner.to_string(),
            name: name.to_string(),
        })
    }

    /// The largest tar kept: a quarter of the budget, so that one repository's few tips
    /// cannot take it all.
    fn max_entry_bytes(&self) -> u64 {
        self.max_bytes / 4
    }

    /// Every committed entry, least recently used first.
    pub fn entries(&self) -> io::Result<Vec<ReadyEntry>> {
        let mut out = Vec::new();
        for owner in read_dir_or_empty(&self.root)? {
            for repo in read_dir_or_empty(&owner)? {
                out.extend(entries_in(&repo)?);
            }
        }
        out.sort_by(|a, b| a.last_used.cmp(&b.last_used).then(a.path.cmp(&b.path)));
        Ok(out)
    }

    /// Removes the least recently used entries until all fit the budget. Returns how
    /// many were removed.
    pub fn evict(&self) -> io::Result<usize> {
        let entries = self.entries()?;
        let mut total: u64 = entries.iter().map(|e| e.bytes).sum();
        let mut removed = 0;
        for e in &entries {
            if total <= self.max_bytes {
                break;
            }
            remove_entry(&e.path);
            total = total.saturating_sub(e.bytes);
            removed += 1;
        }
        Ok(removed)
    }
}

impl ReadyRepo {
    fn dir(&self) -> PathBuf {
        self.cache.root.join(&self.owner).join(&self.name)
    }

    /// The key of the clone at `repo_dir` packed tip-only under `prefix` with `limits`.
    /// Reads only the clone (no entry): made while the container is created. `None` when
    /// it cannot be keyed (the reason is logged): the pack goes on without the cache.
    pub(crate) fn key(
        &self,
        repo_dir: &Path,
        prefix: &str,
        limits: &ArchiveLimits,
    ) -> Option<ReadyKey> {
        match key(repo_dir, prefix, limits) {
            Ok(key) => key.map(|(hash, commit)| ReadyKey { hash, commit }),
            Err(e) => {
                tracing::warn!("the ready checkout cannot be keyed: {e}; packing without it");
                None
            }
        }
    }

    /// The ready checkout under `key`: a hit to stream, or a miss with a spool to tee the
    /// pack into (`None` when the spool cannot be made; the reason is logged).
    pub(crate) fn lookup(&self, key: &ReadyKey) -> Lookup {
        let path = self.path_of(key);
        match Hit::open(&path) {
            Ok(Some(hit)) => return Lookup::Hit(hit),
            Ok(None) => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), "a ready checkout is unreadable ({e}): removed");
                remove_entry(&path);
            }
        }
        match Spool::new(self.clone(), path) {
            Ok(spool) => Lookup::Miss(Some(spool)),
            Err(e) => {
                tracing::warn!("the ready checkout cannot be written: {e}; packing without it");
                Lookup::Miss(None)
            }
        }
    }

    fn path_of(&self, key: &ReadyKey) -> PathBuf {
        self.dir().join(format!("{}.{EXT}", key.hash))
    }

    /// Whether the ready checkout under `key` is kept (a preloaded sandbox can be made from
    /// it).
    pub(crate) fn has(&self, key: &ReadyKey) -> bool {
        self.path_of(key).is_file()
    }

    /// The ready checkout under `key` to stream, if it is (still) kept; never makes one.
    pub(crate) fn open(&self, key: &ReadyKey) -> io::Result<Option<Hit>> {
        Hit::open(&self.path_of(key))
    }

    /// Keeps this repository's [`KEEP_PER_REPO`] most recently used entries, removes
    /// stale temporary files, then keeps the whole cache under its budget.
    fn evict(&self) -> io::Result<()> {
        let dir = self.dir();
        let mut entries = entries_in(&dir)?;
        entries.sort_by(|a, b| b.last_used.cmp(&a.last_used).then(b.path.cmp(&a.path)));
        for e in entries.iter().skip(self.cache.keep) {
            remove_entry(&e.path);
        }
        for path in read_dir_or_empty(&dir)? {
            let stale = path
                .file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with(TEMP_PREFIX))
                && fs::metadata(&path)
                    .and_then(|m| m.modified())
                    .is_ok_and(|t| t.elapsed().unwrap_or_default() > STALE_TEMP);
            if stale {
                let _ = fs::remove_file(&path);
            }
        }
        self.cache.evict().map(|_| ())
    }
}

/// A ready checkout's key: the hex SHA-256 of what makes its bytes, and the commit it
/// holds (also in the hash).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReadyKey {
    hash: String,
    commit: String,
}

impl ReadyKey {
    /// The commit the checkout holds (hex).
    pub fn commit(&self) -> &str {
        &self.commit
    }
}

/// What [`ReadyRepo::lookup`] found.
pub(crate) enum Lookup {
    Hit(Hit),
    /// Pack; tee the tar into the spool when there is one, and commit it on success.
    Miss(Option<Spool>),
}

/// An entry opened for reading: its manifest read, its tar next.
pub(crate) struct Hit {
    file: File,
    tar_bytes: u64,
    manifest: Manifest,
}

impl Hit {
    /// `Ok(None)`: no entry at `path`. `Err`: one that is not whole or not ours.
    fn open(path: &Path) -> io::Result<Option<Hit>> {
        let mut file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let len = file.metadata()?.len();
        let bad = |why: &str| io::Error::new(io::ErrorKind::InvalidData, why.to_string());
        if len < TRAILER_BYTES {
            return Err(bad("shorter than its trailer"));
        }
        let mut trailer = [0u8; TRAILER_BYTES as usize];
        file.seek(SeekFrom::Start(len - TRAILER_BYTES))?;
        file.read_exact(&mut trailer)?;
        let (lengths, magic) = trailer.split_at(16);
        if magic != MAGIC {
            return Err(bad("no trailer"));
        }
        let tar_bytes = u64::from_le_bytes(lengths[..8].try_into().expect("8 bytes"));
        let manifest_bytes = u64::from_le_bytes(lengths[8..].try_into().expect("8 bytes"));
        if manifest_bytes > MAX_MANIFEST_BYTES
            || tar_bytes.checked_add(manifest_bytes) != Some(len - TRAILER_BYTES)
        {
            return Err(bad("its lengths do not add up"));
        }
        file.seek(SeekFrom::Start(tar_bytes))?;
        let mut raw = Vec::new();
        (&mut file).take(manifest_bytes).read_to_end(&mut raw)?;
        let manifest = Manifest::from_bytes(&raw).map_err(|e| bad(&e))?;
        file.seek(SeekFrom::Start(0))?;
        // The last use, for eviction; a failure only makes the entry look older.
        let _ = file.set_modified(SystemTime::now());
        Ok(Some(Hit {
            file,
            tar_bytes,
            manifest,
        }))
    }

    /// Entries in the manifest.
    pub(crate) fn entries(&self) -> usize {
        self.manifest.len()
    }

    /// Writes the tar to `out` in 64 KiB reads; returns the manifest.
    pub(crate) fn stream_to(self, out: &mut impl Write) -> io::Result<Manifest> {
        let mut buf = vec![0u8; READ_CHUNK];
        let mut tar = self.file.take(self.tar_bytes);
        let mut left = self.tar_bytes;
        while left > 0 {
            let n = tar.read(&mut buf)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the ready checkout ended early",
                ));
            }
            out.write_all(&buf[..n])?;
            left -= n as u64;
        }
        out.flush()?;
        Ok(self.manifest)
    }
}

/// A pack's tar on its way to becoming an entry: a temporary file beside where it goes.
pub(crate) struct Spool {
    repo: ReadyRepo,
    dest: PathBuf,
    file: BufWriter<tempfile::NamedTempFile>,
    bytes: u64,
}

impl Spool {
    fn new(repo: ReadyRepo, dest: PathBuf) -> io::Result<Spool> {
        let dir = repo.dir();
        fs::create_dir_all(&dir)?;
        let file = tempfile::Builder::new()
            .prefix(TEMP_PREFIX)
            .tempfile_in(&dir)?;
        Ok(Spool {
            repo,
            dest,
            file: BufWriter::with_capacity(READ_CHUNK, file),
            bytes: 0,
        })
    }

    /// Appends the manifest and the trailer, syncs, renames the file into place and
    /// evicts what the bounds no longer allow.
    fn commit(self, manifest: &Manifest) -> io::Result<PathBuf> {
        let Spool {
            repo,
            dest,
            mut file,
            bytes,
        } = self;
        let raw = manifest.to_bytes();
        file.write_all(&raw)?;
        file.write_all(&bytes.to_le_bytes())?;
        file.write_all(&(raw.len() as u64).to_le_bytes())?;
        file.write_all(MAGIC)?;
        let file = file.into_inner().map_err(|e| e.into_error())?;
        file.as_file().sync_all()?;
        file.persist(&dest).map_err(|e| e.error)?;
        if let Err(e) = repo.evict() {
            tracing::warn!("keeping the ready checkouts under their bounds failed: {e}");
        }
        Ok(dest)
    }
}

/// A writer that hands everything to `out` and a copy to a spool, while the spool lasts:
/// a write error or a tar past the bound drops it (its temporary file goes with it).
pub(crate) struct Tee<W> {
    pub(crate) out: W,
    spool: Option<Spool>,
}

impl<W: Write> Tee<W> {
    pub(crate) fn new(out: W, spool: Option<Spool>) -> Tee<W> {
        Tee { out, spool }
    }

    /// Splits into the writer and what is left of the spool.
    pub(crate) fn into_parts(self) -> (W, Option<Spool>) {
        (self.out, self.spool)
    }
}

impl<W: Write> Write for Tee<W> {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = self.out.write(data)?;
        if let Some(spool) = self.spool.as_mut() {
            let max = spool.repo.cache.max_entry_bytes();
            spool.bytes += n as u64;
            let kept = if spool.bytes > max {
                tracing::info!(
                    max,
                    "the repository's tar is over the ready checkouts' bound: not kept"
                );
                false
            } else if let Err(e) = spool.file.write_all(&data[..n]) {
                tracing::warn!("writing the ready checkout failed: {e}; not kept");
                false
            } else {
                true
            };
            if !kept {
                self.spool = None;
            }
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// Commits `spool` with `manifest` when the pack succeeded; logs the outcome, and says
/// whether it was kept. A spool not committed is dropped, and its temporary file with it.
pub(crate) fn finish(spool: Option<Spool>, manifest: Option<&Manifest>) -> bool {
    if let (Some(spool), Some(manifest)) = (spool, manifest) {
        let bytes = spool.bytes;
        match spool.commit(manifest) {
            Ok(path) => {
                tracing::info!(bytes, path = %path.display(), "kept the ready checkout");
                return true;
            }
            Err(e) => tracing::warn!("keeping the ready checkout failed: {e}"),
        }
    }
    false
}

/// The key of the tip-only pack of the clone at `repo_dir` (see the module's doc).
/// `Ok(None)`: its `.git` is too big to key cheaply.
fn key(
    repo_dir: &Path,
    prefix: &str,
    limits: &ArchiveLimits,
) -> io::Result<Option<(String, String)>> {
    let repo = git2::Repository::open(repo_dir).map_err(io::Error::other)?;
    // The commit's id without reading the commit: the object need not be read to key.
    let commit = repo
        .head()
        .ok()
        .and_then(|h| h.resolve().ok())
        .and_then(|h| h.target())
        .ok_or_else(|| io::Error::other("HEAD names no commit"))?;
    let mut h = Sha256::new();
    let ArchiveLimits {
        max_file_bytes,
        max_total_bytes,
        max_entries,
        max_name_bytes,
        max_stream_bytes: _, // how much is read back, not what is packed
    } = limits;
    let head = format!(
        "kodx {} ready 1\0{prefix}\0{max_file_bytes} {max_total_bytes} {max_entries} {max_name_bytes}\0{commit}\0",
        env!("CARGO_PKG_VERSION")
    );
    h.update(head.as_bytes());
    let mut budget = (MAX_GIT_BYTES, MAX_GIT_ENTRIES);
    if !hash_dir(&mut h, repo.path(), "", &mut budget)? {
        return Ok(None);
    }
    Ok(Some((hex::encode(h.finalize()), commit.to_string())))
}

/// Hashes the names, kinds, modes and contents under `dir`, in name order, leaving out
/// the object store, the shallow list and the reflogs at the top. `false`: over `budget`.
fn hash_dir(h: &mut Sha256, dir: &Path, rel: &str, budget: &mut (u64, usize)) -> io::Result<bool> {
    let mut names: Vec<_> = fs::read_dir(dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<io::Result<_>>()?;
    if rel.is_empty() {
        names.retain(|n| !["objects", "shallow", "logs"].iter().any(|s| n == s));
    }
    names.sort();
    for name in names {
        if budget.1 == 0 {
            return Ok(false);
        }
        budget.1 -= 1;
        let path = dir.join(&name);
        let rel = format!("{rel}/{}", name.to_string_lossy());
        let meta = fs::symlink_metadata(&path)?;
        let kind = meta.file_type();
        h.update(format!("{rel}\0{:o}\0", meta.mode()).as_bytes());
        if kind.is_dir() {
            h.update(b"D\0");
            if !hash_dir(h, &path, &rel, budget)? {
                return Ok(false);
            }
        } else if kind.is_symlink() {
            h.update(b"L\0");
            h.update(fs::read_link(&path)?.as_os_str().as_encoded_bytes());
            h.update(b"\0");
        } else if kind.is_file() {
            if meta.len() > budget.0 {
                return Ok(false);
            }
            budget.0 -= meta.len();
            h.update(format!("F\0{}\0", meta.len()).as_bytes());
            let copied = io::copy(&mut File::open(&path)?.take(meta.len()), h)?;
            if copied != meta.len() {
                return Err(io::Error::other(format!(
                    "{} changed while it was read",
                    path.display()
                )));
            }
        }
    }
    Ok(true)
}

/// The committed entries in one repository's directory (unordered).
fn entries_in(dir: &Path) -> io::Result<Vec<ReadyEntry>> {
    let mut out = Vec::new();
    for path in read_dir_or_empty(dir)? {
        if path.extension().and_then(|e| e.to_str()) != Some(EXT) {
            continue;
        }
        // Gone meanwhile (another process evicted it): skipped.
        let Ok(meta) = fs::metadata(&path) else {
            continue;
        };
        out.push(ReadyEntry {
            bytes: meta.len(),
            last_used: meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
            path,
        });
    }
    Ok(out)
}

fn read_dir_or_empty(dir: &Path) -> io::Result<Vec<PathBuf>> {
    match fs::read_dir(dir) {
        Ok(entries) => entries.map(|e| e.map(|e| e.path())).collect(),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// Removes an entry; a reader that has it open keeps reading it.
fn remove_entry(path: &Path) {
    match fs::remove_file(path) {
        Ok(()) => tracing::debug!(path = %path.display(), "removed a ready checkout"),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(path = %path.display(), "removing a ready checkout failed: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive;

    const PREFIX: &str = "workspace/repo";

    /// A clone-like repository at `dir` whose `HEAD` (on `branch`) is a commit of `files`.
    fn commit(dir: &Path, branch: &str, files: &[(&str, &str)]) -> git2::Oid {
        let repo = git2::Repository::open(dir)
            .or_else(|_| git2::Repository::init(dir))
            .unwrap();
        let mut builder = repo.treebuilder(None).unwrap();
        for (name, data) in files {
            let blob = repo.blob(data.as_bytes()).unwrap();
            builder.insert(name, blob, 0o100644).unwrap();
        }
        let tree = repo.find_tree(builder.write().unwrap()).unwrap();
        let sig = git2::Signature::new("t", "t@example.com", &git2::Time::new(1, 0)).unwrap();
        let parent = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
        let parents: Vec<&git2::Commit> = parent.iter().collect();
        let id = repo.commit(None, &sig, &sig, "c", &tree, &parents).unwrap();
        repo.reference(&format!("refs/heads/{branch}"), id, true, "t")
            .unwrap();
        repo.set_head(&format!("refs/heads/{branch}")).unwrap();
        id
    }

    fn lookup(repo: &ReadyRepo, dir: &Path) -> Lookup {
        let key = repo.key(dir, PREFIX, &ArchiveLimits::default()).unwrap();
        repo.lookup(&key)
    }

    /// What a start does: streams a hit, or packs (teeing into the spool) and commits.
    /// The tar, the manifest, and whether it was a hit.
    fn start(repo: &ReadyRepo, dir: &Path) -> (Vec<u8>, Manifest, bool) {
        let limits = ArchiveLimits::default();
        match lookup(repo, dir) {
            Lookup::Hit(hit) => {
                let mut out = Vec::new();
                let manifest = hit.stream_to(&mut out).unwrap();
                (out, manifest, true)
            }
            Lookup::Miss(spool) => {
                let mut tee = Tee::new(Vec::new(), spool);
                let manifest = archive::pack_tip_to(dir, PREFIX, &limits, &mut tee).unwrap();
                let (out, spool) = tee.into_parts();
                let _ = finish(spool, Some(&manifest));
                (out, manifest, false)
            }
        }
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = read_dir_or_empty(dir)
            .unwrap()
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn a_second_start_at_the_same_tip_streams_the_same_tar_and_manifest() {
        let tmp = tempfile::tempdir().unwrap();
        let clone = tmp.path().join("clone");
        commit(&clone, "main", &[("a.txt", "a\n"), ("b.txt", "b\n")]);
        let repo = ReadyCache::new(tmp.path().join("ready"), 1 << 30)
            .repository("acme", "widgets")
            .unwrap();
        let (tar, manifest, hit) = start(&repo, &clone);
        assert!(!hit);
        let kept = names(&repo.dir());
        assert_eq!(kept.len(), 1, "{kept:?}");
        assert!(kept[0].ends_with(".ready"), "{kept:?}");
        let (again, stored, hit) = start(&repo, &clone);
        assert!(hit);
        assert_eq!(again, tar);
        assert_eq!(stored, manifest);
        assert!(stored.get("a.txt").is_some() && stored.get(".git/shallow").is_some());
    }

    #[test]
    fn a_new_tip_or_branch_misses_and_the_oldest_past_the_count_goes() {
        let tmp = tempfile::tempdir().unwrap();
        let clone = tmp.path().join("clone");
        let repo = ReadyCache::new(tmp.path().join("ready"), 1 << 30)
            .keeping(2)
            .repository("acme", "widgets")
            .unwrap();
        commit(&clone, "main", &[("a.txt", "one\n")]);
        let (first, _, _) = start(&repo, &clone);
        commit(&clone, "main", &[("a.txt", "two\n")]);
        let (second, manifest, hit) = start(&repo, &clone);
        assert!(!hit, "a new tip never gets the old tar");
        assert_ne!(second, first);
        let two =
            archive::pack_tip_to(&clone, PREFIX, &ArchiveLimits::default(), io::sink()).unwrap();
        assert_eq!(manifest, two);
        // The same commit on another branch: its `.git` differs, so does its tar.
        let other = commit(&clone, "main", &[("a.txt", "three\n")]);
        git2::Repository::open(&clone)
            .unwrap()
            .reference("refs/heads/topic", other, true, "t")
            .unwrap();
        start(&repo, &clone);
        git2::Repository::open(&clone)
            .unwrap()
            .set_head("refs/heads/topic")
            .unwrap();
        let (_, _, hit) = start(&repo, &clone);
        assert!(!hit, "another branch misses");
        assert_eq!(names(&repo.dir()).len(), 2, "kept: the two most recent");
        let (_, _, hit) = start(&repo, &clone);
        assert!(hit);
    }

    #[test]
    fn a_failed_pack_or_one_over_the_bound_leaves_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let clone = tmp.path().join("clone");
        commit(&clone, "main", &[("big.txt", &"x".repeat(64 << 10))]);
        let cache = ReadyCache::new(tmp.path().join("ready"), 1 << 30);
        let repo = cache.repository("acme", "widgets").unwrap();
        // Cut midway: the spool is dropped uncommitted.
        let Lookup::Miss(spool) = lookup(&repo, &clone) else {
            panic!("a hit in an empty cache")
        };
        let mut tee = Tee::new(Vec::new(), spool);
        tee.write_all(&[0; 10_000]).unwrap();
        let (_, spool) = tee.into_parts();
        assert!(spool.is_some());
        let _ = finish(spool, None);
        assert_eq!(names(&repo.dir()), Vec::<String>::new());
        // Over a quarter of a 100 KiB budget: not kept.
        let small = ReadyCache::new(tmp.path().join("ready"), 100 << 10)
            .repository("acme", "widgets")
            .unwrap();
        let (_, _, hit) = start(&small, &clone);
        assert!(!hit);
        assert_eq!(names(&small.dir()), Vec::<String>::new());
        let (_, _, hit) = start(&repo, &clone);
        assert!(!hit);
        assert_eq!(names(&repo.dir()).len(), 1);
    }

    #[test]
    fn the_budget_evicts_the_least_recently_used_across_repositories() {
        let tmp = tempfile::tempdir().unwrap();
        let clone = tmp.path().join("clone");
        commit(&clone, "main", &[("a.txt", &"a".repeat(20 << 10))]);
        let root = tmp.path().join("ready");
        let big = ReadyCache::new(&root, 1 << 30);
        let (tar, _, _) = start(&big.repository("acme", "one").unwrap(), &clone);
        let entry = big.entries().unwrap()[0].bytes;
        assert!(entry > tar.len() as u64);
        // Room for four entries (each a quarter of it at most).
        let cache = ReadyCache::new(&root, 4 * entry + entry / 2);
        let one = cache.repository("acme", "one").unwrap();
        let two = cache.repository("acme", "two").unwrap();
        let others = ["three", "four", "five"].map(|n| cache.repository("beta", n).unwrap());
        let old = SystemTime::now() - Duration::from_secs(60);
        File::options()
            .write(true)
            .open(&big.entries().unwrap()[0].path)
            .unwrap()
            .set_modified(old)
            .unwrap();
        start(&two, &clone);
        start(&others[0], &clone);
        start(&others[1], &clone);
        assert_eq!(cache.entries().unwrap().len(), 4);
        // Used again: now the most recent, and `two` the least.
        assert!(start(&one, &clone).2);
        start(&others[2], &clone);
        let left: Vec<PathBuf> = cache
            .entries()
            .unwrap()
            .into_iter()
            .map(|e| e.path)
            .collect();
        assert_eq!(left.len(), 4, "{left:?}");
        assert!(left.iter().all(|p| !p.starts_with(two.dir())), "{left:?}");
    }

    #[test]
    fn a_damaged_entry_is_removed_and_packed_again() {
        let tmp = tempfile::tempdir().unwrap();
        let clone = tmp.path().join("clone");
        commit(&clone, "main", &[("a.txt", "a\n")]);
        let repo = ReadyCache::new(tmp.path().join("ready"), 1 << 30)
            .repository("acme", "widgets")
            .unwrap();
        let (tar, _, _) = start(&repo, &clone);
        let path = repo.cache.entries().unwrap()[0].path.clone();
        let len = fs::metadata(&path).unwrap().len();
        File::options()
            .write(true)
            .open(&path)
            .unwrap()
            .set_len(len - 1)
            .unwrap();
        let (again, _, hit) = start(&repo, &clone);
        assert!(!hit);
        assert_eq!(again, tar);
        assert!(start(&repo, &clone).2, "kept again");
    }

    #[test]
    fn repository_names_are_single_segments() {
        let cache = ReadyCache::new("/tmp/r", 1);
        assert!(cache.repository("acme", "widgets.rs").is_ok());
        assert!(cache.repository("acme", ".github").is_ok());
        for (owner, name) in [
            (".x", "x"),
            ("a/b", "x"),
            ("acme", ""),
            ("acme", ".."),
            ("acme", "."),
        ] {
            assert!(cache.repository(owner, name).is_err(), "{owner}/{name}");
        }
    }
}
