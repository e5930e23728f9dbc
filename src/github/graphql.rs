//! GitHub's GraphQL API, for what REST cannot do: marking a draft ready for review, and the
//! review threads of a pull request (a thread, its resolved state and its node id exist only
//! in GraphQL).
//!
//! Every call goes through [`Installation::graphql`]: the installation's client, transport
//! and [`RequestPolicy`] as for REST (timeouts, retries of 502/503/504 and unanswered
//! requests, HTTP rate limits such as the secondary limit's 403), then the answer read as
//! GraphQL answers are. GitHub says most GraphQL failures with HTTP 200 and an `errors` list
//! (`{"type", "message", "path"}`); any error makes the call fail (partial `data` beside it
//! is never used), told apart by GitHub's `type`:
//!
//! - `RATE_LIMITED`, the primary GraphQL limit, is what REST's 403 with
//!   `x-ratelimit-remaining: 0` is, and is handled the same way: a reset within
//!   [`RequestPolicy::max_rate_limit_wait`] is waited out (at most twice per call), a later
//!   one is [`GitHubError::RateLimited`] with the time to the reset. It is handled here, after
//!   the transport, because the policy decides on HTTP statuses and this one is a 200.
//!   Retrying is safe for mutations too: GitHub ran nothing.
//! - `NOT_FOUND` is [`GitHubError::NotFound`].
//! - `FORBIDDEN`, or GitHub's "Resource not accessible by integration" without a type, is
//!   [`GitHubError::Forbidden`]: the App's token may not do it (callers say "refused").
//! - Anything else is [`GitHubError::Http`] with status 200 and GitHub's first three
//!   messages, each one line of at most 300 characters.
//!
//! Answers are read into `Deserialize` structs; a missing field is a `Decode` error naming it.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::http; // the `http` crate, which octocrab's raw request API speaks
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Value};

use super::error::{one_line, GitHubError};
use super::policy::{Raw, RequestPolicy};
use super::transport::{self, Call, JSON};
use super::types::RepoName;
use super::wire;
use super::Installation;

/// Review threads asked for per page (the `first:` of [`REVIEW_THREADS`]).
const THREADS_PER_PAGE: usize = 50;
/// Pages of review threads read at most (2,000 threads).
const MAX_THREAD_PAGES: usize = 40;
/// Unresolved threads kept; the others are counted in [`ReviewThreads::left_out`].
const MAX_THREADS: usize = 100;
/// The latest comments of a thread read beside its opening one (the `last:` of
/// [`REVIEW_THREADS`]).
const RECENT_COMMENTS: usize = 20;
/// A comment body or diff hunk is cut past this many bytes.
const MAX_TEXT_BYTES: usize = 8 * 1024;
/// GitHub's error messages shown in an error.
const MAX_MESSAGES: usize = 3;

/// The unresolved review threads of a pull request.
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewThreads {
    /// In GitHub's order (oldest first), at most 100.
    pub threads: Vec<ReviewThread>,
    /// Unresolved threads not in `threads`: past the first 100, or on pages past the bound of
    /// 40 pages (threads never read count here, as they may be unresolved).
    pub left_out: usize,
}

/// One review thread: a conversation on a line of the diff.
#[derive(Debug, Clone, PartialEq)]
pub struct ReviewThread {
    /// The thread's node id (`PRRT_…`), for replying and resolving.
    pub id: String,
    pub path: String,
    /// The line in the current diff; `None` when the thread is outdated.
    pub line: Option<i64>,
    /// The line in the diff the thread was opened on.
    pub original_line: Option<i64>,
    pub is_outdated: bool,
    pub viewer_can_resolve: bool,
    pub viewer_can_reply: bool,
    /// The opening comment's diff hunk (it ends at the commented line), its last 8 KiB.
    pub diff_hunk: String,
    /// The opening comment and the latest 20, oldest first, each once.
    pub comments: Vec<ThreadComment>,
    /// Comments in the thread, shown or not.
    pub comments_total: usize,
}

/// One comment of a review thread.
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadComment {
    /// The author's login, `ghost` for a deleted account.
    pub author: String,
    /// The author is a bot (an App), such as kodx itself.
    pub author_is_bot: bool,
    /// At most 8 KiB; a longer body is cut and says so on its last line.
    pub body: String,
    pub created_at: String,
    pub url: String,
}

