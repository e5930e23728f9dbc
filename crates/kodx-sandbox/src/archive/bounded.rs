//! The bound in front of the `tar` crate: every tar out of a container is read through
//! [`Bounded`] before the crate sees a byte of it.
//!
//! The crate reads the data of an extension entry (a PAX header `x`, a GNU long name `L`
//! or long link name `K`) whole into memory before it hands on the entry that follows,
//! and keeps a list item for every block of a GNU sparse file's map, however large the
//! header says they are. A container can write such a tar itself (it can replace the
//! helper that writes the snapshot: `/.kodx-net` is root's to write), so a 1.25 GiB PAX
//! header would be 1.25 GiB of kodx's memory. [`Bounded`] follows the stream block by block as the crate
//! will read it, and refuses before the crate reads the data:
//! - an extension entry (`x`, `g`, `L` or `K`, whatever its magic) of more than
//!   [`MAX_EXTENSION_BYTES`];
//! - a sparse file's map of more than [`MAX_SPARSE_BLOCKS`] blocks;
//! - more bytes in all than the stream's cap (see [`ArchiveLimits::max_stream_bytes`]).
//!
//! It holds one 512-byte header and, while a PAX header passes, that header's data (its
//! `size` record moves where the next entry ends): flat memory, whatever the stream. The
//! header fields are decoded with the crate's own [`Header`], so this bound and the reader
//! after it cannot disagree on where an entry ends and the next header starts.

use std::fmt;
use std::io::{self, Read};

use tar::{EntryType, GnuExtSparseHeader, Header};

use sha2::{Digest, Sha256};

use super::limits::{human, unsafe_archive, ArchiveLimits, COPY_BUF, STREAM_HEADROOM};
use super::manifest::Manifest;
use crate::error::SandboxError;

/// Most data of one extension entry. What kodx accepts fits many times over: a PAX header
/// with a path and a link target of [`super::limits::MAX_NAME_BYTES`] each (the helper writes
/// nothing else), Docker's few records (times, owner names, `security.capability`), a GNU
/// long name. Anything larger is no tree kodx would take.
pub(super) const MAX_EXTENSION_BYTES: u64 = 64 << 10;
/// Most extension blocks of one GNU sparse file's map (as many bytes as an extension
/// entry): neither the engine nor the helper writes sparse entries at all.
pub(super) const MAX_SPARSE_BLOCKS: u32 = (MAX_EXTENSION_BYTES / BLOCK as u64) as u32;
const BLOCK: usize = 512;

/// A `tar::Archive` over a tar from a container, read through [`Bounded`] with `max_bytes`
/// as the cap. Its errors become messages with [`tar_error`].
pub fn untrusted_archive<R: Read>(tar: R, max_bytes: u64) -> tar::Archive<Bounded<R>> {
    tar::Archive::new(Bounded::new(tar, max_bytes))
}

/// The cap of a stream of the whole tree: `max_stream_bytes` beyond the baseline's files
/// (they were there before the run; a stream of one file has `max_stream_bytes`).
pub(super) fn tree_cap(limits: &ArchiveLimits, baseline: Option<&Manifest>) -> u64 {
    let copied_in = baseline.map_or(0, Manifest::file_bytes);
    limits.max_stream_bytes.saturating_add(copied_in)
}

/// The error for an `io::Error` met while the crate read a tar through [`Bounded`]: what
/// the bound refused, in its own words; anything else as a malformed tar.
pub(super) fn tar_error(e: io::Error) -> SandboxError {
    match refusal(&e) {
        Some(why) => unsafe_archive(why.to_string()),
        None => unsafe_archive(format!("malformed tar: {e}")),
    }
}

/// What [`Bounded`] refused, when `e` is its refusal.
pub(super) fn refusal(e: &io::Error) -> Option<&str> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<Refused>())
        .map(|r| r.0.as_str())
}

#[derive(Debug)]
struct Refused(String);

