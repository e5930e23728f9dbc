//! Execute and deliver: the stage every command that changes the repository ends in. The
//! agent works in its container ([`super::execute`]); its exact change set comes out and is
//! delivered ([`super::deliver`]) as a pull request (or a commit on the pull request's
//! branch), with its checks as a `kodx` Check Run ([`super::checks`]). Work a limit cut
//! short is delivered marked incomplete, as `pr.on_limit` says; checks that stayed red
//! decide with `pr.on_red`.
//!
//! A command says what is particular to it in a [`Delivery`]: the request the commit and
//! the pull request name, how the summary is read from the agent's last message, and the
//! stopped run it continues. Nothing here asks which command runs.

use std::time::Instant;

use crate::db::RunStatus;
use crate::model::Message;
use crate::repo_config::{OnLimit, OnRed};
use crate::sandbox::{ChangeSet, Sandbox as _, SandboxError};
use crate::serve::texts::status::Done;
use crate::serve::texts::{self, checks, Form, Readiness};

use super::checks::report_checks;
use super::deliver::{deliver, deliverable, Change, Delivered, Shipped, Target};
use super::execute::execute;
use super::plan::RunPlan;
use super::workspace::Workspace;
use super::{Ending, RunCtx, RunFailure};

/// What a command's delivery says beyond the change itself.
pub(in crate::serve) struct Delivery {
    /// What the commit and the pull request say was asked: the request, the words kodx
    /// gives a run it starts itself, or for a continuation the first request of its chain.
    pub request: String,
    /// How the summary of the change (what the commit, the pull request and the stored
    /// result say) is read from the agent's last message; the status comment gets the
    /// whole message.
    pub summary: fn(&str) -> String,
    /// The stopped run a `/kodx continue` goes on with.
    pub continues: Option<Earlier>,
    /// A sentence about how the run came to be, shown under its result (a repair whose
    /// failure survived a re-run of the failed jobs).
    pub note: Option<String>,
}

impl Delivery {
    /// `request` delivered as asked: the summary as the agent wrote it, continuing nothing.
    pub fn of(request: impl Into<String>) -> Delivery {
        Delivery {
            request: request.into(),
            summary: |message| message.to_string(),
            continues: None,
            note: None,
        }
    }
}

/// The stopped run a `/kodx continue` goes on with.
#[derive(Debug, Clone, PartialEq)]
pub(in crate::serve) struct Earlier {
    pub id: String,
    /// The request of the first `/kodx code` of the chain (a continue of a continue goes
    /// back to it): the pull request's title and commit subjects say it.
    pub request: String,
    /// The branch the stopped run pushed its work to.
    pub branch: String,
    /// What the stopped run (and the parts before it) cost, USD.
    pub cost: f64,
    /// The stopped run's status comment, which the continuation goes on in.
    pub status_comment_id: Option<i64>,
}

/// Executes a planned code run from `messages` and delivers its change as `delivery` says.
pub(in crate::serve) async fn execute_and_deliver(
    cx: &RunCtx<'_>,
    plan: &RunPlan,
    messages: Vec<Message>,
    delivery: Delivery,
) -> Result<Ending, RunFailure> {
    let (workspace, sandbox, outcome, verified) = match execute(cx, plan, messages).await?.ran() {
        Ok(ran) => ran,
        Err(ending) => return Ok(ending),
    };
    let mut done = Done::new(plan.kind, outcome);
    let (mut deliverable, partial) = deliverable(done.outcome.stop_reason, plan.on_limit);
    // Checks that stayed red decide with `pr.on_red` (SPEC §11).
    let on_red = cx.admission.config.pr.on_red;
    let red = done.verdict.is_red();
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
            None => {
                // No warm sandbox is made on the engine while the change set is read.
                let busy = cx
                    .log
                    .placement
                    .lock()
                    .as_ref()
                    .and_then(|p| p.warm().map(|w| w.busy_guard()));
                let changes = sandbox.change_set().await;
                drop(busy);
                changes
            }
        };
        cx.log.timings.add("export", started.elapsed());
        Some(changes)
    } else {
        None
    };
    // The container goes while the change is delivered (it is not needed any more).
    let teardown = tokio::spawn(async move { sandbox.destroy().await });
    let new_pull = matches!(target, Target::NewPull { .. });
    if let Some(note) = &delivery.note {
        done.notes.push(format!("{note}\n\n"));
    }
    // What the egress proxy refused goes in the pull request too.
    if let Some(note) = cx.log.egress_note.lock().take() {
        done.notes.push(note);
    }
    if red {
        done.notes
            .push(checks::red_note(&done.outcome.checks, on_red, new_pull));
    }
    if let Some(note) = checks::edited_note(&done.outcome.checks, done.verdict) {
        done.notes.push(note);
    }
    // The status comment gets the whole message; the commit, the pull request and the
    // stored result get the summary read from it.
    done.text = done.outcome.last_message.clone();
    done.outcome.last_message = (delivery.summary)(&done.outcome.last_message);
    done.setup = *cx.log.setup.lock();
    let mut readiness = Readiness::Unchanged;
    if let Some(changes) = changes {
        let to = To {
            plan,
            request: &delivery.request,
            workspace: &workspace,
            target,
            partial,
        };
        readiness = deliver_change(cx, to, changes, &mut done).await;
    }
    match teardown.await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!("removing the container failed: {e}"),
        Err(e) => tracing::warn!("removing the container failed: {e}"),
    }
    // The clone goes with its workspace.
    drop(workspace);
    if let Some(earlier) = &delivery.continues {
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

/// Where a change goes, and what it is delivered as.
struct To<'a> {
    plan: &'a RunPlan,
    request: &'a str,
    workspace: &'a Workspace,
    target: &'a Target,
    partial: Option<OnLimit>,
}

