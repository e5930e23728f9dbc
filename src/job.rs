//! The request a `/kodx` command makes, typed once where the webhook is read and carried
//! unchanged through the queue to the worker that answers it.
//!
//! [`RunRequest`] is what [`crate::serve::intake::event::triage`] builds from a delivery, what
//! [`crate::db::Db::accept`] stores and what every stored [`crate::db::Run`] holds. Its
//! [`Job`] and [`Trigger`] are stored in the columns the schema has had since version 1
//! (`kind` + `argument`, `trigger_kind` + `trigger_id` + `context`), decoded by sqlx into
//! [`JobKind`] and [`TriggerKind`], so rows written by earlier versions read the same.

use serde::{Deserialize, Serialize};
use sqlx::{FromRow, Row};

use crate::command::{Command, More, ParseError};
use crate::github::ReactionTarget;

/// What was asked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Job {
    /// `/kodx ask <question>`: read-only agent work.
    Ask { question: String },
    /// `/kodx code <request>`: agent work that ends in a pull request.
    Code { request: String },
    /// `/kodx continue [$N | N steps]`: resume the code run here that a limit stopped, with
    /// `more` budget or steps.
    Continue {
        #[serde(serialize_with = "more_argument")]
        more: More,
    },
    /// `/kodx cancel`: stop the runs on this issue.
    Cancel,
    /// `/kodx help`, or an unknown subcommand (named in the answer).
    Help { unknown: Option<String> },
    /// A command that was found but cannot run (empty or too long); the reason is the
    /// sentence the answer gives.
    Refuse { reason: String },
}

/// The stored tag of a [`Job`] (the `kind` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, sqlx::Type)]
#[sqlx(rename_all = "lowercase", type_name = "text")]
#[serde(rename_all = "lowercase")]
pub enum JobKind {
    Ask,
    Code,
    Continue,
    Cancel,
    Help,
    Refuse,
}

impl JobKind {
    /// The word stored, logged and used as the `kind` label of the metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            JobKind::Ask => "ask",
            JobKind::Code => "code",
            JobKind::Continue => "continue",
            JobKind::Cancel => "cancel",
            JobKind::Help => "help",
            JobKind::Refuse => "refuse",
        }
    }

    /// `ask`, `code` and `continue` do agent work (one at a time per issue, under
    /// `max_concurrent_runs`); the others are short control jobs.
    pub fn is_work(self) -> bool {
        matches!(self, JobKind::Ask | JobKind::Code | JobKind::Continue)
    }
}

/// The two kinds of agent work: what limits, programs and the status comment tell apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RunKind {
    /// `/kodx code`: changes, a pull request or a pushed commit.
    Code,
    /// `/kodx ask`: an answer only.
    Ask,
}

impl RunKind {
    /// The name of the built-in program that does it.
    pub fn program(self) -> &'static str {
        match self {
            RunKind::Code => "code",
            RunKind::Ask => "ask",
        }
    }
}

impl JobKind {
    /// The agent work this job does, if it does any.
    pub fn run_kind(self) -> Option<RunKind> {
        match self {
            JobKind::Ask => Some(RunKind::Ask),
            // Only code runs are continued (an answer is asked for again).
            JobKind::Code | JobKind::Continue => Some(RunKind::Code),
            JobKind::Cancel | JobKind::Help | JobKind::Refuse => None,
        }
    }
}

impl std::fmt::Display for JobKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Job {
    /// The job a parsed command asks for.
    pub fn from_command(command: Result<Command, ParseError>) -> Job {
        match command {
            Ok(Command::Code { request }) => Job::Code { request },
            Ok(Command::Ask { question }) => Job::Ask { question },
            Ok(Command::Cancel) => Job::Cancel,
            Ok(Command::Help { unknown }) => Job::Help { unknown },
            Ok(Command::Continue { more }) => Job::Continue { more },
            Err(e) => Job::Refuse {
                reason: e.to_string(),
            },
        }
    }

    /// The job stored as `kind` and `argument`.
    pub fn from_stored(kind: JobKind, argument: String) -> Job {
        match kind {
            JobKind::Ask => Job::Ask { question: argument },
            JobKind::Code => Job::Code { request: argument },
            // Stored as the command wrote it; a row no version could write reads as the
            // default rather than failing the whole row.
            JobKind::Continue => Job::Continue {
                more: More::parse(&argument).unwrap_or(More::Default),
            },
            JobKind::Cancel => Job::Cancel,
            JobKind::Help => Job::Help {
                unknown: (!argument.is_empty()).then_some(argument),
            },
            JobKind::Refuse => Job::Refuse { reason: argument },
        }
    }

    pub fn kind(&self) -> JobKind {
        match self {
            Job::Ask { .. } => JobKind::Ask,
            Job::Code { .. } => JobKind::Code,
            Job::Continue { .. } => JobKind::Continue,
            Job::Cancel => JobKind::Cancel,
            Job::Help { .. } => JobKind::Help,
            Job::Refuse { .. } => JobKind::Refuse,
        }
    }

