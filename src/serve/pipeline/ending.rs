//! How a run ended, typed, and the one place that writes it down: [`conclude`]
//! records the run's row, its metrics and its comment for every ending — the agent's
//! outcome, a limit, a failure, a refusal, a panicked task.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use crate::agent::{Outcome, StopReason};
use crate::db::{AdmissionRecord, Continues, EndReason, Finish, Run, RunResult, RunStatus};
use crate::redact::redact;
use crate::serve::texts;
use crate::serve::texts::status::Done;

use crate::model::Usage;

use super::gate::Refusal;
use super::{finish, gate, run_kind, status, Services, StatusComment};

/// How a job's work ended, before it is written down. (One per job, moved once: its size
/// does not matter.)
#[allow(clippy::large_enum_variant)]
pub(in crate::serve) enum Ending {
    /// An agent run's end: it succeeded, a limit stopped it, something failed after the
    /// agent, or it was cancelled.
    Work { status: RunStatus, done: Done },
    /// A control job did what it was asked (`help`, `cancel`).
    Answered(EndReason),
}

/// Why a job could not do its work.
#[derive(Debug)]
pub(in crate::serve) enum RunFailure {
    /// It may not run; nothing was started.
    Refused(Refusal),
    /// Something the maintainer can fix (the clone, the container, the model's price): the
    /// sentence the status comment shows.
    User(String),
    /// kodx failed: logged with its cause; the comment gives the run id.
    Internal(anyhow::Error),
}

/// Anything a handler passes on with `?` is kodx's own failure.
impl From<anyhow::Error> for RunFailure {
    fn from(e: anyhow::Error) -> Self {
        RunFailure::Internal(e)
    }
}

impl From<Refusal> for RunFailure {
    fn from(r: Refusal) -> Self {
        RunFailure::Refused(r)
    }
}

/// What a run noted while it worked, stored with its result.
#[derive(Default)]
pub(in crate::serve) struct RunLog {
    pub timings: Timings,
    /// The admission it ran under ([`super::gate::Admission::record`]).
    pub admission: Mutex<Option<AdmissionRecord>>,
    /// How the container's setup went (`None`: no container).
    pub setup: Mutex<Option<crate::sandbox::SetupReport>>,
    /// The branch a code run pushed its change to (what `/kodx continue` goes on from).
    pub branch: Mutex<Option<String>>,
    /// For `/kodx continue`: the run it went on with, the first request and what the
    /// parts before cost.
    pub continues: Mutex<Option<Continues>>,
    /// The Docker engine the run's container is on; given back when the run is over.
    pub placement: Mutex<Option<super::Placement>>,
    /// The run's container was a warm sandbox (counted as in use while the run goes on).
    pub warm: Mutex<Option<super::warm::InUse>>,
    /// How the copy-in used it, when it held the repository's checkout.
    pub preloaded: Mutex<Option<crate::sandbox::docker::PreloadUse>>,
    /// The images of the issue that were not given to the model, as the status comment
    /// names them ([`super::images`]).
    pub images_note: Mutex<Option<String>>,
    /// The secrets `.github/kodx.yml` names that the run did not get, as the status
    /// comment names them ([`super::secrets`]).
    pub secrets_note: Mutex<Option<String>>,
    /// The run's sandbox at kodx's egress proxy, while it works ([`super::egress`]).
    pub egress: Mutex<Option<crate::egress::Registration>>,
    /// What the egress proxy refused, or why `network.allow` was not used, as the status
    /// comment (and the pull request) says it; taken by whichever shows it first.
    pub egress_note: Mutex<Option<String>>,
}

impl RunLog {
    /// The engine's name, and what fires when it stops answering (`None`: no container).
    pub fn placed_on(&self) -> Option<(String, tokio_util::sync::CancellationToken)> {
        self.placement
            .lock()
            .as_ref()
            .map(|p| (p.name.clone(), p.lost().clone()))
    }

    /// The engine the run's container is on (`None`: no container).
    pub fn engine(&self) -> Option<crate::sandbox::Engine> {
        self.placement.lock().as_ref().map(|p| p.engine.clone())
    }
}

