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

pub use crate::command::{Job, JobKind, RunKind};
use crate::github::ReactionTarget;

/// Where a command was written (the `trigger_kind` column).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, sqlx::Type)]
#[sqlx(rename_all = "snake_case", type_name = "text")]
pub enum TriggerKind {
    IssueComment,
    Issue,
    ReviewComment,
    Review,
    Label,
    CheckSuite,
    WorkflowRun,
    Merge,
}

impl TriggerKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TriggerKind::IssueComment => "issue_comment",
            TriggerKind::Issue => "issue",
            TriggerKind::ReviewComment => "review_comment",
            TriggerKind::Review => "review",
            TriggerKind::Label => "label",
            TriggerKind::CheckSuite => "check_suite",
            TriggerKind::WorkflowRun => "workflow_run",
            TriggerKind::Merge => "merge",
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
    /// The body of a submitted pull request review, by the review's id.
    Review(i64),
    /// A label added to an issue (`triggers.label`, SPEC §11): the issue, the label's name,
    /// and `key`, which tells this labelling from a later one of the same issue (a
    /// redelivery has the same key; taking the label off and on again makes a new one).
    Label { issue: i64, label: String, key: i64 },
    /// A completed check suite on a pull request kodx opened (CI repair), by its id.
    CheckSuite(i64),
    /// A completed GitHub Actions workflow run on a pull request kodx opened, by its id.
    WorkflowRun(i64),
    /// A merge run kodx starts on a pull request it opened (a push to its base, or
    /// `/kodx update` finding conflicts), by a key of the pull request and the two tips:
    /// the same merge asked twice is one run.
    Merge(i64),
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
    /// The label of a [`Trigger::Label`] (and its issue).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    label: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    labelled_issue: Option<i64>,
}

impl Trigger {
    pub fn kind(&self) -> TriggerKind {
        match self {
            Trigger::IssueComment(_) => TriggerKind::IssueComment,
            Trigger::IssueBody(_) => TriggerKind::Issue,
            Trigger::ReviewComment { .. } => TriggerKind::ReviewComment,
            Trigger::Review(_) => TriggerKind::Review,
            Trigger::Label { .. } => TriggerKind::Label,
            Trigger::CheckSuite(_) => TriggerKind::CheckSuite,
            Trigger::WorkflowRun(_) => TriggerKind::WorkflowRun,
            Trigger::Merge(_) => TriggerKind::Merge,
        }
    }

    /// The comment's id, or the issue's number for an issue body (the `trigger_id` column,
    /// part of the key that recognises a replayed delivery).
    pub fn id(&self) -> i64 {
        match self {
            Trigger::IssueComment(id)
            | Trigger::IssueBody(id)
            | Trigger::Review(id)
            | Trigger::CheckSuite(id)
            | Trigger::WorkflowRun(id)
            | Trigger::Merge(id) => *id,
            Trigger::ReviewComment { id, .. } => *id,
            Trigger::Label { key, .. } => *key,
        }
    }

    pub fn review(&self) -> Option<&ReviewContext> {
        match self {
            Trigger::ReviewComment { review, .. } => review.as_ref(),
            _ => None,
        }
    }

    /// The label a [`Trigger::Label`] names.
    pub fn label(&self) -> Option<&str> {
        match self {
            Trigger::Label { label, .. } => Some(label),
            _ => None,
        }
    }

    /// What kodx reacts on to say it saw the command: `None` where GitHub has no
    /// reactions (a review's body) or nobody wrote anything (CI).
    pub fn reaction_target(&self) -> Option<ReactionTarget> {
        match self {
            Trigger::IssueComment(id) => Some(ReactionTarget::IssueComment(*id as u64)),
            Trigger::ReviewComment { id, .. } => Some(ReactionTarget::ReviewComment(*id as u64)),
            Trigger::IssueBody(number) | Trigger::Label { issue: number, .. } => {
                Some(ReactionTarget::Issue(*number as u64))
            }
            Trigger::Review(_)
            | Trigger::CheckSuite(_)
            | Trigger::WorkflowRun(_)
            | Trigger::Merge(_) => None,
        }
    }

