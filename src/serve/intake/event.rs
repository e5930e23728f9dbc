//! Webhook payloads into kodx's own event type (SPEC §3, §4).
//!
//! Pure: the raw body in, a [`Triage`] out. Only the fields kodx needs are read, into
//! borrowed structs, so the common case (a comment without a command) costs one pass of
//! the JSON parser and one of the command parser. The payload is untrusted: a missing
//! field is a one-line reason, never a panic.

use std::borrow::Cow;

use serde::Deserialize;

use crate::command;
use crate::job::{Job, ReviewContext, RunRequest, Trigger};

/// What a delivery means to kodx.
#[derive(Debug, Clone, PartialEq)]
pub enum Triage {
    /// Nothing to do; the reason is answered in `{"ignored": …}`.
    Ignore(Cow<'static, str>),
    /// An `installation*` event, recorded.
    Installation {
        id: i64,
        account: String,
        action: String,
    },
    /// A `/kodx` command to act on.
    Command(Box<RunRequest>),
    /// A completed check suite or workflow run on one of `pulls` (CI repair, SPEC §11): a
    /// repair request once the store knows which of them kodx opened, and who asked for it
    /// ([`RunRequest::issue_number`] and the author are filled in then).
    /// A push to a branch of a repository (SPEC §12, "Mergeable pull requests"): a merge
    /// request for each open pull request kodx opened into `branch`, once the store says
    /// which they are ([`RunRequest::issue_number`], the author and the trigger are filled
    /// in then).
    Push {
        request: Box<RunRequest>,
        branch: String,
        /// The branch's new tip.
        after: String,
    },
    Ci {
        request: Box<RunRequest>,
        pulls: Vec<i64>,
        /// The App whose check suite completed (`check_suite.app.id`; none for a
        /// workflow run): kodx's own suite is dropped at the door.
        app_id: Option<u64>,
    },
}

/// A signed delivery kodx cannot read; the text is answered with `400`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadRequest(pub String);

#[derive(Deserialize)]
struct User<'a> {
    #[serde(borrow)]
    login: Cow<'a, str>,
    id: i64,
    #[serde(rename = "type", borrow, default)]
    kind: Option<Cow<'a, str>>,
}

impl User<'_> {
    fn is_bot(&self) -> bool {
        self.kind.as_deref() == Some("Bot") || self.login.ends_with("[bot]")
    }
}

#[derive(Deserialize)]
struct Repository<'a> {
    #[serde(borrow)]
    full_name: Cow<'a, str>,
    #[serde(borrow)]
    clone_url: Cow<'a, str>,
    #[serde(borrow)]
    default_branch: Cow<'a, str>,
}

#[derive(Deserialize)]
struct InstallationRef {
    id: i64,
}

#[derive(Deserialize)]
struct Issue<'a> {
    number: i64,
    #[serde(borrow, default)]
    body: Option<Cow<'a, str>>,
    #[serde(borrow)]
    user: User<'a>,
    #[serde(default)]
    pull_request: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct Comment<'a> {
    id: i64,
    #[serde(borrow, default)]
    body: Option<Cow<'a, str>>,
    #[serde(borrow)]
    user: User<'a>,
}

#[derive(Deserialize)]
struct IssueCommentEvent<'a> {
    #[serde(borrow)]
    action: Cow<'a, str>,
    #[serde(borrow)]
    issue: Issue<'a>,
    #[serde(borrow)]
    comment: Comment<'a>,
    #[serde(borrow)]
    repository: Repository<'a>,
    installation: Option<InstallationRef>,
}

#[derive(Deserialize)]
struct IssuesEvent<'a> {
    #[serde(borrow)]
    action: Cow<'a, str>,
    #[serde(borrow)]
    issue: Issue<'a>,
    #[serde(borrow)]
    repository: Repository<'a>,
    installation: Option<InstallationRef>,
}

#[derive(Deserialize)]
struct ReviewComment<'a> {
    id: i64,
    #[serde(borrow, default)]
    body: Option<Cow<'a, str>>,
    #[serde(borrow)]
    user: User<'a>,
    #[serde(borrow, default)]
    path: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    diff_hunk: Option<Cow<'a, str>>,
    #[serde(default)]
    line: Option<i64>,
    #[serde(borrow, default)]
    commit_id: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct PullRef {
    number: i64,
}