    /// The text stored in the `argument` column: the question, the request, what
    /// `continue` adds (`$2`, `20 steps`), the unknown subcommand or the refusal's reason
    /// (empty for `cancel`).
    pub fn argument(&self) -> std::borrow::Cow<'_, str> {
        match self {
            Job::Ask { question } => question.into(),
            Job::Code { request } => request.into(),
            Job::Continue { more } => more.as_argument().into(),
            Job::Cancel => "".into(),
            Job::Help { unknown } => unknown.as_deref().unwrap_or("").into(),
            Job::Refuse { reason } => reason.into(),
        }
    }

    pub fn is_work(&self) -> bool {
        self.kind().is_work()
    }

    /// The command as the status comment quotes it.
    pub fn command_line(&self) -> String {
        format!("/kodx {} {}", self.kind(), self.argument())
    }
}

fn more_argument<S: serde::Serializer>(more: &More, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&more.as_argument())
}

/// Where a command was written (the `trigger_kind` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, sqlx::Type)]
#[sqlx(rename_all = "snake_case", type_name = "text")]
pub enum TriggerKind {
    IssueComment,
    Issue,
    ReviewComment,
}

impl TriggerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerKind::IssueComment => "issue_comment",
            TriggerKind::Issue => "issue",
            TriggerKind::ReviewComment => "review_comment",
        }
    }
}

/// Where a command was written, with what that place adds to the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// A comment in the conversation of an issue or pull request, by id.
    IssueComment(i64),
    /// The body of a newly opened issue (the issue's number).
    IssueBody(i64),
    /// A comment on a line of a pull request's diff, by id, with its file and hunk (absent
    /// when GitHub sent no file).
    ReviewComment {
        id: i64,
        review: Option<ReviewContext>,
    },
}

/// A review comment's file, line and diff hunk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReviewContext {
    pub path: String,
    pub line: Option<i64>,
    pub diff_hunk: String,
    /// The commit the comment was written on (stored; not used yet).
    pub commit_id: Option<String>,
}

/// The `context` column as earlier versions wrote it: `null`, or a review comment's
/// `{"path", "line", "commit_id", "diff_hunk"}` with any of them `null`.
#[derive(Debug, Default, Serialize, Deserialize)]
struct StoredContext {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    line: Option<i64>,
    #[serde(default)]
    commit_id: Option<String>,
    #[serde(default)]
    diff_hunk: Option<String>,
}

impl Trigger {
    pub fn kind(&self) -> TriggerKind {
        match self {
            Trigger::IssueComment(_) => TriggerKind::IssueComment,
            Trigger::IssueBody(_) => TriggerKind::Issue,
            Trigger::ReviewComment { .. } => TriggerKind::ReviewComment,
        }
    }

    /// The comment's id, or the issue's number for an issue body (the `trigger_id` column,
    /// part of the key that recognises a replayed delivery).
    pub fn id(&self) -> i64 {
        match self {
            Trigger::IssueComment(id) | Trigger::IssueBody(id) => *id,
            Trigger::ReviewComment { id, .. } => *id,
        }
    }

    pub fn review(&self) -> Option<&ReviewContext> {
        match self {
            Trigger::ReviewComment { review, .. } => review.as_ref(),
            _ => None,
        }
    }

    /// What kodx reacts on to say it saw the command.
    pub fn reaction_target(&self) -> ReactionTarget {
        match self {
            Trigger::IssueComment(id) => ReactionTarget::IssueComment(*id as u64),
            Trigger::ReviewComment { id, .. } => ReactionTarget::ReviewComment(*id as u64),
            Trigger::IssueBody(number) => ReactionTarget::Issue(*number as u64),
        }
    }

    fn from_stored(kind: TriggerKind, id: i64, context: Option<StoredContext>) -> Trigger {
        match kind {
            TriggerKind::IssueComment => Trigger::IssueComment(id),
            TriggerKind::Issue => Trigger::IssueBody(id),
            TriggerKind::ReviewComment => Trigger::ReviewComment {
                id,
                review: context.and_then(|c| {
                    Some(ReviewContext {
                        path: c.path?,
                        line: c.line,
                        diff_hunk: c.diff_hunk.unwrap_or_default(),
                        commit_id: c.commit_id,
                    })
                }),
            },
        }
    }

    fn stored_context(&self) -> Option<StoredContext> {
        self.review().map(|r| StoredContext {
            path: Some(r.path.clone()),
            line: r.line,
            commit_id: r.commit_id.clone(),
            diff_hunk: Some(r.diff_hunk.clone()),
        })
    }
}