impl fmt::Display for Refused {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Refused {}

/// A reader that hands a tar on unchanged, refusing it (an `io::Error` that [`tar_error`]
/// turns into [`SandboxError::UnsafeArchive`]) before the `tar` crate reads an oversized
/// extension entry, and past its cap. Once refused, every later read fails the same way.
pub struct Bounded<R> {
    src: Capped<R>,
    at: At,
    /// The header block being handed on: `block[served..filled]` is still to go.
    block: [u8; BLOCK],
    filled: usize,
    served: usize,
    /// The `size` record of the PAX header before the entry it describes.
    pax_size: Option<u64>,
    /// A PAX header's data, gathered as it passes (at most [`MAX_EXTENSION_BYTES`]).
    pax: Option<Vec<u8>>,
    refused: Option<String>,
}

/// The stream, and the bytes taken from it against the cap.
struct Capped<R> {
    inner: R,
    taken: u64,
    cap: u64,
}

impl<R: Read> Capped<R> {
    /// Reads into `buf`, within the cap.
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let room = self.cap - self.taken;
        if room == 0 {
            // One more byte tells a stream that ends at the cap from one that goes on.
            let mut probe = [0u8];
            return match self.inner.read(&mut probe)? {
                0 => Ok(0),
                _ => Err(refused(format!(
                    "the archive goes on past {} bytes ({}), the most read from a container \
                     (limit max_stream_bytes, beyond the files copied in)",
                    self.cap,
                    human(self.cap)
                ))),
            };
        }
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        self.taken += n as u64;
        Ok(n)
    }
}

fn refused(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, Refused(why))
}

/// Where the stream is.
#[derive(Debug, Clone, Copy, PartialEq)]
enum At {
    /// The next block is an entry's header.
    Header,
    /// The next block continues a sparse file's map: `blocks` read so far, then `data`
    /// bytes of the entry.
    SparseMap { blocks: u32, data: u64 },
    /// `left` bytes of an entry's data and padding, the first `pax` of them a PAX header's.
    Data { left: u64, pax: u64 },
    /// Past the end of the archive (or inside a last block cut short): bytes pass as
    /// they are, counted against the cap.
    After,
    /// After a header the crate refuses (a bad checksum or size): the crate reads no
    /// further, and nothing more is handed on.
    Broken,
}

impl<R: Read> Bounded<R> {
    /// `cap`: the most bytes taken from `inner`; one more is refused.
    pub fn new(inner: R, cap: u64) -> Self {
        Bounded {
            src: Capped {
                inner,
                taken: 0,
                cap,
            },
            at: At::Header,
            block: [0; BLOCK],
            filled: 0,
            served: 0,
            pax_size: None,
            pax: None,
            refused: None,
        }
    }

    /// Bytes taken from the stream so far.
    pub fn taken(&self) -> u64 {
        self.src.taken
    }

    /// Reads the next block whole into `block`; `false` at the stream's end before it.
    /// A block cut short is handed on as it is (the crate says the archive ends early).
    fn gather(&mut self) -> io::Result<bool> {
        self.filled = 0;
        self.served = 0;
        while self.filled < BLOCK {
            let n = match self.src.read(&mut self.block[self.filled..]) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            if n == 0 {
                if self.filled > 0 {
                    self.at = At::After;
                }
                return Ok(self.filled > 0);
            }
            self.filled += n;
        }
        Ok(true)
    }

    /// The whole block just gathered, at [`At::Header`] or [`At::SparseMap`].
    fn block_read(&mut self) -> io::Result<()> {
        match self.at {
            At::SparseMap { blocks, data } => {
                let blocks = blocks + 1;
                if blocks > MAX_SPARSE_BLOCKS {
                    return Err(refused(format!(
                        "a sparse file's map of more than {MAX_SPARSE_BLOCKS} blocks"
                    )));
                }
                let mut ext = GnuExtSparseHeader::new();
                ext.as_mut_bytes().copy_from_slice(&self.block);
                self.at = match ext.is_extended() {
                    true => At::SparseMap { blocks, data },
                    false => At::Data { left: data, pax: 0 },
                };
                Ok(())
            }
            _ => self.header(),
        }
    }