#[derive(Deserialize)]
struct ReviewCommentEvent<'a> {
    #[serde(borrow)]
    action: Cow<'a, str>,
    #[serde(borrow)]
    comment: ReviewComment<'a>,
    pull_request: PullRef,
    #[serde(borrow)]
    repository: Repository<'a>,
    installation: Option<InstallationRef>,
}

#[derive(Deserialize)]
struct Review<'a> {
    id: i64,
    #[serde(borrow, default)]
    body: Option<Cow<'a, str>>,
    #[serde(borrow)]
    user: User<'a>,
}

#[derive(Deserialize)]
struct ReviewEvent<'a> {
    #[serde(borrow)]
    action: Cow<'a, str>,
    #[serde(borrow)]
    review: Review<'a>,
    pull_request: PullRef,
    #[serde(borrow)]
    repository: Repository<'a>,
    installation: Option<InstallationRef>,
}

#[derive(Deserialize)]
struct Label<'a> {
    #[serde(borrow)]
    name: Cow<'a, str>,
}

#[derive(Deserialize)]
struct LabeledIssue<'a> {
    number: i64,
    #[serde(borrow, default)]
    title: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    body: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    updated_at: Option<Cow<'a, str>>,
    #[serde(default)]
    pull_request: Option<serde::de::IgnoredAny>,
}

#[derive(Deserialize)]
struct LabeledEvent<'a> {
    #[serde(borrow)]
    action: Cow<'a, str>,
    #[serde(borrow)]
    issue: LabeledIssue<'a>,
    #[serde(borrow, default)]
    label: Option<Label<'a>>,
    #[serde(borrow)]
    sender: User<'a>,
    #[serde(borrow)]
    repository: Repository<'a>,
    installation: Option<InstallationRef>,
}

/// What a `check_suite` and a `workflow_run` payload share for CI repair.
#[derive(Deserialize)]
struct CiRun<'a> {
    id: i64,
    #[serde(borrow)]
    head_sha: Cow<'a, str>,
    #[serde(default)]
    pull_requests: Vec<PullRef>,
    /// The App a check suite belongs to.
    #[serde(default)]
    app: Option<AppRef>,
    /// When the check suite last changed: each completion of a suite whose jobs were
    /// re-run has its own.
    #[serde(borrow, default)]
    updated_at: Option<Cow<'a, str>>,
    /// Which attempt of a workflow run completed (re-runs count up).
    #[serde(default)]
    run_attempt: Option<i64>,
}

impl CiRun<'_> {
    /// The trigger id of this completion. A suite or workflow run completes again after
    /// its failed jobs are re-run (the same id), and that completion must be read; a body
    /// replayed under a new delivery id must not be. So a completion is its id with its
    /// attempt (`workflow_run`) or its last change (`check_suite`): a positive number
    /// drawn from the three, the same for the same completion.
    fn completion_id(&self) -> i64 {
        if self.updated_at.is_none() && self.run_attempt.is_none() {
            return self.id;
        }
        use sha2::Digest;
        let key = format!(
            "{}:{}:{}",
            self.id,
            self.run_attempt.unwrap_or(0),
            self.updated_at.as_deref().unwrap_or("")
        );
        let digest = sha2::Sha256::digest(key.as_bytes());
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(&digest[..8]);
        (u64::from_be_bytes(bytes) >> 1) as i64
    }
}

#[derive(Deserialize)]
struct AppRef {
    id: u64,
}

#[derive(Deserialize)]
struct CiEvent<'a> {
    #[serde(borrow)]
    action: Cow<'a, str>,
    #[serde(borrow, alias = "workflow_run")]
    check_suite: CiRun<'a>,
    #[serde(borrow)]
    repository: Repository<'a>,
    installation: Option<InstallationRef>,
}

