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
//!
//! One file per layer: [`pack`] (host directory → tar), [`untrusted`] (the reader that
//! checks every entry of a hostile tar), [`names`] (the checks of entry names and symlink
//! targets), [`ignore`] (the `.gitignore` rules met on the way), [`changes`] (the
//! change-set diff against the manifest) and [`write`] (trees and change sets onto the
//! host disk). The items the layers share live in this file.

use std::collections::BTreeMap;
use std::io::{self, Read};
use std::path::Path;

use super::{Result, SandboxError};

mod bounded;
mod changes;
mod ignore;
mod names;
mod pack;
#[cfg(test)]
mod testutil;
mod tip;
mod untrusted;
mod write;

pub use bounded::{untrusted_archive, Bounded, STREAM_HEADROOM};
pub use changes::{
    change_set, change_set_from, change_set_from_snapshot, Change, ChangeKind, ChangeSet, Contents,
    NewEntry,
};
pub use pack::{
    pack_checkout_to, pack_dir, pack_dir_to, pack_file, pack_files, pack_over_to, pack_tip_to,
    PackSource, Skipped,
};
pub use untrusted::memory_opener;
pub use write::{extract, replace_dir, replace_dir_from, Exported};
// Each layer sees the others' crate-private items (`use super::*`) through this.
use {bounded::*, changes::*, ignore::*, names::*, pack::*, tip::*, untrusted::*, write::*};

/// Longest entry name or symlink target accepted (Linux's PATH_MAX).
const MAX_NAME_BYTES: usize = 4096;

/// The first line of a manifest written by [`Manifest::to_bytes`].
const MANIFEST_MAGIC: &[u8] = b"kodx-manifest 1\n";
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
pub struct ArchiveLimits {
    /// Largest single regular file, in bytes.
    pub max_file_bytes: u64,
    /// Largest sum of all regular files (hard-link copies included), in bytes. Files the
    /// same as in the baseline do not count: the user's own tree was there already.
    pub max_total_bytes: u64,
    /// Most entries in the archive.
    pub max_entries: usize,
    /// Largest sum of the entry names and symlink targets held while reading.
    pub max_name_bytes: u64,
    /// Most bytes read from one tar stream out of the container, headers, padding and
    /// ignored files included, beyond the bytes of the baseline's files (they were there
    /// already). Nothing else bounds what ignored files (build output) may send: this
    /// bounds the time a stream can take. See [`ArchiveLimits::for_disk`].
    pub max_stream_bytes: u64,
}

impl Default for ArchiveLimits {
    /// 100 MiB per file, 2 GiB in total, 500 000 entries, 64 MiB of names, and 16 GiB
    /// read from one stream: a sandbox's default disk limit (10 GiB) and
    /// [`STREAM_HEADROOM`].
    fn default() -> Self {
        ArchiveLimits {
            max_file_bytes: 100 << 20,
            max_total_bytes: 2 << 30,
            max_entries: 500_000,
            max_name_bytes: 64 << 20,
            max_stream_bytes: (10 << 30) + STREAM_HEADROOM,
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

    /// Every path with its entry, in path order.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &ManifestEntry)> + '_ {
        self.entries.iter().map(|(p, e)| (p.as_str(), e))
    }

    /// The entry at `path` (relative, e.g. "src/main.rs").
    pub fn get(&self, path: &str) -> Option<&ManifestEntry> {
        self.entries.get(path)
    }

    /// The manifest without `.git` and what is under it.
    pub fn without_git(&self) -> Manifest {
        Manifest {
            entries: self
                .entries
                .iter()
                .filter(|(p, _)| *p != ".git" && !p.starts_with(".git/"))
                .map(|(p, e)| (p.clone(), e.clone()))
                .collect(),
        }
    }

    /// The manifest as bytes that [`Manifest::from_bytes`] reads back: a header line, then
    /// one NUL-terminated record of five NUL-terminated fields per path (kind, path, and
    /// mode, size and SHA-256 of a file; the target of a symlink; the mode of a directory).
    /// Paths and targets never hold NUL (the packer refuses them).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = MANIFEST_MAGIC.to_vec();
        for (path, entry) in &self.entries {
            let (kind, a, b, c) = match entry {
                ManifestEntry::File { mode, size, sha256 } => (
                    "F",
                    format!("{mode:o}"),
                    size.to_string(),
                    hex::encode(sha256),
                ),
                ManifestEntry::Symlink { target } => {
                    ("L", target.clone(), String::new(), String::new())
                }
                ManifestEntry::Dir { mode } => {
                    ("D", format!("{mode:o}"), String::new(), String::new())
                }
            };
            for field in [kind, path.as_str(), &a, &b, &c] {
                out.extend_from_slice(field.as_bytes());
                out.push(0);
            }
        }
        out
    }

