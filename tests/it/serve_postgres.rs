//! `kodx serve` with `DATABASE_URL=postgres://…`: the same webhook → queue → worker → pull
//! request path as on SQLite, against a real PostgreSQL server (see
//! `kodx::db::test_databases`), the real Docker engine, the fake GitHub and model, and a
//! real git server.

use crate::common;
use crate::common::serve::{text, tool, usage, Options, Served, REPO};
use kodx::db::test_databases;
use kodx::db::RunStatus;
use serde_json::json;

/// A short lease for the tests of leases (`KODX_TEST_LEASE_MS`, which scales the GitHub
/// request bound and the margin with it): a stopped or killed process's run is taken over
/// within two seconds, not a minute.
pub(crate) const SHORT_LEASE_MS: u64 = 2000;
pub(crate) const SHORT_LEASE: &[(&str, &str)] = &[("KODX_TEST_LEASE_MS", "2000")];

/// A server on a fresh PostgreSQL database; `None` when `KODX_SKIP_POSTGRES=1` asked to
/// test SQLite only (it prints why).
pub(crate) async fn served_on_postgres(test: &str) -> Option<Served> {
    served_on_postgres_with(test, &[]).await
}

/// [`served_on_postgres`] with `extra_env` in the server's environment.
pub(crate) async fn served_on_postgres_with(
    test: &str,
    extra_env: &[(&str, &str)],
) -> Option<Served> {
    let Some(admin) = test_databases::postgres_admin_url() else {
        eprintln!("SKIPPED {test}: KODX_SKIP_POSTGRES=1");
        return None;
    };
    let url = test_databases::fresh_postgres_database(&admin).await;
    Some(
        Served::start(Options {
            workers: true,
            database_url: Some(url),
            extra_env: extra_env
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Options::default()
        })
        .await,
    )
}

#[tokio::test]
async fn ask_and_code_runs_work_on_postgres() {
    let _engine = common::require_engine!();
    let Some(mut s) = served_on_postgres("ask_and_code_runs_work_on_postgres").await else {
        return;
    };
    s.github
        .add_issue(REPO, 7, "Add a greeting", "We need hello.txt.", "carol");

    // An ask: answered in the status comment.
    s.model
        .reply(tool("cat README.md"), "tool_use", usage(2000, 20));
    s.model
        .answer_from_last_tool_result(|out| format!("The readme says: {out}"));
    let ask = s.comment(7, "alice", "/kodx ask what is this?").await;
    let answered = s
        .bot_comment_where(7, "the answer", |c| c.body.contains("The readme says"))
        .await;
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(answered.body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ✅ answered

    > /kodx ask what is this?

    The readme says: # widgets
    [exit status: 0]

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 3,200 | 60 | 0 | 0 | $0.0105 of $1.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code></sub>
    "#)
    });
    s.reaction(&s.trigger(&ask), "rocket").await;

    // A code run on the same issue: a pull request with the change.
    s.model
        .reply(tool("echo hello > hello.txt"), "tool_use", usage(2000, 20));
    s.model.reply(
        vec![json!({"type": "text", "text": "Added hello.txt."})],
        "end_turn",
        usage(2100, 10),
    );
    let code = s.comment(7, "alice", "/kodx code add hello.txt").await;
    s.bot_comment_where(7, "the pull request", |c| c.body.contains("/pull/"))
        .await;
    s.reaction(&s.trigger(&code), "rocket").await;
    let pulls = s.github.created_pulls(REPO);
    assert_eq!(pulls.len(), 1, "{pulls:?}");

    // Both runs are in PostgreSQL, finished, with their cost.
    let db = s.db().await;
    assert_eq!(db.backend(), "postgres");
    for run in [&ask.0, &code.0] {
        let run = db.get_run(run).await.unwrap().expect("the run is stored");
        assert_eq!(run.status, RunStatus::Succeeded, "{run:?}");
        assert!(run.cost_usd.unwrap() > 0.0, "{run:?}");
    }
    let code_run = db.get_run(&code.0).await.unwrap().unwrap();
    let pr_url = code_run.pr_url.expect("the pull request is stored");
    common::serve::redactions(&[], &[])
        .bind(|| insta::assert_snapshot!(pr_url, @"http://127.0.0.1:[port]/acme/widgets/pull/8"));
    db.close().await;
    s.finish().await;
    // The server never logged the database password.
    assert!(!s.log().contains("kodx:kodx@"), "{}", s.log());
}