/// Tells one labelling of an issue from another: the issue, the label and the time GitHub
/// gives the change (a redelivery carries the same; taking the label off and on again, a
/// new one), as a positive 63-bit FNV-1a hash.
fn label_key(issue: i64, label: &str, updated_at: &str) -> i64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in issue
        .to_le_bytes()
        .iter()
        .chain(label.as_bytes())
        .chain(b"\0")
        .chain(updated_at.as_bytes())
    {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h >> 1) as i64
}

/// The request a trigger label makes: the issue's title and description, cut to what a
/// command may ask (the description is in the run's context whole).
fn labelled_request(title: &str, body: &str) -> String {
    let mut request = format!("{}\n\n{}", title.trim(), body.trim());
    if request.len() > command::MAX_REQUEST_BYTES {
        let mut end = command::MAX_REQUEST_BYTES;
        while !request.is_char_boundary(end) {
            end -= 1;
        }
        request.truncate(end);
        request.push_str("\n[… the rest of the description is in the issue]");
    }
    request.trim().to_string()
}

#[derive(Deserialize)]
struct Account<'a> {
    #[serde(borrow)]
    login: Cow<'a, str>,
}

#[derive(Deserialize)]
struct InstallationFull<'a> {
    id: i64,
    #[serde(borrow)]
    account: Account<'a>,
}

#[derive(Deserialize)]
struct InstallationEvent<'a> {
    #[serde(borrow)]
    action: Cow<'a, str>,
    #[serde(borrow)]
    installation: InstallationFull<'a>,
}

fn decode<'a, T: Deserialize<'a>>(event: &str, body: &'a [u8]) -> Result<T, BadRequest> {
    serde_json::from_slice(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "the body is not valid JSON".to_string()
        } else {
            format!("not a `{event}` payload kodx can read: {e}")
        };
        BadRequest(what)
    })
}

fn installation_id(i: Option<InstallationRef>) -> Result<i64, BadRequest> {
    i.map(|i| i.id).ok_or_else(|| {
        BadRequest(
            "the payload has no `installation`: is this webhook sent by the GitHub App?".into(),
        )
    })
}

const fn ignore(reason: &'static str) -> Result<Triage, BadRequest> {
    Ok(Triage::Ignore(Cow::Borrowed(reason)))
}

/// Where a command was written: the issue or pull request, and the trigger.
struct Place {
    number: i64,
    is_pull_request: bool,
    trigger: Trigger,
}

/// The job of the command in `body`, written by `user` as a `what` (comment, issue,
/// review); `Err` with the reason to ignore it (a bot wrote it, or it holds no command).
fn found(user: &User, body: Option<&str>, what: &'static str) -> Result<Job, Triage> {
    if user.is_bot() {
        return Err(Triage::Ignore(Cow::Owned(format!(
            "the {what} was written by a bot"
        ))));
    }
    match command::parse(body.unwrap_or("")) {
        Some(parsed) => Ok(Job::from_parsed(parsed)),
        None => Err(Triage::Ignore(Cow::Borrowed("no /kodx command"))),
    }
}

/// The request of a command by `user` at `at` in `repository`.
fn command(
    installation: Option<InstallationRef>,
    repository: Repository<'_>,
    user: User<'_>,
    job: Job,
    at: Place,
) -> Result<Triage, BadRequest> {
    Ok(Triage::Command(Box::new(RunRequest {
        installation_id: installation_id(installation)?,
        repo: repository.full_name.into_owned(),
        issue_number: at.number,
        is_pull_request: at.is_pull_request,
        author: user.login.into_owned(),
        author_id: user.id,
        clone_url: repository.clone_url.into_owned(),
        default_branch: repository.default_branch.into_owned(),
        job,
        trigger: at.trigger,
    })))
}

