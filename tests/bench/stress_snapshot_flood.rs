//! Stress figure for the snapshot's tar (issue 36, item 2): the peak memory (VmHWM) of the
//! real `kodx serve` while a sandbox tries to replace kodx's helper with a program that
//! sends a tar flood as the workspace's snapshot, against the target of 300 MB. Without the
//! bound in front of the `tar` crate a 1.25 GiB PAX header took `kodx serve` to 1.3 GB;
//! since the helper runs from a read-only volume the replacement fails, and the case
//! measures the attempt (docs/benchmarks.md).
//!
//! cargo test --release --test bench -- --ignored --nocapture stress_snapshot_flood::
//!
//! A `/kodx code` run on an issue through the real `kodx serve` (this build's binary), a
//! fake GitHub, a real git server, the scripted fake Anthropic and the real Docker engine:
//! the repository's setup script tries to put a flood writer where the helper is, before the
//! snapshot's exec is started ahead (a code run's change set comes from the snapshot; `kodx
//! run` exports the whole workspace through the engine and never runs the helper's
//! snapshot). The model writes one file. Two floods: a 1.25 GiB PAX header and a 1.25 GiB
//! GNU long name. The run must still open its pull request with exactly that file (the
//! refused snapshot is replaced by the whole workspace read back), or end with a clear
//! error; it must not take kodx's memory with it.

use crate::common;

use std::time::Instant;

use crate::stats::vm_hwm_kb;
use common::serve::{text, tool, usage, Served, REPO};
use common::tar_flood::{Flood, FLOOD_BYTES};

const TARGET_MB: u64 = 300;

/// One code run with `flood` as the snapshot; prints its figures, true when within target.
async fn case(flood: Flood, name: &str) -> bool {
    let mut s = Served::with_workers().await;
    s.github
        .add_issue(REPO, 7, "Add a greeting", "We need hello.txt.", "carol");
    let setup = flood.replace_helper();
    s.github.set_file(
        REPO,
        ".github/kodx.yml",
        &format!("setup_script: |\n  {setup}\n  echo set up\n"),
    );
    s.model
        .reply(tool("echo hello > hello.txt"), "tool_use", usage(1000, 10));
    s.model
        .reply(text("Added hello.txt."), "end_turn", usage(1100, 10));
    let started = Instant::now();
    s.comment(7, "alice", "/kodx code add hello.txt").await;
    let body = s
        .bot_comment_where(7, "the run to finish", |c| {
            c.body.contains("✅") || c.body.contains("❌")
        })
        .await
        .body;
    let took = started.elapsed();
    // The high-water mark of the whole process, taken before it stops.
    let peak_kb = vm_hwm_kb(s.kodx_pid()).unwrap_or(0);
    let log = s.log();
    let refused: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("the workspace's snapshot failed"))
        .collect();
    let pulls = s.github.created_pulls(REPO);
    let branch_has_hello = pulls.first().is_some_and(|pr| {
        s.git.file_at(REPO, &pr.head, "hello.txt").as_deref() == Some(&b"hello\n"[..])
    });
    let outcome_ok = (body.contains("✅ done") && pulls.len() == 1 && branch_has_hello)
        || (body.contains("❌") && body.contains("unsafe archive"));
    s.finish().await;

    let peak_mb = peak_kb / 1024;
    let verdict = if peak_mb <= TARGET_MB { "ok" } else { "MISSED" };
    println!("{name}");
    println!(
        "  peak RSS {peak_mb} MB  target <= {TARGET_MB} MB: {verdict}   ({:.1} s)",
        took.as_secs_f64()
    );
    match refused.as_slice() {
        [] => println!("  the snapshot was not refused (the replaced helper did not run)"),
        lines => {
            for line in lines {
                let at = line.find("the workspace's snapshot failed").unwrap_or(0);
                println!("  kodx: {}", &line[at..]);
            }
        }
    }
    println!(
        "  outcome: {}",
        if outcome_ok {
            "normal (the pull request holds exactly hello.txt)"
        } else {
            "UNEXPECTED"
        }
    );
    if !outcome_ok {
        println!("  status comment: {body}");
    }
    peak_mb <= TARGET_MB && outcome_ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "stress figure: cargo test --release --test bench -- --ignored --nocapture stress_snapshot_flood::"]
async fn stress_snapshot_flood() {
    let _engine = common::require_engine!();
    println!("\nkodx binary: {}", env!("CARGO_BIN_EXE_kodx"));
    let gib = FLOOD_BYTES as f64 / f64::from(1 << 30);
    let mut missed = Vec::new();
    for (flood, name) in [
        (
            Flood::Pax,
            format!("(1) a {gib} GiB PAX header as the snapshot"),
        ),
        (
            Flood::LongName,
            format!("(2) a {gib} GiB GNU long name as the snapshot"),
        ),
    ] {
        if !case(flood, &name).await {
            missed.push(name);
        }
    }
    assert!(missed.is_empty(), "missed: {missed:?}");
}
