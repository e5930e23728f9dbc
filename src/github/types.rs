//! kodx's own small types for what it reads from and writes to GitHub: the client turns
//! every JSON answer into these at once, so no raw JSON leaves `crate::github`.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;

use super::error::GitHubError;
use crate::checks::Annotation;

/// `owner/name` of a repository.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RepoName {
    pub owner: String,
    pub name: String,
}

impl RepoName {
    /// Checks both parts against what GitHub allows: an owner of ASCII letters, digits, `-`
    /// and `_` (Enterprise Managed Users), starting with a letter or digit, at most 39
    /// characters (100 tolerated for Enterprise Server); a name of letters, digits, `-`, `_`
    /// and `.`, at most 100 characters, not `.` or `..`.
    /// Parses `owner/name` (the same as `str::parse`).
    pub fn parse(full_name: &str) -> Result<RepoName, RepoNameError> {
        full_name.parse()
    }

    pub fn new(owner: &str, name: &str) -> Result<RepoName, RepoNameError> {
        let owner_ok = !owner.is_empty()
            && owner.len() <= 100
            && owner.as_bytes()[0].is_ascii_alphanumeric()
            && owner
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !owner_ok {
            return Err(RepoNameError(format!("{owner:?} is not a valid owner")));
        }
        let name_ok = !name.is_empty()
            && name.len() <= 100
            && name != "."
            && name != ".."
            && name
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'));
        if !name_ok {
            return Err(RepoNameError(format!(
                "{name:?} is not a valid repository name"
            )));
        }
        Ok(RepoName {
            owner: owner.to_string(),
            name: name.to_string(),
        })
    }
}

/// Read or write, for one permission of an installation token.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Access {
    Read,
    Write,
}

impl Access {
    pub fn as_str(self) -> &'static str {
        match self {
            Access::Read => "read",
            Access::Write => "write",
        }
    }
}

/// What an installation token is minted for: one repository (by name, in the
/// installation's account) and the permissions a piece of work uses (`metadata: read` is
/// always included). GitHub refuses the token anything else.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TokenScope {
    /// The repository's name without its owner, as `repositories` wants it.
    pub repository: String,
    pub contents: Access,
    pub issues: Access,
    pub pull_requests: Access,
    /// Asked for only by the work that needs it: an installation without the Checks
    /// permission refuses any token that asks.
    pub checks: Option<Access>,
    /// Reading GitHub Actions' job logs (CI repair); asked for only then, like `checks`.
    pub actions: Option<Access>,
    /// Reading commit statuses (CI repair).
    pub statuses: Option<Access>,
}

impl TokenScope {
    /// Reading the repository and commenting, as `/kodx ask`, help and cancel do. A
    /// reaction on a review comment needs `pull_requests: write`, hence `review_comment`.
    pub fn read(repo: &RepoName, review_comment: bool) -> TokenScope {
        TokenScope {
            repository: repo.name.clone(),
            contents: Access::Read,
            issues: Access::Write,
            pull_requests: if review_comment {
                Access::Write
            } else {
                Access::Read
            },
            checks: None,
            actions: None,
            statuses: None,
        }
    }

    /// Reporting a code run's checks as a Check Run on the commit it pushed.
    pub fn checks(repo: &RepoName) -> TokenScope {
        TokenScope {
            repository: repo.name.clone(),
            contents: Access::Read,
            issues: Access::Read,
            pull_requests: Access::Read,
            checks: Some(Access::Write),
            actions: None,
            statuses: None,
        }
    }

    /// Reading why CI failed on a pull request (CI repair's admission): check suites and
    /// runs, annotations, commit statuses, and with `with_actions` the Actions job logs;
    /// commenting, to say when repairing stops.
    pub fn ci(repo: &RepoName, with_actions: bool) -> TokenScope {
        TokenScope {
            repository: repo.name.clone(),
            contents: Access::Read,
            issues: Access::Write,
            pull_requests: Access::Read,
            checks: Some(Access::Read),
            actions: with_actions.then_some(Access::Read),
            statuses: Some(Access::Read),
        }
    }

    /// [`TokenScope::ci`] with GitHub Actions write: re-running failed jobs before a repair.
    pub fn ci_rerun(repo: &RepoName) -> TokenScope {
        TokenScope {
            actions: Some(Access::Write),
            ..TokenScope::ci(repo, true)
        }
    }

