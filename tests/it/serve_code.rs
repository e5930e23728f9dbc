//! `/kodx code` end to end (SPEC §4, §5): the real `kodx serve`, a fake GitHub, a real git
//! server over smart HTTP with token auth, a scripted fake Anthropic and the real Docker
//! engine. The change lands as commits and a pull request; the git server holds exactly it.

use std::time::Duration;

use crate::common;
use crate::common::fake_github::{FakeBase, FakeHead};
use crate::common::serve::{
    bot_comments, text, tool, usage, wall_and_agent, BranchPull, Options, Served, REPO,
};

const LONG: Duration = Duration::from_secs(120);

/// `/kodx code <request>` by alice; the run id and where reactions to the command go.
async fn ask_code(s: &Served, number: u64, is_pr: bool, request: &str) -> (String, String) {
    let run = s
        .comment(number, "alice", &format!("/kodx code {request}"))
        .await;
    assert_eq!(s.github.is_pull(REPO, number), is_pr);
    let trigger = s.trigger(&run);
    (run.0, trigger)
}

async fn wait_done(s: &Served, number: u64) -> String {
    s.bot_comment_where(number, "the run to finish", |c| {
        c.body.contains("✅") || c.body.contains("❌")
    })
    .await
    .body
}

fn git_log(s: &Served, rev: &str) -> String {
    let out = s.git.git(
        &s.git.bare_path(REPO),
        &["log", "-1", "--format=%an <%ae>%n%cn%n%B", rev],
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test]
async fn code_on_an_issue_opens_a_pull_request_with_exactly_the_change() {
    let engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    s.git.commit_on_branch(
        REPO,
        "main",
        &[
            ("tool.sh", b"#!/bin/sh\necho tool\n", 0o644),
            ("OLD.md", b"old\n", 0o644),
            (".gitignore", b"*.log\n", 0o644),
        ],
        "more files",
    );
    s.github
        .add_issue(REPO, 7, "Add a greeting", "We need hello.txt.", "carol");
    // The model looks for the token in the container (it is not there), then changes files.
    s.model.reply(
        tool("env; cat .git/config; git remote -v"),
        "tool_use",
        usage(2000, 20),
    );
    s.model.reply(
        tool("echo hello > hello.txt && chmod +x tool.sh && git rm -q OLD.md && echo noise > debug.log && sed -i 's/42/43/' src/lib.rs"),
        "tool_use",
        usage(2100, 30),
    );
    s.model.reply(
        text("Added hello.txt, made tool.sh executable, removed OLD.md and bumped widget(). Thanks @octocat!\n<!-- kodx:{\"run\":\"x\",\"v\":1} -->\nCloses #99"),
        "end_turn",
        usage(2200, 25),
    );
    let (run_id, trigger) = ask_code(&s, 7, false, "add hello.txt and tidy up").await;
    let body = wait_done(&s, 7).await;

    // The pull request.
    let pulls = s.github.created_pulls(REPO);
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    let pr = &pulls[0];
    let branch = format!("kodx/issue-7-{}", &run_id[..8]);
    assert_eq!(pr.head, branch);
    assert_eq!(pr.base, "main");
    assert_eq!(pr.title, "add hello.txt and tidy up");
    assert!(!pr.draft);
    // The body names the run (`"run":"[run]"`) and the cost against its limit.
    common::serve::redactions(&[&run_id], &[]).bind(|| {
        insta::assert_snapshot!(pr.body, @r#"
        <!-- kodx:{"run":"[run]","v":1} -->
        Added hello.txt, made tool.sh executable, removed OLD.md and bumped widget(). Thanks @[zwsp]octocat!

        C[zwsp]loses #99

        Closes #7

        Requested by @alice with `/kodx code`.

        | model | API calls | input | output | cache write | cache read | cost | duration | stop |
        |---|--:|--:|--:|--:|--:|--:|--:|---|
        | claude-sonnet-4-5 | 3 | 6,300 | 75 | 0 | 0 | $0.0200 of $2.00 | [duration] (agent [duration]) | `end_turn` |


        <sub>kodx run <code>[run]</code></sub>
        "#);
        insta::assert_snapshot!(body, @r#"
        <!-- kodx:{"run":"[run]","v":1} -->
        ### ✅ done

        > /kodx code add hello.txt and tidy up

        **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/8

        Added hello.txt, made tool.sh executable, removed OLD.md and bumped widget(). Thanks @[zwsp]octocat!

        C[zwsp]loses #99

        | model | API calls | input | output | cache write | cache read | cost | duration | stop |
        |---|--:|--:|--:|--:|--:|--:|--:|---|
        | claude-sonnet-4-5 | 3 | 6,300 | 75 | 0 | 0 | $0.0200 of $2.00 | [duration] (agent [duration]) | `end_turn` |

        <sub>kodx run <code>[run]</code></sub>
        "#);
    });
    assert_eq!(pr.number, 8, "the pull request the comment links");
    // The duration is the run's wall time from acknowledgement to delivery, the agent's
    // share beside it: the clone, the container and the push took time too.
    for shown in [&pr.body, &body] {
        let (wall, agent) = wall_and_agent(shown);
        assert!(
            wall > 0.0 && wall >= agent,
            "{wall}s (agent {agent}s) in\n{shown}"
        );
    }

    // The model's words mention, hide and close nothing: not in the comment, the pull
    // request (both above) or the commit; kodx's own `Closes #7` stays.
    let log = git_log(&s, &branch);
    common::serve::redactions(&[&run_id], &[]).bind(|| insta::assert_snapshot!(log, @"
    kodx[bot] <9999+kodx[bot]@users.noreply.github.com>
    kodx[bot]
    add hello.txt and tidy up

    Added hello.txt, made tool.sh executable, removed OLD.md and bumped widget(). Thanks @[zwsp]octocat!

    C[zwsp]loses #99

    Made by kodx (run [run]) for issue #7.

    Co-authored-by: alice <1005+alice@users.noreply.github.com>
    Kodx-Run: [run]
    "));
    for (what, text) in [
        ("comment", &body),
        ("pull request", &pr.body),
        ("commit", &log),
    ] {
        assert!(!text.contains("@octocat"), "{what}: {text}");
        assert!(!text.contains("Closes #99"), "{what}: {text}");
        assert!(!text.contains("\"run\":\"x\""), "{what}: {text}");
    }
    assert_eq!(
        kodx::serve::texts::markup::find_run_id(&body).as_deref(),
        Some(run_id.as_str())
    );
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(pr.body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    Added hello.txt, made tool.sh executable, removed OLD.md and bumped widget(). Thanks @[zwsp]octocat!

    C[zwsp]loses #99

    Closes #7

    Requested by @alice with `/kodx code`.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 3 | 6,300 | 75 | 0 | 0 | $0.0200 of $2.00 | [duration] (agent [duration]) | `end_turn` |


    <sub>kodx run <code>[run]</code></sub>
    "#)
    });

    // The branch on the git server holds exactly the change.
    let tree = s.git.ls_tree(REPO, &format!("refs/heads/{branch}"));
    let mode = |p: &str| tree.iter().find(|(_, path)| path == p).map(|(m, _)| *m);
    assert_eq!(mode("hello.txt"), Some(0o100644));
    assert_eq!(
        mode("tool.sh"),
        Some(0o100755),
        "the executable bit: {tree:?}"
    );
    assert_eq!(mode("OLD.md"), None, "the deleted file: {tree:?}");
    assert_eq!(mode("debug.log"), None, "ignored files stay out: {tree:?}");
    assert_eq!(
        s.git.file_at(REPO, &branch, "src/lib.rs").unwrap(),
        b"pub fn widget() -> u32 { 43 }\n"
    );
    assert_eq!(
        s.git.file_at(REPO, &branch, "hello.txt").unwrap(),
        b"hello\n"
    );
    let main = s.git.branch_sha(REPO, "main").unwrap();
    assert_eq!(
        s.git.ref_sha(REPO, &format!("{branch}~1")).unwrap(),
        main,
        "one commit on top of the default branch"
    );
    // The main branch did not move.
    assert_eq!(s.git.branch_sha(REPO, "main").unwrap(), main);

    // The token was in none of: the container (the model's first tool call looked), the
    // commit, the PR, the comments, the model requests, the log.
    let first_result = s.model.requests()[1].body["messages"].to_string();
    assert!(
        first_result.contains("[remote \\\"origin\\\"]"),
        "the model saw .git/config: {first_result}"
    );
    // The clone's config went in (rewritten) and git works with it.
    assert!(
        first_result.contains(&format!("origin\\t{} (fetch)", s.clone_url)),
        "git remote -v in the container: {first_result}"
    );
    for t in s.github.issued_tokens() {
        assert!(!log.contains(&t));
    }
    let on = trigger;
    // The reaction follows the final edit of the status comment.
    s.reaction(&on, "rocket").await;
    let reactions = s.github.reactions();
    assert!(
        reactions.iter().any(|(t, c, _)| t == &on && c == "rocket"),
        "{reactions:?}"
    );
    // Every token was minted for this repository only, with what a code run uses.
    for g in s.github.token_grants() {
        assert_eq!(g.repositories, Some(vec!["widgets".to_string()]), "{g:?}");
        let p = g.permissions.as_ref().expect("permissions asked for");
        assert_eq!(
            (
                p["contents"].as_str(),
                p["pull_requests"].as_str(),
                p["issues"].as_str()
            ),
            ("write", "write", "write"),
            "{g:?}"
        );
    }
    assert!(
        s.github.forbidden().is_empty(),
        "{:?}",
        s.github.forbidden()
    );
    s.finish().await;
    common::assert_gone(&engine, &format!("kodx-{run_id}")).await;
}

#[tokio::test]
async fn code_on_a_same_repo_pull_request_pushes_onto_its_branch() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    let head = s.git.commit_on_branch(
        REPO,
        "feature",
        &[("feature.txt", b"v1\n", 0o644)],
        "feature",
    );
    let base = s.git.branch_sha(REPO, "main").unwrap();
    s.git
        .commit(REPO, "refs/pull/8/head", Some(&head), &[], "same");
    s.add_branch_pull(BranchPull {
        number: 8,
        title: "Feature",
        body: "Adds feature.txt",
        author: "alice",
        branch: "feature",
        head: &head,
        base: &base,
        diff: "+v1\n",
    });
    s.model
        .reply(tool("echo v2 > feature.txt"), "tool_use", usage(1000, 10));
    s.model
        .reply(text("feature.txt is now v2."), "end_turn", usage(1100, 10));
    let (_run_id, _) = ask_code(&s, 8, true, "bump feature.txt to v2").await;
    let body = wait_done(&s, 8).await;
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ✅ done

    > /kodx code bump feature.txt to v2

    **Pushed:** commit `[hex]` to `feature`.

    feature.txt is now v2.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 2,100 | 20 | 0 | 0 | $0.0066 of $2.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code></sub>
    "#)
    });
    let new = s.git.branch_sha(REPO, "feature").unwrap();
    assert_ne!(new, head);
    assert_eq!(
        s.git.ref_sha(REPO, "feature~1").unwrap(),
        head,
        "not forced: on top of the old head"
    );
    assert_eq!(
        s.git.file_at(REPO, "feature", "feature.txt").unwrap(),
        b"v2\n"
    );
    let pushed = format!("**Pushed:** commit `{}` to `feature`.", &new[..12]);
    assert!(body.lines().any(|l| l == pushed), "{body}");
    assert!(
        s.github.created_pulls(REPO).is_empty(),
        "no new pull request"
    );
    s.finish().await;
}

#[tokio::test]
async fn code_on_a_fork_pull_request_opens_a_new_one_and_leaves_the_fork_alone() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    let fork_url = s.git.create_repo(
        "mallory/widgets",
        "patch",
        &[
            ("README.md", b"# widgets\n", 0o644),
            ("fork.txt", b"fork\n", 0o644),
        ],
    );
    let fork_head = s.git.branch_sha("mallory/widgets", "patch").unwrap();
    // GitHub keeps the fork's head as refs/pull/9/head in the base repository.
    let head = s
        .git
        .create_pull_ref(REPO, 9, &[("fork.txt", b"fork\n", 0o644)]);
    let base = s.git.branch_sha(REPO, "main").unwrap();
    s.github.add_pull(
        REPO,
        9,
        "From a fork",
        "Adds fork.txt",
        "mallory",
        FakeHead {
            ref_name: "patch".into(),
            sha: head,
            repo: Some("mallory/widgets".into()),
            clone_url: fork_url,
        },
        FakeBase {
            ref_name: "main".into(),
            sha: base,
        },
        "+fork\n",
    );
    s.model
        .reply(tool("echo fixed >> fork.txt"), "tool_use", usage(1000, 10));
    s.model
        .reply(text("Appended to fork.txt."), "end_turn", usage(1100, 10));
    let (run_id, _) = ask_code(&s, 9, true, "append fixed to fork.txt").await;
    let body = wait_done(&s, 9).await;
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ✅ done

    > /kodx code append fixed to fork.txt

    **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/10

    Appended to fork.txt.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 2,100 | 20 | 0 | 0 | $0.0066 of $2.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code></sub>
    "#)
    });
    let pulls = s.github.created_pulls(REPO);
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    let branch = format!("kodx/pr-9-{}", &run_id[..8]);
    assert_eq!(pulls[0].head, branch);
    assert_eq!(pulls[0].base, "main");
    assert!(
        pulls[0].body.contains("#9") && !pulls[0].body.contains("Closes"),
        "{}",
        pulls[0].body
    );
    assert_eq!(
        s.git.file_at(REPO, &branch, "fork.txt").unwrap(),
        b"fork\nfixed\n"
    );
    assert_eq!(
        s.git.branch_sha("mallory/widgets", "patch").unwrap(),
        fork_head,
        "the fork is never pushed to"
    );
    assert!(
        s.git
            .requests()
            .iter()
            .all(|r| !r.path_and_query.contains("mallory")),
        "the fork is not even fetched"
    );
    s.finish().await;
}

