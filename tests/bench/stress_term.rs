//! Stress (ignored by default): kodx's peak memory while commands print output meant to
//! exhaust it. Runs the real `kodx run` binary against the scripted fake Anthropic model and
//! the real Docker engine, samples the kodx process's VmHWM from /proc every 20 ms until it
//! exits, and prints each case's peak against the target with the run's outcome:
//!
//!     cargo test --release --test bench -- --ignored --nocapture stress_term::
//!
//! `KODX_STRESS_BIN=/path/to/kodx` measures another build of kodx (e.g. one from before the
//! terminal decoder was bounded) with the same cases.

use crate::common;

use std::process::Stdio;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::stats::vm_hwm_kb;
use common::fake_anthropic::FakeAnthropic;
use common::serve::usage;
use serde_json::{json, Value};

const KEY: &str = "sk-ant-stress-0123456789";
const TARGET_MB: u64 = 200;

/// A program with a command timeout long enough for 500 MB to pass through the PTY.
const PROGRAM: &str = "model:\n  name: claude-sonnet-4-20250514\n  provider: anthropic\n\
                       limits:\n  command_timeout: 600\n\
                       prompt:\n  system: Stress test.\n";

fn flood(escapes: usize) -> String {
    "\x1b[99999999C".repeat(escapes)
}

struct Case {
    name: &'static str,
    setup: Option<String>,
    /// What the model types, one tool call per step.
    steps: Vec<&'static str>,
    want_stop: &'static str,
}

struct Measured {
    peak_kb: u64,
    stop_reason: String,
    detail: String,
    seconds: f64,
    last_tool_result: String,
}

