//! Tar streams into and out of the container (SPEC §6).
//!
//! Files cross the container boundary only as tar streams, and neither direction holds a
//! tree, or even one whole file, in memory. The tar that goes in is written here from a
//! host directory straight into a pipe ([`pack_dir_to`]), hashing each file on the way into
//! a [`Manifest`] of what went in. The tar that comes out is hostile — a model with root in
//! the container may plant anything — so every entry is checked as it streams past: sizes
//! are refused on the header before any data is read, and contents go where they belong at
//! once: into a fresh directory ([`extract`], [`replace_dir_from`]), or, compared with the
//! baseline, into a [`ChangeSet`] that keeps only changed contents (small ones in memory,
//! larger ones spooled to temporary files). A single bad entry refuses the whole operation.
//!
//! The change set follows the repository's ignore rules the way `git add -A` does: paths
//! the `.gitignore` files ignore (and `.git` itself) are skipped while streaming, neither
//! kept nor held to the size limits, unless the baseline had them (a tracked file stays
//! tracked). The rules are the container's own `.gitignore` files, evaluated by libgit2 —
//! the library that commits the result — on a scratch repository holding copies of them.

use std::collections::{btree_map, BTreeMap, BTreeSet, HashMap, HashSet};
use std::fs::{self, File, Metadata, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{symlink, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use sha2::{Digest, Sha256};
use tar::{EntryType, Header};

use super::{Result, SandboxError};

/// Longest entry name or symlink target accepted (Linux's PATH_MAX).
const MAX_NAME_BYTES: usize = 4096;
/// Most symlinks followed while checking where one symlink leads (Linux's limit).
const MAX_SYMLINK_HOPS: usize = 40;
/// Changed contents up to this size are kept in memory (while [`MEMORY_BUDGET`] allows);
/// larger ones are spooled to a temporary file.
const INLINE_MAX: u64 = 256 << 10;
/// Most bytes of changed contents one change set keeps in memory.
const MEMORY_BUDGET: u64 = 16 << 20;
/// Largest `.gitignore` whose rules are read, and the most bytes of rules read in all.
/// Past them the rules are not read: more is kept, never less.
const MAX_IGNORE_FILE: u64 = 1 << 20;
const MAX_IGNORE_TOTAL: u64 = 16 << 20;
/// Most files read again one at a time at the end of a change set; past that the whole
/// workspace is read a second time.
const MAX_REFETCH: usize = 256;
/// Copy buffer for file data.
const COPY_BUF: usize = 64 << 10;

/// Size limits for a tar coming out of the container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Largest single regular file, in bytes.
    pub max_file_bytes: u64,
    /// Largest sum of all regular files (hard-link copies included), in bytes. Files the
    /// same as in the baseline do not count: the user's own tree was there already.
    pub max_total_bytes: u64,
    /// Most entries in the archive.
    pub max_entries: usize,
    /// Largest sum of the entry names and symlink targets held while reading.
    pub max_name_bytes: u64,
}

impl Default for Limits {
    /// 100 MiB per file, 2 GiB in total, 500 000 entries, 64 MiB of names.
    fn default() -> Self {
        Limits {
            max_file_bytes: 100 << 20,
            max_total_bytes: 2 << 30,
            max_entries: 500_000,
            max_name_bytes: 64 << 20,
        }
    }
}

/// The baseline: what was copied into the container. Paths are relative to the tree root,
/// '/'-separated, without a leading "./".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Manifest {
    entries: BTreeMap<String, ManifestEntry>,
}

/// One path of a [`Manifest`]. Modes are the permission bits (`& 0o7777`) as on disk.
#[derive(Debug, Clone, PartialEq)]
pub enum ManifestEntry {
    File {
        mode: u32,
        size: u64,
        sha256: [u8; 32],
    },
    Symlink {
        target: String,
    },
    Dir {
        mode: u32,
    },
}

impl Manifest {
    /// Number of paths (files, symlinks and directories).
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when the tree was empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// The entry at `path` (relative, e.g. "src/main.rs").
    pub fn get(&self, path: &str) -> Option<&ManifestEntry> {
        self.entries.get(path)
    }

    /// `(mode, size, sha256)` of the regular file at `path`.
    fn file(&self, path: &str) -> Option<(u32, u64, [u8; 32])> {
        match self.entries.get(path) {
            Some(ManifestEntry::File { mode, size, sha256 }) => Some((*mode, *size, *sha256)),
            _ => None,
        }
    }
}

/// The exact difference between a tree taken out of the container and its [`Manifest`],
/// over files and symlinks (directories are implicit, as in git), sorted by path.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChangeSet {
    pub changes: Vec<Change>,
}

/// One changed path.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    pub path: String,
    pub kind: ChangeKind,
}

/// What happened to a path.
#[derive(Debug, Clone, PartialEq)]
pub enum ChangeKind {
    /// Not in the baseline (or only as a directory).
    Added(NewEntry),
    /// Contents (file data, symlink target, or the kind of entry) and/or permission bits changed.
    Modified {
        new: NewEntry,
        content_changed: bool,
        mode_changed: bool,
    },
    /// In the baseline as a file or symlink, gone now.
    Deleted,
}

/// The new state of an added or modified path. File modes are permission bits (`& 0o777`).
#[derive(Debug, Clone, PartialEq)]
pub enum NewEntry {
    File { mode: u32, contents: Contents },
    Symlink { target: String },
}

/// The contents of an added or modified file: in memory when small, else in a temporary
/// file removed when the last clone is dropped. Two are equal when their length and
/// SHA-256 are.
#[derive(Clone)]
pub struct Contents {
    len: u64,
    sha256: [u8; 32],
    stored: Stored,
}

#[derive(Clone)]
enum Stored {
    Memory(Bytes),
    Spooled(Arc<tempfile::TempPath>),
}

impl Contents {
    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn sha256(&self) -> [u8; 32] {
        self.sha256
    }

    /// True when the contents live in a temporary file rather than in memory.
    pub fn is_spooled(&self) -> bool {
        matches!(self.stored, Stored::Spooled(_))
    }

    /// A reader over the contents.
    pub fn reader(&self) -> io::Result<Box<dyn Read + Send + '_>> {
        Ok(match &self.stored {
            Stored::Memory(bytes) => Box::new(&bytes[..]),
            Stored::Spooled(path) => Box::new(File::open(path.as_ref() as &Path)?),
        })
    }

    /// The contents as a vector (reads a spooled file whole: for small files and tests).
    pub fn to_vec(&self) -> io::Result<Vec<u8>> {
        let mut out = Vec::with_capacity(usize::try_from(self.len).unwrap_or(0).min(1 << 20));
        self.reader()?.read_to_end(&mut out)?;
        Ok(out)
    }
}

impl From<Vec<u8>> for Contents {
    fn from(data: Vec<u8>) -> Self {
        Contents {
            len: data.len() as u64,
            sha256: sha256_of(&data),
            stored: Stored::Memory(Bytes::from(data)),
        }
    }
}

impl From<&[u8]> for Contents {
    fn from(data: &[u8]) -> Self {
        Contents::from(data.to_vec())
    }
}

impl PartialEq for Contents {
    fn eq(&self, other: &Self) -> bool {
        self.len == other.len && self.sha256 == other.sha256
    }
}

impl std::fmt::Debug for Contents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let sha = hex::encode(&self.sha256[..6]);
        let place = if self.is_spooled() {
            "spooled"
        } else {
            "memory"
        };
        write!(f, "Contents({} bytes, sha256 {sha}…, {place})", self.len)
    }
}

/// What [`replace_dir_from`] wrote.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Exported {
    /// Regular files written.
    pub files: usize,
    /// Files the repository ignores that were left out for being over a limit: path and
    /// size, the first [`Exported::SHOWN`] of them.
    pub left_out: Vec<(String, u64)>,
    /// How many were left out in all.
    pub left_out_count: usize,
}

impl Exported {
    /// Most left-out paths listed.
    pub const SHOWN: usize = 20;
}

/// Opens a tar stream of the tree (`""`) or of one path in it (relative to the tree's
/// root), the way Docker's archive endpoint gives them: the tree's entries under
/// `root/`, a single path as its bare file name. `Ok(None)` when the path does not exist.
pub type Open<'o> = dyn FnMut(&str) -> Result<Option<Box<dyn Read + 'o>>> + 'o;

// ---- packing -------------------------------------------------------------------------

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
    };
    if !prefix.is_empty() {
        let mut h = header(EntryType::Directory, 0o755, mtime(&meta), 0);
        packer
            .builder
            .append_data(&mut h, format!("{prefix}/"), io::empty())
            .map_err(io_at("archiving", src))?;
    }
    packer.walk(src, "")?;
    packer
        .builder
        .into_inner()
        .and_then(|mut out| out.flush())
        .map_err(|e| SandboxError::io("finishing the tar", e))?;
    Ok(packer.manifest)
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

struct Packer<'p, W: Write> {
    builder: tar::Builder<W>,
    manifest: Manifest,
    prefix: &'p str,
}

