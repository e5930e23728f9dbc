//! The check runner's wire format (`native/kodx-checks.c`, `kodx-net checks`): the batch
//! kodx writes to its stdin, and the frames it writes back on its stdout. Pure: no I/O.
//!
//! A batch (integers big-endian): `u32` length of the rest, `u32` milliseconds the batch
//! may take (`within`), `u16` count, `u16` length of the directory, the directory, then per
//! command `u32` timeout in milliseconds, `u32` length, the command.
//!
//! A frame: `u8` type, `u8` 0, `u16` the check's index, `u32` length, then that many bytes.
//! `H` (once, first: the runner's pid, the protocol's version), `B` (check began: its
//! pid), `O` (its output), `E` (it ended: how, a value), `Z` (the batch is over). Only the
//! runner writes frames: nothing a check prints is parsed as one (its output is an `O`
//! frame's payload, whatever it holds).

use bytes::{Buf, Bytes, BytesMut};
use std::time::Duration;

/// The protocol's version the runner says in its hello.
pub(super) const VERSION: u32 = 1;
/// Most commands in a batch (the runner's limit).
pub(super) const MAX_COMMANDS: usize = 64;
/// Longest batch, length word aside (the runner's limit).
const MAX_BATCH: usize = 1 << 18;
/// Longest payload of a frame (an output frame is one read of the check's pipe).
const MAX_PAYLOAD: usize = 65536;
const HEADER: usize = 8;

/// How a check ended, by the runner's word.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Ending {
    /// It exited with this status.
    Exited(u32),
    /// A signal killed it.
    Signaled(u32),
    /// It ran past its timeout, and its process group (and what it left) was killed.
    TimedOut,
    /// The batch's `within` was spent before its turn.
    NotStarted,
    /// The runner could not start it (errno).
    CouldNotStart(u32),
}

/// One frame from the runner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Frame {
    Hello { pid: u32, version: u32 },
    Began { index: u16, pid: u32 },
    Output { index: u16, bytes: Bytes },
    Ended { index: u16, how: Ending },
    Over { count: u16 },
}

/// The batch that runs `commands` in `dir`, all within `within`; `None` when it is past
/// the runner's limits (too many commands, too long, a NUL in a command or the directory).
pub(super) fn batch(
    dir: &str,
    commands: &[(String, Duration)],
    within: Duration,
) -> Option<Vec<u8>> {
    let ms = |d: Duration| d.as_millis().min(u32::MAX as u128) as u32;
    let ok = |s: &str| !s.is_empty() && !s.contains('\0');
    if commands.len() > MAX_COMMANDS
        || !ok(dir)
        || dir.len() > 4096
        || !commands.iter().all(|(c, _)| ok(c))
    {
        return None;
    }
    let mut body = Vec::with_capacity(256);
    body.extend_from_slice(&ms(within).to_be_bytes());
    body.extend_from_slice(&(commands.len() as u16).to_be_bytes());
    body.extend_from_slice(&(dir.len() as u16).to_be_bytes());
    body.extend_from_slice(dir.as_bytes());
    for (command, timeout) in commands {
        body.extend_from_slice(&ms(*timeout).to_be_bytes());
        body.extend_from_slice(&(command.len() as u32).to_be_bytes());
        body.extend_from_slice(command.as_bytes());
    }
    if body.len() > MAX_BATCH {
        return None;
    }
    let mut out = (body.len() as u32).to_be_bytes().to_vec();
    out.extend_from_slice(&body);
    Some(out)
}

/// Frames out of the runner's stdout as it comes, in pieces of any size. Holds at most one
/// frame's bytes beyond what it was given last.
#[derive(Default)]
pub(super) struct Reader {
    buf: BytesMut,
}

