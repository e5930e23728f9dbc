//! Hostile output against the real Docker engine: escape floods and lines without end, from
//! a shell and from the setup script. The output is capped with an exact note, and kodx's
//! memory does not grow with what was printed (the sandbox runs in this test's process; the
//! figures themselves are in tests/bench/stress_term.rs).

use std::time::Duration;

use crate::common;
use crate::common::*;
use kodx::sandbox::{Sandbox, SandboxError, ShellStatus};

/// Far below what keeping the output would take (hundreds of MB to GB on the code before
/// the bound), far above what the decoder's buffers and one chunk in flight need.
const GROWTH_LIMIT: usize = 150 << 20;

fn assert_bounded(before: usize, what: &str) {
    let grown = peak_rss().saturating_sub(before);
    assert!(
        grown <= GROWTH_LIMIT,
        "{what}: peak memory grew by {} MB",
        grown >> 20
    );
}

/// The parts of a capped output: head, the note's count, tail.
fn cut(output: &str) -> (&str, usize, &str) {
    let (head, rest) = output.split_once("\n[... ").expect("a note");
    let (n, tail) = rest.split_once(" bytes of output omitted ...]\n").unwrap();
    (head, n.replace(',', "").parse().unwrap(), tail)
}

#[tokio::test]
async fn cat_of_a_cursor_escape_flood_stays_one_screen_line() {
    let engine = common::require_engine!();
    let spec = spec("esc-flood");
    let sb = start(&engine, &spec).await;
    // 3,000 escapes, 33 KB: each moves the cursor 99,999,999 columns forward.
    let out = sb
        .feed_chars(
            "default",
            "printf '\\033[99999999C%.0s' $(seq 1 3000) > flood.txt; wc -c < flood.txt",
            30 * SEC,
        )
        .await
        .unwrap();
    assert_eq!(out.output, "33000\n", "{out:?}");
    let before = peak_rss();
    for _ in 0..3 {
        let out = sb
            .feed_chars("default", "cat flood.txt; echo; echo after", 60 * SEC)
            .await
            .unwrap();
        assert_eq!(out.status, ShellStatus::Ready { exit_code: Some(0) });
        // As a 1000-column terminal shows it: blanks up to the last column, then the text.
        assert_eq!(out.output, format!("{}\nafter\n", " ".repeat(999)));
        assert_eq!(out.omitted_bytes, 0);
    }
    assert_bounded(before, "cat of an escape flood");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn a_line_of_100_mb_is_cut_in_the_middle_with_an_exact_count() {
    let engine = common::require_engine!();
    let mut spec = spec("endless-line");
    spec.output_cap = 10_000;
    let sb = start(&engine, &spec).await;
    let before = peak_rss();
    let out = sb
        .feed_chars(
            "default",
            "printf start; head -c 100000000 /dev/zero | tr '\\0' a; printf end",
            120 * SEC,
        )
        .await
        .unwrap();
    assert_bounded(before, "a 100 MB line");
    assert_eq!(
        out.status,
        ShellStatus::Ready { exit_code: Some(0) },
        "{}",
        &out.output[..out.output.len().min(300)]
    );
    let (head, n, tail) = cut(&out.output);
    assert!(head.starts_with("startaaa"), "{}", &head[..20]);
    assert!(tail.ends_with("aaaend"), "{}", &tail[tail.len() - 20..]);
    assert_eq!(n, out.omitted_bytes);
    assert_eq!(head.len() + n + tail.len(), 100_000_000 + 8);
    assert!(out.output.len() < 11_000, "{}", out.output.len());
    // The shell is fine afterwards.
    let out = sb.feed_chars("default", "echo ok", 10 * SEC).await.unwrap();
    assert_eq!(out.output, "ok\n");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn a_setup_script_printing_an_escape_flood_fails_with_a_short_tail() {
    let engine = common::require_engine!();
    let mut spec = spec("setup-flood");
    spec.setup_script = Some(
        "printf '\\033[99999999C%.0s' $(seq 1 3000)\necho\necho 'pip: no matching distribution'\nexit 4\n"
            .into(),
    );
    let before = peak_rss();
    let err = engine.start(&spec).await.err().expect("setup fails");
    assert_bounded(before, "setup printing an escape flood");
    match &err {
        SandboxError::SetupFailed { exit_code, tail } => {
            assert_eq!(*exit_code, 4);
            assert_eq!(tail, "pip: no matching distribution");
        }
        other => panic!("expected SetupFailed, got {other:?}"),
    }
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn a_setup_script_printing_without_end_succeeds_and_its_failure_tail_is_bounded() {
    let engine = common::require_engine!();
    // Succeeds: the run goes on.
    let mut spec = spec("setup-endless");
    spec.setup_script = Some(
        "printf '\\033[99999999C%.0s' $(seq 1 3000)\nhead -c 50000000 /dev/zero | tr '\\0' a\necho\necho set up\n"
            .into(),
    );
    let before = peak_rss();
    let sb = start(&engine, &spec).await;
    assert_bounded(before, "setup printing 50 MB");
    let out = sb.feed_chars("default", "echo ok", 10 * SEC).await.unwrap();
    assert_eq!(out.output, "ok\n");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
    // Fails after a line without end: the message ends with the script's last words.
    let mut spec = self::spec("setup-endless-fail");
    spec.setup_script =
        Some("head -c 50000000 /dev/zero | tr '\\0' a\necho\necho 'the end'\nexit 2\n".into());
    spec.setup_timeout = Duration::from_secs(120);
    let err = engine.start(&spec).await.err().expect("setup fails");
    match &err {
        SandboxError::SetupFailed { exit_code, tail } => {
            assert_eq!(*exit_code, 2);
            assert!(
                tail.ends_with("aaa\nthe end"),
                "{}",
                &tail[tail.len() - 50..]
            );
            assert!(tail.len() <= 8000, "{}", tail.len());
        }
        other => panic!("expected SetupFailed, got {other:?}"),
    }
    assert_gone(&engine, &spec.run_id).await;
}
