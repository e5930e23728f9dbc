//! Preloaded warm sandboxes (`warm_repositories`, issue 43) through the real `kodx serve`
//! on the real Docker engine, with a real git server: after a repository's run, a warm
//! sandbox holding its checkout waits; the next run at that tip copies nothing, one at a
//! tip twenty commits newer gets only the difference (removals included), and what each
//! pushes is exactly its own change. A preloaded sandbox never goes to another repository
//! or installation.

use std::path::Path;
use std::time::Duration;

use crate::common;
use crate::common::serve::{
    delivery_id, issue_comment, text, tool, usage, IssueComment, Options, RunId, Served, REPO,
};
use crate::serve_warm::last_tool_output;
use serde_json::Value;

const LONG: Duration = Duration::from_secs(120);

/// `kodx serve` keeping one preloaded sandbox per engine and no empty ones.
async fn preload_server() -> Served {
    Served::start(Options {
        workers: true,
        settings: Some(
            "status_interval_secs = 0.2\nshutdown_grace_secs = 5\nwarm_sandboxes = 0\n\
             warm_repositories = 1\nwarm_idle_secs = 600\n",
        ),
        ..Options::default()
    })
    .await
}

/// Waits until one preloaded sandbox for `key` (`<installation>/<owner>/<name>`) waits on
/// the engine, none of `not`, and `/metrics` counts it; its container id.
async fn until_preloaded(s: &Served, key: &str, not: &[&str]) -> String {
    let engine = kodx::sandbox::Engine::connect().await.unwrap();
    let deadline = std::time::Instant::now() + LONG;
    let pid = s.kodx_pid().to_string();
    loop {
        let waiting: Vec<String> =
            common::summaries_labelled(&engine, kodx::sandbox::docker::PRELOADED_LABEL)
                .await
                .into_iter()
                .filter(|c| {
                    let labels = c.labels.clone().unwrap_or_default();
                    let label = |name: &str| labels.get(name).cloned().unwrap_or_default();
                    // This server's: tests run side by side, on the same repository.
                    label(kodx::sandbox::docker::PROCESS_LABEL)
                        .split('/')
                        .nth(2)
                        == Some(pid.as_str())
                        && label(kodx::sandbox::docker::PRELOADED_LABEL) == key
                        && c.names.iter().flatten().any(|n| {
                            n.trim_start_matches('/')
                                .starts_with(kodx::sandbox::docker::WARM_NAME_PREFIX)
                        })
                })
                .filter_map(|c| c.id)
                .collect();
        let (_, metrics) = s.get("/metrics").await;
        let counted = metrics
            .lines()
            .any(|l| l == "kodx_engine_warm_preloaded{engine=\"local\"} 1");
        if waiting.len() == 1 && counted && !not.contains(&waiting[0].as_str()) {
            return waiting[0].clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no preloaded sandbox for {key} (have {waiting:?})\n--- kodx serve log ---\n{}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The run's stored result once it ended.
async fn result_of(s: &Served, run: &RunId) -> Value {
    let db = s.db().await;
    let deadline = std::time::Instant::now() + LONG;
    let result = loop {
        let r = db.get_run(run).await.unwrap().unwrap();
        if r.status.is_final() {
            break r.result.unwrap_or_default();
        }
        assert!(std::time::Instant::now() < deadline, "the run never ended");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    db.close().await;
    serde_json::from_str(&result).unwrap()
}

/// `/kodx code` on issue `number` whose one command is `script`; the run, its result and
/// its branch.
async fn code_run(s: &Served, number: u64, script: &str) -> (RunId, Value, String) {
    s.github.add_issue(REPO, number, "Look", "", "carol");
    s.model.reply(tool(script), "tool_use", usage(1000, 10));
    s.model.reply(text("Done."), "end_turn", usage(1100, 10));
    let run = s.comment(number, "alice", "/kodx code look around").await;
    let result = result_of(s, &run).await;
    let branch = format!("kodx/issue-{number}-{}", &run.0[..8]);
    (run, result, branch)
}

/// `git diff --name-status base..rev` in the bare repository, one line per path.
fn changed(s: &Served, base: &str, rev: &str) -> String {
    let out = s.git.git(
        &s.git.bare_path(REPO),
        &["diff", "--name-status", "--no-renames", base, rev],
    );
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// A file of the run's branch, as text.
fn file(s: &Served, branch: &str, name: &str, result: &Value) -> String {
    let bytes = s
        .git
        .file_at(REPO, branch, name)
        .unwrap_or_else(|| panic!("no {name}: {result}\n{}", s.log()));
    String::from_utf8(bytes).unwrap()
}

/// Commits `files` (path, contents, mode) on `main` of the test repository; the new tip.
fn commit_on_main(s: &Served, files: &[(String, Vec<u8>, u32)], message: &str) -> String {
    let borrowed: Vec<(&str, &[u8], u32)> = files
        .iter()
        .map(|(p, c, m)| (p.as_str(), c.as_slice(), *m))
        .collect();
    s.git.commit_on_branch(REPO, "main", &borrowed, message)
}

/// Runs git in `dir`, failing the test with its output when it fails.
fn git(dir: &Path, args: &[&str]) -> String {
    let out = std::process::Command::new("git")
        .current_dir(dir)
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "git {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap()
}

/// Twenty commits on `main` of the bare repository `bare`, as a project moves: edits, a
/// deletion, a rename, a new directory, an exec bit, a file that becomes a directory and a
/// directory that becomes a file. Returns the new tip.
fn twenty_commits(bare: &Path) -> String {
    let work = tempfile::tempdir().unwrap();
    let w = work.path();
    git(w, &["clone", "-q", bare.to_str().unwrap(), "."]);
    git(w, &["config", "user.email", "m@example.com"]);
    git(w, &["config", "user.name", "Maintainer"]);
    for i in 0..20 {
        match i {
            0 => {
                git(w, &["rm", "-q", "old/gone.txt"]);
            }
            1 => {
                git(w, &["mv", "docs/page-1.md", "docs/renamed.md"]);
            }
            2 => {
                std::fs::create_dir_all(w.join("new/deep")).unwrap();
                std::fs::write(w.join("new/deep/file.txt"), "new\n").unwrap();
            }
            3 => {
                use std::os::unix::fs::PermissionsExt;
                let exec = std::fs::Permissions::from_mode(0o755);
                std::fs::set_permissions(w.join("tool.sh"), exec).unwrap();
            }
            4 => {
                git(w, &["rm", "-q", "becomes-dir"]);
                std::fs::create_dir_all(w.join("becomes-dir")).unwrap();
                std::fs::write(w.join("becomes-dir/inner.txt"), "inner\n").unwrap();
            }
            5 => {
                git(w, &["rm", "-q", "-r", "becomes-file"]);
                std::fs::write(w.join("becomes-file"), "a file now\n").unwrap();
            }
            _ => {
                std::fs::write(w.join("README.md"), format!("# widgets {i}\n")).unwrap();
                std::fs::write(w.join(format!("docs/page-{}.md", 10 + i)), format!("{i}\n"))
                    .unwrap();
            }
        }
        git(w, &["add", "-A"]);
        git(w, &["commit", "-q", "-m", &format!("step {i}")]);
    }
    git(w, &["push", "-q", "origin", "HEAD:main"]);
    git(w, &["rev-parse", "HEAD"]).trim().to_string()
}

/// What the run's diagnostics script writes into the workspace before its one change.
const LOOK: &str = "git status --porcelain > /tmp/status; git log -1 --format=%H > /tmp/one; \
    cat .git/shallow > /tmp/shallow; (git fsck --no-dangling; echo exit=$?) > /tmp/fsck 2>&1; \
    ls -la old becomes-dir becomes-file tool.sh > /tmp/ls 2>&1; \
    for f in status one shallow fsck ls; do cp /tmp/$f $f.txt; done; echo ran > ran.txt";

#[tokio::test]
async fn a_preloaded_sandbox_gives_its_tip_at_once_and_a_newer_tip_only_the_difference() {
    let _engine = common::require_engine!();
    let s = preload_server().await;
    // A repository of some size, so that a difference is visibly not the whole tree.
    let mut files: Vec<(String, Vec<u8>, u32)> = (0..300)
        .map(|i| {
            (
                format!("docs/page-{i}.md"),
                format!("page {i}\n").into_bytes(),
                0o644,
            )
        })
        .collect();
    files.push(("old/gone.txt".into(), b"going\n".to_vec(), 0o644));
    files.push(("tool.sh".into(), b"#!/bin/sh\necho tool\n".to_vec(), 0o644));
    files.push(("becomes-dir".into(), b"a file first\n".to_vec(), 0o644));
    files.push((
        "becomes-file/x.txt".into(),
        b"in a dir first\n".to_vec(),
        0o644,
    ));
    let t0 = commit_on_main(&s, &files, "a bigger tree");
    let key = format!("{}/{REPO}", common::serve::INSTALLATION);

    // The first run copies the repository in; its checkout is then preloaded.
    let (_, first, _) = code_run(&s, 7, "echo one > first.txt").await;
    assert_eq!(first["preloaded"], Value::Null, "{first}");
    let waiting = until_preloaded(&s, &key, &[]).await;

    // At the same tip: the preloaded sandbox, nothing copied, a clean checkout, and the
    // change set holds the run's files alone.
    let (same_run, same, branch) = code_run(&s, 8, LOOK).await;
    assert_eq!(same["preloaded"], "same_tip", "{same}\n{}", s.log());
    assert_eq!(same["warm_start"], true, "{same}");
    assert_eq!(file(&s, &branch, "one.txt", &same), format!("{t0}\n"));
    assert_eq!(file(&s, &branch, "status.txt", &same), "");
    assert!(file(&s, &branch, "fsck.txt", &same).ends_with("exit=0\n"));
    insta::assert_snapshot!(changed(&s, &t0, &branch), @"
    A	fsck.txt
    A	ls.txt
    A	one.txt
    A	ran.txt
    A	shallow.txt
    A	status.txt
    ");
    // Made again from the same checkout, in another container.
    let again = until_preloaded(&s, &key, &[&waiting]).await;
    assert_ne!(again, waiting);

    // Twenty commits later: only the difference goes in; what the newer tree lacks is gone.
    let t1 = twenty_commits(&s.git.bare_path(REPO));
    let (newer_run, newer, branch) = code_run(&s, 9, LOOK).await;
    assert_eq!(newer["preloaded"], "difference", "{newer}\n{}", s.log());
    assert_eq!(file(&s, &branch, "one.txt", &newer), format!("{t1}\n"));
    assert_eq!(
        file(&s, &branch, "shallow.txt", &newer).lines().next(),
        Some(t1.as_str())
    );
    assert_eq!(
        file(&s, &branch, "status.txt", &newer),
        "",
        "a clean work tree"
    );
    let fsck = file(&s, &branch, "fsck.txt", &newer);
    assert!(fsck.ends_with("exit=0\n"), "{fsck}");
    let ls = file(&s, &branch, "ls.txt", &newer);
    assert!(ls.contains("'old': No such file"), "{ls}");
    assert!(ls.contains("-rwxr-xr-x") && ls.contains("tool.sh"), "{ls}");
    assert!(ls.contains("inner.txt"), "a file became a directory: {ls}");
    assert!(
        ls.contains("-rw-r--r--") && ls.contains("becomes-file"),
        "{ls}"
    );
    // Both change sets came from the snapshot: what the copy-in wrote (the whole checkout
    // at preload, the difference now) is older than its marker, so only what the runs
    // touched was read back.
    for run in [&same_run, &newer_run] {
        // By the run's id: the log's fields may be coloured.
        let snapshot = |l: &str| {
            l.contains(&run.0) && l.contains("read the change set from the workspace's snapshot")
        };
        s.wait_for(&format!("run {run}'s snapshot"), LONG, || {
            s.log().lines().any(snapshot)
        })
        .await;
    }
    let log = s.log();
    assert!(!log.contains("snapshot failed"), "{log}");
    // What the branch holds beyond the new tip is the run's own files.
    insta::assert_snapshot!(changed(&s, &t1, &branch), @"
    A	fsck.txt
    A	ls.txt
    A	one.txt
    A	ran.txt
    A	shallow.txt
    A	status.txt
    ");

    // Made again, still holding the first tip (a difference writes no ready checkout).
    let held = until_preloaded(&s, &key, &[&again]).await;
    // Most of the tree rewritten: too far for a difference. The workspace is emptied and
    // the tip goes in whole; its ready checkout is kept, so the next preloaded sandbox
    // holds it and the next run at that tip copies nothing.
    let rewritten: Vec<(String, Vec<u8>, u32)> = (0..250)
        .map(|i| {
            (
                format!("docs/page-{i}.md"),
                format!("rewritten {i}\n").into_bytes(),
                0o644,
            )
        })
        .collect();
    let t2 = commit_on_main(&s, &rewritten, "rewrite the docs");
    let (_, far, branch) = code_run(&s, 10, LOOK).await;
    assert_eq!(far["preloaded"], "whole", "{far}\n{}", s.log());
    assert_eq!(file(&s, &branch, "one.txt", &far), format!("{t2}\n"));
    assert_eq!(
        file(&s, &branch, "status.txt", &far),
        "",
        "a clean work tree"
    );
    assert_eq!(
        String::from_utf8(s.git.file_at(REPO, &branch, "docs/page-7.md").unwrap()).unwrap(),
        "rewritten 7\n"
    );
    insta::assert_snapshot!(changed(&s, &t2, &branch), @"
    A	fsck.txt
    A	ls.txt
    A	one.txt
    A	ran.txt
    A	shallow.txt
    A	status.txt
    ");
    until_preloaded(&s, &key, &[&held]).await;
    let (_, next, branch) = code_run(&s, 11, LOOK).await;
    assert_eq!(next["preloaded"], "same_tip", "{next}\n{}", s.log());
    assert_eq!(file(&s, &branch, "one.txt", &next), format!("{t2}\n"));

    // A pull request's run (its clone has the history) leaves the preloaded sandbox to the
    // repository's next issue run.
    let waiting = until_preloaded(&s, &key, &[]).await;
    let run = s.code_run_counting_a_pulls_commits(12, &t2).await;
    let pull = result_of(&s, &run).await;
    assert_eq!(pull["preloaded"], Value::Null, "{pull}");
    assert!(
        s.git.file_at(REPO, "feature", "count.txt").is_some(),
        "{pull}\n{}",
        s.log()
    );
    assert_eq!(until_preloaded(&s, &key, &[]).await, waiting);
}

/// An `issue_comment` on issue `number` of `repo` (installation `installation`) asking
/// `/kodx ask`, whose one command is `command`; the run.
async fn ask_in(
    s: &Served,
    (repo, installation, clone_url): (&str, u64, &str),
    number: u64,
    command: &str,
) -> RunId {
    s.github
        .add_issue(repo, number, "Q", "A question.", "carol");
    s.model.reply(tool(command), "tool_use", usage(100, 10));
    s.model.reply(text("Answered."), "end_turn", usage(100, 10));
    let mut payload = issue_comment(&IssueComment {
        clone_url,
        number,
        comment_id: 9000 + number,
        body: "/kodx ask what is here?",
        ..IssueComment::default()
    });
    let (owner, name) = repo.split_once('/').unwrap();
    payload["repository"]["full_name"] = repo.into();
    payload["repository"]["name"] = name.into();
    payload["repository"]["owner"]["login"] = owner.into();
    payload["installation"]["id"] = installation.into();
    let (status, answer) = s.deliver("issue_comment", &delivery_id(), &payload).await;
    assert_eq!(status, 202, "{answer}");
    RunId(answer["run_id"].as_str().unwrap().to_string())
}

#[tokio::test]
async fn a_preloaded_sandbox_goes_to_its_own_repository_and_installation_alone() {
    let _engine = common::require_engine!();
    let s = preload_server().await;
    let installation = common::serve::INSTALLATION;
    // Another repository of the installation, and one of another installation.
    let gadgets = s.git.create_repo(
        "acme/gadgets",
        "main",
        &[("README.md", b"# gadgets\n", 0o644)],
    );
    s.github
        .add_repo(installation, "acme/gadgets", "main", &gadgets, true);
    s.github.set_permission("acme/gadgets", "alice", "admin");
    s.github.add_installation(installation + 1, "globex");
    let things = s.git.create_repo(
        "globex/things",
        "main",
        &[("README.md", b"# things\n", 0o644)],
    );
    s.github
        .add_repo(installation + 1, "globex/things", "main", &things, true);
    s.github.set_permission("globex/things", "alice", "admin");

    let widgets = (REPO, installation, s.clone_url.as_str());
    let run = ask_in(&s, widgets, 7, "cat README.md").await;
    result_of(&s, &run).await;
    let preloaded = until_preloaded(&s, &format!("{installation}/{REPO}"), &[]).await;

    for (n, (repo, inst, url)) in [
        (8, ("acme/gadgets", installation, gadgets.as_str())),
        (9, ("globex/things", installation + 1, things.as_str())),
    ] {
        let run = ask_in(&s, (repo, inst, url), n, "hostname; cat README.md; ls").await;
        let result = result_of(&s, &run).await;
        let printed = last_tool_output(&s);
        assert!(
            printed.contains("README.md"),
            "{repo}: {result}\n{printed}\n{:?}\n{:?}",
            s.github.forbidden(),
            s.github
                .requests()
                .iter()
                .map(|r| format!("{} {}", r.method, r.path))
                .collect::<Vec<_>>()
        );
        assert_eq!(result["preloaded"], Value::Null, "{repo}: {result}");
        assert_eq!(result["warm_start"], Value::Null, "{repo}: {result}");
        assert!(!printed.contains(&preloaded[..12]), "{repo}: {printed}");
        let name = repo.split('/').nth(1).unwrap();
        assert!(printed.contains(&format!("# {name}")), "{repo}: {printed}");
        assert!(
            !printed.contains("widgets") && !printed.contains("src"),
            "{repo}: {printed}"
        );
        // The slot goes to the repository with the most recent run.
        until_preloaded(&s, &format!("{inst}/{repo}"), &[]).await;
    }
    // The widgets run after them finds the other installation's sandbox, not its own.
    let run = ask_in(&s, widgets, 10, "hostname; cat README.md").await;
    let result = result_of(&s, &run).await;
    assert_eq!(result["preloaded"], Value::Null, "{result}");
    assert!(last_tool_output(&s).contains("# widgets"));
}

/// An `/kodx ask` on issue `number` of the widgets whose one command is `command`; what it
/// printed and the run's result.
async fn ask(s: &Served, number: u64, command: &str) -> (String, Value) {
    let widgets = (REPO, common::serve::INSTALLATION, s.clone_url.as_str());
    let run = ask_in(s, widgets, number, command).await;
    let result = result_of(s, &run).await;
    (last_tool_output(s), result)
}

/// A repository with a setup script: a preloaded sandbox is made from the image its run
/// started from (the cached setup image on a hit) and goes only to runs with the same
/// setup cache key; a changed setup script's run starts its own.
#[tokio::test]
async fn a_preloaded_sandbox_is_tied_to_its_setup_cache_key() {
    let _engine = common::require_engine!();
    let _lock = crate::sandbox_setup_cache::cache_lock(false);
    let s = preload_server().await;
    let key = format!("{}/{REPO}", common::serve::INSTALLATION);
    // A script of its own, so that no other test's cached image is this one's.
    let token = format!("{:08x}", rand::random::<u32>());
    let script = |n: &str| format!("setup_script: |\n  echo {n}-{token} > /var/tmp/setup\n");
    s.github.set_file(REPO, ".github/kodx.yml", &script("one"));

    let (_, first) = ask(&s, 7, "cat /var/tmp/setup").await;
    assert_eq!(first["setup_cache"], "miss", "{first}");
    let plain = until_preloaded(&s, &key, &[]).await;
    // From the cached image now: the sandbox preloaded from the plain image is not its
    // shape; the next one is made from the cached image.
    let (_, second) = ask(&s, 8, "cat /var/tmp/setup").await;
    assert_eq!(second["setup_cache"], "hit", "{second}");
    assert_eq!(second["preloaded"], Value::Null, "{second}");
    let cached = until_preloaded(&s, &key, &[&plain]).await;
    let (printed, third) = ask(
        &s,
        9,
        "cat /var/tmp/setup; cat README.md; git status --porcelain",
    )
    .await;
    assert_eq!(third["setup_cache"], "hit", "{third}");
    assert_eq!(third["preloaded"], "same_tip", "{third}\n{}", s.log());
    assert!(printed.contains(&format!("one-{token}")), "{printed}");
    assert!(printed.contains("# widgets"), "{printed}");
    let waiting = until_preloaded(&s, &key, &[&cached]).await;

    // Another setup script: another key; the cached image's preloaded sandbox is not used.
    s.github.set_file(REPO, ".github/kodx.yml", &script("two"));
    let (printed, fourth) = ask(&s, 10, "hostname; cat /var/tmp/setup").await;
    assert_eq!(fourth["setup_cache"], "miss", "{fourth}");
    assert_eq!(fourth["preloaded"], Value::Null, "{fourth}");
    assert!(printed.contains(&format!("two-{token}")), "{printed}");
    assert!(!printed.contains(&waiting[..12]), "{printed}");
}