    /// Reads what [`Manifest::to_bytes`] wrote. Anything else is an error: the bytes come
    /// back out of a container.
    pub fn from_bytes(bytes: &[u8]) -> std::result::Result<Manifest, String> {
        let body = bytes
            .strip_prefix(MANIFEST_MAGIC)
            .ok_or("not a kodx manifest (no header)")?;
        let body = match body {
            [] => body,
            [rest @ .., 0] => rest,
            _ => return Err("the manifest does not end with a complete record".into()),
        };
        let mut entries = BTreeMap::new();
        if body.is_empty() {
            return Ok(Manifest { entries });
        }
        let fields: Vec<&[u8]> = body.split(|b| *b == 0).collect();
        if fields.len() % 5 != 0 {
            return Err("the manifest's records are cut short".into());
        }
        fn text(f: &[u8]) -> std::result::Result<&str, String> {
            std::str::from_utf8(f).map_err(|_| "a field is not UTF-8".to_string())
        }
        let mode = |f: &[u8]| {
            u32::from_str_radix(text(f)?, 8)
                .ok()
                .filter(|m| *m <= 0o7777)
                .ok_or_else(|| "a bad mode".to_string())
        };
        for record in fields.chunks(5) {
            let path = text(record[1])?;
            check_rel(path).map_err(|why| format!("a bad path {path:?}: {why}"))?;
            let entry = match record[0] {
                b"F" => {
                    let size = text(record[3])?
                        .parse()
                        .map_err(|_| "a bad size".to_string())?;
                    let sha = hex::decode(record[4]).map_err(|_| "a bad hash".to_string())?;
                    ManifestEntry::File {
                        mode: mode(record[2])?,
                        size,
                        sha256: sha.try_into().map_err(|_| "a bad hash".to_string())?,
                    }
                }
                b"L" => ManifestEntry::Symlink {
                    target: text(record[2])?.to_string(),
                },
                b"D" => ManifestEntry::Dir {
                    mode: mode(record[2])?,
                },
                _ => return Err("an entry of unknown kind".into()),
            };
            if entries.insert(path.to_string(), entry).is_some() {
                return Err(format!("the path {path:?} twice"));
            }
        }
        Ok(Manifest { entries })
    }

    /// The sum of the sizes of its regular files.
    pub fn file_bytes(&self) -> u64 {
        self.entries
            .values()
            .map(|e| match e {
                ManifestEntry::File { size, .. } => *size,
                _ => 0,
            })
            .fold(0, u64::saturating_add)
    }

    /// `(mode, size, sha256)` of the regular file at `path`.
    fn file(&self, path: &str) -> Option<(u32, u64, [u8; 32])> {
        match self.entries.get(path) {
            Some(ManifestEntry::File { mode, size, sha256 }) => Some((*mode, *size, *sha256)),
            _ => None,
        }
    }
}

/// Opens a tar stream of the tree (`""`) or of one path in it (relative to the tree's
/// root), the way Docker's archive endpoint gives them: the tree's entries under
/// `root/`, a single path as its bare file name. `Ok(None)` when the path does not exist.
pub type Open<'o> = dyn FnMut(&str) -> Result<Option<Box<dyn Read + 'o>>> + 'o;

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

fn unsafe_archive(message: String) -> SandboxError {
    SandboxError::UnsafeArchive(message)
}

fn io_at<'p>(what: &'p str, path: &'p Path) -> impl FnOnce(io::Error) -> SandboxError + 'p {
    move |e| SandboxError::io(format!("{what} {}", path.display()), e)
}
