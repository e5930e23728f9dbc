//! Issue 43's preloaded warm sandboxes (a warm sandbox per engine that already holds a
//! repository's tip), as the cargo-sized benchmark sees them: waiting for one, a run at a
//! tip 20 commits newer than the one it holds, the host's memory for each while idle, and
//! the warm hit rate `/metrics` reports.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kodx::sandbox::owner::{PROCESS_LABEL, WARM_LABEL, WARM_NAME_PREFIX};

use super::{code_once, open_db, report, Measured};
use crate::common::serve::{Served, REPO};
use crate::common::synthetic::advance_main;

// The label the preloaded sandboxes carry: `<installation>/<owner>/<name>` of the runs
// they are kept for.
use kodx::sandbox::docker::PRELOADED_LABEL;

/// The cargo server keeps preloaded sandboxes (`warm_repositories = 2`, the default) unless
/// KODX_BENCH_PRELOAD=0 asks for a comparison without them.
pub(super) fn enabled() -> bool {
    std::env::var("KODX_BENCH_PRELOAD").map_or(true, |v| v != "0")
}

/// Set once a wait saw no `kodx_engine_warm_preloaded` gauge at all: this build keeps no
/// preloaded sandboxes, and later waits return at once.
static NO_GAUGE: AtomicBool = AtomicBool::new(false);