    fn from_stored(kind: TriggerKind, id: i64, context: Option<StoredContext>) -> Trigger {
        match kind {
            TriggerKind::IssueComment => Trigger::IssueComment(id),
            TriggerKind::Issue => Trigger::IssueBody(id),
            TriggerKind::Review => Trigger::Review(id),
            TriggerKind::CheckSuite => Trigger::CheckSuite(id),
            TriggerKind::WorkflowRun => Trigger::WorkflowRun(id),
            TriggerKind::Merge => Trigger::Merge(id),
            TriggerKind::Label => {
                let c = context.unwrap_or_default();
                Trigger::Label {
                    issue: c.labelled_issue.unwrap_or_default(),
                    label: c.label.unwrap_or_default(),
                    key: id,
                }
            }
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
        if let Trigger::Label { issue, label, .. } = self {
            return Some(StoredContext {
                label: Some(label.clone()),
                labelled_issue: Some(*issue),
                ..Default::default()
            });
        }
        self.review().map(|r| StoredContext {
            path: Some(r.path.clone()),
            line: r.line,
            commit_id: r.commit_id.clone(),
            diff_hunk: Some(r.diff_hunk.clone()),
            ..Default::default()
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
            .push_bind(self.job.stored_argument().into_owned())
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

impl Trigger {
    /// The trigger of a merge of base tip `base` into pull request `pull` at head `head`: a
    /// key of the three (the first 8 bytes of their SHA-256, positive), so the same merge
    /// asked twice (a redelivered push, a second `/kodx update`) is one run.
    pub fn merge(pull: i64, head: &str, base: &str) -> Trigger {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(format!("{pull}\n{head}\n{base}").as_bytes());
        let mut first = [0u8; 8];
        first.copy_from_slice(&digest[..8]);
        Trigger::Merge((u64::from_be_bytes(first) >> 1) as i64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{More, ParseError};

    #[test]
    fn every_job_survives_its_columns() {
        for job in [
            Job::Ask {
                question: "why?".into(),
            },
            Job::Code {
                request: "add a flag".into(),
                base: None,
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
            Job::AddressReviews {
                words: String::new(),
            },
            Job::AddressReviews {
                words: "keep the API".into(),
            },
            Job::Repair {
                commit: "0123456789abcdef0123456789abcdef01234567".into(),
            },
        ] {
            let back = Job::from_stored(job.kind(), job.stored_argument().to_string());
            assert_eq!(back, job);
        }
    }

    #[test]
    fn commands_become_jobs() {
        assert_eq!(
            Job::from_parsed(Err(ParseError::EmptyRequest { command: "code" })),
            Job::Refuse {
                reason: "`/kodx code` needs a request".into()
            }
        );
        assert_eq!(
            Job::from_parsed(Ok(Job::Continue {
                more: More::Steps(5)
            }))
            .command_line(),
            "/kodx continue 5 steps"
        );
        assert_eq!(
            Job::from_parsed(Ok(Job::Cancel)).command_line(),
            "/kodx cancel "
        );
        assert_eq!(
            Job::from_parsed(Ok(Job::Ask {
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
        assert_eq!(t.reaction_target(), Some(ReactionTarget::ReviewComment(5)));
        assert_eq!(
            Trigger::IssueBody(4).reaction_target(),
            Some(ReactionTarget::Issue(4))
        );
        assert_eq!(Trigger::CheckSuite(4).reaction_target(), None);
    }

    #[test]
    fn a_label_trigger_survives_its_columns() {
        let t = Trigger::Label {
            issue: 12,
            label: "kodx".into(),
            key: 987,
        };
        let back = Trigger::from_stored(t.kind(), t.id(), t.stored_context());
        assert_eq!(back, t);
        assert_eq!(t.reaction_target(), Some(ReactionTarget::Issue(12)));
    }
}
