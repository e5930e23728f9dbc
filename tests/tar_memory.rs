//! Memory held by the workspace tars, measured exactly: this test binary counts every heap
//! byte (a counting global allocator) while huge files are packed, compared and exported.
//! One test function, so no other test's allocations are counted.

#[allow(dead_code)] // the sandbox half is for tests/it
#[path = "it/common/tar_flood.rs"]
mod tar_flood;

use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::VecDeque;
use std::fs::File;
use std::io::{self, Read, Write};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use kodx::sandbox::archive::{self, ArchiveLimits, ChangeKind, Manifest, NewEntry};
use tar_flood::{Flood, FLOOD_BYTES};

struct Counting;

static CURRENT: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);

fn grew(by: usize) {
    let now = CURRENT.fetch_add(by, Ordering::Relaxed) + by;
    PEAK.fetch_max(now, Ordering::Relaxed);
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        grew(layout.size());
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        CURRENT.fetch_sub(layout.size(), Ordering::Relaxed);
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if new_size > layout.size() {
            grew(new_size - layout.size());
        } else {
            CURRENT.fetch_sub(layout.size() - new_size, Ordering::Relaxed);
        }
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static ALLOCATOR: Counting = Counting;

/// Runs `f` and returns its result and the most heap it held above what was held before.
fn peak_of<T>(f: impl FnOnce() -> T) -> (T, usize) {
    let base = CURRENT.load(Ordering::Relaxed);
    PEAK.store(base, Ordering::Relaxed);
    let out = f();
    (out, PEAK.load(Ordering::Relaxed).saturating_sub(base))
}

const MIB: usize = 1 << 20;
/// What the tar code may hold at once, whatever the file sizes.
const BOUND: usize = 8 * MIB;

/// A writer that only counts.
struct Sink(u64);

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0 += b.len() as u64;
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A tar made on the fly, never held in memory: entries whose data is text or a run of
/// zeros. Counts the bytes read from it.
struct Generated {
    parts: VecDeque<Part>,
    read: Arc<AtomicU64>,
}

enum Part {
    Bytes(Vec<u8>),
    Zeros(u64),
}

enum Data<'a> {
    Dir,
    Text(&'a str),
    Zeros(u64),
}

fn generated(entries: &[(&str, Data)]) -> (Generated, Arc<AtomicU64>) {
    let mut parts = VecDeque::new();
    for (name, data) in entries {
        let mut h = tar::Header::new_gnu();
        h.set_path(name).unwrap();
        h.set_mode(0o644);
        let size = match data {
            Data::Dir => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_mode(0o755);
                0
            }
            Data::Text(t) => t.len() as u64,
            Data::Zeros(n) => *n,
        };
        h.set_size(size);
        h.set_cksum();
        parts.push_back(Part::Bytes(h.as_bytes().to_vec()));
        match data {
            Data::Dir => {}
            Data::Text(t) => parts.push_back(Part::Bytes(t.as_bytes().to_vec())),
            Data::Zeros(n) => parts.push_back(Part::Zeros(*n)),
        }
        parts.push_back(Part::Zeros((512 - size % 512) % 512));
    }
    parts.push_back(Part::Zeros(1024));
    let read = Arc::new(AtomicU64::new(0));
    (
        Generated {
            parts,
            read: read.clone(),
        },
        read,
    )
}

impl Read for Generated {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            let n = match self.parts.front_mut() {
                None => return Ok(0),
                Some(Part::Bytes(b)) if b.is_empty() => 0,
                Some(Part::Bytes(b)) => {
                    let n = buf.len().min(b.len());
                    buf[..n].copy_from_slice(&b[..n]);
                    b.drain(..n);
                    n
                }
                Some(Part::Zeros(0)) => 0,
                Some(Part::Zeros(left)) => {
                    let n = buf.len().min(usize::try_from(*left).unwrap_or(usize::MAX));
                    buf[..n].fill(0);
                    *left -= n as u64;
                    n
                }
            };
            if n == 0 {
                self.parts.pop_front();
                continue;
            }
            self.read.fetch_add(n as u64, Ordering::Relaxed);
            return Ok(n);
        }
    }
}

/// An opener that gives `tar` for the whole tree (once) and the root's `.gitignore` as
/// Docker would (`rules`), and nothing else.
fn only(
    tar: Generated,
    rules: Option<&'static str>,
) -> impl FnMut(&str) -> kodx::sandbox::Result<Option<Box<dyn Read>>> {
    let mut tar = Some(tar);
    move |path: &str| {
        Ok(match (path, rules) {
            ("", _) => Some(Box::new(tar.take().expect("read once")) as Box<dyn Read>),
            (".gitignore", Some(text)) => {
                let (one, _) = generated(&[(".gitignore", Data::Text(text))]);
                Some(Box::new(one) as Box<dyn Read>)
            }
            _ => None,
        })
    }
}