impl<W: Write> Packer<'_, W> {
    /// Appends the contents of the host directory `dir` (at `rel` in the tree), sorted by name.
    fn walk(&mut self, dir: &Path, rel: &str) -> Result<()> {
        let mut names = fs::read_dir(dir)
            .and_then(|entries| {
                entries
                    .map(|e| e.map(|e| e.file_name()))
                    .collect::<io::Result<Vec<_>>>()
            })
            .map_err(io_at("reading the directory", dir))?;
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
                let mut h = header(EntryType::Directory, mode, mtime(&meta), 0);
                self.builder
                    .append_data(&mut h, format!("{tar_path}/"), io::empty())
                    .map_err(io_at("archiving", &path))?;
                ManifestEntry::Dir { mode }
            } else if kind.is_file() && super::gitconfig::is_config_path(&rel) {
                // Credentials in the git config never enter the sandbox (gitconfig.rs).
                // Read at most one byte past the size sanitize accepts (bigger: a minimal config).
                let mut raw = Vec::new();
                File::open(&path)
                    .and_then(|f| {
                        f.take(super::gitconfig::MAX_CONFIG_BYTES as u64 + 1)
                            .read_to_end(&mut raw)
                    })
                    .map_err(io_at("reading", &path))?;
                let data = super::gitconfig::sanitize(&raw);
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
                self.append_symlink(&tar_path, &target, mode, mtime(&meta))
                    .map_err(io_at("archiving", &path))?;
                ManifestEntry::Symlink { target }
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

    /// Appends a symlink with its target bytes exactly as given (the tar crate's own
    /// link-name setter normalises "a//b", "./a", "a/"), using a GNU long-link entry for
    /// targets that do not fit the 100-byte header field.
    fn append_symlink(
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
struct Exact<R> {
    inner: R,
    left: u64,
    hasher: Sha256,
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
fn header(kind: EntryType, mode: u32, mtime: u64, size: u64) -> Header {
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

fn mtime(meta: &Metadata) -> u64 {
    u64::try_from(meta.mtime()).unwrap_or(0)
}

fn sha256_of(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

// ---- the public entry points for a hostile tar -----------------------------------------

/// Validates the hostile `tar` and writes its tree into `dest`, which must not exist yet
/// (it is created) or be an empty directory.
///
/// Every entry must be `root` or under `root/` (Docker's GET archive of
/// "/workspace/repo" yields "repo", "repo/a.txt", …); that prefix is stripped. An empty
/// `root` takes the entries as they are. Files are written as they stream past; if any
/// entry breaks a rule, or writing fails, what was written is removed again.
/// Returns the number of regular files written.
pub fn extract(tar: &[u8], root: &str, dest: &Path, limits: &Limits) -> Result<usize> {
    check_root(root)?;
    let created = match fs::symlink_metadata(dest) {
        Ok(m) if m.is_dir() => {
            let mut entries = fs::read_dir(dest).map_err(io_at("reading", dest))?;
            if entries.next().is_some() {
                return Err(SandboxError::InvalidInput(format!(
                    "cannot extract into {}: it is not empty",
                    dest.display()
                )));
            }
            false
        }
        Ok(_) => {
            return Err(SandboxError::InvalidInput(format!(
                "cannot extract into {}: it exists and is not a directory",
                dest.display()
            )))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            fs::create_dir_all(dest).map_err(io_at("creating directory", dest))?;
            true
        }
        Err(e) => {
            return Err(SandboxError::io(
                format!("inspecting {}", dest.display()),
                e,
            ))
        }
    };
    let mut reader = Reader::new(root, limits, None, Out::Write(dest), None);
    let written = reader.read(tar).and_then(|()| reader.finish_write());
    written.map(|e| e.files).inspect_err(|_| {
        if created {
            let _ = fs::remove_dir_all(dest);
        } else if let Ok(entries) = fs::read_dir(dest) {
            for entry in entries.flatten() {
                let _ = remove_any(&entry.path());
            }
        }
    })
}

/// [`replace_dir_from`] for a tar in memory.
pub fn replace_dir(
    tar: &[u8],
    root: &str,
    dest: &Path,
    limits: &Limits,
    baseline: Option<&Manifest>,
) -> Result<Exported> {
    replace_dir_from(&mut memory_opener(tar, root), root, dest, limits, baseline)
}

/// Replaces `dest` wholesale with the tree of the tar `open("")` gives (same rules as
/// [`extract`]): the tree is written into a fresh sibling directory as it streams in, the
/// old `dest` is moved aside, the new one renamed into place and the old one removed, so
/// files deleted in the container are gone here too. Creates `dest`'s parents if needed.
/// On any error `dest` is left untouched and the temporary directory removed.
///
/// A symlink leaving the tree is accepted only when `baseline` (what was copied in) has
/// the very same link: the user's own repository had it, the container did not make it.
/// A file identical to the baseline's is not held to the size limits (it is the user's own).
/// A file the tree's `.gitignore` files ignore (build output) that is over a limit is left
/// out and listed in the result, rather than refusing the whole export; a file that is not
/// ignored and over a limit refuses it.
pub fn replace_dir_from(
    open: &mut Open,
    root: &str,
    dest: &Path,
    limits: &Limits,
    baseline: Option<&Manifest>,
) -> Result<Exported> {
    check_root(root)?;
    let name = dest.file_name().ok_or_else(|| {
        SandboxError::InvalidInput(format!("{} has no final component", dest.display()))
    })?;
    let name = name.to_string_lossy();
    let parent = match dest.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    fs::create_dir_all(parent).map_err(io_at("creating directory", parent))?;
    let mut ignores = Ignores::default();
    ignores.prefetch_root(open, limits)?;

    let fresh = sibling_dir(parent, &name, "new")?;
    let written = (|| {
        let tar = open("")?.ok_or_else(|| gone(root))?;
        let mut reader = Reader::new(root, limits, baseline, Out::Export(&fresh), Some(ignores));
        reader.read(tar)?;
        let exported = reader.finish_write()?;
        let trash = swap_into_place(&fresh, dest, parent, &name)?;
        Ok((exported, trash))
    })();
    let (exported, trash) = written.inspect_err(|_| {
        let _ = fs::remove_dir_all(&fresh);
    })?;
    if let Some(trash) = trash {
        if let Err(e) = fs::remove_dir_all(&trash) {
            tracing::warn!("could not remove the old tree {}: {e}", trash.display());
        }
    }
    Ok(exported)
}

/// [`change_set_from`] for a tar in memory.
pub fn change_set(
    tar: &[u8],
    root: &str,
    baseline: &Manifest,
    limits: &Limits,
) -> Result<ChangeSet> {
    change_set_from(&mut memory_opener(tar, root), root, baseline, limits)
}

/// The exact change set of the tree `open("")` gives against `baseline` (same safety rules
/// as [`extract`]): files and symlinks only, sorted by path. A top-level ".git" and
/// everything under it is left out on both sides, and so is every path the tree's
/// `.gitignore` files ignore, unless the baseline had it (git keeps tracking it): those
/// are skipped while streaming, never kept and never held to the size limits. Only added
/// and modified contents are kept.
///
/// Files whose contents are needed but were not kept while streaming (a hard link to a
/// skipped file, a large file of unchanged size that changed, a path whose ignore rules
/// came later in the stream) are read again one by one with `open(path)`; when there are
/// many, the whole tree is read a second time with every rule known from the start.
pub fn change_set_from(
    open: &mut Open,
    root: &str,
    baseline: &Manifest,
    limits: &Limits,
) -> Result<ChangeSet> {
    check_root(root)?;
    let mut ignores = Ignores::default();
    ignores.prefetch_root(open, limits)?;
    for pass in 1..=2 {
        let tar = open("")?.ok_or_else(|| gone(root))?;
        let mut reader = Reader::new(root, limits, Some(baseline), Out::Changes, Some(ignores));
        reader.read(tar)?;
        match reader.finish_changes(open, pass == 2)? {
            Finished::Done(set) => return Ok(set),
            Finished::Again(mut known) => {
                tracing::info!("reading the workspace again, with every ignore rule known");
                known.complete = true;
                known.dirs.clear();
                ignores = known;
            }
        }
    }
    unreachable!("the second pass never asks for a third")
}

/// An [`Open`] over a tar in memory: the whole tar, or one path of it re-packed under its
/// bare name, as Docker answers for a single path (a hard link comes as the file it is).
pub fn memory_opener<'t>(
    tar: &'t [u8],
    root: &'t str,
) -> impl FnMut(&str) -> Result<Option<Box<dyn Read + 't>>> + 't {
    move |path: &str| {
        if path.is_empty() {
            return Ok(Some(Box::new(tar) as Box<dyn Read + 't>));
        }
        let Some((mut h, data)) = find_entry(tar, root, path, 0) else {
            return Ok(None);
        };
        let base = path.rsplit('/').next().unwrap_or(path);
        let mut b = tar::Builder::new(Vec::new());
        h.set_path(base)
            .and_then(|()| {
                h.set_cksum();
                b.append(&h, data.as_slice())
            })
            .map_err(|e| SandboxError::io("re-packing a file", e))?;
        let one = b
            .into_inner()
            .map_err(|e| SandboxError::io("re-packing a file", e))?;
        Ok(Some(Box::new(io::Cursor::new(one))))
    }
}

/// The header and data of the entry at `path` in a tar in memory, a hard link resolved to
/// the regular file it names.
fn find_entry(tar: &[u8], root: &str, path: &str, hops: usize) -> Option<(Header, Vec<u8>)> {
    let mut archive = tar::Archive::new(tar);
    for entry in archive.entries().ok()? {
        let mut entry = entry.ok()?;
        if strip_root(&entry.path_bytes(), root).ok().as_deref() != Some(path) {
            continue;
        }
        let mut h = entry.header().clone();
        match h.entry_type() {
            EntryType::Regular | EntryType::Continuous | EntryType::Symlink => {
                let mut data = Vec::new();
                entry.read_to_end(&mut data).ok()?;
                return Some((h, data));
            }
            EntryType::Link if hops < MAX_SYMLINK_HOPS => {
                let target = strip_root(&entry.link_name_bytes()?, root).ok()?;
                let (file, data) = find_entry(tar, root, &target, hops + 1)?;
                h.set_entry_type(file.entry_type());
                h.set_size(data.len() as u64);
                return Some((h, data));
            }
            _ => return None,
        }
    }
    None
}

fn check_root(root: &str) -> Result<()> {
    if !root.is_empty() && (root.contains('/') || check_rel(root).is_err()) {
        return Err(SandboxError::InvalidInput(format!(
            "bad archive root {root:?}: it must be a single file name"
        )));
    }
    Ok(())
}

fn gone(root: &str) -> SandboxError {
    SandboxError::InvalidInput(format!("the directory {root:?} is gone from the container"))
}

/// Renames `fresh` to `dest`, first moving an existing `dest` (of whatever type) into a new
/// trash directory of our own rather than onto a name that might exist (renaming a directory
/// silently replaces an empty one). Returns the trash directory to remove. On error the old
/// `dest` is back in place.
fn swap_into_place(
    fresh: &Path,
    dest: &Path,
    parent: &Path,
    name: &str,
) -> Result<Option<PathBuf>> {
    let trash = match fs::symlink_metadata(dest) {
        Ok(_) => {
            let trash = sibling_dir(parent, name, "old")?;
            if let Err(e) = fs::rename(dest, trash.join("old")) {
                let _ = fs::remove_dir(&trash);
                return Err(SandboxError::io(
                    format!("moving {} aside", dest.display()),
                    e,
                ));
            }
            Some(trash)
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => None,
        Err(e) => {
            return Err(SandboxError::io(
                format!("inspecting {}", dest.display()),
                e,
            ))
        }
    };
    if let Err(e) = fs::rename(fresh, dest) {
        if let Some(trash) = &trash {
            let _ = fs::rename(trash.join("old"), dest);
            let _ = fs::remove_dir(trash);
        }
        return Err(SandboxError::io(
            format!("moving the new tree to {}", dest.display()),
            e,
        ));
    }
    Ok(trash)
}

impl ChangeSet {
    /// True when nothing changed.
    pub fn is_empty(&self) -> bool {
        self.changes.is_empty()
    }

    /// The added paths.
    pub fn added(&self) -> impl Iterator<Item = &Change> + '_ {
        self.changes
            .iter()
            .filter(|c| matches!(c.kind, ChangeKind::Added(_)))
    }

    /// The modified paths.
    pub fn modified(&self) -> impl Iterator<Item = &Change> + '_ {
        self.changes
            .iter()
            .filter(|c| matches!(c.kind, ChangeKind::Modified { .. }))
    }

    /// The deleted paths.
    pub fn deleted(&self) -> impl Iterator<Item = &Change> + '_ {
        self.changes
            .iter()
            .filter(|c| matches!(c.kind, ChangeKind::Deleted))
    }

    /// E.g. "2 added, 1 modified, 1 deleted"; zero counts are left out, and an empty set
    /// reads "no changes".
    pub fn summary(&self) -> String {
        if self.is_empty() {
            return "no changes".to_string();
        }
        [
            (self.added().count(), "added"),
            (self.modified().count(), "modified"),
            (self.deleted().count(), "deleted"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect::<Vec<_>>()
        .join(", ")
    }

    /// Applies the change set to the host tree `dest` (e.g. the host clone of the repo):
    /// removes deleted paths (and directories they leave empty, as git does), then writes
    /// added and modified files (permission bits `& 0o777`) and symlinks, creating parent
    /// directories as needed.
    ///
    /// Every path is validated again (relative, no `.`/`..`, not in the top-level ".git";
    /// symlink targets relative and lexically inside the tree), and nothing is ever written
    /// or removed through a symlink or over a non-directory parent in `dest`. These checks
    /// run before anything is changed; only an I/O error (e.g. a path to be replaced by a
    /// file is a non-empty directory) can stop the work halfway.
    pub fn apply(&self, dest: &Path) -> Result<()> {
        let mut written = BTreeSet::new();
        let mut deleted = BTreeSet::new();
        for change in &self.changes {
            let path = change.path.as_str();
            let refuse = |why: String| unsafe_archive(format!("change to {path:?}: {why}"));
            check_rel(path).map_err(refuse)?;
            if is_git(path) {
                return Err(refuse("paths inside .git are never applied".into()));
            }
            match &change.kind {
                ChangeKind::Deleted => deleted.insert(path),
                ChangeKind::Added(new) | ChangeKind::Modified { new, .. } => {
                    if let NewEntry::Symlink { target } = new {
                        check_link(path, target, &|_| None).map_err(refuse)?;
                    }
                    written.insert(path)
                }
            };
        }
        for path in &written {
            if let Some(ancestor) = ancestors(path).find(|a| written.contains(a)) {
                return Err(unsafe_archive(format!(
                    "change to {path:?}: {ancestor:?} is written as a file or symlink by the same change set"
                )));
            }
        }
        for change in &self.changes {
            checked_path(dest, &change.path, Walk::Precheck { deleted: &deleted })?;
        }

        for path in &deleted {
            let Some(full) = checked_path(dest, path, Walk::Lookup)? else {
                continue;
            };
            match fs::symlink_metadata(&full) {
                Ok(m) if m.is_dir() => {} // directories are implicit; a write may replace it
                Ok(_) => fs::remove_file(&full).map_err(io_at("removing", &full))?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(SandboxError::io(
                        format!("inspecting {}", full.display()),
                        e,
                    ))
                }
            }
            for ancestor in ancestors(path).collect::<Vec<_>>().into_iter().rev() {
                if fs::remove_dir(dest.join(ancestor)).is_err() {
                    break;
                }
            }
        }
        for change in &self.changes {
            let (ChangeKind::Added(new) | ChangeKind::Modified { new, .. }) = &change.kind else {
                continue;
            };
            let full =
                checked_path(dest, &change.path, Walk::Create)?.expect("parents were created");
            match fs::symlink_metadata(&full) {
                Ok(m) if m.is_dir() => fs::remove_dir(&full)
                    .map_err(io_at("replacing the directory (it must be empty)", &full))?,
                Ok(_) => fs::remove_file(&full).map_err(io_at("replacing", &full))?,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => {
                    return Err(SandboxError::io(
                        format!("inspecting {}", full.display()),
                        e,
                    ))
                }
            }
            match new {
                NewEntry::File { mode, contents } => {
                    let mut data = contents
                        .reader()
                        .map_err(|e| SandboxError::io("reading spooled contents", e))?;
                    write_new_file(&full, &mut data, contents.len(), *mode)?;
                }
                NewEntry::Symlink { target } => {
                    symlink(target, &full).map_err(io_at("creating the symlink", &full))?
                }
            }
        }
        Ok(())
    }
}

// ---- the repository's ignore rules ---------------------------------------------------

/// The ignore rules of a tree being read, as libgit2 evaluates them. The `.gitignore` files
/// met in the stream are copied into a scratch repository (made on first use) and libgit2 is
/// asked about each path there; `.git/info/exclude` and the user's global excludes are those
/// a fresh clone on this machine would have.
///
/// Docker writes a tree depth first in byte order, so a directory's `.gitignore` comes
/// before the names that sort after ".gitignore" but after those sorting before it
/// (".cache", "-x"). A decision taken before every rule file that can apply to the path was
/// read is *provisional* and checked again at the end. The root's `.gitignore` is fetched
/// before the stream, so provisional decisions are rare.
#[derive(Default)]
struct Ignores {
    scratch: Option<(tempfile::TempDir, git2::Repository)>,
    /// Directories whose `.gitignore` was read (or is known to be absent).
    known: HashSet<String>,
    /// Every rule file is known already (a second pass): nothing is provisional.
    complete: bool,
    /// Directories found ignored (their contents need no question), and whether that
    /// answer was provisional.
    dirs: HashMap<String, bool>,
    /// Bytes of rule files read.
    bytes: u64,
    /// The root `.gitignore` fetched before the stream: its SHA-256, `None` when absent.
    prefetched: Option<Option<[u8; 32]>>,
    /// The stream's root `.gitignore` differs from the one fetched first.
    changed: bool,
}

impl Ignores {
    /// Reads the root's `.gitignore` on its own before the tree streams.
    fn prefetch_root(&mut self, open: &mut Open, limits: &Limits) -> Result<()> {
        let Some(tar) = open(".gitignore")? else {
            self.known.insert(String::new());
            self.prefetched = Some(None);
            return Ok(());
        };
        let mut archive = tar::Archive::new(tar);
        let malformed = |e: io::Error| unsafe_archive(format!("malformed tar: {e}"));
        let Some(entry) = archive.entries().map_err(malformed)?.next() else {
            return Ok(());
        };
        let mut entry = entry.map_err(malformed)?;
        let size = entry.size();
        let regular = matches!(
            entry.header().entry_type(),
            EntryType::Regular | EntryType::Continuous
        );
        if &*entry.path_bytes() != b".gitignore" || !regular {
            // A symlink or directory: git reads no rules from it, and neither do we.
            self.known.insert(String::new());
            self.prefetched = Some(None);
            return Ok(());
        }
        if size > MAX_IGNORE_FILE.min(limits.max_file_bytes) {
            return Ok(()); // too big to read: the root stays provisional
        }
        let data = read_exact_vec(&mut entry, size)
            .map_err(|e| unsafe_archive(format!("\".gitignore\": {e}")))?;
        self.load("", &data)?;
        self.prefetched = Some(Some(sha256_of(&data)));
        Ok(())
    }

    /// Takes the rules of the `.gitignore` in `dir` ("" for the root).
    fn load(&mut self, dir: &str, data: &[u8]) -> Result<()> {
        if self.complete {
            return Ok(());
        }
        if dir.is_empty() {
            if let Some(before) = self.prefetched {
                if before != Some(sha256_of(data)) {
                    self.changed = true;
                } else {
                    return Ok(()); // the same file: nothing to learn
                }
            }
        }
        self.known.insert(dir.to_string());
        self.bytes += data.len() as u64;
        if self.bytes > MAX_IGNORE_TOTAL {
            return Ok(()); // too many rules to read: more is kept, never less
        }
        let (scratch, _) = self.scratch()?;
        let path = scratch.path().join(dir).join(".gitignore");
        let written = fs::create_dir_all(path.parent().expect("has a parent"))
            .and_then(|()| fs::write(&path, data));
        written.map_err(io_at("copying the ignore rules to", &path))
    }

    fn scratch(&mut self) -> Result<&(tempfile::TempDir, git2::Repository)> {
        if self.scratch.is_none() {
            let dir = tempfile::Builder::new()
                .prefix("kodx-ignore-")
                .tempdir()
                .map_err(|e| SandboxError::io("creating a scratch directory", e))?;
            let repo = git2::Repository::init(dir.path()).map_err(|e| {
                SandboxError::InvalidInput(format!(
                    "creating a scratch repository for the ignore rules: {}",
                    e.message()
                ))
            })?;
            self.scratch = Some((dir, repo));
        }
        Ok(self.scratch.as_ref().expect("just made"))
    }

    /// libgit2's answer for `rel` (a directory when `is_dir`).
    fn query(&mut self, rel: &str, is_dir: bool) -> Result<bool> {
        let (_, repo) = self.scratch()?;
        let path = if is_dir {
            format!("{rel}/")
        } else {
            rel.to_string()
        };
        repo.is_path_ignored(&path).map_err(|e| {
            SandboxError::InvalidInput(format!(
                "checking the ignore rules for {rel:?}: {}",
                e.message()
            ))
        })
    }

    /// Whether `rel` is ignored, and whether that answer is provisional. The contents of an
    /// ignored directory are ignored without a question (git never looks inside).
    fn decide(&mut self, rel: &str, is_dir: bool) -> Result<(bool, bool)> {
        for dir in ancestors(rel) {
            if let Some(&provisional) = self.dirs.get(dir) {
                return Ok((true, provisional));
            }
        }
        let provisional = !self.complete && !self.settled(rel);
        let ignored = self.query(rel, is_dir)?;
        if ignored && is_dir {
            self.dirs.insert(rel.to_string(), provisional);
        }
        Ok((ignored, provisional))
    }

    /// True when no `.gitignore` that applies to `rel` can come later in the stream: at
    /// each level, the directory's rule file was read or sorts before the next component.
    fn settled(&self, rel: &str) -> bool {
        let mut dir = "";
        let mut start = 0;
        for part in rel.split('/') {
            if part < ".gitignore" && !self.known.contains(dir) {
                return false;
            }
            dir = &rel[..start + part.len()];
            start += part.len() + 1;
        }
        true
    }

    /// The final answer, every rule file being known: an ignored ancestor directory
    /// ignores everything under it. `cache` holds the directories asked about.
    fn finally(
        &mut self,
        rel: &str,
        is_dir: bool,
        cache: &mut HashMap<String, bool>,
    ) -> Result<bool> {
        for dir in ancestors(rel) {
            let ignored = match cache.get(dir) {
                Some(&v) => v,
                None => {
                    let v = self.query(dir, true)?;
                    cache.insert(dir.to_string(), v);
                    v
                }
            };
            if ignored {
                return Ok(true);
            }
        }
        self.query(rel, is_dir)
    }
}

// ---- reading a hostile tar -----------------------------------------------------------

/// Where the tree read from a tar goes.
enum Out<'d> {
    /// Written into `dest` (ours, empty) as the entries stream past.
    Write(&'d Path),
    /// As `Write`, for an export: ignored files over a limit are left out, not refused.
    Export(&'d Path),
    /// Compared with the baseline: only changes are kept.
    Changes,
}

/// A tree read from a hostile tar: paths relative to the root, every ancestor of a node a
/// `Dir` node. File data is not here: it was written out, kept in a [`Contents`], or
/// compared and dropped.
#[derive(Default)]
struct Tree {
    root_mode: Option<u32>,
    nodes: BTreeMap<String, Node>,
}

enum Node {
    Dir { mode: u32 },
    File { mode: u32, size: u64, data: Data },
    Symlink { target: String },
}

/// What became of a regular file's data.
enum Data {
    /// Written to the output directory.
    Written,
    /// Left out of an export: ignored and over a limit.
    LeftOut,
    /// Change set: kept, as it may differ from the baseline.
    Kept(Contents),
    /// Change set: the same as the baseline's (mode and SHA-256).
    Unchanged,
    /// Change set: not kept; read again by path at the end if still needed. The size,
    /// when known.
    Pending(Option<u64>),
}

/// A decision taken before every rule that applies was known: checked again at the end.
struct Provisional {
    path: String,
    is_dir: bool,
    ignored: bool,
}

/// Where a file's data comes from.
enum Source<'s> {
    /// The tar entry being read.
    Stream(&'s mut dyn Read),
    /// An earlier file of the output directory (a hard link).
    Copy(PathBuf),
}

/// The result of the first reading of a change set.
enum Finished {
    Done(ChangeSet),
    /// Read everything again with these rules (all of them are known now).
    Again(Ignores),
}

struct Reader<'r> {
    root: &'r str,
    limits: &'r Limits,
    baseline: Option<&'r Manifest>,
    out: Out<'r>,
    ignores: Option<Ignores>,
    tree: Tree,
    entries: usize,
    /// Bytes counted against `max_total_bytes`; in an export, ignored files have a
    /// budget of their own so build output never crowds out the real work.
    total: u64,
    ignored_total: u64,
    names: u64,
    memory: u64,
    files: usize,
    provisional: Vec<Provisional>,
    /// Regular files skipped one by one as ignored (a later hard link may point at one).
    skipped: HashSet<String>,
    left_out: Vec<(String, u64)>,
    left_out_count: usize,
}

impl<'r> Reader<'r> {
    fn new(
        root: &'r str,
        limits: &'r Limits,
        baseline: Option<&'r Manifest>,
        out: Out<'r>,
        ignores: Option<Ignores>,
    ) -> Self {
        Reader {
            root,
            limits,
            baseline,
            out,
            ignores,
            tree: Tree::default(),
            entries: 0,
            total: 0,
            ignored_total: 0,
            names: 0,
            memory: 0,
            files: 0,
            provisional: Vec::new(),
            skipped: HashSet::new(),
            left_out: Vec::new(),
            left_out_count: 0,
        }
    }

    fn shown(&self, rel: &str) -> String {
        match (self.root.is_empty(), rel.is_empty()) {
            (true, _) => rel.to_string(),
            (false, true) => self.root.to_string(),
            (false, false) => format!("{}/{rel}", self.root),
        }
    }

    fn changes(&self) -> bool {
        matches!(self.out, Out::Changes)
    }

    fn dest(&self) -> Option<&'r Path> {
        match self.out {
            Out::Write(d) | Out::Export(d) => Some(d),
            Out::Changes => None,
        }
    }

    /// Reads every entry of `tar`.
    fn read(&mut self, tar: impl Read) -> Result<()> {
        let malformed = |e: io::Error| unsafe_archive(format!("malformed tar: {e}"));
        let mut archive = tar::Archive::new(tar);
        for entry in archive.entries().map_err(malformed)? {
            let mut entry = entry.map_err(malformed)?;
            let kind = entry.header().entry_type();
            if kind.is_pax_global_extensions() {
                continue; // archive-wide metadata; the tar crate does not apply it to paths
            }
            let raw = entry.path_bytes().into_owned();
            let refuse =
                |why: String| unsafe_archive(format!("{:?}: {why}", String::from_utf8_lossy(&raw)));
            let rel = match strip_root(&raw, self.root) {
                Ok(rel) => rel,
                Err(_) if self.inside_skipped(&raw) => continue,
                Err(why) => return Err(refuse(why)),
            };
            // A change set skips what is ignored (and .git) before any other check; a
            // regular file is decided once a rule file it may be has been read.
            let regular = matches!(kind, EntryType::Regular | EntryType::Continuous);
            let mut provisional = false;
            if self.changes() && !regular {
                let is_dir = kind == EntryType::Directory;
                match self.triage(&rel, is_dir, kind == EntryType::Link)? {
                    None => continue,
                    Some(p) => provisional = p,
                }
            }
            let mode = entry
                .header()
                .mode()
                .map_err(|e| refuse(format!("bad mode field: {e}")))?
                & 0o7777;
            match kind {
                EntryType::Regular | EntryType::Continuous => {
                    let size = entry.size();
                    self.regular(rel, mode, size, &mut entry)?
                }
                EntryType::Directory => self.dir(rel, mode)?,
                EntryType::Symlink => {
                    let target = entry.link_name_bytes().unwrap_or_default();
                    let target = String::from_utf8(target.into_owned())
                        .map_err(|_| refuse("symlink target is not UTF-8".into()))?;
                    check_target_syntax(&target)
                        .map_err(|why| refuse(format!("symlink: {why}")))?;
                    self.symlink(rel, target)?
                }
                EntryType::Link => {
                    let raw = entry.link_name_bytes().unwrap_or_default();
                    let target = strip_root(&raw, self.root).map_err(|why| {
                        refuse(format!(
                            "hard link to {:?}: {why}",
                            String::from_utf8_lossy(&raw)
                        ))
                    })?;
                    self.hard_link(rel, &target, provisional).map_err(|why| {
                        let raw = String::from_utf8_lossy(&raw);
                        match why {
                            Why::NotEarlier => refuse(format!(
                                "hard link to {raw:?}: not an earlier regular file of the archive"
                            )),
                            Why::Error(e) => e,
                        }
                    })?
                }
                EntryType::Char | EntryType::Block => {
                    return Err(refuse("device file (character or block device)".into()))
                }
                other => return Err(refuse(format!("unsupported entry type {other:?}"))),
            }
        }
        Ok(())
    }

    /// Counts one entry and `name_bytes` of names against the limits.
    fn count(&mut self, rel: &str, name_bytes: usize) -> Result<()> {
        self.entries += 1;
        if self.entries > self.limits.max_entries {
            return Err(unsafe_archive(format!(
                "{:?}: the archive has too many entries (limit max_entries = {})",
                self.shown(rel),
                self.limits.max_entries
            )));
        }
        self.count_names(rel, name_bytes)
    }

    fn count_names(&mut self, rel: &str, bytes: usize) -> Result<()> {
        self.names += bytes as u64;
        if self.names > self.limits.max_name_bytes {
            return Err(unsafe_archive(format!(
                "{:?}: the names in the archive add up to more than {} bytes (limit max_name_bytes)",
                self.shown(rel),
                self.limits.max_name_bytes
            )));
        }
        Ok(())
    }

    fn insert(&mut self, rel: &str, node: Node) -> Result<()> {
        let inserted = self.tree.insert(rel.to_string(), node);
        inserted.map_err(|why| self.at(rel, why))
    }

    /// An error about `rel`, named as in the archive.
    fn at(&self, rel: &str, why: impl std::fmt::Display) -> SandboxError {
        unsafe_archive(format!("{:?}: {why}", self.shown(rel)))
    }

    /// Change set: whether to skip `rel` as ignored (and `.git`). Records what a
    /// provisional answer needs to be checked again. `Ok(Some(provisional))` when kept.
    fn triage(&mut self, rel: &str, is_dir: bool, is_file: bool) -> Result<Option<bool>> {
        if is_git(rel) {
            return Ok(None);
        }
        let tracked = self.baseline.is_some_and(|b| match b.get(rel) {
            Some(ManifestEntry::Dir { .. }) => is_dir,
            Some(_) => true,
            None => false,
        });
        if tracked || rel.is_empty() {
            return Ok(Some(false));
        }
        let Some(ignores) = self.ignores.as_mut() else {
            return Ok(Some(false));
        };
        let (ignored, provisional) = ignores.decide(rel, is_dir)?;
        let inside = under_ignored(&ignores.dirs, rel);
        if provisional && (!ignored || !inside) {
            self.count_names(rel, rel.len())?;
            self.provisional.push(Provisional {
                path: rel.to_string(),
                is_dir,
                ignored,
            });
        }
        if ignored {
            if is_file && !inside {
                self.count_names(rel, rel.len())?;
                self.skipped.insert(rel.to_string());
            }
            return Ok(None);
        }
        Ok(Some(provisional))
    }

    /// Export: whether `rel` is ignored, and whether provisionally.
    fn export_ignored(&mut self, rel: &str) -> Result<(bool, bool)> {
        match (&self.out, self.ignores.as_mut()) {
            (Out::Export(_), Some(ignores)) => ignores.decide(rel, false),
            _ => Ok((false, false)),
        }
    }

    /// The `.gitignore` in a directory that is not skipped: its rules are read.
    fn wants_rules(&self, rel: &str, size: u64) -> bool {
        let Some(ignores) = &self.ignores else {
            return false;
        };
        let base = rel.rsplit('/').next().unwrap_or(rel);
        base == ".gitignore"
            && !ignores.complete
            && !is_git(rel)
            && size <= MAX_IGNORE_FILE
            && !under_ignored(&ignores.dirs, rel)
    }

    fn regular(&mut self, rel: String, mode: u32, size: u64, data: &mut dyn Read) -> Result<()> {
        if rel.is_empty() {
            return Err(self.at(&rel, "the root of the tree is not a directory"));
        }
        // A rule file is read first: its own rules may ignore it.
        let mut rules = None;
        if self.wants_rules(&rel, size) {
            let text = read_exact_vec(data, size).map_err(|e| self.at(&rel, e))?;
            let dir = rel.rsplit_once('/').map_or("", |(d, _)| d);
            self.ignores.as_mut().expect("wanted").load(dir, &text)?;
            rules = Some(text);
        }
        let mut cursor;
        let data: &mut dyn Read = match &rules {
            Some(text) => {
                cursor = &text[..];
                &mut cursor
            }
            None => data,
        };
        if self.changes() {
            let Some(provisional) = self.triage(&rel, false, true)? else {
                return Ok(());
            };
            self.count(&rel, rel.len())?;
            self.insert(
                &rel,
                Node::File {
                    mode,
                    size,
                    data: Data::Pending(Some(size)),
                },
            )?;
            if provisional {
                return Ok(()); // read again at the end if it is still wanted
            }
            let kept = self.compare(&rel, mode, size, data)?;
            self.set_data(&rel, kept);
            Ok(())
        } else {
            self.count(&rel, rel.len())?;
            self.insert(
                &rel,
                Node::File {
                    mode,
                    size,
                    data: Data::Written,
                },
            )?;
            self.write_file(&rel, mode, size, Source::Stream(data))
        }
    }

    fn set_data(&mut self, rel: &str, new: Data) {
        if let Some(Node::File { data, .. }) = self.tree.nodes.get_mut(rel) {
            *data = new;
        }
    }

    /// Change set: reads a file that is not skipped and decides what to keep.
    fn compare(&mut self, rel: &str, mode: u32, size: u64, data: &mut dyn Read) -> Result<Data> {
        let base = self.baseline.and_then(|b| b.file(rel));
        match base {
            // Same size and mode: read to compare, and keep only when it differs.
            Some((old_mode, old_size, old_sha))
                if old_size == size && (old_mode ^ mode) & 0o777 == 0 =>
            {
                if size <= INLINE_MAX {
                    let bytes = read_exact_vec(data, size).map_err(|e| self.at(rel, e))?;
                    if sha256_of(&bytes) == old_sha {
                        return Ok(Data::Unchanged);
                    }
                    self.check_file(rel, size)?;
                    self.add_total(rel, size)?;
                    let contents = read_contents(&mut bytes.as_slice(), size, &mut self.memory)
                        .map_err(|e| self.at(rel, e))?;
                    Ok(Data::Kept(contents))
                } else {
                    let sha = hash_exact(data, size).map_err(|e| self.at(rel, e))?;
                    if sha == old_sha {
                        return Ok(Data::Unchanged);
                    }
                    self.check_file(rel, size)?;
                    Ok(Data::Pending(Some(size)))
                }
            }
            _ => {
                self.check_file(rel, size)?;
                self.add_total(rel, size)?;
                let contents =
                    read_contents(data, size, &mut self.memory).map_err(|e| self.at(rel, e))?;
                Ok(Data::Kept(contents))
            }
        }
    }

    fn check_file(&self, rel: &str, size: u64) -> Result<()> {
        if size > self.limits.max_file_bytes {
            let hint = if self.changes() {
                "; paths the repository's .gitignore ignores are left out"
            } else {
                ""
            };
            return Err(self.at(rel, over_file_limit(size, self.limits) + hint));
        }
        Ok(())
    }

    fn add_total(&mut self, rel: &str, size: u64) -> Result<()> {
        self.total = self.total.saturating_add(size);
        if self.total > self.limits.max_total_bytes {
            return Err(unsafe_archive(format!(
                "{:?}: the files add up to more than {} bytes (limit max_total_bytes)",
                self.shown(rel),
                self.limits.max_total_bytes
            )));
        }
        Ok(())
    }

    /// Output directory: what is over a limit, for a file of `size` counted in the
    /// ignored files' budget or the others'.
    fn over(&self, size: u64, ignored: bool) -> Option<String> {
        let used = if ignored {
            self.ignored_total
        } else {
            self.total
        };
        if size > self.limits.max_file_bytes {
            Some(over_file_limit(size, self.limits))
        } else if used.saturating_add(size) > self.limits.max_total_bytes {
            Some(format!(
                "the files add up to more than {} bytes (limit max_total_bytes)",
                self.limits.max_total_bytes
            ))
        } else {
            None
        }
    }

    /// Output directory: budgets a changed file of `size`, or leaves it out (ignored, or
    /// perhaps ignored once every rule is known), or refuses it. `Ok(false)`: left out.
    fn admit(&mut self, rel: &str, size: u64) -> Result<bool> {
        let (ignored, provisional) = self.export_ignored(rel)?;
        match self.over(size, ignored) {
            None => {
                if ignored {
                    self.ignored_total += size;
                } else {
                    self.total += size;
                }
                Ok(true)
            }
            Some(_) if ignored || provisional => {
                if provisional && !ignored {
                    self.count_names(rel, rel.len())?;
                    self.provisional.push(Provisional {
                        path: rel.to_string(),
                        is_dir: false,
                        ignored: false,
                    });
                }
                self.left_out_count += 1;
                if self.left_out.len() < Exported::SHOWN {
                    self.left_out.push((rel.to_string(), size));
                }
                self.set_data(rel, Data::LeftOut);
                Ok(false)
            }
            Some(why) => Err(unsafe_archive(format!("{:?}: {why}", self.shown(rel)))),
        }
    }

    /// Output directory: writes a file (node inserted already) from `source`.
    fn write_file(&mut self, rel: &str, mode: u32, size: u64, source: Source) -> Result<()> {
        let dest = self.dest().expect("an output directory");
        let same_size = self
            .baseline
            .and_then(|b| b.file(rel))
            .filter(|(_, old_size, _)| *old_size == size);
        if same_size.is_none() && !self.admit(rel, size)? {
            return Ok(()); // left out; the tar crate skips the data
        }
        let path = checked_path(dest, rel, Walk::Create)?.expect("parents were created");
        let shown = self.shown(rel);
        let sha: [u8; 32] = match source {
            Source::Stream(data) => {
                let mut exact = Exact {
                    inner: data,
                    left: size,
                    hasher: Sha256::new(),
                };
                write_new_file(&path, &mut exact, size, mode).map_err(|e| match e {
                    SandboxError::Io { source, .. }
                        if source.kind() == io::ErrorKind::UnexpectedEof =>
                    {
                        unsafe_archive(format!("{shown:?}: the archive ends inside this file"))
                    }
                    e => e,
                })?;
                exact.hasher.finalize().into()
            }
            Source::Copy(from) => {
                let file = File::open(&from).map_err(io_at("reading", &from))?;
                let mut exact = Exact {
                    inner: file,
                    left: size,
                    hasher: Sha256::new(),
                };
                write_new_file(&path, &mut exact, size, mode)?;
                exact.hasher.finalize().into()
            }
        };
        self.files += 1;
        if let Some((_, _, old_sha)) = same_size {
            if sha != old_sha && !self.admit(rel, size)? {
                fs::remove_file(&path).map_err(io_at("removing", &path))?;
                self.files -= 1;
            }
        }
        Ok(())
    }

    fn dir(&mut self, rel: String, mode: u32) -> Result<()> {
        if let (Out::Export(_), Some(ignores)) = (&self.out, self.ignores.as_mut()) {
            // A new directory is asked about once, so that the files of an ignored one
            // (node_modules, target) need no question each.
            let known = self
                .baseline
                .is_some_and(|b| matches!(b.get(&rel), Some(ManifestEntry::Dir { .. })));
            if !known && !rel.is_empty() && !is_git(&rel) && !under_ignored(&ignores.dirs, &rel) {
                ignores.decide(&rel, true)?;
            }
        }
        self.count(&rel, rel.len())?;
        self.insert(&rel, Node::Dir { mode })?;
        if let (Some(dest), false) = (self.dest(), rel.is_empty()) {
            let path = checked_path(dest, &rel, Walk::Create)?.expect("parents were created");
            match fs::create_dir(&path) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
                Err(e) => {
                    return Err(SandboxError::io(
                        format!("creating directory {}", path.display()),
                        e,
                    ))
                }
            }
        }
        Ok(())
    }

    fn symlink(&mut self, rel: String, target: String) -> Result<()> {
        self.count(&rel, rel.len() + target.len())?;
        self.insert(&rel, Node::Symlink { target })
    }

    /// `provisional`: a change set's answer about ignoring `rel` may still change.
    fn hard_link(
        &mut self,
        rel: String,
        target: &str,
        provisional: bool,
    ) -> std::result::Result<(), Why> {
        let earlier = match self.tree.nodes.get(target) {
            Some(Node::File { mode, size, data }) if !target.is_empty() => {
                let sha = match data {
                    Data::Kept(c) => Some(c.sha256()),
                    Data::Unchanged => self.baseline.and_then(|b| b.file(target)).map(|f| f.2),
                    _ => None,
                };
                let kept = match data {
                    Data::Kept(c) => Some(c.clone()),
                    _ => None,
                };
                let left_out = matches!(data, Data::LeftOut);
                let size = match data {
                    Data::Pending(known) => *known,
                    _ => Some(*size),
                };
                Some((*mode, size, sha, kept, left_out))
            }
            _ => None,
        };
        if self.changes() {
            let (mode, size, sha, kept) = match earlier {
                Some((mode, size, sha, kept, _)) => (mode, size, sha, kept),
                None if self.was_skipped(target) => (0o644, None, None, None),
                None => return Err(Why::NotEarlier),
            };
            self.count(&rel, rel.len())?;
            self.insert(
                &rel,
                Node::File {
                    mode,
                    size: size.unwrap_or(0),
                    data: Data::Pending(size),
                },
            )?;
            if provisional {
                return Ok(());
            }
            let base = self.baseline.and_then(|b| b.file(&rel));
            let data = match (base, sha, kept) {
                (Some((old_mode, _, old_sha)), Some(sha), _)
                    if old_sha == sha && (old_mode ^ mode) & 0o777 == 0 =>
                {
                    Data::Unchanged
                }
                (_, _, Some(contents)) => {
                    self.check_file(&rel, contents.len())?;
                    self.add_total(&rel, contents.len())?;
                    Data::Kept(contents)
                }
                _ => {
                    if let Some(size) = size {
                        self.check_file(&rel, size)?;
                    }
                    Data::Pending(size)
                }
            };
            self.set_data(&rel, data);
            return Ok(());
        }
        let Some((mode, Some(size), _, _, left_out)) = earlier else {
            return Err(Why::NotEarlier);
        };
        self.count(&rel, rel.len())?;
        self.insert(
            &rel,
            Node::File {
                mode,
                size,
                data: Data::Written,
            },
        )?;
        if left_out {
            // The data was never written; the link is over the same limit.
            if !self.admit(&rel, size)? {
                return Ok(());
            }
            return Err(Why::Error(unsafe_archive(format!(
                "{:?}: a hard link to a file that was left out",
                self.shown(&rel)
            ))));
        }
        let from = self.dest().expect("an output directory").join(target);
        self.write_file(&rel, mode, size, Source::Copy(from))?;
        Ok(())
    }

    /// Change set: the archive name `raw`, which is not a valid path, lies in `.git` or in
    /// an ignored directory, so it is skipped like its neighbours rather than checked.
    fn inside_skipped(&self, raw: &[u8]) -> bool {
        if !self.changes() {
            return false;
        }
        let name = String::from_utf8_lossy(raw);
        let rest = if self.root.is_empty() {
            Some(name.as_ref())
        } else {
            name.strip_prefix(self.root)
                .and_then(|r| r.strip_prefix('/'))
        };
        rest.is_some_and(|rest| {
            is_git(rest)
                || self
                    .ignores
                    .as_ref()
                    .is_some_and(|i| under_ignored(&i.dirs, rest))
        })
    }

    /// Change set: the path was skipped (in `.git`, ignored on its own or in an ignored
    /// directory), so it is no part of the tree.
    fn was_skipped(&self, path: &str) -> bool {
        is_git(path)
            || self.skipped.contains(path)
            || self
                .ignores
                .as_ref()
                .is_some_and(|i| under_ignored(&i.dirs, path))
    }

    /// Checks that the symlinks stay inside the tree (unless the baseline has that very link).
    fn check_symlinks(&self) -> Result<()> {
        for (path, node) in &self.tree.nodes {
            if let Node::Symlink { target } = node {
                let unchanged = self.baseline.and_then(|b| b.get(path))
                    == Some(&ManifestEntry::Symlink {
                        target: target.clone(),
                    });
                if unchanged {
                    continue;
                }
                let lookup = |p: &str| match self.tree.nodes.get(p) {
                    Some(Node::Symlink { target }) => Some(target.as_str()),
                    _ => None,
                };
                check_link(path, target, &lookup).map_err(|why| {
                    unsafe_archive(format!(
                        "symlink {:?} -> {target:?}: {why}",
                        self.shown(path)
                    ))
                })?;
            }
        }
        Ok(())
    }

    /// Output directory: checks provisional left-outs and the symlinks, then creates the
    /// symlinks and sets the directory modes (deepest first, so none blocks the writing).
    fn finish_write(&mut self) -> Result<Exported> {
        if !self.provisional.is_empty() {
            let mut ignores = self.ignores.take().expect("provisional answers need rules");
            let mut cache = HashMap::new();
            for p in std::mem::take(&mut self.provisional) {
                if !ignores.finally(&p.path, p.is_dir, &mut cache)? {
                    let size = match self.tree.nodes.get(&p.path) {
                        Some(Node::File { size, .. }) => *size,
                        _ => 0,
                    };
                    let why = self
                        .over(size, false)
                        .unwrap_or_else(|| over_file_limit(size, self.limits));
                    return Err(unsafe_archive(format!("{:?}: {why}", self.shown(&p.path))));
                }
            }
        }
        self.check_symlinks()?;
        let dest = self.dest().expect("an output directory");
        for (rel, node) in &self.tree.nodes {
            if let Node::Symlink { target } = node {
                let path = checked_path(dest, rel, Walk::Create)?.expect("parents were created");
                symlink(target, &path).map_err(io_at("creating the symlink", &path))?;
            }
        }
        let dirs = self
            .tree
            .nodes
            .iter()
            .rev()
            .filter_map(|(rel, node)| match node {
                Node::Dir { mode } => Some((dest.join(rel), *mode)),
                _ => None,
            });
        for (path, mode) in dirs.chain(self.tree.root_mode.map(|m| (dest.to_path_buf(), m))) {
            // The owner keeps full access so the export can be read, replaced and removed.
            fs::set_permissions(&path, Permissions::from_mode(mode & 0o777 | 0o700))
                .map_err(io_at("setting the mode of", &path))?;
        }
        Ok(Exported {
            files: self.files,
            left_out: std::mem::take(&mut self.left_out),
            left_out_count: self.left_out_count,
        })
    }

    /// Change set: checks provisional answers again with every rule known, reads pending
    /// files again, and builds the change set — or asks for a second reading.
    fn finish_changes(mut self, open: &mut Open, last: bool) -> Result<Finished> {
        let mut ignores = self
            .ignores
            .take()
            .expect("a change set reads the ignore rules");
        let mut again = ignores.changed;
        {
            let mut cache = HashMap::new();
            for p in std::mem::take(&mut self.provisional) {
                let ignored = ignores.finally(&p.path, p.is_dir, &mut cache)?;
                if p.ignored && !ignored {
                    again = true; // skipped, but wanted after all
                } else if !p.ignored && ignored && !p.is_dir {
                    self.tree.nodes.remove(&p.path);
                }
            }
        }
        if again && !last {
            return Ok(Finished::Again(ignores));
        }
        self.check_symlinks()?;
        let pending: Vec<(String, Option<u64>)> = self
            .tree
            .nodes
            .iter()
            .filter_map(|(path, node)| match node {
                Node::File {
                    data: Data::Pending(size),
                    ..
                } => Some((path.clone(), *size)),
                _ => None,
            })
            .collect();
        for (path, size) in &pending {
            if let Some(size) = size {
                self.check_file(path, *size)?;
            }
        }
        if pending.len() > MAX_REFETCH {
            if !last {
                return Ok(Finished::Again(ignores));
            }
            return Err(unsafe_archive(format!(
                "{} files would have to be read from the container one by one (limit {MAX_REFETCH})",
                pending.len()
            )));
        }
        for (path, _) in pending {
            let data = self.refetch(open, &path)?;
            self.set_data(&path, data);
        }
        Ok(Finished::Done(self.change_list()))
    }

    /// Reads one file of the tree on its own.
    fn refetch(&mut self, open: &mut Open, rel: &str) -> Result<Data> {
        let shown = self.shown(rel);
        let vanished = || {
            unsafe_archive(format!(
                "{shown:?} changed while kodx was taking the changes out of the container; try again"
            ))
        };
        let tar = open(rel)?.ok_or_else(vanished)?;
        let malformed = |e: io::Error| unsafe_archive(format!("{shown:?}: malformed tar: {e}"));
        let mut archive = tar::Archive::new(tar);
        let mut entry = archive
            .entries()
            .map_err(malformed)?
            .next()
            .ok_or_else(vanished)?
            .map_err(malformed)?;
        let base = rel.rsplit('/').next().unwrap_or(rel);
        let regular = matches!(
            entry.header().entry_type(),
            EntryType::Regular | EntryType::Continuous
        );
        if &*entry.path_bytes() != base.as_bytes() || !regular {
            return Err(vanished());
        }
        let mode = entry.header().mode().map_err(malformed)? & 0o7777;
        let size = entry.size();
        if let Some(Node::File {
            mode: m, size: s, ..
        }) = self.tree.nodes.get_mut(rel)
        {
            *m = mode;
            *s = size;
        }
        self.check_file(rel, size)?;
        let contents = read_contents(&mut entry, size, &mut self.memory)
            .map_err(|e| unsafe_archive(format!("{shown:?}: {e}")))?;
        if let Some((old_mode, _, old_sha)) = self.baseline.and_then(|b| b.file(rel)) {
            if old_sha == contents.sha256() && (old_mode ^ mode) & 0o777 == 0 {
                return Ok(Data::Unchanged);
            }
        }
        self.add_total(rel, size)?;
        Ok(Data::Kept(contents))
    }

    /// The change list from the tree and the baseline.
    fn change_list(&self) -> ChangeSet {
        let baseline = self.baseline.expect("a change set has a baseline");
        let mut changes = Vec::new();
        for (path, node) in &self.tree.nodes {
            let (new, diff) = match node {
                Node::Dir { .. } => continue,
                Node::File { mode, data, .. } => {
                    let contents = match data {
                        Data::Kept(c) => c.clone(),
                        _ => continue, // unchanged
                    };
                    let diff = match baseline.get(path) {
                        None | Some(ManifestEntry::Dir { .. }) => None,
                        Some(ManifestEntry::File {
                            mode: old, sha256, ..
                        }) => Some((contents.sha256() != *sha256, (mode ^ old) & 0o777 != 0)),
                        Some(ManifestEntry::Symlink { .. }) => Some((true, false)),
                    };
                    let new = NewEntry::File {
                        mode: mode & 0o777,
                        contents,
                    };
                    (new, diff)
                }
                Node::Symlink { target } => {
                    let diff = match baseline.get(path) {
                        None | Some(ManifestEntry::Dir { .. }) => None,
                        Some(ManifestEntry::Symlink { target: old }) => {
                            Some((target != old, false))
                        }
                        Some(ManifestEntry::File { .. }) => Some((true, false)),
                    };
                    let new = NewEntry::Symlink {
                        target: target.clone(),
                    };
                    (new, diff)
                }
            };
            let kind = match diff {
                Some((false, false)) => continue,
                None => ChangeKind::Added(new),
                Some((content_changed, mode_changed)) => ChangeKind::Modified {
                    new,
                    content_changed,
                    mode_changed,
                },
            };
            changes.push(Change {
                path: path.clone(),
                kind,
            });
        }
        for (path, entry) in &baseline.entries {
            let gone = !matches!(
                self.tree.nodes.get(path),
                Some(Node::File { .. } | Node::Symlink { .. })
            );
            if gone && !is_git(path) && !matches!(entry, ManifestEntry::Dir { .. }) {
                changes.push(Change {
                    path: path.clone(),
                    kind: ChangeKind::Deleted,
                });
            }
        }
        changes.sort_by(|a, b| a.path.cmp(&b.path));
        ChangeSet { changes }
    }
}

/// Why a hard link was refused.
enum Why {
    NotEarlier,
    Error(SandboxError),
}

impl From<SandboxError> for Why {
    fn from(e: SandboxError) -> Self {
        Why::Error(e)
    }
}

fn under_ignored(dirs: &HashMap<String, bool>, rel: &str) -> bool {
    ancestors(rel).any(|d| dirs.contains_key(d))
}

fn over_file_limit(size: u64, limits: &Limits) -> String {
    format!(
        "file of {size} bytes ({}) is over the limit max_file_bytes = {} ({})",
        human(size),
        limits.max_file_bytes,
        human(limits.max_file_bytes)
    )
}

/// E.g. "2.2 GiB", "120.0 MiB", "512 bytes".
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} bytes");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

/// Exactly `size` bytes of `data` into memory (`size` is small: callers check).
fn read_exact_vec(data: &mut dyn Read, size: u64) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    let n = data.take(size).read_to_end(&mut out)?;
    if (n as u64) < size {
        return Err(ends_inside());
    }
    Ok(out)
}

fn ends_inside() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the archive ends inside this file",
    )
}