/// How long each phase of a run took (stored with its result, logged, and read by
/// `bench/pr-latency.sh`).
#[derive(Default)]
pub(in crate::serve) struct Timings(Mutex<Vec<(&'static str, Duration)>>);

impl Timings {
    pub fn add(&self, phase: &'static str, took: Duration) {
        self.0.lock().push((phase, took));
    }

    /// Each phase's milliseconds (a phase timed twice keeps its last).
    pub fn millis(&self) -> BTreeMap<String, u64> {
        let phases = self.0.lock();
        phases
            .iter()
            .map(|(k, d)| (k.to_string(), d.as_millis() as u64))
            .collect()
    }
}

/// Writes down how `run` ended — its row, its metrics, its comment and reaction — for
/// every ending. `started`: when its work began (for the duration metric).
pub(in crate::serve) async fn conclude(
    svc: &Services,
    run: &Run,
    ended: Result<Ending, RunFailure>,
    log: &RunLog,
    started: Instant,
) {
    conclude_with(svc, run, ended, log, started, None).await
}

/// [`conclude`], with the run's own status comment when it has one (a run
/// that got its context), so the final edit needs no token of its own.
pub(in crate::serve) async fn conclude_with(
    svc: &Services,
    run: &Run,
    ended: Result<Ending, RunFailure>,
    log: &RunLog,
    started: Instant,
    comment: Option<&StatusComment>,
) {
    let (status, done) = match ended {
        Ok(Ending::Work { status, done }) => (status, done),
        Ok(Ending::Answered(reason)) => {
            let result = RunResult {
                refused: Some(reason.as_str().to_string()),
                ..RunResult::default()
            };
            finish::finish_quietly(svc, run, RunStatus::Succeeded, reason, &result).await;
            return;
        }
        Err(RunFailure::Refused(refusal)) => {
            gate::refuse(svc, run, &refusal).await;
            return;
        }
        Err(RunFailure::User(text)) => {
            (RunStatus::Failed, failed_done(run, StopReason::Error, text))
        }
        Err(RunFailure::Internal(e)) if e.downcast_ref::<Panicked>().is_some() => {
            // Nothing else would ever finish the run of a task that panicked (the
            // worker logged it).
            let ended_here = finish::finish_quietly(
                svc,
                run,
                RunStatus::Failed,
                EndReason::InternalError,
                &failed_result(&e),
            )
            .await;
            if !ended_here {
                return;
            }
            let text = texts::internal_error("a worker task panicked", &run.id);
            let done = failed_done(run, StopReason::Error, text);
            status::post_done(svc, run, &done).await;
            return;
        }
        Err(RunFailure::Internal(e)) if !run.is_work() => {
            tracing::error!("{e:#}");
            finish::finish_quietly(
                svc,
                run,
                RunStatus::Failed,
                EndReason::InternalError,
                &failed_result(&e),
            )
            .await;
            return;
        }
        Err(RunFailure::Internal(e)) => {
            tracing::error!("{e:#}");
            let text = texts::internal_error(&format!("{e:#}"), &run.id);
            (RunStatus::Failed, failed_done(run, StopReason::Error, text))
        }
    };
    let o = &done.outcome;
    let fin = Finish {
        status,
        stop_reason: EndReason::Agent(o.stop_reason),
        cost_usd: o.usd_cost,
        input_tokens: o.usage.input_tokens as i64,
        output_tokens: o.usage.output_tokens as i64,
        cache_read_tokens: o.usage.cache_read_tokens as i64,
        cache_write_tokens: o.usage.cache_write_tokens as i64,
        api_calls: i64::from(o.api_calls),
        result: RunResult {
            last_message: redact(&o.last_message),
            detail: done.failure.as_deref().or(o.detail.as_deref()).map(redact),
            model: o.model.clone(),
            timings_ms: log.timings.millis(),
            admission: log.admission.lock().clone(),
            setup_cache: log.setup.lock().map(|s| s.cache.as_str().to_string()),
            branch: log.branch.lock().clone(),
            continues: log.continues.lock().clone(),
            engine: log.placed_on().map(|(name, _)| name),
            warm_start: log.warm.lock().is_some(),
            preloaded: log.preloaded.lock().map(|u| u.as_str().to_string()),
            ..RunResult::default()
        }
        .to_text(),
        pr_url: done.pr_url.clone(),
    };
    stop_before_finish_for_tests();
    match svc
        .db
        .finish(&run.id, &finish::holder(svc, run), &fin)
        .await
    {
        Ok(true) => {}
        Ok(false) => {
            // Ended already, or another process holds it now (this one was paused or
            // cut off past its lease): its end is that process's to write and post.
            tracing::warn!("run given up here: another process holds it now");
            return;
        }
        // The database could not say: the outcome is still shown (as before the
        // database failed), and the run is recovered when it answers again.
        Err(e) => tracing::error!("recording the end of the run failed: {e}"),
    }
    svc.metrics.run_finished(
        run.kind().as_str(),
        o.stop_reason.as_str(),
        o.usd_cost,
        started.elapsed(),
    );
    tracing::info!(
        stop_reason = o.stop_reason.as_str(),
        cost_usd = o.usd_cost,
        api_calls = o.api_calls,
        timings_ms = %serde_json::to_string(&log.timings.millis()).unwrap_or_default(),
        warm_start = log.warm.lock().is_some(),
        "run finished"
    );
    // A run that outlived its token (about an hour) takes a new one for the last edit.
    let mut done = done;
    done.wall = Some(run.since_acknowledged(crate::db::now_ms()));
    if let Some(note) = log.images_note.lock().clone() {
        done.notes.push(note);
    }
    if let Some(note) = log.secrets_note.lock().clone() {
        done.notes.push(note);
    }
    if let Some(note) = log.egress_note.lock().take() {
        done.notes.push(note);
    }
    if run.is_work() {
        done.notes
            .extend(super::steering::too_late(svc, &run.id).await);
    }
    match comment.filter(|c| c.gh().valid_for(Duration::from_secs(60))) {
        Some(comment) => comment.finish(&done).await,
        None => status::post_done(svc, run, &done).await,
    }
}

/// A run's end without a model call, with `failure` as what the status comment says.
pub(in crate::serve) fn failed_done(run: &Run, reason: StopReason, failure: String) -> Done {
    let mut done = Done::new(run_kind(run), zero_outcome(reason, 0.0, String::new()));
    done.failure = Some(failure);
    done
}

/// Tests only: with `KODX_TEST_STOP_BEFORE_FINISH=1` the process stops itself (`SIGSTOP`)
/// once a run's work is over and every check of its lease is behind it, just before its end
/// is written — so a test can let another process take the run over and then resume this
/// one (`SIGCONT`), and see that the end written with a lost lease changes nothing.
fn stop_before_finish_for_tests() {
    if std::env::var("KODX_TEST_STOP_BEFORE_FINISH").is_ok_and(|v| v == "1") {
        tracing::warn!("KODX_TEST_STOP_BEFORE_FINISH=1: stopping before the run's end is written");
        // SAFETY: raise(3) with a valid signal number; SIGSTOP stops the whole process.
        unsafe { libc::raise(libc::SIGSTOP) };
    }
}

/// A task that ended by panicking, with the run it worked on.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the worker task panicked: {message}")]
pub(in crate::serve) struct Panicked {
    pub run_id: String,
    pub message: String,
}

/// The stored result of a run kodx failed.
fn failed_result(e: &anyhow::Error) -> RunResult {
    RunResult {
        error: Some(format!("{e:#}")),
        ..RunResult::default()
    }
}

/// The outcome of a run that ended without a model call.
pub(in crate::serve) fn zero_outcome(
    reason: StopReason,
    cost_limit: f64,
    model: String,
) -> Outcome {
    Outcome {
        stop_reason: reason,
        last_message: String::new(),
        api_calls: 0,
        usage: Usage::default(),
        usd_cost: 0.0,
        cost_limit,
        duration: Duration::ZERO,
        model,
        detail: None,
        checks: Vec::new(),
    }
}
