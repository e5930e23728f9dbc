//! The rows kodx stores and the types of their columns.

use std::fmt;
use std::str::FromStr;

use serde::Serialize;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::FromRow;

use super::error::DbError;
use crate::agent::StopReason;
use crate::job::RunRequest;

/// Where a run is in its life. Stored as lowercase text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, sqlx::Type)]
#[serde(rename_all = "lowercase")]
#[sqlx(rename_all = "lowercase", type_name = "text")]
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

/// Why a run ended: the `stop_reason` column, typed. Stored as TEXT with exactly the words
/// kodx has always written, so rows from every earlier version read the same, and a word
/// this version does not know (a newer kodx wrote it, or it was edited by hand) reads as
/// [`EndReason::Other`] instead of failing the row.
///
/// Derefs to its stored word, so `run.stop_reason.as_deref() == Some("end_turn")` works.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndReason {
    /// The agent loop stopped (SPEC §7): `end_turn`, `cost_limit_exceeded`,
    /// `max_iterations`, `timeout`, `tool_error`, `setup_failed`, `cancelled`, `error`.
    Agent(StopReason),
    /// `not_permitted`: the author may not run the command on this repository.
    NotPermitted,
    /// `refused`: the command was found but cannot run (empty, too long).
    Refused,
    /// `help`: the help answer was posted.
    Help,
    /// `cancel`: a `/kodx cancel` command was carried out (the run it stopped ends
    /// `cancelled`, the agent's word).
    Cancel,
    /// `internal_error`: kodx failed (a bug, a dead process, an unreachable service).
    InternalError,
    /// `invalid_config`: the repository's `.github/kodx.yml` cannot be used.
    InvalidConfig,
    /// `budget_exceeded`: the installation's monthly budget is spent.
    BudgetExceeded,
    /// `dismissed`: an event that was kodx's to look at turned out to need nothing (a label
    /// that is not the trigger, a CI failure that is not kodx's to repair); nothing posted.
    Dismissed,
    /// `go`: a `/kodx go` command was carried out (or answered: nothing waited).
    Go,
    /// `update`: a `/kodx update` command was carried out (or answered).
    Update,
    /// `unconfirmed`: the run waited for `/kodx go` and nobody gave it in time.
    Unconfirmed,
    /// `steer`: a `/kodx steer` command was carried out (or answered: nothing ran).
    Steer,
    /// Any other stored word, kept as it was.
    Other(String),
}

/// Every [`StopReason`], in the order of [`agent_reason_index`].
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

/// Where `reason` is in [`AGENT_REASONS`]. Exhaustive on purpose: a new [`StopReason`]
/// does not compile until it is listed, so it can never decode as [`EndReason::Other`].
#[cfg_attr(not(test), allow(dead_code))]
const fn agent_reason_index(reason: StopReason) -> usize {
    match reason {
        StopReason::EndTurn => 0,
        StopReason::CostLimitExceeded => 1,
        StopReason::MaxIterations => 2,
        StopReason::Timeout => 3,
        StopReason::ToolError => 4,
        StopReason::SetupFailed => 5,
        StopReason::Cancelled => 6,
        StopReason::Error => 7,
    }
}

impl EndReason {
    /// The reasons kodx itself gives (not the agent's, not [`EndReason::Other`]).
    pub const KODX: [EndReason; 12] = [
        EndReason::NotPermitted,
        EndReason::Refused,
        EndReason::Help,
        EndReason::Cancel,
        EndReason::InternalError,
        EndReason::InvalidConfig,
        EndReason::BudgetExceeded,
        EndReason::Dismissed,
        EndReason::Go,
        EndReason::Update,
        EndReason::Unconfirmed,
        EndReason::Steer,
    ];

    /// The stored word.
    pub fn as_str(&self) -> &str {
        match self {
            EndReason::Agent(reason) => reason.as_str(),
            EndReason::NotPermitted => "not_permitted",
            EndReason::Refused => "refused",
            EndReason::Help => "help",
            EndReason::Cancel => "cancel",
            EndReason::InternalError => "internal_error",
            EndReason::InvalidConfig => "invalid_config",
            EndReason::BudgetExceeded => "budget_exceeded",
            EndReason::Dismissed => "dismissed",
            EndReason::Go => "go",
            EndReason::Update => "update",
            EndReason::Unconfirmed => "unconfirmed",
            EndReason::Steer => "steer",
            EndReason::Other(word) => word,
        }
    }

