//! Reading a commit's CI from the fake GitHub (SPEC §11): pending suites and runs, Apps that
//! never report, kodx's own checks ignored, hundreds of check runs over pages, annotations,
//! commit statuses, and GitHub Actions job logs fetched through a redirect to a log host
//! that must never see the installation token, up to a 200 MB log read in bounded memory.

use crate::common::fake_github;

use std::time::Instant;

use fake_github::{FakeCheckRunSpec, FakeGitHub, FakeLog, FakeSuite, ACTIONS_SLUG, TEST_APP_KEY};
use kodx::github::{CiLimits, CiState, GitHubApp, Installation, NewCheckRun, RepoName};

const APP_ID: u64 = 4242;
const INST: u64 = 77;
const REPO: &str = "acme/widgets";
const SHA: &str = "5779607b49aab1200488439f02372c57b4f75444";

async fn setup() -> (FakeGitHub, Installation, RepoName) {
    let fake = FakeGitHub::start(APP_ID).await;
    fake.add_installation(INST, "acme");
    fake.add_repo(
        INST,
        REPO,
        "main",
        "https://github.com/acme/widgets.git",
        false,
    );
    let app = GitHubApp::new(&fake.url(), APP_ID, TEST_APP_KEY).unwrap();
    let inst = app.installation(INST).await.unwrap();
    (fake, inst, RepoName::parse(REPO).unwrap())
}

async fn state(fake: &FakeGitHub, inst: &Installation, repo: &RepoName) -> CiState {
    state_with(fake, inst, repo, &CiLimits::default()).await
}

async fn state_with(
    fake: &FakeGitHub,
    inst: &Installation,
    repo: &RepoName,
    limits: &CiLimits,
) -> CiState {
    inst.ci_state(repo, SHA, &fake.slug(), limits)
        .await
        .unwrap()
}

/// Nothing refused as malformed, nothing sent to the log host with credentials.
fn assert_clean(fake: &FakeGitHub) {
    assert_eq!(fake.refused(), Vec::<String>::new());
    assert_eq!(fake.forbidden(), Vec::<String>::new());
    assert_eq!(fake.blob_requests_with_auth(), 0);
}

fn requests_to(fake: &FakeGitHub, part: &str) -> usize {
    fake.requests()
        .iter()
        .filter(|r| r.path.contains(part))
        .count()
}

#[tokio::test]
async fn a_suite_still_running_is_pending_and_nothing_is_detailed() {
    let (fake, inst, repo) = setup().await;
    let failing = FakeCheckRunSpec::completed("lint", "failure").with_annotations(&["bad"]);
    fake.add_check_suite(
        REPO,
        SHA,
        FakeSuite::of(
            "circleci",
            vec![failing, FakeCheckRunSpec::running("tests")],
        ),
    );
    let st = state(&fake, &inst, &repo).await;
    assert_eq!(st.pending, vec!["check suite of circleci", "tests"]);
    assert_eq!(st.failed.len(), 1);
    assert_eq!(st.failed[0].name, "lint");
    assert!(st.failed[0].annotations.is_empty() && st.failed[0].first_error.is_empty());
    assert_eq!(requests_to(&fake, "/annotations"), 0);
    assert_clean(&fake);
}

#[tokio::test]
async fn a_queued_suite_without_runs_does_not_block() {
    let (fake, inst, repo) = setup().await;
    // An App installed on the repository that never reports: its suite stays queued.
    fake.add_check_suite(REPO, SHA, FakeSuite::of("sleepy-app", vec![]));
    let ok = FakeCheckRunSpec::completed("build", "success");
    let skipped = FakeCheckRunSpec::completed("deploy", "skipped");
    fake.add_check_suite(REPO, SHA, FakeSuite::of(ACTIONS_SLUG, vec![ok, skipped]));
    let st = state(&fake, &inst, &repo).await;
    assert_eq!(
        st,
        CiState {
            pending: vec![],
            failed: vec![],
            passed: 2,
            left_out: 0
        }
    );
    assert_clean(&fake);
}

