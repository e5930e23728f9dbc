//! Packing: a host directory (or a few files) into a tar for the container, with the
//! [`Manifest`] of what went in.

use std::fs::{self, File, Metadata};
use std::io::{self, Read, Write};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use sha2::{Digest, Sha256};
use tar::{EntryType, Header};

use super::*;
use crate::sandbox::{Result, SandboxError};

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

pub(super) struct Packer<'p, W: Write> {
    pub(super) builder: tar::Builder<W>,
    pub(super) manifest: Manifest,
    pub(super) prefix: &'p str,
}

impl<W: Write> Packer<'_, W> {
    /// Appends the contents of the host directory `dir` (at `rel` in the tree), sorted by name.
    pub(super) fn walk(&mut self, dir: &Path, rel: &str) -> Result<()> {
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
            } else if kind.is_file() && crate::sandbox::gitconfig::is_config_path(&rel) {
                // Credentials in the git config never enter the sandbox (gitconfig.rs).
                // Read at most one byte past the size sanitize accepts (bigger: a minimal config).
                let mut raw = Vec::new();
                File::open(&path)
                    .and_then(|f| {
                        f.take(crate::sandbox::gitconfig::MAX_CONFIG_BYTES as u64 + 1)
                            .read_to_end(&mut raw)
                    })
                    .map_err(io_at("reading", &path))?;
                let data = crate::sandbox::gitconfig::sanitize(&raw);
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
    use crate::sandbox::archive::testutil::*;
    use tempfile::TempDir;

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
