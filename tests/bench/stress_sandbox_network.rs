//! What the network fence and the disk watchdog cost a sandbox's start, against the real
//! Docker engine. Not a timed test: run it by hand and read the figures.
//!
//! cargo test --release --test bench -- --ignored --nocapture stress_sandbox_network::
//!
//! Starts alternate between a fenced sandbox (the default: plugged into the kodx-sandbox
//! network by the fencer, routes added by the same exec), one plugged in with everything
//! allowed (`0.0.0.0/0`: no routes) and one without network, so all see the same load;
//! the difference of the first two medians is the routes' cost, of the last two the
//! network's.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use kodx::sandbox::Sandbox;

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn p95(v: &mut [Duration]) -> Duration {
    v.sort();
    v[(v.len() * 95 / 100).min(v.len() - 1)]
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

#[tokio::test]
#[ignore]
async fn bench_network_fence_and_disk_watchdog() {
    let engine = common::require_engine!();
    let reps: usize = std::env::var("KODX_BENCH_REPS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(20);
    // The first fenced start reads the engine host's addresses (then cached for 5 min).
    let t = Instant::now();
    let sb = engine.start(&spec("bench-net-first")).await.unwrap();
    let first = t.elapsed();
    sb.destroy().await.unwrap();

    let mut fenced = Vec::new();
    let mut open = Vec::new();
    let mut bare = Vec::new();
    let mut watched = Vec::new();
    for i in 0..reps {
        for kind in 0..4 {
            let mut s = spec(&format!("bench-net-{i}-{kind}"));
            match kind {
                0 => {}
                1 => s.allowed_cidrs = vec!["0.0.0.0/0".parse().unwrap()],
                2 => s.no_network = true,
                _ => {
                    s.no_network = true;
                    s.max_disk_bytes = None;
                }
            }
            let t = Instant::now();
            let sb = engine.start(&s).await.unwrap();
            let took = t.elapsed();
            sb.destroy().await.unwrap();
            match kind {
                0 => fenced.push(took),
                1 => open.push(took),
                2 => bare.push(took),
                _ => watched.push(took),
            }
        }
    }
    let (mf, mo, mb, mu) = (
        median(&mut fenced),
        median(&mut open),
        median(&mut bare),
        median(&mut watched),
    );
    let fence_cost = mf.saturating_sub(mo);
    let watchdog_cost = mb.saturating_sub(mu);
    println!(
        "kodx sandbox network fence and disk watchdog — {reps} starts each, image {}",
        image()
    );
    println!(
        "first fenced start (reads the host's addresses)  {}",
        ms(first)
    );
    println!(
        "start, fenced network (default)     median {}  p95 {}",
        ms(mf),
        ms(p95(&mut fenced))
    );
    println!(
        "start, network, everything allowed  median {}  p95 {}",
        ms(mo),
        ms(p95(&mut open))
    );
    println!(
        "start, no network (no fence)        median {}  p95 {}",
        ms(mb),
        ms(p95(&mut bare))
    );
    println!(
        "start, no network, no disk limit    median {}  p95 {}",
        ms(mu),
        ms(p95(&mut watched))
    );
    let target = Duration::from_millis(250);
    println!(
        "fence cost (median difference)      {}  target <= {}: {}",
        ms(fence_cost),
        ms(target),
        if fence_cost <= target { "ok" } else { "MISSED" }
    );
    let target = Duration::from_millis(20);
    println!(
        "watchdog cost at start              {}  target <= {}: {}",
        ms(watchdog_cost),
        ms(target),
        if watchdog_cost <= target {
            "ok"
        } else {
            "MISSED"
        }
    );

    // One size check of the watchdog on a busy workspace: the engine walks the writable
    // layer, so its cost grows with the number of files.
    let s = spec("bench-net-size");
    let sb = engine.start(&s).await.unwrap();
    sb.feed_chars(
        "default",
        "mkdir -p many && cd many && for i in $(seq 1 20000); do echo $i > f$i; done; cd ..",
        Duration::from_secs(120),
    )
    .await
    .unwrap();
    let mut checks = Vec::new();
    for _ in 0..10 {
        let t = Instant::now();
        engine
            .docker()
            .inspect_container(
                sb.container_id(),
                Some(bollard::query_parameters::InspectContainerOptions { size: true }),
            )
            .await
            .unwrap();
        checks.push(t.elapsed());
    }
    sb.destroy().await.unwrap();
    let target = Duration::from_millis(500);
    let m = median(&mut checks);
    println!(
        "one disk check, 20,000 files written  median {}  target <= {} (every 10 s): {}",
        ms(m),
        ms(target),
        if m <= target { "ok" } else { "MISSED" }
    );
}
