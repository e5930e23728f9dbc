//! Figures for the repository cache (issue 11), on a synthetic repository shaped like
//! rust-lang/cargo (3,000 files, 20,000 commits, made deterministically with
//! `git fast-import`) served by the real `git http-backend` over loopback HTTP:
//!
//! - cold clone as `kodx serve` does it today (full history for code runs, depth 1 for ask);
//! - cold mirror (first run through the cache) and warm runs (1 new commit; nothing new);
//! - a run's clone from the mirror, with files or with the index only;
//! - the tree into the container's tar: checkout + `pack_dir_to` (two writes) against
//!   `pack_checkout_to` straight from the objects (one).
//!
//! Each figure is the median of `KODX_BENCH_RUNS` (default 3) and is printed against its
//! target. `KODX_BENCH_FILES` / `KODX_BENCH_COMMITS` shrink the repository for a quick look.
//!
//! cargo test --release --test bench -- --ignored --nocapture stress_repo_cache::
//! (or bash bench/repo-cache.sh)

use crate::common::{git_server, synthetic};

use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::stats::{env_usize, median_duration as median};
use git_server::{accept_tokens, GitServer};
use kodx::git::{self, Checkout};
use kodx::repo_cache::{RepoCache, RepoKey};
use kodx::sandbox::archive::{self, ArchiveLimits};

const TOKEN: &str = "ghs_BenchInstallationToken0123456789abcd";
const REPO: &str = "bench/cargo";

/// Makes the bare repository `REPO` on the server with the synthetic history.
fn make_repo(srv: &GitServer, files: usize, commits: usize) -> String {
    synthetic::fill_bare(&srv.bare_path(REPO), files, commits);
    srv.clone_url(REPO)
}

fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => dir_bytes(&e.path()),
                    Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
                    _ => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

/// Bytes of the files under `dir` that are not hard links to elsewhere.
fn own_bytes(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .map(|e| match e.file_type() {
                    Ok(t) if t.is_dir() => own_bytes(&e.path()),
                    Ok(t) if t.is_file() => {
                        e.metadata()
                            .map_or(0, |m| if m.nlink() == 1 { m.len() } else { 0 })
                    }
                    _ => 0,
                })
                .sum()
        })
        .unwrap_or(0)
}

fn secs(d: Duration) -> String {
    format!("{:.3} s", d.as_secs_f64())
}

/// One printed figure; `target`: the most it may take, if it has one.
fn figure(results: &mut Vec<bool>, name: &str, took: Duration, target: Option<Duration>) {
    match target {
        Some(t) => {
            let ok = took <= t;
            results.push(ok);
            println!(
                "{name:<58} {:>9}  target <= {:>7}: {}",
                secs(took),
                secs(t),
                if ok { "ok" } else { "MISSED" }
            );
        }
        None => println!("{name:<58} {:>9}  (reference)", secs(took)),
    }
}

/// A writer that counts and drops.
struct Count(u64);

