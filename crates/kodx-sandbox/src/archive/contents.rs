//! The contents of a changed file, as a change set keeps them: small ones in memory, larger
//! ones spooled to an unnamed temporary file.

use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::Arc;

use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::bounded::{ends_inside, read_exact_vec};
use super::limits::{COPY_BUF, INLINE_MAX, MEMORY_BUDGET};
use super::pack::sha256_of;

/// The contents of an added or modified file: in memory when small, else in an unnamed
/// temporary file that the system removes when the last clone is dropped or kodx dies. Two are equal when their length and
/// SHA-256 are.
#[derive(Clone)]
pub struct Contents {
    pub(super) len: u64,
    pub(super) sha256: [u8; 32],
    pub(super) stored: Stored,
}

#[derive(Clone)]
pub(super) enum Stored {
    Memory(Bytes),
    /// An unnamed temporary file (unlinked at once, so nothing is left behind even when
    /// kodx is killed), read by position so clones can read it side by side.
    Spooled(Arc<File>),
}

/// Reads `len` bytes of a spooled file from its start, by position.
struct SpoolReader<'a> {
    file: &'a File,
    pos: u64,
    len: u64,
}

impl Read for SpoolReader<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use std::os::unix::fs::FileExt;
        let left = self.len - self.pos;
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.pos)?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the spooled file is shorter than recorded",
            ));
        }
        self.pos += n as u64;
        Ok(n)
    }
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
            Stored::Spooled(file) => Box::new(SpoolReader {
                file,
                pos: 0,
                len: self.len,
            }),
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

/// Exactly `size` bytes of `data` as [`Contents`]: in memory when small and `memory` (the
/// bytes kept in memory so far) allows, else spooled to a temporary file.
pub(super) fn read_contents(
    data: &mut dyn Read,
    size: u64,
    memory: &mut u64,
) -> io::Result<Contents> {
    if size <= INLINE_MAX && *memory + size <= MEMORY_BUDGET {
        let bytes = read_exact_vec(data, size)?;
        *memory += size;
        return Ok(Contents::from(bytes));
    }
    let mut file = tempfile::tempfile()?;
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
        stored: Stored::Spooled(Arc::new(file)),
    })
}