/// `kill -9` of the process running a code run, then a new process on the same PostgreSQL:
/// the run stays the dead process's until its lease expires (the new process does not take
/// it at once: on a shared queue a running run may be a live process's), then the new
/// process queues it again and finishes it: one pull request, one status comment.
#[tokio::test]
async fn a_killed_process_run_is_finished_by_another_after_its_lease() {
    let engine = common::require_engine!();
    let Some(mut s) = served_on_postgres_with(
        "a_killed_process_run_is_finished_by_another_after_its_lease",
        SHORT_LEASE,
    )
    .await
    else {
        return;
    };
    let run = s.code_run_in_its_first_command().await;
    s.kill().await;
    let killed_at = std::time::Instant::now();
    s.model
        .reply(tool("echo one > one.txt"), "tool_use", usage(1000, 10));
    s.model.reply(
        vec![json!({"type": "text", "text": "Wrote one.txt."})],
        "end_turn",
        usage(1000, 10),
    );
    s.restart().await;
    let done = s
        .bot_comment_where(7, "the run to finish", |c| c.body.contains("✅"))
        .await;
    let took = killed_at.elapsed();
    assert!(
        took >= std::time::Duration::from_millis(SHORT_LEASE_MS * 4 / 5),
        "taken back after {took:?}, before the lease could expire"
    );
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(done.body, @r#"
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
    // The one status comment said the run was taken up again.
    assert!(
        done.edits.iter().any(|e| e
            .lines()
            .any(|l| l == "### ⏳ queued again — kodx restarted while this run was working")),
        "{:#?}",
        done.edits
    );
    assert_eq!(s.github.created_pulls(REPO).len(), 1);
    let db = s.db().await;
    let stored = db.get_run(&run.0).await.unwrap().unwrap();
    assert_eq!((stored.attempts, stored.recovered), (2, true), "{stored:?}");
    db.close().await;
    common::assert_gone(&engine, &format!("kodx-{}", run.0)).await;
    s.reaction(&s.trigger(&run), "rocket").await;
    s.finish().await;
}

/// A `/kodx cancel` taken by another process (here the test, writing to the shared queue as
/// that process's handler does) stops the run this process is running: the request is
/// stored on the run and announced with `NOTIFY`.
#[tokio::test]
async fn a_cancel_recorded_by_another_process_stops_the_run() {
    let engine = common::require_engine!();
    let Some(mut s) =
        served_on_postgres("a_cancel_recorded_by_another_process_stops_the_run").await
    else {
        return;
    };
    let run = s.code_run_in_its_first_command().await;
    let other = s.db().await;
    let touched = other.cancel_issue(REPO, 7, "bob").await.unwrap();
    assert_eq!(touched.len(), 1);
    assert!(touched[0].was_running);
    other.close().await;
    let done = s
        .bot_comment_where(7, "the cancelled run", |c| {
            c.body.contains("Cancelled by @bob")
        })
        .await;
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(done.body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ❌ cancelled

    > /kodx code write one.txt

    ```text
    Cancelled by @bob.
    ```

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 1 | 1,000 | 10 | 0 | 0 | $0.0032 of $2.00 | [duration] (agent [duration]) | `cancelled` |

    <sub>kodx run <code>[run]</code></sub>
    "#)
    });
    let db = s.db().await;
    let stored = db.get_run(&run.0).await.unwrap().unwrap();
    assert_eq!(stored.status, RunStatus::Cancelled, "{stored:?}");
    db.close().await;
    common::assert_gone(&engine, &format!("kodx-{}", run.0)).await;
    s.reaction(&s.trigger(&run), "confused").await;
    s.finish().await;
}