/// The SHA-256 of exactly `size` bytes of `data`, read through a small buffer.
fn hash_exact(data: &mut dyn Read, size: u64) -> io::Result<[u8; 32]> {
    let mut hasher = Sha256::new();
    let mut buf = vec![0; COPY_BUF];
    let mut left = size;
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = data.read(&mut buf[..want])?;
        if n == 0 {
            return Err(ends_inside());
        }
        hasher.update(&buf[..n]);
        left -= n as u64;
    }
    Ok(hasher.finalize().into())
}

/// Exactly `size` bytes of `data` as [`Contents`]: in memory when small and `memory` (the
/// bytes kept in memory so far) allows, else spooled to a temporary file.
fn read_contents(data: &mut dyn Read, size: u64, memory: &mut u64) -> io::Result<Contents> {
    if size <= INLINE_MAX && *memory + size <= MEMORY_BUDGET {
        let bytes = read_exact_vec(data, size)?;
        *memory += size;
        return Ok(Contents::from(bytes));
    }
    let mut file = tempfile::Builder::new().prefix("kodx-change-").tempfile()?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0; COPY_BUF];
    let mut left = size;
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = data.read(&mut buf[..want])?;
        if n == 0 {
            return Err(ends_inside());
        }
        hasher.update(&buf[..n]);
        file.write_all(&buf[..n])?;
        left -= n as u64;
    }
    file.flush()?;
    Ok(Contents {
        len: size,
        sha256: hasher.finalize().into(),
        stored: Stored::Spooled(Arc::new(file.into_temp_path())),
    })
}