    /// `/kodx code`: pushing a branch and opening or updating a pull request too.
    pub fn write(repo: &RepoName) -> TokenScope {
        TokenScope {
            repository: repo.name.clone(),
            contents: Access::Write,
            issues: Access::Write,
            pull_requests: Access::Write,
            checks: None,
            actions: None,
            statuses: None,
        }
    }

    /// The body of `POST /app/installations/{id}/access_tokens`.
    pub fn request_body(&self) -> serde_json::Value {
        let mut body = serde_json::json!({
            "repositories": [self.repository],
            "permissions": {
                "contents": self.contents.as_str(),
                "issues": self.issues.as_str(),
                "pull_requests": self.pull_requests.as_str(),
                "metadata": "read",
            },
        });
        for (name, access) in [
            ("checks", self.checks),
            ("actions", self.actions),
            ("statuses", self.statuses),
        ] {
            if let Some(access) = access {
                body["permissions"][name] = access.as_str().into();
            }
        }
        body
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a repository name (owner/name): {0}")]
pub struct RepoNameError(String);

impl FromStr for RepoName {
    type Err = RepoNameError;

    fn from_str(s: &str) -> Result<RepoName, RepoNameError> {
        let (owner, name) = s
            .split_once('/')
            .ok_or_else(|| RepoNameError(format!("{s:?} has no '/'")))?;
        RepoName::new(owner, name)
    }
}

impl fmt::Display for RepoName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.owner, self.name)
    }
}

/// A user's role on a repository, weakest first, so `perm >= Permission::Write` reads as
/// the check it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Permission {
    None,
    Read,
    Triage,
    Write,
    Maintain,
    Admin,
}

impl Permission {
    /// From the collaborator permission answer: `permission` is the base level
    /// (admin/write/read/none); `role_name` refines write to maintain and read to triage.
    /// A custom role counts as its base level; anything unknown counts as `None`.
    pub fn from_api(permission: &str, role_name: Option<&str>) -> Permission {
        match (permission, role_name) {
            ("admin", _) => Permission::Admin,
            ("write", Some("maintain")) => Permission::Maintain,
            ("write", _) => Permission::Write,
            ("read", Some("triage")) => Permission::Triage,
            ("read", _) => Permission::Read,
            _ => Permission::None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Permission::None => "none",
            Permission::Read => "read",
            Permission::Triage => "triage",
            Permission::Write => "write",
            Permission::Maintain => "maintain",
            Permission::Admin => "admin",
        }
    }
}

impl fmt::Display for Permission {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `GET /app`: the App itself. The bot's login is `<slug>[bot]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppInfo {
    pub id: u64,
    pub slug: String,
    /// What the App's settings grant: permission name → `read`, `write` or `admin`.
    pub permissions: BTreeMap<String, String>,
    /// The webhook events the App subscribes to.
    pub events: Vec<String>,
}

impl AppInfo {
    /// From the `GET /app` answer; `id` and `slug` are required, the rest read as far as
    /// it is there (an App without permissions has none).
    pub(crate) fn from_json(v: &serde_json::Value, what: &str) -> Result<AppInfo, GitHubError> {
        let id = v
            .get("id")
            .and_then(|v| v.as_u64())
            .ok_or_else(|| GitHubError::decode(what, "no number `id`"))?;
        let slug = v
            .get("slug")
            .and_then(|v| v.as_str())
            .ok_or_else(|| GitHubError::decode(what, "no string `slug`"))?
            .to_string();
        let permissions = v
            .get("permissions")
            .and_then(|p| p.as_object())
            .map(|p| {
                p.iter()
                    .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                    .collect()
            })
            .unwrap_or_default();
        let events = v
            .get("events")
            .and_then(|e| e.as_array())
            .map(|e| {
                e.iter()
                    .filter_map(|e| e.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        Ok(AppInfo {
            id,
            slug,
            permissions,
            events,
        })
    }

    pub fn bot_login(&self) -> String {
        format!("{}[bot]", self.slug)
    }
}

/// An issue or a pull request seen as an issue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssueInfo {
    pub number: u64,
    pub title: String,
    /// `""` when GitHub says `null`.
    pub body: String,
    pub author: String,
    pub state: String,
    pub is_pull_request: bool,
}

/// A comment on an issue or pull request conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommentInfo {
    pub id: u64,
    pub author: String,
    /// `user.type == "Bot"`.
    pub author_is_bot: bool,
    pub body: String,
    /// As GitHub wrote it (RFC 3339, UTC).
    pub created_at: String,
    pub html_url: String,
}

/// Where a comment kodx posted lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommentRef {
    pub id: u64,
    pub html_url: String,
}