#[test]
fn huge_files_cross_the_tar_code_in_bounded_memory() {
    // Copy-in: a 1.5 GB file in the repository (sparse: no disk used) is streamed.
    let repo = tempfile::tempdir().unwrap();
    let size = 1536 * MIB as u64;
    File::create(repo.path().join("big.bin"))
        .unwrap()
        .set_len(size)
        .unwrap();
    std::fs::write(repo.path().join("small.txt"), "small\n").unwrap();
    let (manifest, held) = peak_of(|| {
        let mut sink = Sink(0);
        let manifest = archive::pack_dir_to(repo.path(), "workspace/repo", &mut sink).unwrap();
        assert!(sink.0 > size, "the whole file went into the tar");
        manifest
    });
    assert!(
        matches!(manifest.get("big.bin"), Some(archive::ManifestEntry::File { size: s, .. }) if *s == size)
    );
    println!("pack_dir_to, 1.5 GB file: {} KiB held", held / 1024);
    assert!(held < BOUND, "packing held {held} bytes");

    // Export side: a 2.3 GB file is refused on its header, nothing of it read.
    let huge = 2300 * MIB as u64;
    let entries = [
        ("repo/", Data::Dir),
        ("repo/big.bin", Data::Zeros(huge)),
        ("repo/after.txt", Data::Text("after")),
    ];
    let (tar, read) = generated(&entries);
    let (result, held) = peak_of(|| {
        archive::change_set_from(
            &mut only(tar, None),
            "repo",
            &Manifest::default(),
            &ArchiveLimits::default(),
        )
    });
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains("repo/big.bin") && err.contains("max_file_bytes"),
        "{err}"
    );
    let read = read.load(Ordering::Relaxed);
    println!(
        "change set, 2.3 GB file refused: {read} bytes read, {} KiB held",
        held / 1024
    );
    assert!(
        read < 1 << 20,
        "read {read} bytes of the stream before refusing"
    );
    assert!(held < BOUND, "held {held} bytes");

    let (tar, read) = generated(&entries);
    let out = tempfile::tempdir().unwrap();
    let err = archive::replace_dir_from(
        &mut only(tar, None),
        "repo",
        &out.path().join("export"),
        &ArchiveLimits::default(),
        None,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("repo/big.bin"), "{err}");
    assert!(read.load(Ordering::Relaxed) < 1 << 20);

    // An ignored 600 MB file streams past without being kept or counted; a new 90 MB
    // file (under the limit) is spooled to disk, not held.
    let (tar, _) = generated(&[
        ("repo/", Data::Dir),
        ("repo/.gitignore", Data::Text("target/\n")),
        ("repo/new.bin", Data::Zeros(90 * MIB as u64)),
        ("repo/target/", Data::Dir),
        ("repo/target/app.bin", Data::Zeros(600 * MIB as u64)),
    ]);
    let (set, held) = peak_of(|| {
        archive::change_set_from(
            &mut only(tar, Some("target/\n")),
            "repo",
            &Manifest::default(),
            &ArchiveLimits::default(),
        )
        .unwrap()
    });
    let got: Vec<&str> = set.changes.iter().map(|c| c.path.as_str()).collect();
    assert_eq!(got, [".gitignore", "new.bin"]);
    let ChangeKind::Added(NewEntry::File { contents, .. }) = &set.changes[1].kind else {
        panic!("{set:?}")
    };
    assert!(contents.is_spooled() && contents.len() == 90 * MIB as u64);
    println!(
        "change set, 600 MB ignored + 90 MB new: {} KiB held",
        held / 1024
    );
    assert!(held < BOUND, "held {held} bytes");

    // Export of a 90 MB file: written as it streams.
    let (tar, _) = generated(&[
        ("repo/", Data::Dir),
        ("repo/new.bin", Data::Zeros(90 * MIB as u64)),
    ]);
    let dest = out.path().join("export");
    let (exported, held) = peak_of(|| {
        archive::replace_dir_from(
            &mut only(tar, None),
            "repo",
            &dest,
            &ArchiveLimits::default(),
            None,
        )
        .unwrap()
    });
    assert_eq!(exported.files, 1);
    assert_eq!(
        std::fs::metadata(dest.join("new.bin")).unwrap().len(),
        90 * MIB as u64
    );
    println!("export, 90 MB file: {} KiB held", held / 1024);
    assert!(held < BOUND, "held {held} bytes");

    // A replaced helper's flood (issue 36): one extension entry that claims 1.25 GiB,
    // through the snapshot's read site and the engine archive's. The tar crate would read
    // its data whole into memory; the bound refuses it on its header.
    for flood in [Flood::Pax, Flood::LongName] {
        let what = match flood {
            Flood::Pax => "PAX extended header",
            Flood::LongName => "GNU long name",
        };
        let (tar, read) = flood.reader();
        let mut open = |_: &str| -> kodx::sandbox::Result<Option<Box<dyn Read>>> { Ok(None) };
        let (result, held) = peak_of(|| {
            archive::change_set_from_snapshot(
                tar,
                &mut open,
                "repo",
                &Manifest::default(),
                &ArchiveLimits::default(),
            )
        });
        let err = result.unwrap_err().to_string();
        let read = read.load(Ordering::Relaxed);
        println!(
            "snapshot, {what} of {FLOOD_BYTES} bytes: refused after {read} bytes, {} KiB held",
            held / 1024
        );
        assert!(read < 1 << 20, "read {read} bytes of the flood");
        assert!(held < BOUND, "held {held} bytes");
        assert!(
            err.contains(&format!("a {what} of {FLOOD_BYTES} bytes")),
            "{err}"
        );

        let (tar, read) = flood.reader();
        let mut tar = Some(tar);
        let mut open = |path: &str| -> kodx::sandbox::Result<Option<Box<dyn Read>>> {
            Ok(match path {
                "" => Some(Box::new(tar.take().expect("read once"))),
                _ => None,
            })
        };
        let (result, held) = peak_of(|| {
            archive::change_set_from(
                &mut open,
                "repo",
                &Manifest::default(),
                &ArchiveLimits::default(),
            )
        });
        let err = result.unwrap_err().to_string();
        let read = read.load(Ordering::Relaxed);
        println!(
            "change set, {what} of {FLOOD_BYTES} bytes: refused after {read} bytes, {} KiB held",
            held / 1024
        );
        assert!(read < 1 << 20, "read {read} bytes of the flood");
        assert!(held < BOUND, "held {held} bytes");
        assert!(err.contains(what), "{err}");
    }
}