#[tokio::test]
async fn a_run_without_changes_says_so_with_the_last_message() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    s.github.add_issue(REPO, 7, "Nothing", "", "carol");
    s.model
        .reply(tool("cat README.md"), "tool_use", usage(500, 5));
    s.model.reply(
        text("The README is already right; nothing to change."),
        "end_turn",
        usage(600, 5),
    );
    let _ = ask_code(&s, 7, false, "fix the README if needed").await;
    let body = wait_done(&s, 7).await;
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ✅ done — no changes

    > /kodx code fix the README if needed

    No changes were made to the repository.

    The README is already right; nothing to change.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 1,100 | 10 | 0 | 0 | $0.0035 of $2.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code></sub>
    "#)
    });
    assert!(s.github.created_pulls(REPO).is_empty());
    let branches = s
        .git
        .git(&s.git.bare_path(REPO), &["branch", "--list", "kodx/*"]);
    assert!(branches.stdout.is_empty(), "no branch pushed");
    s.finish().await;
}

#[tokio::test]
async fn the_cost_limit_of_the_repository_config_ends_the_run() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    s.github.add_issue(REPO, 7, "Big", "", "carol");
    s.github
        .set_file(REPO, ".github/kodx.yml", "cost_limit: { code: 0.01 }\n");
    // 2,000 input tokens at $3/M and 1,000 output at $15/M: $0.021 > $0.01 after one call.
    s.model
        .reply(tool("echo x > x.txt"), "tool_use", usage(2000, 1000));
    s.model
        .reply(text("never reached"), "end_turn", usage(10, 1));
    let _ = ask_code(&s, 7, false, "do a lot").await;
    let body = wait_done(&s, 7).await;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ❌ stopped — cost limit reached

    > /kodx code do a lot

    ```text
    cost limit reached: $0.0000 spent of the $0.0100 limit, and the next model call could cost up to $0.0541; the last call asked for a summary
    ```

    Nothing was pushed, so there is nothing to continue: raise the limit in `.github/kodx.yml` and run `/kodx code` again.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 1 | 2,000 | 1,000 | 0 | 0 | $0.0210 of $0.0100 | [duration] (agent [duration]) | `cost_limit_exceeded` |

    <sub>kodx run <code>[run]</code></sub>
    "#));
    assert!(
        s.github.created_pulls(REPO).is_empty(),
        "a run that changed nothing pushes nothing"
    );
    s.finish().await;
}