impl Tree {
    /// Adds a node, creating implicit parent directories. Refuses a path below a symlink or
    /// a file, and a second entry for a path unless both are directories.
    fn insert(&mut self, rel: String, node: Node) -> Result<(), String> {
        if rel.is_empty() {
            let Node::Dir { mode } = node else {
                return Err("the root of the tree is not a directory".into());
            };
            self.root_mode = Some(mode);
            return Ok(());
        }
        let mut missing = Vec::new();
        for parent in ancestors(&rel).collect::<Vec<_>>().into_iter().rev() {
            match self.nodes.get(parent) {
                Some(Node::Dir { .. }) => break, // its own ancestors were checked already
                Some(Node::Symlink { .. }) => {
                    return Err(format!("would be written through the symlink {parent:?}"))
                }
                Some(Node::File { .. }) => return Err(format!("its parent {parent:?} is a file")),
                None => missing.push(parent.to_string()),
            }
        }
        for parent in missing {
            self.nodes.insert(parent, Node::Dir { mode: 0o755 });
        }
        match self.nodes.entry(rel) {
            btree_map::Entry::Vacant(slot) => {
                slot.insert(node);
            }
            btree_map::Entry::Occupied(mut slot) => match (slot.get_mut(), node) {
                (Node::Dir { mode }, Node::Dir { mode: new }) => *mode = new,
                _ => return Err("a second entry for the same path".into()),
            },
        }
        Ok(())
    }
}