/// A repository a pull request branch lives in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullRepo {
    pub name: RepoName,
    pub clone_url: String,
}

/// The branch a pull request brings in. `repo` is `None` when the fork was deleted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullHead {
    pub ref_name: String,
    pub sha: String,
    pub repo: Option<PullRepo>,
}

/// The branch a pull request goes into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullBase {
    pub ref_name: String,
    pub sha: String,
    pub repo: PullRepo,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullInfo {
    pub number: u64,
    pub title: String,
    /// `""` when GitHub says `null`.
    pub body: String,
    pub author: String,
    pub state: String,
    pub head: PullHead,
    pub base: PullBase,
    /// The head lives in another repository than the base (or its fork is gone): kodx
    /// cannot push to it and opens a new PR instead.
    pub is_fork: bool,
    pub maintainer_can_modify: bool,
    /// Whether it merges cleanly into its base; `None` while GitHub has not computed it
    /// (it does so lazily after a push: ask again).
    pub mergeable: Option<bool>,
    /// GitHub's word for it (`clean`, `behind`, `dirty`, `blocked`, `unstable`,
    /// `unknown`, …), when given.
    pub mergeable_state: Option<String>,
}

/// A completed Check Run for [`Installation::create_check_run`](super::Installation::create_check_run).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewCheckRun {
    pub name: String,
    pub head_sha: String,
    /// `success`, `failure`, `neutral`, `cancelled`, `timed_out`, `action_required`.
    pub conclusion: String,
    pub title: String,
    /// Markdown, at most 65,535 characters (cut before sending).
    pub summary: String,
    pub text: String,
    pub details_url: Option<String>,
    pub external_id: Option<String>,
    /// Annotations sent with the run, at most
    /// [`ANNOTATIONS_PER_REQUEST`](super::ANNOTATIONS_PER_REQUEST) (GitHub's limit per
    /// request); more go in updates
    /// ([`Installation::add_check_run_annotations`](super::Installation::add_check_run_annotations)).
    pub annotations: Vec<Annotation>,
}

/// A Check Run GitHub created: its id (what updates name) and its page.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedCheckRun {
    pub id: u64,
    pub html_url: String,
}

/// A commit's tree as [`Installation::tree`](super::Installation::tree) lists it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Tree {
    pub entries: Vec<TreeEntry>,
    /// GitHub listed only part of the tree (over 100,000 entries or 7 MB).
    pub truncated: bool,
}

/// One file, directory, link or submodule of a [`Tree`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TreeEntry {
    /// From the root, `/`-separated.
    pub path: String,
    /// Git's mode: `100644`, `100755` (files), `120000` (a symbolic link, whose blob is
    /// its target), `040000` (a directory), `160000` (a submodule).
    pub mode: String,
    pub sha: String,
    /// Bytes, for blobs.
    pub size: Option<u64>,
}

impl TreeEntry {
    pub fn is_file(&self) -> bool {
        matches!(self.mode.as_str(), "100644" | "100755")
    }

    pub fn is_link(&self) -> bool {
        self.mode == "120000"
    }
}

/// A pull request for [`Installation::create_pull`](super::Installation::create_pull) to open.
/// `head` is a branch of the same repository (a bare name, no `owner:`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewPull {
    pub title: String,
    pub head: String,
    pub base: String,
    pub body: String,
    pub draft: bool,
}

/// A pull request kodx opened or found again: enough to link to it and to edit it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullRef {
    pub number: u64,
    pub html_url: String,
    /// The head branch name (`head.ref`).
    pub head_ref: String,
}

/// What an update of a pull request says of it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullState {
    /// Its GraphQL node id (what `markPullRequestReadyForReview` takes).
    pub node_id: String,
    pub draft: bool,
}

/// The App's bot account, as commits name it: `login` is `<slug>[bot]`, `noreply_email`
/// `<id>+<slug>[bot]@users.noreply.github.com` (GitHub links such commits to the bot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BotIdentity {
    pub login: String,
    pub id: u64,
    pub noreply_email: String,
}