/// Every page of threads, with the opening comment (its diff hunk too) and the latest ones.
/// The comment fields are a fragment so that both selections ask for the same ones.
const REVIEW_THREADS: &str = "\
query ReviewThreads($owner: String!, $name: String!, $number: Int!, $cursor: String) {
  repository(owner: $owner, name: $name) {
    pullRequest(number: $number) {
      reviewThreads(first: 50, after: $cursor) {
        totalCount
        pageInfo { hasNextPage endCursor }
        nodes {
          id isResolved isOutdated path line originalLine viewerCanResolve viewerCanReply
          opening: comments(first: 1) { nodes { ...ThreadComment diffHunk } }
          recent: comments(last: 20) { totalCount nodes { ...ThreadComment } }
        }
      }
    }
  }
}
fragment ThreadComment on PullRequestReviewComment {
  id author { login __typename } body createdAt url
}";

const REPLY: &str = "\
mutation ReplyToReviewThread($id: ID!, $body: String!) {
  addPullRequestReviewThreadReply(input: {pullRequestReviewThreadId: $id, body: $body}) {
    comment { url }
  }
}";

const RESOLVE: &str = "\
mutation ResolveReviewThread($id: ID!) {
  resolveReviewThread(input: {threadId: $id}) { thread { id isResolved } }
}";

const MARK_READY: &str = "\
mutation MarkReadyForReview($id: ID!) {
  markPullRequestReadyForReview(input: {pullRequestId: $id}) { pullRequest { id isDraft } }
}";

impl Installation {
    /// Runs one GraphQL document with `variables` and reads its `data` as `T`; `what` names
    /// the call in errors and logs. See the module's documentation for the errors.
    pub(crate) async fn graphql<T: DeserializeOwned>(
        &self,
        what: &str,
        query: &str,
        variables: Value,
    ) -> Result<T, GitHubError> {
        let (_, policy, _) = self.graphql_channel();
        self.graphql_under(policy, what, query, variables).await
    }

    /// [`graphql`](Self::graphql) with a single attempt: for a mutation that must not be sent
    /// twice (a request that got no answer may have been carried out). A GraphQL rate limit
    /// is still waited for: GitHub ran nothing then.
    async fn graphql_once<T: DeserializeOwned>(
        &self,
        what: &str,
        query: &str,
        variables: Value,
    ) -> Result<T, GitHubError> {
        let (_, policy, _) = self.graphql_channel();
        let once = RequestPolicy {
            max_attempts: 1,
            ..policy.clone()
        };
        self.graphql_under(&once, what, query, variables).await
    }

    async fn graphql_under<T: DeserializeOwned>(
        &self,
        policy: &RequestPolicy,
        what: &str,
        query: &str,
        variables: Value,
    ) -> Result<T, GitHubError> {
        let (octo, _, endpoint) = self.graphql_channel();
        let what = format!("POST graphql {what}");
        let body = json!({ "query": query, "variables": variables });
        let mut waits = 0;
        loop {
            let call = Call {
                what: &what,
                method: http::Method::POST,
                path: endpoint,
                query: None,
                accept: JSON,
                body: Some(&body),
                jwt: None,
                max_body: transport::MAX_ANSWER_BYTES,
                guard: self.write_guard(),
            };
            let raw = transport::send(octo, policy, call).await?;
            let reset_in = match read_answer(&raw, &what) {
                Ok(data) => return Ok(data),
                Err(Refusal::Failed(e)) => return Err(e),
                Err(Refusal::RateLimited) => rate_limit_reset(&raw),
            };
            if reset_in > policy.max_rate_limit_wait || waits >= 2 {
                return Err(GitHubError::RateLimited { what, reset_in });
            }
            waits += 1;
            tracing::warn!(%what, wait_s = reset_in.as_secs(), "GitHub GraphQL rate limit; waiting");
            tokio::time::sleep(reset_in).await;
        }
    }