/// Turns an archive name into a path relative to `root`: refuses non-UTF-8, empty, overlong,
/// NUL-containing and absolute names, `..` components, and names outside `root`;
/// drops empty and `.` components.
fn strip_root(raw: &[u8], root: &str) -> Result<String, String> {
    let name = std::str::from_utf8(raw).map_err(|_| "name is not UTF-8".to_string())?;
    if name.is_empty() {
        return Err("empty name".into());
    }
    if name.len() > MAX_NAME_BYTES {
        return Err(format!("name longer than {MAX_NAME_BYTES} bytes"));
    }
    if name.contains('\0') {
        return Err("NUL byte in name".into());
    }
    if name.starts_with('/') {
        return Err("absolute path".into());
    }
    let mut parts = Vec::new();
    for part in name.split('/') {
        match part {
            "" | "." => {}
            ".." => return Err("path with a `..` component".into()),
            part => parts.push(part),
        }
    }
    if !root.is_empty() {
        if parts.first() != Some(&root) {
            return Err(format!("entry is not under {root:?}"));
        }
        parts.remove(0);
    }
    Ok(parts.join("/"))
}

/// A canonical relative path: non-empty, no NUL, not absolute, no empty/`.`/`..` component.
fn check_rel(path: &str) -> Result<(), String> {
    if path.is_empty() {
        return Err("empty path".into());
    }
    if path.contains('\0') {
        return Err("NUL byte in path".into());
    }
    if path.starts_with('/') {
        return Err("absolute path".into());
    }
    if path.split('/').any(|p| matches!(p, "" | "." | "..")) {
        return Err("path with an empty, `.` or `..` component".into());
    }
    Ok(())
}

/// Syntax only (empty, overlong, NUL); whether the target stays inside the tree is
/// [`check_link`]'s job.
fn check_target_syntax(target: &str) -> Result<(), String> {
    if target.is_empty() {
        return Err("empty target".into());
    }
    if target.len() > MAX_NAME_BYTES {
        return Err(format!("target longer than {MAX_NAME_BYTES} bytes"));
    }
    if target.contains('\0') {
        return Err("NUL byte in target".into());
    }
    Ok(())
}

/// Checks that the symlink at `link` with `target` stays inside the tree when resolved from
/// the link's own directory. `lookup` gives the target of another symlink in the tree, which
/// is followed (so a chain of individually harmless links cannot climb out); with a lookup
/// that knows no links the check is purely lexical.
fn check_link<'t>(
    link: &'t str,
    target: &'t str,
    lookup: &dyn Fn(&str) -> Option<&'t str>,
) -> Result<(), String> {
    let mut dir: Vec<&str> = link.split('/').collect();
    dir.pop();
    resolve(&mut dir, target, lookup, &mut 0)
}

fn resolve<'t>(
    at: &mut Vec<&'t str>,
    target: &'t str,
    lookup: &dyn Fn(&str) -> Option<&'t str>,
    hops: &mut usize,
) -> Result<(), String> {
    check_target_syntax(target)?;
    if target.starts_with('/') {
        return Err("absolute target".into());
    }
    for part in target.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                if at.pop().is_none() {
                    return Err("points outside the tree".into());
                }
            }
            part => {
                at.push(part);
                if let Some(next) = lookup(&at.join("/")) {
                    *hops += 1;
                    if *hops > MAX_SYMLINK_HOPS {
                        return Err("too many levels of symlinks".into());
                    }
                    at.pop();
                    resolve(at, next, lookup, hops)?;
                }
            }
        }
    }
    Ok(())
}

