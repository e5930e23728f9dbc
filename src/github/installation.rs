//! The REST calls kodx makes as one installation, through that installation's octocrab
//! client (see [`super::transport`]). Every answer becomes one of kodx's own types at once.

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use axum::http; // the `http` crate, which octocrab's raw request API speaks
use octocrab::Octocrab;
use secrecy::SecretString;
use serde_json::{json, Value};

use super::clock::Clock;
use super::error::GitHubError;
use super::guard::WriteGuard;
use super::policy::{Raw, RequestPolicy};
use super::transport::{self, Auth, Call, JSON};
use super::types::{
    CommentInfo, CommentRef, IssueInfo, NewPull, Permission, PullInfo, PullRef, PullState,
    Reaction, ReactionTarget, RepoName, Tree,
};
use super::util::{base64_decode, encode_path, encode_segment};
use super::wire;

const DIFF: &str = "application/vnd.github.diff";
/// A file's or blob's bytes as they are.
const RAW: &str = "application/vnd.github.raw+json";
/// Comments per page when listing (GitHub's maximum).
const PER_PAGE: usize = 100;
/// Pages `find_comment` reads at most (10 000 comments).
const MAX_PAGES: u32 = 100;

/// One installation's access: its token (valid at least five more minutes when handed out
/// by [`super::GitHubApp::installation`]) and an octocrab client authenticated with it.
/// Cheap to clone. Ask the App again for each unit of work rather than keeping one for
/// longer than its token lives (`expires_at`).
#[derive(Clone)]
pub struct Installation {
    inner: Arc<Inner>,
    /// Asked before each write ([`Installation::guarded`]); `None`: writes go out as asked.
    guard: Option<Arc<dyn WriteGuard>>,
}

struct Inner {
    id: u64,
    token: SecretString,
    expires_at: SystemTime,
    /// What [`Installation::valid_for`] reads the time from (the App's clock).
    clock: Clock,
    octo: Octocrab,
    policy: RequestPolicy,
    /// GitHub's GraphQL endpoint beside the REST API ([`graphql_url`]).
    graphql: String,
}

impl fmt::Debug for Installation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Installation")
            .field("id", &self.inner.id)
            .field("token", &self.inner.token)
            .field("expires_at", &self.inner.expires_at)
            .finish()
    }
}

impl Installation {
    /// Builds the installation's octocrab client on `api_url` ([`transport::client`]); the
    /// calls below go through kodx's one [`RequestPolicy`]. Inside a Tokio runtime.
    pub(crate) fn new(
        api_url: &str,
        id: u64,
        token: SecretString,
        expires_at: SystemTime,
        policy: RequestPolicy,
        clock: Clock,
    ) -> Result<Installation, GitHubError> {
        let octo = transport::client(api_url, &policy, Auth::Installation(token.clone()))?;
        Ok(Installation {
            inner: Arc::new(Inner {
                id,
                token,
                expires_at,
                clock,
                octo,
                policy,
                graphql: graphql_url(api_url),
            }),
            guard: None,
        })
    }

    /// The same installation and token, whose every write asks `guard` first, right before
    /// each attempt ([`super::guard`]): the client a run's stages get, so that no write of
    /// theirs skips the run's lease.
    pub fn guarded(&self, guard: Arc<dyn WriteGuard>) -> Installation {
        Installation {
            inner: self.inner.clone(),
            guard: Some(guard),
        }
    }

    pub fn id(&self) -> u64 {
        self.inner.id
    }

    /// The installation token, for git's credentials (`expose_secret` reads it). No
    /// `Debug` or `Display` shows it.
    pub fn token(&self) -> &SecretString {
        &self.inner.token
    }

    /// When the token stops working, as GitHub said.
    pub fn expires_at(&self) -> SystemTime {
        self.inner.expires_at
    }

    /// Whether the token is good for at least `margin` more.
    pub fn valid_for(&self, margin: Duration) -> bool {
        self.inner.clock.now() + margin < self.inner.expires_at
    }

    // ---------------------------------------------------------------------------------
    // The calls
    // ---------------------------------------------------------------------------------

