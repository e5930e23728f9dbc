//! Benchmark (ignored by default; `bash bench/checks.sh` runs it): what running the checks
//! apart from the agent (SPEC §12) adds to each pass, against issue 37's target of at most
//! 1 s on top of the checks themselves.
//!
//! On the real engine, for a small repository and a cargo-sized one (3,270 files): the
//! agent's sandbox is started and changes a few files; each pass then takes the change
//! set out of it and writes it into the checks' sandbox (`FreshSandboxes::checkout`, the
//! code the agent loop calls). Measured two ways:
//! - **made ahead**, as in a run: the checks' sandbox is made while the agent works (here:
//!   while the benchmark waits, as a model's turn would), so a pass waits only for the
//!   change set to be read and written;
//! - **on demand**: the agent ended its turn before the checks' sandbox was made (a run
//!   whose agent answers at once), so the pass also waits for the whole sandbox.

use crate::common;

use std::path::Path;
use std::time::{Duration, Instant};

use crate::stats::{median, verdict};
use kodx::checks::verify::{FreshSandboxes, Verifier};
use kodx::sandbox::{Engine, Sandbox as _, SandboxSpec};

/// A work tree of `files` files of a few KiB in nested directories.
fn tree(dir: &Path, files: usize) {
    for i in 0..files {
        let path = dir.join(format!("src/d{}/e{}/f{i}.rs", i % 40, i % 7));
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let body = format!(
            "// file {i}\n{}",
            "fn x() { let y = 1; }\n".repeat(1 + i % 200)
        );
        std::fs::write(path, body).unwrap();
    }
    std::fs::write(dir.join(".gitignore"), "target/\n").unwrap();
}

/// Overhead of each pass, in ms: `ahead` waits for the checks' sandbox to be made first.
async fn passes(engine: &Engine, spec: &SandboxSpec, n: usize, ahead: bool) -> Vec<f64> {
    let work = engine
        .start(spec)
        .await
        .expect("the agent's sandbox starts");
    let mut out = Vec::new();
    for pass in 0..n {
        let verifier = FreshSandboxes::new(engine.clone(), spec);
        // The agent's turn: a few edited files, one new, one deleted.
        let edit = format!(
            "echo '// pass {pass}' >> src/d1/e1/f1.rs && echo {pass} > NEW-{pass}.md && rm -f src/d2/e2/f{}.rs && mkdir -p target && echo x > target/ignored",
            2 + 40 * 7 * pass
        );
        let done = work
            .feed_chars("default", &edit, Duration::from_secs(30))
            .await;
        assert!(done.is_ok(), "{done:?}");
        if ahead {
            // As long as a model's turn takes, at the least.
            tokio::time::sleep(Duration::from_secs(6)).await;
        }
        let started = Instant::now();
        let checkout = verifier.checkout(&work).await.expect("the checks' sandbox");
        out.push(started.elapsed().as_secs_f64() * 1000.0);
        let seen = checkout
            .sandbox
            .run_to_end(
                &format!("test -f NEW-{pass}.md && test ! -e target/ignored"),
                Duration::from_secs(30),
                1024,
            )
            .await
            .unwrap();
        assert_eq!(seen.exit_code, Some(0), "{seen:?}");
        checkout.sandbox.destroy().await.unwrap();
        verifier.close().await;
    }
    work.destroy().await.unwrap();
    out
}

#[tokio::test]
#[ignore]
async fn verifier_overhead_per_pass() {
    let engine = common::require_engine!();
    // KODX_BENCH_LOG=1: each pass's parts (the change set and the sandbox, the write).
    if std::env::var_os("KODX_BENCH_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("kodx::checks=info")
            .with_writer(std::io::stderr)
            .try_init();
    }
    let n: usize = std::env::var("KODX_BENCH_PASSES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    println!("checks apart from the agent: overhead per pass before the checks start (medians of {n}), real engine {}:", engine.host());
    for (label, files) in [
        ("small repository (3 files)", 3),
        ("cargo-sized repository (3,270 files)", 3270),
    ] {
        let dir = tempfile::tempdir().unwrap();
        tree(dir.path(), files);
        let mut spec = common::spec("bench-verifier");
        spec.repo_dir = Some(dir.path().to_path_buf());
        spec.change_set_ahead = true;
        let ahead = median(passes(&engine, &spec, n, true).await);
        let on_demand = median(passes(&engine, &spec, n, false).await);
        println!("  {label}:");
        println!(
            "    made ahead (the run's case): {ahead:.0} ms  [target ≤ 1000 ms: {}]",
            verdict(ahead, 1000.0)
        );
        println!("    made on demand (an agent that ends at once): {on_demand:.0} ms");
    }
}
