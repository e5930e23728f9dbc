//! The rows kodx stores and the types of their columns.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use sqlx::FromRow;

use super::DbError;
use crate::serve::job::RunRequest;

/// Where a run is in its life. Stored as lowercase text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, sqlx::Type)]
#[serde(rename_all = "lowercase")]
#[sqlx(rename_all = "lowercase")]
pub enum RunStatus {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
}

impl RunStatus {
    pub const ALL: [RunStatus; 5] = [
        RunStatus::Queued,
        RunStatus::Running,
        RunStatus::Succeeded,
        RunStatus::Failed,
        RunStatus::Cancelled,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RunStatus::Queued => "queued",
            RunStatus::Running => "running",
            RunStatus::Succeeded => "succeeded",
            RunStatus::Failed => "failed",
            RunStatus::Cancelled => "cancelled",
        }
    }

    /// Succeeded, failed or cancelled: the run will not change again.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunStatus::Succeeded | RunStatus::Failed | RunStatus::Cancelled
        )
    }
}

impl fmt::Display for RunStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for RunStatus {
    type Err = DbError;

    fn from_str(s: &str) -> Result<Self, DbError> {
        RunStatus::ALL
            .into_iter()
            .find(|status| status.as_str() == s)
            .ok_or_else(|| DbError::Corrupt(format!("unknown run status {s:?}")))
    }
}

/// A webhook delivery as it is recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewDelivery {
    /// GitHub's `X-GitHub-Delivery` id.
    pub id: String,
    /// `X-GitHub-Event`.
    pub event: String,
    pub action: Option<String>,
    pub installation_id: Option<i64>,
    /// `owner/name`.
    pub repo: Option<String>,
}

/// A run to queue: the typed request the webhook read.
pub use crate::serve::job::RunRequest as NewRun;

/// What [`Db::accept`] did with a delivery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Accepted {
    /// The delivery is new and its run is queued.
    Queued { run_id: String },
    /// The delivery is new and was recorded; it queued nothing.
    Recorded,
    /// The delivery id was seen before; nothing was written.
    Duplicate,
    /// The delivery is new (and recorded) but its trigger (the same comment or issue)
    /// already queued `run_id`: a replayed body, not a second command. Nothing is queued.
    DuplicateTrigger { run_id: String },
}

/// A stored run, as [`run_columns!`] selects it.
#[derive(Debug, Clone, PartialEq, FromRow)]
pub struct Run {
    /// 12 lowercase hex characters.
    pub id: String,
    pub delivery_id: String,
    /// What was asked, by whom, where: as the webhook read it.
    #[sqlx(flatten)]
    pub request: RunRequest,
    pub status: RunStatus,
    /// Free text for observability (`setting_up`, `working` …); cleared when claimed.
    pub phase: Option<String>,
    /// How many times a worker has claimed it.
    pub attempts: i64,
    /// The worker that claimed it last.
    pub worker: Option<String>,
    /// Put back in the queue after a process died while running it.
    pub recovered: bool,
    pub status_comment_id: Option<i64>,
    pub stop_reason: Option<String>,
    pub cost_usd: Option<f64>,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cache_read_tokens: i64,
    pub cache_write_tokens: i64,
    pub api_calls: i64,
    /// JSON text: the run's summary, written by [`Db::finish`] (or by [`Db::recover`]:
    /// `{"error": "…"}`).
    pub result: Option<String>,
    pub pr_url: Option<String>,
    pub cancelled_by: Option<String>,
    /// Unix milliseconds.
    pub created_at: i64,
    pub started_at: Option<i64>,
    pub finished_at: Option<i64>,
}

impl Run {
    /// True for `ask` and `code` runs, which do agent work.
    pub fn is_work(&self) -> bool {
        self.request.job.is_work()
    }

    /// What kind of job the run is (`ask`, `code`, `help` …).
    pub fn kind(&self) -> crate::serve::job::JobKind {
        self.request.job.kind()
    }
}

/// How a run ended, for [`Db::finish`].
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    /// `Succeeded`, `Failed` or `Cancelled`.
    pub status: RunStatus,
    pub stop_reason: String,
    pub cost_usd: f64,
    pub input_tokens: i64,
    pub output_tokens: i64,
    pub cache_read_tokens: i64,
    pub cache_write_tokens: i64,
    pub api_calls: i64,
    /// JSON text: the run's summary.
    pub result: String,
    pub pr_url: Option<String>,
}

impl Finish {
    /// A run that ends without a model call (refused, or failed before its first).
    pub fn without_calls(
        status: RunStatus,
        stop_reason: &str,
        result: serde_json::Value,
    ) -> Finish {
        Finish {
            status,
            stop_reason: stop_reason.to_string(),
            cost_usd: 0.0,
            input_tokens: 0,
            output_tokens: 0,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
            api_calls: 0,
            result: result.to_string(),
            pr_url: None,
        }
    }
}

/// One run touched by [`Db::cancel_issue`].
#[derive(Debug, Clone, PartialEq)]
pub struct CancelledRun {
    /// The run as it is now: `cancelled` if it was queued, still `running` if it was running.
    pub run: Run,
    /// The run was running and was NOT changed: the caller must stop it and finish it as
    /// cancelled.
    pub was_running: bool,
}

/// What [`Db::recover`] did with a run a dead process left running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecoveryAction {
    /// Back in the queue, `recovered` set.
    Requeued,
    /// Out of attempts: failed with stop reason `internal_error`.
    Failed,
}

/// One run handled by [`Db::recover`], as it is after recovery.
#[derive(Debug, Clone, PartialEq)]
pub struct Recovered {
    pub run: Run,
    pub action: RecoveryAction,
}

/// An installation of the App, as its last `installation` event left it.
#[derive(Debug, Clone, PartialEq, Eq, FromRow)]
pub struct InstallationRecord {
    pub id: i64,
    pub account: String,
    pub last_action: String,
    pub suspended: bool,
    pub deleted: bool,
    pub created_at: i64,
    pub updated_at: i64,
}

/// Run counts and spend, for `/metrics`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunCounts {
    pub queued: i64,
    pub running: i64,
    pub succeeded: i64,
    pub failed: i64,
    pub cancelled: i64,
    /// Sum of `cost_usd` over every run.
    pub spend_usd: f64,
}

impl RunCounts {
    /// The count for one status.
    pub fn get(&self, status: RunStatus) -> i64 {
        match status {
            RunStatus::Queued => self.queued,
            RunStatus::Running => self.running,
            RunStatus::Succeeded => self.succeeded,
            RunStatus::Failed => self.failed,
            RunStatus::Cancelled => self.cancelled,
        }
    }
}

/// The columns of a [`Run`], as its `FromRow` reads them (by name).
macro_rules! run_columns {
    () => {
        "id, delivery_id, kind, installation_id, repo, issue_number, is_pull_request, \
         argument, author, author_id, trigger_kind, trigger_id, clone_url, default_branch, \
         context, status, phase, attempts, worker, recovered, status_comment_id, stop_reason, \
         cost_usd, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, \
         api_calls, result, pr_url, cancelled_by, created_at, started_at, finished_at"
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_round_trip_as_text() {
        for status in RunStatus::ALL {
            assert_eq!(status.as_str().parse::<RunStatus>().unwrap(), status);
            assert_eq!(status.to_string(), status.as_str());
        }
        assert!("done".parse::<RunStatus>().is_err());
        assert!(!RunStatus::Running.is_final() && RunStatus::Cancelled.is_final());
    }
}
