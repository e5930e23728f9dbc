//! Benchmark (ignored by default; `bash bench/follow-up.sh` runs it): what one follow-up run
//! of the pull request's life (SPEC §11) costs, in calls and time, through the real
//! `kodx serve` against the fake GitHub and a scripted model (two model calls each: one
//! command, one final message).
//!
//! 1. **CI repair**: a failing GitHub Actions job on the pull request kodx opened; from the
//!    `check_suite.completed` delivery to the repair's finished status comment (admission
//!    with the CI reads and the job log through its redirect, the container, the model, the
//!    push).
//!    With `ci_rerun: 0`: the repair alone.
//! 2. **Re-run first** (`ci_rerun`, on by default): the same failure; from the delivery to
//!    GitHub's `rerun-failed-jobs` answered (no model call) — then the re-run fails too, and
//!    from that completion's delivery to the repair's finished status comment.
//! 3. **`/kodx address-reviews`**: three unresolved threads; from the comment to the
//!    finished status comment (the threads read over GraphQL, the run, the push, three
//!    replies and two resolves).
//! 4. **Conflict** (`pr.keep_mergeable`, SPEC §12): a push to `main` that conflicts with the
//!    pull request kodx opened; from the `push` delivery to the merge commit pushed to the
//!    branch (GitHub's `mergeable` asked until computed — the fake answers `null` to the
//!    first read after a push, which admission's read of the base rules takes, so no pause
//!    of the backoff is in the figure; GitHub may take seconds —, the base merged in the
//!    workspace with markers, the model, the merge commit, the push).
//!
//! Each prints the median and the slowest of `KODX_BENCH_RUNS` rounds (default 3), with the
//! GitHub requests (REST and GraphQL) and the model calls the run made.

use crate::common;

use std::time::{Duration, Instant};

use common::fake_github::ACTIONS_SLUG;
use common::follow_up::{
    ci_event, config, ended, feature_pull, kodx_pull, push_payload, red_actions_suite, thread,
};
use common::serve::{delivery_id, text, tool, usage, Served, INSTALLATION, REPO};
use serde_json::json;

