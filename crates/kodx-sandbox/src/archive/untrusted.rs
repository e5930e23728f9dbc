//! The untrusted-tar reader: every entry of a tar out of the container is checked as it
//! streams past (names, sizes, links, limits) before it goes anywhere.

use std::collections::{btree_map, BTreeMap, HashMap, HashSet};
use std::fs;
use std::io::{self, Read};

use std::path::{Path, PathBuf};

use tar::{EntryType, Header};

use super::bounded::{hash_exact, read_exact_vec, tar_error, tree_cap, untrusted_archive};
use super::contents::{read_contents, Contents};
use super::disk::{checked_path, Walk};
use super::ignore::Ignores;
use super::limits::{
    human, unsafe_archive, ArchiveLimits, INLINE_MAX, MAX_IGNORE_FILE, MAX_SYMLINK_HOPS,
};
use super::manifest::{Manifest, ManifestEntry};
use super::names::{ancestors, check_link, check_target_syntax, is_git, strip_root};
use super::pack::sha256_of;
use crate::error::{Result, SandboxError};

/// An [`Open`](super::Open) over a tar in memory: the whole tar, or one path of it re-packed under its
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
pub(super) fn find_entry(
    tar: &[u8],
    root: &str,
    path: &str,
    hops: usize,
) -> Option<(Header, Vec<u8>)> {
    let mut archive = untrusted_archive(tar, u64::MAX); // in memory already: no cap
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

/// Where the tree read from a tar goes.
pub(super) enum Out<'d> {
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
pub(super) struct Tree {
    pub(super) root_mode: Option<u32>,
    pub(super) nodes: BTreeMap<String, Node>,
}

pub(super) enum Node {
    Dir { mode: u32 },
    File { mode: u32, size: u64, data: Data },
    Symlink { target: String },
}

/// What became of a regular file's data.
pub(super) enum Data {
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
pub(super) struct Provisional {
    pub(super) path: String,
    pub(super) is_dir: bool,
    pub(super) ignored: bool,
}

/// Where a file's data comes from.
pub(super) enum Source<'s> {
    /// The tar entry being read.
    Stream(&'s mut dyn Read),
    /// An earlier file of the output directory (a hard link).
    Copy(PathBuf),
}

pub(super) struct Reader<'r> {
    pub(super) root: &'r str,
    pub(super) limits: &'r ArchiveLimits,
    pub(super) baseline: Option<&'r Manifest>,
    pub(super) out: Out<'r>,
    pub(super) ignores: Option<Ignores>,
    pub(super) tree: Tree,
    pub(super) entries: usize,
    /// Bytes counted against `max_total_bytes`; in an export, ignored files have a
    /// budget of their own so build output never crowds out the real work.
    pub(super) total: u64,
    pub(super) ignored_total: u64,
    pub(super) names: u64,
    pub(super) memory: u64,
    pub(super) files: usize,
    pub(super) provisional: Vec<Provisional>,
    /// Regular files skipped one by one as ignored (a later hard link may point at one).
    pub(super) skipped: HashSet<String>,
    pub(super) left_out: Vec<(String, u64)>,
    pub(super) left_out_count: usize,
    /// Reading kodx's helper's snapshot ([`super::change_set_from_snapshot`]): an entry
    /// of type [`AS_COPIED`] is a baseline file as it was copied in.
    pub(super) snapshot: bool,
}

impl<'r> Reader<'r> {
    pub(super) fn new(
        root: &'r str,
        limits: &'r ArchiveLimits,
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
            snapshot: false,
        }
    }

    pub(super) fn shown(&self, rel: &str) -> String {
        match (self.root.is_empty(), rel.is_empty()) {
            (true, _) => rel.to_string(),
            (false, true) => self.root.to_string(),
            (false, false) => format!("{}/{rel}", self.root),
        }
    }

    pub(super) fn changes(&self) -> bool {
        matches!(self.out, Out::Changes)
    }

    pub(super) fn dest(&self) -> Option<&'r Path> {
        match self.out {
            Out::Write(d) | Out::Export(d) => Some(d),
            Out::Changes => None,
        }
    }

    /// Reads every entry of `tar` (through [`Bounded`](super::Bounded), capped by [`tree_cap`]).
    pub(super) fn read(&mut self, tar: impl Read) -> Result<()> {
        let mut archive = untrusted_archive(tar, tree_cap(self.limits, self.baseline));
        for entry in archive.entries().map_err(tar_error)? {
            let mut entry = entry.map_err(tar_error)?;
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
            if self.snapshot && kind.as_byte() == AS_COPIED {
                self.as_copied(&rel)?;
                continue;
            }
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
    pub(super) fn count(&mut self, rel: &str, name_bytes: usize) -> Result<()> {
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

    pub(super) fn count_names(&mut self, rel: &str, bytes: usize) -> Result<()> {
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

    pub(super) fn insert(&mut self, rel: &str, node: Node) -> Result<()> {
        let inserted = self.tree.insert(rel.to_string(), node);
        inserted.map_err(|why| self.at(rel, why))
    }

    /// An error about `rel`, named as in the archive.
    pub(super) fn at(&self, rel: &str, why: impl std::fmt::Display) -> SandboxError {
        unsafe_archive(format!("{:?}: {why}", self.shown(rel)))
    }

    /// Change set: whether to skip `rel` as ignored (and `.git`). Records what a
    /// provisional answer needs to be checked again. `Ok(Some(provisional))` when kept.
    pub(super) fn triage(
        &mut self,
        rel: &str,
        is_dir: bool,
        is_file: bool,
    ) -> Result<Option<bool>> {
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
    pub(super) fn export_ignored(&mut self, rel: &str) -> Result<(bool, bool)> {
        match (&self.out, self.ignores.as_mut()) {
            (Out::Export(_), Some(ignores)) => ignores.decide(rel, false),
            _ => Ok((false, false)),
        }
    }

    /// The `.gitignore` in a directory that is not skipped: its rules are read.
    pub(super) fn wants_rules(&self, rel: &str, size: u64) -> bool {
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

    pub(super) fn regular(
        &mut self,
        rel: String,
        mode: u32,
        size: u64,
        data: &mut dyn Read,
    ) -> Result<()> {
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

    pub(super) fn set_data(&mut self, rel: &str, new: Data) {
        if let Some(Node::File { data, .. }) = self.tree.nodes.get_mut(rel) {
            *data = new;
        }
    }

    /// Change set: reads a file that is not skipped and decides what to keep.
    pub(super) fn compare(
        &mut self,
        rel: &str,
        mode: u32,
        size: u64,
        data: &mut dyn Read,
    ) -> Result<Data> {
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

    pub(super) fn check_file(&self, rel: &str, size: u64) -> Result<()> {
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

    pub(super) fn add_total(&mut self, rel: &str, size: u64) -> Result<()> {
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

    pub(super) fn dir(&mut self, rel: String, mode: u32) -> Result<()> {
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

    pub(super) fn symlink(&mut self, rel: String, target: String) -> Result<()> {
        self.count(&rel, rel.len() + target.len())?;
        self.insert(&rel, Node::Symlink { target })
    }

    /// `provisional`: a change set's answer about ignoring `rel` may still change.
    pub(super) fn hard_link(
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
    pub(super) fn inside_skipped(&self, raw: &[u8]) -> bool {
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
    pub(super) fn was_skipped(&self, path: &str) -> bool {
        is_git(path)
            || self.skipped.contains(path)
            || self
                .ignores
                .as_ref()
                .is_some_and(|i| under_ignored(&i.dirs, path))
    }

    /// Checks that the symlinks stay inside the tree (unless the baseline has that very link).
    pub(super) fn check_symlinks(&self) -> Result<()> {
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
}

/// The snapshot's entry type for a regular file whose inode has not changed since the
/// copy-in: a header alone (`U`, one of the types POSIX leaves to implementations).
pub(super) const AS_COPIED: u8 = b'U';

/// Why a hard link was refused.
pub(super) enum Why {
    NotEarlier,
    Error(SandboxError),
}

impl From<SandboxError> for Why {
    fn from(e: SandboxError) -> Self {
        Why::Error(e)
    }
}

pub(super) fn under_ignored(dirs: &HashMap<String, bool>, rel: &str) -> bool {
    ancestors(rel).any(|d| dirs.contains_key(d))
}

pub(super) fn over_file_limit(size: u64, limits: &ArchiveLimits) -> String {
    format!(
        "file of {size} bytes ({}) is over the limit max_file_bytes = {} ({})",
        human(size),
        limits.max_file_bytes,
        human(limits.max_file_bytes)
    )
}

impl Tree {
    /// Adds a node, creating implicit parent directories. Refuses a path below a symlink or
    /// a file, and a second entry for a path unless both are directories.
    pub(super) fn insert(&mut self, rel: String, node: Node) -> Result<(), String> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::testutil::*;
    use crate::archive::{change_set, extract, pack_dir, replace_dir};
    use std::os::unix::fs::{symlink, MetadataExt};
    use tempfile::TempDir;

    #[test]
    fn hard_link_inside_is_written_as_a_copy() {
        let tar = raw_tar(&[
            RawEntry::dir("repo/"),
            RawEntry::file("repo/a", "data"),
            RawEntry::hard("repo/b", "repo/a"),
        ]);
        let tmp = TempDir::new().unwrap();
        let out = tmp.path().join("out");
        assert_eq!(
            extract(&tar, "repo", &out, &ArchiveLimits::default()).unwrap(),
            2
        );
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
        extract(&tar, "repo", &out, &ArchiveLimits::default()).unwrap();
        let rel = long.strip_prefix("repo/").unwrap();
        assert_eq!(fs::read_to_string(out.join(rel)).unwrap(), "long");
        assert_eq!(fs::read_link(out.join("l")).unwrap(), Path::new(&target));
        assert!(!out.join("truncated").exists());
    }

    /// Runs extract, replace_dir and change_set on a hostile tar: each must refuse with an
    /// UnsafeArchive message containing `needle`, leave an existing dest as it was, and
    /// write nothing next to it (no `outside` file, no leftover temp dir).
    fn assert_refused(
        case: &str,
        make: impl Fn(&Path) -> Vec<u8>,
        limits: &ArchiveLimits,
        needle: &str,
    ) {
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
        let d = ArchiveLimits::default;
        // Builds the tar, given the path of the `outside` directory.
        type Make = Box<dyn Fn(&Path) -> Vec<u8>>;
        type Case = (&'static str, Make, ArchiveLimits, &'static str);
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
                ArchiveLimits {
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
                ArchiveLimits {
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
                ArchiveLimits {
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
                ArchiveLimits {
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
            replace_dir(&tar, "repo", &dest, &ArchiveLimits::default(), None),
            Err(SandboxError::UnsafeArchive(_))
        ));
        replace_dir(
            &tar,
            "repo",
            &dest,
            &ArchiveLimits::default(),
            Some(&baseline),
        )
        .unwrap();
        assert_eq!(
            fs::read_link(dest.join("common")).unwrap(),
            Path::new("../shared/common")
        );
        assert!(
            change_set(&tar, "repo", &baseline, &ArchiveLimits::default())
                .unwrap()
                .is_empty()
        );
        // The same name pointing elsewhere outside, or a new link through the kept one: refused.
        fs::remove_file(src.path().join("dict")).unwrap();
        symlink("/etc", src.path().join("dict")).unwrap();
        symlink("common/../../x", src.path().join("via")).unwrap();
        let (tar2, _) = pack_dir(src.path(), "repo").unwrap();
        let err = change_set(&tar2, "repo", &baseline, &ArchiveLimits::default()).unwrap_err();
        assert!(err.to_string().contains("dict"), "{err}");
        fs::remove_file(src.path().join("dict")).unwrap();
        let (tar3, _) = pack_dir(src.path(), "repo").unwrap();
        let err = change_set(&tar3, "repo", &baseline, &ArchiveLimits::default()).unwrap_err();
        assert!(err.to_string().contains("via"), "{err}");
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
        let set = change_set(
            &tar,
            "repo",
            &Manifest::default(),
            &ArchiveLimits::default(),
        )
        .unwrap();
        assert_eq!(paths(&set), ["added .gitignore", "added a.txt"]);
    }
}