/// `/kodx cancel` delivered to one process (an intake) stops the run another process is
/// running: the webhook, not a database handle, crosses the processes.
#[tokio::test]
async fn a_cancel_webhook_to_one_process_stops_the_run_on_another() {
    let engine = common::require_engine!();
    let Some(mut s) =
        served_on_postgres("a_cancel_webhook_to_one_process_stops_the_run_on_another").await
    else {
        return;
    };
    // The intake: it takes webhooks and runs nothing.
    let (mut intake, intake_url) = s.spawn_another(&["--role", "intake"]).await;
    let run = s.code_run_in_its_first_command().await;
    let id = s
        .github
        .add_comment(REPO, 7, "alice", "/kodx cancel", false);
    let payload = common::serve::issue_comment(&common::serve::IssueComment {
        clone_url: &s.clone_url,
        number: 7,
        comment_id: id,
        author: "alice",
        body: "/kodx cancel",
        ..Default::default()
    });
    let (status, answer) = s
        .deliver_to(
            &intake_url,
            "issue_comment",
            &common::serve::delivery_id(),
            &payload,
        )
        .await;
    assert_eq!(status, 202, "{answer}");
    s.bot_comment_where(7, "the cancelled run", |c| {
        c.body.contains("Cancelled by @alice")
    })
    .await;
    let db = s.db().await;
    let stored = db.get_run(&run.0).await.unwrap().unwrap();
    assert_eq!(stored.status, RunStatus::Cancelled, "{stored:?}");
    db.close().await;
    assert_eq!(
        s.model.requests().len(),
        1,
        "no model call after the cancel"
    );
    common::assert_gone(&engine, &format!("kodx-{}", run.0)).await;
    s.reaction(&s.trigger(&run), "confused").await;
    terminate(&mut intake).await;
    s.finish().await;
}

/// `--role intake` receives and queues; `--role worker` (another process, no webhooks) runs
/// the work: an intake fleet with workers elsewhere.
#[tokio::test]
async fn an_intake_process_queues_and_a_worker_process_runs() {
    let _engine = common::require_engine!();
    let Some(admin) = test_databases::postgres_admin_url() else {
        eprintln!(
            "SKIPPED an_intake_process_queues_and_a_worker_process_runs: KODX_SKIP_POSTGRES=1"
        );
        return;
    };
    let url = test_databases::fresh_postgres_database(&admin).await;
    // The intake: `workers: false` starts it with --no-workers, the same as --role intake.
    let mut s = Served::start(Options {
        workers: false,
        database_url: Some(url),
        ..Options::default()
    })
    .await;
    s.github.add_issue(REPO, 7, "Question", "", "carol");
    s.model.reply(
        vec![json!({"type": "text", "text": "It makes widgets."})],
        "end_turn",
        usage(1000, 10),
    );
    let run = s.comment(7, "alice", "/kodx ask what is this?").await;
    let db = s.db().await;
    assert_eq!(
        db.get_run(&run.0).await.unwrap().unwrap().status,
        RunStatus::Queued,
        "nothing runs it yet"
    );
    let (mut worker, worker_url) = s.spawn_another(&["--role", "worker"]).await;
    let answered = s
        .bot_comment_where(7, "the answer", |c| c.body.contains("It makes widgets."))
        .await;
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(answered.body, @r#"
    <!-- kodx:{"run":"[hex]","v":1} -->
    ### ✅ answered

    > /kodx ask what is this?

    It makes widgets.

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 1 | 1,000 | 10 | 0 | 0 | $0.0032 of $1.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code></sub>
    "#)
    });
    s.reaction(&s.trigger(&run), "rocket").await;
    // The worker takes no webhooks, and says where they go.
    let refused = reqwest::Client::new()
        .post(format!("{worker_url}/webhook"))
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(refused.status(), 404);
    insta::assert_snapshot!(refused.text().await.unwrap(), @r#"{"error":"this kodx serve process runs with --role worker and takes no webhooks; point the GitHub App's webhook URL at a process with --role all or intake"}"#);
    // Its health endpoint answers.
    let health = reqwest::get(format!("{worker_url}/healthz")).await.unwrap();
    assert_eq!(health.status(), 200);
    terminate(&mut worker).await;
    assert_eq!(
        db.get_run(&run.0).await.unwrap().unwrap().status,
        RunStatus::Succeeded
    );
    db.close().await;
    s.finish().await;
}

/// [`common::serve::terminate`] within 30 s.
pub(crate) async fn terminate(child: &mut tokio::process::Child) {
    common::serve::terminate(child, std::time::Duration::from_secs(30)).await;
}

