//! Failed GitHub Actions jobs re-run once before a CI repair is paid for (SPEC §12,
//! "Mergeable pull requests"): the real `kodx serve`, a fake GitHub whose Actions answers
//! are checked against `@octokit/openapi` (`tests/data/openapi-actions.json`), a scripted
//! fake Anthropic, real git and the real Docker engine.
//!
//! - A flaky failure: the failed jobs are re-run, the repair is dismissed, no model call;
//!   the re-run passes and nothing more happens.
//! - A real failure: after the re-run fails too, one repair run, whose status comment and
//!   failure report say the jobs were re-run first.
//! - Without Actions write: kodx repairs at once and says so once on the pull request.
//! - Other CI (a commit status) cannot be re-run: straight to repair.

use serde_json::Value;

use crate::common;
use crate::common::fake_github::{FakeCheckRunSpec, FakeSuite, ACTIONS_SLUG};
use crate::common::follow_up::{
    ci_event, ended, first_user_text, github_get, kodx_pull, red_actions_suite,
};
use crate::common::openapi;
use crate::common::serve::{text, tool, usage, Served, INSTALLATION, REPO};

/// The `check_suite.completed` event of Actions suite `suite` on `head` of pull `pr`.
fn suite_completed(
    s: &Served,
    suite: u64,
    head: &str,
    branch: &str,
    pr: u64,
    conclusion: &str,
) -> Value {
    s.github.check_suite_completed_payload(
        REPO,
        INSTALLATION,
        suite,
        ACTIONS_SLUG,
        head,
        branch,
        conclusion,
        &[pr],
    )
}

/// The fake's answer to `GET …/actions/jobs/{job}`, read with a token kodx was given, fits
/// GitHub's description of it.
async fn job_fits_the_description(s: &Served, job: u64) {
    let token = s
        .github
        .token_grants()
        .into_iter()
        .rev()
        .find(|g| {
            g.permissions
                .as_ref()
                .is_some_and(|p| p.get("actions").is_some_and(|a| a == "write"))
        })
        .expect("a token with actions: write")
        .token;
    let answer = github_get(s, &token, &format!("actions/jobs/{job}")).await;
    let described = openapi::extract("actions");
    let schema = &described["GET /repos/{owner}/{repo}/actions/jobs/{job_id} 200"];
    let broken = openapi::violations(&answer, schema, "job");
    assert!(broken.is_empty(), "{broken:#?}\n{answer:#}");
}

#[tokio::test]
async fn a_flaky_failure_is_rerun_without_a_model_call() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    let pr = kodx_pull(&s, "ci_repair: 1\n", "Added a.txt.").await;
    let head = s.git.branch_sha(REPO, &pr.head).unwrap();
    let suite = red_actions_suite(&s, &head);
    let failed_job = s.github.suite_runs(suite)[0];
    let payload = suite_completed(&s, suite, &head, &pr.head, pr.number, "failure");
    let run = ci_event(&s, "check_suite", &payload).await.unwrap();
    assert_eq!(ended(&s, &run).await, "dismissed");
    assert_eq!(
        s.github.reruns(),
        vec![suite],
        "the failed jobs' workflow run"
    );
    assert_eq!(s.model.requests().len(), 2, "no model call for the re-run");
    job_fits_the_description(&s, failed_job).await;
    // The twin workflow_run about the same commit, still showing the old failure: no second
    // re-run, no repair.
    let twin = s.github.workflow_run_completed_payload(
        REPO,
        INSTALLATION,
        555,
        suite,
        "CI",
        &head,
        &pr.head,
        "failure",
        &[pr.number],
    );
    let run = ci_event(&s, "workflow_run", &twin).await.unwrap();
    assert_eq!(ended(&s, &run).await, "dismissed");
    assert_eq!(s.github.reruns().len(), 1);
    // The re-run passes: nothing is posted, nothing is paid for.
    let rerun_job = s.github.suite_runs(suite)[0];
    assert_ne!(rerun_job, failed_job, "a re-run job has a new id");
    s.github.complete_check_run(rerun_job, "success");
    let payload = suite_completed(&s, suite, &head, &pr.head, pr.number, "success");
    let run = ci_event(&s, "check_suite", &payload).await.unwrap();
    assert_eq!(ended(&s, &run).await, "dismissed");
    assert_eq!(s.model.requests().len(), 2);
    assert_eq!(
        s.git.branch_sha(REPO, &pr.head).unwrap(),
        head,
        "nothing pushed"
    );
    assert!(s.github.refused().is_empty(), "{:?}", s.github.refused());
    s.finish().await;
}