fn rounds() -> usize {
    std::env::var("KODX_BENCH_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3)
}

/// One round's figures: wall time, GitHub REST requests, GraphQL requests, model calls.
struct Round {
    took: Duration,
    rest: usize,
    graphql: usize,
    model: usize,
}

fn requests_since(s: &Served, before: usize) -> (usize, usize) {
    let all = s.github.requests();
    let new = &all[before.min(all.len())..];
    let graphql = new.iter().filter(|r| r.path.ends_with("/graphql")).count();
    (new.len() - graphql, graphql)
}

fn print(what: &str, rounds: &[Round]) {
    let mut ms: Vec<f64> = rounds
        .iter()
        .map(|r| r.took.as_secs_f64() * 1000.0)
        .collect();
    ms.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let last = rounds.last().unwrap();
    println!(
        "{what:<34} median {:>7.0} ms   slowest {:>7.0} ms   GitHub {} REST + {} GraphQL requests   {} model calls",
        ms[ms.len() / 2],
        ms[ms.len() - 1],
        last.rest,
        last.graphql,
        last.model,
    );
}

async fn repair_round() -> Round {
    let mut s = Served::with_workers().await;
    let pr = kodx_pull(&s, "ci_repair: 1\nci_rerun: 0\n", "Added a.txt.").await;
    let head = s.git.branch_sha(REPO, &pr.head).unwrap();
    let suite = red_actions_suite(&s, &head);
    s.model
        .reply(tool("echo two > a.txt"), "tool_use", usage(2000, 10));
    s.model
        .reply(text("Fixed a.txt."), "end_turn", usage(2100, 10));
    let payload = s.github.check_suite_completed_payload(
        REPO,
        INSTALLATION,
        suite,
        ACTIONS_SLUG,
        &head,
        &pr.head,
        "failure",
        &[pr.number],
    );
    let round = repaired(&s, &payload, pr.number).await;
    s.finish().await;
    round
}

/// Delivers the CI `payload` that starts a repair of pull request `pull` and times it to
/// the repair's finished status comment, with the requests and model calls it made.
async fn repaired(s: &Served, payload: &serde_json::Value, pull: u64) -> Round {
    let (before, calls) = (s.github.requests().len(), s.model.requests().len());
    let started = Instant::now();
    let run = ci_event(s, "check_suite", payload).await.unwrap();
    assert_eq!(ended(s, &run).await, "end_turn", "{}", s.log());
    s.finished_status(pull).await;
    let took = started.elapsed();
    let (rest, graphql) = requests_since(s, before);
    Round {
        took,
        rest,
        graphql,
        model: s.model.requests().len() - calls,
    }
}

/// The re-run path: (failure → jobs re-run, failed again → repaired and reported).
async fn rerun_rounds() -> (Round, Round) {
    let mut s = Served::with_workers().await;
    let pr = kodx_pull(&s, "ci_repair: 1\n", "Added a.txt.").await;
    let head = s.git.branch_sha(REPO, &pr.head).unwrap();
    let suite = red_actions_suite(&s, &head);
    let completed = |s: &Served| {
        s.github.check_suite_completed_payload(
            REPO,
            INSTALLATION,
            suite,
            ACTIONS_SLUG,
            &head,
            &pr.head,
            "failure",
            &[pr.number],
        )
    };
    let payload = completed(&s);
    let (before, calls) = (s.github.requests().len(), s.model.requests().len());
    let started = Instant::now();
    let run = ci_event(&s, "check_suite", &payload).await.unwrap();
    s.until("the failed jobs re-run", || {
        (!s.github.reruns().is_empty()).then_some(())
    })
    .await;
    let took = started.elapsed();
    assert_eq!(ended(&s, &run).await, "dismissed", "{}", s.log());
    let (rest, graphql) = requests_since(&s, before);
    let rerun = Round {
        took,
        rest,
        graphql,
        model: s.model.requests().len() - calls,
    };
    // The re-run fails too: now the repair.
    s.github
        .complete_check_run(s.github.suite_runs(suite)[0], "failure");
    s.model
        .reply(tool("echo two > a.txt"), "tool_use", usage(2000, 10));
    s.model
        .reply(text("Fixed a.txt."), "end_turn", usage(2100, 10));
    let payload = completed(&s);
    let round = repaired(&s, &payload, pr.number).await;
    s.finish().await;
    (rerun, round)
}

async fn address_reviews_round() -> Round {
    let mut s = Served::with_workers().await;
    config(&s, "reviews: { resolve: fixed }\n");
    feature_pull(&s, 40);
    let ids: Vec<String> = ["Rename it.", "Document it.", "Why a const?"]
        .iter()
        .map(|c| {
            s.github
                .add_review_thread(REPO, 40, thread("src/flag.rs", 1, &[("dora", c)], true))
        })
        .collect();
    let list = json!([
        {"thread": ids[0], "status": "fixed", "reply": "Renamed."},
        {"thread": ids[1], "status": "fixed", "reply": "Documented."},
        {"thread": ids[2], "status": "question", "reply": "Would an enum help?"},
    ]);
    s.model.reply(
        tool("printf '/// The flag.\\npub const LOUD: &str = \"v\";\\n' > src/flag.rs"),
        "tool_use",
        usage(1000, 10),
    );
    s.model.reply(
        text(&format!("Done.\n\n```kodx-threads\n{list}\n```")),
        "end_turn",
        usage(1100, 10),
    );
    let before = s.github.requests().len();
    let started = Instant::now();
    s.comment(40, "alice", "/kodx address-reviews").await;
    let status = s.finished_status(40).await;
    let took = started.elapsed();
    assert!(status.contains("resolved 2"), "{status}");
    let (rest, graphql) = requests_since(&s, before);
    let model = s.model.requests().len();
    s.finish().await;
    Round {
        took,
        rest,
        graphql,
        model,
    }
}

/// The conflict path: a push to the base → the merge commit pushed to kodx's branch.
async fn conflict_round() -> Round {
    let mut s = Served::with_workers().await;
    let pr = kodx_pull(&s, "pr: { keep_mergeable: true }\n", "Added a.txt.").await;
    let head = s.git.branch_sha(REPO, &pr.head).unwrap();
    s.model.reply(
        tool("grep -q '^<<<<<<< ' a.txt && printf 'one\\nother\\n' > a.txt"),
        "tool_use",
        usage(1000, 10),
    );
    s.model
        .reply(text("Kept both lines."), "end_turn", usage(1100, 10));
    let before_main = s.git.branch_sha(REPO, "main").unwrap();
    let after_main = s.git.commit_on_branch(
        REPO,
        "main",
        &[("a.txt", b"other\n", 0o644)],
        "Another a.txt",
    );
    let payload = push_payload(&s, &before_main, &after_main);
    let (before, calls) = (s.github.requests().len(), s.model.requests().len());
    let started = Instant::now();
    let (status, answer) = s.deliver("push", &delivery_id(), &payload).await;
    assert_eq!(status, 202, "{answer}");
    s.until("the merge commit pushed", || {
        s.git
            .branch_sha(REPO, &pr.head)
            .filter(|tip| *tip != head)
            .map(|_| ())
    })
    .await;
    let took = started.elapsed();
    let run = answer["run_ids"][0].as_str().unwrap().to_string();
    assert_eq!(ended(&s, &run).await, "end_turn", "{}", s.log());
    s.finished_status(pr.number).await;
    let (rest, graphql) = requests_since(&s, before);
    let model = s.model.requests().len() - calls;
    s.finish().await;
    Round {
        took,
        rest,
        graphql,
        model,
    }
}

#[tokio::test]
#[ignore]
async fn follow_up_runs() {
    let _engine = common::require_engine!();
    let n = rounds();
    println!(
        "\nfollow-up runs through the real kodx serve ({n} rounds each, fake GitHub and model)\n"
    );
    let mut repairs = Vec::new();
    for _ in 0..n {
        repairs.push(repair_round().await);
    }
    print("CI repair (webhook → done)", &repairs);
    let (mut reruns, mut after) = (Vec::new(), Vec::new());
    for _ in 0..n {
        let (rerun, repair) = rerun_rounds().await;
        reruns.push(rerun);
        after.push(repair);
    }
    print("re-run (webhook → jobs re-run)", &reruns);
    print("repair after re-run (webhook → done)", &after);
    let mut reviews = Vec::new();
    for _ in 0..n {
        reviews.push(address_reviews_round().await);
    }
    print("address-reviews (comment → done)", &reviews);
    let mut conflicts = Vec::new();
    for _ in 0..n {
        conflicts.push(conflict_round().await);
    }
    print("conflict (push → merge pushed)", &conflicts);
}
