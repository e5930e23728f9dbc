//! The objects of one commit as a git pack with its index (`.pack` and `.idx`, version 2),
//! for a `.git` that holds only the tip: the container of an issue or `ask` run gets a
//! shallow repository of the commit it works on, not the whole history ([`pack_tip_to`]).
//!
//! The objects are added while the tree is packed (each blob is read once, for the work
//! tree and for the pack), each compressed on its own (no deltas: fast, and the tree is
//! what is big, not its history) into an unnamed temporary file. The pack's length, and
//! so its tar header, is known only at the end: then the file is hashed (the pack's
//! trailer and name), streamed into the tar, and the index is made from what was
//! recorded per object (its id, CRC-32 and offset: 32 bytes each, as many as the tree has
//! entries, which the archive limits bound).
//!
//! [`pack_tip_to`]: super::pack_tip_to

use std::collections::HashSet;
use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};

use flate2::{Compress, Compression, FlushCompress, Status};
use sha1::{Digest, Sha1};

/// `PACK`, version, object count.
const HEADER_BYTES: u64 = 12;
const TRAILER_BYTES: u64 = 20;

/// The spool: the packed objects, counted and checksummed (CRC-32, per object) on the way.
struct Spool {
    out: BufWriter<File>,
    len: u64,
    crc: crc32fast::Hasher,
}

impl Write for Spool {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = self.out.write(data)?;
        self.crc.update(&data[..n]);
        self.len += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.out.flush()
    }
}

/// A pack being made. Objects are added once each, whatever order they come in.
pub(super) struct TipPack {
    spool: Spool,
    zlib: Compress,
    /// The compressor's output, on its way to the spool.
    buf: Vec<u8>,
    seen: HashSet<git2::Oid>,
    /// Per object: its id, the CRC-32 of its packed bytes, its offset in the pack.
    entries: Vec<(git2::Oid, u32, u64)>,
}

/// A finished pack: its name (the hex SHA-1 of its contents, as git names packs), the
/// pack's bytes as a reader of known length, and its index.
pub(super) struct FinishedPack {
    pub name: String,
    pub pack_len: u64,
    pub pack: Box<dyn Read>,
    pub idx: Vec<u8>,
}

impl TipPack {
    pub fn new() -> io::Result<TipPack> {
        Ok(TipPack {
            spool: Spool {
                out: BufWriter::with_capacity(64 << 10, tempfile::tempfile()?),
                len: 0,
                crc: crc32fast::Hasher::new(),
            },
            zlib: Compress::new(Compression::fast(), true),
            buf: vec![0; 64 << 10],
            seen: HashSet::new(),
            entries: Vec::new(),
        })
    }

    /// As [`TipPack::new`], for a `.git` that holds the objects `known` already: they are
    /// not added.
    pub fn without(known: HashSet<git2::Oid>) -> io::Result<TipPack> {
        let mut pack = TipPack::new()?;
        pack.seen = known;
        Ok(pack)
    }

    /// Whether no object went in.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Adds the object `id` of `kind` whose contents are `data` (unless it is in already).
    pub fn add(&mut self, id: git2::Oid, kind: git2::ObjectType, data: &[u8]) -> io::Result<()> {
        if !self.seen.insert(id) {
            return Ok(());
        }
        let type_bits: u8 = match kind {
            git2::ObjectType::Commit => 1,
            git2::ObjectType::Tree => 2,
            git2::ObjectType::Blob => 3,
            git2::ObjectType::Tag => 4,
            other => {
                return Err(io::Error::other(format!(
                    "an object of kind {other} cannot go into a pack"
                )))
            }
        };
        let offset = HEADER_BYTES + self.spool.len;
        self.spool.crc = crc32fast::Hasher::new();
        // Type and inflated size: 4 bits of size in the first byte, 7 in each next one.
        let mut size = data.len() as u64;
        let mut header = [0u8; 10];
        let mut n = 0;
        let mut byte = (type_bits << 4) | (size & 0x0f) as u8;
        size >>= 4;
        while size > 0 {
            header[n] = byte | 0x80;
            n += 1;
            byte = (size & 0x7f) as u8;
            size >>= 7;
        }
        header[n] = byte;
        n += 1;
        self.spool.write_all(&header[..n])?;
        // One compressor for all objects, reset between them: a new one per object
        // costs more than compressing a small file.
        self.zlib.reset();
        let mut input = data;
        loop {
            let (before_in, before_out) = (self.zlib.total_in(), self.zlib.total_out());
            let status = self
                .zlib
                .compress(input, &mut self.buf, FlushCompress::Finish)
                .map_err(io::Error::other)?;
            let used = (self.zlib.total_in() - before_in) as usize;
            let made = (self.zlib.total_out() - before_out) as usize;
            input = &input[used..];
            self.spool.write_all(&self.buf[..made])?;
            if status == Status::StreamEnd {
                break;
            }
        }
        let crc = std::mem::replace(&mut self.spool.crc, crc32fast::Hasher::new()).finalize();
        self.entries.push((id, crc, offset));
        Ok(())
    }

