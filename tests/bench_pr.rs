//! Benchmark (ignored by default; `bash bench/pr-latency.sh` runs it): webhook → pull
//! request opened, with a scripted model that answers at once, on a small repository and on
//! one of 20,000 files. Prints the medians of each phase of the run (from the timings kodx
//! stores with every run) and of the whole, as seen from outside.

mod common;

use std::time::{Duration, Instant};

use common::serve::{delivery_id, issue_comment, IssueComment, Served, REPO};
use serde_json::{json, Value};

fn usage() -> Value {
    json!({"input_tokens": 1000, "output_tokens": 10,
           "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0})
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

async fn measure(label: &str, s: &Served, runs: usize) -> Vec<(String, f64)> {
    let db = kodx::db::Db::open(&format!(
        "sqlite://{}",
        s.dir.path().join("kodx.db").display()
    ))
    .await
    .unwrap();
    let mut totals = Vec::new();
    let mut phases: std::collections::BTreeMap<String, Vec<f64>> = Default::default();
    for i in 0..runs {
        let number = 100 + i as u64;
        s.github.add_issue(REPO, number, "Bench", "", "carol");
        s.model.reply(
            vec![
                json!({"type": "tool_use", "id": format!("t{i}"), "name": "feed_chars",
                        "input": {"chars": format!("echo {i} > bench-{i}.txt")}}),
            ],
            "tool_use",
            usage(),
        );
        s.model.reply(
            vec![json!({"type": "text", "text": "Wrote the file."})],
            "end_turn",
            usage(),
        );
        let before = s.github.created_pulls(REPO).len();
        let body = format!("/kodx code write bench-{i}.txt");
        let id = s.github.add_comment(REPO, number, "alice", &body, false);
        let payload = issue_comment(&IssueComment {
            clone_url: &s.clone_url,
            number,
            comment_id: id,
            body: &body,
            ..IssueComment::default()
        });
        let started = Instant::now();
        let (status, answer) = s.deliver("issue_comment", &delivery_id(), &payload).await;
        assert_eq!(status, 202, "{answer}");
        let run_id = answer["run_id"].as_str().unwrap().to_string();
        while s.github.created_pulls(REPO).len() == before {
            assert!(
                started.elapsed() < Duration::from_secs(300),
                "no PR:\n{}",
                s.log()
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        totals.push(started.elapsed().as_secs_f64() * 1000.0);
        // The run's own timings, once it is recorded.
        let result = loop {
            let run = db.get_run(&run_id).await.unwrap().unwrap();
            if run.status.is_final() {
                break run.result.unwrap_or_default();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let result: Value = serde_json::from_str(&result).unwrap();
        for (phase, ms) in result["timings_ms"].as_object().unwrap() {
            phases
                .entry(phase.clone())
                .or_default()
                .push(ms.as_f64().unwrap());
        }
    }
    println!("\n{label}: {runs} runs, medians");
    let mut out = Vec::new();
    for phase in [
        "prepare",
        "clone",
        "container",
        "agent",
        "export",
        "commit",
        "push",
        "pull_request",
    ] {
        if let Some(v) = phases.remove(phase) {
            let m = median(v);
            println!("  {phase:<28} {m:>9.1} ms");
            out.push((phase.to_string(), m));
        }
    }
    let m = median(totals);
    println!("  {:<28} {m:>9.1} ms", "webhook → PR opened (total)");
    out.push(("total".into(), m));
    out
}

#[tokio::test]
#[ignore = "benchmark: bash bench/pr-latency.sh"]
async fn webhook_to_pull_request() {
    let Some(_engine) = common::engine().await else {
        panic!("the benchmark needs the Docker engine and the test images");
    };
    let runs: usize = std::env::var("KODX_BENCH_RUNS")
        .ok()
        .and_then(|r| r.parse().ok())
        .unwrap_or(7);
    let s = Served::with_workers().await;
    let small = measure("small repository (3 files)", &s, runs).await;
    drop(s);

    let s = Served::with_workers().await;
    let contents: Vec<(String, Vec<u8>)> = (0..20_000)
        .map(|i| {
            (
                format!("src/d{}/f{i}.txt", i % 200),
                format!("file {i}\n").into_bytes(),
            )
        })
        .collect();
    let files: Vec<(&str, &[u8], u32)> = contents
        .iter()
        .map(|(p, c)| (p.as_str(), c.as_slice(), 0o644))
        .collect();
    s.git.commit_on_branch(REPO, "main", &files, "20,000 files");
    let large = measure("20,000-file repository", &s, runs.min(5)).await;
    let total = small.iter().find(|(p, _)| p == "total").unwrap().1;
    println!(
        "\ntarget: ≤ 3000 ms end to end on the small repository: {} ({total:.0} ms)",
        if total <= 3000.0 { "ok" } else { "MISSED" }
    );
    let _ = large;
}
