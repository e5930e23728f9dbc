//! GitHub's REST answers as kodx reads them: `Deserialize` structs holding the fields kodx
//! uses (GitHub's other fields are ignored), turned at once into the domain types of
//! [`super::types`]. A missing or mistyped field is a [`GitHubError::Decode`] naming the
//! request and the field.

use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::Value;

use super::error::GitHubError;
use super::types::RepoName;
use super::types::{
    CommentInfo, CommentRef, CreatedCheckRun, IssueInfo, PullBase, PullHead, PullInfo, PullRef,
    PullRepo, PullState,
};

/// Reads `v` (the answer to `what`) as `T`.
pub(super) fn decode<T: DeserializeOwned>(v: &Value, what: &str) -> Result<T, GitHubError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        GitHubError::decode(what, format!("`{path}`: {inner}"))
    })
}

#[derive(Deserialize)]
pub(super) struct User {
    pub login: String,
    #[serde(rename = "type", default)]
    pub kind: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct Permission {
    pub permission: String,
    #[serde(default)]
    pub role_name: Option<String>,
}

/// `GET /repos/{owner}/{repo}/contents/{path}` for one entry.
#[derive(Deserialize)]
pub(super) struct Content {
    #[serde(rename = "type")]
    pub kind: String,
    #[serde(default)]
    pub encoding: Option<String>,
    #[serde(default)]
    pub size: u64,
    #[serde(default)]
    pub content: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct Branch {
    pub commit: Sha,
}

#[derive(Deserialize)]
pub(super) struct Sha {
    pub sha: String,
}

#[derive(Deserialize)]
pub(super) struct Tree {
    pub tree: Vec<TreeEntry>,
    #[serde(default)]
    pub truncated: bool,
}

#[derive(Deserialize)]
pub(super) struct TreeEntry {
    pub path: String,
    pub mode: String,
    pub sha: String,
    #[serde(default)]
    pub size: Option<u64>,
}

impl From<Tree> for super::types::Tree {
    fn from(t: Tree) -> Self {
        super::types::Tree {
            entries: t
                .tree
                .into_iter()
                .map(|e| super::types::TreeEntry {
                    path: e.path,
                    mode: e.mode,
                    sha: e.sha,
                    size: e.size,
                })
                .collect(),
            truncated: t.truncated,
        }
    }
}

#[derive(Deserialize)]
pub(super) struct Issue {
    number: u64,
    title: String,
    #[serde(default)]
    body: Option<String>,
    user: User,
    state: String,
    #[serde(default)]
    pull_request: Option<Value>,
}

impl From<Issue> for IssueInfo {
    fn from(i: Issue) -> IssueInfo {
        IssueInfo {
            number: i.number,
            title: i.title,
            body: i.body.unwrap_or_default(),
            author: i.user.login,
            state: i.state,
            is_pull_request: i.pull_request.is_some_and(|p| !p.is_null()),
        }
    }
}

#[derive(Deserialize)]
pub(super) struct Comment {
    id: u64,
    user: User,
    #[serde(default)]
    body: Option<String>,
    #[serde(default)]
    created_at: Option<String>,
    #[serde(default)]
    html_url: Option<String>,
}

impl From<Comment> for CommentInfo {
    fn from(c: Comment) -> CommentInfo {
        CommentInfo {
            id: c.id,
            author_is_bot: c.user.kind.as_deref() == Some("Bot"),
            author: c.user.login,
            body: c.body.unwrap_or_default(),
            created_at: c.created_at.unwrap_or_default(),
            html_url: c.html_url.unwrap_or_default(),
        }
    }
}

#[derive(Deserialize)]
pub(super) struct Created {
    id: u64,
    html_url: String,
}

impl From<Created> for CommentRef {
    fn from(c: Created) -> CommentRef {
        CommentRef {
            id: c.id,
            html_url: c.html_url,
        }
    }
}

/// A Check Run GitHub created (`checks/create`'s answer).
#[derive(Deserialize)]
pub(super) struct CheckRunCreated {
    id: u64,
    #[serde(default)]
    html_url: Option<String>,
}

impl From<CheckRunCreated> for CreatedCheckRun {
    fn from(c: CheckRunCreated) -> CreatedCheckRun {
        CreatedCheckRun {
            id: c.id,
            html_url: c.html_url.unwrap_or_default(),
        }
    }
}

#[derive(Deserialize)]
struct Repo {
    full_name: String,
    clone_url: String,
}

impl Repo {
    fn into_pull_repo(self) -> Result<PullRepo, String> {
        let name: RepoName = self
            .full_name
            .parse()
            .map_err(|e| format!("repo.full_name: {e}"))?;
        Ok(PullRepo {
            name,
            clone_url: self.clone_url,
        })
    }
}

#[derive(Deserialize)]
struct Side {
    #[serde(rename = "ref")]
    ref_name: String,
    sha: String,
    /// `null` for the head of a pull request whose fork was deleted.
    #[serde(default)]
    repo: Option<Repo>,
}

#[derive(Deserialize)]
pub(super) struct Pull {
    number: u64,
    title: String,
    #[serde(default)]
    body: Option<String>,
    user: User,
    state: String,
    head: Side,
    base: Side,
    #[serde(default)]
    maintainer_can_modify: bool,
    /// `null` until GitHub has computed it (lazily, after a push to either side).
    #[serde(default)]
    mergeable: Option<bool>,
    #[serde(default)]
    mergeable_state: Option<String>,
}

impl Pull {
    /// The pull request, or why its repositories cannot be read.
    pub(super) fn into_info(self) -> Result<PullInfo, String> {
        let head_repo = self.head.repo.map(Repo::into_pull_repo).transpose()?;
        let base_repo = self.base.repo.ok_or("no `base.repo`")?.into_pull_repo()?;
        let is_fork = head_repo.as_ref().is_none_or(|h| h.name != base_repo.name);
        Ok(PullInfo {
            number: self.number,
            title: self.title,
            body: self.body.unwrap_or_default(),
            author: self.user.login,
            state: self.state,
            head: PullHead {
                ref_name: self.head.ref_name,
                sha: self.head.sha,
                repo: head_repo,
            },
            base: PullBase {
                ref_name: self.base.ref_name,
                sha: self.base.sha,
                repo: base_repo,
            },
            is_fork,
            maintainer_can_modify: self.maintainer_can_modify,
            mergeable: self.mergeable,
            mergeable_state: self.mergeable_state,
        })
    }
}

#[derive(Deserialize)]
struct FullName {
    full_name: String,
}

#[derive(Deserialize)]
struct HeadRef {
    #[serde(rename = "ref")]
    ref_name: String,
    /// `null` when the fork was deleted.
    #[serde(default)]
    repo: Option<FullName>,
}

/// A pull request answer (create, list) as a [`PullRef`].
#[derive(Deserialize)]
pub(super) struct PullListed {
    number: u64,
    html_url: String,
    head: HeadRef,
}

impl PullListed {
    /// `owner/name` of the repository the head branch is in.
    pub(super) fn head_repo(&self) -> Option<&str> {
        self.head.repo.as_ref().map(|r| r.full_name.as_str())
    }
}

impl From<PullListed> for PullRef {
    fn from(p: PullListed) -> PullRef {
        PullRef {
            number: p.number,
            html_url: p.html_url,
            head_ref: p.head.ref_name,
        }
    }
}

#[derive(Deserialize)]
pub(super) struct PullUpdated {
    node_id: String,
    #[serde(default)]
    draft: Option<bool>,
}

impl From<PullUpdated> for PullState {
    fn from(p: PullUpdated) -> PullState {
        PullState {
            node_id: p.node_id,
            draft: p.draft.unwrap_or(false),
        }
    }
}

#[derive(Deserialize)]
pub(super) struct Id {
    pub id: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_missing_or_mistyped_field_names_the_request_and_the_field() {
        let e = decode::<Comment>(&json!({"id": "x", "user": {"login": "a"}}), "GET /c")
            .err()
            .expect("a string id is refused");
        assert!(e.to_string().contains("GET /c"), "{e}");
        assert!(e.to_string().contains("`id`"), "{e}");
        let e = decode::<Pull>(
            &json!({"number": 1, "title": "t", "user": {"login": "a"}, "state": "open",
                    "head": {"ref": "h", "sha": "1"}, "base": {"sha": "2"}}),
            "GET /p",
        )
        .err()
        .expect("a base without ref is refused");
        assert!(e.to_string().contains("base"), "{e}");
    }

    #[test]
    fn nulls_read_as_github_means_them() {
        let c: CommentInfo = decode::<Comment>(
            &json!({"id": 5, "user": {"login": "kodx[bot]", "type": "Bot"}, "body": null}),
            "GET /c",
        )
        .unwrap()
        .into();
        assert_eq!((c.id, c.author_is_bot, c.body.as_str()), (5, true, ""));
        let p = decode::<Pull>(
            &json!({"number": 2, "title": "t", "body": null, "user": {"login": "a"},
                    "state": "open",
                    "head": {"ref": "h", "sha": "1", "repo": null},
                    "base": {"ref": "main", "sha": "2",
                             "repo": {"full_name": "o/r", "clone_url": "https://x/o/r.git"}}}),
            "GET /p",
        )
        .unwrap()
        .into_info()
        .unwrap();
        assert!(p.is_fork && p.head.repo.is_none() && p.body.is_empty());
        assert_eq!(p.base.repo.name.to_string(), "o/r");
    }
}
