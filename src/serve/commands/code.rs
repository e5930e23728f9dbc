//! `/kodx code` (and `/kodx continue`, which goes on with one): the agent changes the
//! repository in its container; the exact change set comes out and is delivered
//! ([`crate::serve::pipeline::deliver`]) as a pull request (or a commit on the pull
//! request's branch). Work a limit cut short is delivered marked incomplete, as
//! `pr.on_limit` says.

use std::time::Instant;

use crate::db::RunStatus;
use crate::job::Job;
use crate::model::Message;
use crate::repo_config::OnRed;
use crate::sandbox::Sandbox as _;
use crate::serve::commands::continue_run::Earlier;
use crate::serve::pipeline::checks::report_checks;
use crate::serve::pipeline::deliver::{
    deliver, deliverable, Change, Delivered, DeliveryError, Target,
};
use crate::serve::pipeline::execute::execute;
use crate::serve::pipeline::plan::RunPlan;
use crate::serve::pipeline::threads;
use crate::serve::pipeline::{Ending, RunCtx, RunFailure};
use crate::serve::texts::status::Done;
use crate::serve::texts::{self, checks, Form, Readiness};

/// Runs `/kodx code`: planned, executed, delivered.
pub(in crate::serve) async fn run(cx: &RunCtx<'_>) -> Result<Ending, RunFailure> {
    let plan = cx.plan().await?;
    let messages = vec![Message::user_text(&plan.prompt)];
    deliver_work(cx, &plan, messages, None).await
}

/// Executes a planned code run from `messages` and delivers its change; `earlier`: the
/// stopped run a `/kodx continue` goes on with.
pub(in crate::serve) async fn deliver_work(
    cx: &RunCtx<'_>,
    plan: &RunPlan,
    messages: Vec<Message>,
    earlier: Option<Earlier>,
) -> Result<Ending, RunFailure> {
    let (workspace, sandbox, outcome, verified) = match execute(cx, plan, messages).await?.ran() {
        Ok(ran) => ran,
        Err(ending) => return Ok(ending),
    };
    let (mut deliverable, partial) = deliverable(outcome.stop_reason, plan.on_limit);
    // Checks that stayed red decide with `pr.on_red` (SPEC §11).
    let on_red = cx.admission.config.pr.on_red;
    let red = crate::checks::all_passed(&outcome.checks) == Some(false);
    if red && on_red == OnRed::Discard {
        deliverable = false;
    }
    let target = plan
        .target
        .as_ref()
        .ok_or_else(|| anyhow::anyhow!("a code run was planned without a target"))?;
    let changes = if deliverable {
        let started = Instant::now();
        // What the last checks judged, when nothing changed after them; else read now.
        let changes = match verified {
            Some(verified) => Ok(verified),
            None => sandbox.change_set().await,
        };
        cx.log.timings.add("export", started.elapsed());
        Some(changes)
    } else {
        None
    };
    // The container goes while the change is delivered (it is not needed any more).
    let teardown = tokio::spawn(async move { sandbox.destroy().await });
    let mut done = Done::new(plan.kind, outcome);
    let new_pull = matches!(target, Target::NewPull { .. });
    if red {
        done.notes
            .push(checks::red_note(&done.outcome.checks, on_red, new_pull));
    }
    if let Some(note) = checks::edited_note(&done.outcome.checks) {
        done.notes.push(note);
    }
    let mut readiness = Readiness::Unchanged;
    done.text = done.outcome.last_message.clone();
    if matches!(cx.run.request.job, Job::AddressReviews { .. }) {
        // The list is for kodx (`done.text` keeps it for the replies); the commit, the pull
        // request and the stored result get the summary without it.
        done.outcome.last_message = threads::without_list(&done.outcome.last_message);
    }
    done.setup = *cx.log.setup.lock();
    if let Some(changes) = changes {
        // A continuation's commit and pull request say the request it continues.
        let request = match &earlier {
            Some(earlier) => earlier.request.clone(),
            None => work_request(&cx.run.request.job),
        };
        let delivered = match changes {
            Ok(changes) => {
                let paths: Vec<&str> = changes.changes.iter().map(|c| c.path.as_str()).collect();
                // kodx's part of the body: the checks, and what red ones made of it.
                let mut extra = checks::section(&done.outcome.checks);
                for note in &done.notes {
                    extra.push_str(note);
                }
                if let Some(note) = checks::rules_edited_note(&paths) {
                    extra.push_str(&note);
                }
                let change = Change {
                    request: &request,
                    workspace: &workspace,
                    target,
                    draft: plan.draft || (red && on_red == OnRed::Draft),
                    partial,
                    form: Form {
                        templated: plan
                            .repo_context
                            .as_ref()
                            .is_some_and(|c| c.template.is_some()),
                        checks_passed: checks::plainly_green(&done.outcome.checks) == Some(true),
                        extra,
                    },
                };
                deliver(cx, change, changes, &done).await
            }
            Err(e) => Err(DeliveryError::Export(e)),
        };
        match delivered {
            Ok(Delivered::Pull(url, ready)) => {
                done.pr_url = Some(url);
                readiness = ready;
            }
            Ok(Delivered::Pushed { sha, branch }) => done.pushed = Some((sha, branch)),
            Ok(Delivered::Nothing) => {}
            Err(failure) => done.failure = Some(failure.to_string()),
        }
        if done.pr_url.is_some() || done.pushed.is_some() {
            *cx.log.branch.lock() = Some(target.branch().to_string());
            record_pull_commit(cx, done.pr_url.as_deref()).await;
        }
        // The checks, where GitHub shows them: a `kodx` Check Run on the pushed commit.
        let commit = cx.log.commit.lock().clone();
        if let (Some(sha), false) = (commit, done.outcome.checks.is_empty()) {
            if let Err(note) = report_checks(cx, &sha, &done.outcome.checks).await {
                done.notes.push(format!("{note}\n\n"));
            }
        }
    }
    match teardown.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("removing the container failed: {e}"),
        Err(e) => tracing::warn!("removing the container failed: {e}"),
    }
    // The clone goes with its workspace.
    drop(workspace);
    if let Some(earlier) = &earlier {
        done.text = texts::continued(
            &done.text,
            &earlier.id,
            earlier.cost,
            done.outcome.usd_cost,
            &readiness,
        );
    }
    let status = if done.succeeded() {
        RunStatus::Succeeded
    } else {
        RunStatus::Failed
    };
    Ok(Ending::Work { status, done })
}

