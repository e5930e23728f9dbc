//! Benchmark (ignored by default; `bash bench/checks.sh` runs it): what kodx adds around a
//! repository's checks (SPEC §11), against the issue's target of at most 50 ms per check.
//!
//! 1. **Per check**, on the real engine: attempts of three trivial checks (`true`) through
//!    `kodx::checks::run_checks`, the same code the agent loop calls. A check's time is
//!    kodx's own around a command that costs nothing: the batch to the sandbox's check
//!    runner (no engine exec: the runner's was started with the sandbox), the `bash -c` it
//!    starts, the frames back, the result. (The second figure, the attempt's wall time per
//!    check, adds the loop.) Beside it, the path kodx takes without a runner: one engine
//!    exec per check (`run_to_end`: create, start, read to the end, the exit code from the
//!    engine).
//! 2. **End to end**: `/kodx code` through the real `kodx serve`, webhook → pull request
//!    opened, on the test repository with three checks declared, beside the same run
//!    without checks (medians), and the difference per check.

use crate::common;

use std::time::{Duration, Instant};

use crate::stats::{median, p95, verdict};
use common::serve::{text, tool, usage, Served, REPO};
use kodx::checks::{run_checks, CheckSpec};
use kodx::sandbox::Sandbox as _;

fn trivial(n: usize) -> Vec<CheckSpec> {
    (0..n)
        .map(|i| CheckSpec {
            name: format!("check{i}"),
            run: "true".into(),
            timeout_secs: 60,
        })
        .collect()
}

#[tokio::test]
#[ignore]
async fn checks_overhead() {
    let engine = common::require_engine!();
    let attempts: usize = std::env::var("KODX_BENCH_ATTEMPTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let mut spec = common::spec("bench-checks");
    // A run with checks: its check runner starts with the sandbox.
    spec.checks_ahead = true;
    let sb = common::start(&engine, &spec).await;
    let checks = trivial(3);
    let mut per_check = Vec::new();
    let mut per_check_with_shell = Vec::new();
    let mut per_exec = Vec::new();
    // One attempt to warm the engine's exec path up, not counted.
    let deadline = Instant::now() + Duration::from_secs(600);
    run_checks(&sb, &checks, 0, deadline, |_| {}).await;
    sb.run_to_end("true", Duration::from_secs(60), 4096)
        .await
        .unwrap();
    for attempt in 1..=attempts {
        let started = Instant::now();
        let results = run_checks(&sb, &checks, attempt as u32, deadline, |_| {}).await;
        let wall = started.elapsed().as_secs_f64() * 1000.0;
        assert!(results.iter().all(|r| r.passed), "{results:#?}");
        for r in &results {
            per_check.push(r.duration_ms as f64);
        }
        per_check_with_shell.push(wall / checks.len() as f64);
        // The same checks, one engine exec each (kodx without a runner).
        for c in &checks {
            let started = Instant::now();
            let done = sb
                .run_to_end(&c.run, Duration::from_secs(60), 4096)
                .await
                .unwrap();
            assert_eq!(done.exit_code, Some(0), "{done:?}");
            per_exec.push(started.elapsed().as_secs_f64() * 1000.0);
        }
    }
    sb.destroy().await.unwrap();
    let (m, p) = (median(per_check.clone()), p95(per_check));
    let (ms, ps) = (
        median(per_check_with_shell.clone()),
        p95(per_check_with_shell),
    );
    let (me, pe) = (median(per_exec.clone()), p95(per_exec));
    println!("checks overhead, {attempts} attempts of 3 checks (`true`) on the real engine:");
    println!(
        "  per check (the runner: batch in, bash -c, frames out, result): median {m:.1} ms, p95 {p:.1} ms  [target ≤ 50 ms: {}]",
        verdict(m, 50.0)
    );
    println!(
        "  per check, the attempt's wall time / 3: median {ms:.1} ms, p95 {ps:.1} ms  [target ≤ 50 ms: {}]",
        verdict(ms, 50.0)
    );
    println!(
        "  for comparison, one engine exec per check (no runner): median {me:.1} ms, p95 {pe:.1} ms"
    );
}

/// Webhook → pull request opened for one `/kodx code` on issue `number`, and its
/// `verifier` phase (what the checks' own sandbox added), in ms.
async fn code_once(s: &Served, number: u64) -> (f64, f64) {
    s.model
        .reply(tool("echo x >> bench.txt"), "tool_use", usage(1000, 10));
    s.model.reply(text("Done."), "end_turn", usage(1000, 10));
    let before = s.github.created_pulls(REPO).len();
    let started = Instant::now();
    let run = s.comment(number, "alice", "/kodx code bench").await;
    s.until("the pull request", || {
        (s.github.created_pulls(REPO).len() > before).then_some(())
    })
    .await;
    let took = started.elapsed().as_secs_f64() * 1000.0;
    let db = s.db().await;
    let verifier = loop {
        let r = db.get_run(&run.0).await.unwrap().unwrap();
        if r.status.is_final() {
            let result: serde_json::Value =
                serde_json::from_str(r.result.as_deref().unwrap_or("{}")).unwrap();
            break result["timings_ms"]["verifier"].as_f64().unwrap_or(0.0);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    db.close().await;
    (took, verifier)
}

#[tokio::test]
#[ignore]
async fn three_checks_end_to_end() {
    let _engine = common::require_engine!();
    let runs: usize = std::env::var("KODX_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5);
    let s = Served::with_workers().await;
    let mut without = Vec::new();
    let mut with = Vec::new();
    let mut verifiers = Vec::new();
    // Every issue first: the pull requests are numbered after them.
    let mut number = 100;
    for n in 101..=100 + 2 * runs as u64 {
        s.github.add_issue(REPO, n, "Bench", "", "carol");
    }
    for _ in 0..runs {
        s.git.commit_on_branch(
            REPO,
            "main",
            &[(".github/kodx.yml", b"{}\n", 0o644)],
            "no checks",
        );
        number += 1;
        without.push(code_once(&s, number).await.0);
        s.git.commit_on_branch(
            REPO,
            "main",
            &[(
                ".github/kodx.yml",
                b"checks:\n  - { name: a, run: \"true\" }\n  - { name: b, run: \"true\" }\n  - { name: c, run: \"true\" }\n",
                0o644,
            )],
            "three checks",
        );
        number += 1;
        let (took, verifier) = code_once(&s, number).await;
        with.push(took);
        verifiers.push(verifier);
    }
    // The Check Run follows the pull request.
    s.until("a Check Run per run with checks", || {
        (s.github.check_runs().len() == runs).then_some(())
    })
    .await;
    let (a, b, v) = (median(without), median(with), median(verifiers));
    let per_check = (b - a - v) / 3.0;
    println!("webhook → pull request, {runs} runs each (medians), test repository:");
    println!("  without checks: {a:.0} ms");
    println!("  with three checks: {b:.0} ms (+{:.0} ms)", b - a);
    println!(
        "    of which the checks' own sandbox: {v:.0} ms (made on demand: the scripted model ends its turn at once; the verifier benchmark measures it made ahead)  [target ≤ 1000 ms: {}]",
        verdict(v, 1000.0)
    );
    println!(
        "    the rest, per check: {per_check:.1} ms (Check Run included)  [target ≤ 50 ms per check: {}]",
        verdict(per_check, 50.0)
    );
}