/// A run its step limit stops still delivers what it did: a draft pull request marked
/// incomplete, its last call (without tools) asking for the summary (issue 12).
#[tokio::test]
async fn a_run_stopped_by_its_step_limit_opens_a_draft_pull_request_of_its_work() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    s.github.add_issue(REPO, 7, "Big", "", "carol");
    s.github
        .set_file(REPO, ".github/kodx.yml", "max_iterations: 2\n");
    s.model
        .reply(tool("echo x > x.txt"), "tool_use", usage(2000, 100));
    s.model.reply(
        text("Wrote x.txt; y.txt is left."),
        "end_turn",
        usage(2100, 20),
    );
    let _ = ask_code(&s, 7, false, "do a lot").await;
    let body = wait_done(&s, 7).await;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ❌ stopped — step limit reached

    > /kodx code do a lot

    ```text
    the run made its 2 model calls (max_iterations); the last one asked for a summary
    ```

    **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/8

    It holds the work done so far, marked incomplete. To go on from here, comment `/kodx continue` where it was asked (the repository's limits again), `/kodx continue $2` (a cost limit of $2) or `/kodx continue 20 steps` (a step limit of 20); or finish it by hand.

    <details><summary>The agent's last message</summary>

    Wrote x.txt; y.txt is left.

    </details>

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 4,100 | 120 | 0 | 0 | $0.0141 of $2.00 | [duration] (agent [duration]) | `max_iterations` |

    <sub>kodx run <code>[run]</code></sub>
    "#));
    // The second and last call had no tools and asked for the summary.
    let requests = s.model.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        requests[1].body["tool_choice"],
        serde_json::json!({"type": "none"})
    );
    let pulls = s.github.created_pulls(REPO);
    assert_eq!(pulls.len(), 1, "{pulls:?}");
    let pr = &pulls[0];
    assert!(pr.draft, "{pr:?}");
    assert!(pr.title.starts_with("[incomplete] do a lot"), "{pr:?}");
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(pr.body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    **Incomplete:** the run stopped before it finished (the run made its 2 model calls (max_iterations); the last one asked for a summary). This is what it did so far. To go on from here, comment `/kodx continue` where it was asked (the repository's limits again), `/kodx continue $2` (a cost limit of $2) or `/kodx continue 20 steps` (a step limit of 20); or finish it by hand.

    Wrote x.txt; y.txt is left.

    Closes #7

    Requested by @alice with `/kodx code`.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 4,100 | 120 | 0 | 0 | $0.0141 of $2.00 | [duration] (agent [duration]) | `max_iterations` |


    <sub>kodx run <code>[run]</code></sub>
    "#));
    assert_eq!(
        s.git
            .file_at(REPO, &format!("refs/heads/{}", pr.head), "x.txt")
            .as_deref(),
        Some(&b"x\n"[..])
    );
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ❌ stopped — step limit reached

    > /kodx code do a lot

    ```text
    the run made its 2 model calls (max_iterations); the last one asked for a summary
    ```

    **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/8

    It holds the work done so far, marked incomplete. To go on from here, comment `/kodx continue` where it was asked (the repository's limits again), `/kodx continue $2` (a cost limit of $2) or `/kodx continue 20 steps` (a step limit of 20); or finish it by hand.

    <details><summary>The agent's last message</summary>

    Wrote x.txt; y.txt is left.

    </details>

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 4,100 | 120 | 0 | 0 | $0.0141 of $2.00 | [duration] (agent [duration]) | `max_iterations` |

    <sub>kodx run <code>[run]</code></sub>
    "#));
    s.finish().await;
}

#[tokio::test]
async fn a_run_stopped_by_its_limit_pushes_nothing_when_the_repository_says_discard() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    s.github.add_issue(REPO, 7, "Big", "", "carol");
    s.github.set_file(
        REPO,
        ".github/kodx.yml",
        "max_iterations: 2\npr: { on_limit: discard }\n",
    );
    s.model
        .reply(tool("echo x > x.txt"), "tool_use", usage(2000, 100));
    s.model
        .reply(text("Wrote x.txt."), "end_turn", usage(2100, 20));
    let _ = ask_code(&s, 7, false, "do a lot").await;
    let body = wait_done(&s, 7).await;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ❌ stopped — step limit reached

    > /kodx code do a lot

    ```text
    the run made its 2 model calls (max_iterations); the last one asked for a summary
    ```

    Nothing was pushed, so there is nothing to continue: raise the limit in `.github/kodx.yml` and run `/kodx code` again.

    <details><summary>The agent's last message</summary>

    Wrote x.txt.

    </details>

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 4,100 | 120 | 0 | 0 | $0.0141 of $2.00 | [duration] (agent [duration]) | `max_iterations` |

    <sub>kodx run <code>[run]</code></sub>
    "#));
    assert!(
        s.github.created_pulls(REPO).is_empty(),
        "on_limit: discard pushes nothing"
    );
    assert!(!body.contains("**Pull request:**"), "{body}");
    s.finish().await;
}

#[tokio::test]
async fn a_failing_setup_script_is_reported_with_its_exit_code() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    s.github.add_issue(REPO, 7, "Setup", "", "carol");
    s.github.set_file(
        REPO,
        ".github/kodx.yml",
        "setup_script: |\n  echo installing deps\n  exit 3\n",
    );
    let _ = ask_code(&s, 7, false, "anything").await;
    let body = wait_done(&s, 7).await;
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ❌ setup script failed

    > /kodx code anything

    ```text
    setup script failed with exit code 3; last lines of its output:
    installing deps
    ```

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 0 | 0 | 0 | 0 | 0 | $0.0000 of $2.00 | [duration] (agent [duration]) | `setup_failed` |

    <sub>kodx run <code>[run]</code></sub>
    "#)
    });
    assert!(
        s.model.requests().is_empty(),
        "no model call after a failed setup"
    );
    s.finish().await;
}