    /// The unresolved review threads of pull request `pr`, oldest first: every page of 50
    /// (at most 40 pages), resolved threads skipped, at most 100 kept (the rest counted in
    /// `left_out`). Each thread has its opening comment and its latest 20, each body at most
    /// 8 KiB. A repository or pull request the installation cannot see is `NotFound`.
    pub async fn unresolved_review_threads(
        &self,
        repo: &RepoName,
        pr: u64,
    ) -> Result<ReviewThreads, GitHubError> {
        let mut out = ReviewThreads {
            threads: Vec::new(),
            left_out: 0,
        };
        let (mut cursor, mut read, mut total) = (None::<String>, 0, 0);
        for _ in 0..MAX_THREAD_PAGES {
            let variables = json!({
                "owner": repo.owner, "name": repo.name, "number": pr, "cursor": cursor,
            });
            let data: ThreadsData = self
                .graphql("reviewThreads", REVIEW_THREADS, variables)
                .await?;
            let page = data.page(repo, pr)?;
            total = page.total_count;
            for node in page
                .nodes
                .into_iter()
                .flatten()
                .flatten()
                .take(THREADS_PER_PAGE)
            {
                read += 1;
                if node.is_resolved {
                    continue;
                }
                if out.threads.len() < MAX_THREADS {
                    out.threads.push(node.into_thread());
                } else {
                    out.left_out += 1;
                }
            }
            match page.page_info.end_cursor {
                Some(next) if page.page_info.has_next_page && cursor.as_ref() != Some(&next) => {
                    cursor = Some(next)
                }
                _ => break,
            }
        }
        // Threads on pages not read (past the bound) may be unresolved: counted as left out.
        out.left_out += total.saturating_sub(read);
        Ok(out)
    }

    /// Replies in a review thread (`addPullRequestReviewThreadReply`); returns the new
    /// comment's URL. Sent once: a reply whose answer was lost is not posted again.
    pub async fn reply_to_review_thread(
        &self,
        thread_id: &str,
        body: &str,
    ) -> Result<String, GitHubError> {
        let what = "addPullRequestReviewThreadReply";
        let data: ReplyData = self
            .graphql_once(what, REPLY, json!({ "id": thread_id, "body": body }))
            .await?;
        data.add_pull_request_review_thread_reply
            .and_then(|p| p.comment)
            .map(|c| c.url)
            .ok_or_else(|| {
                GitHubError::decode(&format!("POST graphql {what}"), "no comment in the answer")
            })
    }

    /// Resolves a review thread (`resolveReviewThread`). A token that may not resolve it is
    /// `Forbidden` ("Resource not accessible by integration").
    pub async fn resolve_review_thread(&self, thread_id: &str) -> Result<(), GitHubError> {
        let what = "resolveReviewThread";
        let data: ResolveData = self
            .graphql(what, RESOLVE, json!({ "id": thread_id }))
            .await?;
        match data.resolve_review_thread.and_then(|p| p.thread) {
            Some(t) if t.is_resolved => Ok(()),
            _ => Err(GitHubError::decode(
                &format!("POST graphql {what}"),
                "the answer does not say the thread is resolved",
            )),
        }
    }

    /// Marks a draft pull request ready for review. GitHub does this over GraphQL only
    /// (`markPullRequestReadyForReview`, by the pull request's node id).
    pub async fn mark_ready_for_review(&self, node_id: &str) -> Result<(), GitHubError> {
        let what = "markPullRequestReadyForReview";
        let data: MarkReadyData = self
            .graphql(what, MARK_READY, json!({ "id": node_id }))
            .await?;
        match data
            .mark_pull_request_ready_for_review
            .and_then(|p| p.pull_request)
        {
            Some(p) if !p.is_draft => Ok(()),
            _ => Err(GitHubError::decode(
                &format!("POST graphql {what}"),
                "the answer does not say the pull request is ready",
            )),
        }
    }
}

// -------------------------------------------------------------------------------------
// Reading answers
// -------------------------------------------------------------------------------------

/// Why an answer has no usable `data`.
#[derive(Debug)]
enum Refusal {
    /// GitHub's GraphQL rate limit: wait for the reset, or give up.
    RateLimited,
    Failed(GitHubError),
}

impl From<GitHubError> for Refusal {
    fn from(e: GitHubError) -> Refusal {
        Refusal::Failed(e)
    }
}

/// A GraphQL answer: `data`, `errors`, or both.
#[derive(Deserialize)]
struct Answer {
    #[serde(default)]
    data: Option<Value>,
    #[serde(default)]
    errors: Option<Vec<WireError>>,
}

