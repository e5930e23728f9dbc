//! `KODX_BENCH_ONLY=cargo`: the cargo-sized code runs alone (their phases), then issue 43's
//! "Done when" figures on them: a second command right after the first one's pull
//! request and 10 s after it, an ask, a run at a tip 20 commits newer than the preloaded
//! sandbox's, the host's memory per idle preloaded sandbox, and the warm hit rate.

use std::time::Duration;

use super::{
    ask_latency, figure, idle_rss_mb, measure, preload, print_ask_breakdown, print_copy_ins,
    second_commands, Measured,
};
use crate::common;
use crate::common::serve::{Served, REPO};
use crate::stats::median;

/// `kodx serve` with one warm sandbox per engine and two preloaded ones
/// (`warm_repositories`, issue 43), or none with KODX_BENCH_PRELOAD=0.
async fn server() -> Served {
    common::serve::Served::start(common::serve::Options {
        workers: true,
        settings: Some(if preload::enabled() {
            "status_interval_secs = 0.2\nshutdown_grace_secs = 5\nwarm_sandboxes = 1\nwarm_repositories = 2\n"
        } else {
            "status_interval_secs = 0.2\nshutdown_grace_secs = 5\nwarm_sandboxes = 1\nwarm_repositories = 0\n"
        }),
        ..Default::default()
    })
    .await
}

fn median_total(runs: &[Measured]) -> f64 {
    median(runs.iter().map(|m| m.total_ms).collect())
}

pub(super) async fn only(runs: usize, files: usize, commits: usize, journaled: bool) {
    let s = server().await;
    println!(
        "preloaded sandboxes: {}",
        if preload::enabled() {
            "warm_repositories = 2 (the default; KODX_BENCH_PRELOAD=0 turns them off)"
        } else {
            "off (warm_repositories = 0, KODX_BENCH_PRELOAD=0)"
        }
    );
    // Before any run: nothing preloaded yet (the comparison for the memory figure).
    let rss_before = idle_rss_mb(&s).await;
    common::synthetic::fill_bare(&s.git.bare_path(REPO), files, commits);
    let label = format!("cargo-sized repository ({files} files, {commits} commits)");
    measure(&label, &s, runs, 100).await;
    // Issue 43's rhythm: a second command right after the first one's pull request
    // (no wait for the pool's refill), and one 10 s later.
    let mut seconds = Vec::new();
    for (gap, what, first_issue) in [
        (Duration::ZERO, "immediately after the first's PR", 300),
        (Duration::from_secs(10), "10 s after the first's PR", 400),
    ] {
        let label = format!("{label}, second command {what}");
        seconds.push(second_commands(&s, runs, first_issue, gap, &label).await);
    }
    // The mirror is warm: every ask is a second run.
    println!();
    let (_, _, asks) = ask_latency(&s, runs, 500, true).await;
    print_ask_breakdown("ask, cargo-sized, second run", &asks);
    let newer = preload::newer_tips(
        &s,
        runs,
        600,
        &format!("{label}, a run at a tip 20 commits newer than the preloaded one"),
    )
    .await;
    let memory = preload::idle_memory(&s, rss_before).await;
    print_copy_ins(&s);

    println!(
        "\nissue 43 targets (release build; medians of all runs of each; sandboxes on {})",
        if journaled {
            "the journaled-ext4 engine"
        } else {
            "this machine's engine"
        }
    );
    let mut results = Vec::new();
    for (name, ms, target) in [
        (
            "second command immediately after the first's PR",
            median_total(&seconds[0]),
            1000.0,
        ),
        (
            "second command 10 s after the first's PR",
            median_total(&seconds[1]),
            1000.0,
        ),
        (
            "ask: webhook → answer posted",
            median(asks.iter().map(|a| a.total_ms).collect()),
            1500.0,
        ),
        (
            "a run at a tip 20 commits newer than the preloaded one",
            median_total(&newer),
            1200.0,
        ),
    ] {
        figure(&mut results, name, ms, target);
    }
    match memory {
        Some(mb) => {
            results.push(mb <= 50.0);
            println!(
                "  {:<56} {mb:>9.1} MB  target <= 50 MB: {}",
                "idle memory per preloaded sandbox, host side",
                if mb <= 50.0 { "ok" } else { "MISSED" }
            );
        }
        None => println!(
            "  {:<56} not measured: no preloaded sandbox found (not counted)",
            "idle memory per preloaded sandbox, host side"
        ),
    }
    preload::print_hit_ratio(&s).await;
    println!(
        "{} of {} targets met",
        results.iter().filter(|r| **r).count(),
        results.len()
    );
}