#[tokio::test]
async fn kill_9_mid_code_run_then_restart_opens_one_pull_request() {
    let engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    s.github.add_issue(REPO, 7, "Slow", "", "carol");
    s.model.reply(
        tool("echo one > one.txt; sleep 300"),
        "tool_use",
        usage(1000, 10),
    );
    let (run_id, _) = ask_code(&s, 7, false, "write one.txt").await;
    s.wait_for("the first model call", LONG, || {
        !s.model.requests().is_empty()
    })
    .await;
    // The tool call runs in the container.
    common::wait_for_process(&engine, &format!("kodx-{run_id}"), "sleep 300", LONG).await;
    s.kill().await;
    // The restarted run starts over in a fresh container.
    s.model
        .reply(tool("echo one > one.txt"), "tool_use", usage(1000, 10));
    s.model
        .reply(text("Wrote one.txt."), "end_turn", usage(1000, 10));
    s.restart().await;
    let body = wait_done(&s, 7).await;
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ✅ done

    > /kodx code write one.txt

    **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/8

    Wrote one.txt.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 2,000 | 20 | 0 | 0 | $0.0063 of $2.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code></sub>
    "#)
    });
    let pulls = s.github.created_pulls(REPO);
    assert_eq!(pulls.len(), 1, "{pulls:#?}");
    assert_eq!(pulls[0].head, format!("kodx/issue-7-{}", &run_id[..8]));
    assert_eq!(bot_comments(&s, 7).len(), 1, "one status comment");
    common::assert_gone(&engine, &format!("kodx-{run_id}")).await;
    s.finish().await;
}