    /// Reads a stored word; never fails (unknown words are [`EndReason::Other`]).
    pub fn parse(word: &str) -> EndReason {
        if let Some(reason) = AGENT_REASONS.into_iter().find(|r| r.as_str() == word) {
            return EndReason::Agent(reason);
        }
        EndReason::KODX
            .into_iter()
            .find(|r| r.as_str() == word)
            .unwrap_or_else(|| EndReason::Other(word.to_owned()))
    }
}

impl fmt::Display for EndReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::ops::Deref for EndReason {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl From<StopReason> for EndReason {
    fn from(reason: StopReason) -> EndReason {
        EndReason::Agent(reason)
    }
}

impl From<&str> for EndReason {
    fn from(word: &str) -> EndReason {
        EndReason::parse(word)
    }
}

impl From<String> for EndReason {
    fn from(word: String) -> EndReason {
        EndReason::parse(&word)
    }
}

impl PartialEq<str> for EndReason {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for EndReason {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl Serialize for EndReason {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

// Stored as its word on either backend.
impl<DB: sqlx::Database> sqlx::Type<DB> for EndReason
where
    str: sqlx::Type<DB>,
{
    fn type_info() -> DB::TypeInfo {
        <str as sqlx::Type<DB>>::type_info()
    }

    fn compatible(ty: &DB::TypeInfo) -> bool {
        <str as sqlx::Type<DB>>::compatible(ty)
    }
}

impl<'q, DB: sqlx::Database> sqlx::Encode<'q, DB> for EndReason
where
    String: sqlx::Encode<'q, DB>,
{
    fn encode_by_ref(
        &self,
        buf: &mut <DB as sqlx::Database>::ArgumentBuffer<'q>,
    ) -> Result<IsNull, BoxDynError> {
        <String as sqlx::Encode<'q, DB>>::encode(self.as_str().to_owned(), buf)
    }
}

impl<'r, DB: sqlx::Database> sqlx::Decode<'r, DB> for EndReason
where
    &'r str: sqlx::Decode<'r, DB>,
{
    fn decode(value: <DB as sqlx::Database>::ValueRef<'r>) -> Result<Self, BoxDynError> {
        <&str as sqlx::Decode<'r, DB>>::decode(value).map(EndReason::parse)
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
pub use crate::job::RunRequest as NewRun;

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
    /// Why it ended; `None` until it has.
    pub stop_reason: Option<EndReason>,
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
    /// Waiting for a writer's `/kodx go` until then (unix milliseconds): a queued run no
    /// worker claims, ended by whichever process sees the time pass.
    pub held_until: Option<i64>,
    /// Who started it with `/kodx go`.
    pub confirmed_by: Option<String>,
    /// The lower cap `/kodx go $N` asked for, in USD.
    pub confirmed_cap_usd: Option<f64>,
    /// The status comment's estimate line, as the acknowledgement made it.
    pub estimate: Option<String>,
    /// GitHub's `mergeable_state` of the pull request when a merge run or `/kodx update`
    /// decided on it.
    pub mergeable_state: Option<String>,
    /// What kodx's egress proxy refused for the run (a JSON list of
    /// [`crate::egress::Blocked`]); `None`: the run did not go through the proxy.
    pub egress_blocked: Option<String>,
}

impl Run {
    /// Waiting for `/kodx go`.
    pub fn is_held(&self) -> bool {
        self.held_until.is_some() && self.status == RunStatus::Queued
    }

    /// How long before `now_ms` (unix milliseconds) the run was acknowledged: from its
    /// stored `created_at` (written when the webhook that asked for it was taken in), so a
    /// run taken over after a restart still counts from then.
    pub fn since_acknowledged(&self, now_ms: i64) -> std::time::Duration {
        std::time::Duration::from_millis((now_ms - self.created_at).max(0) as u64)
    }

    /// True for `ask` and `code` runs, which do agent work.
    pub fn is_work(&self) -> bool {
        self.request.job.is_work()
    }

    /// What kind of job the run is (`ask`, `code`, `help` …).
    pub fn kind(&self) -> crate::job::JobKind {
        self.request.job.kind()
    }

    /// The claim this row shows running the run (`None` unless it is running).
    pub fn lease(&self) -> Option<Lease> {
        match (&self.status, &self.worker) {
            (RunStatus::Running, Some(worker)) => Some(Lease {
                worker: worker.clone(),
                epoch: self.attempts,
            }),
            _ => None,
        }
    }
}

/// One claim of a run: the worker that claimed it and the claim's number (its attempt,
/// counted up by every claim), the fencing token of everything done for the run. A write
/// that carries it ([`Db::finish`], [`Db::set_phase`], [`Db::append_transcript`] …) changes
/// the run only while the run is still running under that very claim: a process paused past
/// its lease, whose run another process took over (or that claimed the run again since),
/// changes nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub worker: String,
    pub epoch: i64,
}

/// Who ends a run ([`Db::finish`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// The claim running it: it ends the run only while the run is still that claim's.
    Lease(Lease),
    /// A process ending a run it has not claimed (refusing it while it waits): only while
    /// the run is still queued, or running under a claim of this same worker.
    Waiting(String),
}

impl Holder {
    /// The holder of `run` as `worker` sees it: its claim when the row shows `worker`
    /// running it, else a waiting run's.
    pub fn of(run: &Run, worker: &str) -> Holder {
        match run.lease() {
            Some(lease) if lease.worker == worker => Holder::Lease(lease),
            _ => Holder::Waiting(worker.to_string()),
        }
    }
}

/// How a run ended, for [`Db::finish`].
#[derive(Debug, Clone, PartialEq)]
pub struct Finish {
    /// `Succeeded`, `Failed` or `Cancelled`.
    pub status: RunStatus,
    /// Why it ended; read back as [`Run::stop_reason`].
    pub stop_reason: EndReason,
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
        stop_reason: impl Into<EndReason>,
        result: &super::result::RunResult,
    ) -> Finish {
        Finish {
            status,
            stop_reason: stop_reason.into(),
            cost_usd: 0.0,
            input_tokens: 0,
            output_tokens: 0,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
            api_calls: 0,
            result: result.to_text(),
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
         context, status, phase, attempts, worker, (recovered <> 0) AS recovered, \
         status_comment_id, stop_reason, \
         cost_usd, input_tokens, output_tokens, cache_read_tokens, cache_write_tokens, \
         api_calls, result, pr_url, cancelled_by, created_at, started_at, finished_at, \
         held_until, confirmed_by, confirmed_cap_usd, estimate, mergeable_state, \
         egress_blocked"
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What each stop reason has been stored as since version 1.
    const STORED: [&str; 15] = [
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
        "internal_error",
        "invalid_config",
        "budget_exceeded",
    ];

    #[test]
    fn end_reasons_keep_the_words_stored_today() {
        for word in STORED {
            let reason = EndReason::parse(word);
            assert!(!matches!(reason, EndReason::Other(_)), "{word} is known");
            assert_eq!(reason.as_str(), word);
            assert_eq!(&*reason, word);
            assert_eq!(reason.to_string(), word);
            assert_eq!(EndReason::from(word.to_owned()), reason);
            assert_eq!(serde_json::to_value(&reason).unwrap(), word);
        }
        for (i, a) in STORED.iter().enumerate() {
            for b in &STORED[i + 1..] {
                assert_ne!(EndReason::parse(a), EndReason::parse(b));
            }
        }
        // The agent's reasons are the agent's words, and every one is listed.
        for (i, reason) in AGENT_REASONS.into_iter().enumerate() {
            assert_eq!(agent_reason_index(reason), i);
            assert_eq!(EndReason::from(reason).as_str(), reason.as_str());
            assert_eq!(EndReason::parse(reason.as_str()), EndReason::Agent(reason));
        }
        for reason in EndReason::KODX {
            assert_eq!(EndReason::parse(reason.as_str()), reason);
        }
    }

    #[test]
    fn unknown_end_reasons_are_kept_as_they_are() {
        for word in ["quota_gone", "", "End_Turn", " end_turn"] {
            let reason = EndReason::parse(word);
            assert_eq!(reason, EndReason::Other(word.to_owned()));
            assert_eq!(reason.as_str(), word);
        }
        assert_eq!(EndReason::from("help"), EndReason::Help);
        assert!(EndReason::Help == "help");
    }

    #[test]
    fn finish_takes_words_or_types() {
        let json = crate::db::RunResult::default();
        let by_word = Finish::without_calls(RunStatus::Failed, "budget_exceeded", &json);
        let typed = Finish::without_calls(RunStatus::Failed, EndReason::BudgetExceeded, &json);
        assert_eq!(by_word, typed);
        assert_eq!(by_word.stop_reason, "budget_exceeded");
        assert_eq!(by_word.stop_reason, EndReason::BudgetExceeded);
        let agent = Finish::without_calls(RunStatus::Failed, StopReason::SetupFailed, &json);
        assert_eq!(agent.result, "{}");
        assert_eq!(agent.stop_reason, "setup_failed");
    }

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