    /// How many objects are in.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// The pack and its index.
    pub fn finish(self) -> io::Result<FinishedPack> {
        let TipPack {
            spool, mut entries, ..
        } = self;
        let count = u32::try_from(entries.len())
            .map_err(|_| io::Error::other("too many objects for one pack"))?;
        let body_len = spool.len;
        let mut file = spool.out.into_inner().map_err(|e| e.into_error())?;
        let mut header = Vec::with_capacity(HEADER_BYTES as usize);
        header.extend_from_slice(b"PACK");
        header.extend_from_slice(&2u32.to_be_bytes());
        header.extend_from_slice(&count.to_be_bytes());

        // The pack's checksum (its trailer, and its name): one read of the spool.
        file.seek(SeekFrom::Start(0))?;
        let mut sha = Sha1::new();
        sha.update(&header);
        let mut buf = vec![0u8; 64 << 10];
        let mut left = body_len;
        while left > 0 {
            let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
            let got = file.read(&mut buf[..want])?;
            if got == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "the pack's spool is shorter than written",
                ));
            }
            sha.update(&buf[..got]);
            left -= got as u64;
        }
        let trailer: [u8; 20] = sha.finalize().into();
        file.seek(SeekFrom::Start(0))?;

        // The index, version 2: fan-out, ids, CRCs, offsets (large ones in a second
        // table), the pack's checksum, then its own.
        entries.sort_unstable_by_key(|e| e.0);
        let large = entries.iter().filter(|e| e.2 >= 1 << 31).count();
        let mut idx = Vec::with_capacity(
            8 + 1024 + entries.len() * 28 + large * 8 + 2 * TRAILER_BYTES as usize,
        );
        idx.extend_from_slice(b"\xfftOc");
        idx.extend_from_slice(&2u32.to_be_bytes());
        let mut fanout = [0u32; 256];
        for (id, _, _) in &entries {
            fanout[id.as_bytes()[0] as usize] += 1;
        }
        let mut total = 0u32;
        for n in fanout {
            total += n;
            idx.extend_from_slice(&total.to_be_bytes());
        }
        for (id, _, _) in &entries {
            idx.extend_from_slice(id.as_bytes());
        }
        for (_, crc, _) in &entries {
            idx.extend_from_slice(&crc.to_be_bytes());
        }
        let mut large_offsets = Vec::with_capacity(large);
        for (_, _, offset) in &entries {
            if *offset < 1 << 31 {
                idx.extend_from_slice(&(*offset as u32).to_be_bytes());
            } else {
                let at = 0x8000_0000u32 | large_offsets.len() as u32;
                idx.extend_from_slice(&at.to_be_bytes());
                large_offsets.push(*offset);
            }
        }
        for offset in large_offsets {
            idx.extend_from_slice(&offset.to_be_bytes());
        }
        idx.extend_from_slice(&trailer);
        let own: [u8; 20] = Sha1::digest(&idx).into();
        idx.extend_from_slice(&own);

        let pack = io::Cursor::new(header)
            .chain(file.take(body_len))
            .chain(io::Cursor::new(trailer));
        Ok(FinishedPack {
            name: hex::encode(trailer),
            pack_len: HEADER_BYTES + body_len + TRAILER_BYTES,
            pack: Box::new(pack),
            idx,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pack written here is read back by libgit2: every object, from the index.
    #[test]
    fn libgit2_reads_the_pack() {
        let tmp = tempfile::tempdir().unwrap();
        let src = git2::Repository::init_bare(tmp.path().join("src")).unwrap();
        let big: Vec<u8> = (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let blobs = [
            src.blob(b"").unwrap(),
            src.blob(b"hello\n").unwrap(),
            src.blob(&big).unwrap(),
        ];
        let mut tb = src.treebuilder(None).unwrap();
        tb.insert("a", blobs[1], 0o100644).unwrap();
        tb.insert("big", blobs[2], 0o100644).unwrap();
        tb.insert("empty", blobs[0], 0o100644).unwrap();
        let tree = tb.write().unwrap();
        let odb = src.odb().unwrap();

        let mut pack = TipPack::new().unwrap();
        for id in blobs.iter().chain([&tree]) {
            let o = odb.read(*id).unwrap();
            pack.add(*id, o.kind(), o.data()).unwrap();
        }
        pack.add(tree, git2::ObjectType::Tree, b"ignored: in already")
            .unwrap();
        assert_eq!(pack.len(), 4);
        let mut done = pack.finish().unwrap();
        let mut bytes = Vec::new();
        done.pack.read_to_end(&mut bytes).unwrap();
        assert_eq!(bytes.len() as u64, done.pack_len);
        assert_eq!(
            hex::encode(Sha1::digest(&bytes[..bytes.len() - 20])),
            done.name
        );

        let dst = git2::Repository::init_bare(tmp.path().join("dst")).unwrap();
        let dir = dst.path().join("objects/pack");
        std::fs::write(dir.join(format!("pack-{}.pack", done.name)), &bytes).unwrap();
        std::fs::write(dir.join(format!("pack-{}.idx", done.name)), &done.idx).unwrap();
        let dst = git2::Repository::open_bare(tmp.path().join("dst")).unwrap();
        let odb2 = dst.odb().unwrap();
        for id in blobs.iter().chain([&tree]) {
            let want = odb.read(*id).unwrap();
            let got = odb2.read(*id).unwrap();
            assert_eq!((got.kind(), got.data()), (want.kind(), want.data()));
        }
    }
}