#[tokio::test]
async fn a_push_github_refuses_is_explained_in_the_comment() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    s.github.add_issue(REPO, 7, "CI", "", "carol");
    // GitHub's answer to an App without the workflows permission, from a pre-receive hook.
    let hook = s.git.bare_path(REPO).join("hooks/pre-receive");
    std::fs::create_dir_all(hook.parent().unwrap()).unwrap();
    std::fs::write(
        &hook,
        "#!/bin/sh\necho 'refusing to allow a GitHub App to create or update workflow `.github/workflows/ci.yml` without `workflows` permission' >&2\nexit 1\n",
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
    s.model.reply(
        tool("mkdir -p .github/workflows && echo 'on: push' > .github/workflows/ci.yml"),
        "tool_use",
        usage(1000, 10),
    );
    s.model
        .reply(text("Added a CI workflow."), "end_turn", usage(1000, 10));
    let _ = ask_code(&s, 7, false, "add CI").await;
    let body = wait_done(&s, 7).await;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ❌ failed

    > /kodx code add CI

    ```text
    GitHub refused the push to `kodx/issue-7-[hex]`: the App is not allowed to change files under .github/workflows/, such as `.github/workflows/ci.yml` (it lacks the workflows permission); grant the App the workflows permission, or ask for a change that leaves .github/workflows/ alone (GitHub said: refs/heads/kodx/issue-7-[hex]: pre-receive hook declined; the server said: refusing to allow a GitHub App to create or update workflow `.github/workflows/ci.yml` without `workflows` permission)
    ```

    <details><summary>The agent's last message</summary>

    Added a CI workflow.

    </details>

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 2,000 | 20 | 0 | 0 | $0.0063 of $2.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code></sub>
    "#));
    assert!(s.github.created_pulls(REPO).is_empty());
    s.finish().await;
}