/// Reads one delivery of `event` (the `X-GitHub-Event` header).
pub fn triage(event: &str, body: &[u8]) -> Result<Triage, BadRequest> {
    match event {
        "issues" if is_labeled(body) => labeled(event, body),
        "check_suite" | "workflow_run" => ci(event, body),
        "push" => push(event, body),
        "issue_comment" => {
            let p: IssueCommentEvent = decode(event, body)?;
            if p.action != "created" {
                return ignore("only new comments are read (edits and deletions are not)");
            }
            let job = match found(&p.comment.user, p.comment.body.as_deref(), "comment") {
                Ok(job) => job,
                Err(ignored) => return Ok(ignored),
            };
            let at = Place {
                number: p.issue.number,
                is_pull_request: p.issue.pull_request.is_some(),
                trigger: Trigger::IssueComment(p.comment.id),
            };
            command(p.installation, p.repository, p.comment.user, job, at)
        }
        "issues" => {
            let p: IssuesEvent = decode(event, body)?;
            if p.action != "opened" {
                return ignore("only newly opened issues are read");
            }
            let job = match found(&p.issue.user, p.issue.body.as_deref(), "issue") {
                Ok(job) => job,
                Err(ignored) => return Ok(ignored),
            };
            let at = Place {
                number: p.issue.number,
                is_pull_request: false,
                trigger: Trigger::IssueBody(p.issue.number),
            };
            command(p.installation, p.repository, p.issue.user, job, at)
        }
        "pull_request_review_comment" => {
            let p: ReviewCommentEvent = decode(event, body)?;
            if p.action != "created" {
                return ignore("only new review comments are read (edits and deletions are not)");
            }
            let job = match found(&p.comment.user, p.comment.body.as_deref(), "comment") {
                Ok(job) => job,
                Err(ignored) => return Ok(ignored),
            };
            let review = p.comment.path.map(|path| ReviewContext {
                path: path.into_owned(),
                line: p.comment.line,
                diff_hunk: p.comment.diff_hunk.map(Cow::into_owned).unwrap_or_default(),
                commit_id: p.comment.commit_id.map(Cow::into_owned),
            });
            let at = Place {
                number: p.pull_request.number,
                is_pull_request: true,
                trigger: Trigger::ReviewComment {
                    id: p.comment.id,
                    review,
                },
            };
            command(p.installation, p.repository, p.comment.user, job, at)
        }
        "pull_request_review" => {
            let p: ReviewEvent = decode(event, body)?;
            if p.action != "submitted" {
                return ignore("only submitted reviews are read (edits and dismissals are not)");
            }
            let job = match found(&p.review.user, p.review.body.as_deref(), "review") {
                Ok(job) => job,
                Err(ignored) => return Ok(ignored),
            };
            let at = Place {
                number: p.pull_request.number,
                is_pull_request: true,
                trigger: Trigger::Review(p.review.id),
            };
            command(p.installation, p.repository, p.review.user, job, at)
        }
        "installation" | "installation_repositories" => {
            let p: InstallationEvent = decode(event, body)?;
            Ok(Triage::Installation {
                id: p.installation.id,
                account: p.installation.account.login.into_owned(),
                action: format!("{event}.{}", p.action),
            })
        }
        "ping" => {
            // Still has to be JSON: a ping is how a maintainer checks the webhook works.
            let _: serde::de::IgnoredAny = decode(event, body)?;
            ignore("ping")
        }
        "" => Err(BadRequest("the X-GitHub-Event header is missing".into())),
        _ => {
            let _: serde::de::IgnoredAny = decode(event, body)?;
            Ok(Triage::Ignore(Cow::Owned(format!(
                "kodx does not act on `{}` events",
                event.chars().take(64).collect::<String>()
            ))))
        }
    }
}

/// Whether an `issues` delivery is a `labeled` one (read before the full decode: the other
/// actions are read as before).
fn is_labeled(body: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Action<'a> {
        #[serde(borrow)]
        action: Cow<'a, str>,
    }
    serde_json::from_slice::<Action>(body).is_ok_and(|a| a.action == "labeled")
}