impl BotIdentity {
    pub fn new(login: &str, id: u64) -> BotIdentity {
        BotIdentity {
            login: login.to_string(),
            id,
            noreply_email: noreply_email(login, id),
        }
    }
}

/// GitHub's noreply address of an account, `<id>+<login>@users.noreply.github.com`: what a
/// commit author or a `Co-authored-by:` trailer names to be linked to that account.
pub fn noreply_email(login: &str, id: u64) -> String {
    format!("{id}+{login}@users.noreply.github.com")
}

/// What a reaction goes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReactionTarget {
    /// A comment in an issue or PR conversation, by id.
    IssueComment(u64),
    /// A comment on a diff line of a PR, by id.
    ReviewComment(u64),
    /// The issue or PR itself, by number.
    Issue(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reaction {
    Eyes,
    Rocket,
    Confused,
    PlusOne,
}

impl Reaction {
    /// The `content` value of the reactions API.
    pub fn as_str(self) -> &'static str {
        match self {
            Reaction::Eyes => "eyes",
            Reaction::Rocket => "rocket",
            Reaction::Confused => "confused",
            Reaction::PlusOne => "+1",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repo_names_parse_strictly() {
        let r: RepoName = "rust-lang/rust.vim".parse().unwrap();
        assert_eq!(
            (r.owner.as_str(), r.name.as_str()),
            ("rust-lang", "rust.vim")
        );
        assert_eq!(r.to_string(), "rust-lang/rust.vim");
        assert!("my_org_emu/.github".parse::<RepoName>().is_ok());
        for bad in [
            "",
            "owner",
            "owner/",
            "/name",
            "a/b/c",
            "-owner/name",
            "own er/name",
            "owner/na me",
            "owner/..",
            "owner/.",
            "owner/name?x=1",
            "ow%6ber/name",
            "owner/näme",
        ] {
            assert!(bad.parse::<RepoName>().is_err(), "{bad:?} accepted");
        }
        assert!(format!("a/{}", "n".repeat(101))
            .parse::<RepoName>()
            .is_err());
    }

    #[test]
    fn permissions_map_and_order() {
        use Permission as P;
        let p = Permission::from_api;
        assert_eq!(p("admin", Some("admin")), P::Admin);
        assert_eq!(p("write", Some("maintain")), P::Maintain);
        assert_eq!(p("write", Some("write")), P::Write);
        assert_eq!(p("write", Some("custom-dev")), P::Write);
        assert_eq!(p("read", Some("triage")), P::Triage);
        assert_eq!(p("read", None), P::Read);
        assert_eq!(p("none", Some("maintain")), P::None);
        assert_eq!(p("owner", None), P::None);
        assert!(P::None < P::Read && P::Read < P::Triage && P::Triage < P::Write);
        assert!(P::Write < P::Maintain && P::Maintain < P::Admin);
    }

    #[test]
    fn app_info_reads_permissions_and_events() {
        let v = serde_json::json!({
            "id": 7, "slug": "kodx", "name": "kodx",
            "permissions": {"contents": "write", "metadata": "read", "odd": 3},
            "events": ["issues", "issue_comment", 5],
        });
        let info = AppInfo::from_json(&v, "GET /app").unwrap();
        assert_eq!((info.id, info.slug.as_str()), (7, "kodx"));
        assert_eq!(info.bot_login(), "kodx[bot]");
        assert_eq!(info.permissions.len(), 2);
        assert_eq!(info.permissions["contents"], "write");
        assert_eq!(info.events, ["issues", "issue_comment"]);
        let bare = AppInfo::from_json(&serde_json::json!({"id": 1, "slug": "s"}), "GET /app");
        assert!(bare.unwrap().permissions.is_empty());
        let e = AppInfo::from_json(&serde_json::json!({"slug": "s"}), "GET /app").unwrap_err();
        assert!(e.to_string().contains("`id`"), "{e}");
    }

    #[test]
    fn bot_identity_and_noreply_addresses() {
        let bot = BotIdentity::new("kodx[bot]", 41898282);
        assert_eq!(
            bot.noreply_email,
            "41898282+kodx[bot]@users.noreply.github.com"
        );
        assert_eq!(
            noreply_email("alice", 7),
            "7+alice@users.noreply.github.com"
        );
    }
}