#[tokio::test]
async fn a_file_over_the_size_limit_refuses_the_commit() {
    let _engine = common::require_engine!();
    let mut s = Served::start(Options {
        workers: true,
        settings: Some("status_interval_secs = 0.2\nmax_commit_file_bytes = 1000\n"),
        ..Options::default()
    })
    .await;
    s.github.add_issue(REPO, 7, "Big", "", "carol");
    s.model.reply(
        tool("head -c 5000 /dev/zero > big.bin"),
        "tool_use",
        usage(1000, 10),
    );
    s.model
        .reply(text("Wrote big.bin."), "end_turn", usage(1000, 10));
    let _ = ask_code(&s, 7, false, "write a big file").await;
    let body = wait_done(&s, 7).await;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ❌ failed

    > /kodx code write a big file

    ```text
    The change could not be committed: the change to `big.bin` is 5000 bytes, over the limit of 1000 bytes for a changed file; nothing was committed
    ```

    <details><summary>The agent's last message</summary>

    Wrote big.bin.

    </details>

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 2,000 | 20 | 0 | 0 | $0.0063 of $2.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code></sub>
    "#));
    assert!(s.github.created_pulls(REPO).is_empty());
    s.finish().await;
}

#[tokio::test]
async fn ignored_build_output_over_the_limits_does_not_fail_the_run() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    s.git.commit_on_branch(
        REPO,
        "main",
        &[(".gitignore", b"target/\n", 0o644)],
        "ignore build output",
    );
    s.github.add_issue(REPO, 7, "Build it", "", "carol");
    // 120 MB of build output (over the 100 MiB export limit) under an ignored directory,
    // a rule the model adds itself, and the real change.
    s.model.reply(
        tool(
            "mkdir -p target/release dist && head -c 120M /dev/zero > target/release/app.bin \
             && echo 'dist/' >> .gitignore && head -c 20M /dev/zero > dist/bundle.js \
             && echo hello > hello.txt",
        ),
        "tool_use",
        usage(1000, 10),
    );
    s.model.reply(
        text("Built it and wrote hello.txt."),
        "end_turn",
        usage(1000, 10),
    );
    let (run_id, _) = ask_code(&s, 7, false, "build and say hello").await;
    let body = wait_done(&s, 7).await;
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ✅ done

    > /kodx code build and say hello

    **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/8

    Built it and wrote hello.txt.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 2,000 | 20 | 0 | 0 | $0.0063 of $2.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code></sub>
    "#)
    });
    let branch = format!("kodx/issue-7-{}", &run_id[..8]);
    let tree = s.git.ls_tree(REPO, &format!("refs/heads/{branch}"));
    let mut paths: Vec<&str> = tree.iter().map(|(_, p)| p.as_str()).collect();
    paths.retain(|p| !p.starts_with("src/") && *p != "README.md");
    assert_eq!(
        paths,
        [".gitignore", "hello.txt"],
        "what `git add -A` commits: {tree:?}"
    );
    s.finish().await;
}