/// `issues.labeled`: a request for `/kodx code` on the issue by whoever added the label, if
/// the repository's `triggers.label` names it (known only when its config is read).
fn labeled(event: &str, body: &[u8]) -> Result<Triage, BadRequest> {
    let p: LabeledEvent = decode(event, body)?;
    if p.action != "labeled" {
        return ignore("only added labels are read");
    }
    if p.issue.pull_request.is_some() {
        return ignore("labels on pull requests do not start work");
    }
    if p.sender.is_bot() {
        return ignore("the label was added by a bot");
    }
    let Some(label) = p.label else {
        return ignore("the delivery names no label");
    };
    let title = p.issue.title.as_deref().unwrap_or("");
    let request = labelled_request(title, p.issue.body.as_deref().unwrap_or(""));
    if request.is_empty() {
        return ignore("the issue has no title or description to work from");
    }
    let key = label_key(
        p.issue.number,
        &label.name,
        p.issue.updated_at.as_deref().unwrap_or(""),
    );
    let at = Place {
        number: p.issue.number,
        is_pull_request: false,
        trigger: Trigger::Label {
            issue: p.issue.number,
            label: label.name.chars().take(64).collect(),
            key,
        },
    };
    let job = Job::Code {
        request,
        base: None,
    };
    command(p.installation, p.repository, p.sender, job, at)
}

/// `check_suite.completed` and `workflow_run.completed` on a pull request: a possible CI
/// repair (whatever the conclusion: the last suite to finish may be a green one while an
/// earlier one failed; the worker decides once every check on the commit has finished).
fn ci(event: &str, body: &[u8]) -> Result<Triage, BadRequest> {
    let p: CiEvent = decode(event, body)?;
    if p.action != "completed" {
        return ignore("only completed check suites and workflow runs are read");
    }
    let pulls: Vec<i64> = p
        .check_suite
        .pull_requests
        .iter()
        .map(|pr| pr.number)
        .take(20)
        .collect();
    if pulls.is_empty() {
        return ignore("the commit is on no pull request of this repository");
    }
    let id = p.check_suite.completion_id();
    let sha = p.check_suite.head_sha;
    if sha.len() != 40 || !sha.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(BadRequest(format!("`{event}.head_sha` is not a commit id")));
    }
    let app_id = p.check_suite.app.as_ref().map(|a| a.id);
    Ok(Triage::Ci {
        app_id,
        request: Box::new(RunRequest {
            installation_id: installation_id(p.installation)?,
            repo: p.repository.full_name.into_owned(),
            issue_number: pulls[0],
            is_pull_request: true,
            author: String::new(),
            author_id: 0,
            clone_url: p.repository.clone_url.into_owned(),
            default_branch: p.repository.default_branch.into_owned(),
            job: Job::Repair {
                commit: sha.to_ascii_lowercase(),
            },
            trigger: match event {
                "check_suite" => Trigger::CheckSuite(id),
                _ => Trigger::WorkflowRun(id),
            },
        }),
        pulls,
    })
}

#[derive(Deserialize)]
struct PushEvent<'a> {
    #[serde(borrow, rename = "ref")]
    git_ref: Cow<'a, str>,
    #[serde(borrow)]
    after: Cow<'a, str>,
    #[serde(default)]
    deleted: bool,
    #[serde(borrow)]
    repository: Repository<'a>,
    installation: Option<InstallationRef>,
}