#[tokio::test]
async fn a_failure_that_survives_the_rerun_is_repaired_and_says_so() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    let pr = kodx_pull(&s, "ci_repair: 1\n", "Added a.txt.").await;
    let head = s.git.branch_sha(REPO, &pr.head).unwrap();
    let suite = red_actions_suite(&s, &head);
    let payload = suite_completed(&s, suite, &head, &pr.head, pr.number, "failure");
    let run = ci_event(&s, "check_suite", &payload).await.unwrap();
    assert_eq!(ended(&s, &run).await, "dismissed");
    // The re-run fails again: now the repair is paid for.
    s.github
        .complete_check_run(s.github.suite_runs(suite)[0], "failure");
    s.model
        .reply(tool("echo two > a.txt"), "tool_use", usage(2000, 10));
    s.model
        .reply(text("a.txt now says two."), "end_turn", usage(2100, 10));
    let again = suite_completed(&s, suite, &head, &pr.head, pr.number, "failure");
    let run = ci_event(&s, "check_suite", &again).await.unwrap();
    assert_eq!(ended(&s, &run).await, "end_turn", "{}", s.log());
    let status = s.finished_status(pr.number).await;
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(status, @r#"
        <!-- kodx:{"run":"[hex]","v":1} -->
        ### ✅ done

        > CI repair of [hex]

        **Pushed:** commit `[hex]` to `kodx/issue-7-[hex]`.

        Before this repair kodx re-ran the failed GitHub Actions jobs once (`test`); they failed again, so the failure is not a flaky one.

        a.txt now says two.

        | model | API calls | input | output | cache write | cache read | cost | duration | stop |
        |---|--:|--:|--:|--:|--:|--:|--:|---|
        | claude-sonnet-4-5 | 2 | 4,100 | 20 | 0 | 0 | $0.0126 of $2.00 | [duration] (agent [duration]) | `end_turn` |

        <sub>kodx run <code>[run]</code></sub>
        "#);
    });
    let report = first_user_text(&s, 2);
    assert!(
        report.contains("The CI failure report:\\n````\\nBefore this repair kodx re-ran the failed GitHub Actions jobs once (`test`); they failed again"),
        "{report}"
    );
    assert_eq!(s.github.reruns(), vec![suite], "re-run once");
    assert_ne!(
        s.git.branch_sha(REPO, &pr.head).unwrap(),
        head,
        "the repair pushed"
    );
    s.finish().await;
}

#[tokio::test]
async fn without_actions_write_kodx_repairs_and_says_so_once() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    s.github.grant_actions_read_only();
    let pr = kodx_pull(&s, "ci_repair: 1\n", "Added a.txt.").await;
    let head = s.git.branch_sha(REPO, &pr.head).unwrap();
    let suite = red_actions_suite(&s, &head);
    s.model
        .reply(tool("echo two > a.txt"), "tool_use", usage(2000, 10));
    s.model
        .reply(text("a.txt now says two."), "end_turn", usage(2100, 10));
    let payload = suite_completed(&s, suite, &head, &pr.head, pr.number, "failure");
    let run = ci_event(&s, "check_suite", &payload).await.unwrap();
    assert_eq!(ended(&s, &run).await, "end_turn", "{}", s.log());
    let note = s
        .bot_comment_where(pr.number, "the note that jobs cannot be re-run", |c| {
            c.body.starts_with("kodx could not re-run")
        })
        .await;
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(note.body, @"
        kodx could not re-run the failed GitHub Actions jobs of [hex] before repairing: the App lacks the Actions write permission (GitHub gave no token that may re-run jobs). It repairs without re-running, here and on this pull request's next failures. To give flaky jobs one more try first, grant the App the **Actions: Read and write** permission; `ci_rerun: 0` in `.github/kodx.yml` turns re-running off.

        <sub>kodx run <code>[run]</code></sub>
        ");
    });
    s.finished_status(pr.number).await;
    assert!(s.github.reruns().is_empty());
    let notes = common::serve::bot_comments(&s, pr.number)
        .into_iter()
        .filter(|c| c.body.starts_with("kodx could not re-run"))
        .count();
    assert_eq!(notes, 1);
    s.finish().await;
}

#[tokio::test]
async fn a_failed_commit_status_goes_straight_to_repair() {
    let _engine = common::require_engine!();
    let mut s = Served::with_workers().await;
    let pr = kodx_pull(&s, "ci_repair: 1\n", "Added a.txt.").await;
    let head = s.git.branch_sha(REPO, &pr.head).unwrap();
    s.github
        .set_commit_status(REPO, &head, "ci/jenkins", "failure", "2 tests failed");
    let circle = s.github.add_check_suite(
        REPO,
        &head,
        FakeSuite::of(
            "circleci",
            vec![FakeCheckRunSpec::completed("lint", "success")],
        ),
    );
    s.model
        .reply(tool("echo two > a.txt"), "tool_use", usage(2000, 10));
    s.model
        .reply(text("a.txt now says two."), "end_turn", usage(2100, 10));
    let payload = s.github.check_suite_completed_payload(
        REPO,
        INSTALLATION,
        circle,
        "circleci",
        &head,
        &pr.head,
        "success",
        &[pr.number],
    );
    let run = ci_event(&s, "check_suite", &payload).await.unwrap();
    assert_eq!(ended(&s, &run).await, "end_turn", "{}", s.log());
    s.finished_status(pr.number).await;
    assert!(
        s.github.reruns().is_empty(),
        "a commit status cannot be re-run"
    );
    s.finish().await;
}
