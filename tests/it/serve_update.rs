//! `/kodx update` (SPEC §12, "Mergeable pull requests"): the real `kodx serve`, real git
//! over smart HTTP, a fake GitHub, a scripted fake Anthropic and the real Docker engine. On
//! a pull request kodx opened and its base moved on, the base is merged into the branch
//! with a merge commit (first parent the old head, second the base's tip), pushed, without
//! a model call; a branch someone else pushed to is left alone. Conflicts start a merge
//! run (`serve_merge.rs`).

use crate::common;
use crate::common::follow_up::kodx_pull;
use crate::common::serve::{redactions, Served, REPO};

/// The parents of `rev` in the git server's repository.
fn parents(s: &Served, rev: &str) -> Vec<String> {
    let repo = git2::Repository::open_bare(s.git.bare_path(REPO)).unwrap();
    let commit = repo.revparse_single(rev).unwrap().peel_to_commit().unwrap();
    commit.parent_ids().map(|p| p.to_string()).collect()
}

#[tokio::test]
async fn update_merges_the_base_without_the_model_and_leaves_others_branches_alone() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    let pr = kodx_pull(&s, "ci_repair: 0\n", "Added a.txt.").await;
    let head = s.git.branch_sha(REPO, &pr.head).unwrap();
    let calls = s.model.requests().len();

    // Up to date: nothing to merge.
    s.comment(pr.number, "alice", "/kodx update").await;
    let answer = s
        .bot_comment_where(pr.number, "the up-to-date answer", |c| {
            c.body.contains("up to date")
        })
        .await;
    redactions(&[], &[]).bind(|| insta::assert_snapshot!(answer.body, @"@alice `kodx/issue-7-[hex]` is up to date with `main`: there is nothing to merge."));

    // The base moves on: merged with a merge commit, no model call.
    let base = s
        .git
        .commit_on_branch(REPO, "main", &[("b.txt", b"two\n", 0o644)], "Add b.txt");
    let update = s.comment(pr.number, "alice", "/kodx update").await;
    let merged = s
        .bot_comment_where(pr.number, "the merge", |c| c.body.starts_with("Merged"))
        .await;
    redactions(&[&update], &[]).bind(|| {
        insta::assert_snapshot!(merged.body, @"
    Merged `main` ([hex]) into `kodx/issue-7-[hex]` with merge commit [hex]; no model was called.

    <sub>kodx run <code>[run]</code></sub>
    ")
    });
    s.reaction(&s.trigger(&update), "+1").await;
    let tip = s.git.branch_sha(REPO, &pr.head).unwrap();
    assert_eq!(parents(&s, &tip), vec![head.clone(), base.clone()]);
    assert_eq!(
        s.git.file_at(REPO, &tip, "b.txt").as_deref(),
        Some(&b"two\n"[..])
    );
    assert_eq!(
        s.git.file_at(REPO, &tip, "a.txt").as_deref(),
        Some(&b"one\n"[..])
    );
    assert_eq!(s.model.requests().len(), calls, "no model call");

    // Someone else pushes to the branch: kodx leaves it alone.
    let theirs = s.git.commit_on_branch(
        REPO,
        &pr.head,
        &[("c.txt", b"theirs\n", 0o644)],
        "A maintainer's commit",
    );
    s.git
        .commit_on_branch(REPO, "main", &[("d.txt", b"more\n", 0o644)], "Add d.txt");
    s.comment(pr.number, "alice", "/kodx update").await;
    let left = s
        .bot_comment_where(pr.number, "the refusal", |c| {
            c.body.contains("does not update this pull request")
        })
        .await;
    redactions(&[], &[]).bind(|| insta::assert_snapshot!(left.body, @"@alice kodx does not update this pull request: its branch's head is not a commit kodx made (someone else pushed to it, or kodx did not open it), and kodx leaves such a branch alone."));
    assert_eq!(
        s.git.branch_sha(REPO, &pr.head).unwrap(),
        theirs,
        "not touched"
    );
    s.finish().await;
}
