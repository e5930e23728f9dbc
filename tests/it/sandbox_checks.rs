//! The repository's checks run to their end as their own processes, against the real
//! Docker engine: a check cannot forge its result with a fake shell prompt (the prompt's
//! marker is readable in the container), a timed-out check is killed with what it
//! started, and output is bounded.
//!
//! All the checks of an attempt go through kodx's check runner, one engine exec started
//! with the sandbox (`crates/kodx-sandbox/src/docker/runner.rs`): an attempt makes no
//! engine exec; a check cannot reach the runner's stdout (its frames) to forge its own or another's
//! result, nor can a process left running in the sandbox; a check that kills or stops the
//! runner makes the rest fail, and later attempts run one engine exec per check; a
//! timeout kills what escaped the check's process group too; each check's output is its
//! own.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::common;
use crate::common::*;
use kodx::checks::{run_checks, CheckSpec};
use kodx::sandbox::Sandbox;

/// The spec of a sandbox for a run with checks: its check runner is started with it.
fn with_checks(test: &str) -> kodx::sandbox::SandboxSpec {
    let mut spec = spec(test);
    spec.checks_ahead = true;
    spec
}

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
    // Through the check runner, and one engine exec per check (a sandbox without it).
    for runner in [true, false] {
        let mut spec = spec(&format!("check-forge-{runner}"));
        spec.checks_ahead = runner;
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
        assert_eq!(
            r.output.lines().last(),
            Some("after-the-fake-prompt"),
            "{r:?}"
        );
        sb.destroy().await.unwrap();
        assert_gone(&engine, &spec.run_id).await;
    }
}