/// Fencing: the process running a code run is paused (SIGSTOP) past its lease; another
/// process takes the run back and finishes it (one pull request, the status comment done).
/// When the paused process goes on (SIGCONT) it finds it lost the lease and stops the run
/// without a model call, a command, a push or a comment edit.
#[tokio::test]
async fn a_paused_process_that_lost_its_lease_does_nothing_more() {
    let engine = common::require_engine!();
    let Some(mut s) = served_on_postgres_with(
        "a_paused_process_that_lost_its_lease_does_nothing_more",
        SHORT_LEASE,
    )
    .await
    else {
        return;
    };
    let run = s.code_run_in_its_first_command().await;
    s.signal("STOP");
    s.model
        .reply(tool("echo one > one.txt"), "tool_use", usage(1000, 10));
    s.model.reply(
        vec![json!({"type": "text", "text": "Wrote one.txt."})],
        "end_turn",
        usage(1000, 10),
    );
    let (mut other, _) = s.spawn_another(&["--role", "worker"]).await;
    let done = s
        .bot_comment_where(7, "the other process to finish the run", |c| {
            c.body.contains("✅")
        })
        .await;
    common::serve::redactions(&[], &[]).bind(|| {
        insta::assert_snapshot!(done.body, @r#"
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
    let calls = s.model.requests().len();
    assert_eq!(calls, 3, "one call by the paused process, two by the other");

    s.signal("CONT");
    s.wait_for(
        "the resumed process to give the run up",
        std::time::Duration::from_secs(60),
        || {
            s.log()
                .contains("run given up here: another process holds it now")
        },
    )
    .await;
    assert!(s.log().contains("lost the run's lease"), "{}", s.log());
    // Nothing more happened for the run: no model call, no edit, one pull request.
    assert_eq!(s.model.requests().len(), calls);
    let after = s
        .github
        .comments(REPO, 7)
        .into_iter()
        .find(|c| c.id == done.id)
        .expect("the status comment");
    assert_eq!(after.body, done.body);
    assert_eq!(after.edits.len(), done.edits.len(), "{:#?}", after.edits);
    assert_eq!(s.github.created_pulls(REPO).len(), 1);
    let db = s.db().await;
    let stored = db.get_run(&run.0).await.unwrap().unwrap();
    assert_eq!(stored.status, RunStatus::Succeeded, "{stored:?}");
    assert_eq!(stored.attempts, 2, "{stored:?}");
    db.close().await;
    terminate(&mut other).await;
    common::assert_gone(&engine, &format!("kodx-{}", run.0)).await;
    s.reaction(&s.trigger(&run), "rocket").await;
    s.finish().await;
}

/// Three `kodx serve` processes on one PostgreSQL: a burst of 200 signed commands spread
/// over them, each delivery sent to two different processes, gives exactly 200 runs, each
/// run once and answered once (`/kodx help`: one comment each).
#[tokio::test]
async fn a_burst_over_three_processes_runs_each_command_once() {
    let Some(admin) = test_databases::postgres_admin_url() else {
        eprintln!(
            "SKIPPED a_burst_over_three_processes_runs_each_command_once: KODX_SKIP_POSTGRES=1"
        );
        return;
    };
    let url = test_databases::fresh_postgres_database(&admin).await;
    let mut s = Served::start(Options {
        workers: true,
        database_url: Some(url),
        ..Options::default()
    })
    .await;
    let (mut b, b_url) = s.spawn_another(&["--role", "all"]).await;
    let (mut c, c_url) = s.spawn_another(&["--role", "all"]).await;
    let urls = [s.url.clone(), b_url, c_url];
    const ISSUES: u64 = 20;
    const PER_ISSUE: u64 = 10;
    for issue in 1..=ISSUES {
        s.github.add_issue(REPO, issue, "Help", "", "carol");
    }
    let mut deliveries = Vec::new();
    for n in 0..ISSUES * PER_ISSUE {
        let issue = 1 + n % ISSUES;
        let id = s
            .github
            .add_comment(REPO, issue, "alice", "/kodx help", false);
        let payload = common::serve::issue_comment(&common::serve::IssueComment {
            clone_url: &s.clone_url,
            number: issue,
            comment_id: id,
            body: "/kodx help",
            ..Default::default()
        });
        deliveries.push((n as usize, common::serve::delivery_id(), payload));
    }
    // Every delivery goes to one process and, at the same time, again to the next.
    let sent = futures_util::future::join_all(deliveries.iter().flat_map(|(n, id, payload)| {
        let s = &s;
        [urls[n % 3].clone(), urls[(n + 1) % 3].clone()]
            .into_iter()
            .map(move |url| async move { s.deliver_to(&url, "issue_comment", id, payload).await })
    }))
    .await;
    let mut run_ids = std::collections::BTreeSet::new();
    for (status, answer) in &sent {
        assert!(matches!(status, 200 | 202), "{status} {answer}");
        if let Some(run) = answer["run_id"].as_str() {
            run_ids.insert(run.to_string());
        }
    }
    assert_eq!(run_ids.len(), 200, "one run per command, whoever took it");
    // Each command is answered once.
    for issue in 1..=ISSUES {
        for _ in 0..PER_ISSUE {
            let help = s.next_bot_comment(issue).await;
            insta::allow_duplicates! {
                common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(help.body, @r"
                **kodx** runs an AI agent in a sandboxed container on a copy of this repository.

                | command | what happens | who may |
                | --- | --- | --- |
                | `/kodx ask <question>` | the agent reads the code and answers here | write access (or read, if the repository allows it) |
                | `/kodx code <request>` | the agent makes the change and opens a pull request (`--base <branch>` first: from and into that branch) | write access |
                | `/kodx continue [$N \| N steps]` | resumes the code run here that a cost, step or time limit stopped, on its branch and pull request, with the repository's limit again (or `$N` / `N steps`) | write access |
                | `/kodx address-reviews [words]` | on a pull request: one run addresses every unresolved review thread, pushes, and replies in each | write access |
                | `/kodx cancel` | stops the runs on this issue or pull request | write access |
                | `/kodx update` | on a pull request kodx opened: merges its base branch into it with a merge commit (no model) | write access |
                | `/kodx go [$N]` | starts the run here that waits for a go-ahead (`confirm_above_usd`), with a cap of at most `$N` if given | write access |
                | `/kodx steer <words>` | gives your words to the run working here, at its next step | write access |
                | `/kodx help` | this message | everyone |

                The command must start a line, outside code blocks and quotes; everything after it is the request. Limits and the model are set in `.github/kodx.yml`; kodx follows the repository's `AGENTS.md` and pull request template, read from the branch the work targets. With `ci_repair`, kodx repairs red CI on the pull requests it opened; with `triggers.label`, labelling an issue starts `/kodx code`.
                "));
            }
        }
    }
    let db = s.db().await;
    let mut workers = std::collections::BTreeSet::new();
    for run in &run_ids {
        // The help is posted before its run is recorded as ended: wait for that.
        let started = std::time::Instant::now();
        let stored = loop {
            let stored = db.get_run(run).await.unwrap().unwrap();
            if stored.status.is_final() || started.elapsed() > std::time::Duration::from_secs(30) {
                break stored;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        };
        assert!(stored.status.is_final(), "{stored:?}");
        assert_eq!(stored.attempts, 1, "{stored:?}");
        workers.extend(stored.worker.clone());
    }
    // The work was shared: more than one process claimed runs.
    assert!(workers.len() > 1, "{workers:?}");
    db.close().await;
    terminate(&mut b).await;
    terminate(&mut c).await;
    s.finish().await;
    let log = s.log();
    assert_eq!(
        s.github
            .all_comments(REPO)
            .into_iter()
            .filter(|(_, c)| c.is_bot)
            .count(),
        200,
        "{log}"
    );
}

/// Queued runs waiting for a slot are acknowledged once across processes: two worker
/// processes see the same queue, and each run gets one `eyes` and one status comment.
#[tokio::test]
async fn waiting_runs_are_acknowledged_once_across_processes() {
    let _engine = common::require_engine!();
    let Some(admin) = test_databases::postgres_admin_url() else {
        eprintln!(
            "SKIPPED waiting_runs_are_acknowledged_once_across_processes: KODX_SKIP_POSTGRES=1"
        );
        return;
    };
    let url = test_databases::fresh_postgres_database(&admin).await;
    let mut s = Served::start(Options {
        workers: false,
        database_url: Some(url),
        ..Options::default()
    })
    .await;
    const RUNS: u64 = 8;
    let mut runs = Vec::new();
    for issue in 1..=RUNS {
        s.github.add_issue(REPO, issue, "Question", "", "carol");
        s.model.reply(
            vec![json!({"type": "text", "text": "Because of Rayleigh scattering."})],
            "end_turn",
            usage(1000, 10),
        );
        runs.push(
            s.comment(issue, "alice", "/kodx ask why is the sky blue?")
                .await,
        );
    }
    // Two workers (two slots each) start on a queue of eight.
    let (mut a, _) = s.spawn_another(&["--role", "worker"]).await;
    let (mut b, _) = s.spawn_another(&["--role", "worker"]).await;
    for (issue, run) in (1..=RUNS).zip(&runs) {
        let done = s
            .bot_comment_where(issue, "the answer", |c| {
                c.body.lines().any(|l| l == "### ✅ answered")
            })
            .await;
        // The same answer for each run (its id redacted).
        insta::allow_duplicates! {
            common::serve::redactions(&[&run.0], &[])
                .bind(|| insta::assert_snapshot!(done.body, @r#"
                <!-- kodx:{"run":"[run]","v":1} -->
                ### ✅ answered

                > /kodx ask why is the sky blue?

                Because of Rayleigh scattering.

                | model | API calls | input | output | cache write | cache read | cost | duration | stop |
                |---|--:|--:|--:|--:|--:|--:|--:|---|
                | claude-sonnet-4-5 | 1 | 1,000 | 10 | 0 | 0 | $0.0032 of $1.00 | [duration] (agent [duration]) | `end_turn` |

                <sub>kodx run <code>[run]</code></sub>
                "#));
        }
        s.reaction(&s.trigger(run), "rocket").await;
    }
    terminate(&mut a).await;
    terminate(&mut b).await;
    for (issue, run) in (1..=RUNS).zip(&runs) {
        let bot = common::serve::bot_comments(&s, issue);
        assert_eq!(bot.len(), 1, "one status comment on #{issue}: {bot:#?}");
        assert_eq!(
            s.reactions_on(&s.trigger(run)),
            ["eyes", "rocket"],
            "#{issue}"
        );
    }
    s.finish().await;
}

/// Two processes (one run at a time each) sharing one engine that takes one sandbox: their
/// runs take turns on it (the database counts the runs placed there), never two at once.
#[tokio::test]
async fn processes_sharing_an_engine_respect_its_max_runs() {
    let engine = common::require_engine!();
    let Some(admin) = test_databases::postgres_admin_url() else {
        eprintln!("SKIPPED processes_sharing_an_engine_respect_its_max_runs: KODX_SKIP_POSTGRES=1");
        return;
    };
    let host = std::env::var("DOCKER_HOST")
        .ok()
        .filter(|h| h.starts_with("unix://"))
        .unwrap_or_else(|| "unix:///var/run/docker.sock".into());
    let settings = format!(
        "status_interval_secs = 0.2\nshutdown_grace_secs = 5\nmax_concurrent_runs = 1\n\n\
         [[engines]]\nname = \"shared\"\nhost = \"{host}\"\nmax_runs = 1\n"
    );
    let mut s = Served::start(Options {
        workers: true,
        database_url: Some(test_databases::fresh_postgres_database(&admin).await),
        settings: Some(Box::leak(settings.into_boxed_str())),
        ..Options::default()
    })
    .await;
    let (mut other, _) = s.spawn_another(&["--role", "worker"]).await;
    s.github.add_issue(REPO, 7, "One", "", "carol");
    s.github.add_issue(REPO, 8, "Two", "", "carol");
    for _ in 0..2 {
        s.model.reply(tool("sleep 2"), "tool_use", usage(100, 10));
        s.model.reply(text("Done."), "end_turn", usage(100, 10));
    }
    let a = s.comment(7, "alice", "/kodx ask one?").await;
    let b = s.comment(8, "alice", "/kodx ask two?").await;
    let labels = [a.container_label(), b.container_label()];
    let mut most = 0;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        // Runs with a running container (a run's short-lived network helper carries its
        // label too).
        let mut running = 0;
        for label in &labels {
            let containers =
                common::running_containers_labelled(&engine, &format!("kodx.run={label}")).await;
            running += usize::from(!containers.is_empty());
        }
        most = most.max(running);
        let done = bot_comments_with(&s, 7, "Done.") && bot_comments_with(&s, 8, "Done.");
        if done {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{}", s.log());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(
        most, 1,
        "two sandboxes ran at once on an engine that takes one"
    );
    for issue in [7, 8] {
        s.bot_comment_where(issue, "the answer", |c| c.body.contains("Done."))
            .await;
    }
    let db = s.db().await;
    for run in [&a, &b] {
        let row = db.get_run(run).await.unwrap().unwrap();
        let result: serde_json::Value =
            serde_json::from_str(row.result.as_deref().unwrap_or("{}")).unwrap();
        assert_eq!(result["engine"], "shared", "{result}");
    }
    db.close().await;
    terminate(&mut other).await;
    s.finish().await;
}

fn bot_comments_with(s: &Served, issue: u64, text: &str) -> bool {
    common::serve::bot_comments(s, issue)
        .iter()
        .any(|c| c.body.contains(text))
}
