//! A tar flood: what a container that replaced kodx's helper (`/.kodx-bin/kodx-net`, now on a read-only volume; root's to
//! write) can send as the workspace's snapshot. One extension entry whose header claims
//! 1.25 GiB (a PAX header, or a GNU long name), then that many bytes: the `tar` crate
//! reads such an entry's data whole into memory unless something stops it first.
//!
//! The same bytes three ways: [`Flood::reader`] (made as they are read, for the reading
//! code on its own), [`Flood::program`] (a program that writes them, for a sandbox) and
//! [`Flood::replace_helper`] (a command that puts that program where the helper was).

use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// What the flood's header claims, and the bytes that follow it: 1.25 GiB.
pub const FLOOD_BYTES: u64 = 1_342_177_280;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flood {
    /// A PAX extended header (`x`) as GNU tar and Go name theirs, under ustar's magic.
    Pax,
    /// A GNU long name (`L`) as GNU tar writes it, under GNU's magic.
    LongName,
}

impl Flood {
    /// The 512-byte header, its name written as is (the crate's `set_path` would drop the
    /// leading `./`).
    pub fn header(self) -> [u8; 512] {
        let (mut h, name, kind) = match self {
            Flood::Pax => (
                tar::Header::new_ustar(),
                &b"././@PaxHeader"[..],
                tar::EntryType::XHeader,
            ),
            Flood::LongName => (
                tar::Header::new_gnu(),
                &b"././@LongLink"[..],
                tar::EntryType::GNULongName,
            ),
        };
        h.as_old_mut().name[..name.len()].copy_from_slice(name);
        h.set_mode(0o644);
        h.set_size(FLOOD_BYTES);
        h.set_entry_type(kind);
        h.set_cksum();
        *h.as_bytes()
    }

    /// The flood, made as it is read (never held), and the count of bytes read from it.
    pub fn reader(self) -> (FloodReader, Arc<AtomicU64>) {
        let read = Arc::new(AtomicU64::new(0));
        let reader = FloodReader {
            header: self.header(),
            at: 0,
            read: read.clone(),
        };
        (reader, read)
    }

    /// A program (Python 3, in the test image) that writes the flood to its stdout when run
    /// as the helper's `snapshot` (or `snapshot-on-line`, once its line came), and runs the
    /// real helper, kept at `/tmp/.kodx-net.real`, for everything else.
    pub fn program(self) -> String {
        format!(
            r#"#!/usr/bin/python3
import os, sys
if len(sys.argv) < 2 or not sys.argv[1].startswith("snapshot"):
    os.execv("/tmp/.kodx-net.real", ["{helper}"] + sys.argv[1:])
if sys.argv[1] == "snapshot-on-line":
    sys.stdin.readline()
out = sys.stdout.buffer
try:
    out.write(bytes.fromhex("{header}"))
    chunk = b"a" * (1 << 20)
    for _ in range({chunks}):
        out.write(chunk)
    out.flush()
except OSError:
    pass
"#,
            header = hex::encode(self.header()),
            helper = kodx::sandbox::net::SANDBOX_HELPER_PATH,
            chunks = FLOOD_BYTES >> 20,
        )
    }

    /// A shell command, for a setup script or a shell in the sandbox, that keeps the real
    /// helper at `/tmp/.kodx-net.real` (once) and puts [`Flood::program`] where kodx runs
    /// its helper from (by rename beside it: the helper's file is busy as the container's
    /// first process). The helper is on a read-only volume, so this fails and says `the
    /// helper stays`; the command still succeeds.
    pub fn replace_helper(self) -> String {
        let helper = kodx::sandbox::net::SANDBOX_HELPER_PATH;
        format!(
            "(([ -e /tmp/.kodx-net.real ] || cp -p {helper} /tmp/.kodx-net.real) \
             && echo {} | base64 -d > {helper}.new \
             && chmod 755 {helper}.new \
             && mv -f {helper}.new {helper}) 2>/dev/null || echo 'the helper stays'",
            base64_of(self.program().as_bytes())
        )
    }
}

fn base64_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

/// [`Flood::reader`]'s reader: the header, then [`FLOOD_BYTES`] of `a`.
pub struct FloodReader {
    header: [u8; 512],
    at: u64,
    read: Arc<AtomicU64>,
}

impl Read for FloodReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let mut n = 0;
        if let Some(header) = self.header.get(self.at as usize..) {
            n = header.len().min(buf.len());
            buf[..n].copy_from_slice(&header[..n]);
        }
        let left = 512 + FLOOD_BYTES - (self.at + n as u64);
        let filler = (buf.len() - n).min(left.try_into().unwrap_or(usize::MAX));
        buf[n..n + filler].fill(b'a');
        n += filler;
        self.at += n as u64;
        self.read.fetch_add(n as u64, Ordering::Relaxed);
        Ok(n)
    }
}
