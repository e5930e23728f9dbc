//! Merge runs (SPEC §12, "Mergeable pull requests"): the real `kodx serve`, real git over
//! smart HTTP, a fake GitHub whose `mergeable` is `null` at first and then computed from
//! the real repository (`git merge-tree`), a scripted fake Anthropic and the real Docker
//! engine. A pull request kodx opened whose base conflicts with it gets an ordinary run
//! whose workspace holds the merge with conflict markers; its change is pushed as a merge
//! commit (first parent the old head, second the base's tip), never while a marker is
//! left. A `push` to the base (GitHub's documented payload) starts it with
//! `pr.keep_mergeable`; a pull request that is only behind, or whose branch someone else
//! pushed to, is left alone. The fake's `mergeable` fits `@octokit/openapi`.

use serde_json::{json, Value};

use crate::common;
use crate::common::follow_up::{ended, first_user_text, github_get, kodx_pull, push_payload};
use crate::common::openapi;
use crate::common::serve::{delivery_id, text, tool, usage, Served, REPO};

/// The parents of `rev` in the git server's repository.
fn parents(s: &Served, rev: &str) -> Vec<String> {
    let repo = git2::Repository::open_bare(s.git.bare_path(REPO)).unwrap();
    let commit = repo.revparse_single(rev).unwrap().peel_to_commit().unwrap();
    commit.parent_ids().map(|p| p.to_string()).collect()
}

/// Commits `files` on `main` and delivers the push; the merge runs it queued.
async fn push_to_main(s: &Served, files: &[(&str, &[u8], u32)], message: &str) -> Vec<String> {
    let before = s.git.branch_sha(REPO, "main").unwrap();
    let after = s.git.commit_on_branch(REPO, "main", files, message);
    let (status, answer) = s
        .deliver("push", &delivery_id(), &push_payload(s, &before, &after))
        .await;
    match status {
        202 => answer["run_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect(),
        200 => Vec::new(),
        other => panic!("push: {other} {answer}"),
    }
}

/// The fake's answer to `GET …/pulls/{number}`, read with a token kodx was given.
async fn pull_answer(s: &Served, number: u64) -> Value {
    let token = s.github.token_grants().pop().expect("a token").token;
    github_get(s, &token, &format!("pulls/{number}")).await
}

/// The model resolves `a.txt` only if it holds conflict markers (else the markers check
/// of the delivery would have nothing to refuse, and the test would prove nothing).
fn script_resolution(s: &Served) {
    s.model.reply(
        tool("grep -q '^<<<<<<< ' a.txt && grep -q '^>>>>>>> ' a.txt && printf 'one\\nother\\n' > a.txt"),
        "tool_use",
        usage(1000, 10),
    );
    s.model.reply(
        text("Kept both lines of a.txt."),
        "end_turn",
        usage(1100, 10),
    );
}

#[tokio::test]
async fn update_on_a_conflicted_pull_request_resolves_it_in_a_merge_commit() {
    let _engine = common::require_engine!();
    let mut s = Served::with_run_pages().await;
    let pr = kodx_pull(&s, "ci_repair: 0\n", "Added a.txt.").await;
    let head = s.git.branch_sha(REPO, &pr.head).unwrap();
    let base = s.git.commit_on_branch(
        REPO,
        "main",
        &[("a.txt", b"other\n", 0o644)],
        "Another a.txt",
    );
    let calls = s.model.requests().len();
    script_resolution(&s);
    let update = s.comment(pr.number, "alice", "/kodx update").await;
    let status = s.finished_status(pr.number).await;
    assert!(status.contains("### ✅"), "{status}\n{}", s.log());
    assert!(
        status.contains("@alice asked with `/kodx update`, and merging `main` into this pull request conflicted (GitHub's `mergeable_state`: `dirty`)"),
        "{status}"
    );
    s.reaction(&s.trigger(&update), "eyes").await;
    let page = s.linked_run_page(&status).await;
    assert!(
        page.contains("Mergeable state (as GitHub said when kodx decided): <code>dirty</code>"),
        "{page}"
    );

    // The model was told the files and both commits, in a workspace with the markers.
    let prompt = first_user_text(&s, calls);
    assert!(prompt.contains("This is a merge run"), "{prompt}");
    assert!(
        prompt.contains(&format!(
            "`{}` at {} (this pull request's head) and `main` at {} (the base's tip)",
            pr.head,
            &head[..7],
            &base[..7]
        )),
        "{prompt}"
    );
    assert!(
        prompt.contains("- `a.txt` (changed on both sides: markers left in it)"),
        "{prompt}"
    );

    // One merge commit on the branch: the old head, then the base's tip.
    let tip = s.git.branch_sha(REPO, &pr.head).unwrap();
    assert_eq!(parents(&s, &tip), vec![head.clone(), base.clone()]);
    let merged = s.git.file_at(REPO, &tip, "a.txt").unwrap();
    assert_eq!(merged, b"one\nother\n");
    assert!(!kodx::git::has_marker(&merged));

    // GitHub's word is on the run's page, and the merge commit is kodx's (a later update
    // recognises the branch).
    let db = s.db().await;
    let runs = db.recent_runs(10).await.unwrap();
    let merge = runs
        .iter()
        .find(|r| r.kind().as_str() == "merge")
        .expect("a merge run");
    assert_eq!(merge.mergeable_state.as_deref(), Some("dirty"));
    assert!(db
        .kodx_commit_run(REPO, pr.number as i64, &tip)
        .await
        .unwrap()
        .is_some());
    db.close().await;
    s.finish().await;
}

#[tokio::test]
async fn a_merge_with_a_marker_left_is_not_pushed() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    let pr = kodx_pull(&s, "ci_repair: 0\n", "Added a.txt.").await;
    let head = s.git.branch_sha(REPO, &pr.head).unwrap();
    s.git.commit_on_branch(
        REPO,
        "main",
        &[("a.txt", b"other\n", 0o644), ("b.txt", b"b\n", 0o644)],
        "Another a.txt",
    );
    // The model touches another file and leaves a.txt as it is.
    s.model
        .reply(tool("echo note > NOTES.md"), "tool_use", usage(1000, 10));
    s.model.reply(text("Done."), "end_turn", usage(1100, 10));
    s.comment(pr.number, "alice", "/kodx update").await;
    let status = s.finished_status(pr.number).await;
    assert!(
        status.contains("conflict markers are still in `a.txt`; a merge is committed only once every conflict is resolved"),
        "{status}\n{}",
        s.log()
    );
    assert_eq!(
        s.git.branch_sha(REPO, &pr.head).unwrap(),
        head,
        "nothing pushed"
    );
    s.finish().await;
}