#[tokio::test]
async fn kodxs_own_suite_and_check_runs_are_ignored() {
    let (fake, inst, repo) = setup().await;
    // kodx's own run, created as kodx creates it, failing; and a suite of its App running.
    inst.create_check_run(
        &repo,
        &NewCheckRun {
            name: "kodx".into(),
            head_sha: SHA.into(),
            conclusion: "failure".into(),
            title: "1 of 2 checks failed".into(),
            summary: "tests failed".into(),
            text: String::new(),
            details_url: None,
            external_id: None,
            annotations: Vec::new(),
        },
    )
    .await
    .unwrap();
    fake.add_check_suite(
        REPO,
        SHA,
        FakeSuite::of(&fake.slug(), vec![FakeCheckRunSpec::running("kodx checks")]),
    );
    let passing = FakeCheckRunSpec::completed("build", "success");
    fake.add_check_suite(REPO, SHA, FakeSuite::of(ACTIONS_SLUG, vec![passing]));
    let st = state(&fake, &inst, &repo).await;
    assert_eq!(
        (st.pending.len(), st.failed.len(), st.passed),
        (0, 0, 1),
        "{st:?}"
    );
    // They are listed, under kodx's slug.
    let listed = fake
        .requests()
        .iter()
        .filter(|r| r.path.ends_with("/check-runs") && r.method == "GET")
        .count();
    assert_eq!(listed, 1);
    assert_clean(&fake);
}

#[tokio::test]
async fn five_hundred_check_runs_are_read_over_pages() {
    let (fake, inst, repo) = setup().await;
    let runs = (0..500)
        .map(|i| match i {
            7 | 250 | 499 => FakeCheckRunSpec::completed(&format!("job {i}"), "failure")
                .with_output(&format!("job {i} broke"), "exit code 1"),
            _ => FakeCheckRunSpec::completed(&format!("job {i}"), "success"),
        })
        .collect();
    fake.add_check_suite(REPO, SHA, FakeSuite::of("buildkite", runs));
    let st = state(&fake, &inst, &repo).await;
    assert_eq!((st.passed, st.left_out, st.pending.len()), (497, 0, 0));
    let names: Vec<&str> = st.failed.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["job 7", "job 250", "job 499"]);
    assert_eq!(st.failed[1].first_error, "job 250 broke");
    let pages: Vec<String> = fake
        .requests()
        .into_iter()
        .filter(|r| r.path.ends_with("/check-runs"))
        .map(|r| r.query.unwrap_or_default())
        .collect();
    assert_eq!(pages.len(), 5, "{pages:?}");
    insta::assert_snapshot!(pages[4], @"filter=latest&per_page=100&page=5");
    assert_clean(&fake);
}

#[tokio::test]
async fn past_ten_pages_check_runs_are_counted_as_left_out() {
    let (fake, inst, repo) = setup().await;
    let runs = (0..1_050)
        .map(|i| FakeCheckRunSpec::completed(&format!("job {i}"), "success"))
        .collect();
    fake.add_check_suite(REPO, SHA, FakeSuite::of("buildkite", runs));
    let st = state(&fake, &inst, &repo).await;
    assert_eq!((st.passed, st.left_out), (1_000, 50));
    assert_eq!(requests_to(&fake, "/check-runs"), 10);
    assert_clean(&fake);
}

#[tokio::test]
async fn a_failed_check_brings_its_output_and_annotations() {
    let (fake, inst, repo) = setup().await;
    let lint = FakeCheckRunSpec::completed("clippy", "failure")
        .with_output("2 errors", "Clippy found problems.\n\nSee the annotations.")
        .with_annotations(&[
            "notice: consider a shorter name",
            "unused variable: `x`",
            "warning: this could be a `const fn`",
        ]);
    let timed_out = FakeCheckRunSpec::completed("e2e", "timed_out");
    let neutral = FakeCheckRunSpec::completed("size", "neutral");
    fake.add_check_suite(
        REPO,
        SHA,
        FakeSuite::of("clippy-bot", vec![lint, timed_out, neutral]),
    );
    let st = state(&fake, &inst, &repo).await;
    assert_eq!(st.passed, 1);
    let clippy = &st.failed[0];
    assert_eq!(clippy.app, "clippy-bot");
    assert_eq!(clippy.title.as_deref(), Some("2 errors"));
    assert_eq!(
        clippy.annotations,
        [
            "src/lib.rs:2: failure: check 2: unused variable: `x`",
            "src/lib.rs:3: warning: check 3: this could be a `const fn`"
        ]
    );
    assert_eq!(clippy.first_error, "check 2: unused variable: `x`");
    let details = clippy.details_url.as_deref().unwrap();
    crate::common::serve::redactions(&[], &[])
        .bind(|| insta::assert_snapshot!(details, @"https://clippy-bot.example.com/builds/[hex]"));
    let e2e = &st.failed[1];
    assert_eq!(
        (e2e.conclusion.as_str(), e2e.first_error.as_str()),
        ("timed_out", "timed_out")
    );
    let report = st.report(48 * 1024);
    crate::common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(report, @"
    ## CI failures

    2 failed, 1 passed.

    ### `clippy` — failure (clippy-bot)
    Details: https://clippy-bot.example.com/builds/[hex]
    Title: 2 errors
    First error: check 2: unused variable: `x`

    Summary:
    ```text
    Clippy found problems.

    See the annotations.
    ```

    Annotations:
    ```text
    - src/lib.rs:2: failure: check 2: unused variable: `x`
    - src/lib.rs:3: warning: check 3: this could be a `const fn`

    ```

    ### `e2e` — timed_out (clippy-bot)
    Details: https://clippy-bot.example.com/builds/[hex]
    First error: timed_out
    ")
    });
    assert_clean(&fake);
}

