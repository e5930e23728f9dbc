//! The limits and small helpers every layer of the archive code shares: the lowest layer,
//! it names no other.

use std::io::{self, Read};
use std::path::Path;

use crate::error::{Result, SandboxError};

/// Longest entry name or symlink target accepted (Linux's PATH_MAX).
pub(super) const MAX_NAME_BYTES: usize = 4096;
/// Most symlinks followed while checking where one symlink leads (Linux's limit).
pub(super) const MAX_SYMLINK_HOPS: usize = 40;
/// Changed contents up to this size are kept in memory (while [`MEMORY_BUDGET`] allows);
/// larger ones are spooled to a temporary file.
pub(super) const INLINE_MAX: u64 = 256 << 10;
/// Most bytes of changed contents one change set keeps in memory.
pub(super) const MEMORY_BUDGET: u64 = 16 << 20;
/// Largest `.gitignore` whose rules are read, and the most bytes of rules read in all.
/// Past them the rules are not read: more is kept, never less.
pub(super) const MAX_IGNORE_FILE: u64 = 1 << 20;
pub(super) const MAX_IGNORE_TOTAL: u64 = 16 << 20;
/// Most files read again one at a time at the end of a change set; past that the whole
/// workspace is read a second time.
pub(super) const MAX_REFETCH: usize = 256;
/// Copy buffer for file data.
pub(super) const COPY_BUF: usize = 64 << 10;
/// What a stream may carry beyond the files a sandbox wrote: the tar's headers and padding
/// (about 1 KiB a file), for millions of files.
pub const STREAM_HEADROOM: u64 = 6 << 30;

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

/// Opens a tar stream of the tree (`""`) or of one path in it (relative to the tree's
/// root), the way Docker's archive endpoint gives them: the tree's entries under
/// `root/`, a single path as its bare file name. `Ok(None)` when the path does not exist.
pub type Open<'o> = dyn FnMut(&str) -> Result<Option<Box<dyn Read + 'o>>> + 'o;

pub(super) fn gone(root: &str) -> SandboxError {
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

pub(super) fn unsafe_archive(message: String) -> SandboxError {
    SandboxError::UnsafeArchive(message)
}

pub(super) fn io_at<'p>(
    what: &'p str,
    path: &'p Path,
) -> impl FnOnce(io::Error) -> SandboxError + 'p {
    move |e| SandboxError::io(format!("{what} {}", path.display()), e)
}