#[derive(Deserialize)]
struct WireError {
    #[serde(rename = "type", default)]
    kind: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

/// The `data` of a 2xx answer as `T`, or why there is none.
fn read_answer<T: DeserializeOwned>(raw: &Raw, what: &str) -> Result<T, Refusal> {
    let answer: Answer = wire::decode(&raw.json(what)?, what)?;
    if let Some(errors) = answer.errors.filter(|e| !e.is_empty()) {
        return Err(refusal(&errors, what));
    }
    match answer.data {
        Some(data) if !data.is_null() => Ok(wire::decode(&data, what)?),
        _ => Err(GitHubError::decode(what, "the answer has no `data` and no `errors`").into()),
    }
}

/// The error GitHub's `errors` list stands for (see the module's documentation).
fn refusal(errors: &[WireError], what: &str) -> Refusal {
    let of_kind = |kind: &str| errors.iter().find(|e| e.kind.as_deref() == Some(kind));
    if of_kind("RATE_LIMITED").is_some() {
        return Refusal::RateLimited;
    }
    let what = what.to_string();
    if let Some(e) = of_kind("NOT_FOUND") {
        let message = one_line(e.message.as_deref().unwrap_or("NOT_FOUND"));
        return GitHubError::NotFound {
            what: format!("{what} ({message})"),
        }
        .into();
    }
    let message = messages(errors);
    let refused = errors.iter().any(|e| {
        e.kind.as_deref() == Some("FORBIDDEN")
            || e.message
                .as_deref()
                .is_some_and(|m| m.contains("Resource not accessible by integration"))
    });
    if refused {
        return GitHubError::Forbidden { what, message }.into();
    }
    GitHubError::Http {
        what,
        status: 200,
        message: format!("GraphQL errors: {message}"),
    }
    .into()
}

/// GitHub's first messages, each one line of at most 300 characters, and how many more.
fn messages(errors: &[WireError]) -> String {
    let mut shown: Vec<String> = errors
        .iter()
        .take(MAX_MESSAGES)
        .map(|e| match (&e.kind, &e.message) {
            (Some(kind), Some(m)) => one_line(&format!("{kind}: {m}")),
            (None, Some(m)) => one_line(m),
            (kind, None) => kind.clone().unwrap_or_else(|| "(no message)".into()),
        })
        .collect();
    if errors.len() > MAX_MESSAGES {
        shown.push(format!("and {} more", errors.len() - MAX_MESSAGES));
    }
    shown.join("; ")
}

/// How long until GitHub's GraphQL limit resets, read from the headers as the REST layer
/// reads a primary limit: `retry-after`, else `x-ratelimit-reset` plus a second (the reset is
/// a whole second and clocks differ a little), else a minute.
fn rate_limit_reset(raw: &Raw) -> Duration {
    let number = |name: &str| raw.header(name).and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(secs) = number("retry-after") {
        return Duration::from_secs(secs);
    }
    match number("x-ratelimit-reset") {
        Some(reset) => {
            let now = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_secs();
            Duration::from_secs(reset.saturating_sub(now).max(1) + 1)
        }
        None => Duration::from_secs(60),
    }
}

// -------------------------------------------------------------------------------------
// Review threads as GitHub sends them
// -------------------------------------------------------------------------------------

/// GraphQL lists are nullable, and so are their items.
type Nodes<T> = Option<Vec<Option<T>>>;

#[derive(Deserialize)]
struct ThreadsData {
    repository: Option<RepoNode>,
}

impl ThreadsData {
    /// The page of threads; a repository or pull request that is `null` is not found.
    fn page(self, repo: &RepoName, pr: u64) -> Result<ThreadPage, GitHubError> {
        self.repository
            .and_then(|r| r.pull_request)
            .map(|p| p.review_threads)
            .ok_or_else(|| GitHubError::NotFound {
                what: format!("POST graphql reviewThreads ({repo}#{pr})"),
            })
    }
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct RepoNode {
    pull_request: Option<PullNode>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PullNode {
    review_threads: ThreadPage,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ThreadPage {
    total_count: usize,
    page_info: PageInfo,
    nodes: Nodes<ThreadNode>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct PageInfo {
    has_next_page: bool,
    end_cursor: Option<String>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ThreadNode {
    id: String,
    is_resolved: bool,
    is_outdated: bool,
    path: String,
    line: Option<i64>,
    original_line: Option<i64>,
    viewer_can_resolve: bool,
    viewer_can_reply: bool,
    opening: CommentPage,
    recent: CommentPage,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CommentPage {
    /// Asked for on `recent` only.
    #[serde(default)]
    total_count: Option<usize>,
    nodes: Nodes<CommentNode>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CommentNode {
    id: String,
    /// `null` for a deleted account.
    author: Option<Author>,
    body: String,
    created_at: String,
    url: String,
    /// Asked for on the opening comment only.
    #[serde(default)]
    diff_hunk: Option<String>,
}

#[derive(Deserialize)]
struct Author {
    login: String,
    #[serde(rename = "__typename")]
    typename: String,
}

impl ThreadNode {
    /// The thread with its opening comment and the latest ones, each once, oldest first.
    fn into_thread(self) -> ReviewThread {
        let opening = self.opening.nodes.into_iter().flatten().flatten().next();
        let mut recent: Vec<CommentNode> =
            self.recent.nodes.into_iter().flatten().flatten().collect();
        // The latest ones, should an answer hold more than was asked.
        recent.drain(..recent.len().saturating_sub(RECENT_COMMENTS));
        let diff_hunk = opening
            .as_ref()
            .and_then(|c| c.diff_hunk.as_deref())
            .map(hunk_tail)
            .unwrap_or_default();
        let mut comments = Vec::with_capacity(RECENT_COMMENTS + 1);
        match opening {
            Some(first) if !recent.iter().any(|c| c.id == first.id) => comments.push(first),
            _ => {}
        }
        comments.extend(recent);
        let comments_total = self.recent.total_count.unwrap_or(0).max(comments.len());
        ReviewThread {
            id: self.id,
            path: self.path,
            line: self.line,
            original_line: self.original_line,
            is_outdated: self.is_outdated,
            viewer_can_resolve: self.viewer_can_resolve,
            viewer_can_reply: self.viewer_can_reply,
            diff_hunk,
            comments: comments.into_iter().map(ThreadComment::from).collect(),
            comments_total,
        }
    }
}

impl From<CommentNode> for ThreadComment {
    fn from(c: CommentNode) -> ThreadComment {
        let (author, author_is_bot) = match c.author {
            Some(a) => (a.login, a.typename == "Bot"),
            None => ("ghost".to_string(), false),
        };
        ThreadComment {
            author,
            author_is_bot,
            body: body_head(c.body),
            created_at: c.created_at,
            url: c.url,
        }
    }
}

/// `body` cut to [`MAX_TEXT_BYTES`] on a character boundary, saying so on a last line.
fn body_head(body: String) -> String {
    if body.len() <= MAX_TEXT_BYTES {
        return body;
    }
    let mut end = MAX_TEXT_BYTES;
    while !body.is_char_boundary(end) {
        end -= 1;
    }
    format!(
        "{}\n[comment cut: {end} of {} bytes shown]",
        &body[..end],
        body.len()
    )
}

/// The end of a diff hunk (the commented line is its last) within [`MAX_TEXT_BYTES`], saying
/// so on a first line when cut.
fn hunk_tail(hunk: &str) -> String {
    if hunk.len() <= MAX_TEXT_BYTES {
        return hunk.to_string();
    }
    let mut start = hunk.len() - MAX_TEXT_BYTES;
    while !hunk.is_char_boundary(start) {
        start += 1;
    }
    format!(
        "[diff hunk cut: the last {} of {} bytes shown]\n{}",
        hunk.len() - start,
        hunk.len(),
        &hunk[start..]
    )
}

// -------------------------------------------------------------------------------------
// The mutations' answers
// -------------------------------------------------------------------------------------

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ReplyData {
    add_pull_request_review_thread_reply: Option<ReplyPayload>,
}

#[derive(Deserialize)]
struct ReplyPayload {
    comment: Option<CommentUrl>,
}

#[derive(Deserialize)]
struct CommentUrl {
    url: String,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResolveData {
    resolve_review_thread: Option<ResolvePayload>,
}

#[derive(Deserialize)]
struct ResolvePayload {
    thread: Option<ResolvedThread>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct ResolvedThread {
    is_resolved: bool,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MarkReadyData {
    mark_pull_request_ready_for_review: Option<MarkReadyPayload>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct MarkReadyPayload {
    pull_request: Option<DraftState>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct DraftState {
    is_draft: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderMap;
    use bytes::Bytes;

    fn raw(headers: &[(&'static str, String)], body: Value) -> Raw {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.insert(*k, v.parse().unwrap());
        }
        Raw {
            status: 200,
            headers: h,
            body: Bytes::from(body.to_string()),
            cut: false,
        }
    }

    fn failed(body: Value) -> GitHubError {
        match read_answer::<Value>(&raw(&[], body), "POST graphql x") {
            Err(Refusal::Failed(e)) => e,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn errors_carry_githubs_first_three_messages_bounded() {
        let long = "y".repeat(1000);
        let e = failed(json!({ "errors": [
            { "message": "Field 'x' doesn't exist on type 'Query'", "locations": [{"line": 1, "column": 3}] },
            { "type": "UNPROCESSABLE", "message": long },
            { "message": "third\nline" },
            { "message": "fourth" },
            { "message": "fifth" },
        ]}));
        let GitHubError::Http {
            status: 200,
            ref message,
            ..
        } = e
        else {
            panic!("{e}")
        };
        assert!(
            message.starts_with("GraphQL errors: Field 'x' doesn't exist"),
            "{message}"
        );
        assert!(message.contains("UNPROCESSABLE: yyy"), "{message}");
        assert!(message.contains("third line; and 2 more"), "{message}");
        assert!(!message.contains("fourth"), "{message}");
        assert!(message.chars().count() < 3 * 302 + 40, "{message}");
    }

    #[test]
    fn not_found_and_forbidden_are_their_variants() {
        let e = failed(json!({ "data": { "node": null }, "errors": [{
            "type": "NOT_FOUND", "path": ["node"],
            "message": "Could not resolve to a node with the global id of 'PRRT_9'",
        }]}));
        assert!(e.is_not_found(), "{e}");
        assert!(e.to_string().contains("PRRT_9"), "{e}");
        let e = failed(
            json!({ "data": { "resolveReviewThread": null }, "errors": [{
                "type": "FORBIDDEN", "path": ["resolveReviewThread"],
                "message": "Resource not accessible by integration",
            }]}),
        );
        assert!(
            matches!(&e, GitHubError::Forbidden { message, .. } if message.contains("not accessible")),
            "{e}"
        );
        let e =
            failed(json!({ "errors": [{ "message": "Resource not accessible by integration" }]}));
        assert!(matches!(e, GitHubError::Forbidden { .. }), "{e}");
    }

    #[test]
    fn rate_limited_waits_for_the_reset_in_the_headers() {
        let body = json!({ "errors": [{ "type": "RATE_LIMITED", "code": "graphql_rate_limit",
            "message": "API rate limit exceeded for installation ID 77." }]});
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let limited = raw(
            &[
                ("x-ratelimit-remaining", "0".into()),
                ("x-ratelimit-reset", (now + 30).to_string()),
            ],
            body.clone(),
        );
        assert!(matches!(
            read_answer::<Value>(&limited, "w"),
            Err(Refusal::RateLimited)
        ));
        let wait = rate_limit_reset(&limited);
        assert!(
            (Duration::from_secs(30)..=Duration::from_secs(32)).contains(&wait),
            "{wait:?}"
        );
        let after = raw(&[("retry-after", "7".into())], body.clone());
        assert_eq!(rate_limit_reset(&after), Duration::from_secs(7));
        assert_eq!(rate_limit_reset(&raw(&[], body)), Duration::from_secs(60));
    }

    #[test]
    fn data_null_or_missing_is_a_decode_error() {
        for body in [json!({ "data": null }), json!({}), json!({ "errors": [] })] {
            let e = failed(body);
            assert!(matches!(e, GitHubError::Decode { .. }), "{e}");
        }
        let e = failed(json!({ "data": { "x": 1 }, "errors": "not a list" }));
        assert!(matches!(e, GitHubError::Decode { .. }), "{e}");
        let ok: Value = read_answer(&raw(&[], json!({ "data": { "x": 1 } })), "w").unwrap();
        assert_eq!(ok, json!({ "x": 1 }));
        // Typed: a field of the wrong type names the field.
        let e = match read_answer::<ResolveData>(
            &raw(
                &[],
                json!({ "data": { "resolveReviewThread": { "thread": { "isResolved": "yes" } } } }),
            ),
            "POST graphql resolveReviewThread",
        ) {
            Err(Refusal::Failed(e)) => e,
            other => panic!("{:?}", other.map(|_| ())),
        };
        assert!(e.to_string().contains("isResolved"), "{e}");
    }

    fn comment(id: &str, author: Value, body: &str) -> Value {
        json!({ "id": id, "author": author, "body": body, "createdAt": "2025-01-01T00:00:00Z",
                "url": format!("https://github.com/o/r/pull/1#discussion_{id}") })
    }

    #[test]
    fn a_thread_has_its_opening_comment_and_the_latest_once() {
        let alice = json!({ "login": "alice", "__typename": "User" });
        let bot = json!({ "login": "kodx[bot]", "__typename": "Bot" });
        let mut opening = comment("c1", alice.clone(), "why?");
        opening["diffHunk"] = json!(format!("@@ -1 +1 @@\n{}+é end", "+x\n".repeat(4000)));
        let recent: Vec<Value> = (280..300)
            .map(|i| {
                comment(
                    &format!("c{i}"),
                    if i % 2 == 0 { bot.clone() } else { Value::Null },
                    "ok",
                )
            })
            .collect();
        let node: ThreadNode = serde_json::from_value(json!({
            "id": "PRRT_1", "isResolved": false, "isOutdated": true, "path": "src/a.rs",
            "line": null, "originalLine": 7, "viewerCanResolve": true, "viewerCanReply": true,
            "opening": { "nodes": [opening] },
            "recent": { "totalCount": 300, "nodes": recent },
        }))
        .unwrap();
        let t = node.into_thread();
        assert_eq!(t.comments.len(), 21);
        assert_eq!(t.comments_total, 300);
        assert_eq!(
            (t.comments[0].author.as_str(), t.comments[0].author_is_bot),
            ("alice", false)
        );
        assert_eq!(
            (t.comments[1].author.as_str(), t.comments[1].author_is_bot),
            ("kodx[bot]", true)
        );
        assert_eq!(t.comments[2].author, "ghost");
        assert!(
            t.diff_hunk.starts_with("[diff hunk cut: the last 8"),
            "{}",
            &t.diff_hunk[..60]
        );
        assert!(t.diff_hunk.ends_with("+é end"));
        assert!(t.diff_hunk.len() <= MAX_TEXT_BYTES + 60);
        // A short thread: the opening comment is among the latest, shown once.
        let node: ThreadNode = serde_json::from_value(json!({
            "id": "PRRT_2", "isResolved": false, "isOutdated": false, "path": "b", "line": 1,
            "originalLine": 1, "viewerCanResolve": false, "viewerCanReply": true,
            "opening": { "nodes": [comment("c1", alice.clone(), "a")] },
            "recent": { "totalCount": 2, "nodes": [comment("c1", alice.clone(), "a"), comment("c2", alice, "b")] },
        }))
        .unwrap();
        let t = node.into_thread();
        let bodies: Vec<&str> = t.comments.iter().map(|c| c.body.as_str()).collect();
        assert_eq!(
            (bodies, t.comments_total, t.diff_hunk.as_str()),
            (vec!["a", "b"], 2, "")
        );
    }

    #[test]
    fn bodies_are_cut_on_a_char_boundary() {
        assert_eq!(body_head("short".into()), "short");
        let long = "é".repeat(MAX_TEXT_BYTES); // two bytes each
        let cut = body_head(long);
        let (text, marker) = cut.rsplit_once('\n').unwrap();
        assert_eq!(text.len(), MAX_TEXT_BYTES);
        assert_eq!(
            marker,
            format!(
                "[comment cut: {MAX_TEXT_BYTES} of {} bytes shown]",
                2 * MAX_TEXT_BYTES
            )
        );
        let odd = format!("a{}", "é".repeat(MAX_TEXT_BYTES));
        let (text, _) = body_head(odd)
            .rsplit_once('\n')
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .unwrap();
        assert_eq!(text.len(), MAX_TEXT_BYTES - 1);
    }

    #[test]
    fn the_documents_ask_for_the_bounds_the_reader_expects() {
        let squashed = REVIEW_THREADS
            .split_whitespace()
            .collect::<Vec<_>>()
            .join(" ");
        assert!(squashed.contains(&format!(
            "reviewThreads(first: {THREADS_PER_PAGE}, after: $cursor)"
        )));
        assert!(squashed.contains(&format!("recent: comments(last: {RECENT_COMMENTS})")));
        assert!(squashed.contains("opening: comments(first: 1)"));
    }
}