#[tokio::test]
async fn commit_statuses_count_as_checks() {
    let (fake, inst, repo) = setup().await;
    fake.set_commit_status(REPO, SHA, "ci/jenkins", "pending", "Build queued");
    let st = state(&fake, &inst, &repo).await;
    assert_eq!(st.pending, vec!["ci/jenkins"]);
    fake.set_commit_status(REPO, SHA, "ci/jenkins", "failure", "Build #12 failed in 3m");
    fake.set_commit_status(REPO, SHA, "security/scan", "error", "Scanner crashed");
    fake.set_commit_status(REPO, SHA, "docs", "success", "ok");
    let st = state(&fake, &inst, &repo).await;
    assert!(st.pending.is_empty());
    assert_eq!(st.passed, 1);
    let failed: Vec<(&str, &str, &str)> = st
        .failed
        .iter()
        .map(|f| {
            (
                f.name.as_str(),
                f.conclusion.as_str(),
                f.first_error.as_str(),
            )
        })
        .collect();
    assert_eq!(
        failed,
        [
            ("ci/jenkins", "failure", "Build #12 failed in 3m"),
            ("security/scan", "error", "Scanner crashed")
        ]
    );
    assert!(st.failed[0]
        .details_url
        .as_deref()
        .unwrap()
        .starts_with("https://ci.example.com/"));
    assert_eq!(st.failed[0].app, "commit status");
    assert_clean(&fake);
}

#[tokio::test]
async fn an_actions_job_log_comes_through_the_redirect_without_the_token() {
    let (fake, inst, repo) = setup().await;
    let log = "\u{feff}2024-05-01T12:34:56.1000000Z ##[group]Run cargo test\n\
               2024-05-01T12:34:56.2000000Z \x1b[1m\x1b[92m   Compiling\x1b[0m widgets v0.1.0\n\
               2024-05-01T12:34:57.0000000Z \x1b[0m\x1b[1m\x1b[38;5;9merror[E0308]\x1b[0m\x1b[1m: mismatched types\x1b[0m\n\
               2024-05-01T12:34:57.1000000Z  --> src/lib.rs:3:5\n\
               2024-05-01T12:34:58.0000000Z ##[error]Process completed with exit code 101.\n";
    let job = FakeCheckRunSpec::completed("test (ubuntu-latest)", "failure")
        .with_log(FakeLog::Text(log.into()));
    let suite = fake.add_check_suite(REPO, SHA, FakeSuite::of(ACTIONS_SLUG, vec![job]));
    let job_id = fake.suite_runs(suite)[0];
    let st = state(&fake, &inst, &repo).await;
    let failed = &st.failed[0];
    assert_eq!(failed.first_error, "error[E0308]: mismatched types");
    let excerpt = failed.log.as_ref().unwrap();
    assert_eq!(
        excerpt.text,
        "##[group]Run cargo test\n   Compiling widgets v0.1.0\nerror[E0308]: mismatched types\n \
         --> src/lib.rs:3:5\n##[error]Process completed with exit code 101."
    );
    assert_eq!((excerpt.lines, excerpt.bytes), (5, log.len() as u64));
    // The API call carried the token; the log host got the signed URL alone.
    let api = fake
        .requests()
        .into_iter()
        .find(|r| r.path == format!("/repos/{REPO}/actions/jobs/{job_id}/logs"))
        .unwrap();
    assert!(api.authorization.unwrap().starts_with("Bearer ghs_"));
    assert_eq!(fake.blob_requests(), 1);
    assert_eq!(fake.log_bytes_served(), log.len() as u64);
    let report = st.report(48 * 1024);
    crate::common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(report, @"
    ## CI failures

    1 failed, 0 passed.

    ### `test (ubuntu-latest)` — failure (github-actions)
    Details: http://127.0.0.1:[port]/acme/widgets/actions/runs/[hex]/job/[hex]
    First error: error[E0308]: mismatched types

    Log excerpt (5 lines, 340 bytes):
    ```text
    ##[group]Run cargo test
       Compiling widgets v0.1.0
    error[E0308]: mismatched types
     --> src/lib.rs:3:5
    ##[error]Process completed with exit code 101.
    ```
    ")
    });
    assert_clean(&fake);
}