/// A push: the branch and its new tip, for the pull requests kodx opened into it.
fn push(event: &str, body: &[u8]) -> Result<Triage, BadRequest> {
    let p: PushEvent = decode(event, body)?;
    let Some(branch) = p.git_ref.strip_prefix("refs/heads/") else {
        return ignore("only pushes to branches are read (not tags)");
    };
    if p.deleted {
        return ignore("a deleted branch is no pull request's new base");
    }
    let after = p.after.to_ascii_lowercase();
    if after.len() != 40 || !after.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(BadRequest(format!("`{event}.after` is not a commit id")));
    }
    Ok(Triage::Push {
        branch: branch.to_string(),
        request: Box::new(RunRequest {
            installation_id: installation_id(p.installation)?,
            repo: p.repository.full_name.into_owned(),
            issue_number: 0,
            is_pull_request: true,
            author: String::new(),
            author_id: 0,
            clone_url: p.repository.clone_url.into_owned(),
            default_branch: p.repository.default_branch.into_owned(),
            job: Job::Merge {
                base: after.clone(),
                asked: false,
            },
            trigger: Trigger::Merge(0),
        }),
        after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    fn comment_payload(body: &str, user_type: &str, pr: bool) -> Vec<u8> {
        let mut issue = json!({
            "number": 7, "title": "T", "body": "issue body",
            "user": {"login": "alice", "id": 1, "type": "User"}
        });
        if pr {
            issue["pull_request"] = json!({"url": "https://api.github.com/repos/o/r/pulls/7"});
        }
        json!({
            "action": "created",
            "issue": issue,
            "comment": {"id": 99, "body": body, "user": {"login": "bob", "id": 2, "type": user_type}},
            "repository": {"full_name": "o/r", "clone_url": "https://github.com/o/r.git", "default_branch": "main"},
            "installation": {"id": 5},
            "sender": {"login": "bob", "id": 2, "type": user_type}
        })
        .to_string()
        .into_bytes()
    }

    fn command(t: Triage) -> RunRequest {
        match t {
            Triage::Command(c) => *c,
            other => panic!("expected a command, got {other:?}"),
        }
    }

    #[test]
    fn issue_comment_with_command() {
        let c = command(
            triage(
                "issue_comment",
                &comment_payload("/kodx ask why?", "User", false),
            )
            .unwrap(),
        );
        assert_eq!(c.repo, "o/r");
        assert_eq!(c.issue_number, 7);
        assert!(!c.is_pull_request);
        assert_eq!(c.author, "bob");
        assert_eq!(c.trigger, Trigger::IssueComment(99));
        assert_eq!(c.installation_id, 5);
        assert_eq!(
            c.job,
            Job::Ask {
                question: "why?".into()
            }
        );
        let c = command(
            triage(
                "issue_comment",
                &comment_payload("/kodx code x", "User", true),
            )
            .unwrap(),
        );
        assert!(c.is_pull_request);
    }

    #[test]
    fn ignored_cases() {
        let t = triage(
            "issue_comment",
            &comment_payload("just talk", "User", false),
        )
        .unwrap();
        assert_eq!(t, Triage::Ignore("no /kodx command".into()));
        let t = triage(
            "issue_comment",
            &comment_payload("/kodx ask x", "Bot", false),
        )
        .unwrap();
        assert!(matches!(t, Triage::Ignore(r) if r.contains("bot")));
        let mut edited: Value =
            serde_json::from_slice(&comment_payload("/kodx ask x", "User", false)).unwrap();
        edited["action"] = json!("edited");
        let t = triage("issue_comment", edited.to_string().as_bytes()).unwrap();
        assert!(matches!(t, Triage::Ignore(r) if r.contains("edits")));
        let t = triage("release", b"{}").unwrap();
        assert!(matches!(t, Triage::Ignore(r) if r.contains("release")));
        assert!(
            matches!(triage("ping", b"{\"zen\":\"x\"}").unwrap(), Triage::Ignore(r) if r == "ping")
        );
    }

    #[test]
    fn bad_requests() {
        let e = triage("issue_comment", b"{not json").unwrap_err();
        assert_eq!(e.0, "the body is not valid JSON");
        let e = triage("issue_comment", b"{\"action\":\"created\"}").unwrap_err();
        assert!(e.0.contains("missing field"), "{e}");
        assert!(!e.0.contains('\n'));
        let mut p: Value =
            serde_json::from_slice(&comment_payload("/kodx ask x", "User", false)).unwrap();
        p.as_object_mut().unwrap().remove("installation");
        let e = triage("issue_comment", p.to_string().as_bytes()).unwrap_err();
        assert!(e.0.contains("installation"), "{e}");
        assert!(triage("push", b"[oops").is_err());
        assert!(triage("", b"{}").is_err());
    }

    #[test]
    fn issue_opened_and_review_comment() {
        let p = json!({
            "action": "opened",
            "issue": {"number": 3, "body": "Please\n/kodx code add a flag", "user": {"login": "carol", "id": 3, "type": "User"}},
            "repository": {"full_name": "o/r", "clone_url": "u", "default_branch": "trunk"},
            "installation": {"id": 5}
        });
        let c = command(triage("issues", p.to_string().as_bytes()).unwrap());
        assert_eq!(c.trigger, Trigger::IssueBody(3));
        assert_eq!(c.default_branch, "trunk");
        assert_eq!(
            c.job,
            Job::Code {
                request: "add a flag".into(),
                base: None,
            }
        );

        let p = json!({
            "action": "created",
            "comment": {"id": 11, "body": "/kodx ask what does this do?", "user": {"login": "dan", "id": 4, "type": "User"},
                        "path": "src/lib.rs", "diff_hunk": "@@ -1 +1 @@\n-a\n+b", "line": 1, "commit_id": "abc"},
            "pull_request": {"number": 8},
            "repository": {"full_name": "o/r", "clone_url": "u", "default_branch": "main"},
            "installation": {"id": 5}
        });
        let c = command(triage("pull_request_review_comment", p.to_string().as_bytes()).unwrap());
        assert!(c.is_pull_request);
        assert_eq!(c.issue_number, 8);
        assert_eq!(
            c.trigger,
            Trigger::ReviewComment {
                id: 11,
                review: Some(ReviewContext {
                    path: "src/lib.rs".into(),
                    line: Some(1),
                    diff_hunk: "@@ -1 +1 @@\n-a\n+b".into(),
                    commit_id: Some("abc".into()),
                })
            }
        );
    }

    #[test]
    fn reviews_labels_and_ci() {
        let p = json!({
            "action": "submitted",
            "review": {"id": 77, "body": "Looks close.\n/kodx address-reviews keep the API", "user": {"login": "dan", "id": 4, "type": "User"}},
            "pull_request": {"number": 8},
            "repository": {"full_name": "o/r", "clone_url": "u", "default_branch": "main"},
            "installation": {"id": 5}
        });
        let c = command(triage("pull_request_review", p.to_string().as_bytes()).unwrap());
        assert_eq!(c.trigger, Trigger::Review(77));
        assert_eq!(
            c.job,
            Job::AddressReviews {
                words: "keep the API".into()
            }
        );
        let labeled = |label: &str, sender: &str, at: &str| {
            json!({
                "action": "labeled",
                "issue": {"number": 3, "title": "Add a flag", "body": "It needs --verbose.", "updated_at": at,
                          "user": {"login": "carol", "id": 3, "type": "User"}},
                "label": {"name": label},
                "sender": {"login": sender, "id": 9, "type": if sender.ends_with("[bot]") { "Bot" } else { "User" }},
                "repository": {"full_name": "o/r", "clone_url": "u", "default_branch": "main"},
                "installation": {"id": 5}
            })
            .to_string()
        };
        let c = command(
            triage(
                "issues",
                labeled("kodx", "erin", "2026-01-01T00:00:00Z").as_bytes(),
            )
            .unwrap(),
        );
        assert_eq!(c.author, "erin");
        assert_eq!(
            c.job,
            Job::Code {
                request: "Add a flag\n\nIt needs --verbose.".into(),
                base: None
            }
        );
        assert_eq!(c.trigger.label(), Some("kodx"));
        let again = command(
            triage(
                "issues",
                labeled("kodx", "erin", "2026-01-01T00:00:00Z").as_bytes(),
            )
            .unwrap(),
        );
        assert_eq!(
            again.trigger.id(),
            c.trigger.id(),
            "a redelivery is the same trigger"
        );
        let later = command(
            triage(
                "issues",
                labeled("kodx", "erin", "2026-01-02T00:00:00Z").as_bytes(),
            )
            .unwrap(),
        );
        assert_ne!(
            later.trigger.id(),
            c.trigger.id(),
            "labelling again is a new trigger"
        );
        assert!(c.trigger.id() >= 0);
        assert!(matches!(
            triage("issues", labeled("kodx", "ci[bot]", "x").as_bytes()).unwrap(),
            Triage::Ignore(r) if r.contains("bot")
        ));

        let suite = json!({
            "action": "completed",
            "check_suite": {"id": 41, "head_sha": "A".repeat(40), "head_branch": "kodx/issue-3-abc",
                            "conclusion": "failure", "pull_requests": [{"number": 12}, {"number": 13}],
                            "app": {"id": 77, "slug": "some-ci"}},
            "repository": {"full_name": "o/r", "clone_url": "u", "default_branch": "main"},
            "installation": {"id": 5}
        });
        // Completed again after a re-run (a later `updated_at`): another trigger; the same
        // completion replayed: the same one.
        let trigger = |updated: &str| {
            let mut again = suite.clone();
            again["check_suite"]["updated_at"] = json!(updated);
            match triage("check_suite", again.to_string().as_bytes()).unwrap() {
                Triage::Ci { request, .. } => request.trigger,
                _ => panic!(),
            }
        };
        let first = trigger("2026-11-29T00:01:00Z");
        assert_eq!(first, trigger("2026-11-29T00:01:00Z"));
        assert_ne!(first, trigger("2026-11-29T00:07:00Z"));
        assert!(matches!(first, Trigger::CheckSuite(id) if id > 0 && id != 41));
        match triage("check_suite", suite.to_string().as_bytes()).unwrap() {
            Triage::Ci {
                request,
                pulls,
                app_id,
            } => {
                assert_eq!(pulls, vec![12, 13]);
                assert_eq!(app_id, Some(77));
                assert_eq!(request.trigger, Trigger::CheckSuite(41));
                assert_eq!(
                    request.job,
                    Job::Repair {
                        commit: "a".repeat(40)
                    }
                );
            }
            other => panic!("{other:?}"),
        }
        let run = json!({
            "action": "completed",
            "workflow_run": {"id": 42, "head_sha": "b".repeat(40), "pull_requests": []},
            "repository": {"full_name": "o/r", "clone_url": "u", "default_branch": "main"},
            "installation": {"id": 5}
        });
        assert!(matches!(
            triage("workflow_run", run.to_string().as_bytes()).unwrap(),
            Triage::Ignore(r) if r.contains("no pull request")
        ));
        let mut bad = suite.clone();
        bad["check_suite"]["head_sha"] = json!("main");
        assert!(triage("check_suite", bad.to_string().as_bytes()).is_err());
    }

    #[test]
    fn pushes_to_branches_are_read_and_tags_ignored() {
        let data: Value =
            serde_json::from_str(include_str!("../../../tests/data/webhooks-push.json")).unwrap();
        let branch = serde_json::to_vec(&data["branch"]).unwrap();
        match triage("push", &branch).unwrap() {
            Triage::Push {
                request,
                branch,
                after,
            } => {
                assert_eq!(branch, "master");
                assert_eq!(after, "6113728f27ae82c7b1a177c8d03f9e96e0adf246");
                assert_eq!(request.repo, "Codertocat/Hello-World");
                assert_eq!(request.installation_id, 1);
                assert_eq!(
                    request.job,
                    Job::Merge {
                        base: after.clone(),
                        asked: false
                    }
                );
            }
            other => panic!("{other:?}"),
        }
        let tag = serde_json::to_vec(&data["tag"]).unwrap();
        assert!(matches!(triage("push", &tag), Ok(Triage::Ignore(_))));
        let mut deleted = data["branch"].clone();
        deleted["deleted"] = json!(true);
        let deleted = serde_json::to_vec(&deleted).unwrap();
        assert!(matches!(triage("push", &deleted), Ok(Triage::Ignore(_))));
        let mut bad = data["branch"].clone();
        bad["after"] = json!("nope");
        let bad = serde_json::to_vec(&bad).unwrap();
        assert!(triage("push", &bad).is_err());
    }

    #[test]
    fn installation_events_are_recorded() {
        let p =
            json!({"action": "created", "installation": {"id": 9, "account": {"login": "acme"}}});
        let t = triage("installation", p.to_string().as_bytes()).unwrap();
        assert_eq!(
            t,
            Triage::Installation {
                id: 9,
                account: "acme".into(),
                action: "installation.created".into()
            }
        );
    }

    #[test]
    fn escaped_strings_are_read() {
        let body = "/kodx ask \u{e9}t\u{e9}? \"quoted\"\nsecond line";
        let c = command(triage("issue_comment", &comment_payload(body, "User", false)).unwrap());
        assert_eq!(
            c.job,
            Job::Ask {
                question: "\u{e9}t\u{e9}? \"quoted\"\nsecond line".into()
            }
        );
    }
}
