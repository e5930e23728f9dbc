//! Writing on the host: a tree out of the container into a fresh directory
//! ([`extract`], [`replace_dir_from`]) and a [`ChangeSet`] onto a host tree
//! ([`ChangeSet::apply`]), never through a symlink.

use std::collections::{BTreeSet, HashMap};
use std::fs::{self, File, OpenOptions, Permissions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{symlink, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use super::bounded::ends_inside;
use super::changes::{ChangeKind, ChangeSet, NewEntry};
use super::disk::{checked_path, Walk};
use super::ignore::Ignores;
use super::limits::{gone, io_at, unsafe_archive, ArchiveLimits, Open, COPY_BUF};
use super::manifest::Manifest;
use super::names::{ancestors, check_link, check_rel, check_root, is_git};
use super::pack::{header, Exact, Packer};
use super::untrusted::{
    memory_opener, over_file_limit, Data, Node, Out, Provisional, Reader, Source,
};
use crate::error::{Result, SandboxError};

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

/// Validates the hostile `tar` and writes its tree into `dest`, which must not exist yet
/// (it is created) or be an empty directory.
///
/// Every entry must be `root` or under `root/` (Docker's GET archive of
/// "/workspace/repo" yields "repo", "repo/a.txt", …); that prefix is stripped. An empty
/// `root` takes the entries as they are. Files are written as they stream past; if any
/// entry breaks a rule, or writing fails, what was written is removed again.
/// Returns the number of regular files written.
pub fn extract(tar: &[u8], root: &str, dest: &Path, limits: &ArchiveLimits) -> Result<usize> {
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
    limits: &ArchiveLimits,
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
    limits: &ArchiveLimits,
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

/// Renames `fresh` to `dest`, first moving an existing `dest` (of whatever type) into a new
/// trash directory of our own rather than onto a name that might exist (renaming a directory
/// silently replaces an empty one). Returns the trash directory to remove. On error the old
/// `dest` is back in place.
pub(super) fn swap_into_place(
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
        let (_, deleted) = self.validated()?;
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

impl ChangeSet {
    /// The paths written (added, modified) and deleted, once every change passed the rules
    /// [`ChangeSet::apply`] holds them to: relative, no `.`/`..`, not in the top-level
    /// ".git", symlink targets relative and inside the tree, no path written below another
    /// written as a file or symlink.
    pub(super) fn validated(&self) -> Result<(BTreeSet<&str>, BTreeSet<&str>)> {
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
        Ok((written, deleted))
    }

    /// The deleted paths, once every change passed the rules of [`ChangeSet::apply`], and
    /// whether they can be removed while the rest is written: no written path is one of
    /// them, or above or below one (a directory that became a file, or the reverse).
    pub fn checked_deletions(&self) -> Result<(Vec<String>, bool)> {
        let (written, deleted) = self.validated()?;
        let apart = deleted
            .iter()
            .all(|d| !written.contains(d) && !ancestors(d).any(|a| written.contains(a)))
            && written
                .iter()
                .all(|w| !ancestors(w).any(|a| deleted.contains(a)));
        Ok((deleted.into_iter().map(str::to_string).collect(), apart))
    }

    /// The change set as a tar for another copy of the same tree (the checks' sandbox, SPEC
    /// §12): its added and modified files (permission bits kept, owner root) and symlinks,
    /// paths relative to the tree's top, after the rules of [`ChangeSet::apply`]. Returns
    /// the deleted paths, which a tar cannot say: the caller removes them first. Contents
    /// are streamed, never read whole.
    pub fn pack_written_to<W: Write>(&self, out: W) -> Result<Vec<String>> {
        let (_, deleted) = self.validated()?;
        let mtime = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut packer = Packer {
            builder: tar::Builder::new(out),
            manifest: Manifest::default(),
            prefix: "",
            have: None,
            skipped: Default::default(),
        };
        for change in &self.changes {
            let (ChangeKind::Added(new) | ChangeKind::Modified { new, .. }) = &change.kind else {
                continue;
            };
            let path = change.path.as_str();
            let packing = |e: io::Error| SandboxError::io(format!("packing {path}"), e);
            match new {
                NewEntry::File { mode, contents } => {
                    let data = contents
                        .reader()
                        .map_err(|e| SandboxError::io("reading spooled contents", e))?;
                    let mut h =
                        header(tar::EntryType::Regular, mode & 0o777, mtime, contents.len());
                    packer
                        .builder
                        .append_data(&mut h, path, data)
                        .map_err(packing)?;
                }
                NewEntry::Symlink { target } => packer
                    .append_symlink(path, target, 0o777, mtime)
                    .map_err(packing)?,
            }
        }
        let finished = packer.builder.into_inner().and_then(|mut out| out.flush());
        finished.map_err(|e| SandboxError::io("packing the change set", e))?;
        Ok(deleted.into_iter().map(str::to_string).collect())
    }
}

impl Reader<'_> {
    /// Output directory: what is over a limit, for a file of `size` counted in the
    /// ignored files' budget or the others'.
    pub(super) fn over(&self, size: u64, ignored: bool) -> Option<String> {
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
    pub(super) fn admit(&mut self, rel: &str, size: u64) -> Result<bool> {
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
    pub(super) fn write_file(
        &mut self,
        rel: &str,
        mode: u32,
        size: u64,
        source: Source,
    ) -> Result<()> {
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
    /// Output directory: checks provisional left-outs and the symlinks, then creates the
    /// symlinks and sets the directory modes (deepest first, so none blocks the writing).
    pub(super) fn finish_write(&mut self) -> Result<Exported> {
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
}

/// Creates a new file (never opening an existing path, so never following a symlink) and
/// gives it the permission bits of `mode` (`& 0o777`: no setuid, setgid or sticky bit).
/// `size` bytes of `data` are copied through a small buffer.
pub(super) fn write_new_file(path: &Path, data: &mut dyn Read, size: u64, mode: u32) -> Result<()> {
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
pub(super) fn sibling_dir(parent: &Path, name: &str, tag: &str) -> Result<PathBuf> {
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

pub(super) fn remove_any(path: &Path) -> io::Result<()> {
    if fs::symlink_metadata(path)?.is_dir() {
        fs::remove_dir_all(path)
    } else {
        fs::remove_file(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::testutil::*;
    use crate::archive::{change_set, pack_dir, pack_file, Change, Contents};
    use tempfile::TempDir;

    #[test]
    fn extract_refuses_a_non_empty_dest() {
        let tmp = TempDir::new().unwrap();
        put(tmp.path(), "dest/x", "x", 0o644);
        let tar = pack_file("repo/a", b"a", 0o644);
        let err = extract(
            &tar,
            "repo",
            &tmp.path().join("dest"),
            &ArchiveLimits::default(),
        )
        .unwrap_err();
        assert!(matches!(err, SandboxError::InvalidInput(_)), "{err}");
    }

    #[test]
    fn deletions_run_beside_the_writes_only_when_no_path_depends_on_another() {
        let set = |changes: &[(&str, bool)]| ChangeSet {
            changes: changes
                .iter()
                .map(|(path, deleted)| Change {
                    path: path.to_string(),
                    kind: if *deleted {
                        ChangeKind::Deleted
                    } else {
                        ChangeKind::Added(NewEntry::File {
                            mode: 0o644,
                            contents: Contents::from(b"x".as_slice()),
                        })
                    },
                })
                .collect(),
        };
        let (deleted, apart) = set(&[("a/x", true), ("b/y", false)])
            .checked_deletions()
            .unwrap();
        assert_eq!((deleted, apart), (vec!["a/x".to_string()], true));
        // A directory become a file, and a file become a directory.
        assert!(
            !set(&[("d/x", true), ("d", false)])
                .checked_deletions()
                .unwrap()
                .1
        );
        assert!(
            !set(&[("f", true), ("f/inner", false)])
                .checked_deletions()
                .unwrap()
                .1
        );
        assert!(set(&[("../x", true)]).checked_deletions().is_err());
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

        let set = change_set(&tar1, "repo", &baseline, &ArchiveLimits::default()).unwrap();
        assert_eq!(set.summary(), "3 added, 3 deleted");
        let host = tmp.path().join("host");
        extract(&tar0, "repo", &host, &ArchiveLimits::default()).unwrap();
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
        replace_dir(&tar, "repo", &dest, &ArchiveLimits::default(), None).unwrap();
        assert_eq!(snapshot(&dest), snapshot(&src));
        assert_eq!(names(&parent), ["repo"]);

        // Parents are created; an absent dest is fine.
        let deep = tmp.path().join("a/b/c");
        replace_dir(&tar, "repo", &deep, &ArchiveLimits::default(), None).unwrap();
        assert_eq!(snapshot(&deep), snapshot(&src));
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
}
