//! The baseline: what was copied into the container, and its bytes as stored beside it.

use std::collections::BTreeMap;

use super::names::check_rel;

/// The first line of a manifest written by [`Manifest::to_bytes`].
pub(super) const MANIFEST_MAGIC: &[u8] = b"kodx-manifest 1\n";

/// The baseline: what was copied into the container. Paths are relative to the tree root,
/// '/'-separated, without a leading "./".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Manifest {
    pub(super) entries: BTreeMap<String, ManifestEntry>,
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
    pub(super) fn file(&self, path: &str) -> Option<(u32, u64, [u8; 32])> {
        match self.entries.get(path) {
            Some(ManifestEntry::File { mode, size, sha256 }) => Some((*mode, *size, *sha256)),
            _ => None,
        }
    }
}