/// What the commit and the pull request say was asked: the request, or for the runs kodx
/// words itself, what they do.
fn work_request(job: &Job) -> String {
    match job {
        Job::AddressReviews { words } if words.trim().is_empty() => {
            "Address the review threads".to_string()
        }
        Job::AddressReviews { words } => format!("Address the review threads: {words}"),
        Job::Repair { commit } => format!(
            "Repair the failing CI of {}",
            commit.get(..7).unwrap_or(commit)
        ),
        other => other.argument().into_owned(),
    }
}

/// Remembers the commit this run made the head of a pull request (SPEC §11: CI repair acts
/// only on pull requests kodx opened, while their head is kodx's).
async fn record_pull_commit(cx: &RunCtx<'_>, pr_url: Option<&str>) {
    let Some(sha) = cx.log.commit.lock().clone() else {
        return;
    };
    let request = &cx.run.request;
    let (pull, opened) = match pr_url.and_then(pull_number) {
        // A new pull request (a fork's gets one too); an earlier part's is its own.
        Some(n) if !(request.is_pull_request && n == request.issue_number) => (n, true),
        Some(n) => (n, false),
        None if request.is_pull_request => (request.issue_number, false),
        None => return,
    };
    if let Err(e) = cx
        .svc
        .db
        .record_pull_commit(
            &request.repo,
            pull,
            &sha,
            &cx.run.id,
            cx.fence.lease(),
            request.job.kind().as_str(),
            opened,
        )
        .await
    {
        tracing::warn!("recording the pushed commit failed: {e}");
    }
}

/// The number at the end of a pull request's address (`…/pull/12`).
fn pull_number(url: &str) -> Option<i64> {
    let (_, n) = url.trim_end_matches('/').rsplit_once("/pull/")?;
    n.parse().ok()
}