    /// A header, checked as the crate will read it: what follows it, and whether its data
    /// may be read at all.
    fn header(&mut self) -> io::Result<()> {
        if self.block.iter().all(|b| *b == 0) {
            self.at = At::After; // the end of the archive: the crate reads no further
            return Ok(());
        }
        let h = Header::from_byte_slice(&self.block);
        let sum = self.block[..148]
            .iter()
            .chain(&self.block[156..])
            .map(|b| u32::from(*b))
            .sum::<u32>()
            + 8 * 32;
        let Some(size) = h
            .cksum()
            .ok()
            .filter(|c| *c == sum)
            .and(h.entry_size().ok())
        else {
            self.at = At::Broken;
            return Ok(());
        };
        let kind = h.entry_type();
        let extension = extension_name(kind);
        // A PAX `size` record sets the size of the next entry that is not an extension.
        let size = match (extension, self.pax_size) {
            (None, Some(pax)) => pax,
            _ => size,
        };
        if let Some(what) = extension {
            if size > MAX_EXTENSION_BYTES {
                let name = String::from_utf8_lossy(&h.path_bytes()).into_owned();
                return Err(refused(format!(
                    "{name:?}: a {what} of {size} bytes ({}), over the {} such an entry may \
                     have (it would be held in memory whole)",
                    human(size),
                    human(MAX_EXTENSION_BYTES)
                )));
            }
        }
        let Some(padded) = size
            .checked_add(BLOCK as u64 - 1)
            .map(|s| s & !(BLOCK as u64 - 1))
        else {
            self.at = At::Broken;
            return Ok(());
        };
        // The crate gathers recognized `L`, `K` and `x` entries for the entry after them;
        // every other entry ends the group (a `g` too: it is handed on as an entry).
        let recognized = h.as_gnu().is_some() || h.as_ustar().is_some();
        let described = recognized
            && (kind.is_gnu_longname() || kind.is_gnu_longlink() || kind.is_pax_local_extensions());
        let mut pax = 0;
        if !described {
            self.pax_size = None;
        } else if kind.is_pax_local_extensions() {
            pax = size;
            self.pax = Some(Vec::with_capacity(size as usize));
        }
        self.at = match h.as_gnu() {
            Some(gnu) if !described && kind.is_gnu_sparse() && gnu.is_extended() => At::SparseMap {
                blocks: 0,
                data: padded,
            },
            None if kind.is_gnu_sparse() => At::Broken, // the crate wants a GNU header
            _ => At::Data { left: padded, pax },
        };
        Ok(())
    }

    /// Data or padding handed on, the first of it into a PAX header's.
    fn passed(&mut self, data: &[u8]) {
        let At::Data { left, pax } = self.at else {
            return;
        };
        let n = data.len() as u64;
        let into_pax = pax.min(n);
        if let Some(gathered) = self.pax.as_mut() {
            gathered.extend_from_slice(&data[..into_pax as usize]);
        }
        self.at = At::Data {
            left: left - n,
            pax: pax - into_pax,
        };
    }

    /// An entry's data and padding all handed on: a header next.
    fn data_done(&mut self) {
        if let Some(gathered) = self.pax.take() {
            self.pax_size = pax_size(&gathered);
        }
        self.at = At::Header;
    }
}

/// What an extension entry is called, `None` for other entries.
fn extension_name(kind: EntryType) -> Option<&'static str> {
    if kind.is_pax_local_extensions() {
        Some("PAX extended header")
    } else if kind.is_pax_global_extensions() {
        Some("PAX global header")
    } else if kind.is_gnu_longname() {
        Some("GNU long name")
    } else if kind.is_gnu_longlink() {
        Some("GNU long link name")
    } else {
        None
    }
}