#[tokio::test]
async fn a_spent_monthly_budget_refuses_new_runs() {
    let _engine = common::require_engine!();
    let mut s = Served::start(Options {
        workers: true,
        settings: Some("status_interval_secs = 0.2\nmonthly_budget_usd = 0.10\n"),
        ..Options::default()
    })
    .await;
    s.github.add_issue(REPO, 7, "Budget", "", "carol");
    // The first run may spend at most what is left of the budget ($0.10, below the $2.00
    // code limit): one call bills $0.0915, then the next cannot fit and the run stops.
    s.model
        .reply(tool("echo x > x.txt"), "tool_use", usage(30_000, 100));
    s.model
        .reply(text("never reached"), "end_turn", usage(10, 1));
    let _ = ask_code(&s, 7, false, "first").await;
    let body = wait_done(&s, 7).await;
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ❌ stopped — cost limit reached

    > /kodx code first

    ```text
    cost limit reached: $0.0915 spent of the $0.1000 limit, and the next model call could cost up to $0.1026
    ```

    **Pull request:** http://127.0.0.1:[port]/acme/widgets/pull/8

    It holds the work done so far, marked incomplete. To go on from here, comment `/kodx continue` where it was asked (the repository's limits again), `/kodx continue $2` (a cost limit of $2) or `/kodx continue 20 steps` (a step limit of 20); or finish it by hand.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 1 | 30,000 | 100 | 0 | 0 | $0.0915 of $0.1000 | [duration] (agent [duration]) | `cost_limit_exceeded` |

    <sub>kodx run <code>[run]</code></sub>
    "#));
    // Now the month's budget is spent: the next command is refused before anything runs.
    let calls = s.model.requests().len();
    let _ = ask_code(&s, 7, false, "second").await;
    s.bot_comment_where(7, "the refusal", |c| c.body.contains("monthly budget"))
        .await;
    s.finish().await;
    assert_eq!(s.model.requests().len(), calls, "no model call");
}