#[tokio::test]
async fn a_200_mb_job_log_is_read_in_bounded_memory() {
    let (fake, inst, repo) = setup().await;
    let lines = 1_500_000;
    let job = FakeCheckRunSpec::completed("test", "failure").with_log(FakeLog::Generated {
        lines,
        errors_at: vec![60, lines - 3],
    });
    fake.add_check_suite(REPO, SHA, FakeSuite::of(ACTIONS_SLUG, vec![job]));
    let started = Instant::now();
    let st = state(&fake, &inst, &repo).await;
    let took = started.elapsed();
    let excerpt = st.failed[0].log.clone().unwrap();
    eprintln!(
        "200 MB job log through the redirect: {} bytes read ({} lines) in {took:?}, {:.0} MB/s; \
         excerpt {} bytes",
        excerpt.bytes,
        excerpt.lines,
        excerpt.bytes as f64 / 1e6 / took.as_secs_f64(),
        excerpt.text.len()
    );
    assert!(excerpt.bytes > 200_000_000, "{}", excerpt.bytes);
    assert_eq!(excerpt.bytes, fake.log_bytes_served());
    assert_eq!(excerpt.lines, lines);
    assert!(!excerpt.cut_at_read_limit);
    assert!(excerpt.text.len() <= CiLimits::default().max_log_excerpt);
    assert!(
        excerpt.text.contains("found (log line 60)"),
        "{}",
        excerpt.text
    );
    assert!(excerpt
        .text
        .contains(&format!("found (log line {})", lines - 3)));
    assert_eq!(
        st.failed[0].first_error,
        "error[E0599]: no method named `frobnicate` found (log line 60)"
    );
    assert_clean(&fake);
}

#[tokio::test]
async fn reading_a_log_stops_at_the_read_limit() {
    let (fake, inst, repo) = setup().await;
    let job = FakeCheckRunSpec::completed("test", "failure").with_log(FakeLog::Generated {
        lines: 400_000,
        errors_at: vec![10],
    });
    fake.add_check_suite(REPO, SHA, FakeSuite::of(ACTIONS_SLUG, vec![job]));
    let limits = CiLimits {
        max_log_bytes_read: 1 << 20,
        ..CiLimits::default()
    };
    let st = state_with(&fake, &inst, &repo, &limits).await;
    let excerpt = st.failed[0].log.clone().unwrap();
    assert!(excerpt.cut_at_read_limit);
    assert_eq!(excerpt.bytes, 1 << 20);
    assert!(excerpt
        .text
        .ends_with("reading stopped after 1048576 bytes]"));
    assert!(excerpt.text.contains("(log line 10)"));
    // The rest was not pulled from the log host (a few chunks may be in flight).
    let served = fake.log_bytes_served();
    assert!(served < 8 << 20, "{served}");
    assert_clean(&fake);
}