/// The `size` record of a PAX header's data, read as the crate reads it: the first
/// `size` key; nothing when a record before it, or its value, is malformed.
fn pax_size(data: &[u8]) -> Option<u64> {
    for record in tar::PaxExtensions::new(data) {
        let record = record.ok()?;
        if record.key() == Ok("size") {
            return record.value().ok()?.parse().ok();
        }
    }
    None
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(why) = &self.refused {
            return Err(refused(why.clone()));
        }
        let result = self.read_on(buf);
        if let Some(why) = result.as_ref().err().and_then(refusal) {
            self.refused = Some(why.to_string());
        }
        result
    }
}

impl<R: Read> Bounded<R> {
    fn read_on(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        loop {
            if self.served < self.filled {
                let n = (self.filled - self.served).min(buf.len());
                buf[..n].copy_from_slice(&self.block[self.served..self.served + n]);
                self.served += n;
                return Ok(n);
            }
            match self.at {
                At::Header | At::SparseMap { .. } => {
                    if !self.gather()? {
                        return Ok(0);
                    }
                    if self.filled == BLOCK {
                        self.block_read()?;
                    }
                }
                At::Data { left: 0, .. } => self.data_done(),
                At::Data { left, .. } => {
                    let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
                    let n = self.src.read(&mut buf[..want])?;
                    self.passed(&buf[..n]);
                    return Ok(n);
                }
                At::After => return self.src.read(buf),
                At::Broken => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "the archive goes on after a header that is not valid",
                    ))
                }
            }
        }
    }
}

impl ArchiveLimits {
    /// The limits for a sandbox that may write `max_disk_bytes` to its disk (`None`: no
    /// limit): [`ArchiveLimits::max_stream_bytes`] raised, when that is more, to the disk
    /// limit and [`STREAM_HEADROOM`] for the tar's own headers, so that a stream holding
    /// everything the sandbox may write is read.
    pub fn for_disk(mut self, max_disk_bytes: Option<u64>) -> Self {
        if let Some(disk) = max_disk_bytes {
            let stream = disk.saturating_add(STREAM_HEADROOM);
            self.max_stream_bytes = self.max_stream_bytes.max(stream);
        }
        self
    }
}

/// Exactly `size` bytes of `data` into memory (`size` is small: callers check).
pub(super) fn read_exact_vec(data: &mut dyn Read, size: u64) -> io::Result<Vec<u8>> {
    let mut out = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
    let n = data.take(size).read_to_end(&mut out)?;
    if (n as u64) < size {
        return Err(ends_inside());
    }
    Ok(out)
}

pub(super) fn ends_inside() -> io::Error {
    io::Error::new(
        io::ErrorKind::UnexpectedEof,
        "the archive ends inside this file",
    )
}