/// Waits (up to 30 s) until `/metrics` shows `want` preloaded sandboxes waiting on the
/// engines (`kodx_engine_warm_preloaded{…} N`, N ≥ `want`); prints whether they came.
pub(super) async fn until_preloaded(s: &Served, want: u64) -> bool {
    if NO_GAUGE.load(Ordering::Relaxed) {
        return false;
    }
    let started = Instant::now();
    let mut gauge = false;
    while started.elapsed() < Duration::from_secs(30) {
        let (_, metrics) = s.get("/metrics").await;
        let waiting: Vec<u64> = metrics
            .lines()
            .filter(|l| l.starts_with("kodx_engine_warm_preloaded{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|n| n as u64)
            .collect();
        gauge |= !waiting.is_empty();
        if waiting.iter().sum::<u64>() >= want {
            println!(
                "  ({want} preloaded sandbox(es) waiting after {:.1} s)",
                started.elapsed().as_secs_f64()
            );
            return true;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    if gauge {
        println!("  note: fewer than {want} preloaded sandbox(es) waiting after 30 s");
    } else {
        NO_GAUGE.store(true, Ordering::Relaxed);
        println!(
            "  note: /metrics has no kodx_engine_warm_preloaded gauge after 30 s (this build keeps no preloaded sandboxes); not waiting for one again"
        );
    }
    false
}

/// `runs` code runs, each at a tip 20 commits newer than the one the preloaded sandbox
/// holds: once one is waiting, `main` moves by 20 commits (1–3 files each, some added,
/// one deleted) and the command comes. Prints them as [`report`] does; returns them.
pub(super) async fn newer_tips(
    s: &Served,
    runs: usize,
    first_issue: u64,
    label: &str,
) -> Vec<Measured> {
    let db = open_db(s).await;
    let mut all = Vec::new();
    for i in 0..runs.max(2) as u64 {
        super::until_warm(s).await;
        until_preloaded(s, 1).await;
        let moved = Instant::now();
        let tip = advance_main(&s.git.bare_path(REPO), i, 20);
        println!(
            "  (main moved 20 commits to {} in {:.0} ms)",
            &tip[..12],
            moved.elapsed().as_secs_f64() * 1000.0
        );
        all.push(code_once(s, &db, first_issue + i).await);
    }
    db.close().await;
    report(label, &all);
    all
}

/// One warm sandbox of this server, as the host pays for it.
struct Held {
    name: String,
    repository: Option<String>,
    /// The RSS of its containerd shim, MB.
    shim_mb: Option<f64>,
    /// Its cgroup: all memory charged, anonymous memory, page cache, MB.
    charged_mb: Option<f64>,
    anon_mb: Option<f64>,
    cache_mb: Option<f64>,
}

/// Once a preloaded sandbox is waiting and the server has been idle 2 s: each of this
/// server's warm sandboxes (the preloaded ones when there are any) with its shim's RSS and
/// its cgroup's memory, and `kodx serve`'s RSS against `rss_before` (before any preload).
/// Returns the host-side MB per preloaded sandbox (the shim, the anonymous memory, and
/// kodx's increase shared among them), or `None` when none was found.
pub(super) async fn idle_memory(s: &Served, rss_before: f64) -> Option<f64> {
    println!("\nidle memory with a preloaded sandbox waiting (host side)");
    until_preloaded(s, 1).await;
    let rss_after = super::idle_rss_mb(s).await;
    let held = warm_sandboxes(s.kodx_pid()).await;
    let preloaded: Vec<&Held> = held.iter().filter(|h| h.repository.is_some()).collect();
    let mb = |v: Option<f64>| v.map_or("?".to_string(), |v| format!("{v:.1} MB"));
    for h in &held {
        println!(
            "  {} ({}): shim {}, cgroup {} (anon {}, page cache {})",
            h.name,
            h.repository
                .as_deref()
                .map_or("warm, holds no repository".to_string(), |r| format!(
                    "preloaded with {r}"
                )),
            mb(h.shim_mb),
            mb(h.charged_mb),
            mb(h.anon_mb),
            mb(h.cache_mb)
        );
    }
    let increase = rss_after - rss_before;
    println!(
        "  kodx serve: {rss_after:.1} MB idle now, {rss_before:.1} MB before any preload ({increase:+.1} MB; the mirror's and the runs' too, not only the preload's)"
    );
    let (what, measured) = if preloaded.is_empty() {
        (
            "host side per warm sandbox (none preloaded)",
            held.iter().collect(),
        )
    } else {
        ("host side per preloaded sandbox", preloaded)
    };
    if measured.is_empty() {
        println!("  note: no warm sandbox of this server found on the engine");
        return None;
    }
    let mean = |f: &dyn Fn(&Held) -> Option<f64>| {
        measured.iter().filter_map(|h| f(h)).sum::<f64>() / measured.len() as f64
    };
    let (shim, anon, cache) = (
        mean(&|h| h.shim_mb),
        mean(&|h| h.anon_mb),
        mean(&|h| h.cache_mb),
    );
    println!(
        "  {what}: shim {shim:.1} MB + anon {anon:.1} MB (+ page cache {cache:.1} MB, reclaimable); with kodx's increase shared among {}: {:.1} MB",
        measured.len(),
        shim + anon + increase.max(0.0) / measured.len() as f64
    );
    let preloads = measured.iter().any(|h| h.repository.is_some());
    preloads.then(|| shim + anon + increase.max(0.0) / measured.len() as f64)
}

/// This server's warm sandboxes waiting on the engine (labelled [`WARM_LABEL`], made by
/// the process `pid`, not claimed by a run, or preloaded).
async fn warm_sandboxes(pid: u32) -> Vec<Held> {
    use bollard::query_parameters::ListContainersOptions;
    let docker = bollard::Docker::connect_with_defaults().unwrap();
    let listed = docker
        .list_containers(Some(ListContainersOptions {
            filters: Some(std::collections::HashMap::from([(
                "label".to_string(),
                vec![WARM_LABEL.to_string()],
            )])),
            ..Default::default()
        }))
        .await
        .unwrap_or_default();
    let mut out = Vec::new();
    for c in listed {
        let labels = c.labels.unwrap_or_default();
        let ours = labels
            .get(PROCESS_LABEL)
            .and_then(|p| p.split('/').nth(2))
            .is_some_and(|p| p == pid.to_string());
        let name = c
            .names
            .and_then(|n| n.into_iter().next())
            .unwrap_or_default();
        let repository = labels.get(PRELOADED_LABEL).cloned();
        let waiting = name.trim_start_matches('/').starts_with(WARM_NAME_PREFIX);
        let Some(id) = c.id.filter(|_| ours && (waiting || repository.is_some())) else {
            continue;
        };
        let Some(pid) = docker
            .inspect_container(&id, None)
            .await
            .ok()
            .and_then(|i| i.state?.pid)
            .filter(|p| *p > 0)
        else {
            continue;
        };
        let memory = cgroup_memory(pid as u32);
        out.push(Held {
            name: name.trim_start_matches('/').to_string(),
            repository,
            shim_mb: shim_of(pid as u32).and_then(rss_mb),
            charged_mb: memory.map(|m| m.0),
            anon_mb: memory.map(|m| m.1),
            cache_mb: memory.map(|m| m.2),
        });
    }
    out
}

/// The containerd shim above the container's first process `pid` (its parent chain).
fn shim_of(pid: u32) -> Option<u32> {
    let mut at = pid;
    for _ in 0..8 {
        let stat = std::fs::read_to_string(format!("/proc/{at}/stat")).ok()?;
        let after = &stat[stat.rfind(')')? + 1..];
        at = after.split_whitespace().nth(1)?.parse().ok()?;
        if at <= 1 {
            return None;
        }
        let comm = std::fs::read_to_string(format!("/proc/{at}/comm")).ok()?;
        if comm.starts_with("containerd-shim") {
            return Some(at);
        }
    }
    None
}

/// A process's resident memory, MB.
fn rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

/// The memory cgroup of process `pid`: (all charged, anonymous, page cache), MB; cgroup v2
/// (`memory.current`, `anon`, `file`) or v1 (`memory.usage_in_bytes`, `total_rss`,
/// `total_cache`).
fn cgroup_memory(pid: u32) -> Option<(f64, f64, f64)> {
    let groups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let mb = |bytes: u64| bytes as f64 / (1024.0 * 1024.0);
    let stat_of = |text: &str, key: &str| -> Option<u64> {
        text.lines()
            .find_map(|l| l.strip_prefix(key)?.strip_prefix(' '))?
            .trim()
            .parse()
            .ok()
    };
    // v1: the memory controller's own line.
    if let Some(path) = groups.lines().find_map(|l| {
        let mut parts = l.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == "memory")
            .then_some(path)
    }) {
        let dir = format!("/sys/fs/cgroup/memory{path}");
        let usage: u64 = std::fs::read_to_string(format!("{dir}/memory.usage_in_bytes"))
            .ok()?
            .trim()
            .parse()
            .ok()?;
        let stat = std::fs::read_to_string(format!("{dir}/memory.stat")).ok()?;
        return Some((
            mb(usage),
            mb(stat_of(&stat, "total_rss")?),
            mb(stat_of(&stat, "total_cache")?),
        ));
    }
    let path = groups.lines().find_map(|l| l.strip_prefix("0::"))?;
    let dir = format!("/sys/fs/cgroup{path}");
    let current: u64 = std::fs::read_to_string(format!("{dir}/memory.current"))
        .ok()?
        .trim()
        .parse()
        .ok()?;
    let stat = std::fs::read_to_string(format!("{dir}/memory.stat")).ok()?;
    Some((
        mb(current),
        mb(stat_of(&stat, "anon")?),
        mb(stat_of(&stat, "file")?),
    ))
}

/// The warm hit rate each engine reports (`kodx_warm_hit_ratio`).
pub(super) async fn print_hit_ratio(s: &Served) {
    let (_, metrics) = s.get("/metrics").await;
    let lines: Vec<&str> = metrics
        .lines()
        .filter(|l| l.starts_with("kodx_warm_hit_ratio") || l.starts_with("kodx_warm_starts_total"))
        .collect();
    if lines.is_empty() {
        println!("  warm hit rate: /metrics has no kodx_warm_hit_ratio");
    }
    for line in lines {
        println!("  /metrics: {line}");
    }
}
