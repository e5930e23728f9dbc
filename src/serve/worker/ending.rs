//! How a run ended, typed, and the one place that writes it down: [`Workers::conclude`]
//! records the run's row, its metrics and its comment for every ending — the agent's
//! outcome, a limit, a failure, a refusal, a panicked task.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::agent::StopReason;
use crate::comment::{self, Done};
use crate::db::{Finish, Run, RunStatus};

use super::gate::Refusal;
use super::tasks::Panicked;
use super::{run_kind, zero_outcome, Workers};

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
    /// The admission it ran under ([`super::gate::Admission::to_json`]).
    pub admission: Mutex<Option<serde_json::Value>>,
    /// The branch a code run pushed its change to (what `/kodx continue` goes on from).
    pub branch: Mutex<Option<String>>,
    /// For `/kodx continue`: the run it went on with, the first request and what the
    /// parts before cost.
    pub continues: Mutex<Option<serde_json::Value>>,
}

/// How long each phase of a run took (stored with its result, logged, and read by
/// `bench/pr-latency.sh`).
#[derive(Default)]
pub(in crate::serve) struct Timings(Mutex<Vec<(&'static str, Duration)>>);

impl Timings {
    pub fn add(&self, phase: &'static str, took: Duration) {
        self.0.lock().expect("lock").push((phase, took));
    }

    pub fn to_json(&self) -> serde_json::Value {
        let phases = self.0.lock().expect("lock");
        serde_json::Value::Object(
            phases
                .iter()
                .map(|(k, d)| (k.to_string(), serde_json::json!(d.as_millis() as u64)))
                .collect(),
        )
    }
}

impl Workers {
    /// Writes down how `run` ended — its row, its metrics, its comment and reaction — for
    /// every ending. `started`: when its work began (for the duration metric).
    pub(in crate::serve) async fn conclude(
        &self,
        run: &Run,
        ended: Result<Ending, RunFailure>,
        log: &RunLog,
        started: Instant,
    ) {
        let (status, done) = match ended {
            Ok(Ending::Work { status, done }) => (status, done),
            Ok(Ending::Answered(reason)) => {
                let result = serde_json::json!({ "refused": reason.as_str() });
                self.finish_quietly(run, RunStatus::Succeeded, reason, result)
                    .await;
                return;
            }
            Err(RunFailure::Refused(refusal)) => {
                self.refuse(run, &refusal).await;
                return;
            }
            Err(RunFailure::User(text)) => (
                RunStatus::Failed,
                self.failed_done(run, StopReason::Error, text),
            ),
            Err(RunFailure::Internal(e)) if e.downcast_ref::<Panicked>().is_some() => {
                // Nothing else would ever finish the run of a task that panicked (the
                // worker logged it).
                self.finish_quietly(
                    run,
                    RunStatus::Failed,
                    EndReason::Internal,
                    serde_json::json!({ "error": format!("{e:#}") }),
                )
                .await;
                let text = format!(
                    "kodx hit an internal error (a worker task panicked). Run id `{}`.",
                    run.id
                );
                let done = self.failed_done(run, StopReason::Error, text);
                self.post_done(run, &done).await;
                return;
            }
            Err(RunFailure::Internal(e)) if !run.is_work() => {
                tracing::error!("{e:#}");
                self.finish_quietly(
                    run,
                    RunStatus::Failed,
                    EndReason::Internal,
                    serde_json::json!({ "error": format!("{e:#}") }),
                )
                .await;
                return;
            }
            Err(RunFailure::Internal(e)) => {
                tracing::error!("{e:#}");
                let text = format!("kodx hit an internal error ({e:#}). Run id `{}`.", run.id);
                (
                    RunStatus::Failed,
                    self.failed_done(run, StopReason::Error, text),
                )
            }
        };
        let o = &done.outcome;
        let fin = Finish {
            status,
            stop_reason: EndReason::Agent(o.stop_reason).as_str().to_string(),
            cost_usd: o.usd_cost,
            input_tokens: o.usage.input_tokens as i64,
            output_tokens: o.usage.output_tokens as i64,
            cache_read_tokens: o.usage.cache_read_tokens as i64,
            cache_write_tokens: o.usage.cache_write_tokens as i64,
            api_calls: i64::from(o.api_calls),
            result: serde_json::json!({
                "last_message": comment::redact(&o.last_message),
                "detail": done.failure.as_deref().or(o.detail.as_deref()).map(comment::redact),
                "model": o.model,
                "timings_ms": log.timings.to_json(),
                "admission": log.admission.lock().expect("lock").clone(),
                "branch": log.branch.lock().expect("lock").clone(),
                "continues": log.continues.lock().expect("lock").clone(),
            })
            .to_string(),
            pr_url: done.pr_url.clone(),
        };
        if let Err(e) = self.db.finish(&run.id, &fin).await {
            tracing::error!("recording the end of the run failed: {e}");
        }
        self.metrics.run_finished(
            run.kind().as_str(),
            o.stop_reason.as_str(),
            o.usd_cost,
            started.elapsed(),
        );
        tracing::info!(
            stop_reason = o.stop_reason.as_str(),
            cost_usd = o.usd_cost,
            api_calls = o.api_calls,
            timings_ms = %log.timings.to_json(),
            "run finished"
        );
        self.post_done(run, &done).await;
    }

    /// A run's end without a model call, with `failure` as what the status comment says.
    pub(super) fn failed_done(&self, run: &Run, reason: StopReason, failure: String) -> Done {
        Done {
            kind: run_kind(run),
            outcome: zero_outcome(reason, 0.0, String::new()),
            text: String::new(),
            pr_url: None,
            pushed: None,
            failure: Some(failure),
        }
    }
}

/// Why a run (or a control job) ended. [`EndReason::as_str`] is the word stored in the
/// `stop_reason` column and used as the `outcome` label of `kodx_runs_total`; it is the
/// same word every earlier version wrote, so stored rows read back the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndReason {
    /// The agent ran (or was meant to): its own stop reason.
    Agent(StopReason),
    /// Who asked may not run the command.
    NotPermitted,
    /// The command could not be read (empty or too long).
    Refused,
    /// `/kodx help` was answered.
    Help,
    /// `/kodx cancel` was done.
    Cancel,
    /// `.github/kodx.yml` is invalid.
    InvalidConfig,
    /// The installation's monthly budget is spent.
    BudgetSpent,
    /// kodx failed (GitHub unreachable, a panicked task, restarted too often).
    Internal,
}

const AGENT_REASONS: [StopReason; 8] = [
    StopReason::EndTurn,
    StopReason::CostLimitExceeded,
    StopReason::MaxIterations,
    StopReason::Timeout,
    StopReason::ToolError,
    StopReason::SetupFailed,
    StopReason::Cancelled,
    StopReason::Error,
];

impl EndReason {
    /// Every reason that is not the agent's.
    const OTHERS: [EndReason; 7] = [
        EndReason::NotPermitted,
        EndReason::Refused,
        EndReason::Help,
        EndReason::Cancel,
        EndReason::InvalidConfig,
        EndReason::BudgetSpent,
        EndReason::Internal,
    ];

    /// The stored word (see the type's documentation).
    pub fn as_str(self) -> &'static str {
        match self {
            EndReason::Agent(reason) => reason.as_str(),
            EndReason::NotPermitted => "not_permitted",
            EndReason::Refused => "refused",
            EndReason::Help => "help",
            EndReason::Cancel => "cancel",
            EndReason::InvalidConfig => "invalid_config",
            EndReason::BudgetSpent => "budget_exceeded",
            EndReason::Internal => "internal_error",
        }
    }

    /// The reason a stored word names; `None` for a word no version wrote.
    pub fn parse(word: &str) -> Option<EndReason> {
        AGENT_REASONS
            .into_iter()
            .map(EndReason::Agent)
            .chain(EndReason::OTHERS)
            .find(|r| r.as_str() == word)
    }
}

impl From<StopReason> for EndReason {
    fn from(reason: StopReason) -> Self {
        EndReason::Agent(reason)
    }
}

impl std::fmt::Display for EndReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stored_words_are_todays_and_read_back() {
        let all: Vec<EndReason> = AGENT_REASONS
            .into_iter()
            .map(EndReason::Agent)
            .chain(EndReason::OTHERS)
            .collect();
        let words: Vec<&str> = all.iter().map(|r| r.as_str()).collect();
        // The words rows and metrics have always held: they must not move.
        assert_eq!(
            words,
            [
                "end_turn",
                "cost_limit_exceeded",
                "max_iterations",
                "timeout",
                "tool_error",
                "setup_failed",
                "cancelled",
                "error",
                "not_permitted",
                "refused",
                "help",
                "cancel",
                "invalid_config",
                "budget_exceeded",
                "internal_error",
            ]
        );
        for r in all {
            assert_eq!(EndReason::parse(r.as_str()), Some(r));
        }
        assert_eq!(EndReason::parse("exploded"), None);
        assert_eq!(EndReason::parse(""), None);
    }
}