#[tokio::test]
async fn a_push_to_the_base_keeps_the_pull_request_mergeable_and_leaves_others_alone() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    let pr = kodx_pull(
        &s,
        "ci_repair: 0\npr:\n  keep_mergeable: true\n",
        "Added a.txt.",
    )
    .await;
    let head = s.git.branch_sha(REPO, &pr.head).unwrap();
    let calls = s.model.requests().len();

    // Only behind: GitHub says it merges cleanly, and kodx leaves it alone.
    let runs = push_to_main(&s, &[("b.txt", b"b\n", 0o644)], "Add b.txt").await;
    assert_eq!(runs.len(), 1, "one pull request kodx opened goes into main");
    let why = ended(&s, &runs[0]).await;
    assert_eq!(why, "dismissed", "{}", s.log());
    assert_eq!(s.git.branch_sha(REPO, &pr.head).unwrap(), head);
    assert_eq!(s.model.requests().len(), calls, "no model call");
    let db = s.db().await;
    let run = db.get_run(&runs[0]).await.unwrap().unwrap();
    assert_eq!(run.mergeable_state.as_deref(), Some("behind"));

    // Conflicted: GitHub answers `null` first, then `dirty`; a merge run resolves it.
    script_resolution(&s);
    let runs = push_to_main(&s, &[("a.txt", b"other\n", 0o644)], "Another a.txt").await;
    let base = s.git.branch_sha(REPO, "main").unwrap();
    assert_eq!(ended(&s, &runs[0]).await, "end_turn", "{}", s.log());
    let status = s.finished_status(pr.number).await;
    assert!(
        status.contains("A push to `main` left this pull request conflicted (GitHub's `mergeable_state`: `dirty`)"),
        "{status}"
    );
    let tip = s.git.branch_sha(REPO, &pr.head).unwrap();
    assert_eq!(parents(&s, &tip), vec![head.clone(), base]);
    assert_eq!(s.git.file_at(REPO, &tip, "a.txt").unwrap(), b"one\nother\n");
    let asked: Vec<_> = s
        .github
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.ends_with(&format!("/pulls/{}", pr.number)))
        .collect();
    assert!(asked.len() >= 2, "mergeable was asked again after null");

    // The same push delivered again starts nothing.
    let before = parents(&s, "main")[0].clone();
    let (status_code, answer) = s
        .deliver(
            "push",
            &delivery_id(),
            &push_payload(&s, &before, &s.git.branch_sha(REPO, "main").unwrap()),
        )
        .await;
    assert_eq!(status_code, 200, "{answer}");

    // Someone else pushes to the branch: the next conflicting push leaves it alone.
    let theirs = s.git.commit_on_branch(
        REPO,
        &pr.head,
        &[("c.txt", b"theirs\n", 0o644)],
        "A maintainer's commit",
    );
    let calls = s.model.requests().len();
    let runs = push_to_main(&s, &[("a.txt", b"third\n", 0o644)], "A third a.txt").await;
    assert_eq!(ended(&s, &runs[0]).await, "dismissed");
    let run = db.get_run(&runs[0]).await.unwrap().unwrap();
    assert!(
        run.result
            .unwrap_or_default()
            .contains("someone else pushed"),
        "{}",
        s.log()
    );
    assert_eq!(s.git.branch_sha(REPO, &pr.head).unwrap(), theirs);
    assert_eq!(s.model.requests().len(), calls, "no model call");

    // What the fake answers fits GitHub's description: `null` first, then computed.
    s.git.commit_on_branch(
        REPO,
        "main",
        &[("a.txt", b"fourth\n", 0o644)],
        "A fourth a.txt",
    );
    let first = pull_answer(&s, pr.number).await;
    let then = pull_answer(&s, pr.number).await;
    assert_eq!(
        (&first["mergeable"], &first["mergeable_state"]),
        (&json!(null), &json!("unknown"))
    );
    assert_eq!(
        (&then["mergeable"], &then["mergeable_state"]),
        (&json!(false), &json!("dirty"))
    );
    let described = openapi::extract("actions");
    let schema = &described["GET /repos/{owner}/{repo}/pulls/{pull_number} 200 (mergeable)"];
    for answer in [&first, &then] {
        let broken = openapi::violations(answer, schema, "pull");
        assert!(broken.is_empty(), "{broken:#?}\n{answer:#}");
    }

    // A push to another branch concerns none of kodx's pull requests.
    let other = s
        .git
        .commit_on_branch(REPO, "dev", &[("d.txt", b"d\n", 0o644)], "dev");
    let mut payload = push_payload(&s, &other, &other);
    payload["ref"] = json!("refs/heads/dev");
    let (code, answer) = s.deliver("push", &delivery_id(), &payload).await;
    assert_eq!(code, 200);
    assert_eq!(
        answer["ignored"],
        "no open pull request kodx opened goes into this branch"
    );
    db.close().await;
    s.finish().await;
}

#[tokio::test]
async fn without_keep_mergeable_a_push_runs_nothing() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    let pr = kodx_pull(&s, "ci_repair: 0\n", "Added a.txt.").await;
    let head = s.git.branch_sha(REPO, &pr.head).unwrap();
    let calls = s.model.requests().len();
    let runs = push_to_main(&s, &[("a.txt", b"other\n", 0o644)], "Another a.txt").await;
    assert_eq!(ended(&s, &runs[0]).await, "dismissed");
    assert_eq!(s.git.branch_sha(REPO, &pr.head).unwrap(), head);
    assert_eq!(s.model.requests().len(), calls, "no model call");
    s.finish().await;
}