/// Delivers the change set the container gave (or says why it gave none), notes where it
/// went in `done`, and reports the checks on the pushed commit. What became of an earlier
/// part's draft pull request.
async fn deliver_change(
    cx: &RunCtx<'_>,
    to: To<'_>,
    changes: Result<ChangeSet, SandboxError>,
    done: &mut Done,
) -> Readiness {
    let shipped = match changes {
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
            let on_red = cx.admission.config.pr.on_red;
            let change = Change {
                request: to.request,
                workspace: to.workspace,
                target: to.target,
                draft: to.plan.draft || (done.verdict.is_red() && on_red == OnRed::Draft),
                partial: to.partial,
                form: Form {
                    templated: to
                        .plan
                        .repo_context
                        .as_ref()
                        .is_some_and(|c| c.template.is_some()),
                    checks_passed: done.verdict.plainly_green() == Some(true),
                    extra,
                },
            };
            deliver(cx, change, changes, done).await
        }
        Err(e) => Shipped::failed(super::deliver::DeliveryError::Export(e)),
    };
    let mut readiness = Readiness::Unchanged;
    match shipped.delivered {
        Ok(Delivered::Pull(url, ready)) => {
            done.pr_url = Some(url);
            readiness = ready;
        }
        Ok(Delivered::Pushed { sha, branch }) => done.pushed = Some((sha, branch)),
        Ok(Delivered::Nothing) => {}
        Err(failure) => done.failure = Some(failure.to_string()),
    }
    done.commit = shipped.commit;
    if done.pr_url.is_some() || done.pushed.is_some() {
        *cx.log.branch.lock() = Some(to.target.branch().to_string());
        let base = match to.target {
            Target::NewPull { base, .. } => Some(base.as_str()),
            _ => None,
        };
        record_pull_commit(cx, done.commit.as_deref(), done.pr_url.as_deref(), base).await;
    }
    // The checks, where GitHub shows them: a `kodx` Check Run on the pushed commit.
    if let (Some(sha), false) = (&done.commit, done.outcome.checks.is_empty()) {
        if let Err(note) = report_checks(cx, sha, &done.outcome.checks, done.verdict).await {
            done.notes.push(format!("{note}\n\n"));
        }
    }
    readiness
}

/// Remembers the commit this run made the head of a pull request (SPEC §11: CI repair acts
/// only on pull requests kodx opened, while their head is kodx's).
/// A pull request it opened into `base` is remembered with its base: a push there looks
/// at it (SPEC §12).
async fn record_pull_commit(
    cx: &RunCtx<'_>,
    commit: Option<&str>,
    pr_url: Option<&str>,
    base: Option<&str>,
) {
    let Some(sha) = commit else {
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
            sha,
            &cx.run.id,
            cx.lease.lease(),
            request.job.kind().as_str(),
            opened,
        )
        .await
    {
        tracing::warn!("recording the pushed commit failed: {e}");
    }
    if let (true, Some(base)) = (opened, base) {
        if let Err(e) = cx.svc.db.record_pull_base(&request.repo, pull, base).await {
            tracing::warn!("recording the pull request's base failed: {e}");
        }
    }
}

/// The number at the end of a pull request's address (`…/pull/12`).
fn pull_number(url: &str) -> Option<i64> {
    let (_, n) = url.trim_end_matches('/').rsplit_once("/pull/")?;
    n.parse().ok()
}