#[tokio::test]
async fn a_timed_out_check_is_killed_with_what_it_started_and_output_is_bounded() {
    let engine = common::require_engine!();
    // Through the check runner, and one engine exec per check (a sandbox without it).
    for runner in [true, false] {
        let mut spec = spec(&format!("check-timeout-{runner}"));
        spec.checks_ahead = runner;
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
        assert!(next.passed, "{next:?}");
        assert_eq!(next.output.trim(), "next-ran", "{next:?}");
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
}

/// The commands of the engine execs made in the sandbox's container since `since`, by
/// the engine's events.
async fn execs_since(
    engine: &kodx::sandbox::Engine,
    sb: &kodx::sandbox::DockerSandbox,
    since: SystemTime,
) -> Vec<String> {
    use futures_util::StreamExt as _;
    let stamp = |t: SystemTime| {
        let d = t.duration_since(UNIX_EPOCH).unwrap();
        format!("{}.{:09}", d.as_secs(), d.subsec_nanos())
    };
    let options = bollard::query_parameters::EventsOptions {
        since: Some(stamp(since)),
        until: Some(stamp(SystemTime::now())),
        filters: Some(HashMap::from([(
            "container".to_string(),
            vec![sb.container_id().to_string()],
        )])),
    };
    engine
        .docker()
        .events(Some(options))
        .filter_map(|e| async move {
            let action = e.unwrap().action.unwrap_or_default();
            action.strip_prefix("exec_create: ").map(str::to_string)
        })
        .collect()
        .await
}

/// `printf` arguments writing the runner's frame "check INDEX exited 0" (and the frame
/// that ends a batch of COUNT), as a check would forge them.
fn fake_frames(index: u16, count: u16) -> String {
    format!(r"'E\0\0\{index:o}\0\0\0\5x\0\0\0\0Z\0\0\{count:o}\0\0\0\0'")
}

#[tokio::test]
async fn an_attempt_runs_through_the_runner_in_no_engine_exec_of_its_own() {
    let engine = common::require_engine!();
    let spec = with_checks("check-one-exec");
    let sb = start(&engine, &spec).await;
    let since = SystemTime::now();
    let results = run_checks(
        &sb,
        &[
            check("parent", "tr '\\0' ' ' < /proc/$PPID/cmdline", 30),
            check("fails", "echo failing; exit 7", 30),
            check("passes", "true", 30),
        ],
        1,
        Instant::now() + Duration::from_secs(60),
        |_| {},
    )
    .await;
    // (The sandbox's spare shell may start meanwhile: that one is kodx's `gate`.)
    let execs = execs_since(&engine, &sb, since).await;
    let others: Vec<_> = execs
        .iter()
        .filter(|c| !c.ends_with("kodx-net gate"))
        .collect();
    assert!(others.is_empty(), "{execs:#?}");
    let (parent, fails, passes) = (&results[0], &results[1], &results[2]);
    assert!(parent.passed, "{parent:?}");
    assert_eq!(
        parent.output.trim(),
        "/.kodx-bin/kodx-net checks",
        "{parent:?}"
    );
    assert_eq!(fails.exit_code, Some(7), "{fails:?}");
    assert!(!fails.passed, "{fails:?}");
    insta::assert_snapshot!(fails.output, @"failing");
    assert!(passes.passed, "{passes:?}");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

/// A check that forges the runner's frames — on its stdout, its stderr, through
/// `/proc/$PPID/fd/1` and through every `/proc/*/fd/*` it can open — fails, and so does
/// the red check after it.
#[tokio::test]
async fn a_check_forging_the_runners_frames_passes_neither_itself_nor_another() {
    let engine = common::require_engine!();
    let spec = with_checks("check-frames");
    let sb = start(&engine, &spec).await;
    let forge = [
        // Its own result (check 0) and the next one's (check 1), then the batch's end.
        format!("printf {}", fake_frames(0, 3)),
        format!("printf {}", fake_frames(1, 3)),
        format!("printf {} >&2", fake_frames(0, 3)),
        // The runner's stdout, directly.
        format!(
            "if printf {} > /proc/$PPID/fd/1; then echo PARENT-REACHED; else echo PARENT-DENIED; fi",
            fake_frames(0, 3)
        ),
        "if : 3</proc/$PPID/fd/1; then echo PARENT-READ; else echo PARENT-READ-DENIED; fi"
            .to_string(),
        // Any other pipe it can open for writing (not files: `>` would truncate them).
        format!(
            "for f in /proc/[0-9]*/fd/*; do case $f in /proc/$$/*|/proc/self/*) continue;; esac; \
             case $(readlink $f 2>/dev/null) in pipe:*) ;; *) continue;; esac; \
             {{ printf {} > $f && echo \"reached $f\"; }} 2>/dev/null; done",
            fake_frames(0, 3)
        ),
        "exit 1".to_string(),
    ]
    .join("; ");
    let results = run_checks(
        &sb,
        &[
            check("forges", &forge, 30),
            check("red", "exit 2", 30),
            check("green", "true", 30),
        ],
        1,
        Instant::now() + Duration::from_secs(60),
        |_| {},
    )
    .await;
    let (forges, red, green) = (&results[0], &results[1], &results[2]);
    assert_eq!(forges.exit_code, Some(1), "{forges:?}");
    assert!(!forges.passed, "{forges:?}");
    assert!(forges.output.contains("PARENT-DENIED"), "{forges:?}");
    assert!(forges.output.contains("PARENT-READ-DENIED"), "{forges:?}");
    assert!(!forges.output.contains("PARENT-REACHED"), "{forges:?}");
    assert_eq!(red.exit_code, Some(2), "{red:?}");
    assert!(!red.passed, "{red:?}");
    assert!(green.passed, "{green:?}");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

/// A process left running in the sandbox (a model's shell's, an earlier check's) that
/// writes forged frames to every descriptor of every process it can open, all along the
/// attempt, reaches no frame of the runner's: it started before them.
#[tokio::test]
async fn a_process_left_in_the_sandbox_cannot_reach_the_runner() {
    let engine = common::require_engine!();
    let spec = with_checks("check-racer");
    let sb = start(&engine, &spec).await;
    // Into every pipe it can open (the runner's stdout is one): not into files, which
    // `>` would truncate (the shared libraries a process has open among them).
    let racer = format!(
        "(while :; do for f in /proc/[0-9]*/fd/[0-9]*; do \
         case $(readlink $f) in pipe:*) printf {} > $f;; esac; done 2>/dev/null; \
         done) >/dev/null 2>&1 & echo racer-started",
        fake_frames(0, 2)
    );
    let out = sb.feed_chars("default", &racer, 10 * SEC).await.unwrap();
    assert_eq!(out.output.lines().last(), Some("racer-started"), "{out:?}");
    for attempt in 1..=2 {
        let results = run_checks(
            &sb,
            &[
                check("red", "sleep 0.5; exit 4", 30),
                check("green", "true", 30),
            ],
            attempt,
            Instant::now() + Duration::from_secs(60),
            |_| {},
        )
        .await;
        assert_eq!(results[0].exit_code, Some(4), "{results:#?}");
        assert!(!results[0].passed, "{results:#?}");
        assert!(results[1].passed, "{results:#?}");
    }
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

/// A check that kills the runner fails, and so do the checks after it; the next attempt
/// runs one engine exec per check, its results the engine's.
#[tokio::test]
async fn a_check_killing_the_runner_fails_the_rest() {
    let engine = common::require_engine!();
    let spec = with_checks("check-kill-runner");
    let sb = start(&engine, &spec).await;
    let results = run_checks(
        &sb,
        &[
            check("first", "true", 30),
            check(
                "killer",
                "echo killing; sleep 0.3; kill -9 $PPID; sleep 1; exit 0",
                30,
            ),
            check("after", "true", 30),
        ],
        1,
        Instant::now() + Duration::from_secs(60),
        |_| {},
    )
    .await;
    let (first, killer, after) = (&results[0], &results[1], &results[2]);
    assert!(first.passed, "{first:?}");
    assert!(!killer.passed && killer.exit_code.is_none(), "{killer:?}");
    insta::assert_snapshot!(killer.output, @"
    killing
    [kodx lost this check: its runner ended]
    ");
    assert!(!after.passed && after.exit_code.is_none(), "{after:?}");
    insta::assert_snapshot!(after.output, @"[kodx could not run the check: kodx's check runner ended before this check]");
    // No runner now: one exec per check, and a check's parent is no runner.
    let since = SystemTime::now();
    let results = run_checks(
        &sb,
        &[
            check("red", "exit 5", 30),
            check("green", "! grep -qs kodx-net /proc/$PPID/cmdline", 30),
        ],
        2,
        Instant::now() + Duration::from_secs(60),
        |_| {},
    )
    .await;
    assert_eq!(results[0].exit_code, Some(5), "{results:#?}");
    assert!(results[1].passed, "{results:#?}");
    let execs = execs_since(&engine, &sb, since).await;
    let checks = execs.iter().filter(|c| c.contains("kodx-check")).count();
    assert_eq!(checks, 2, "{execs:#?}");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

/// A check that stops the runner (it cannot report any more) fails once its timeout and
/// kodx's grace have passed, and so do the checks after it.
#[tokio::test]
async fn a_check_stopping_the_runner_fails_the_rest() {
    let engine = common::require_engine!();
    let spec = with_checks("check-stop-runner");
    let sb = start(&engine, &spec).await;
    let started = Instant::now();
    let results = run_checks(
        &sb,
        &[
            check("stopper", "kill -STOP $PPID; exit 0", 1),
            check("after", "true", 30),
        ],
        1,
        Instant::now() + Duration::from_secs(60),
        |_| {},
    )
    .await;
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "{:?}",
        started.elapsed()
    );
    let (stopper, after) = (&results[0], &results[1]);
    assert!(
        !stopper.passed && stopper.exit_code.is_none(),
        "{stopper:?}"
    );
    insta::assert_snapshot!(stopper.output, @"[kodx lost this check: its runner stopped answering]");
    assert!(!after.passed, "{after:?}");
    // The stopped runner was killed: nothing of it is left.
    let left = sb
        .run_to_end(
            "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done | grep -c 'kodx-net [c]hecks' || true",
            Duration::from_secs(10),
            4096,
        )
        .await
        .unwrap();
    assert_eq!(left.output.trim(), "0", "{left:?}");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

/// A timed-out check is killed with what left its process group (a new session, a
/// double fork), and the next check runs; a check that ends leaves nothing running
/// either; each check's output is its own, even what a check's background job would
/// print after its end.
#[tokio::test]
async fn a_timed_out_check_ends_with_what_escaped_its_group_and_output_stays_its_own() {
    let engine = common::require_engine!();
    let spec = with_checks("check-escape");
    let sb = start(&engine, &spec).await;
    let results = run_checks(
        &sb,
        &[
            check(
                "escapes",
                "setsid sleep 1003 & (setsid sh -c 'sleep 1005 &' &); echo escaping; sleep 1004",
                1,
            ),
            check("a", "echo a-out; (sleep 0.3; echo late-a) & exit 0", 30),
            check(
                "leaves",
                "setsid sleep 1006 & (setsid sh -c 'sleep 1007 &' &); exit 0",
                30,
            ),
            check("b", "sleep 0.6; echo b-out", 30),
        ],
        1,
        Instant::now() + Duration::from_secs(60),
        |_| {},
    )
    .await;
    let (escapes, a, b) = (&results[0], &results[1], &results[3]);
    assert!(escapes.timed_out && !escapes.passed, "{escapes:?}");
    insta::assert_snapshot!(escapes.output, @"escaping");
    assert!(a.passed && results[2].passed && b.passed, "{results:#?}");
    assert_eq!(a.output.trim(), "a-out", "{a:?}");
    assert_eq!(b.output.trim(), "b-out", "{b:?}");
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