impl Reader {
    pub(super) fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next whole frame; `Ok(None)` until more bytes come; `Err` for bytes that are
    /// no frame of the runner's (then nothing more of the stream can be trusted to parse).
    pub(super) fn next(&mut self) -> Result<Option<Frame>, String> {
        if self.buf.len() < HEADER {
            return Ok(None);
        }
        let (kind, pad) = (self.buf[0], self.buf[1]);
        let index = u16::from_be_bytes([self.buf[2], self.buf[3]]);
        let len = u32::from_be_bytes([self.buf[4], self.buf[5], self.buf[6], self.buf[7]]) as usize;
        if pad != 0 || len > MAX_PAYLOAD {
            return Err(format!("a bad frame header {:?}", &self.buf[..HEADER]));
        }
        if self.buf.len() < HEADER + len {
            return Ok(None);
        }
        self.buf.advance(HEADER);
        let mut payload = self.buf.split_to(len).freeze();
        let bad = || format!("a bad {:?} frame of {len} bytes", kind as char);
        let frame = match (kind, len) {
            (b'H', 8) => Frame::Hello {
                pid: payload.get_u32(),
                version: payload.get_u32(),
            },
            (b'B', 4) => Frame::Began {
                index,
                pid: payload.get_u32(),
            },
            (b'O', 1..) => Frame::Output {
                index,
                bytes: payload,
            },
            (b'E', 5) => {
                let how = payload.get_u8();
                let value = payload.get_u32();
                let how = match how {
                    b'x' => Ending::Exited(value),
                    b's' => Ending::Signaled(value),
                    b't' => Ending::TimedOut,
                    b'n' => Ending::NotStarted,
                    b'f' => Ending::CouldNotStart(value),
                    _ => return Err(bad()),
                };
                Frame::Ended { index, how }
            }
            (b'Z', 0) => Frame::Over { count: index },
            _ => return Err(bad()),
        };
        Ok(Some(frame))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, index: u16, payload: &[u8]) -> Vec<u8> {
        let mut f = vec![kind, 0];
        f.extend_from_slice(&index.to_be_bytes());
        f.extend_from_slice(&(payload.len() as u32).to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn a_batch_is_laid_out_as_the_runner_reads_it() {
        let b = batch(
            "/w",
            &[
                ("true".into(), Duration::from_secs(2)),
                ("echo é".into(), Duration::from_millis(1500)),
            ],
            Duration::from_secs(60),
        )
        .unwrap();
        let mut want = Vec::new();
        want.extend_from_slice(&60_000u32.to_be_bytes());
        want.extend_from_slice(&[0, 2, 0, 2]);
        want.extend_from_slice(b"/w");
        want.extend_from_slice(&2000u32.to_be_bytes());
        want.extend_from_slice(&4u32.to_be_bytes());
        want.extend_from_slice(b"true");
        want.extend_from_slice(&1500u32.to_be_bytes());
        want.extend_from_slice(&7u32.to_be_bytes());
        want.extend_from_slice("echo é".as_bytes());
        assert_eq!(&b[..4], &(want.len() as u32).to_be_bytes());
        assert_eq!(&b[4..], &want[..]);
        // Past the runner's limits: refused here, not cut there.
        let one = |c: &str| vec![(c.to_string(), Duration::from_secs(1))];
        assert!(batch("/w", &one("a\0b"), Duration::ZERO).is_none());
        assert!(batch("", &one("true"), Duration::ZERO).is_none());
        assert!(batch("/w", &one(&"x".repeat(MAX_BATCH)), Duration::ZERO).is_none());
        let many = vec![("true".to_string(), Duration::ZERO); MAX_COMMANDS + 1];
        assert!(batch("/w", &many, Duration::ZERO).is_none());
        // A timeout past u32 milliseconds is the longest the runner takes.
        let long = batch("/w", &one("true"), Duration::from_secs(u64::MAX / 2)).unwrap();
        assert_eq!(&long[4..8], &u32::MAX.to_be_bytes());
    }

    #[test]
    fn frames_are_read_in_pieces_of_any_size() {
        let mut stream = frame(b'H', 0, &[0, 0, 0, 7, 0, 0, 0, 1]);
        stream.extend(frame(b'B', 0, &[0, 0, 0, 9]));
        stream.extend(frame(b'O', 0, b"E\0\0\0\0\0\0\x05x\0\0\0\0 fake frame"));
        stream.extend(frame(b'E', 0, &[b'x', 0, 0, 0, 3]));
        stream.extend(frame(b'E', 1, &[b'n', 0, 0, 0, 0]));
        stream.extend(frame(b'E', 2, &[b's', 0, 0, 0, 9]));
        stream.extend(frame(b'E', 3, &[b't', 0, 0, 0, 0]));
        stream.extend(frame(b'E', 4, &[b'f', 0, 0, 0, 12]));
        stream.extend(frame(b'Z', 5, &[]));
        let want = vec![
            Frame::Hello { pid: 7, version: 1 },
            Frame::Began { index: 0, pid: 9 },
            Frame::Output {
                index: 0,
                bytes: Bytes::from_static(b"E\0\0\0\0\0\0\x05x\0\0\0\0 fake frame"),
            },
            Frame::Ended {
                index: 0,
                how: Ending::Exited(3),
            },
            Frame::Ended {
                index: 1,
                how: Ending::NotStarted,
            },
            Frame::Ended {
                index: 2,
                how: Ending::Signaled(9),
            },
            Frame::Ended {
                index: 3,
                how: Ending::TimedOut,
            },
            Frame::Ended {
                index: 4,
                how: Ending::CouldNotStart(12),
            },
            Frame::Over { count: 5 },
        ];
        for piece in [1, 3, 8, 13, stream.len()] {
            let mut r = Reader::default();
            let mut got = Vec::new();
            for chunk in stream.chunks(piece) {
                r.push(chunk);
                while let Some(f) = r.next().unwrap() {
                    got.push(f);
                }
            }
            assert_eq!(got, want, "pieces of {piece}");
            assert!(r.buf.is_empty());
        }
    }

    #[test]
    fn bytes_that_are_no_frame_are_refused() {
        for bad in [
            frame(b'Q', 0, &[]),
            frame(b'E', 0, &[b'?', 0, 0, 0, 0]),
            frame(b'E', 0, &[b'x', 0, 0, 0]),
            frame(b'O', 0, &[]),
            frame(b'B', 0, &[1, 2]),
            vec![b'O', 1, 0, 0, 0, 0, 0, 1, b'x'],
            // Longer than the runner ever writes: refused before it is buffered.
            vec![b'O', 0, 0, 0, 0, 1, 0, 1],
        ] {
            let mut r = Reader::default();
            r.push(&bad);
            assert!(r.next().is_err(), "{bad:?}");
        }
    }
}