#[tokio::test]
async fn only_the_first_failures_are_detailed() {
    let (fake, inst, repo) = setup().await;
    let jobs = (0..5)
        .map(|i| {
            FakeCheckRunSpec::completed(&format!("job {i}"), "failure")
                .with_log(FakeLog::Text(format!("error: job {i} broke\n")))
        })
        .collect();
    fake.add_check_suite(REPO, SHA, FakeSuite::of(ACTIONS_SLUG, jobs));
    let limits = CiLimits {
        max_detailed: 2,
        ..CiLimits::default()
    };
    let st = state_with(&fake, &inst, &repo, &limits).await;
    let detailed: Vec<bool> = st.failed.iter().map(|f| f.log.is_some()).collect();
    assert_eq!(detailed, [true, true, false, false, false]);
    assert_eq!(fake.blob_requests(), 2);
    let report = st.report(48 * 1024);
    crate::common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(report, @"
    ## CI failures

    5 failed, 0 passed.

    ### `job 0` — failure (github-actions)
    Details: http://127.0.0.1:[port]/acme/widgets/actions/runs/[hex]/job/[hex]
    First error: error: job 0 broke

    Log excerpt (1 lines, 19 bytes):
    ```text
    error: job 0 broke
    ```

    ### `job 1` — failure (github-actions)
    Details: http://127.0.0.1:[port]/acme/widgets/actions/runs/[hex]/job/[hex]
    First error: error: job 1 broke

    Log excerpt (1 lines, 19 bytes):
    ```text
    error: job 1 broke
    ```

    Also failed (not detailed): `job 2`, `job 3`, `job 4`
    ")
    });
    assert_clean(&fake);
}

#[tokio::test]
async fn the_same_failure_again_has_the_same_signature() {
    let (fake, inst, repo) = setup().await;
    let log = |secs: &str| FakeLog::Text(format!("test it ... FAILED ({secs}s) at 0x7ffd5e8c\n"));
    let first = fake.add_check_suite(
        REPO,
        SHA,
        FakeSuite::of(
            ACTIONS_SLUG,
            vec![FakeCheckRunSpec::completed("test", "failure").with_log(log("0.53"))],
        ),
    );
    let before = state(&fake, &inst, &repo).await.signature();
    // A re-run: the newest run of the same name is the one read.
    fake.set_suite(first, "completed", Some("failure"));
    fake.add_check_suite(
        REPO,
        SHA,
        FakeSuite::of(
            ACTIONS_SLUG,
            vec![FakeCheckRunSpec::completed("test", "failure").with_log(log("1.20"))],
        ),
    );
    let again = state(&fake, &inst, &repo).await;
    assert_eq!(again.failed.len(), 1);
    insta::assert_snapshot!(again.failed[0].first_error, @"test it ... FAILED (1.20s) at 0x7ffd5e8c");
    assert_eq!(again.signature(), before);
    fake.add_check_suite(
        REPO,
        SHA,
        FakeSuite::of(
            ACTIONS_SLUG,
            vec![FakeCheckRunSpec::completed("test", "failure")
                .with_log(FakeLog::Text("error: another problem\n".into()))],
        ),
    );
    assert_ne!(state(&fake, &inst, &repo).await.signature(), before);
    assert_clean(&fake);
}

#[tokio::test]
async fn webhook_payloads_carry_what_github_sends() {
    let (fake, _, _) = setup().await;
    let v = fake.check_suite_completed_payload(
        REPO,
        INST,
        118578147,
        ACTIONS_SLUG,
        SHA,
        "kodx/fix-1",
        "failure",
        &[7],
    );
    assert_eq!(v["action"], "completed");
    assert_eq!(v["check_suite"]["conclusion"], "failure");
    assert_eq!(v["check_suite"]["app"]["slug"], ACTIONS_SLUG);
    assert_eq!(v["check_suite"]["pull_requests"][0]["number"], 7);
    assert_eq!(
        v["check_suite"]["pull_requests"][0]["head"]["ref"],
        "kodx/fix-1"
    );
    assert_eq!(v["check_suite"]["pull_requests"][0]["base"]["ref"], "main");
    assert_eq!(v["repository"]["full_name"], REPO);
    assert_eq!(v["repository"]["default_branch"], "main");
    assert_eq!(v["installation"]["id"], INST);
    let v = fake.workflow_run_completed_payload(
        REPO,
        INST,
        1589141559,
        118578147,
        "CI",
        SHA,
        "kodx/fix-1",
        "failure",
        &[7],
    );
    assert_eq!(v["workflow_run"]["conclusion"], "failure");
    assert_eq!(v["workflow_run"]["check_suite_id"], 118578147);
    assert_eq!(v["workflow_run"]["head_sha"], SHA);
    assert_eq!(v["workflow_run"]["pull_requests"][0]["head"]["sha"], SHA);
    assert_eq!(
        v["repository"]["clone_url"],
        "https://github.com/acme/widgets.git"
    );
    assert!(v["sender"]["login"].is_string());
}
