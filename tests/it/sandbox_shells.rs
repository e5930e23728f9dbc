//! The shells, against the real Docker engine and the locally built test image.

use std::time::{Duration, Instant};

use crate::common;
use crate::common::*;
use kodx::sandbox::{Sandbox, ShellStatus};

#[tokio::test]
async fn echo_returns_at_the_prompt_with_exit_status() {
    let engine = common::require_engine!();
    let spec = spec("echo");
    let sb = start(&engine, &spec).await;
    let t = Instant::now();
    let out = sb.feed_chars("default", "echo hi", 30 * SEC).await.unwrap();
    let took = t.elapsed();
    assert_eq!(out.output, "hi\n", "{out:?}");
    assert_eq!(out.status, ShellStatus::Ready { exit_code: Some(0) });
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let out = sb.feed_chars("default", "false", 30 * SEC).await.unwrap();
    assert_eq!(
        out.status,
        ShellStatus::Ready { exit_code: Some(1) },
        "{out:?}"
    );
    assert_eq!(out.output, "");
    let out = sb
        .feed_chars("default", "pwd; (exit 7)", 30 * SEC)
        .await
        .unwrap();
    assert_eq!(out.output, "/workspace\n");
    assert_eq!(out.status, ShellStatus::Ready { exit_code: Some(7) });
    assert_eq!(out.render(), "/workspace\n[exit status: 7]");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn two_shells_at_once_server_and_client() {
    let engine = common::require_engine!();
    let spec = spec("two-shells");
    let sb = start(&engine, &spec).await;
    sb.create_new_shell("server").await.unwrap();
    sb.feed_chars("server", "echo served > page.txt", 5 * SEC)
        .await
        .unwrap();
    // The server never returns to the prompt: partial output at the yield time.
    let out = sb
        .feed_chars(
            "server",
            "python3 -u -m http.server 8000 --bind 127.0.0.1",
            1500 * Duration::from_millis(1),
        )
        .await
        .unwrap();
    assert_eq!(out.status, ShellStatus::StillRunning, "{out:?}");
    assert!(out.render().contains("still running"), "{}", out.render());
    let fetch = "python3 -c \"import urllib.request as u; print(u.urlopen('http://127.0.0.1:8000/page.txt').read().decode().strip())\"";
    let out = sb.feed_chars("default", fetch, 20 * SEC).await.unwrap();
    assert_eq!(out.output, "served\n", "{out:?}");
    assert_eq!(out.status, ShellStatus::Ready { exit_code: Some(0) });
    // The server logged the request, and is still running.
    let out = sb.feed_chars("server", "", 2 * SEC).await.unwrap();
    assert!(out.output.contains("GET /page.txt"), "{out:?}");
    assert_eq!(out.status, ShellStatus::StillRunning);
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn partial_output_then_continuation() {
    let engine = common::require_engine!();
    let spec = spec("partial");
    let sb = start(&engine, &spec).await;
    let cmd = "for i in 1 2 3; do echo step$i; sleep 1; done; echo finished";
    let out = sb
        .feed_chars("default", cmd, Duration::from_millis(1500))
        .await
        .unwrap();
    assert_eq!(out.status, ShellStatus::StillRunning, "{out:?}");
    assert!(out.output.contains("step1"), "{out:?}");
    assert!(!out.output.contains("finished"), "{out:?}");
    let t = Instant::now();
    let out = sb.feed_chars("default", "", 10 * SEC).await.unwrap();
    assert!(out.output.contains("step3\nfinished\n"), "{out:?}");
    assert!(!out.output.contains("step1"), "already read: {out:?}");
    assert_eq!(out.status, ShellStatus::Ready { exit_code: Some(0) });
    assert!(
        t.elapsed() < 4 * SEC,
        "returned at the prompt, not the yield time"
    );
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn ctrl_c_interrupts_a_long_command() {
    let engine = common::require_engine!();
    let spec = spec("ctrl-c");
    let sb = start(&engine, &spec).await;
    let out = sb
        .feed_chars("default", "sleep 100", Duration::from_millis(500))
        .await
        .unwrap();
    assert_eq!(out.status, ShellStatus::StillRunning);
    let t = Instant::now();
    let out = sb.feed_chars("default", "\\x03", 10 * SEC).await.unwrap();
    assert!(t.elapsed() < 3 * SEC, "{:?}", t.elapsed());
    assert_eq!(
        out.status,
        ShellStatus::Ready {
            exit_code: Some(130)
        },
        "{out:?}"
    );
    // The raw control character works too, and the shell is usable afterwards.
    sb.feed_chars("default", "sleep 100", Duration::from_millis(300))
        .await
        .unwrap();
    let out = sb.feed_chars("default", "\u{3}", 10 * SEC).await.unwrap();
    assert_eq!(
        out.status,
        ShellStatus::Ready {
            exit_code: Some(130)
        },
        "{out:?}"
    );
    let out = sb
        .feed_chars("default", "echo alive", 10 * SEC)
        .await
        .unwrap();
    assert_eq!(out.output, "alive\n");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn python_repl_works_without_waiting_for_the_yield_time() {
    let engine = common::require_engine!();
    let spec = spec("repl");
    let sb = start(&engine, &spec).await;
    let t = Instant::now();
    let out = sb.feed_chars("default", "python3", 30 * SEC).await.unwrap();
    assert_eq!(out.status, ShellStatus::WaitingForInput, "{out:?}");
    assert!(out.output.ends_with(">>> "), "{out:?}");
    let out = sb
        .feed_chars("default", "print(6*7)", 30 * SEC)
        .await
        .unwrap();
    insta::assert_snapshot!(out.output, @"
    42
    >>>
    ");
    assert_eq!(out.status, ShellStatus::WaitingForInput);
    let out = sb
        .feed_chars("default", "def f(x):\n    return x + 1\n\nf(41)", 30 * SEC)
        .await
        .unwrap();
    assert!(out.output.contains("42"), "{out:?}");
    let out = sb.feed_chars("default", "exit()", 30 * SEC).await.unwrap();
    assert_eq!(
        out.status,
        ShellStatus::Ready { exit_code: Some(0) },
        "{out:?}"
    );
    assert!(t.elapsed() < 10 * SEC, "{:?}", t.elapsed());
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn huge_output_is_cut_in_the_middle() {
    let engine = common::require_engine!();
    let mut spec = spec("huge");
    spec.output_cap = 10_000;
    let sb = start(&engine, &spec).await;
    let out = sb
        .feed_chars("default", "seq 1 300000", 60 * SEC)
        .await
        .unwrap();
    assert_eq!(
        out.status,
        ShellStatus::Ready { exit_code: Some(0) },
        "{}",
        &out.output[..200]
    );
    assert!(
        out.output.starts_with("1\n2\n3\n"),
        "{}",
        &out.output[..100]
    );
    assert!(out.output.ends_with("299999\n300000\n"));
    assert!(out.output.len() < 11_000, "{}", out.output.len());
    let total: usize = (1..=300000).map(|i: u32| i.to_string().len() + 1).sum();
    let note = format!(
        "[... {} bytes of output omitted ...]",
        kodx::sandbox::term::group_thousands(out.omitted_bytes)
    );
    assert!(out.output.lines().any(|l| l == note), "{note}");
    let kept = out.output.len() - note.len() - 1;
    assert_eq!(kept + out.omitted_bytes, total);
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn several_lines_heredocs_and_escape_codes() {
    let engine = common::require_engine!();
    let spec = spec("lines");
    let sb = start(&engine, &spec).await;
    let out = sb
        .feed_chars("default", "cd /tmp\npwd\nsleep 0.3\necho done", 10 * SEC)
        .await
        .unwrap();
    assert!(out.output.contains("/tmp\n"), "{out:?}");
    assert!(out.output.contains("done\n"), "{out:?}");
    assert_eq!(out.status, ShellStatus::Ready { exit_code: Some(0) });
    let out = sb
        .feed_chars(
            "default",
            "cat > f.txt <<'EOF'\nhello $HOME\nEOF\ncat f.txt",
            10 * SEC,
        )
        .await
        .unwrap();
    assert!(out.output.contains("hello $HOME\n"), "{out:?}");
    let out = sb
        .feed_chars("default", "printf '\\033[1;31mred\\033[0m\\n'", 10 * SEC)
        .await
        .unwrap();
    assert_eq!(out.output, "red\n", "{out:?}");
    // A long heredoc (line by line, each taken at its PS2 prompt) stays quick and exact.
    let body: String = (0..300)
        .map(|i| format!("row {i} with 'quotes' and $dollars\n"))
        .collect();
    let t = Instant::now();
    let out = sb
        .feed_chars(
            "default",
            &format!("cat > big.txt <<'EOF'\n{body}EOF\nwc -l < big.txt"),
            30 * SEC,
        )
        .await
        .unwrap();
    assert!(out.output.ends_with("300\n"), "{}", out.output);
    assert!(t.elapsed() < 5 * SEC, "{:?}", t.elapsed());
    let out = sb
        .feed_chars("default", "md5sum < big.txt", 10 * SEC)
        .await
        .unwrap();
    let want = md5_of(body.as_bytes());
    assert!(out.output.starts_with(&want), "{out:?} vs {want}");
    // Lines for a program that reads the terminal reach it, in the same call.
    let t = Instant::now();
    let out = sb
        .feed_chars("default", "read x\nvalue\necho got=$x", 10 * SEC)
        .await
        .unwrap();
    assert!(out.output.contains("got=value\n"), "{out:?}");
    assert_eq!(out.status, ShellStatus::Ready { exit_code: Some(0) });
    assert!(t.elapsed() < 3 * SEC);
    let out = sb
        .feed_chars(
            "default",
            "python3 -c 'print(int(input()) * 2)'\n21\necho after",
            10 * SEC,
        )
        .await
        .unwrap();
    assert!(
        out.output.contains("42\n") && out.output.contains("after\n"),
        "{out:?}"
    );
    // Or in the next call, as with a REPL.
    let out = sb
        .feed_chars("default", "read -p 'name? ' x", 10 * SEC)
        .await
        .unwrap();
    assert_eq!(out.status, ShellStatus::WaitingForInput, "{out:?}");
    let out = sb.feed_chars("default", "value", 10 * SEC).await.unwrap();
    assert_eq!(
        out.status,
        ShellStatus::Ready { exit_code: Some(0) },
        "{out:?}"
    );
    let out = sb
        .feed_chars("default", "echo got=$x", 10 * SEC)
        .await
        .unwrap();
    assert_eq!(out.output, "got=value\n");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

/// md5 via the host's md5sum, to compare with the container's.
fn md5_of(data: &[u8]) -> String {
    use std::io::Write;
    let mut child = std::process::Command::new("md5sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(data).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .split(' ')
        .next()
        .unwrap()
        .to_string()
}

#[tokio::test]
async fn typing_into_a_program_that_does_not_read_returns_at_the_yield_time() {
    let engine = common::require_engine!();
    let spec = spec("no-reader");
    let sb = start(&engine, &spec).await;
    // A foreground program in raw mode that never reads: the PTY fills and writes block.
    // (In canonical mode the kernel drops the excess instead, so typing never blocks.)
    let raw = "python3 -c 'import tty,time; tty.setraw(0); time.sleep(100)'";
    sb.feed_chars("default", raw, Duration::from_millis(500))
        .await
        .unwrap();
    let big = "x".repeat(300_000);
    let t = Instant::now();
    let out = sb
        .feed_chars("default", &big, Duration::from_millis(1500))
        .await
        .unwrap();
    assert!(t.elapsed() < 10 * SEC, "{:?}", t.elapsed());
    assert!(
        out.untyped_bytes > 0,
        "{:?} {}",
        out.status,
        &out.output[..out.output.len().min(300)]
    );
    assert!(out.render().contains("were not typed"), "{}", out.render());
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn shells_are_created_replaced_and_reported_when_they_exit() {
    let engine = common::require_engine!();
    let spec = spec("lifecycle");
    let sb = start(&engine, &spec).await;
    let err = sb.feed_chars("nope", "echo", SEC).await.unwrap_err();
    insta::assert_snapshot!(err, @r#"no shell named "nope": call create_new_shell with that name first"#);
    assert!(sb.create_new_shell("bad name").await.is_err());
    sb.feed_chars("default", "export MARK=1; sleep 1000 &", 5 * SEC)
        .await
        .unwrap();
    let msg = sb.create_new_shell("default").await.unwrap();
    insta::assert_snapshot!(msg, @r#"Replaced shell "default" in /workspace."#);
    let out = sb
        .feed_chars("default", "echo ${MARK:-unset}", 5 * SEC)
        .await
        .unwrap();
    assert_eq!(out.output, "unset\n");
    // The old shell and its background job were hung up.
    let out = sb
        .feed_chars(
            "default",
            "sleep 0.5; ps -eo args | grep -c '^sleep 1000' || true",
            5 * SEC,
        )
        .await
        .unwrap();
    assert_eq!(out.output, "0\n", "{out:?}");
    let out = sb.feed_chars("default", "exit 3", 5 * SEC).await.unwrap();
    assert_eq!(
        out.status,
        ShellStatus::Exited { exit_code: Some(3) },
        "{out:?}"
    );
    insta::assert_snapshot!(out.render(), @r#"
    exit
    [shell "default" exited with status 3; call create_new_shell to start a new one]
    "#);
    sb.create_new_shell("default").await.unwrap();
    let out = sb
        .feed_chars("default", "echo back", 5 * SEC)
        .await
        .unwrap();
    assert_eq!(out.output, "back\n");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn sh_without_bash_works_too() {
    let engine = common::require_engine!();
    let mut spec = spec("busybox");
    spec.image = BUSYBOX_IMAGE.to_string();
    let sb = start(&engine, &spec).await;
    let out = sb
        .feed_chars("default", "echo hi from sh", 10 * SEC)
        .await
        .unwrap();
    assert_eq!(out.output, "hi from sh\n", "{out:?}");
    // busybox ash expands $? in its prompt too.
    let out = sb.feed_chars("default", "false", 10 * SEC).await.unwrap();
    assert_eq!(
        out.status,
        ShellStatus::Ready { exit_code: Some(1) },
        "{out:?}"
    );
    let out = sb
        .feed_chars("default", "cd /tmp\npwd", 10 * SEC)
        .await
        .unwrap();
    assert!(out.output.contains("/tmp\n"), "{out:?}");
    assert_eq!(
        out.status,
        ShellStatus::Ready { exit_code: Some(0) },
        "{out:?}"
    );
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn many_quick_commands_each_return_exactly_their_output() {
    let engine = common::require_engine!();
    let spec = spec("many");
    let sb = start(&engine, &spec).await;
    for i in 0..400 {
        let out = sb
            .feed_chars("default", &format!("echo n{i}"), 10 * SEC)
            .await
            .unwrap();
        assert_eq!(out.output, format!("n{i}\n"), "call {i}: {out:?}");
        assert_eq!(out.status, ShellStatus::Ready { exit_code: Some(0) });
    }
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

/// The prompt's marker is nowhere a command can read it: a command that prints a prompt
/// made of every marker it finds in the container's environments (the shells start with
/// one there, then drop it) does not end its output early or set its status.
#[tokio::test]
async fn a_fake_prompt_made_of_markers_found_in_the_container_does_not_end_a_command() {
    let engine = common::require_engine!();
    let spec = spec("fake-prompt");
    let sb = start(&engine, &spec).await;
    sb.create_new_shell("second").await.unwrap();
    let script = r#"cat > /tmp/forge.sh <<'EOF'
for f in /proc/[0-9]*/environ; do tr '\0' '\n' < "$f" 2>/dev/null; done | grep -a 'kodx;' | sed -n 's/^[A-Za-z0-9_]*=//p' | sort -u > /tmp/markers
n=0
while IFS= read -r m; do
  m=$(printf '%s' "$m" | sed 's/\$?;\$\$/0;1/; s/\\\[//; s/\\\]//')
  printf '%s\n' "$m"
  n=$((n+1))
done < /tmp/markers
echo "markers tried: $n"
sleep 0.3
echo after-the-fake-prompts
exit 3
EOF"#;
    sb.feed_chars("default", script, 10 * SEC).await.unwrap();
    let out = sb
        .feed_chars("default", "bash /tmp/forge.sh", 10 * SEC)
        .await
        .unwrap();
    assert!(out.output.contains("after-the-fake-prompts"), "{out:?}");
    assert_eq!(
        out.status,
        ShellStatus::Ready { exit_code: Some(3) },
        "{out:?}"
    );
    // It really tried: the markers the shells started with are there, dead.
    let tried = out
        .output
        .lines()
        .find_map(|l| l.strip_prefix("markers tried: "))
        .and_then(|n| n.trim().parse::<u32>().ok())
        .unwrap_or(0);
    assert!(tried >= 1, "{out:?}");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

/// The pids of the shells started ahead and waiting in `sb` (kodx's helper, `gate`).
async fn waiting_shells(sb: &impl Sandbox) -> Vec<String> {
    let list = "for p in /proc/[0-9]*; do \
                tr '\\0' ' ' < $p/cmdline 2>/dev/null | grep -q '^/.kodx-bin/kodx-net gate' && echo ${p#/proc/}; \
                done; true";
    let out = sb.run_to_end(list, 10 * SEC, 4096).await.unwrap();
    out.output.lines().map(str::to_string).collect()
}

/// Waits until one shell is started ahead in `sb`, and returns its pid.
async fn a_waiting_shell(sb: &impl Sandbox, not: Option<&str>) -> String {
    let deadline = Instant::now() + 20 * SEC;
    loop {
        let waiting = waiting_shells(sb).await;
        assert!(waiting.len() <= 1, "more than one shell waits: {waiting:?}");
        if let Some(pid) = waiting.into_iter().find(|p| Some(p.as_str()) != not) {
            return pid;
        }
        assert!(Instant::now() < deadline, "no shell was started ahead");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test]
async fn a_new_shell_opens_the_one_started_ahead_and_reads_the_rc_files_as_they_are_then() {
    let engine = common::require_engine!();
    let spec = spec("spare");
    let sb = start(&engine, &spec).await;
    // A spare is started shortly after the first shell, and runs nothing of the image.
    let spare = a_waiting_shell(&sb, None).await;
    // Written after the spare's exec started: the new shell still reads it, and starts in
    // the working directory even though it was replaced meanwhile.
    let out = sb
        .run_to_end(
            "echo 'export FROM_RC=yes' >> ~/.bashrc && mv /workspace /old && mkdir /workspace && touch /workspace/new",
            10 * SEC,
            4096,
        )
        .await
        .unwrap();
    assert_eq!(out.exit_code, Some(0), "{out:?}");
    let msg = sb.create_new_shell("second").await.unwrap();
    assert!(msg.starts_with("Started"), "{msg}");
    let out = sb
        .feed_chars("second", "echo $$ ${FROM_RC:-unset}; ls", 10 * SEC)
        .await
        .unwrap();
    // The shell is the spare's process (the helper ran it in its place).
    assert_eq!(out.output, format!("{spare} yes\nnew\n"), "{out:?}");
    assert_eq!(out.status, ShellStatus::Ready { exit_code: Some(0) });
    // Another spare for the next call; the taken one is no longer waiting.
    let next = a_waiting_shell(&sb, Some(&spare)).await;
    assert_ne!(next, spare);
    // Replacing a shell with the spare hangs up the old one and its jobs, as without it.
    sb.feed_chars("second", "sleep 1000 &", 5 * SEC)
        .await
        .unwrap();
    let msg = sb.create_new_shell("second").await.unwrap();
    assert!(msg.starts_with("Replaced"), "{msg}");
    let out = sb
        .feed_chars(
            "second",
            "echo $$; sleep 0.5; ps -eo args | grep -c '^sleep 1000' || true",
            5 * SEC,
        )
        .await
        .unwrap();
    assert_eq!(out.output, format!("{next}\n0\n"), "{out:?}");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn the_first_shell_started_ahead_runs_only_after_the_fence_the_files_and_the_setup() {
    let engine = common::require_engine!();
    let repo = tempfile::tempdir().unwrap();
    std::fs::write(repo.path().join("README.md"), "hello\n").unwrap();
    let mut spec = spec("first-shell");
    spec.repo_dir = Some(repo.path().to_path_buf());
    // The rc file the setup writes records what the shell found when bash started: the
    // setup's mark and the repository's file. Bash started any earlier would have read
    // no such rc file at all.
    spec.setup_script = Some(
        "echo 'echo \"$(cat /tmp/setup-done) $(ls)\" > /tmp/rc-saw' >> ~/.bashrc\n\
         sleep 1\necho done > /tmp/setup-done\n"
            .to_string(),
    );
    let sb = start(&engine, &spec).await;
    let out = sb
        .feed_chars("default", "cat /tmp/rc-saw", 10 * SEC)
        .await
        .unwrap();
    assert_eq!(out.output, "done README.md\n", "{out:?}");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}
