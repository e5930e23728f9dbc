//! Stress figures for the workspace tars (issue 9): the peak memory (VmHWM) of the real
//! `kodx run` process while huge files cross the container boundary, against the target
//! of 200 MB. Against the scripted fake Anthropic and the real Docker engine.
//!
//! cargo test --release --test bench -- --ignored --nocapture stress_tar::
//!
//! `KODX_STRESS_BIN=/path/to/kodx` measures another build (e.g. the original code).

use crate::common;

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::stats::vm_hwm_kb;
use common::fake_anthropic::FakeAnthropic;
use common::serve::usage;
use common::*;
use serde_json::json;

const KEY: &str = "sk-ant-stress-0123456789";
const TARGET_MB: u64 = 200;

struct Outcome {
    peak_mb: u64,
    took: Duration,
    code: Option<i32>,
    notes: Vec<String>,
}

/// Runs `kodx run` in `repo` with a model that types `command` and ends its turn;
/// samples VmHWM every 20 ms until the process exits.
async fn run(bin: &str, repo: &Path, command: &str, export: Option<&Path>) -> Outcome {
    let fake = FakeAnthropic::start(KEY).await;
    fake.reply(
        vec![json!({"type": "tool_use", "id": "t1", "name": "feed_chars",
                    "input": {"chars": command, "yield_time_ms": 120000}})],
        "tool_use",
        usage(1000, 20),
    );
    fake.reply(
        vec![json!({"type": "text", "text": "Done."})],
        "end_turn",
        usage(1100, 5),
    );
    let mut cmd = tokio::process::Command::new(bin);
    cmd.env("ANTHROPIC_BASE_URL", &fake.url)
        .env("ANTHROPIC_API_KEY", KEY)
        .env("KODX_IMAGE", image())
        .env_remove("KODX_PRICING")
        .args(["run", "-p", "Do the thing.", "--timeout", "600"])
        .arg("--repo-dir")
        .arg(repo)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    if let Some(dir) = export {
        cmd.arg("--export-dir").arg(dir);
    }
    let started = Instant::now();
    let mut child = cmd.spawn().expect("spawning kodx");
    let pid = child.id().expect("a pid");
    let stderr = child.stderr.take().unwrap();
    let reading = tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut text = String::new();
        let mut stderr = stderr;
        let _ = stderr.read_to_string(&mut text).await;
        text
    });
    let mut peak_kb = 0;
    let status = loop {
        if let Some(kb) = vm_hwm_kb(pid) {
            peak_kb = kb;
        }
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let took = started.elapsed();
    let stderr = reading.await.unwrap();
    let notes = stderr
        .lines()
        .filter(|l| l.starts_with("kodx:"))
        .map(str::to_string)
        .collect();
    Outcome {
        peak_mb: peak_kb / 1024,
        took,
        code: status.code(),
        notes,
    }
}

/// Prints the case's figures; true when its peak is within the target and it ended as
/// expected: exit 0, or (when `refusal` names a file) a `kodx:` line naming that file.
fn report(case: &str, o: &Outcome, refusal: Option<&str>) -> bool {
    let outcome_ok =
        o.code == Some(0) || refusal.is_some_and(|file| o.notes.iter().any(|n| n.contains(file)));
    let verdict = if o.peak_mb <= TARGET_MB {
        "ok"
    } else {
        "MISSED"
    };
    println!("{case}");
    println!(
        "  peak RSS {} MB  target <= {TARGET_MB} MB: {verdict}   ({:.1} s, exit {:?})",
        o.peak_mb,
        o.took.as_secs_f64(),
        o.code
    );
    for note in &o.notes {
        println!("  {note}");
    }
    println!(
        "  outcome: {}",
        if outcome_ok { "normal" } else { "UNEXPECTED" }
    );
    o.peak_mb <= TARGET_MB && outcome_ok
}

#[tokio::test]
#[ignore = "stress figures: cargo test --release --test bench -- --ignored --nocapture stress_tar::"]
async fn stress_workspace_tars() {
    let _engine = common::require_engine!();
    let mut missed = Vec::new();
    let bin =
        std::env::var("KODX_STRESS_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_kodx").to_string());
    println!("\nkodx binary: {bin}");

    // (1) The model makes a 2.3 GB sparse file in the workspace; the workspace is exported.
    let repo = tempfile::tempdir().unwrap();
    std::fs::write(repo.path().join("README.md"), "# small\n").unwrap();
    let out = tempfile::tempdir().unwrap();
    let o = run(
        &bin,
        repo.path(),
        "truncate -s 2300M big.bin && ls -ls big.bin",
        Some(&out.path().join("export")),
    )
    .await;
    let case = "(1) 2.3 GB sparse file made in the workspace, --export-dir";
    if !report(case, &o, Some("big.bin")) {
        missed.push(case);
    }

    // (2) A 1.5 GB file in the repository (sparse on the host) is copied in.
    let repo = tempfile::tempdir().unwrap();
    std::fs::write(repo.path().join("README.md"), "# big\n").unwrap();
    std::fs::File::create(repo.path().join("data.bin"))
        .unwrap()
        .set_len(1536 << 20)
        .unwrap();
    let o = run(&bin, repo.path(), "ls -l data.bin", None).await;
    let case = "(2) 1.5 GB file in the repository, copied in";
    if !report(case, &o, Some("data.bin")) {
        missed.push(case);
    }
    drop(repo);

    // (3) 120 MB of ignored build output under target/, --export-dir.
    let repo = tempfile::tempdir().unwrap();
    std::fs::write(repo.path().join(".gitignore"), "target/\n").unwrap();
    std::fs::write(repo.path().join("main.rs"), "fn main() {}\n").unwrap();
    let out = tempfile::tempdir().unwrap();
    let o = run(
        &bin,
        repo.path(),
        "mkdir -p target && head -c 120M /dev/urandom > target/app.bin && echo '// x' >> main.rs",
        Some(&out.path().join("export")),
    )
    .await;
    let case = "(3) 120 MB ignored file under target/, --export-dir";
    if !report(case, &o, None) {
        missed.push(case);
    }
    assert!(missed.is_empty(), "missed: {missed:?}");
}