/// The proper ancestors of a relative path, shallowest first: "a/b/c" → "a", "a/b".
fn ancestors(rel: &str) -> impl Iterator<Item = &str> {
    rel.match_indices('/').map(move |(i, _)| &rel[..i])
}

fn is_git(path: &str) -> bool {
    path == ".git" || path.starts_with(".git/")
}

// ---- writing on the host -------------------------------------------------------------

/// How [`checked_path`] treats missing parents, and parents that are not directories.
enum Walk<'s> {
    /// Create missing parents.
    Create,
    /// Stop at a missing parent: there is nothing at the path.
    Lookup,
    /// Like `Lookup`, but a parent that `deleted` removes first is no obstacle.
    Precheck { deleted: &'s BTreeSet<&'s str> },
}

/// `dest/rel`, after checking each parent below `dest` with `symlink_metadata` (never
/// following a symlink): a symlink or other non-directory parent is refused. `None` when a
/// parent is missing (or, in a precheck, deleted first), so nothing is at `rel`.
fn checked_path(dest: &Path, rel: &str, walk: Walk) -> Result<Option<PathBuf>> {
    for parent in ancestors(rel) {
        let path = dest.join(parent);
        match (fs::symlink_metadata(&path), &walk) {
            (Ok(m), _) if m.is_dir() => {}
            (Ok(_), Walk::Precheck { deleted }) if deleted.contains(parent) => return Ok(None),
            (Ok(m), _) => {
                return Err(unsafe_archive(if m.file_type().is_symlink() {
                    format!("{rel:?}: refusing to write through the symlink {parent:?}")
                } else {
                    format!("{rel:?}: its parent {parent:?} is not a directory")
                }))
            }
            (Err(e), Walk::Create) if e.kind() == io::ErrorKind::NotFound => {
                fs::create_dir(&path).map_err(io_at("creating directory", &path))?
            }
            (Err(e), _) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            (Err(e), _) => {
                return Err(SandboxError::io(
                    format!("inspecting {}", path.display()),
                    e,
                ))
            }
        }
    }
    Ok(Some(dest.join(rel)))
}

/// Creates a new file (never opening an existing path, so never following a symlink) and
/// gives it the permission bits of `mode` (`& 0o777`: no setuid, setgid or sticky bit).
/// `size` bytes of `data` are copied through a small buffer.
fn write_new_file(path: &Path, data: &mut dyn Read, size: u64, mode: u32) -> Result<()> {
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_at("creating", path))?;
    let mut buf = vec![
        0;
        COPY_BUF
            .min(usize::try_from(size).unwrap_or(COPY_BUF))
            .max(1)
    ];
    let mut left = size;
    while left > 0 {
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        let n = data
            .read(&mut buf[..want])
            .map_err(io_at("reading the data of", path))?;
        if n == 0 {
            return Err(SandboxError::io(
                format!("reading the data of {}", path.display()),
                ends_inside(),
            ));
        }
        file.write_all(&buf[..n]).map_err(io_at("writing", path))?;
        left -= n as u64;
    }
    file.set_permissions(Permissions::from_mode(mode & 0o777))
        .map_err(io_at("setting the mode of", path))
}

/// A new, empty directory `.{name}.kodx-{tag}-{pid}-{n}` in `parent`.
fn sibling_dir(parent: &Path, name: &str, tag: &str) -> Result<PathBuf> {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    loop {
        let n = COUNTER.fetch_add(1, Ordering::Relaxed);
        let path = parent.join(format!(".{name}.kodx-{tag}-{}-{n}", std::process::id()));
        match fs::create_dir(&path) {
            Ok(()) => return Ok(path),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => {
                return Err(SandboxError::io(
                    format!("creating directory {}", path.display()),
                    e,
                ))
            }
        }
    }
}

