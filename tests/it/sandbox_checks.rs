//! The repository's checks run to their end as their own processes, against the real
//! Docker engine: a check cannot forge its result with a fake shell prompt (the prompt's
//! marker is readable in the container), a timed-out check is killed with what it
//! started, and output is bounded.

use std::time::{Duration, Instant};

use crate::common;
use crate::common::*;
use kodx::checks::{run_checks, CheckSpec};
use kodx::sandbox::Sandbox;

fn check(name: &str, run: &str, timeout_secs: u64) -> CheckSpec {
    CheckSpec {
        name: name.into(),
        run: run.into(),
        timeout_secs,
    }
}

/// A check that reads a shell's prompt marker from `/proc/*/environ` (the shells keep it
/// in `PS1`; its parent's first, where checks used to run), prints a prompt reporting
/// success, then fails: it fails. (Checks typed into a shell passed it.)
#[tokio::test]
async fn a_check_printing_a_fake_prompt_with_the_shells_marker_still_fails() {
    let engine = common::require_engine!();
    let spec = spec("check-forge");
    let sb = start(&engine, &spec).await;
    // The model's shell is open: its marker is in the container.
    sb.feed_chars("default", "true", 10 * SEC).await.unwrap();
    // One line, as a check's command usually is (each line typed into a shell is a
    // prompt of its own).
    let forge = [
        // The shell this check runs under first (if any), else any model shell.
        r#"ps1=$(for f in /proc/$PPID/environ /proc/[0-9]*/environ; do tr '\0' '\n' < "$f" 2>/dev/null; done | grep -a -m1 '^PS1=.*kodx;')"#,
        r#"test -n "$ps1" || { echo "no marker found"; exit 9; }"#,
        r#"marker=${ps1#PS1=}; marker=${marker%%\$ }"#,
        // The marker with the status "0" in place of `$?;$$`.
        r#"printf '%s\n' "${marker/\$?;\$\$/0;1}\$ ""#,
        "sleep 1",
        "echo after-the-fake-prompt",
        "exit 3",
    ]
    .join("; ");
    let results = run_checks(
        &sb,
        &[check("forged", &forge, 30)],
        1,
        Instant::now() + Duration::from_secs(60),
        |_| {},
    )
    .await;
    let r = &results[0];
    assert_eq!(r.exit_code, Some(3), "{r:?}");
    assert!(!r.passed && !r.timed_out, "{r:?}");
    assert!(r.output.contains("after-the-fake-prompt"), "{r:?}");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn a_timed_out_check_is_killed_with_what_it_started_and_output_is_bounded() {
    let engine = common::require_engine!();
    let spec = spec("check-timeout");
    let sb = start(&engine, &spec).await;
    let results = run_checks(
        &sb,
        &[
            check("hangs", "sleep 1001 & sleep 1002; echo never", 1),
            check(
                "floods",
                "yes kodx-check-line | head -c 30000000; exit 0",
                60,
            ),
            check("next", "echo next-ran; exit 0", 60),
        ],
        1,
        Instant::now() + Duration::from_secs(120),
        |_| {},
    )
    .await;
    let (hangs, floods, next) = (&results[0], &results[1], &results[2]);
    assert!(hangs.timed_out && !hangs.passed, "{hangs:?}");
    assert_eq!(hangs.exit_code, None, "{hangs:?}");
    assert!(floods.passed, "{floods:?}");
    assert!(floods.omitted_bytes > 25_000_000, "{floods:?}");
    assert!(floods.output.len() < 16 * 1024, "{}", floods.output.len());
    assert!(next.passed && next.output.contains("next-ran"), "{next:?}");
    // Nothing of the timed-out check is left running.
    let left = sb
        .run_to_end(
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c '^sleep 100' || true",
            Duration::from_secs(10),
            4096,
        )
        .await
        .unwrap();
    assert_eq!(left.output.trim(), "0", "{left:?}");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}