/// A `/kodx` command as kodx acts on it: who asked, where, and what.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunRequest {
    pub installation_id: i64,
    /// `owner/name`.
    pub repo: String,
    pub issue_number: i64,
    pub is_pull_request: bool,
    /// Login of who asked.
    pub author: String,
    pub author_id: i64,
    pub clone_url: String,
    pub default_branch: String,
    pub job: Job,
    pub trigger: Trigger,
}

impl RunRequest {
    /// The columns a request is stored in.
    pub const COLUMNS: &'static str = "kind, installation_id, repo, issue_number, \
        is_pull_request, argument, author, author_id, trigger_kind, trigger_id, clone_url, \
        default_branch, context";

    /// Binds this request's columns ([`RunRequest::COLUMNS`]) to `row`, on either backend.
    pub fn push_binds<'q, DB>(
        &'q self,
        row: &mut sqlx::query_builder::Separated<'_, 'q, DB, &'static str>,
    ) where
        DB: sqlx::Database,
        JobKind: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        TriggerKind: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        i64: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        &'q str: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
        String: sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    {
        // The review context as JSON text (a TEXT column on both backends).
        let context = serde_json::to_string(&self.trigger.stored_context())
            .expect("a review context always serializes");
        row.push_bind(self.job.kind())
            .push_bind(self.installation_id)
            .push_bind(self.repo.as_str())
            .push_bind(self.issue_number)
            .push_bind(i64::from(self.is_pull_request))
            .push_bind(self.job.argument().into_owned())
            .push_bind(self.author.as_str())
            .push_bind(self.author_id)
            .push_bind(self.trigger.kind())
            .push_bind(self.trigger.id())
            .push_bind(self.clone_url.as_str())
            .push_bind(self.default_branch.as_str())
            .push_bind(context);
    }
}

impl<'r, R> FromRow<'r, R> for RunRequest
where
    R: Row,
    &'r str: sqlx::ColumnIndex<R>,
    i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    JobKind: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    TriggerKind: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    fn from_row(row: &'r R) -> Result<Self, sqlx::Error> {
        let context: String = row.try_get("context")?;
        let context: Option<StoredContext> =
            serde_json::from_str(&context).map_err(|e| sqlx::Error::ColumnDecode {
                index: "context".into(),
                source: Box::new(e),
            })?;
        Ok(RunRequest {
            installation_id: row.try_get("installation_id")?,
            repo: row.try_get("repo")?,
            issue_number: row.try_get("issue_number")?,
            is_pull_request: row.try_get::<i64, _>("is_pull_request")? != 0,
            author: row.try_get("author")?,
            author_id: row.try_get("author_id")?,
            clone_url: row.try_get("clone_url")?,
            default_branch: row.try_get("default_branch")?,
            job: Job::from_stored(row.try_get("kind")?, row.try_get("argument")?),
            trigger: Trigger::from_stored(
                row.try_get("trigger_kind")?,
                row.try_get("trigger_id")?,
                context,
            ),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_job_survives_its_columns() {
        for job in [
            Job::Ask {
                question: "why?".into(),
            },
            Job::Code {
                request: "add a flag".into(),
            },
            Job::Cancel,
            Job::Continue {
                more: More::Default,
            },
            Job::Continue {
                more: More::Usd(2.5),
            },
            Job::Continue {
                more: More::Steps(1),
            },
            Job::Continue {
                more: More::Steps(20),
            },
            Job::Help { unknown: None },
            Job::Help {
                unknown: Some("frobnicate".into()),
            },
            Job::Refuse {
                reason: "`/kodx code` needs a request".into(),
            },
        ] {
            let back = Job::from_stored(job.kind(), job.argument().to_string());
            assert_eq!(back, job);
        }
    }

    #[test]
    fn commands_become_jobs() {
        assert_eq!(
            Job::from_command(Err(ParseError::EmptyRequest { command: "code" })),
            Job::Refuse {
                reason: "`/kodx code` needs a request".into()
            }
        );
        assert_eq!(
            Job::from_command(Ok(Command::Continue {
                more: More::Steps(5)
            }))
            .command_line(),
            "/kodx continue 5 steps"
        );
        assert_eq!(
            Job::from_command(Ok(Command::Cancel)).command_line(),
            "/kodx cancel "
        );
        assert_eq!(
            Job::from_command(Ok(Command::Ask {
                question: "why?".into()
            }))
            .command_line(),
            "/kodx ask why?"
        );
    }

    #[test]
    fn a_review_comment_without_a_file_has_no_review_context() {
        let t = Trigger::from_stored(
            TriggerKind::ReviewComment,
            5,
            Some(StoredContext {
                path: None,
                line: Some(3),
                ..Default::default()
            }),
        );
        assert_eq!(
            t,
            Trigger::ReviewComment {
                id: 5,
                review: None
            }
        );
        assert_eq!(t.reaction_target(), ReactionTarget::ReviewComment(5));
        assert_eq!(
            Trigger::IssueBody(4).reaction_target(),
            ReactionTarget::Issue(4)
        );
    }
}
