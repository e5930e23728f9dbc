//! Helpers shared by the archive tests: trees on disk, snapshots, hand-made tars.

use std::collections::BTreeMap;
use std::fs::{self, File, Permissions};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::Path;

use tar::{EntryType, Header};

use super::changes::{ChangeKind, ChangeSet};
use super::limits::ArchiveLimits;
use super::names::is_git;

#[derive(Debug, PartialEq)]
pub(super) enum Snap {
    File(u32, Vec<u8>),
    Dir(u32),
    Link(String),
}

/// Everything below `root` (not `root` itself), without following symlinks.
pub(super) fn snapshot(root: &Path) -> BTreeMap<String, Snap> {
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

pub(super) fn without_git(mut snap: BTreeMap<String, Snap>) -> BTreeMap<String, Snap> {
    snap.retain(|path, _| !is_git(path));
    snap
}

pub(super) fn put(root: &Path, rel: &str, contents: &str, mode: u32) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    fs::write(&path, contents).unwrap();
    fs::set_permissions(&path, Permissions::from_mode(mode)).unwrap();
}

pub(super) fn link(root: &Path, rel: &str, target: &str) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    symlink(target, path).unwrap();
}

pub(super) fn names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// A tree with every kind of thing pack_dir and extract must carry over exactly.
pub(super) fn sample_tree(root: &Path) {
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

pub(super) fn append_pax(b: &mut tar::Builder<Vec<u8>>, records: &[(&str, &str)]) {
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
pub(super) struct RawEntry {
    pub(super) name: Vec<u8>,
    pub(super) kind: EntryType,
    pub(super) data: Vec<u8>,
    pub(super) link: Vec<u8>,
}

impl RawEntry {
    pub(super) fn new(name: impl Into<Vec<u8>>, kind: EntryType, data: &str, link: &str) -> Self {
        RawEntry {
            name: name.into(),
            kind,
            data: data.as_bytes().to_vec(),
            link: link.as_bytes().to_vec(),
        }
    }
    pub(super) fn file(name: &str, data: &str) -> Self {
        Self::new(name, EntryType::Regular, data, "")
    }
    pub(super) fn dir(name: &str) -> Self {
        Self::new(name, EntryType::Directory, "", "")
    }
    pub(super) fn sym(name: &str, target: &str) -> Self {
        Self::new(name, EntryType::Symlink, "", target)
    }
    pub(super) fn hard(name: &str, target: &str) -> Self {
        Self::new(name, EntryType::Link, "", target)
    }
}

pub(super) fn raw_tar(entries: &[RawEntry]) -> Vec<u8> {
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

/// A file of `size` bytes (sparse: no disk used).
pub(super) fn sized(root: &Path, rel: &str, size: u64) {
    let path = root.join(rel);
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    File::create(&path).unwrap().set_len(size).unwrap();
}

pub(super) fn paths(set: &ChangeSet) -> Vec<String> {
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

pub(super) fn small_limits() -> ArchiveLimits {
    ArchiveLimits {
        max_file_bytes: 1000,
        ..ArchiveLimits::default()
    }
}