impl Write for Count {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0 += b.len() as u64;
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

fn vm_hwm_mb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

#[test]
#[ignore = "benchmark: cargo test --release --test bench -- --ignored --nocapture stress_repo_cache::"]
fn repo_cache_figures() {
    let files = env_usize("KODX_BENCH_FILES", 3_000);
    let commits = env_usize("KODX_BENCH_COMMITS", 20_000);
    let runs = env_usize("KODX_BENCH_RUNS", 3).max(1);
    let srv = GitServer::start(accept_tokens(&[TOKEN]));
    let work = tempfile::tempdir().unwrap();
    let scratch = |name: &str| -> PathBuf { work.path().join(name) };

    let started = Instant::now();
    let url = make_repo(&srv, files, commits);
    let pack_bytes = dir_bytes(&srv.bare_path(REPO).join("objects/pack"));
    println!(
        "\nsynthetic repository: {files} files, {} commits, pack {} (made in {})",
        srv.commit_count(REPO, "main"),
        archive::human(pack_bytes),
        secs(started.elapsed())
    );
    let key = RepoKey::parse(REPO).unwrap();
    let mut results = Vec::new();
    let mut n = 0;
    let mut fresh = |prefix: &str| {
        n += 1;
        scratch(&format!("{prefix}{n}"))
    };

    // Today: a clone per run.
    let mut full = Vec::new();
    let mut shallow = Vec::new();
    for _ in 0..runs {
        let dest = fresh("clone");
        let t = Instant::now();
        git::clone(&url, TOKEN, &dest, &Checkout::DefaultBranch, None).unwrap();
        full.push(t.elapsed());
        std::fs::remove_dir_all(&dest).unwrap();
        let dest = fresh("shallow");
        let t = Instant::now();
        git::clone(&url, TOKEN, &dest, &Checkout::DefaultBranch, Some(1)).unwrap();
        shallow.push(t.elapsed());
        std::fs::remove_dir_all(&dest).unwrap();
    }
    println!("\n-- today: a clone per run --");
    figure(
        &mut results,
        "cold clone, full history (code run; cargo: 9.3 s)",
        median(full),
        None,
    );
    let shallow = median(shallow);
    figure(&mut results, "cold clone, depth 1 (ask run)", shallow, None);

    // The cache: a cold mirror (first run on the repository).
    let mut cold = Vec::new();
    for _ in 0..runs {
        let cache = RepoCache::new(fresh("mirrors"), u64::MAX);
        let t = Instant::now();
        let c = cache
            .checkout(
                &key,
                &url,
                TOKEN,
                &Checkout::DefaultBranch,
                &fresh("run"),
                false,
            )
            .unwrap();
        cold.push(t.elapsed());
        assert!(c.fetched);
        std::fs::remove_dir_all(cache.root()).unwrap();
    }
    println!("\n-- the repository cache --");
    figure(
        &mut results,
        "cold mirror + clone from it (first run on a repository)",
        median(cold),
        None,
    );

    let cache = RepoCache::new(scratch("cache"), u64::MAX);
    cache
        .checkout(
            &key,
            &url,
            TOKEN,
            &Checkout::DefaultBranch,
            &fresh("run"),
            false,
        )
        .unwrap();
    let mirror_bytes = dir_bytes(&cache.mirror_path(&key));

    // Warm, with one new commit on the server each time.
    let mut warm_fetch = Vec::new();
    let mut warm_total = Vec::new();
    let mut objects = Vec::new();
    for i in 0..runs {
        let name = format!("src/cargo/core/new{i}.rs");
        srv.commit_on_branch(REPO, "main", &[(&name, b"pub fn new() {}\n", 0o644)], "new");
        let t = Instant::now();
        let c = cache
            .checkout(
                &key,
                &url,
                TOKEN,
                &Checkout::DefaultBranch,
                &fresh("run"),
                false,
            )
            .unwrap();
        warm_total.push(t.elapsed());
        warm_fetch.push(c.fetch_took);
        objects.push(c.received_objects);
        assert!(c.fetched && c.received_objects < 20, "{c:?}");
    }
    figure(
        &mut results,
        &format!(
            "warm refresh, 1 new commit ({} objects fetched)",
            objects[0]
        ),
        median(warm_fetch),
        Some(Duration::from_millis(500)),
    );
    figure(
        &mut results,
        "warm run: refresh (1 new commit) + clone, index only",
        median(warm_total),
        Some(Duration::from_secs(1)),
    );
    let mut same = Vec::new();
    for _ in 0..runs {
        let t = Instant::now();
        let c = cache
            .checkout(
                &key,
                &url,
                TOKEN,
                &Checkout::DefaultBranch,
                &fresh("run"),
                false,
            )
            .unwrap();
        same.push(t.elapsed());
        assert!(!c.fetched);
    }
    let same = median(same);
    figure(
        &mut results,
        "warm run, nothing new: ref list + clone, index only",
        same,
        Some(Duration::from_millis(500)),
    );

    // A run's clone from the mirror (no network), with files or with the index only.
    let tip = git::fetch_mirror(
        &cache.mirror_path(&key),
        &url,
        TOKEN,
        &Checkout::DefaultBranch,
        None,
    )
    .unwrap();
    let mut with_files = Vec::new();
    let mut index_only = Vec::new();
    let mut pack_disk = Vec::new();
    let mut pack_objects = Vec::new();
    let (mut tar_disk, mut tar_objects) = (0, 0);
    let limits = ArchiveLimits::default();
    let mut last_index = PathBuf::new();
    for _ in 0..runs {
        let dest = fresh("files");
        let t = Instant::now();
        git::clone_from_mirror(
            &cache.mirror_path(&key),
            &tip,
            &url,
            &Checkout::DefaultBranch,
            &dest,
            true,
        )
        .unwrap();
        with_files.push(t.elapsed());
        let t = Instant::now();
        let mut sink = Count(0);
        archive::pack_dir_to(&dest, "workspace/repo", &mut sink).unwrap();
        pack_disk.push(t.elapsed());
        tar_disk = sink.0;

        let dest = fresh("index");
        last_index = dest.clone();
        let t = Instant::now();
        git::clone_from_mirror(
            &cache.mirror_path(&key),
            &tip,
            &url,
            &Checkout::DefaultBranch,
            &dest,
            false,
        )
        .unwrap();
        index_only.push(t.elapsed());
        let t = Instant::now();
        let mut sink = Count(0);
        archive::pack_checkout_to(&dest, "workspace/repo", &limits, &mut sink).unwrap();
        pack_objects.push(t.elapsed());
        tar_objects = sink.0;
    }
    let (with_files, index_only) = (median(with_files), median(index_only));
    let (pack_disk, pack_objects) = (median(pack_disk), median(pack_objects));
    println!("\n-- a run's clone from the mirror, and its tree into the container's tar --");
    figure(
        &mut results,
        "clone from the mirror, files checked out",
        with_files,
        None,
    );
    figure(
        &mut results,
        "clone from the mirror, index only",
        index_only,
        Some(Duration::from_millis(300)),
    );
    figure(
        &mut results,
        &format!(
            "tar from the checkout on disk ({})",
            archive::human(tar_disk)
        ),
        pack_disk,
        None,
    );
    figure(
        &mut results,
        &format!("tar from the objects ({})", archive::human(tar_objects)),
        pack_objects,
        None,
    );
    let two_writes = with_files + pack_disk;
    let one_write = index_only + pack_objects;
    figure(
        &mut results,
        "checkout + tar from disk (two writes)",
        two_writes,
        None,
    );
    figure(
        &mut results,
        "index only + tar from the objects (one write)",
        one_write,
        Some(two_writes),
    );
    figure(
        &mut results,
        "warm run, nothing new, tree in the tar (vs depth-1 clone today)",
        same + pack_objects,
        Some(shallow),
    );

    println!(
        "\nmirror on disk {}; a run's clone costs {} more (hard links); bench process VmHWM {} MB",
        archive::human(mirror_bytes),
        archive::human(own_bytes(&last_index)),
        vm_hwm_mb()
    );
    let missed = results.iter().filter(|ok| !**ok).count();
    println!(
        "{} of {} targets met\n",
        results.len() - missed,
        results.len()
    );
    assert_eq!(missed, 0, "targets missed");
}