fn remove_any(path: &Path) -> io::Result<()> {
    if fs::symlink_metadata(path)?.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

fn unsafe_archive(message: String) -> SandboxError {
    SandboxError::UnsafeArchive(message)
}

fn io_at<'p>(what: &'p str, path: &'p Path) -> impl FnOnce(io::Error) -> SandboxError + 'p {
    move |e| SandboxError::io(format!("{what} {}", path.display()), e)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tempfile::TempDir;

    #[derive(Debug, PartialEq)]
    enum Snap {
        File(u32, Vec<u8>),
        Dir(u32),
        Link(String),
    }

    /// Everything below `root` (not `root` itself), without following symlinks.
    fn snapshot(root: &Path) -> BTreeMap<String, Snap> {
        fn walk(dir: &Path, rel: &str, out: &mut BTreeMap<String, Snap>) {
            for entry in fs::read_dir(dir).unwrap() {
                let entry = entry.unwrap();
                let name = entry.file_name().into_string().unwrap();
                let rel = if rel.is_empty() {
                    name
                } else {
                    format!("{rel}/{name}")
                };
                let path = entry.path();
                let meta = fs::symlink_metadata(&path).unwrap();
                let mode = meta.mode() & 0o7777;
                if meta.file_type().is_symlink() {
                    let target = fs::read_link(&path).unwrap();
                    out.insert(rel, Snap::Link(target.to_str().unwrap().to_string()));
                } else if meta.is_dir() {
                    out.insert(rel.clone(), Snap::Dir(mode));
                    walk(&path, &rel, out);
                } else {
                    out.insert(rel, Snap::File(mode, fs::read(&path).unwrap()));
                }
            }
        }
        let mut out = BTreeMap::new();
        walk(root, "", &mut out);
        out
    }

    fn without_git(mut snap: BTreeMap<String, Snap>) -> BTreeMap<String, Snap> {
        snap.retain(|path, _| !is_git(path));
        snap
    }

    fn put(root: &Path, rel: &str, contents: &str, mode: u32) {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        fs::write(&path, contents).unwrap();
        fs::set_permissions(&path, Permissions::from_mode(mode)).unwrap();
    }

    fn link(root: &Path, rel: &str, target: &str) {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        symlink(target, path).unwrap();
    }

    fn names(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    /// A tree with every kind of thing pack_dir and extract must carry over exactly.
    fn sample_tree(root: &Path) {
        put(root, "a.txt", "alpha\n", 0o644);
        put(root, "bin/run.sh", "#!/bin/sh\necho hi\n", 0o755);
        put(root, "secret", "s3cr3t", 0o600);
        put(root, "nested/deep/x/y.txt", "deep", 0o644);
        put(root, "name with spaces ü✓.txt", "unicode", 0o644);
        fs::create_dir(root.join("empty")).unwrap();
        fs::set_permissions(root.join("bin"), Permissions::from_mode(0o750)).unwrap();
        link(root, "link", "a.txt");
        link(root, "dangling", "nested/missing");
        link(root, "nested/up", "../bin/run.sh");
        link(root, "odd-link", "./nested//deep/");
        let long = format!("{}/{}/file.txt", "d".repeat(90), "e".repeat(100));
        assert!(long.len() >= 200);
        put(root, &long, "long", 0o640);
        link(root, "long-link", &long);
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
        let files = extract(&tar, "repo", &out, &Limits::default()).unwrap();
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
        extract(&tar, "", &top, &Limits::default()).unwrap();
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

    #[test]
    fn pack_file_holds_one_file() {
        let tar = pack_file("setup.sh", b"echo hi\n", 0o755);
        assert!(tar.ends_with(&[0; 1024]));
        let tmp = TempDir::new().unwrap();
        let out = tmp.path().join("out");
        assert_eq!(extract(&tar, "", &out, &Limits::default()).unwrap(), 1);
        assert_eq!(
            snapshot(&out),
            BTreeMap::from([("setup.sh".into(), Snap::File(0o755, b"echo hi\n".to_vec()))])
        );
        let mut archive = tar::Archive::new(tar.as_slice());
        let entry = archive.entries().unwrap().next().unwrap().unwrap();
        assert_eq!(entry.header().uid().unwrap(), 0);
    }

    #[test]
    fn extract_refuses_a_non_empty_dest() {
        let tmp = TempDir::new().unwrap();
        put(tmp.path(), "dest/x", "x", 0o644);
        let tar = pack_file("repo/a", b"a", 0o644);
        let err = extract(&tar, "repo", &tmp.path().join("dest"), &Limits::default()).unwrap_err();
        assert!(matches!(err, SandboxError::InvalidInput(_)), "{err}");
    }

    #[test]
    fn change_set_and_apply() {
        let tmp = TempDir::new().unwrap();
        let orig = tmp.path().join("orig");
        put(&orig, "a.txt", "alpha", 0o644);
        put(&orig, "same.txt", "same", 0o644);
        put(&orig, "mode.sh", "x", 0o644);
        put(&orig, "gone.txt", "bye", 0o644);
        put(&orig, "f2l.txt", "was a file", 0o644);
        put(&orig, "dir/keep.txt", "keep", 0o644);
        put(&orig, "dir/gone2.txt", "bye", 0o644);
        put(&orig, "only/lonely.txt", "bye", 0o644);
        put(&orig, ".git/HEAD", "ref: refs/heads/main", 0o644);
        link(&orig, "link", "a.txt");
        let (tar0, baseline) = pack_dir(&orig, "repo").unwrap();
        let unchanged = change_set(&tar0, "repo", &baseline, &Limits::default()).unwrap();
        assert!(unchanged.is_empty());
        assert_eq!(unchanged.summary(), "no changes");

        let new = tmp.path().join("new");
        extract(&tar0, "repo", &new, &Limits::default()).unwrap();
        put(&new, "a.txt", "alpha changed", 0o644);
        fs::set_permissions(new.join("mode.sh"), Permissions::from_mode(0o755)).unwrap();
        fs::remove_file(new.join("gone.txt")).unwrap();
        fs::remove_file(new.join("dir/gone2.txt")).unwrap();
        fs::remove_dir_all(new.join("only")).unwrap();
        fs::remove_file(new.join("f2l.txt")).unwrap();
        link(&new, "f2l.txt", "a.txt");
        fs::remove_file(new.join("link")).unwrap();
        link(&new, "link", "same.txt");
        put(&new, "new.txt", "brand new", 0o600);
        put(&new, "sub/new/deep.txt", "deep", 0o644);
        put(&new, ".git/HEAD", "ref: refs/heads/other", 0o644);
        put(&new, ".git/objects/ab", "object", 0o444);
        let (tar1, _) = pack_dir(&new, "repo").unwrap();

        let set = change_set(&tar1, "repo", &baseline, &Limits::default()).unwrap();
        let file = |mode, contents: &str| NewEntry::File {
            mode,
            contents: contents.as_bytes().into(),
        };
        let sym = |target: &str| NewEntry::Symlink {
            target: target.into(),
        };
        let modified = |new, content_changed, mode_changed| ChangeKind::Modified {
            new,
            content_changed,
            mode_changed,
        };
        let expected = [
            ("a.txt", modified(file(0o644, "alpha changed"), true, false)),
            ("dir/gone2.txt", ChangeKind::Deleted),
            ("f2l.txt", modified(sym("a.txt"), true, false)),
            ("gone.txt", ChangeKind::Deleted),
            ("link", modified(sym("same.txt"), true, false)),
            ("mode.sh", modified(file(0o755, "x"), false, true)),
            ("new.txt", ChangeKind::Added(file(0o600, "brand new"))),
            ("only/lonely.txt", ChangeKind::Deleted),
            ("sub/new/deep.txt", ChangeKind::Added(file(0o644, "deep"))),
        ];
        let expected: Vec<Change> = expected
            .into_iter()
            .map(|(path, kind)| Change {
                path: path.into(),
                kind,
            })
            .collect();
        assert_eq!(set.changes, expected);
        assert_eq!(set.summary(), "2 added, 4 modified, 3 deleted");
        assert_eq!(set.added().count(), 2);
        assert_eq!(set.deleted().count(), 3);

        let host = tmp.path().join("host");
        extract(&tar0, "repo", &host, &Limits::default()).unwrap();
        set.apply(&host).unwrap();
        assert_eq!(without_git(snapshot(&host)), without_git(snapshot(&new)));
        assert_eq!(
            fs::read_to_string(host.join(".git/HEAD")).unwrap(),
            "ref: refs/heads/main"
        );
    }

    #[test]
    fn apply_handles_type_switches() {
        let tmp = TempDir::new().unwrap();
        let orig = tmp.path().join("orig");
        put(&orig, "sub/s.txt", "s", 0o644);
        link(&orig, "a", "sub"); // becomes a directory
        put(&orig, "f", "file", 0o644); // becomes a directory
        put(&orig, "d/x", "x", 0o644); // d becomes a file
        let (tar0, baseline) = pack_dir(&orig, "repo").unwrap();

        let new = tmp.path().join("new");
        put(&new, "sub/s.txt", "s", 0o644);
        put(&new, "a/x", "through?", 0o644);
        put(&new, "f/inner.txt", "inner", 0o644);
        put(&new, "d", "now a file", 0o644);
        let (tar1, _) = pack_dir(&new, "repo").unwrap();

        let set = change_set(&tar1, "repo", &baseline, &Limits::default()).unwrap();
        assert_eq!(set.summary(), "3 added, 3 deleted");
        let host = tmp.path().join("host");
        extract(&tar0, "repo", &host, &Limits::default()).unwrap();
        set.apply(&host).unwrap();
        assert_eq!(snapshot(&host), snapshot(&new));
    }

    #[test]
    fn replace_dir_swaps_the_whole_tree() {
        let tmp = TempDir::new().unwrap();
        let src = tmp.path().join("src");
        fs::create_dir(&src).unwrap();
        sample_tree(&src);
        let (tar, _) = pack_dir(&src, "repo").unwrap();

        let parent = tmp.path().join("exports");
        let dest = parent.join("repo");
        put(&dest, "stale.txt", "old", 0o644);
        put(&dest, "a.txt", "old alpha", 0o644);
        replace_dir(&tar, "repo", &dest, &Limits::default(), None).unwrap();
        assert_eq!(snapshot(&dest), snapshot(&src));
        assert_eq!(names(&parent), ["repo"]);

        // Parents are created; an absent dest is fine.
        let deep = tmp.path().join("a/b/c");
        replace_dir(&tar, "repo", &deep, &Limits::default(), None).unwrap();
        assert_eq!(snapshot(&deep), snapshot(&src));
    }

    #[test]
    fn hard_link_inside_is_written_as_a_copy() {
        let tar = raw_tar(&[
            RawEntry::dir("repo/"),
            RawEntry::file("repo/a", "data"),
            RawEntry::hard("repo/b", "repo/a"),
        ]);
        let tmp = TempDir::new().unwrap();
        let out = tmp.path().join("out");
        assert_eq!(extract(&tar, "repo", &out, &Limits::default()).unwrap(), 2);
        assert_eq!(fs::read_to_string(out.join("b")).unwrap(), "data");
        assert_eq!(fs::metadata(out.join("a")).unwrap().nlink(), 1);
    }

    #[test]
    fn pax_long_names_work() {
        let long = format!("repo/{}/f.txt", "p".repeat(150));
        let target = format!("{}/f.txt", "p".repeat(150));
        let mut b = tar::Builder::new(Vec::new());
        append_pax(&mut b, &[("path", &long)]);
        let mut h = Header::new_ustar();
        h.set_path("repo/truncated").unwrap();
        h.set_size(4);
        h.set_mode(0o600);
        h.set_cksum();
        b.append(&h, &b"long"[..]).unwrap();
        append_pax(&mut b, &[("linkpath", &target)]);
        let mut h = Header::new_ustar();
        h.set_path("repo/l").unwrap();
        h.set_entry_type(EntryType::Symlink);
        h.set_link_name("x").unwrap();
        h.set_mode(0o777);
        h.set_size(0);
        h.set_cksum();
        b.append(&h, io::empty()).unwrap();
        let tar = b.into_inner().unwrap();

        let tmp = TempDir::new().unwrap();
        let out = tmp.path().join("out");
        extract(&tar, "repo", &out, &Limits::default()).unwrap();
        let rel = long.strip_prefix("repo/").unwrap();
        assert_eq!(fs::read_to_string(out.join(rel)).unwrap(), "long");
        assert_eq!(fs::read_link(out.join("l")).unwrap(), Path::new(&target));
        assert!(!out.join("truncated").exists());
    }

    fn append_pax(b: &mut tar::Builder<Vec<u8>>, records: &[(&str, &str)]) {
        let mut body = Vec::new();
        for (key, value) in records {
            let base = key.len() + value.len() + 3; // ' ', '=', '\n'
            let mut len = base + 1;
            while base + len.to_string().len() != len {
                len = base + len.to_string().len();
            }
            body.extend(format!("{len} {key}={value}\n").into_bytes());
        }
        let mut h = Header::new_ustar();
        h.set_path("PaxHeaders/x").unwrap();
        h.set_entry_type(EntryType::XHeader);
        h.set_size(body.len() as u64);
        h.set_cksum();
        b.append(&h, body.as_slice()).unwrap();
    }

    /// A tar entry with raw name bytes, bypassing the tar crate's own path checks.
    struct RawEntry {
        name: Vec<u8>,
        kind: EntryType,
        data: Vec<u8>,
        link: Vec<u8>,
    }

    impl RawEntry {
        fn new(name: impl Into<Vec<u8>>, kind: EntryType, data: &str, link: &str) -> Self {
            RawEntry {
                name: name.into(),
                kind,
                data: data.as_bytes().to_vec(),
                link: link.as_bytes().to_vec(),
            }
        }
        fn file(name: &str, data: &str) -> Self {
            Self::new(name, EntryType::Regular, data, "")
        }
        fn dir(name: &str) -> Self {
            Self::new(name, EntryType::Directory, "", "")
        }
        fn sym(name: &str, target: &str) -> Self {
            Self::new(name, EntryType::Symlink, "", target)
        }
        fn hard(name: &str, target: &str) -> Self {
            Self::new(name, EntryType::Link, "", target)
        }
    }

    fn raw_tar(entries: &[RawEntry]) -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        for e in entries {
            let mut h = Header::new_gnu();
            h.as_old_mut().name[..e.name.len()].copy_from_slice(&e.name);
            h.as_old_mut().linkname[..e.link.len()].copy_from_slice(&e.link);
            h.set_entry_type(e.kind);
            h.set_mode(0o644);
            h.set_size(e.data.len() as u64);
            h.set_cksum();
            b.append(&h, e.data.as_slice()).unwrap();
        }
        b.into_inner().unwrap()
    }

    /// Runs extract, replace_dir and change_set on a hostile tar: each must refuse with an
    /// UnsafeArchive message containing `needle`, leave an existing dest as it was, and
    /// write nothing next to it (no `outside` file, no leftover temp dir).
    fn assert_refused(case: &str, make: impl Fn(&Path) -> Vec<u8>, limits: &Limits, needle: &str) {
        let tmp = TempDir::new().unwrap();
        let outside = tmp.path().join("outside");
        fs::create_dir(&outside).unwrap();
        let tar = make(&outside);
        let dest = tmp.path().join("dest");
        let check = |op: &str, result: Result<()>| match result {
            Err(SandboxError::UnsafeArchive(m)) => {
                assert!(
                    m.contains(needle),
                    "{case}/{op}: {m:?} does not mention {needle:?}"
                )
            }
            other => panic!("{case}/{op}: expected UnsafeArchive, got {other:?}"),
        };
        check("extract", extract(&tar, "repo", &dest, limits).map(drop));
        assert!(!dest.exists(), "{case}: extract left {}", dest.display());
        put(&dest, "keep", "kept", 0o644);
        check(
            "replace_dir",
            replace_dir(&tar, "repo", &dest, limits, None).map(drop),
        );
        assert_eq!(
            snapshot(&dest),
            BTreeMap::from([("keep".into(), Snap::File(0o644, b"kept".to_vec()))]),
            "{case}: replace_dir touched dest"
        );
        check(
            "change_set",
            change_set(&tar, "repo", &Manifest::default(), limits).map(drop),
        );
        assert!(names(&outside).is_empty(), "{case}: wrote outside");
        assert_eq!(names(tmp.path()), ["dest", "outside"], "{case}: leftovers");
    }

    #[test]
    fn hostile_archives_are_refused() {
        let d = Limits::default;
        // Builds the tar, given the path of the `outside` directory.
        type Make = Box<dyn Fn(&Path) -> Vec<u8>>;
        type Case = (&'static str, Make, Limits, &'static str);
        let tar = |entries: Vec<RawEntry>| -> Make {
            let bytes = raw_tar(&entries);
            Box::new(move |_| bytes.clone())
        };
        let cases: Vec<Case> = vec![
            (
                "absolute path",
                Box::new(|outside| {
                    let name = format!("{}/pwned", outside.display());
                    raw_tar(&[RawEntry::file(&name, "x")])
                }),
                d(),
                "absolute path",
            ),
            (
                "../escape",
                tar(vec![RawEntry::file("../outside/x", "x")]),
                d(),
                "`..`",
            ),
            (
                "root/../x",
                tar(vec![
                    RawEntry::dir("repo/"),
                    RawEntry::file("repo/../outside/x", "x"),
                ]),
                d(),
                "`..`",
            ),
            (
                "symlink to /etc",
                tar(vec![RawEntry::sym("repo/l", "/etc")]),
                d(),
                "absolute target",
            ),
            (
                "symlink ../../outside",
                tar(vec![RawEntry::sym("repo/l", "../../outside")]),
                d(),
                "outside the tree",
            ),
            (
                "symlink ../outside",
                tar(vec![RawEntry::sym("repo/l", "../outside")]),
                d(),
                "outside the tree",
            ),
            (
                "chained symlinks",
                tar(vec![
                    RawEntry::sym("repo/a/b/s", "../.."),
                    RawEntry::sym("repo/t", "a/b/s/../outside"),
                ]),
                d(),
                "outside the tree",
            ),
            (
                "symlink loop",
                tar(vec![
                    RawEntry::sym("repo/x", "y"),
                    RawEntry::sym("repo/y", "x"),
                ]),
                d(),
                "too many levels",
            ),
            (
                "file through a symlink",
                tar(vec![
                    RawEntry::dir("repo/sub/"),
                    RawEntry::sym("repo/link", "sub"),
                    RawEntry::file("repo/link/pwned", "x"),
                ]),
                d(),
                "through the symlink",
            ),
            (
                "symlink replacing a directory",
                tar(vec![
                    RawEntry::file("repo/d/x", "x"),
                    RawEntry::sym("repo/d", "x"),
                ]),
                d(),
                "second entry",
            ),
            (
                "hard link to /etc/passwd",
                tar(vec![RawEntry::hard("repo/h", "/etc/passwd")]),
                d(),
                "hard link",
            ),
            (
                "hard link outside",
                tar(vec![RawEntry::hard("repo/h", "repo/../outside/x")]),
                d(),
                "hard link",
            ),
            (
                "hard link to a later entry",
                tar(vec![
                    RawEntry::hard("repo/h", "repo/later"),
                    RawEntry::file("repo/later", "x"),
                ]),
                d(),
                "not an earlier regular file",
            ),
            (
                "hard link to a directory",
                tar(vec![
                    RawEntry::dir("repo/d/"),
                    RawEntry::hard("repo/h", "repo/d"),
                ]),
                d(),
                "not an earlier regular file",
            ),
            (
                "char device",
                tar(vec![RawEntry::new("repo/null", EntryType::Char, "", "")]),
                d(),
                "device file",
            ),
            (
                "block device",
                tar(vec![RawEntry::new("repo/sda", EntryType::Block, "", "")]),
                d(),
                "device file",
            ),
            (
                "fifo",
                tar(vec![RawEntry::new("repo/fifo", EntryType::Fifo, "", "")]),
                d(),
                "unsupported entry type",
            ),
            (
                "entry outside root",
                tar(vec![RawEntry::file("other/x", "x")]),
                d(),
                "not under",
            ),
            (
                "root is a symlink",
                tar(vec![RawEntry::sym("repo", "sub")]),
                d(),
                "not a directory",
            ),
            (
                "non-UTF-8 name",
                tar(vec![RawEntry::new(
                    b"repo/\xff".as_slice(),
                    EntryType::Regular,
                    "x",
                    "",
                )]),
                d(),
                "UTF-8",
            ),
            (
                "file over max_file_bytes",
                tar(vec![RawEntry::file("repo/big", "0123456789A")]),
                Limits {
                    max_file_bytes: 10,
                    ..d()
                },
                "max_file_bytes = 10",
            ),
            (
                "total over max_total_bytes",
                tar(vec![
                    RawEntry::file("repo/a", "0123456789"),
                    RawEntry::file("repo/b", "0123456789"),
                ]),
                Limits {
                    max_total_bytes: 15,
                    ..d()
                },
                "max_total_bytes",
            ),
            (
                "hard links count toward the total",
                tar(vec![
                    RawEntry::file("repo/a", "0123456789"),
                    RawEntry::hard("repo/b", "repo/a"),
                ]),
                Limits {
                    max_total_bytes: 15,
                    ..d()
                },
                "max_total_bytes",
            ),
            (
                "too many entries",
                tar(vec![
                    RawEntry::dir("repo/"),
                    RawEntry::file("repo/a", ""),
                    RawEntry::file("repo/b", ""),
                    RawEntry::file("repo/c", ""),
                ]),
                Limits {
                    max_entries: 3,
                    ..d()
                },
                "max_entries = 3",
            ),
            (
                "truncated archive",
                Box::new(|_| {
                    let mut bytes = raw_tar(&[RawEntry::file("repo/a", &"x".repeat(2000))]);
                    bytes.truncate(1024);
                    bytes
                }),
                d(),
                "ends inside",
            ),
            (
                "garbage",
                Box::new(|_| vec![0xff; 1024]),
                d(),
                "malformed tar",
            ),
        ];
        for (case, make, limits, needle) in cases {
            assert_refused(case, make, &limits, needle);
        }
    }

    #[test]
    fn apply_refuses_unsafe_changes() {
        let tmp = TempDir::new().unwrap();
        let outside = tmp.path().join("outside");
        put(&outside, "victim", "precious", 0o644);
        let dest = tmp.path().join("dest");
        link(&dest, "evil", "../outside");
        let added = |path: &str| Change {
            path: path.into(),
            kind: ChangeKind::Added(NewEntry::File {
                mode: 0o644,
                contents: b"x".to_vec().into(),
            }),
        };
        let deleted = |path: &str| Change {
            path: path.into(),
            kind: ChangeKind::Deleted,
        };
        let cases = [
            (
                vec![added("good.txt"), added("evil/x")],
                "through the symlink",
            ),
            (vec![deleted("evil/victim")], "through the symlink"),
            (vec![added("good.txt"), added("../x")], "`..`"),
            (vec![added("/abs")], "absolute"),
            (vec![added("a/./b")], "`.`"),
            (vec![added("")], "empty path"),
            (vec![added(".git/hooks/pre-commit")], ".git"),
            (vec![added("f"), added("f/g")], "same change set"),
            (
                vec![Change {
                    path: "l".into(),
                    kind: ChangeKind::Added(NewEntry::Symlink {
                        target: "../outside".into(),
                    }),
                }],
                "outside the tree",
            ),
        ];
        for (changes, needle) in cases {
            let set = ChangeSet { changes };
            match set.apply(&dest) {
                Err(SandboxError::UnsafeArchive(m)) => {
                    assert!(m.contains(needle), "{m:?} does not mention {needle:?}")
                }
                other => panic!("{set:?}: expected UnsafeArchive, got {other:?}"),
            }
            assert_eq!(names(&dest), ["evil"], "{set:?} changed dest");
            assert_eq!(names(&outside), ["victim"]);
            assert_eq!(
                fs::read_to_string(outside.join("victim")).unwrap(),
                "precious"
            );
        }
    }

    #[test]
    fn escaping_symlinks_from_the_host_are_kept_but_new_ones_refused() {
        let src = tempfile::tempdir().unwrap();
        fs::write(src.path().join("a.txt"), "a").unwrap();
        symlink("../shared/common", src.path().join("common")).unwrap();
        symlink("/usr/share/dict", src.path().join("dict")).unwrap();
        let (tar, baseline) = pack_dir(src.path(), "repo").unwrap();
        let out = tempfile::tempdir().unwrap();
        let dest = out.path().join("export");
        // Without a baseline the links are refused; with it they are the user's own.
        assert!(matches!(
            replace_dir(&tar, "repo", &dest, &Limits::default(), None),
            Err(SandboxError::UnsafeArchive(_))
        ));
        replace_dir(&tar, "repo", &dest, &Limits::default(), Some(&baseline)).unwrap();
        assert_eq!(
            fs::read_link(dest.join("common")).unwrap(),
            Path::new("../shared/common")
        );
        assert!(change_set(&tar, "repo", &baseline, &Limits::default())
            .unwrap()
            .is_empty());
        // The same name pointing elsewhere outside, or a new link through the kept one: refused.
        fs::remove_file(src.path().join("dict")).unwrap();
        symlink("/etc", src.path().join("dict")).unwrap();
        symlink("common/../../x", src.path().join("via")).unwrap();
        let (tar2, _) = pack_dir(src.path(), "repo").unwrap();
        let err = change_set(&tar2, "repo", &baseline, &Limits::default()).unwrap_err();
        assert!(err.to_string().contains("dict"), "{err}");
        fs::remove_file(src.path().join("dict")).unwrap();
        let (tar3, _) = pack_dir(src.path(), "repo").unwrap();
        let err = change_set(&tar3, "repo", &baseline, &Limits::default()).unwrap_err();
        assert!(err.to_string().contains("via"), "{err}");
    }

    /// A file of `size` bytes (sparse: no disk used).
    fn sized(root: &Path, rel: &str, size: u64) {
        let path = root.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        File::create(&path).unwrap().set_len(size).unwrap();
    }

    fn paths(set: &ChangeSet) -> Vec<String> {
        set.changes
            .iter()
            .map(|c| {
                let kind = match c.kind {
                    ChangeKind::Added(_) => "added",
                    ChangeKind::Modified { .. } => "modified",
                    ChangeKind::Deleted => "deleted",
                };
                format!("{kind} {}", c.path)
            })
            .collect()
    }

    fn small_limits() -> Limits {
        Limits {
            max_file_bytes: 1000,
            ..Limits::default()
        }
    }

    #[test]
    fn ignored_paths_are_skipped_before_the_limits_apply() {
        let tmp = TempDir::new().unwrap();
        let orig = tmp.path().join("orig");
        put(&orig, ".gitignore", "target/\n*.log\n", 0o644);
        put(&orig, "src/a.rs", "fn a() {}\n", 0o644);
        put(
            &orig,
            "target/tracked.txt",
            "tracked in an ignored dir\n",
            0o644,
        );
        put(&orig, "gone.log", "tracked, matches *.log\n", 0o644);
        let (_, baseline) = pack_dir(&orig, "repo").unwrap();

        let new = tmp.path().join("new");
        put(
            &new,
            ".gitignore",
            "target/\n*.log\ndist/\n!keep.log\n",
            0o644,
        );
        put(&new, "src/a.rs", "fn a() { changed }\n", 0o644);
        put(
            &new,
            "target/tracked.txt",
            "changed, still tracked\n",
            0o644,
        );
        sized(&new, "target/app.bin", 120_000); // over the 1000-byte limit, ignored
        sized(&new, "target/deep/x.o", 5000);
        sized(&new, "debug.log", 5000); // ignored by pattern
        put(&new, "keep.log", "re-included\n", 0o644);
        sized(&new, "dist/bundle.js", 5000); // ignored by the model's own new rule
        put(&new, ".git/objects/pack/p.pack", &"x".repeat(5000), 0o444);
        let (tar, _) = pack_dir(&new, "repo").unwrap();
        let set = change_set(&tar, "repo", &baseline, &small_limits()).unwrap();
        assert_eq!(
            paths(&set),
            [
                "modified .gitignore",
                "deleted gone.log",
                "added keep.log",
                "modified src/a.rs",
                "modified target/tracked.txt",
            ]
        );

        // A real oversize change is still refused, naming the file.
        sized(&new, "data.bin", 5000);
        let (tar, _) = pack_dir(&new, "repo").unwrap();
        let err = change_set(&tar, "repo", &baseline, &small_limits()).unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.contains("repo/data.bin") && msg.contains("max_file_bytes = 1000"),
            "{msg}"
        );
        fs::remove_file(new.join("data.bin")).unwrap();

        // Once the model un-ignores target/, its build output is a change like any other.
        put(&new, ".gitignore", "*.log\ndist/\n", 0o644);
        let (tar, _) = pack_dir(&new, "repo").unwrap();
        let err = change_set(&tar, "repo", &baseline, &small_limits()).unwrap_err();
        assert!(err.to_string().contains("repo/target/app.bin"), "{err}");
    }

    #[test]
    fn rules_that_come_later_in_the_stream_still_apply() {
        // Docker writes "-x" and ".cache" before ".gitignore": decisions about them are
        // provisional and taken again once the directory's rules are known.
        let tmp = TempDir::new().unwrap();
        let orig = tmp.path().join("orig");
        put(&orig, "sub/keep.txt", "k", 0o644);
        let (_, baseline) = pack_dir(&orig, "repo").unwrap();
        let new = tmp.path().join("new");
        put(&new, "sub/keep.txt", "k", 0o644);
        put(&new, "sub/.gitignore", "*.tmp\n/.cache/\n", 0o644);
        sized(&new, "sub/-early.tmp", 5000);
        sized(&new, "sub/.cache/blob", 5000);
        put(&new, "sub/-early.txt", "wanted", 0o640);
        put(&new, "sub/late.tmp", "ignored", 0o644);
        put(&new, ".aaa/.gitignore", "!x\n", 0o644); // root has no rules at all
        put(&new, ".aaa/x", "x", 0o644);
        let (tar, _) = pack_dir(&new, "repo").unwrap();
        let order: Vec<String> = tar::Archive::new(tar.as_slice())
            .entries()
            .unwrap()
            .map(|e| String::from_utf8_lossy(&e.unwrap().path_bytes()).into_owned())
            .collect();
        let pos = |p: &str| order.iter().position(|n| n == p).unwrap();
        assert!(pos("repo/sub/-early.tmp") < pos("repo/sub/.gitignore"));
        assert!(pos("repo/sub/.cache/blob") < pos("repo/sub/.gitignore"));

        let set = change_set(&tar, "repo", &baseline, &small_limits()).unwrap();
        assert_eq!(
            paths(&set),
            [
                "added .aaa/.gitignore",
                "added .aaa/x",
                "added sub/-early.txt",
                "added sub/.gitignore",
            ]
        );
        let early = set
            .changes
            .iter()
            .find(|c| c.path == "sub/-early.txt")
            .unwrap();
        let ChangeKind::Added(NewEntry::File { mode, contents }) = &early.kind else {
            panic!("{early:?}")
        };
        assert_eq!(
            (*mode, contents.to_vec().unwrap()),
            (0o640, b"wanted".to_vec())
        );
    }

    #[test]
    fn a_root_gitignore_that_comes_late_is_fetched_first() {
        // The root's rules are read before the stream, so "-big" (before ".gitignore")
        // is decided at once and never read.
        let tmp = TempDir::new().unwrap();
        let new = tmp.path().join("new");
        put(&new, ".gitignore", "-big\n.build/\n", 0o644);
        sized(&new, "-big", 5000);
        sized(&new, ".build/debug/app", 5000);
        put(&new, "a.txt", "a", 0o644);
        let (tar, _) = pack_dir(&new, "repo").unwrap();
        let mut asked = Vec::new();
        let mut inner = memory_opener(&tar, "repo");
        let mut open = |p: &str| {
            asked.push(p.to_string());
            inner(p)
        };
        let set =
            change_set_from(&mut open, "repo", &Manifest::default(), &small_limits()).unwrap();
        assert_eq!(paths(&set), ["added .gitignore", "added a.txt"]);
        assert_eq!(
            asked,
            [".gitignore", ""],
            "no second reading, nothing fetched again"
        );
    }

    #[test]
    fn large_changes_are_spooled_and_same_size_edits_read_again() {
        let tmp = TempDir::new().unwrap();
        let orig = tmp.path().join("orig");
        let big = "b".repeat(300 << 10); // over INLINE_MAX
        put(&orig, "same-size.dat", &big, 0o644);
        put(&orig, "untouched.dat", &big, 0o644);
        let (_, baseline) = pack_dir(&orig, "repo").unwrap();
        let new = tmp.path().join("new");
        put(&new, "untouched.dat", &big, 0o644);
        let edited = format!("X{}", &big[1..]);
        put(&new, "same-size.dat", &edited, 0o644);
        let added = "n".repeat(2 << 20);
        put(&new, "new.dat", &added, 0o600);
        let (tar, _) = pack_dir(&new, "repo").unwrap();
        let set = change_set(&tar, "repo", &baseline, &Limits::default()).unwrap();
        assert_eq!(paths(&set), ["added new.dat", "modified same-size.dat"]);
        for (change, want) in set.changes.iter().zip([&added, &edited]) {
            let (ChangeKind::Added(NewEntry::File { contents, .. })
            | ChangeKind::Modified {
                new: NewEntry::File { contents, .. },
                ..
            }) = &change.kind
            else {
                panic!("{change:?}")
            };
            assert!(contents.is_spooled(), "{change:?}");
            assert_eq!(contents.to_vec().unwrap(), want.as_bytes());
        }
        let host = tmp.path().join("host");
        extract(
            &pack_dir(&orig, "repo").unwrap().0,
            "repo",
            &host,
            &Limits::default(),
        )
        .unwrap();
        set.apply(&host).unwrap();
        assert_eq!(snapshot(&host), snapshot(&new));
    }

    #[test]
    fn hard_links_to_skipped_files_are_read_again() {
        let tar = raw_tar(&[
            RawEntry::dir("repo/"),
            RawEntry::file("repo/.gitignore", "target/\n"),
            RawEntry::dir("repo/target/"),
            RawEntry::file("repo/target/app", "binary"),
            RawEntry::hard("repo/zz-app", "repo/target/app"),
        ]);
        let set = change_set(&tar, "repo", &Manifest::default(), &Limits::default()).unwrap();
        assert_eq!(paths(&set), ["added .gitignore", "added zz-app"]);
        let ChangeKind::Added(NewEntry::File { contents, .. }) = &set.changes[1].kind else {
            panic!("{set:?}")
        };
        assert_eq!(contents.to_vec().unwrap(), b"binary");
    }

    #[test]
    fn an_export_leaves_out_ignored_files_over_the_limits_and_keeps_the_users_own() {
        let tmp = TempDir::new().unwrap();
        let orig = tmp.path().join("orig");
        put(&orig, ".gitignore", "target/\n", 0o644);
        sized(&orig, "assets/video.bin", 5000); // the user's own, over the limit
        let (_, baseline) = pack_dir(&orig, "repo").unwrap();
        let new = tmp.path().join("new");
        put(&new, ".gitignore", "target/\n", 0o644);
        sized(&new, "assets/video.bin", 5000);
        sized(&new, "target/app.bin", 120_000);
        put(&new, "target/small.txt", "built", 0o644);
        put(&new, "src/main.rs", "fn main() {}\n", 0o644);
        let (tar, _) = pack_dir(&new, "repo").unwrap();
        let dest = tmp.path().join("export");
        let exported = replace_dir(&tar, "repo", &dest, &small_limits(), Some(&baseline)).unwrap();
        assert_eq!(
            (exported.files, exported.left_out, exported.left_out_count),
            (4, vec![("target/app.bin".to_string(), 120_000)], 1)
        );
        let mut want = snapshot(&new);
        want.remove("target/app.bin");
        assert_eq!(snapshot(&dest), want);

        // The user's own big file, changed by the model, is over the limit like any change.
        sized(&new, "assets/video.bin", 6000);
        let (tar, _) = pack_dir(&new, "repo").unwrap();
        let err = replace_dir(&tar, "repo", &dest, &small_limits(), Some(&baseline)).unwrap_err();
        assert!(err.to_string().contains("repo/assets/video.bin"), "{err}");
        assert_eq!(
            snapshot(&dest),
            want,
            "a refused export leaves dest as it was"
        );
    }

    #[test]
    fn what_an_ignored_directory_holds_is_not_checked() {
        // Build output may hold anything; git never looks inside, and neither does a
        // change set. The same entries outside are refused (hostile_archives_are_refused).
        let tar = raw_tar(&[
            RawEntry::dir("repo/"),
            RawEntry::file("repo/.gitignore", "node_modules/\n"),
            RawEntry::dir("repo/node_modules/"),
            RawEntry::new(
                b"repo/node_modules/\xff".as_slice(),
                EntryType::Regular,
                "x",
                "",
            ),
            RawEntry::new("repo/node_modules/fifo", EntryType::Fifo, "", ""),
            RawEntry::new("repo/node_modules/null", EntryType::Char, "", ""),
            RawEntry::sym("repo/node_modules/etc", "/etc"),
            RawEntry::file("repo/node_modules/etc/passwd", "through a symlink"),
            RawEntry::file("repo/a.txt", "a"),
        ]);
        let set = change_set(&tar, "repo", &Manifest::default(), &Limits::default()).unwrap();
        assert_eq!(paths(&set), ["added .gitignore", "added a.txt"]);
    }
}