async fn run(bin: &str, case: &Case) -> Measured {
    let fake = FakeAnthropic::start(KEY).await;
    for (i, chars) in case.steps.iter().enumerate() {
        fake.reply(
            vec![
                json!({"type": "tool_use", "id": format!("t{i}"), "name": "feed_chars",
                        "input": {"chars": chars, "yield_time_ms": 600_000}}),
            ],
            "tool_use",
            usage(1000, 10),
        );
    }
    fake.reply(
        vec![json!({"type": "text", "text": "Done."})],
        "end_turn",
        usage(1000, 10),
    );
    let dir = tempfile::tempdir().unwrap();
    let repo = dir.path().join("repo");
    std::fs::create_dir(&repo).unwrap();
    // 32 KB of escapes that each move the cursor 99,999,999 columns forward.
    std::fs::write(repo.join("flood.txt"), flood(2979)).unwrap();
    let program = dir.path().join("program.yaml");
    std::fs::write(&program, PROGRAM).unwrap();
    let mut cmd = tokio::process::Command::new(bin);
    cmd.env("ANTHROPIC_BASE_URL", &fake.url)
        .env("ANTHROPIC_API_KEY", KEY)
        .env("KODX_IMAGE", common::image())
        .env_remove("KODX_PRICING")
        .arg("run")
        .arg(&program)
        .args(["-p", "stress", "--json", "-q"])
        .arg("--repo-dir")
        .arg(&repo)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(script) = &case.setup {
        let file = dir.path().join("setup.sh");
        std::fs::write(&file, script).unwrap();
        cmd.arg("--setup-script").arg(&file);
    }
    let started = Instant::now();
    let child = cmd.spawn().unwrap();
    let pid = child.id().unwrap();
    // VmHWM only grows; the last value read before the process is reaped is its peak.
    let peak = Arc::new(AtomicU64::new(0));
    let poller = {
        let peak = peak.clone();
        tokio::spawn(async move {
            while let Some(kb) = vm_hwm_kb(pid) {
                peak.fetch_max(kb, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let output = child.wait_with_output().await.unwrap();
    let seconds = started.elapsed().as_secs_f64();
    poller.abort();
    let result: Value = serde_json::from_slice(&output.stdout).unwrap_or_else(|_| {
        json!({"stop_reason": format!("no JSON; exit {:?}; stderr: {}", output.status.code(),
            String::from_utf8_lossy(&output.stderr).chars().take(300).collect::<String>())})
    });
    let last_tool_result = fake
        .requests()
        .last()
        .and_then(|r| {
            r.body["messages"]
                .as_array()?
                .last()?
                .get("content")?
                .as_array()?
                .iter()
                .rev()
                .find(|b| b["type"] == "tool_result")
                .map(|b| b["content"].as_str().unwrap_or_default().to_string())
        })
        .unwrap_or_default();
    Measured {
        peak_kb: peak.load(Ordering::Relaxed),
        stop_reason: result["stop_reason"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        // The lines kodx printed on stderr (it keeps them for --json).
        detail: match &result["stderr"] {
            Value::Array(lines) => lines
                .iter()
                .filter_map(|l| l.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
            other => other.as_str().unwrap_or_default().to_string(),
        },
        seconds,
        last_tool_result,
    }
}

/// The `N` of `[... N bytes of output omitted ...]`, and the bytes kept around the note.
fn cut(text: &str) -> Option<(usize, usize)> {
    let (head, rest) = text.split_once("\n[... ")?;
    let (n, tail) = rest.split_once(" bytes of output omitted ...]\n")?;
    let tail = tail.strip_suffix("\n[exit status: 0]")?;
    Some((n.replace(',', "").parse().ok()?, head.len() + tail.len()))
}

#[tokio::test]
#[ignore = "stress: cargo test --release --test bench -- --ignored --nocapture stress_term::"]
async fn memory_stays_bounded_under_hostile_output() {
    let Some(_engine) = common::engine().await else {
        panic!("the stress test needs the Docker engine and the test images");
    };
    let bin =
        std::env::var("KODX_STRESS_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_kodx").to_string());
    let setup_flood = format!("printf '%s' '{}'\necho\necho set up\n", flood(3000));
    let cases = vec![
        Case {
            name: "baseline: one echo",
            setup: None,
            steps: vec!["echo hi"],
            want_stop: "end_turn",
        },
        Case {
            name: "cat of a 32 KB file of ESC[99999999C, 3 times",
            setup: None,
            steps: vec!["cat flood.txt", "cat flood.txt", "cat flood.txt"],
            want_stop: "end_turn",
        },
        Case {
            name: "500 MB without a newline",
            setup: None,
            steps: vec!["head -c 500000000 /dev/zero | tr '\\0' a"],
            want_stop: "end_turn",
        },
        Case {
            name: "setup script printing 33 KB of ESC[99999999C",
            setup: Some(setup_flood.clone()),
            steps: vec!["echo hi"],
            want_stop: "end_turn",
        },
        Case {
            name: "the same setup script, failing (exit 4)",
            setup: Some(format!("{setup_flood}exit 4\n")),
            steps: vec![],
            want_stop: "setup_failed",
        },
    ];
    println!("\nkodx binary: {bin}");
    let mut failures = Vec::new();
    for case in &cases {
        let m = run(&bin, case).await;
        let mb = m.peak_kb / 1024;
        let fits = mb <= TARGET_MB;
        let mut outcome_ok = m.stop_reason == case.want_stop;
        let mut note = String::new();
        if case.name.starts_with("500 MB") {
            // What the model got: head + note + tail, the note's count exact.
            match cut(&m.last_tool_result) {
                Some((n, kept)) if n + kept == 500_000_000 => {
                    note = format!(", model got {} bytes, {n} noted as omitted", kept)
                }
                other => {
                    outcome_ok = false;
                    note = format!(", model's output not cut as expected: {other:?}");
                }
            }
        }
        if case.name.starts_with("cat of") {
            // As a 1000-column terminal shows it: blanks up to the last column.
            let want = format!("{}\n[exit status: 0]", " ".repeat(999));
            if m.last_tool_result != want {
                outcome_ok = false;
                note = format!(
                    ", model got {:?}",
                    m.last_tool_result.chars().take(100).collect::<String>()
                );
            }
        }
        if case.want_stop == "setup_failed" {
            let line = m.detail.lines().count();
            note = format!(", message of {} bytes, {line} lines", m.detail.len());
            outcome_ok &= m.detail.contains("exit code 4")
                && m.detail.contains("set up")
                && m.detail.len() <= 10_000;
        }
        println!(
            "{:<48} peak RSS {mb:>5} MB  target <= {TARGET_MB} MB: {}   outcome {} ({}{note}), {:.1} s",
            case.name,
            if fits { "ok" } else { "MISSED" },
            m.stop_reason,
            if outcome_ok { "normal" } else { "UNEXPECTED" },
            m.seconds,
        );
        if !fits || !outcome_ok {
            failures.push(case.name);
        }
    }
    assert!(failures.is_empty(), "missed: {failures:?}");
}
