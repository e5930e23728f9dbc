//! Stress figure (ignored by default): how a run's transcript grows with its length.
//!
//! `cargo test --release --test bench -- --ignored --nocapture stress_transcripts::` (the
//! figures are byte counts: a debug build gives the same)
//!
//! Runs the real `kodx run --transcript` against a scripted model for 6, 25 and 50 steps,
//! each step a command printing ~6.9 KB, and prints the bytes written against the distinct
//! content the model was sent: every distinct message of every request (as sent, without
//! cache markers), the system prompt and the tools once. Past ~25 steps the oldest tool
//! results are elided from the requests to fit the context window, so the last request is
//! no longer the whole conversation; the transcript still holds each original once.
//! Target: the transcript stays within 1.5× the distinct content, at every length.
//! For comparison it prints what the earlier format (every request stored whole) would
//! have written for the same run, computed from the replayed requests.

use crate::common;

use std::process::Stdio;

use common::fake_anthropic::FakeAnthropic;
use serde_json::{json, Value};

const KEY: &str = "sk-ant-bench-0123456789";

async fn run(steps: usize) -> (usize, usize, usize) {
    let fake = FakeAnthropic::start(KEY).await;
    for step in 1..=steps {
        fake.reply(
            vec![
                json!({"type": "tool_use", "id": format!("t{step}"), "name": "feed_chars",
                        "input": {"chars": format!("seq {step} 1500")}}),
            ],
            "tool_use",
            json!({"input_tokens": 1000, "output_tokens": 20,
                   "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}),
        );
    }
    fake.reply(
        vec![json!({"type": "text", "text": "Done."})],
        "end_turn",
        json!({"input_tokens": 1000, "output_tokens": 10,
               "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}),
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.jsonl");
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kodx"))
        .env("ANTHROPIC_BASE_URL", &fake.url)
        .env("ANTHROPIC_API_KEY", KEY)
        .env("KODX_IMAGE", common::image())
        .args(["run", "-p", "Count", "--repo-dir", "", "--quiet"])
        .args(["--max-iterations", "100", "--cost-limit", "5"])
        .arg("--transcript")
        .arg(&path)
        .stdin(Stdio::null())
        .output()
        .await
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let requests = kodx::transcript::requests(lines.iter().copied()).unwrap();
    let received = fake.requests();
    assert_eq!(requests.len(), received.len());
    for (r, got) in requests.iter().zip(&received) {
        assert_eq!(kodx::providers::anthropic::request_body(r), got.body);
    }
    let mut seen = std::collections::HashSet::new();
    let mut distinct = 0;
    for (i, got) in received.iter().enumerate() {
        let mut body = got.body.clone();
        if i == 0 {
            distinct += body["system"].to_string().len() + body["tools"].to_string().len();
        }
        for m in body["messages"].as_array_mut().unwrap() {
            for block in m["content"].as_array_mut().unwrap() {
                block.as_object_mut().unwrap().remove("cache_control");
            }
            let text = m.to_string();
            if seen.insert(text.clone()) {
                distinct += text.len();
            }
        }
    }
    // The earlier format: each request whole, the other records about as now.
    let others: usize = lines
        .iter()
        .filter(|l| serde_json::from_str::<Value>(l).unwrap()["type"] != "request")
        .map(|l| l.len())
        .sum();
    let whole: usize = requests
        .iter()
        .map(|r| serde_json::to_string(r).unwrap().len())
        .sum();
    (text.len(), distinct, whole + others)
}

#[tokio::test]
#[ignore]
async fn transcript_growth() {
    let _engine = common::require_engine!();
    let mut all_ok = true;
    for steps in [6, 25, 50] {
        let (stored, distinct, old) = run(steps).await;
        let ratio = stored as f64 / distinct as f64;
        let ok = ratio <= 1.5;
        all_ok &= ok;
        println!(
            "{steps:>3} steps: transcript {:>8} bytes, distinct content sent {:>8} bytes, ratio {ratio:.2}  target <= 1.50: {}   (earlier format: {:>9} bytes, {:.1}x)",
            stored,
            distinct,
            if ok { "ok" } else { "MISSED" },
            old,
            old as f64 / distinct as f64
        );
    }
    assert!(all_ok);
}