    /// The user's role on the repository. Someone who is not a collaborator (404) has
    /// `Permission::None`.
    pub async fn permission(&self, repo: &RepoName, user: &str) -> Result<Permission, GitHubError> {
        let path = format!(
            "{}/collaborators/{}/permission",
            repo_path(repo),
            encode_segment(user)
        );
        let v = match self.get_json(&path).await {
            Ok(v) => v,
            Err(e) if e.is_not_found() => return Ok(Permission::None),
            Err(e) => return Err(e),
        };
        let what = format!("GET {path}");
        let answer: wire::Permission = wire::decode(&v, &what)?;
        let (permission, role) = (answer.permission.as_str(), answer.role_name.as_deref());
        let level = Permission::from_api(permission, role);
        if level == Permission::None && permission != "none" {
            tracing::warn!(
                permission,
                ?role,
                "unknown GitHub permission; treated as none"
            );
        }
        Ok(level)
    }

    /// A text file at `git_ref` (a branch, tag or commit; `None`: the default branch);
    /// `None` when there is no such file. A directory, a symlink or submodule, a file too
    /// large for the contents API, or bytes that are not UTF-8 are errors.
    pub async fn file_at(
        &self,
        repo: &RepoName,
        path: &str,
        git_ref: Option<&str>,
    ) -> Result<Option<String>, GitHubError> {
        let path = format!(
            "{}/contents/{}",
            repo_path(repo),
            encode_path(path.trim_start_matches('/'))
        );
        let what = format!("GET {path}");
        let query = git_ref.map(|r| format!("ref={}", encode_segment(r)));
        let v = match self
            .request(http::Method::GET, &path, query.as_deref(), JSON, None)
            .await
            .and_then(|raw| raw.json(&what))
        {
            Ok(v) => v,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        if v.is_array() {
            return Err(GitHubError::decode(
                &what,
                "this path is a directory, not a file",
            ));
        }
        let content: wire::Content = wire::decode(&v, &what)?;
        let kind = content.kind.as_str();
        if kind != "file" {
            return Err(GitHubError::decode(
                &what,
                format!("this path is a {kind}, not a file"),
            ));
        }
        let encoding = content.encoding.as_deref().unwrap_or("");
        if encoding != "base64" {
            let size = content.size;
            return Err(GitHubError::decode(
                &what,
                format!(
                    "the file ({size} bytes) is too large for the contents API \
                     (encoding {encoding:?})"
                ),
            ));
        }
        let text = content
            .content
            .as_deref()
            .ok_or_else(|| GitHubError::decode(&what, "no string `content`"))?;
        let bytes =
            base64_decode(text).map_err(|e| GitHubError::decode(&what, format!("content: {e}")))?;
        String::from_utf8(bytes)
            .map(Some)
            .map_err(|_| GitHubError::decode(&what, "the file is not UTF-8 text"))
    }

    /// The commit at the tip of `branch`; `None` when the repository has no such branch
    /// (a tag or a commit is not a branch).
    pub async fn branch_sha(
        &self,
        repo: &RepoName,
        branch: &str,
    ) -> Result<Option<String>, GitHubError> {
        let path = format!("{}/branches/{}", repo_path(repo), encode_path(branch));
        let what = format!("GET {path}");
        let v = match self.get_json(&path).await {
            Ok(v) => v,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        let branch: wire::Branch = wire::decode(&v, &what)?;
        Ok(Some(branch.commit.sha))
    }

    /// Every entry of the tree of `commit` (recursively: GitHub lists at most 100,000
    /// entries or 7 MB, and says `truncated` past that); `None` when there is no such commit.
    pub async fn tree(&self, repo: &RepoName, commit: &str) -> Result<Option<Tree>, GitHubError> {
        let path = format!("{}/git/trees/{}", repo_path(repo), encode_segment(commit));
        let what = format!("GET {path}");
        let v = match self
            .request(http::Method::GET, &path, Some("recursive=1"), JSON, None)
            .await
            .and_then(|raw| raw.json(&what))
        {
            Ok(v) => v,
            Err(e) if e.is_not_found() => return Ok(None),
            Err(e) => return Err(e),
        };
        let tree: wire::Tree = wire::decode(&v, &what)?;
        Ok(Some(tree.into()))
    }

    /// The first `max` bytes of the blob `sha` (its raw bytes, read no further) and whether
    /// it has more.
    pub async fn blob_head(
        &self,
        repo: &RepoName,
        sha: &str,
        max: usize,
    ) -> Result<(Vec<u8>, bool), GitHubError> {
        let path = format!("{}/git/blobs/{}", repo_path(repo), encode_segment(sha));
        let what = format!("GET {path}");
        let call = Call {
            what: &what,
            method: http::Method::GET,
            path: &path,
            query: None,
            accept: RAW,
            body: None,
            jwt: None,
            max_body: max,
            guard: self.write_guard(),
        };
        let raw = transport::send(&self.inner.octo, &self.inner.policy, call).await?;
        Ok((raw.body.to_vec(), raw.cut))
    }

    /// An issue (or a pull request seen as an issue).
    pub async fn issue(&self, repo: &RepoName, number: u64) -> Result<IssueInfo, GitHubError> {
        let path = format!("{}/issues/{number}", repo_path(repo));
        let what = format!("GET {path}");
        let v = self.get_json(&path).await?;
        Ok(wire::decode::<wire::Issue>(&v, &what)?.into())
    }

    /// The `last` most recent comments of an issue or PR conversation, oldest first.
    /// Reads the first page, then pages back from the last one (`Link: rel="last"`, read by
    /// octocrab's [`Page`](octocrab::Page)) until it has enough.
    pub async fn issue_comments(
        &self,
        repo: &RepoName,
        number: u64,
        last: usize,
    ) -> Result<Vec<CommentInfo>, GitHubError> {
        if last == 0 {
            return Ok(Vec::new());
        }
        let (first, last_page) = self.comments_page(repo, number, 1).await?;
        let mut pages = Vec::new();
        let mut have = 0;
        if let Some(last_page) = last_page.filter(|&p| p > 1) {
            let mut page = last_page;
            while page > 1 && have < last {
                let (items, _) = self.comments_page(repo, number, page).await?;
                have += items.len();
                pages.push(items);
                page -= 1;
            }
            if have < last {
                pages.push(first);
            }
        } else {
            pages.push(first);
        }
        let mut all: Vec<CommentInfo> = pages.into_iter().rev().flatten().collect();
        let skip = all.len().saturating_sub(last);
        all.drain(..skip);
        Ok(all)
    }

    /// The first comment (oldest first) of the conversation that `pred` accepts, e.g. kodx's
    /// status comment recognised by its hidden metadata after a restart. Reads page after
    /// page while the answer names a later last page, [`MAX_PAGES`] at most.
    pub async fn find_comment(
        &self,
        repo: &RepoName,
        issue: u64,
        pred: impl Fn(&CommentInfo) -> bool,
    ) -> Result<Option<CommentInfo>, GitHubError> {
        let mut page = 1;
        loop {
            let (items, last_page) = self.comments_page(repo, issue, page).await?;
            if let Some(found) = items.into_iter().find(|c| pred(c)) {
                return Ok(Some(found));
            }
            match last_page {
                Some(last) if page < last && page < MAX_PAGES => page += 1,
                _ => return Ok(None),
            }
        }
    }

    /// One page of a conversation's comments, and the number of the last page when the
    /// answer's `Link` names one (it does on every page but the last). Page numbers, not the
    /// `Link` URLs, are followed: the next request goes to the same API base and path.
    async fn comments_page(
        &self,
        repo: &RepoName,
        number: u64,
        page: u32,
    ) -> Result<(Vec<CommentInfo>, Option<u32>), GitHubError> {
        let path = format!("{}/issues/{number}/comments", repo_path(repo));
        let what = format!("GET {path}");
        let query = format!("per_page={PER_PAGE}&page={page}");
        let raw = self
            .request(http::Method::GET, &path, Some(&query), JSON, None)
            .await?;
        let page = raw.page(&what, "expected a list of comments").await?;
        let comments = page
            .items
            .iter()
            .map(|c| wire::decode::<wire::Comment>(c, &what).map(CommentInfo::from))
            .collect::<Result<_, _>>()?;
        Ok((comments, page.number_of_pages()))
    }

    /// A pull request's branches. `is_fork` when the head is in another repository (or its
    /// fork was deleted).
    pub async fn pull_request(
        &self,
        repo: &RepoName,
        number: u64,
    ) -> Result<PullInfo, GitHubError> {
        let path = format!("{}/pulls/{number}", repo_path(repo));
        let what = format!("GET {path}");
        let v = self.get_json(&path).await?;
        wire::decode::<wire::Pull>(&v, &what)?
            .into_info()
            .map_err(|e| GitHubError::decode(&what, e))
    }

    /// The pull request as a unified diff, cut to at most `max_bytes` (on a character
    /// boundary) followed by a one-line note saying how much was left out.
    pub async fn pull_request_diff(
        &self,
        repo: &RepoName,
        number: u64,
        max_bytes: usize,
    ) -> Result<String, GitHubError> {
        let path = format!("{}/pulls/{number}", repo_path(repo));
        let raw = self
            .request(http::Method::GET, &path, None, DIFF, None)
            .await?;
        let diff = String::from_utf8_lossy(&raw.body);
        Ok(cut_diff(&diff, max_bytes))
    }

    /// Posts a comment on an issue or PR conversation.
    pub async fn create_comment(
        &self,
        repo: &RepoName,
        issue: u64,
        body: &str,
    ) -> Result<CommentRef, GitHubError> {
        let path = format!("{}/issues/{issue}/comments", repo_path(repo));
        let what = format!("POST {path}");
        let raw = self
            .request(
                http::Method::POST,
                &path,
                None,
                JSON,
                Some(&json!({ "body": body })),
            )
            .await?;
        let v = raw.json(&what)?;
        Ok(wire::decode::<wire::Created>(&v, &what)?.into())
    }

    /// Replaces the body of a comment.
    pub async fn update_comment(
        &self,
        repo: &RepoName,
        comment_id: u64,
        body: &str,
    ) -> Result<(), GitHubError> {
        let path = format!("{}/issues/comments/{comment_id}", repo_path(repo));
        self.request(
            http::Method::PATCH,
            &path,
            None,
            JSON,
            Some(&json!({ "body": body })),
        )
        .await?;
        Ok(())
    }

    /// Adds a reaction. Reacting twice the same way is fine (GitHub answers 200).
    pub async fn react(
        &self,
        repo: &RepoName,
        target: ReactionTarget,
        content: Reaction,
    ) -> Result<(), GitHubError> {
        let path = match target {
            ReactionTarget::IssueComment(id) => {
                format!("{}/issues/comments/{id}/reactions", repo_path(repo))
            }
            ReactionTarget::ReviewComment(id) => {
                format!("{}/pulls/comments/{id}/reactions", repo_path(repo))
            }
            ReactionTarget::Issue(number) => {
                format!("{}/issues/{number}/reactions", repo_path(repo))
            }
        };
        self.request(
            http::Method::POST,
            &path,
            None,
            JSON,
            Some(&json!({ "content": content.as_str() })),
        )
        .await?;
        Ok(())
    }

    /// Opens a pull request from `req.head`, a branch of `repo` itself, into `req.base`
    /// (`POST /repos/{o}/{r}/pulls`). `maintainer_can_modify` is not sent: it is about heads
    /// in forks, GitHub advises leaving it out otherwise, and `true` on a same-repository
    /// pull request has been refused ("Fork collab can only be enabled on cross-repo pull
    /// requests").
    ///
    /// GitHub's 422s become [`GitHubError::PullExists`] (one from this head into this base
    /// is open: [`find_open_pull`](Self::find_open_pull) finds it) and
    /// [`GitHubError::NoCommits`]. A POST is not idempotent, so a 502/503/504 or an
    /// unanswered attempt is never simply sent again: GitHub may have opened the pull request
    /// before failing, so the open pull requests from `head` are looked up first and the one
    /// found is returned; only when there is none is the POST sent again (within the
    /// policy's attempts, with its backoff). A `PullExists` on such a second attempt is that
    /// pull request too, and is returned as found.
    pub async fn create_pull(
        &self,
        repo: &RepoName,
        req: &NewPull,
    ) -> Result<PullRef, GitHubError> {
        let path = format!("{}/pulls", repo_path(repo));
        let what = format!("POST {path}");
        let body = json!({
            "title": req.title,
            "head": req.head,
            "base": req.base,
            "body": req.body,
            "draft": req.draft,
        });
        let policy = &self.inner.policy;
        let once = RequestPolicy {
            max_attempts: 1,
            ..policy.clone()
        };
        let head_label = format!("{}:{}", repo.owner, req.head);
        let mut attempt = 0;
        loop {
            attempt += 1;
            let err = match self
                .request_with(&once, http::Method::POST, &path, None, JSON, Some(&body))
                .await
            {
                Ok(raw) => {
                    let created = wire::decode::<wire::PullListed>(&raw.json(&what)?, &what)?;
                    return Ok(created.into());
                }
                Err(e) => pull_error(e, &head_label),
            };
            let unclear = matches!(err, GitHubError::Network { .. })
                || matches!(
                    err,
                    GitHubError::Http {
                        status: 502..=504,
                        ..
                    }
                );
            let earlier_unclear = attempt > 1 && matches!(err, GitHubError::PullExists { .. });
            if !unclear && !earlier_unclear {
                return Err(err);
            }
            // GitHub may have opened it before failing: look before sending again.
            match self.find_open_pull(repo, &req.head).await {
                Ok(Some(found)) => {
                    tracing::info!(
                        %what,
                        number = found.number,
                        "an unanswered pull request POST had opened it; using that one"
                    );
                    return Ok(found);
                }
                Ok(None) if unclear && attempt < policy.max_attempts => {}
                Ok(None) => return Err(err),
                Err(lookup) => {
                    tracing::warn!(%what, error = %lookup, "cannot tell whether the failed POST opened the pull request; not sending it again");
                    return Err(err);
                }
            }
            let delay = policy.backoff(attempt);
            tracing::warn!(%what, attempt, ?delay, error = %err, "opening the pull request failed; retrying");
            tokio::time::sleep(delay).await;
        }
    }

    /// The open pull request whose head is `head_branch` of `repo` itself, if any
    /// (`GET /repos/{o}/{r}/pulls?state=open&head={owner}:{branch}`; GitHub ignores a `head`
    /// without the `owner:` prefix, so the answer is checked too).
    pub async fn find_open_pull(
        &self,
        repo: &RepoName,
        head_branch: &str,
    ) -> Result<Option<PullRef>, GitHubError> {
        let path = format!("{}/pulls", repo_path(repo));
        let what = format!("GET {path}");
        let query = format!(
            "state=open&head={}",
            encode_segment(&format!("{}:{head_branch}", repo.owner))
        );
        let raw = self
            .request(http::Method::GET, &path, Some(&query), JSON, None)
            .await?;
        let v = raw.json(&what)?;
        let items = v
            .as_array()
            .ok_or_else(|| GitHubError::decode(&what, "expected a list of pull requests"))?;
        for item in items {
            let listed: wire::PullListed = wire::decode(item, &what)?;
            let same_repo = listed
                .head_repo()
                .is_some_and(|f| f.eq_ignore_ascii_case(&repo.to_string()));
            let found = PullRef::from(listed);
            if found.head_ref == head_branch && same_repo {
                return Ok(Some(found));
            }
        }
        Ok(None)
    }

    /// Replaces the description of a pull request, and its title when one is given
    /// (`PATCH /repos/{o}/{r}/pulls/{n}`); returns what GitHub says of it now.
    pub async fn update_pull(
        &self,
        repo: &RepoName,
        number: u64,
        title: Option<&str>,
        body: &str,
    ) -> Result<PullState, GitHubError> {
        let path = format!("{}/pulls/{number}", repo_path(repo));
        let what = format!("PATCH {path}");
        let mut fields = json!({ "body": body });
        if let Some(title) = title {
            fields["title"] = json!(title);
        }
        let raw = self
            .request(http::Method::PATCH, &path, None, JSON, Some(&fields))
            .await?;
        let v = raw.json(&what)?;
        Ok(wire::decode::<wire::PullUpdated>(&v, &what)?.into())
    }

    /// The numeric id of a GitHub account (`GET /users/{login}`; a bot's login
    /// `name[bot]` is percent-encoded), e.g. for a `Co-authored-by:` trailer's noreply
    /// address. An unknown login is `NotFound`.
    pub async fn user_id(&self, login: &str) -> Result<u64, GitHubError> {
        let path = format!("/users/{}", encode_segment(login));
        if login.is_empty() {
            return Err(GitHubError::NotFound {
                what: format!("GET {path}"),
            });
        }
        let what = format!("GET {path}");
        let v = self.get_json(&path).await?;
        Ok(wire::decode::<wire::Id>(&v, &what)?.id)
    }

    // ---------------------------------------------------------------------------------
    // Transport
    // ---------------------------------------------------------------------------------

    /// What the GraphQL calls ([`super::graphql`]) go through: this installation's client and
    /// policy, and GitHub's GraphQL endpoint.
    pub(super) fn graphql_channel(&self) -> (&Octocrab, &RequestPolicy, &str) {
        (&self.inner.octo, &self.inner.policy, &self.inner.graphql)
    }

    /// The guard every write of this client asks first, if any.
    pub(super) fn write_guard(&self) -> Option<&dyn WriteGuard> {
        self.guard.as_deref()
    }

    async fn get_json(&self, path: &str) -> Result<Value, GitHubError> {
        let raw = self
            .request(http::Method::GET, path, None, JSON, None)
            .await?;
        raw.json(&format!("GET {path}"))
    }

    /// One call under the retry policy, through the write guard when it writes. `path`
    /// starts with `/` and is relative to the API base; `query` is already encoded.
    pub(super) async fn request(
        &self,
        method: http::Method,
        path: &str,
        query: Option<&str>,
        accept: &str,
        body: Option<&Value>,
    ) -> Result<Raw, GitHubError> {
        let policy = &self.inner.policy;
        self.request_with(policy, method, path, query, accept, body)
            .await
    }

    /// One call under `policy` (the installation's, or a single-attempt one for calls that
    /// must not be repeated blindly).
    async fn request_with(
        &self,
        policy: &RequestPolicy,
        method: http::Method,
        path: &str,
        query: Option<&str>,
        accept: &str,
        body: Option<&Value>,
    ) -> Result<Raw, GitHubError> {
        let what = format!("{method} {path}");
        let call = Call {
            what: &what,
            method,
            path,
            query,
            accept,
            body,
            jwt: None,
            max_body: transport::MAX_ANSWER_BYTES,
            guard: self.write_guard(),
        };
        transport::send(&self.inner.octo, policy, call).await
    }
}

/// GitHub's GraphQL endpoint for a REST API base: `https://api.github.com/graphql`; on
/// Enterprise Server (`https://HOST/api/v3`) `https://HOST/api/graphql`; for any other base
/// (a test server) `<base>/graphql`.
pub(crate) fn graphql_url(api_url: &str) -> String {
    let base = api_url.trim_end_matches('/');
    match base.strip_suffix("/api/v3") {
        Some(host) => format!("{host}/api/graphql"),
        None => format!("{base}/graphql"),
    }
}

pub(super) fn repo_path(repo: &RepoName) -> String {
    // RepoName only holds URL-safe characters.
    format!("/repos/{}/{}", repo.owner, repo.name)
}

/// Cuts `diff` to at most `max_bytes` on a character boundary and says so on a last line.
fn cut_diff(diff: &str, max_bytes: usize) -> String {
    if diff.len() <= max_bytes {
        return diff.to_string();
    }
    let mut end = max_bytes;
    while !diff.is_char_boundary(end) {
        end -= 1;
    }
    let mut out = diff[..end].to_string();
    if !out.ends_with('\n') && !out.is_empty() {
        out.push('\n');
    }
    out.push_str(&format!(
        "[diff cut: {end} of {} bytes shown]\n",
        diff.len()
    ));
    out
}

/// GitHub's two 422s of opening a pull request that callers act on, told apart by their
/// `errors[].message` (both have code `custom`).
fn pull_error(err: GitHubError, head_label: &str) -> GitHubError {
    match err {
        GitHubError::Http {
            status: 422,
            what,
            message,
        } => {
            if message.contains("A pull request already exists") {
                GitHubError::PullExists {
                    what,
                    head: head_label.to_string(),
                }
            } else if message.contains("No commits between") {
                GitHubError::NoCommits { what, message }
            } else {
                GitHubError::Http {
                    status: 422,
                    what,
                    message,
                }
            }
        }
        other => other,
    }
}

#[cfg(test)]
mod tests {

    #[test]
    fn graphql_sits_beside_the_rest_api() {
        assert_eq!(
            graphql_url("https://api.github.com"),
            "https://api.github.com/graphql"
        );
        assert_eq!(
            graphql_url("https://ghe.example.com/api/v3/"),
            "https://ghe.example.com/api/graphql"
        );
        assert_eq!(
            graphql_url("http://127.0.0.1:8080"),
            "http://127.0.0.1:8080/graphql"
        );
    }

    use super::*;

    #[test]
    fn pull_422s_are_told_apart() {
        let http = |message: &str| GitHubError::Http {
            what: "POST /repos/o/r/pulls".into(),
            status: 422,
            message: message.into(),
        };
        let e = pull_error(
            http("Validation Failed (A pull request already exists for o:kodx/x.)"),
            "o:kodx/x",
        );
        assert!(
            matches!(&e, GitHubError::PullExists { head, .. } if head == "o:kodx/x"),
            "{e}"
        );
        assert_eq!(e.status(), Some(422));
        let e = pull_error(
            http("Validation Failed (No commits between main and kodx/x)"),
            "",
        );
        assert!(matches!(e, GitHubError::NoCommits { .. }), "{e}");
        assert!(
            e.to_string().contains("No commits between main and kodx/x"),
            "{e}"
        );
        let e = pull_error(http("Validation Failed (invalid)"), "");
        assert!(matches!(e, GitHubError::Http { status: 422, .. }), "{e}");
        let policy = RequestPolicy::default();
        assert!(policy.backoff(1) >= policy.base_delay);
        assert!(policy.backoff(30) <= policy.max_delay);
    }

    // Octocrab's client starts its worker on the current Tokio runtime.
    #[tokio::test]
    async fn the_token_never_shows() {
        let token = "ghs_abcdefghijklmnopqrstuvwxyz0123456789";
        let inst = Installation::new(
            "https://api.github.com",
            7,
            SecretString::from(token),
            SystemTime::now() + Duration::from_secs(3600),
            RequestPolicy::default(),
            Clock::default(),
        )
        .unwrap();
        let shown = format!("{inst:?}");
        assert!(!shown.contains(token), "{shown}");
        assert!(shown.contains("[REDACTED]"), "{shown}");
        assert!(!format!("{:?}", inst.token()).contains(token));
        use secrecy::ExposeSecret;
        assert_eq!(inst.token().expose_secret(), token);
    }

    #[test]
    fn diffs_are_cut_on_char_boundaries() {
        assert_eq!(cut_diff("short\n", 100), "short\n");
        let d = "+é\n".repeat(10); // 4 bytes a line
        let cut = cut_diff(&d, 6);
        assert_eq!(cut, "+é\n+\n[diff cut: 5 of 40 bytes shown]\n");
        assert_eq!(cut_diff("abc", 0), "[diff cut: 0 of 3 bytes shown]\n");
    }
}