/// The SHA-256 of exactly `size` bytes of `data`, read through a small buffer.
pub(super) fn hash_exact(data: &mut dyn Read, size: u64) -> io::Result<[u8; 32]> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::archive::testutil::*;
    use crate::archive::{change_set, extract, Manifest};
    use crate::SandboxError;

    /// A header of `kind` named `name` that declares `size` bytes of data.
    fn header(name: &str, kind: EntryType, size: u64) -> Header {
        let mut h = Header::new_ustar();
        h.set_path(name).unwrap();
        h.set_entry_type(kind);
        h.set_mode(0o644);
        h.set_size(size);
        h.set_cksum();
        h
    }

    /// A header followed by an endless flood: what a replaced helper writes.
    fn flood(h: &Header) -> impl Read + '_ {
        h.as_bytes().as_slice().chain(io::repeat(b'a'))
    }

    /// Reads `tar` to its end through the crate: the error's message, as a change set gives
    /// it, and the bytes taken.
    fn refused(tar: impl Read) -> (String, u64) {
        let mut archive = untrusted_archive(tar, u64::MAX);
        let result = (|| -> io::Result<()> {
            for entry in archive.entries()? {
                io::copy(&mut entry?, &mut io::sink())?;
            }
            Ok(())
        })();
        let taken = archive.into_inner().taken();
        match result.map_err(tar_error) {
            Err(SandboxError::UnsafeArchive(m)) => (m, taken),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn oversized_extension_entries_are_refused_on_their_header() {
        for (kind, what) in [
            (EntryType::XHeader, "PAX extended header"),
            (EntryType::XGlobalHeader, "PAX global header"),
            (EntryType::GNULongName, "GNU long name"),
            (EntryType::GNULongLink, "GNU long link name"),
        ] {
            let h = header("@LongLink", kind, 1_342_177_280);
            let (message, taken) = refused(flood(&h));
            assert_eq!(
                message,
                format!(
                    "\"@LongLink\": a {what} of 1342177280 bytes (1.2 GiB), over the 64.0 KiB \
                     such an entry may have (it would be held in memory whole)"
                )
            );
            assert_eq!(taken, 512, "{what}: nothing after the header was read");
        }
        // The same under a GNU header, and at the bound itself: refused one byte over.
        let mut h = Header::new_gnu();
        h.set_path("L").unwrap();
        h.set_entry_type(EntryType::GNULongName);
        h.set_size(MAX_EXTENSION_BYTES + 1);
        h.set_cksum();
        assert!(refused(flood(&h))
            .0
            .contains("GNU long name of 65537 bytes"));
    }

    #[test]
    fn base_256_sizes_are_read() {
        // GNU's base-256 size field (high bit set), as written for 8 GiB and more.
        let h = header("x", EntryType::XHeader, 8 << 30);
        assert_eq!(h.as_old().size[0], 0x80, "base-256");
        assert!(refused(flood(&h))
            .0
            .contains("of 8589934592 bytes (8.0 GiB)"));

        // A regular file of a base-256 size passes, and the next header is found after it.
        let mut h = header("f", EntryType::Regular, 0);
        h.as_old_mut().size = [0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 3];
        h.set_cksum();
        assert_eq!(h.entry_size().unwrap(), 3);
        let mut tar = h.as_bytes().to_vec();
        tar.extend_from_slice(&[b'z'; 512]); // "zzz" and its padding
        tar.extend_from_slice(header("x", EntryType::XHeader, 1 << 20).as_bytes());
        let (message, taken) = refused(&tar[..]);
        assert!(
            message.contains("PAX extended header of 1048576 bytes"),
            "{message}"
        );
        assert_eq!(taken, 1536);
    }

    #[test]
    fn a_stream_past_its_cap_is_refused() {
        let mut b = tar::Builder::new(Vec::new());
        b.append(&header("a", EntryType::Regular, 2000), &[b'a'; 2000][..])
            .unwrap();
        let tar = b.into_inner().unwrap(); // 512 + 2048 + 1024 bytes
        assert_eq!(tar.len(), 3584);
        // At the cap exactly: read whole.
        let mut whole = Vec::new();
        Bounded::new(&tar[..], 3584)
            .read_to_end(&mut whole)
            .unwrap();
        assert_eq!(whole, tar);
        // One byte short: refused, and refused again on every later read.
        let mut bounded = Bounded::new(&tar[..], 3583);
        let e = bounded.read_to_end(&mut Vec::new()).unwrap_err();
        assert_eq!(
            refusal(&e),
            Some(
                "the archive goes on past 3583 bytes (3.5 KiB), the most read from a container \
                 (limit max_stream_bytes, beyond the files copied in)"
            )
        );
        assert!(refusal(&bounded.read(&mut [0; 10]).unwrap_err()).is_some());
        assert_eq!(bounded.taken(), 3583);
        // Inside a file's data too: the crate's reader says so.
        let e = refused(Bounded::new(&tar[..], 1000));
        assert!(
            e.0.starts_with("the archive goes on past 1000 bytes"),
            "{e:?}"
        );
    }

    /// An entry as the crate gave it: kind, path, link target, data.
    type Seen = (u8, Vec<u8>, Option<Vec<u8>>, Vec<u8>);

    /// Every entry of `tar`, read through the crate.
    fn entries(tar: impl Read) -> Vec<Seen> {
        let mut archive = tar::Archive::new(tar);
        let mut out = Vec::new();
        for entry in archive.entries().unwrap() {
            let mut entry = entry.unwrap();
            let mut data = Vec::new();
            entry.read_to_end(&mut data).unwrap();
            out.push((
                entry.header().entry_type().as_byte(),
                entry.path_bytes().into_owned(),
                entry.link_name_bytes().map(|l| l.into_owned()),
                data,
            ));
        }
        out
    }

    /// A tar of every kind the readers meet: PAX headers (one with a `size` record moving
    /// the next entry's end), GNU long names and link names, a global header, the
    /// helper's header-only `U` entries, a hard link, and data not a multiple of 512.
    fn every_kind() -> Vec<u8> {
        let mut b = tar::Builder::new(Vec::new());
        let long = format!("repo/{}/f.txt", "p".repeat(150));
        b.append(&header("repo/", EntryType::Directory, 0), io::empty())
            .unwrap();
        append_pax(&mut b, &[("path", &long), ("mtime", "1.5")]);
        b.append(&header("repo/short", EntryType::Regular, 5), &b"hello"[..])
            .unwrap();
        let mut g = header("pax_global_header", EntryType::XGlobalHeader, 0);
        let body = b"20 comment=anything\n";
        g.set_size(body.len() as u64);
        g.set_cksum();
        b.append(&g, &body[..]).unwrap();
        let mut gnu = Header::new_gnu();
        gnu.set_mode(0o644);
        gnu.set_size(700);
        b.append_data(
            &mut gnu,
            format!("repo/{}", "q".repeat(200)),
            &[7u8; 700][..],
        )
        .unwrap();
        let mut link = Header::new_gnu();
        link.set_entry_type(EntryType::Symlink);
        link.set_size(0);
        b.append_link(&mut link, "repo/l", "r".repeat(300)).unwrap();
        b.append(&header("repo/copied", EntryType::new(b'U'), 0), io::empty())
            .unwrap();
        let mut tar = b.into_inner().unwrap();
        tar.truncate(tar.len() - 1024); // the end, written again below
                                        // A PAX `size` of 1000 for a header that says 0: the crate reads 1000 bytes.
        let record = b"13 size=1000\n";
        let mut x = header("PaxHeaders/big", EntryType::XHeader, record.len() as u64);
        x.set_cksum();
        tar.extend_from_slice(x.as_bytes());
        tar.extend_from_slice(record);
        tar.resize(tar.len().next_multiple_of(512), 0);
        tar.extend_from_slice(header("repo/sized", EntryType::Regular, 0).as_bytes());
        tar.extend_from_slice(&[b's'; 1000]);
        tar.resize(tar.len().next_multiple_of(512), 0);
        tar.extend_from_slice(header("repo/last", EntryType::Regular, 4).as_bytes());
        tar.extend_from_slice(b"last");
        tar.resize(tar.len().next_multiple_of(512) + 1024, 0);
        tar
    }

    /// Hands on `data` a few bytes at a time, the sizes cycling through `sizes`.
    struct Pieces<'d> {
        data: &'d [u8],
        sizes: &'d [usize],
        turn: usize,
    }

    impl Read for Pieces<'_> {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = self.sizes[self.turn % self.sizes.len()]
                .min(buf.len())
                .min(self.data.len());
            self.turn += 1;
            buf[..n].copy_from_slice(&self.data[..n]);
            self.data = &self.data[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_valid_archive_passes_unchanged_whatever_the_read_sizes() {
        let tar = every_kind();
        let want = entries(&tar[..]);
        assert_eq!(want.len(), 8, "{want:?}");
        assert_eq!(want[1].1.len(), 161, "the PAX path was applied");
        assert_eq!(want[3].1.len(), 205, "the GNU long name was applied");
        assert_eq!(
            want[4].2.as_ref().map(Vec::len),
            Some(300),
            "and the long link"
        );
        assert_eq!(want[6].3, vec![b's'; 1000], "the PAX size was applied");
        for sizes in [
            &[1][..],
            &[7, 511, 3],
            &[512],
            &[513, 1],
            &[100_000],
            &[5, 1024, 2],
        ] {
            let pieces = Pieces {
                data: &tar,
                sizes,
                turn: 0,
            };
            let through = Bounded::new(pieces, tar.len() as u64);
            assert_eq!(entries(through), want, "read sizes {sizes:?}");
            // The bytes themselves, read in the same odd pieces.
            let mut bytes = Vec::new();
            let pieces = Pieces {
                data: &tar,
                sizes,
                turn: 0,
            };
            Bounded::new(pieces, u64::MAX)
                .read_to_end(&mut bytes)
                .unwrap();
            assert_eq!(bytes, tar, "read sizes {sizes:?}");
        }
    }

    #[test]
    fn an_oversized_header_split_across_reads_is_refused_before_its_data() {
        let h = header("@PaxHeader", EntryType::XHeader, 1 << 30);
        let mut tar = every_kind();
        tar.truncate(tar.len() - 1024);
        tar.extend_from_slice(h.as_bytes());
        tar.extend_from_slice(&[b'a'; 4096]);
        for sizes in [&[1][..], &[7, 300], &[511]] {
            let pieces = Pieces {
                data: &tar,
                sizes,
                turn: 0,
            };
            let (message, taken) = refused(pieces);
            assert!(
                message.contains("PAX extended header of 1073741824"),
                "{message}"
            );
            assert_eq!(taken as usize, tar.len() - 4096, "read sizes {sizes:?}");
        }
    }

    #[test]
    fn a_sparse_map_is_bounded() {
        // A GNU sparse header whose map goes on block after block.
        let mut h = Header::new_gnu();
        h.set_path("s").unwrap();
        h.set_entry_type(EntryType::GNUSparse);
        h.set_size(0);
        let gnu = h.as_gnu_mut().unwrap();
        gnu.isextended[0] = 1;
        gnu.realsize = *b"00000000000\0";
        h.set_cksum();
        let mut ext = GnuExtSparseHeader::new();
        ext.isextended[0] = 1;
        let endless = h.as_bytes().as_slice().chain(RepeatBlock(*ext.as_bytes()));
        let (message, taken) = refused(endless);
        assert_eq!(message, "a sparse file's map of more than 128 blocks");
        assert_eq!(taken, 512 * 130);
    }

    /// The same block over and over.
    struct RepeatBlock([u8; BLOCK]);

    impl Read for RepeatBlock {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(BLOCK);
            buf[..n].copy_from_slice(&self.0[..n]);
            Ok(n)
        }
    }

    #[test]
    fn the_readers_refuse_a_flood_with_the_bounds_words() {
        let h = header("@PaxHeader", EntryType::XHeader, 1_342_177_280);
        let mut tar = h.as_bytes().to_vec();
        tar.extend(std::iter::repeat_n(b'a', 1 << 20));
        let err = change_set(&tar, "repo", &Manifest::default(), &small_limits()).unwrap_err();
        assert!(
            err.to_string().starts_with(
                "unsafe archive: \"@PaxHeader\": a PAX extended header of 1342177280 bytes"
            ),
            "{err}"
        );
        let out = tempfile::tempdir().unwrap();
        let err = extract(&tar, "repo", &out.path().join("x"), &small_limits()).unwrap_err();
        assert!(err.to_string().contains("PAX extended header"), "{err}");
    }

    #[test]
    fn the_cap_covers_the_disk_a_sandbox_may_write() {
        let d = ArchiveLimits::default();
        assert_eq!(d.max_stream_bytes, 16 << 30);
        assert_eq!(d.clone().for_disk(None), d);
        assert_eq!(d.clone().for_disk(Some(1 << 30)), d);
        assert_eq!(
            d.for_disk(Some(50 << 30)).max_stream_bytes,
            (50 << 30) + STREAM_HEADROOM
        );
    }
}
