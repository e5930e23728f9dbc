//! A stateful fake GitHub REST API on loopback, for tests of the GitHub App client and the
//! server. It follows GitHub's shapes (field names, status codes, `{"message",
//! "documentation_url", "status"}` errors, `Link` pagination) and checks credentials for
//! real: App endpoints verify the RS256 JWT against `tests/data/test-app-key.pub.pem`, every
//! other endpoint wants an installation token it issued, unexpired, for the repository's
//! installation, minted for that repository (`repositories`; else 404) and holding the
//! permission the endpoint needs (`permissions`; else 403 "Resource not accessible by
//! integration"). A token minted without `repositories`/`permissions` has every repository
//! of its installation and every permission of the App. A request that is malformed (bad JSON, a missing or wrong field, an unknown
//! reaction, an unknown path or method, no `User-Agent`) is answered as GitHub would and
//! recorded in `refused()`; tests assert that list is empty.
//!
//! Test API (all methods are synchronous; the server runs on the test's runtime):
//!
//! - `FakeGitHub::start(app_id).await`, `FakeGitHub::start_with_prefix(app_id, "/api/v3")`
//!   (GitHub Enterprise layout); `url()` is the API base to give the client, `root()` the
//!   host part; `TEST_APP_KEY` is the App's private key (PKCS#1 PEM).
//! - App: `slug()` (default `kodx`), `set_slug(..)`, `bot_login()` (`<slug>[bot]`).
//! - State: `add_installation(id, account)`, `add_repo(installation, "owner/name",
//!   default_branch, clone_url, private)`, `set_permission(repo, user, "admin" | "maintain" |
//!   "write" | "triage" | "read" | "none")`, `set_file(repo, path, text)`,
//!   `set_file_bytes(repo, path, bytes)`, `add_issue(repo, number, title, body, author)`
//!   (an empty body is served as `null`), `add_pull(repo, number, title, body, author,
//!   FakeHead { ref_name, sha, repo: Option<full name>, clone_url }, FakeBase { ref_name, sha },
//!   diff)` (a PR is also an issue), `add_comment(repo, number, author, body, is_bot) -> id`,
//!   `add_review_comment(repo, pull, author, body) -> id`, `close_pull(repo, number)`,
//!   `add_user(login, id)` (served by `GET /users/{login}`), `set_bot_user_id(id)` (the
//!   bot `<slug>[bot]` is always served, with an id of its own unless set).
//! - Branches (for `POST /pulls`): `set_branch_exists(|repo, branch| -> bool)` or
//!   `set_branch_sha(|repo, branch| -> Option<sha>)` (e.g. the git server's `branch_sha`);
//!   with neither, every branch exists. `repo` is the full name as given to `add_repo`.
//!   A head whose sha equals the base's is GitHub's 422 "No commits between BASE and HEAD".
//! - Behaviour: `set_token_lifetime(Duration)` (default 1 h), `fail_next(path_prefix,
//!   status, count)` (the next `count` requests whose path, without the API prefix, starts
//!   with `path_prefix` get `status`), `fail_after_next(path_prefix, status)` (the next such
//!   request is carried out, then answered `status`: a POST that GitHub performed but whose
//!   answer was lost), `hold_next(method, path, query) -> HeldRequest` (the next such
//!   request is recorded, then held until `release()`; `arrived(timeout).await` waits for
//!   it), `set_rate_limited(Some(reset_in) | None)` (installation
//!   calls answer 403 with `x-ratelimit-remaining: 0` until the reset), `revoke_tokens()`.
//! - Observations: `comments(repo, number) -> Vec<FakeComment { id, user, body, is_bot,
//!   edits }>` (`edits`: the bodies PATCHed in, in order), `reactions() -> Vec<(target,
//!   content, by)>` (target like `o/r/issues/comments/5`, `o/r/pulls/comments/6`,
//!   `o/r/issues/7`), `requests() -> Vec<FakeRequest { method, path, query, authorization,
//!   body, headers }>` (everything received, in order), `created_pulls(repo) ->
//!   Vec<FakePull { number, title, head, base, body, draft, edits }>` (pull requests opened
//!   through the API, by number), `refused() -> Vec<String>`,
//!   `unauthorized() -> Vec<String>` (401s given, with the reason), `issued_tokens()`,
//!   `token_grants() -> Vec<TokenGrant { token, installation, repositories, permissions }>`
//!   (what each mint asked for), `forbidden() -> Vec<String>` (requests refused for a
//!   token's scope, REST and git).
//! - `all_comments(repo) -> Vec<(number, FakeComment)>`.
//! - Waiting: `changed()` is a `watch::Receiver` woken after every request handled and
//!   every comment added; `is_pull(repo, number)`.
//! - Git: `git_access(token, "owner/name", push) -> GitVerdict` tells the git server what a
//!   token may do there (`contents: read` to fetch, `write` to push); `serve::accept_github`
//!   wires it into `GitServer::start`.
//!
//! New endpoints go in `api_routes` with a handler taking `(State, Path, Req)`; handlers use
//! `auth_installation` / `auth_app`, `refuse`, `gh_error` and the `*_json` shape builders.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, OriginalUri, Path, Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::Router;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use rand::Rng;
use serde_json::{json, Value};

/// The test App's private key (PKCS#1, as GitHub hands them out).
pub const TEST_APP_KEY: &str = include_str!("../../data/test-app-key.pem");
const TEST_APP_PUBLIC_KEY: &str = include_str!("../../data/test-app-key.pub.pem");
const DOCS: &str = "https://docs.github.com/rest";
const REACTIONS: [&str; 8] = [
    "+1", "-1", "laugh", "confused", "heart", "hooray", "rocket", "eyes",
];
const MAX_COMMENT_CHARS: usize = 65_536;

#[derive(Clone, Debug)]
pub struct FakeHead {
    pub ref_name: String,
    pub sha: String,
    /// `owner/name` of the head repository; `None` when the fork was deleted.
    pub repo: Option<String>,
    pub clone_url: String,
}

#[derive(Clone, Debug)]
pub struct FakeBase {
    pub ref_name: String,
    pub sha: String,
}

#[derive(Clone, Debug, PartialEq)]
pub struct FakeComment {
    pub id: u64,
    pub user: String,
    pub body: String,
    pub is_bot: bool,
    /// The bodies PATCHed in, in order; `body` is the last of them (or the original).
    pub edits: Vec<String>,
}

/// A pull request opened through `POST /repos/{o}/{r}/pulls`.
#[derive(Clone, Debug, PartialEq)]
pub struct FakePull {
    pub number: u64,
    pub title: String,
    /// The head branch name.
    pub head: String,
    /// The base branch name.
    pub base: String,
    pub body: String,
    pub draft: bool,
    /// The bodies PATCHed in, in order; `body` is the last of them (or the original).
    pub edits: Vec<String>,
}

/// Answers whether a branch exists in a repository, with its sha.
type BranchSha = Arc<dyn Fn(&str, &str) -> Option<String> + Send + Sync>;
type GitDir = Arc<dyn Fn(&str) -> Option<std::path::PathBuf> + Send + Sync>;

#[path = "fake_github_git.rs"]
mod git_view;

#[path = "fake_github_checks.rs"]
mod checks_api;
pub use checks_api::FakeCheckRun;

#[path = "fake_github_ci.rs"]
mod ci_api;
#[allow(unused_imports)] // the binaries that include `common` without these tests
pub use ci_api::{FakeCheckRunSpec, FakeLog, FakeSuite, ACTIONS_SLUG};

#[path = "fake_github_assets.rs"]
mod assets_api;
#[allow(unused_imports)] // the binaries that include `common` without these tests
pub use assets_api::Asset;

#[path = "fake_github_graphql.rs"]
mod graphql_api;
#[allow(unused_imports)] // the binaries that include `common` without these tests
pub use graphql_api::{FakeThread, FakeThreadState};

#[derive(Clone, Debug)]
pub struct FakeRequest {
    pub method: String,
    /// The full path, API prefix included.
    pub path: String,
    pub query: Option<String>,
    pub authorization: Option<String>,
    pub body: String,
    pub headers: HeaderMap,
    /// When it arrived, and how long the fake took to answer it (`None` until it did).
    pub at: std::time::Instant,
    pub took: Option<std::time::Duration>,
}

struct Pull {
    head: FakeHead,
    base: FakeBase,
    diff: String,
    draft: bool,
    /// Opened through the API (`created_pulls`).
    created: bool,
    edits: Vec<String>,
}

struct Issue {
    number: u64,
    title: String,
    body: String,
    author: String,
    pull: Option<Pull>,
    comments: Vec<u64>,
    created_at: String,
    /// `open` or `closed`.
    state: String,
}

struct Repo {
    id: u64,
    full_name: String,
    installation: u64,
    default_branch: String,
    clone_url: String,
    private: bool,
    files: BTreeMap<String, Vec<u8>>,
    permissions: HashMap<String, String>,
    issues: BTreeMap<u64, Issue>,
}

struct Comment {
    id: u64,
    /// Lower-case `owner/name`.
    repo: String,
    issue: u64,
    user: String,
    is_bot: bool,
    body: String,
    edits: Vec<String>,
    created_at: String,
    updated_at: String,
}

struct ReviewComment {
    repo: String,
    pull: u64,
}

struct Reaction {
    id: u64,
    target: String,
    content: String,
    by: String,
    created_at: String,
}

/// A request to hold (`hold_next`): held before it is carried out until released.
struct Hold {
    method: Method,
    /// The path without the API prefix, exactly.
    path: String,
    /// Held only when the query holds this.
    query: String,
    arrived: tokio::sync::watch::Sender<bool>,
    released: tokio::sync::watch::Receiver<bool>,
}

/// A request the fake holds (`hold_next`): the test learns when it arrived and says when
/// it is carried out and answered.
pub struct HeldRequest {
    arrived: tokio::sync::watch::Receiver<bool>,
    release: tokio::sync::watch::Sender<bool>,
}

impl HeldRequest {
    /// Waits (at most `timeout`) until the request arrived and is held.
    pub async fn arrived(&self, timeout: Duration) {
        let mut arrived = self.arrived.clone();
        tokio::time::timeout(timeout, arrived.wait_for(|a| *a))
            .await
            .expect("the held request did not arrive in time")
            .expect("the fake GitHub is running");
    }

    /// Carries the request out and answers it (as GitHub's state is now).
    pub fn release(&self) {
        self.release.send_replace(true);
    }
}

struct Failure {
    path_prefix: String,
    status: u16,
    count: u32,
    /// Carry the request out first, then answer `status`.
    after: bool,
}

struct IssuedToken {
    installation: u64,
    expires_at: SystemTime,
    /// Lower-case full names the token was minted for; `None`: every repository of the
    /// installation.
    repositories: Option<Vec<String>>,
    /// Permission → `read` | `write` (`metadata` always `read`).
    permissions: BTreeMap<String, String>,
}

/// [`FakeGitHub::git_access`]'s answer, for the git server (`git_server::Verdict`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GitVerdict {
    Allow,
    Unauthorized,
    Forbidden,
    NotFound,
}

/// What one `POST /app/installations/{id}/access_tokens` asked for and got.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenGrant {
    pub token: String,
    pub installation: u64,
    /// The `repositories` asked for (names as sent); `None` when the request named none.
    pub repositories: Option<Vec<String>>,
    /// The `permissions` asked for; `None` when the request named none.
    pub permissions: Option<BTreeMap<String, String>>,
}

struct StateInner {
    slug: String,
    installations: BTreeMap<u64, String>,
    /// By lower-case `owner/name` (GitHub names are case-insensitive).
    repos: BTreeMap<String, Repo>,
    comments: BTreeMap<u64, Comment>,
    review_comments: BTreeMap<u64, ReviewComment>,
    reactions: Vec<Reaction>,
    tokens: HashMap<String, IssuedToken>,
    issued: Vec<String>,
    grants: Vec<TokenGrant>,
    /// Requests refused for a token's scope (repository or permission), with the reason.
    forbidden: Vec<String>,
    token_lifetime: Duration,
    failures: Vec<Failure>,
    holds: Vec<Hold>,
    rate_limited_until: Option<SystemTime>,
    requests: Vec<FakeRequest>,
    refused: Vec<String>,
    unauthorized: Vec<String>,
    user_ids: HashMap<String, u64>,
    next_id: u64,
    branch_sha: Option<BranchSha>,
    /// `set_git_dir`: where a repository's commits are read from.
    git_dir: Option<GitDir>,
    /// Check Runs created, in order.
    check_runs: Vec<FakeCheckRun>,
    /// `withhold_checks_permission`: the App was not granted `checks`.
    no_checks: bool,
    actions_read_only: bool,
    /// Check suites, runs, statuses and job logs (`fake_github_ci.rs`).
    ci: ci_api::CiStore,
    bot_user_id: Option<u64>,
    /// `add_user`: by lower-case login, `(login, id)`.
    users: BTreeMap<String, (String, u64)>,
    /// Review threads and the GraphQL endpoint's own state (`fake_github_graphql.rs`).
    graphql: graphql_api::GraphqlState,
    /// The pull requests (number, head, base tip) whose `mergeable` was asked once: GitHub
    /// answers `null` the first time after a change and computes it meanwhile.
    mergeable_asked: std::collections::HashSet<(u64, String, String)>,
    /// Attachments on the web side (`fake_github_assets.rs`).
    assets: assets_api::Assets,
}

impl StateInner {
    fn next_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    fn user_id(&mut self, login: &str) -> u64 {
        if let Some(id) = self.bot_user_id {
            if login == format!("{}[bot]", self.slug) {
                return id;
            }
        }
        if let Some(&id) = self.user_ids.get(login) {
            return id;
        }
        let mut next = 1000 + self.user_ids.len() as u64;
        while self.user_ids.values().any(|&v| v == next) {
            next += 1;
        }
        self.user_ids.insert(login.to_string(), next);
        next
    }
}

struct Shared {
    url: String,
    root: String,
    prefix: String,
    /// The App's id and the key its JWTs are checked with (replaced by a manifest
    /// conversion).
    app: Mutex<(u64, DecodingKey)>,
    /// Manifest flow: codes handed out by the web form, not yet converted.
    manifest_codes: Mutex<HashMap<String, (Value, String)>>,
    state: Mutex<StateInner>,
    /// Bumped after every request handled and every comment added: see `changed()`.
    changes: tokio::sync::watch::Sender<u64>,
}

#[derive(Clone)]
pub struct FakeGitHub {
    inner: Arc<Shared>,
}

impl FakeGitHub {
    pub async fn start(app_id: u64) -> FakeGitHub {
        Self::start_with_prefix(app_id, "").await
    }

    /// Serves the API under `prefix` (e.g. `/api/v3`, as GitHub Enterprise Server does);
    /// requests outside it are refused.
    pub async fn start_with_prefix(app_id: u64, prefix: &str) -> FakeGitHub {
        let prefix = prefix.trim_end_matches('/').to_string();
        assert!(
            prefix.is_empty() || prefix.starts_with('/'),
            "prefix must start with /"
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let root = format!("http://{}", listener.local_addr().unwrap());
        let fake = FakeGitHub {
            inner: Arc::new(Shared {
                url: format!("{root}{prefix}"),
                root,
                prefix: prefix.clone(),
                app: Mutex::new((
                    app_id,
                    DecodingKey::from_rsa_pem(TEST_APP_PUBLIC_KEY.as_bytes())
                        .expect("tests/data/test-app-key.pub.pem"),
                )),
                manifest_codes: Mutex::new(HashMap::new()),
                state: Mutex::new(StateInner {
                    slug: "kodx".into(),
                    installations: BTreeMap::new(),
                    repos: BTreeMap::new(),
                    comments: BTreeMap::new(),
                    review_comments: BTreeMap::new(),
                    reactions: Vec::new(),
                    tokens: HashMap::new(),
                    grants: Vec::new(),
                    forbidden: Vec::new(),
                    issued: Vec::new(),
                    token_lifetime: Duration::from_secs(3600),
                    failures: Vec::new(),
                    holds: Vec::new(),
                    rate_limited_until: None,
                    requests: Vec::new(),
                    refused: Vec::new(),
                    unauthorized: Vec::new(),
                    user_ids: HashMap::new(),
                    next_id: 1_000_000,
                    branch_sha: None,
                    git_dir: None,
                    mergeable_asked: Default::default(),
                    check_runs: Vec::new(),
                    no_checks: false,
                    actions_read_only: false,
                    ci: Default::default(),
                    bot_user_id: None,
                    users: BTreeMap::new(),
                    graphql: Default::default(),
                    assets: Default::default(),
                }),
                changes: tokio::sync::watch::channel(0).0,
            }),
        };
        let api = api_routes()
            .method_not_allowed_fallback(no_such_route)
            .fallback(no_such_route);
        let app = if prefix.is_empty() {
            api
        } else {
            Router::new().nest(&prefix, api).fallback(no_such_route)
        };
        // The web side (github.com itself) is at the root.
        let app = app.merge(web_routes());
        let app = app
            .layer(axum::middleware::from_fn_with_state(fake.clone(), record))
            .with_state(fake.clone());
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        fake
    }

    /// The API base URL (with the prefix, if any).
    pub fn url(&self) -> String {
        self.inner.url.clone()
    }

    /// `http://127.0.0.1:PORT`, without the API prefix.
    pub fn root(&self) -> String {
        self.inner.root.clone()
    }

    pub fn app_id(&self) -> u64 {
        self.inner.app.lock().unwrap().0
    }

    /// A receiver woken whenever the fake's state may have changed: after each request it
    /// handled (a comment created or edited, a reaction, a pull request) and each comment
    /// added by the test. Tests wait on it instead of polling.
    pub fn changed(&self) -> tokio::sync::watch::Receiver<u64> {
        self.inner.changes.subscribe()
    }

    fn notify(&self) {
        self.inner.changes.send_modify(|n| *n += 1);
    }

    /// Whether `number` in `repo` is a pull request.
    pub fn is_pull(&self, repo: &str, number: u64) -> bool {
        self.state()
            .repos
            .get(&repo.to_lowercase())
            .and_then(|r| r.issues.get(&number))
            .is_some_and(|i| i.pull.is_some())
    }

    fn state(&self) -> MutexGuard<'_, StateInner> {
        self.inner.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    // ---------------------------------------------------------------------------------
    // Test API: state
    // ---------------------------------------------------------------------------------

    pub fn slug(&self) -> String {
        self.state().slug.clone()
    }

    pub fn set_slug(&self, slug: &str) {
        self.state().slug = slug.to_string();
    }

    pub fn bot_login(&self) -> String {
        format!("{}[bot]", self.slug())
    }

    pub fn add_installation(&self, id: u64, account: &str) {
        self.state().installations.insert(id, account.to_string());
    }

    pub fn add_repo(
        &self,
        installation: u64,
        full_name: &str,
        default_branch: &str,
        clone_url: &str,
        private: bool,
    ) {
        let mut st = self.state();
        assert!(
            st.installations.contains_key(&installation),
            "add_installation({installation}) first"
        );
        assert!(full_name.split('/').count() == 2, "owner/name");
        let id = st.next_id();
        st.repos.insert(
            full_name.to_lowercase(),
            Repo {
                id,
                full_name: full_name.to_string(),
                installation,
                default_branch: default_branch.to_string(),
                clone_url: clone_url.to_string(),
                private,
                files: BTreeMap::new(),
                permissions: HashMap::new(),
                issues: BTreeMap::new(),
            },
        );
    }

    fn with_repo<T>(&self, repo: &str, f: impl FnOnce(&mut Repo) -> T) -> T {
        let mut st = self.state();
        let r = st
            .repos
            .get_mut(&repo.to_lowercase())
            .unwrap_or_else(|| panic!("add_repo({repo}) first"));
        f(r)
    }

    pub fn set_permission(&self, repo: &str, user: &str, role: &str) {
        assert!(
            ["admin", "maintain", "write", "triage", "read", "none"].contains(&role),
            "unknown role {role}"
        );
        self.with_repo(repo, |r| {
            r.permissions.insert(user.to_lowercase(), role.to_string())
        });
    }

    pub fn set_file(&self, repo: &str, path: &str, contents: &str) {
        self.set_file_bytes(repo, path, contents.as_bytes());
    }

    pub fn set_file_bytes(&self, repo: &str, path: &str, contents: &[u8]) {
        self.with_repo(repo, |r| {
            r.files
                .insert(path.trim_matches('/').to_string(), contents.to_vec())
        });
    }

    pub fn add_issue(&self, repo: &str, number: u64, title: &str, body: &str, author: &str) {
        self.insert_issue(repo, number, title, body, author, None);
    }

    #[allow(clippy::too_many_arguments)]
    pub fn add_pull(
        &self,
        repo: &str,
        number: u64,
        title: &str,
        body: &str,
        author: &str,
        head: FakeHead,
        base: FakeBase,
        diff: &str,
    ) {
        let pull = Pull {
            head,
            base,
            diff: diff.to_string(),
            draft: false,
            created: false,
            edits: Vec::new(),
        };
        self.insert_issue(repo, number, title, body, author, Some(pull));
    }

    fn insert_issue(
        &self,
        repo: &str,
        number: u64,
        title: &str,
        body: &str,
        author: &str,
        pull: Option<Pull>,
    ) {
        self.with_repo(repo, |r| {
            r.issues.insert(
                number,
                Issue {
                    number,
                    title: title.to_string(),
                    body: body.to_string(),
                    author: author.to_string(),
                    pull,
                    comments: Vec::new(),
                    created_at: iso8601(SystemTime::now()),
                    state: "open".into(),
                },
            )
        });
    }

    /// Closes an issue or pull request (`state: closed`): it no longer counts as open.
    pub fn close_pull(&self, repo: &str, number: u64) {
        self.with_repo(repo, |r| {
            r.issues
                .get_mut(&number)
                .unwrap_or_else(|| panic!("no issue or pull request {number}"))
                .state = "closed".into()
        });
    }

    /// A user `GET /users/{login}` knows, with its id (also used in every other answer
    /// that shows this user).
    pub fn add_user(&self, login: &str, id: u64) {
        let mut st = self.state();
        st.user_ids.insert(login.to_string(), id);
        st.users
            .insert(login.to_lowercase(), (login.to_string(), id));
    }

    /// The id of the App's bot user `<slug>[bot]` everywhere it appears.
    pub fn set_bot_user_id(&self, id: u64) {
        self.state().bot_user_id = Some(id);
    }

    /// Which branches exist, for `POST /pulls` (`repo` as given to `add_repo`); a branch
    /// that exists gets a sha made from its name.
    pub fn set_branch_exists(&self, exists: impl Fn(&str, &str) -> bool + Send + Sync + 'static) {
        self.state().branch_sha = Some(Arc::new(move |repo: &str, branch: &str| {
            exists(repo, branch).then(|| fake_sha(format!("{repo}:{branch}").as_bytes()))
        }));
    }

    /// Which branches exist and at which commit, for `POST /pulls`: the head and base
    /// shas of a new pull request come from here.
    pub fn set_branch_sha(
        &self,
        sha: impl Fn(&str, &str) -> Option<String> + Send + Sync + 'static,
    ) {
        self.state().branch_sha = Some(Arc::new(sha));
    }

    /// Where the commits of a repository (full name as given to `add_repo`) are: its bare
    /// repository on the git server. Branches, trees, blobs and `contents` at a ref are
    /// read from it; `set_file` files still answer `contents` on the default branch.
    pub fn set_git_dir(
        &self,
        dir: impl Fn(&str) -> Option<std::path::PathBuf> + Send + Sync + 'static,
    ) {
        self.state().git_dir = Some(Arc::new(dir));
    }

    /// The Check Runs created through `POST …/check-runs`, in order.
    pub fn check_runs(&self) -> Vec<FakeCheckRun> {
        self.state().check_runs.clone()
    }

    /// The installation was not granted the Checks permission: a token asking for it is
    /// refused (422), as GitHub refuses it.
    pub fn withhold_checks_permission(&self) {
        self.state().no_checks = true;
    }

    /// The installation was granted GitHub Actions read only (as before Actions write was
    /// asked for): a token asking for `actions: write` is refused (422).
    pub fn grant_actions_read_only(&self) {
        self.state().actions_read_only = true;
    }

    /// The tip of `branch` of the repository `key` (lower-case `owner/name`): from the
    /// branch hooks, else the git directory; with neither, every branch exists.
    fn branch_tip(&self, key: &str, branch: &str) -> Option<String> {
        let (full_name, hook, has_git) = {
            let st = self.state();
            let r = st.repos.get(key)?;
            (
                r.full_name.clone(),
                st.branch_sha.clone(),
                st.git_dir.is_some(),
            )
        };
        match hook {
            Some(f) => f(&full_name, branch),
            None if has_git => git_view::branch_tip_from_git(self, key, branch),
            None => Some(fake_sha(format!("{full_name}:{branch}").as_bytes())),
        }
    }

    /// A comment written by someone (`is_bot`: `user.type == "Bot"`); returns its id.
    pub fn add_comment(
        &self,
        repo: &str,
        number: u64,
        author: &str,
        body: &str,
        is_bot: bool,
    ) -> u64 {
        let mut st = self.state();
        let key = repo.to_lowercase();
        assert!(
            st.repos
                .get(&key)
                .is_some_and(|r| r.issues.contains_key(&number)),
            "add_issue({repo}, {number}) first"
        );
        let id = st.next_id();
        let now = iso8601(SystemTime::now());
        st.comments.insert(
            id,
            Comment {
                id,
                repo: key.clone(),
                issue: number,
                user: author.to_string(),
                is_bot,
                body: body.to_string(),
                edits: Vec::new(),
                created_at: now.clone(),
                updated_at: now,
            },
        );
        st.repos
            .get_mut(&key)
            .unwrap()
            .issues
            .get_mut(&number)
            .unwrap()
            .comments
            .push(id);
        drop(st);
        self.notify();
        id
    }

    /// A comment on a diff line of a pull request (only reactions use it); returns its id.
    pub fn add_review_comment(&self, repo: &str, pull: u64, _author: &str, _body: &str) -> u64 {
        let mut st = self.state();
        let key = repo.to_lowercase();
        assert!(
            st.repos
                .get(&key)
                .and_then(|r| r.issues.get(&pull))
                .is_some_and(|i| i.pull.is_some()),
            "add_pull({repo}, {pull}) first"
        );
        let id = st.next_id();
        st.review_comments
            .insert(id, ReviewComment { repo: key, pull });
        id
    }

    // ---------------------------------------------------------------------------------
    // Test API: behaviour
    // ---------------------------------------------------------------------------------

    /// How long newly issued installation tokens live (default one hour).
    pub fn set_token_lifetime(&self, lifetime: Duration) {
        self.state().token_lifetime = lifetime;
    }

    /// Every installation token issued so far stops working (as after the App's key was
    /// rotated or the installation suspended).
    pub fn revoke_tokens(&self) {
        self.state().tokens.clear();
    }

    /// The next `count` requests whose path (without the API prefix) starts with
    /// `path_prefix` are answered `status` before anything else is looked at.
    pub fn fail_next(&self, path_prefix: &str, status: u16, count: u32) {
        self.state().failures.push(Failure {
            path_prefix: path_prefix.to_string(),
            status,
            count,
            after: false,
        });
    }

    /// The next request whose path (without the API prefix) starts with `path_prefix` is
    /// carried out as usual, then answered `status` instead (GitHub did it, the answer was
    /// lost). A `fail_next` for the same request wins: then nothing is carried out.
    pub fn fail_after_next(&self, path_prefix: &str, status: u16) {
        self.state().failures.push(Failure {
            path_prefix: path_prefix.to_string(),
            status,
            count: 1,
            after: true,
        });
    }

    /// The next `method` request to `path` (without the API prefix, exactly) whose query
    /// holds `query` is recorded, then held — neither carried out nor answered — until the
    /// test releases it: GitHub slow to answer one request (the client waits, or gives up
    /// after its own timeout). Other requests go on meanwhile.
    pub fn hold_next(&self, method: &str, path: &str, query: &str) -> HeldRequest {
        let (arrived_tx, arrived_rx) = tokio::sync::watch::channel(false);
        let (release_tx, release_rx) = tokio::sync::watch::channel(false);
        self.state().holds.push(Hold {
            method: method.parse().expect("an HTTP method"),
            path: path.to_string(),
            query: query.to_string(),
            arrived: arrived_tx,
            released: release_rx,
        });
        HeldRequest {
            arrived: arrived_rx,
            release: release_tx,
        }
    }

    /// Installation calls answer GitHub's primary rate-limit 403 until `reset_in` from now;
    /// `None` lifts it.
    pub fn set_rate_limited(&self, reset_in: Option<Duration>) {
        self.state().rate_limited_until = reset_in.map(|d| SystemTime::now() + d);
    }

    // ---------------------------------------------------------------------------------
    // Test API: observations
    // ---------------------------------------------------------------------------------

    pub fn comments(&self, repo: &str, number: u64) -> Vec<FakeComment> {
        let st = self.state();
        let Some(issue) = st
            .repos
            .get(&repo.to_lowercase())
            .and_then(|r| r.issues.get(&number))
        else {
            return Vec::new();
        };
        issue
            .comments
            .iter()
            .map(|id| {
                let c = &st.comments[id];
                FakeComment {
                    id: c.id,
                    user: c.user.clone(),
                    body: c.body.clone(),
                    is_bot: c.is_bot,
                    edits: c.edits.clone(),
                }
            })
            .collect()
    }

    /// Every comment in `repo`, with the number of its issue, by issue then in order.
    pub fn all_comments(&self, repo: &str) -> Vec<(u64, FakeComment)> {
        let numbers: Vec<u64> = self
            .state()
            .repos
            .get(&repo.to_lowercase())
            .map(|r| r.issues.keys().copied().collect())
            .unwrap_or_default();
        numbers
            .into_iter()
            .flat_map(|n| self.comments(repo, n).into_iter().map(move |c| (n, c)))
            .collect()
    }

    /// `(target, content, by)` in the order given.
    pub fn reactions(&self) -> Vec<(String, String, String)> {
        self.state()
            .reactions
            .iter()
            .map(|r| (r.target.clone(), r.content.clone(), r.by.clone()))
            .collect()
    }

    /// Pull requests opened through the API in `repo`, by number.
    pub fn created_pulls(&self, repo: &str) -> Vec<FakePull> {
        let st = self.state();
        let Some(r) = st.repos.get(&repo.to_lowercase()) else {
            return Vec::new();
        };
        r.issues
            .values()
            .filter_map(|i| {
                let p = i.pull.as_ref().filter(|p| p.created)?;
                Some(FakePull {
                    number: i.number,
                    title: i.title.clone(),
                    head: p.head.ref_name.clone(),
                    base: p.base.ref_name.clone(),
                    body: i.body.clone(),
                    draft: p.draft,
                    edits: p.edits.clone(),
                })
            })
            .collect()
    }

    pub fn requests(&self) -> Vec<FakeRequest> {
        self.state().requests.clone()
    }

    /// Requests refused as malformed, with the reason; a test expects none.
    pub fn refused(&self) -> Vec<String> {
        self.state().refused.clone()
    }

    /// 401s given, with the reason.
    pub fn unauthorized(&self) -> Vec<String> {
        self.state().unauthorized.clone()
    }

    pub fn issued_tokens(&self) -> Vec<String> {
        self.state().issued.clone()
    }

    /// Every token minted, with the repositories and permissions it was asked for.
    pub fn token_grants(&self) -> Vec<TokenGrant> {
        self.state().grants.clone()
    }

    /// Requests refused because the token was not minted for that repository (404) or
    /// lacks the permission (403), with the reason.
    pub fn forbidden(&self) -> Vec<String> {
        self.state().forbidden.clone()
    }

    /// What the git server should answer a git request with `token` for `repo` (`owner/name`):
    /// an unknown or expired token is unauthorized, a repository the token was not minted for
    /// is not found, a push needs `contents: write` and a fetch `contents: read`.
    pub fn git_access(&self, token: &str, repo: &str, push: bool) -> GitVerdict {
        type Verdict = GitVerdict;
        let mut st = self.state();
        let key = repo.to_lowercase();
        let Some(issued) = st.tokens.get(token) else {
            return Verdict::Unauthorized;
        };
        if issued.expires_at <= SystemTime::now() {
            return Verdict::Unauthorized;
        }
        let in_installation = st
            .repos
            .get(&key)
            .is_none_or(|r| r.installation == issued.installation);
        if !in_installation || !issued.covers(&key) {
            st.forbidden
                .push(format!("git {repo}: token not minted for it"));
            return Verdict::NotFound;
        }
        let need: Need = if push {
            &[("contents", "write")]
        } else {
            CONTENTS_READ
        };
        if !issued.grants(need) {
            st.forbidden.push(format!(
                "git {} {repo}: token lacks {need:?}",
                if push { "push" } else { "fetch" }
            ));
            return Verdict::Forbidden;
        }
        Verdict::Allow
    }
}

// -------------------------------------------------------------------------------------
// Routing, recording, common checks
// -------------------------------------------------------------------------------------

fn api_routes() -> Router<FakeGitHub> {
    Router::new()
        .route("/app-manifests/{code}/conversions", post(convert_manifest))
        .route("/app", get(get_app))
        .route(
            "/app/installations/{id}/access_tokens",
            post(create_access_token),
        )
        .route("/repos/{owner}/{repo}", get(get_repo))
        .route(
            "/repos/{owner}/{repo}/collaborators/{user}/permission",
            get(get_permission),
        )
        .route("/repos/{owner}/{repo}/contents/{*path}", get(get_contents))
        .route(
            "/repos/{owner}/{repo}/branches/{*branch}",
            get(git_view::get_branch),
        )
        .route(
            "/repos/{owner}/{repo}/git/trees/{sha}",
            get(git_view::get_tree),
        )
        .route(
            "/repos/{owner}/{repo}/git/blobs/{sha}",
            get(git_view::get_blob),
        )
        .route(
            "/repos/{owner}/{repo}/check-runs",
            post(checks_api::create_check_run),
        )
        .route(
            "/repos/{owner}/{repo}/check-runs/{id}",
            axum::routing::patch(checks_api::update_check_run),
        )
        .route(
            "/repos/{owner}/{repo}/commits/{sha}/check-runs",
            get(ci_api::list_check_runs),
        )
        .route(
            "/repos/{owner}/{repo}/commits/{sha}/check-suites",
            get(ci_api::list_check_suites),
        )
        .route(
            "/repos/{owner}/{repo}/commits/{sha}/status",
            get(ci_api::combined_status),
        )
        .route(
            "/repos/{owner}/{repo}/check-runs/{id}/annotations",
            get(ci_api::list_annotations),
        )
        .route(
            "/repos/{owner}/{repo}/actions/jobs/{id}/logs",
            get(ci_api::job_logs),
        )
        .route(
            "/repos/{owner}/{repo}/actions/jobs/{id}",
            get(ci_api::get_job),
        )
        .route(
            "/repos/{owner}/{repo}/actions/runs/{id}/rerun-failed-jobs",
            post(ci_api::rerun_failed_jobs),
        )
        .route("/repos/{owner}/{repo}/issues/{number}", get(get_issue))
        .route(
            "/repos/{owner}/{repo}/issues/{number}/comments",
            get(list_comments).post(create_comment),
        )
        .route(
            "/repos/{owner}/{repo}/issues/{number}/reactions",
            post(react_issue),
        )
        .route(
            "/repos/{owner}/{repo}/issues/comments/{id}",
            get(get_comment).patch(update_comment),
        )
        .route(
            "/repos/{owner}/{repo}/issues/comments/{id}/reactions",
            post(react_issue_comment),
        )
        .route(
            "/repos/{owner}/{repo}/pulls",
            get(list_pulls).post(create_pull),
        )
        .route(
            "/repos/{owner}/{repo}/pulls/{number}",
            get(get_pull).patch(update_pull),
        )
        .route("/users/{username}", get(get_user))
        .route("/graphql", post(graphql_api::graphql))
        .route(
            "/repos/{owner}/{repo}/pulls/comments/{id}/reactions",
            post(react_review_comment),
        )
}

/// Records every request, applies `fail_next`, and checks what GitHub checks of every
/// request (a `User-Agent`, a supported API version).
async fn record(State(fake): State<FakeGitHub>, req: Request, next: Next) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, 64 << 20).await {
        Ok(b) => b,
        Err(_) => return gh_error(413, "Request body too large"),
    };
    let path = parts.uri.path().to_string();
    let header = |name: &str| {
        parts
            .headers
            .get(name)
            .and_then(|v| v.to_str().ok())
            .map(str::to_string)
    };
    let what = format!("{} {path}", parts.method);
    let arrived = std::time::Instant::now();
    let index;
    let ((failure, failure_after), held) = {
        let mut st = fake.state();
        index = st.requests.len();
        st.requests.push(FakeRequest {
            method: parts.method.to_string(),
            path: path.clone(),
            query: parts.uri.query().map(str::to_string),
            authorization: header("authorization"),
            body: String::from_utf8_lossy(&bytes).into_owned(),
            headers: parts.headers.clone(),
            at: arrived,
            took: None,
        });
        if header("user-agent").is_none_or(|ua| ua.trim().is_empty()) {
            st.refused.push(format!("{what}: no User-Agent"));
            return gh_error(
                403,
                "Request forbidden by administrative rules. Please make sure your request has \
                 a User-Agent header (https://docs.github.com/en/rest/overview/resources-in-the-rest-api#user-agent-required).",
            );
        }
        if let Some(v) = header("x-github-api-version").filter(|v| v != "2022-11-28") {
            st.refused.push(format!("{what}: API version {v:?}"));
            return gh_error(400, &format!("API version '{v}' is not supported."));
        }
        let inner_path = path
            .strip_prefix(&fake.inner.prefix)
            .unwrap_or(&path)
            .to_string();
        let mut take = |after: bool| {
            st.failures
                .iter_mut()
                .find(|f| f.count > 0 && f.after == after && inner_path.starts_with(&f.path_prefix))
                .map(|f| {
                    f.count -= 1;
                    f.status
                })
        };
        let failures = match take(false) {
            Some(status) => (Some(status), None),
            None => (None, take(true)),
        };
        let query = parts.uri.query().unwrap_or("");
        let held = st
            .holds
            .iter()
            .position(|h| {
                h.method == parts.method && h.path == inner_path && query.contains(&h.query)
            })
            .map(|i| st.holds.remove(i));
        (failures, held)
    };
    if let Some(hold) = held {
        hold.arrived.send_replace(true);
        let mut released = hold.released.clone();
        let _ = released.wait_for(|r| *r).await;
    }
    let status_error = |status: u16| {
        let message = StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason())
            .unwrap_or("Server Error");
        gh_error(status, message)
    };
    if let Some(status) = failure {
        return status_error(status);
    }
    let response = next
        .run(Request::from_parts(parts, Body::from(bytes)))
        .await;
    if let Some(r) = fake.state().requests.get_mut(index) {
        r.took = Some(arrived.elapsed());
    }
    fake.notify();
    match failure_after {
        Some(status) => status_error(status),
        None => response,
    }
}

async fn no_such_route(State(fake): State<FakeGitHub>, req: Req) -> Response {
    refuse(&fake, &req, 404, "Not Found", "no such endpoint or method")
}

/// What handlers need of a request: method, full path, query, headers, body.
struct Req {
    method: Method,
    path: String,
    query: HashMap<String, String>,
    headers: HeaderMap,
    body: Bytes,
}

impl<S: Send + Sync> FromRequest<S> for Req {
    type Rejection = Response;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        let (parts, body) = req.into_parts();
        let uri = parts
            .extensions
            .get::<OriginalUri>()
            .map(|u| u.0.clone())
            .unwrap_or(parts.uri.clone());
        let body = axum::body::to_bytes(body, 64 << 20)
            .await
            .map_err(|_| gh_error(413, "Request body too large"))?;
        Ok(Req {
            method: parts.method,
            path: uri.path().to_string(),
            query: parse_query(uri.query().unwrap_or("")),
            headers: parts.headers,
            body,
        })
    }
}

impl Req {
    fn what(&self) -> String {
        format!("{} {}", self.method, self.path)
    }

    fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The JSON object body, or a refusal shaped like GitHub's.
    #[allow(clippy::result_large_err)]
    fn json_object(&self, fake: &FakeGitHub) -> Result<serde_json::Map<String, Value>, Response> {
        match serde_json::from_slice::<Value>(&self.body) {
            Ok(Value::Object(map)) => Ok(map),
            Ok(_) => Err(refuse(
                fake,
                self,
                400,
                "Invalid request.\n\nFor 'links/0/schema', the body is not an object.",
                "the body is not a JSON object",
            )),
            Err(e) => Err(refuse(
                fake,
                self,
                400,
                "Problems parsing JSON",
                &format!("the body is not JSON: {e}"),
            )),
        }
    }
}

fn gh_error(status: u16, message: &str) -> Response {
    let status = StatusCode::from_u16(status).unwrap();
    (
        status,
        [("content-type", "application/json; charset=utf-8")],
        json!({
            "message": message,
            "documentation_url": DOCS,
            "status": status.as_u16().to_string(),
        })
        .to_string(),
    )
        .into_response()
}

/// Answers like GitHub and records the request as malformed.
fn refuse(fake: &FakeGitHub, req: &Req, status: u16, message: &str, reason: &str) -> Response {
    fake.state()
        .refused
        .push(format!("{}: {reason}", req.what()));
    gh_error(status, message)
}

fn json_response(status: u16, body: Value) -> Response {
    (
        StatusCode::from_u16(status).unwrap(),
        [("content-type", "application/json; charset=utf-8")],
        body.to_string(),
    )
        .into_response()
}

/// An `Accept` header this endpoint answers in JSON: absent, `*/*`, or GitHub's JSON types.
fn accepts_json(req: &Req) -> bool {
    req.header("accept").is_none_or(|a| {
        a.split(',').any(|t| {
            let t = t.split(';').next().unwrap_or("").trim();
            matches!(
                t,
                "*/*"
                    | "application/json"
                    | "application/vnd.github+json"
                    | "application/vnd.github.v3+json"
            )
        })
    })
}

// -------------------------------------------------------------------------------------
// Authentication
// -------------------------------------------------------------------------------------

fn unauthorized(fake: &FakeGitHub, req: &Req, message: &str, reason: &str) -> Response {
    fake.state()
        .unauthorized
        .push(format!("{}: {reason}", req.what()));
    gh_error(401, message)
}

fn credential(req: &Req) -> Option<(String, String)> {
    let value = req.header("authorization")?;
    let (scheme, rest) = value.split_once(' ')?;
    Some((scheme.to_ascii_lowercase(), rest.trim().to_string()))
}

/// Checks the App JWT as GitHub does: RS256 by the App's key, `iss` the App id (string or
/// number), not expired, `iat` not in the future, at most ten minutes between the two.
#[allow(clippy::result_large_err)]
fn auth_app(fake: &FakeGitHub, req: &Req) -> Result<(), Response> {
    let fail = |reason: &str, message: &str| Err(unauthorized(fake, req, message, reason));
    let credential = credential(req);
    let Some(("bearer", jwt)) = credential.as_ref().map(|(s, t)| (s.as_str(), t.as_str())) else {
        return fail("no Bearer JWT", "A JSON web token could not be decoded");
    };
    let mut validation = Validation::new(Algorithm::RS256);
    validation.set_required_spec_claims(&["exp", "iat", "iss"]);
    validation.leeway = 0;
    validation.validate_aud = false;
    let (app_id, key) = fake.inner.app.lock().unwrap().clone();
    let claims = match jsonwebtoken::decode::<Value>(jwt, &key, &validation) {
        Ok(data) => data.claims,
        Err(e) => {
            return fail(
                &format!("JWT rejected: {e}"),
                "A JSON web token could not be decoded",
            )
        }
    };
    let now = now_secs() as i64;
    let (Some(iat), Some(exp)) = (claims["iat"].as_i64(), claims["exp"].as_i64()) else {
        return fail(
            "iat/exp not integers",
            "A JSON web token could not be decoded",
        );
    };
    if iat > now + 60 {
        return fail(
            "iat in the future",
            "'Issued at' claim ('iat') must be an Integer representing the time that the assertion was issued.",
        );
    }
    if exp - iat > 600 {
        return fail(
            "exp more than 10 minutes after iat",
            "'Expiration time' claim ('exp') is too far in the future",
        );
    }
    let iss_ok = claims["iss"].as_str() == Some(app_id.to_string().as_str())
        || claims["iss"].as_u64() == Some(app_id);
    if !iss_ok {
        return fail(
            &format!("iss {} is not the App id", claims["iss"]),
            "Integration not found",
        );
    }
    Ok(())
}

/// The permissions an endpoint needs, any one of them: `(permission, "read" | "write")`.
/// Empty: metadata only, which every token has.
type Need = &'static [(&'static str, &'static str)];
const METADATA: Need = &[];
const CONTENTS_READ: Need = &[("contents", "read")];
const ISSUES_READ: Need = &[("issues", "read"), ("pull_requests", "read")];
const ISSUES_WRITE: Need = &[("issues", "write"), ("pull_requests", "write")];
const PULLS_READ: Need = &[("pull_requests", "read")];
const PULLS_WRITE: Need = &[("pull_requests", "write")];

/// What the App may be granted, as `GET /app` says.
const APP_PERMISSIONS: [(&str, &str); 7] = [
    ("contents", "write"),
    ("issues", "write"),
    ("pull_requests", "write"),
    ("metadata", "read"),
    ("checks", "write"),
    ("actions", "write"),
    ("statuses", "read"),
];

impl IssuedToken {
    /// Whether the token may touch the repository `key` (lower-case full name).
    fn covers(&self, key: &str) -> bool {
        self.repositories
            .as_ref()
            .is_none_or(|r| r.iter().any(|k| k == key))
    }

    /// Whether the token holds one of `need` (write implies read).
    fn grants(&self, need: Need) -> bool {
        need.is_empty()
            || need.iter().any(|(p, level)| {
                self.permissions
                    .get(*p)
                    .is_some_and(|has| has == "write" || has == level)
            })
    }
}

/// The token of the request as it was issued (unexpired), else the 401 to answer.
#[allow(clippy::result_large_err)]
fn bearer(fake: &FakeGitHub, req: &Req) -> Result<String, Response> {
    match credential(req) {
        Some((scheme, token)) if scheme == "token" || scheme == "bearer" => Ok(token),
        _ => Err(unauthorized(
            fake,
            req,
            "Requires authentication",
            "no installation token",
        )),
    }
}

/// Checks an installation token (`token X` or `Bearer X`), that `repo` belongs to its
/// installation and to the repositories it was minted for (else 404, as GitHub hides what a
/// token cannot see), and that it holds a permission in `need` (else 403 "Resource not
/// accessible by integration", recorded in `forbidden()`). Returns the repository's key.
/// Also serves the rate limit when one is set.
#[allow(clippy::result_large_err)]
fn auth_installation(
    fake: &FakeGitHub,
    req: &Req,
    owner: &str,
    repo: &str,
    need: Need,
) -> Result<String, Response> {
    let installation = token_installation(fake, req)?;
    let token = bearer(fake, req)?;
    let key = format!("{owner}/{repo}").to_lowercase();
    let mut st = fake.state();
    match st.repos.get(&key) {
        Some(r) if r.installation == installation => {}
        _ => return Err(gh_error(404, "Not Found")),
    }
    let Some(issued) = st.tokens.get(&token) else {
        return Err(gh_error(404, "Not Found"));
    };
    if !issued.covers(&key) {
        st.forbidden
            .push(format!("{}: token not minted for {key}", req.what()));
        return Err(gh_error(404, "Not Found"));
    }
    if !issued.grants(need) {
        st.forbidden
            .push(format!("{}: token lacks {need:?}", req.what()));
        return Err(gh_error(403, "Resource not accessible by integration"));
    }
    Ok(key)
}

/// Checks an installation token (`token X` or `Bearer X`), unexpired, and serves the rate
/// limit when one is set; returns the token's installation.
#[allow(clippy::result_large_err)]
fn token_installation(fake: &FakeGitHub, req: &Req) -> Result<u64, Response> {
    let token = match credential(req) {
        Some((scheme, token)) if scheme == "token" || scheme == "bearer" => token,
        _ => {
            return Err(unauthorized(
                fake,
                req,
                "Requires authentication",
                "no installation token",
            ))
        }
    };
    let mut st = fake.state();
    let installation = match st.tokens.get(&token) {
        Some(t) if t.expires_at > SystemTime::now() => t.installation,
        Some(_) => {
            drop(st);
            return Err(unauthorized(fake, req, "Bad credentials", "expired token"));
        }
        None => {
            drop(st);
            return Err(unauthorized(fake, req, "Bad credentials", "unknown token"));
        }
    };
    if let Some(until) = st.rate_limited_until {
        if until > SystemTime::now() {
            let reset = until.duration_since(UNIX_EPOCH).unwrap().as_secs();
            let mut resp = gh_error(
                403,
                &format!("API rate limit exceeded for installation ID {installation}."),
            );
            let h = resp.headers_mut();
            h.insert("x-ratelimit-limit", "5000".parse().unwrap());
            h.insert("x-ratelimit-remaining", "0".parse().unwrap());
            h.insert("x-ratelimit-reset", reset.to_string().parse().unwrap());
            h.insert("x-ratelimit-resource", "core".parse().unwrap());
            return Err(resp);
        }
        st.rate_limited_until = None;
    }
    Ok(installation)
}

// -------------------------------------------------------------------------------------
// Shapes
// -------------------------------------------------------------------------------------

fn user_json(st: &mut StateInner, login: &str, is_bot: bool) -> Value {
    let id = st.user_id(login);
    json!({
        "login": login,
        "id": id,
        "node_id": format!("U_{id}"),
        "type": if is_bot { "Bot" } else { "User" },
        "site_admin": false,
        "html_url": format!("https://github.com/{login}"),
    })
}

fn repo_json(fake: &FakeGitHub, st: &mut StateInner, key: &str) -> Value {
    let (id, full_name, default_branch, clone_url, private) = {
        let r = &st.repos[key];
        (
            r.id,
            r.full_name.clone(),
            r.default_branch.clone(),
            r.clone_url.clone(),
            r.private,
        )
    };
    let (owner, name) = full_name.split_once('/').unwrap();
    let owner_json = user_json(st, owner, false);
    json!({
        "id": id,
        "node_id": format!("R_{id}"),
        "name": name,
        "full_name": full_name,
        "owner": owner_json,
        "private": private,
        "fork": false,
        "default_branch": default_branch,
        "clone_url": clone_url,
        "html_url": format!("{}/{full_name}", fake.inner.root),
        "url": format!("{}/repos/{full_name}", fake.inner.url),
        "visibility": if private { "private" } else { "public" },
    })
}

fn comment_json(fake: &FakeGitHub, st: &mut StateInner, id: u64) -> Value {
    let c = &st.comments[&id];
    let (user, is_bot, body, issue, created, updated) = (
        c.user.clone(),
        c.is_bot,
        c.body.clone(),
        c.issue,
        c.created_at.clone(),
        c.updated_at.clone(),
    );
    let full_name = st.repos[&c.repo].full_name.clone();
    let user = user_json(st, &user, is_bot);
    json!({
        "id": id,
        "node_id": format!("IC_{id}"),
        "url": format!("{}/repos/{full_name}/issues/comments/{id}", fake.inner.url),
        "html_url": format!("{}/{full_name}/issues/{issue}#issuecomment-{id}", fake.inner.root),
        "issue_url": format!("{}/repos/{full_name}/issues/{issue}", fake.inner.url),
        "body": body,
        "user": user,
        "created_at": created,
        "updated_at": updated,
        "author_association": if is_bot { "NONE" } else { "CONTRIBUTOR" },
        "performed_via_github_app": null,
    })
}

fn issue_json(fake: &FakeGitHub, st: &mut StateInner, key: &str, number: u64) -> Value {
    let full_name = st.repos[key].full_name.clone();
    let i = &st.repos[key].issues[&number];
    let (title, body, author, is_pull, count, created, state) = (
        i.title.clone(),
        i.body.clone(),
        i.author.clone(),
        i.pull.is_some(),
        i.comments.len(),
        i.created_at.clone(),
        i.state.clone(),
    );
    let user = user_json(st, &author, author.ends_with("[bot]"));
    let id = 5_000_000 + number;
    let mut v = json!({
        "id": id,
        "node_id": format!("I_{id}"),
        "number": number,
        "title": title,
        "body": if body.is_empty() { Value::Null } else { Value::String(body) },
        "user": user,
        "state": state,
        "locked": false,
        "labels": [],
        "assignees": [],
        "comments": count,
        "created_at": created,
        "updated_at": created,
        "closed_at": null,
        "author_association": "CONTRIBUTOR",
        "url": format!("{}/repos/{full_name}/issues/{number}", fake.inner.url),
        "repository_url": format!("{}/repos/{full_name}", fake.inner.url),
        "html_url": format!("{}/{full_name}/issues/{number}", fake.inner.root),
    });
    if is_pull {
        v["pull_request"] = json!({
            "url": format!("{}/repos/{full_name}/pulls/{number}", fake.inner.url),
            "html_url": format!("{}/{full_name}/pull/{number}", fake.inner.root),
            "diff_url": format!("{}/{full_name}/pull/{number}.diff", fake.inner.root),
            "patch_url": format!("{}/{full_name}/pull/{number}.patch", fake.inner.root),
            "merged_at": null,
        });
    }
    v
}

fn pull_json(fake: &FakeGitHub, st: &mut StateInner, key: &str, number: u64) -> Value {
    let issue = issue_json(fake, st, key, number);
    let base_repo = repo_json(fake, st, key);
    let p = st.repos[key].issues[&number].pull.as_ref().unwrap();
    let (mut head, base, draft) = (p.head.clone(), p.base.clone(), p.draft);
    // A same-repository head moves with its branch, as on GitHub (a push to the branch is
    // the pull request's new head).
    let full = base_repo["full_name"].as_str().unwrap_or(key).to_string();
    if let (Some(f), Some(r)) = (&st.branch_sha, &head.repo) {
        if r.to_lowercase() == key {
            if let Some(live) = f(&full, &head.ref_name) {
                head.sha = live;
            }
        }
    }
    let (mergeable, mergeable_state) = mergeable_of(st, &full, number, &head.sha, &base.ref_name);
    let head_repo = match &head.repo {
        None => Value::Null,
        Some(full) if full.to_lowercase() == key => base_repo.clone(),
        Some(full) => {
            let (owner, name) = full.split_once('/').unwrap_or((full, full));
            let owner_json = user_json(st, owner, false);
            json!({
                "id": 9_000_000 + st.user_id(full),
                "name": name,
                "full_name": full,
                "owner": owner_json,
                "private": false,
                "fork": true,
                "default_branch": "main",
                "clone_url": head.clone_url,
                "html_url": format!("{}/{full}", fake.inner.root),
            })
        }
    };
    let head_owner = head
        .repo
        .as_deref()
        .and_then(|f| f.split_once('/'))
        .map(|(o, _)| o.to_string())
        .unwrap_or_else(|| "ghost".into());
    let base_owner = base_repo["owner"]["login"].as_str().unwrap().to_string();
    let head_user = user_json(st, &head_owner, false);
    let base_user = base_repo["owner"].clone();
    json!({
        "id": issue["id"],
        "node_id": format!("PR_{number}"),
        "number": number,
        "state": issue["state"],
        "locked": false,
        "title": issue["title"],
        "body": issue["body"],
        "user": issue["user"],
        "draft": draft,
        "merged": false,
        "mergeable": mergeable,
        "mergeable_state": mergeable_state,
        "maintainer_can_modify": false,
        "url": format!("{}/repos/{}/pulls/{number}", fake.inner.url, base_repo["full_name"].as_str().unwrap()),
        "html_url": issue["pull_request"]["html_url"],
        "diff_url": issue["pull_request"]["diff_url"],
        "created_at": issue["created_at"],
        "updated_at": issue["updated_at"],
        "head": {
            "label": format!("{head_owner}:{}", head.ref_name),
            "ref": head.ref_name,
            "sha": head.sha,
            "user": head_user,
            "repo": head_repo,
        },
        "base": {
            "label": format!("{base_owner}:{}", base.ref_name),
            "ref": base.ref_name,
            "sha": base.sha,
            "user": base_user,
            "repo": base_repo,
        },
    })
}

/// `mergeable` and `mergeable_state` as GitHub computes them lazily: `null` and `unknown`
/// the first time a pull request is read after its head or its base moved, then from git
/// in the repository's directory (`set_git_dir`): `dirty` when the two conflict (`git
/// merge-tree`), `behind` when the base has commits the head lacks, else `clean`. Without a
/// git directory it stays `null`.
fn mergeable_of(
    st: &mut StateInner,
    full: &str,
    number: u64,
    head: &str,
    base_branch: &str,
) -> (Value, Value) {
    let unknown = (Value::Null, json!("unknown"));
    let (Some(dir), Some(tip)) = (
        st.git_dir.as_ref().and_then(|f| f(full)),
        st.branch_sha.as_ref().and_then(|f| f(full, base_branch)),
    ) else {
        return unknown;
    };
    if st
        .mergeable_asked
        .insert((number, head.to_string(), tip.clone()))
    {
        return unknown;
    }
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .arg("--git-dir")
            .arg(&dir)
            .args(args)
            .output()
            .map(|o| o.status.code())
    };
    match git(&["merge-base", "--is-ancestor", &tip, head]) {
        Ok(Some(0)) => return (json!(true), json!("clean")),
        Ok(Some(1)) => {}
        _ => return unknown,
    }
    match git(&["merge-tree", "--write-tree", "--name-only", head, &tip]) {
        Ok(Some(0)) => (json!(true), json!("behind")),
        Ok(Some(1)) => (json!(false), json!("dirty")),
        _ => unknown,
    }
}

// -------------------------------------------------------------------------------------
// Handlers: the App
// -------------------------------------------------------------------------------------

async fn get_app(State(fake): State<FakeGitHub>, req: Req) -> Response {
    if let Err(r) = auth_app(&fake, &req) {
        return r;
    }
    let slug = fake.slug();
    let mut st = fake.state();
    let owner = user_json(&mut st, "kodx-org", false);
    json_response(
        200,
        json!({
            "id": fake.app_id(),
            "slug": slug,
            "node_id": format!("A_{}", fake.app_id()),
            "name": slug,
            "owner": owner,
            "description": "kodx test App",
            "external_url": "https://example.com",
            "html_url": format!("{}/apps/{slug}", fake.inner.root),
            "created_at": "2024-01-01T00:00:00Z",
            "updated_at": "2024-01-01T00:00:00Z",
            "permissions": {"contents": "write", "issues": "write", "pull_requests": "write", "metadata": "read", "checks": "write", "actions": if st.actions_read_only { "read" } else { "write" }, "statuses": "read"},
            "events": ["issue_comment", "issues", "pull_request_review_comment", "pull_request", "pull_request_review", "check_suite", "workflow_run", "push"],
            "installations_count": st.installations.len(),
        }),
    )
}

async fn create_access_token(
    State(fake): State<FakeGitHub>,
    Path(id): Path<String>,
    req: Req,
) -> Response {
    if let Err(r) = auth_app(&fake, &req) {
        return r;
    }
    let mut asked_repos: Option<Vec<String>> = None;
    let mut asked_perms: Option<BTreeMap<String, String>> = None;
    if !req.body.is_empty() {
        let body = match req.json_object(&fake) {
            Ok(b) => b,
            Err(r) => return r,
        };
        for (k, v) in &body {
            let ok = match k.as_str() {
                "repositories" => v.as_array().is_some_and(|a| a.iter().all(Value::is_string)),
                "repository_ids" => v.as_array().is_some_and(|a| a.iter().all(Value::is_u64)),
                "permissions" => v
                    .as_object()
                    .is_some_and(|o| o.values().all(|l| l == "read" || l == "write")),
                _ => false,
            };
            if !ok {
                return refuse(&fake, &req, 422, "Invalid request.", &format!("bad `{k}`"));
            }
        }
        if body.contains_key("repository_ids") {
            return refuse(
                &fake,
                &req,
                422,
                "Invalid request.",
                "repository_ids is not served by the fake; send repositories",
            );
        }
        asked_repos = body.get("repositories").map(|a| {
            a.as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap().to_string())
                .collect()
        });
        asked_perms = body.get("permissions").map(|o| {
            o.as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect()
        });
    }
    let Ok(id) = id.parse::<u64>() else {
        return refuse(
            &fake,
            &req,
            404,
            "Not Found",
            "installation id is not a number",
        );
    };
    let mut st = fake.state();
    let Some(account) = st.installations.get(&id).cloned() else {
        return gh_error(404, "Not Found");
    };
    // `repositories` are names in the installation's account.
    let repositories = match &asked_repos {
        None => None,
        Some(names) => {
            let mut keys = Vec::new();
            for name in names {
                let key = format!("{account}/{name}").to_lowercase();
                if name.contains('/') || st.repos.get(&key).is_none_or(|r| r.installation != id) {
                    st.forbidden
                        .push(format!("token for {name:?}: not in installation {id}"));
                    return gh_error(
                        422,
                        "There is at least one repository that does not exist or is not accessible to the parent installation.",
                    );
                }
                keys.push(key);
            }
            Some(keys)
        }
    };
    let no_checks = st.no_checks;
    let actions_read_only = st.actions_read_only;
    let app: BTreeMap<String, String> = APP_PERMISSIONS
        .iter()
        .filter(|(k, _)| !(no_checks && *k == "checks"))
        .map(|(k, v)| match (*k, actions_read_only) {
            ("actions", true) => (k.to_string(), "read".to_string()),
            _ => (k.to_string(), v.to_string()),
        })
        .collect();
    let mut permissions = match &asked_perms {
        None => app.clone(),
        Some(asked) => {
            for (k, v) in asked {
                let allowed = app.get(k).is_some_and(|a| a == "write" || a == v);
                if !allowed {
                    st.forbidden
                        .push(format!("token asking {k}: {v}, not granted to the App"));
                    return gh_error(
                        422,
                        "The permissions requested are not granted to this installation.",
                    );
                }
            }
            asked.clone()
        }
    };
    permissions.insert("metadata".into(), "read".into());
    let token: String = format!(
        "ghs_{}",
        rand::rng()
            .sample_iter(&rand::distr::Alphanumeric)
            .take(36)
            .map(char::from)
            .collect::<String>()
    );
    let expires_at = SystemTime::now() + st.token_lifetime;
    st.tokens.insert(
        token.clone(),
        IssuedToken {
            installation: id,
            expires_at,
            repositories: repositories.clone(),
            permissions: permissions.clone(),
        },
    );
    st.issued.push(token.clone());
    st.grants.push(TokenGrant {
        token: token.clone(),
        installation: id,
        repositories: asked_repos,
        permissions: asked_perms,
    });
    let mut answer = json!({
        "token": token,
        "expires_at": iso8601(expires_at),
        "permissions": permissions,
        "repository_selection": if repositories.is_some() { "selected" } else { "all" },
    });
    if let Some(keys) = &repositories {
        let repos: Vec<Value> = keys.iter().map(|k| repo_json(&fake, &mut st, k)).collect();
        answer["repositories"] = Value::Array(repos);
    }
    json_response(201, answer)
}

// -------------------------------------------------------------------------------------
// Handlers: repositories
// -------------------------------------------------------------------------------------

async fn get_repo(
    State(fake): State<FakeGitHub>,
    Path((owner, repo)): Path<(String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, METADATA) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let mut st = fake.state();
    json_response(200, repo_json(&fake, &mut st, &key))
}

async fn get_permission(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, user)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, METADATA) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let mut st = fake.state();
    let Some(role) = st.repos[&key]
        .permissions
        .get(&user.to_lowercase())
        .cloned()
    else {
        return gh_error(404, &format!("{user} is not a user"));
    };
    let permission = match role.as_str() {
        "admin" => "admin",
        "maintain" | "write" => "write",
        "triage" | "read" => "read",
        _ => "none",
    };
    let mut user_v = user_json(&mut st, &user, user.ends_with("[bot]"));
    user_v["permissions"] = json!({
        "admin": role == "admin",
        "maintain": matches!(role.as_str(), "admin" | "maintain"),
        "push": matches!(role.as_str(), "admin" | "maintain" | "write"),
        "triage": matches!(role.as_str(), "admin" | "maintain" | "write" | "triage"),
        "pull": role != "none",
    });
    user_v["role_name"] = json!(role);
    json_response(
        200,
        json!({"permission": permission, "role_name": role, "user": user_v}),
    )
}

async fn get_contents(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, path)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, CONTENTS_READ) {
        Ok(k) => k,
        Err(r) => return r,
    };
    if !accepts_json(&req) {
        return refuse(&fake, &req, 415, "Unsupported 'Accept' header", "Accept");
    }
    let path = path.trim_matches('/').to_string();
    // `set_file` files are the default branch's tip; any other ref is read from git.
    let default_branch = fake.state().repos[&key].default_branch.clone();
    let on_default = match req.query.get("ref") {
        None => true,
        Some(r) => {
            *r == default_branch || fake.branch_tip(&key, &default_branch).as_ref() == Some(r)
        }
    };
    let in_map = {
        let st = fake.state();
        let files = &st.repos[&key].files;
        files.contains_key(&path)
            || files
                .range(format!("{path}/")..)
                .next()
                .is_some_and(|(p, _)| p.starts_with(&format!("{path}/")))
    };
    if !(on_default && in_map) {
        let rev = req.query.get("ref").cloned().unwrap_or(default_branch);
        if let Some(answer) = git_view::contents_at(&fake, &key, &rev, &path) {
            return answer;
        }
        if !on_default {
            return gh_error(404, &format!("No commit found for the ref {rev}"));
        }
    }
    let st = fake.state();
    let r = &st.repos[&key];
    let urls = |p: &str, kind: &str| {
        json!({
            "url": format!("{}/repos/{}/contents/{p}?ref={}", fake.inner.url, r.full_name, r.default_branch),
            "html_url": format!("{}/{}/{kind}/{}/{p}", fake.inner.root, r.full_name, r.default_branch),
        })
    };
    if let Some(bytes) = r.files.get(&path) {
        let name = path.rsplit('/').next().unwrap_or(&path);
        let u = urls(&path, "blob");
        return json_response(
            200,
            json!({
                "type": "file",
                "encoding": "base64",
                "size": bytes.len(),
                "name": name,
                "path": path,
                "content": base64_wrapped(bytes),
                "sha": fake_sha(bytes),
                "url": u["url"],
                "html_url": u["html_url"],
                "git_url": null,
                "download_url": null,
                "_links": {"self": u["url"], "html": u["html_url"], "git": null},
            }),
        );
    }
    let dir_prefix = format!("{path}/");
    let mut entries: BTreeMap<String, Value> = BTreeMap::new();
    for (p, bytes) in r.files.range(dir_prefix.clone()..) {
        let Some(rest) = p.strip_prefix(&dir_prefix) else {
            break;
        };
        let (name, is_dir) = match rest.split_once('/') {
            Some((d, _)) => (d.to_string(), true),
            None => (rest.to_string(), false),
        };
        let full = format!("{dir_prefix}{name}");
        let u = urls(&full, if is_dir { "tree" } else { "blob" });
        entries.entry(name.clone()).or_insert_with(|| {
            json!({
                "type": if is_dir { "dir" } else { "file" },
                "name": name,
                "path": full,
                "size": if is_dir { 0 } else { bytes.len() },
                "sha": fake_sha(full.as_bytes()),
                "url": u["url"],
                "html_url": u["html_url"],
            })
        });
    }
    if entries.is_empty() {
        return gh_error(404, "Not Found");
    }
    json_response(200, Value::Array(entries.into_values().collect()))
}

// -------------------------------------------------------------------------------------
// Handlers: issues, comments, pulls
// -------------------------------------------------------------------------------------

/// The issue number in a path, or a refusal (our client never sends a non-number).
#[allow(clippy::result_large_err)]
fn number(fake: &FakeGitHub, req: &Req, text: &str) -> Result<u64, Response> {
    text.parse().map_err(|_| {
        refuse(
            fake,
            req,
            404,
            "Not Found",
            &format!("{text:?} is not a number"),
        )
    })
}

async fn get_issue(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, n)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, ISSUES_READ) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let n = match number(&fake, &req, &n) {
        Ok(n) => n,
        Err(r) => return r,
    };
    if !accepts_json(&req) {
        return refuse(&fake, &req, 415, "Unsupported 'Accept' header", "Accept");
    }
    let mut st = fake.state();
    if !st.repos[&key].issues.contains_key(&n) {
        return gh_error(404, "Not Found");
    }
    json_response(200, issue_json(&fake, &mut st, &key, n))
}

async fn list_comments(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, n)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, ISSUES_READ) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let n = match number(&fake, &req, &n) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let mut paging = [("per_page", 30u64), ("page", 1u64)];
    for (name, value) in paging.iter_mut() {
        if let Some(text) = req.query.get(*name) {
            match text.parse::<u64>() {
                Ok(v) if v >= 1 => *value = v,
                _ => {
                    return refuse(
                        &fake,
                        &req,
                        422,
                        "Invalid request.",
                        &format!("{name}={text:?}"),
                    )
                }
            }
        }
    }
    let (per_page, page) = (paging[0].1.min(100), paging[1].1);
    let mut st = fake.state();
    let Some(issue) = st.repos[&key].issues.get(&n) else {
        return gh_error(404, "Not Found");
    };
    let ids = issue.comments.clone();
    let full_name = st.repos[&key].full_name.clone();
    let last_page = (ids.len() as u64).div_ceil(per_page).max(1);
    let start = ((page - 1) * per_page) as usize;
    let items: Vec<Value> = ids
        .iter()
        .skip(start)
        .take(per_page as usize)
        .map(|&id| comment_json(&fake, &mut st, id))
        .collect();
    let mut resp = json_response(200, Value::Array(items));
    if last_page > 1 {
        let link = |p: u64, rel: &str| {
            format!(
                "<{}/repos/{full_name}/issues/{n}/comments?per_page={per_page}&page={p}>; rel=\"{rel}\"",
                fake.inner.url
            )
        };
        let mut links = Vec::new();
        if page > 1 {
            links.push(link((page - 1).min(last_page), "prev"));
        }
        if page < last_page {
            links.push(link(page + 1, "next"));
            links.push(link(last_page, "last"));
        }
        if page > 1 {
            links.push(link(1, "first"));
        }
        resp.headers_mut()
            .insert("link", links.join(", ").parse().unwrap());
    }
    resp
}

/// The `body` of a comment write: a non-blank string of at most 65 536 characters.
#[allow(clippy::result_large_err)]
fn comment_body(fake: &FakeGitHub, req: &Req) -> Result<String, Response> {
    let body = req.json_object(fake)?;
    match body.get("body") {
        Some(Value::String(s)) if s.trim().is_empty() => Err(refuse(
            fake,
            req,
            422,
            "Validation Failed",
            "`body` is blank",
        )),
        Some(Value::String(s)) if s.chars().count() > MAX_COMMENT_CHARS => Err(refuse(
            fake,
            req,
            422,
            "Validation Failed",
            "`body` is too long (maximum is 65536 characters)",
        )),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(refuse(
            fake,
            req,
            422,
            "Invalid request.\n\nFor 'properties/body', the value is not a string.",
            "`body` is not a string",
        )),
        None => Err(refuse(
            fake,
            req,
            422,
            "Invalid request.\n\n\"body\" wasn't supplied.",
            "no `body`",
        )),
    }
}

async fn create_comment(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, n)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, ISSUES_WRITE) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let n = match number(&fake, &req, &n) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let body = match comment_body(&fake, &req) {
        Ok(b) => b,
        Err(r) => return r,
    };
    if !fake.state().repos[&key].issues.contains_key(&n) {
        return gh_error(404, "Not Found");
    }
    let bot = fake.bot_login();
    let id = fake.add_comment(&key, n, &bot, &body, true);
    let mut st = fake.state();
    json_response(201, comment_json(&fake, &mut st, id))
}

/// The comment `id` if it is in repository `key`.
#[allow(clippy::result_large_err)]
fn comment_in(fake: &FakeGitHub, req: &Req, key: &str, id: &str) -> Result<u64, Response> {
    let id = number(fake, req, id)?;
    match fake.state().comments.get(&id) {
        Some(c) if c.repo == key => Ok(id),
        _ => Err(gh_error(404, "Not Found")),
    }
}

async fn get_comment(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, id)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, ISSUES_READ) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let id = match comment_in(&fake, &req, &key, &id) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let mut st = fake.state();
    json_response(200, comment_json(&fake, &mut st, id))
}

async fn update_comment(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, id)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, ISSUES_WRITE) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let id = match comment_in(&fake, &req, &key, &id) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let body = match comment_body(&fake, &req) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let mut st = fake.state();
    let c = st.comments.get_mut(&id).unwrap();
    c.body = body.clone();
    c.edits.push(body);
    c.updated_at = iso8601(SystemTime::now());
    json_response(200, comment_json(&fake, &mut st, id))
}

async fn get_pull(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, n)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, PULLS_READ) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let n = match number(&fake, &req, &n) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let accept = req.header("accept").unwrap_or("").to_string();
    let wants_diff = accept.contains("application/vnd.github.diff")
        || accept.contains("application/vnd.github.v3.diff");
    if !wants_diff && !accepts_json(&req) {
        return refuse(&fake, &req, 415, "Unsupported 'Accept' header", "Accept");
    }
    let mut st = fake.state();
    let Some(pull) = st.repos[&key].issues.get(&n).and_then(|i| i.pull.as_ref()) else {
        return gh_error(404, "Not Found");
    };
    if wants_diff {
        return (
            StatusCode::OK,
            [("content-type", "application/vnd.github.diff; charset=utf-8")],
            pull.diff.clone(),
        )
            .into_response();
    }
    json_response(200, pull_json(&fake, &mut st, &key, n))
}

/// GitHub's 422 with `errors` (`resource`, `code`, and `field` or `message`).
fn validation_failed(errors: Value) -> Response {
    json_response(
        422,
        json!({
            "message": "Validation Failed",
            "errors": errors,
            "documentation_url": "https://docs.github.com/rest/pulls/pulls#create-a-pull-request",
            "status": "422",
        }),
    )
}

/// Records a request as a kodx bug without changing GitHub's answer (for what GitHub
/// silently ignores).
fn note_refused(fake: &FakeGitHub, req: &Req, reason: &str) {
    fake.state()
        .refused
        .push(format!("{}: {reason}", req.what()));
}

/// The keys of a JSON body that are not in `allowed`, refused as GitHub's schema does.
#[allow(clippy::result_large_err)]
fn only_keys(
    fake: &FakeGitHub,
    req: &Req,
    body: &serde_json::Map<String, Value>,
    allowed: &[&str],
) -> Result<(), Response> {
    match body.keys().find(|k| !allowed.contains(&k.as_str())) {
        Some(k) => Err(refuse(
            fake,
            req,
            422,
            &format!("Invalid request.\n\n\"{k}\" is not a permitted key."),
            &format!("unknown key `{k}`"),
        )),
        None => Ok(()),
    }
}

/// An optional field of type `kind` (`string`, `boolean`); `null` counts as absent.
#[allow(clippy::result_large_err)]
fn typed_field(
    fake: &FakeGitHub,
    req: &Req,
    body: &serde_json::Map<String, Value>,
    name: &str,
    kind: &str,
) -> Result<Option<Value>, Response> {
    match body.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) if (kind == "string" && v.is_string()) || (kind == "boolean" && v.is_boolean()) => {
            Ok(Some(v.clone()))
        }
        Some(v) => Err(refuse(
            fake,
            req,
            422,
            &format!("Invalid request.\n\nFor 'properties/{name}', {v} is not a {kind}."),
            &format!("`{name}` is not a {kind}"),
        )),
    }
}

#[allow(clippy::result_large_err)]
fn required_string(
    fake: &FakeGitHub,
    req: &Req,
    body: &serde_json::Map<String, Value>,
    name: &str,
) -> Result<String, Response> {
    match typed_field(fake, req, body, name, "string")? {
        Some(Value::String(s)) if !s.trim().is_empty() => Ok(s),
        Some(_) => Err(refuse(
            fake,
            req,
            422,
            "Validation Failed",
            &format!("`{name}` is blank"),
        )),
        None => Err(refuse(
            fake,
            req,
            422,
            &format!("Invalid request.\n\n\"{name}\" wasn't supplied."),
            &format!("no `{name}`"),
        )),
    }
}

/// A pull request body: at most 65 536 characters (`null` is empty).
#[allow(clippy::result_large_err)]
fn pull_body(
    fake: &FakeGitHub,
    req: &Req,
    body: &serde_json::Map<String, Value>,
) -> Result<Option<String>, Response> {
    match typed_field(fake, req, body, "body", "string")? {
        Some(Value::String(s)) if s.chars().count() > MAX_COMMENT_CHARS => Err(refuse(
            fake,
            req,
            422,
            "Validation Failed",
            "`body` is too long (maximum is 65536 characters)",
        )),
        Some(Value::String(s)) => Ok(Some(s)),
        _ => Ok(body.contains_key("body").then(String::new)),
    }
}

/// `maintainer_can_modify: true` on a head in the same repository, which GitHub refuses
/// ("Fork collab can only be enabled on cross-repo pull requests").
#[allow(clippy::result_large_err)]
fn no_fork_collab(
    fake: &FakeGitHub,
    req: &Req,
    body: &serde_json::Map<String, Value>,
) -> Result<(), Response> {
    if typed_field(fake, req, body, "maintainer_can_modify", "boolean")? == Some(json!(true)) {
        note_refused(
            fake,
            req,
            "maintainer_can_modify on a same-repository pull request",
        );
        return Err(validation_failed(json!([{
            "resource": "PullRequest",
            "code": "custom",
            "field": "fork_collab",
            "message": "Fork collab can only be enabled on cross-repo pull requests",
        }])));
    }
    Ok(())
}

/// The fields of `POST /pulls`: title, head, base, body (if given), draft.
#[allow(clippy::result_large_err, clippy::type_complexity)]
fn new_pull_fields(
    fake: &FakeGitHub,
    req: &Req,
    body: &serde_json::Map<String, Value>,
) -> Result<(String, String, String, Option<String>, bool), Response> {
    let allowed = [
        "title",
        "head",
        "base",
        "body",
        "draft",
        "maintainer_can_modify",
    ];
    only_keys(fake, req, body, &allowed)?;
    let title = required_string(fake, req, body, "title")?;
    let head = required_string(fake, req, body, "head")?;
    let base = required_string(fake, req, body, "base")?;
    let text = pull_body(fake, req, body)?;
    let draft = typed_field(fake, req, body, "draft", "boolean")? == Some(json!(true));
    no_fork_collab(fake, req, body)?;
    Ok((title, head, base, text, draft))
}

/// The fields of `PATCH /pulls/{n}` that were given: title, body, state, base.
#[allow(clippy::result_large_err, clippy::type_complexity)]
fn pull_edit_fields(
    fake: &FakeGitHub,
    req: &Req,
    body: &serde_json::Map<String, Value>,
) -> Result<
    (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ),
    Response,
> {
    let allowed = ["title", "body", "state", "base", "maintainer_can_modify"];
    only_keys(fake, req, body, &allowed)?;
    let string = |v: Option<Value>| v.and_then(|v| v.as_str().map(str::to_string));
    let title = string(typed_field(fake, req, body, "title", "string")?);
    let text = pull_body(fake, req, body)?;
    let state = string(typed_field(fake, req, body, "state", "string")?);
    let base = string(typed_field(fake, req, body, "base", "string")?);
    no_fork_collab(fake, req, body)?;
    Ok((title, text, state, base))
}

async fn list_pulls(
    State(fake): State<FakeGitHub>,
    Path((owner, repo)): Path<(String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, PULLS_READ) {
        Ok(k) => k,
        Err(r) => return r,
    };
    if !accepts_json(&req) {
        return refuse(&fake, &req, 415, "Unsupported 'Accept' header", "Accept");
    }
    let known = [
        "state",
        "head",
        "base",
        "sort",
        "direction",
        "per_page",
        "page",
    ];
    if let Some(k) = req.query.keys().find(|k| !known.contains(&k.as_str())) {
        // GitHub ignores unknown parameters; a kodx bug all the same.
        note_refused(&fake, &req, &format!("unknown query parameter `{k}`"));
    }
    let state = req.query.get("state").map_or("open", String::as_str);
    if !["open", "closed", "all"].contains(&state) {
        return refuse(
            &fake,
            &req,
            422,
            "Validation Failed",
            &format!("state={state:?}"),
        );
    }
    let head = match req.query.get("head") {
        Some(h) => match h.split_once(':') {
            Some((o, b)) => Some((o.to_lowercase(), b.to_string())),
            None => {
                // GitHub ignores a head without `owner:` and lists every pull request.
                note_refused(&fake, &req, &format!("head={h:?} has no `owner:` prefix"));
                None
            }
        },
        None => None,
    };
    let base = req.query.get("base").cloned();
    let mut paging = [("per_page", 30u64), ("page", 1u64)];
    for (name, value) in paging.iter_mut() {
        if let Some(text) = req.query.get(*name) {
            match text.parse::<u64>() {
                Ok(v) if v >= 1 => *value = v,
                _ => {
                    return refuse(
                        &fake,
                        &req,
                        422,
                        "Invalid request.",
                        &format!("{name}={text:?}"),
                    )
                }
            }
        }
    }
    let (per_page, page) = (paging[0].1.min(100), paging[1].1);
    let mut st = fake.state();
    let r = &st.repos[&key];
    // Newest first, as GitHub's default `sort=created&direction=desc`.
    let numbers: Vec<u64> = r
        .issues
        .values()
        .rev()
        .filter(|i| state == "all" || i.state == state)
        .filter(|i| {
            let Some(p) = &i.pull else { return false };
            let head_ok = head.as_ref().is_none_or(|(o, b)| {
                let head_owner = p.head.repo.as_deref().and_then(|f| f.split_once('/'));
                head_owner.is_some_and(|(ho, _)| ho.to_lowercase() == *o) && p.head.ref_name == *b
            });
            head_ok && base.as_ref().is_none_or(|b| p.base.ref_name == *b)
        })
        .map(|i| i.number)
        .collect();
    let full_name = r.full_name.clone();
    let last_page = (numbers.len() as u64).div_ceil(per_page).max(1);
    let items: Vec<Value> = numbers
        .iter()
        .skip(((page - 1) * per_page) as usize)
        .take(per_page as usize)
        .map(|&n| pull_json(&fake, &mut st, &key, n))
        .collect();
    let mut resp = json_response(200, Value::Array(items));
    if page < last_page {
        let link = |p: u64, rel: &str| {
            format!(
                "<{}/repos/{full_name}/pulls?state={state}&per_page={per_page}&page={p}>; rel=\"{rel}\"",
                fake.inner.url
            )
        };
        let links = [link(page + 1, "next"), link(last_page, "last")].join(", ");
        resp.headers_mut().insert("link", links.parse().unwrap());
    }
    resp
}

async fn create_pull(
    State(fake): State<FakeGitHub>,
    Path((owner, repo)): Path<(String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, PULLS_WRITE) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let body = match req.json_object(&fake) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (title, head, base, text, draft) = match new_pull_fields(&fake, &req, &body) {
        Ok(x) => x,
        Err(r) => return r,
    };
    let (full_name, clone_url, branch_sha) = {
        let st = fake.state();
        let r = &st.repos[&key];
        (
            r.full_name.clone(),
            r.clone_url.clone(),
            st.branch_sha.clone(),
        )
    };
    let repo_owner = full_name.split_once('/').unwrap().0.to_string();
    let head = match head.split_once(':') {
        None => head,
        Some((o, b)) if o.eq_ignore_ascii_case(&repo_owner) && !b.is_empty() => b.to_string(),
        Some(_) => {
            return refuse(
                &fake,
                &req,
                422,
                "Validation Failed",
                &format!("head {head:?}: heads in other repositories are not modelled"),
            )
        }
    };
    let sha_of = |branch: &str| match &branch_sha {
        Some(f) => f(&full_name, branch),
        None => Some(fake_sha(format!("{full_name}:{branch}").as_bytes())),
    };
    let Some(head_sha) = sha_of(&head) else {
        return validation_failed(json!([
            {"resource": "PullRequest", "field": "head", "code": "invalid"}
        ]));
    };
    let Some(base_sha) = sha_of(&base) else {
        return validation_failed(json!([
            {"resource": "PullRequest", "field": "base", "code": "invalid"}
        ]));
    };
    if head_sha == base_sha {
        return validation_failed(json!([{
            "resource": "PullRequest",
            "code": "custom",
            "message": format!("No commits between {base} and {head}"),
        }]));
    }
    let bot = fake.bot_login();
    let mut st = fake.state();
    let r = st.repos.get_mut(&key).unwrap();
    let duplicate = r.issues.values().any(|i| {
        i.state == "open"
            && i.pull.as_ref().is_some_and(|p| {
                p.head
                    .repo
                    .as_deref()
                    .is_some_and(|f| f.eq_ignore_ascii_case(&full_name))
                    && p.head.ref_name == head
                    && p.base.ref_name == base
            })
    });
    if duplicate {
        return validation_failed(json!([{
            "resource": "PullRequest",
            "code": "custom",
            "message": format!("A pull request already exists for {repo_owner}:{head}."),
        }]));
    }
    // Issues and pull requests share one sequence of numbers.
    let number = r.issues.keys().next_back().map_or(1, |n| n + 1);
    r.issues.insert(
        number,
        Issue {
            number,
            title,
            body: text.unwrap_or_default(),
            author: bot,
            pull: Some(Pull {
                head: FakeHead {
                    ref_name: head,
                    sha: head_sha,
                    repo: Some(full_name.clone()),
                    clone_url,
                },
                base: FakeBase {
                    ref_name: base,
                    sha: base_sha,
                },
                diff: String::new(),
                draft,
                created: true,
                edits: Vec::new(),
            }),
            comments: Vec::new(),
            created_at: iso8601(SystemTime::now()),
            state: "open".into(),
        },
    );
    let mut resp = json_response(201, pull_json(&fake, &mut st, &key, number));
    let location = format!("{}/repos/{full_name}/pulls/{number}", fake.inner.url);
    resp.headers_mut()
        .insert("location", location.parse().unwrap());
    resp
}

async fn update_pull(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, n)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, PULLS_WRITE) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let n = match number(&fake, &req, &n) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let body = match req.json_object(&fake) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let (title, text, state, base) = match pull_edit_fields(&fake, &req, &body) {
        Ok(x) => x,
        Err(r) => return r,
    };
    if title.as_ref().is_some_and(|t| t.trim().is_empty()) {
        return refuse(&fake, &req, 422, "Validation Failed", "`title` is blank");
    }
    if let Some(s) = state
        .as_ref()
        .filter(|s| !["open", "closed"].contains(&s.as_str()))
    {
        return refuse(
            &fake,
            &req,
            422,
            "Validation Failed",
            &format!("state {s:?}"),
        );
    }
    let mut st = fake.state();
    let Some(issue) = st
        .repos
        .get_mut(&key)
        .unwrap()
        .issues
        .get_mut(&n)
        .filter(|i| i.pull.is_some())
    else {
        return gh_error(404, "Not Found");
    };
    if let Some(t) = title {
        issue.title = t;
    }
    if let Some(s) = state {
        issue.state = s;
    }
    let pull = issue.pull.as_mut().unwrap();
    if let Some(b) = base {
        pull.base.ref_name = b;
    }
    if let Some(text) = text {
        pull.edits.push(text.clone());
        issue.body = text;
    }
    json_response(200, pull_json(&fake, &mut st, &key, n))
}

// -------------------------------------------------------------------------------------
// Handlers: users
// -------------------------------------------------------------------------------------

/// `GET /users/{username}`: the App's bot and the users of `add_user`. GitHub serves it
/// without credentials too; credentials given must be a live installation token.
async fn get_user(
    State(fake): State<FakeGitHub>,
    Path(username): Path<String>,
    req: Req,
) -> Response {
    if credential(&req).is_some() {
        if let Err(r) = token_installation(&fake, &req) {
            return r;
        }
    }
    if !accepts_json(&req) {
        return refuse(&fake, &req, 415, "Unsupported 'Accept' header", "Accept");
    }
    let (bot, slug) = (fake.bot_login(), fake.slug());
    let mut st = fake.state();
    let (login, is_bot) = if username.eq_ignore_ascii_case(&bot) {
        (bot, true)
    } else if let Some((login, _)) = st.users.get(&username.to_lowercase()) {
        (login.clone(), false)
    } else {
        return gh_error(404, "Not Found");
    };
    let mut v = user_json(&mut st, &login, is_bot);
    if is_bot {
        v["html_url"] = json!(format!("{}/apps/{slug}", fake.inner.root));
    }
    let extra = json!({
        "avatar_url": format!("https://avatars.githubusercontent.com/u/{}?v=4", v["id"]),
        "url": format!("{}/users/{login}", fake.inner.url),
        "name": null,
        "company": null,
        "blog": "",
        "location": null,
        "email": null,
        "bio": null,
        "public_repos": 0,
        "followers": 0,
        "following": 0,
        "created_at": "2024-01-01T00:00:00Z",
        "updated_at": "2024-01-01T00:00:00Z",
    });
    for (k, val) in extra.as_object().unwrap() {
        v[k] = val.clone();
    }
    json_response(200, v)
}

// -------------------------------------------------------------------------------------
// Handlers: reactions
// -------------------------------------------------------------------------------------

fn react(fake: &FakeGitHub, req: &Req, target: String) -> Response {
    let body = match req.json_object(fake) {
        Ok(b) => b,
        Err(r) => return r,
    };
    let content = match body.get("content") {
        Some(Value::String(c)) if REACTIONS.contains(&c.as_str()) => c.clone(),
        Some(c) => {
            return refuse(
                fake,
                req,
                422,
                "Validation Failed",
                &format!("`content` {c} is not a reaction"),
            )
        }
        None => {
            return refuse(
                fake,
                req,
                422,
                "Invalid request.\n\n\"content\" wasn't supplied.",
                "no `content`",
            )
        }
    };
    let by = fake.bot_login();
    let mut st = fake.state();
    let existing = st
        .reactions
        .iter()
        .position(|r| r.target == target && r.content == content && r.by == by);
    let (status, index) = match existing {
        Some(i) => (200, i),
        None => {
            let id = st.next_id();
            st.reactions.push(Reaction {
                id,
                target,
                content,
                by: by.clone(),
                created_at: iso8601(SystemTime::now()),
            });
            (201, st.reactions.len() - 1)
        }
    };
    let (id, content, created_at) = {
        let r = &st.reactions[index];
        (r.id, r.content.clone(), r.created_at.clone())
    };
    let user = user_json(&mut st, &by, true);
    json_response(
        status,
        json!({
            "id": id,
            "node_id": format!("REA_{id}"),
            "user": user,
            "content": content,
            "created_at": created_at,
        }),
    )
}

async fn react_issue(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, n)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, ISSUES_WRITE) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let n = match number(&fake, &req, &n) {
        Ok(n) => n,
        Err(r) => return r,
    };
    let full_name = {
        let st = fake.state();
        if !st.repos[&key].issues.contains_key(&n) {
            return gh_error(404, "Not Found");
        }
        st.repos[&key].full_name.clone()
    };
    react(&fake, &req, format!("{full_name}/issues/{n}"))
}

async fn react_issue_comment(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, id)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, ISSUES_WRITE) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let id = match comment_in(&fake, &req, &key, &id) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let full_name = fake.state().repos[&key].full_name.clone();
    react(&fake, &req, format!("{full_name}/issues/comments/{id}"))
}

async fn react_review_comment(
    State(fake): State<FakeGitHub>,
    Path((owner, repo, id)): Path<(String, String, String)>,
    req: Req,
) -> Response {
    let key = match auth_installation(&fake, &req, &owner, &repo, PULLS_WRITE) {
        Ok(k) => k,
        Err(r) => return r,
    };
    let id = match number(&fake, &req, &id) {
        Ok(id) => id,
        Err(r) => return r,
    };
    let full_name = {
        let st = fake.state();
        match st.review_comments.get(&id) {
            Some(c) if c.repo == key && st.repos[&key].issues.contains_key(&c.pull) => {}
            _ => return gh_error(404, "Not Found"),
        }
        st.repos[&key].full_name.clone()
    };
    react(&fake, &req, format!("{full_name}/pulls/comments/{id}"))
}

// -------------------------------------------------------------------------------------
// Helpers
// -------------------------------------------------------------------------------------

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// `2016-07-11T22:14:10Z`.
fn iso8601(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).unwrap().as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60
    )
}

/// Base64 wrapped every 60 characters, each line ending in `\n`, as the contents API does.
fn base64_wrapped(bytes: &[u8]) -> String {
    use base64::Engine as _;
    let flat = base64::engine::general_purpose::STANDARD.encode(bytes);
    let mut out = String::new();
    for line in flat.as_bytes().chunks(60) {
        out.push_str(std::str::from_utf8(line).unwrap());
        out.push('\n');
    }
    out
}

fn fake_sha(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(&sha2::Sha256::digest(bytes)[..20])
}

fn parse_query(query: &str) -> HashMap<String, String> {
    query
        .split('&')
        .filter(|kv| !kv.is_empty())
        .map(|kv| {
            let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
            (percent_decode(k), percent_decode(v))
        })
        .collect()
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match b[i] {
            b'%' if i + 2 < b.len() && hex(b[i + 1]).is_some() && hex(b[i + 2]).is_some() => {
                out.push((hex(b[i + 1]).unwrap() * 16 + hex(b[i + 2]).unwrap()) as u8);
                i += 3;
                continue;
            }
            b'+' => out.push(b' '),
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

// ---------------------------------------------------------------------------------------
// The manifest flow's web side: the form GitHub shows at /settings/apps/new (here it
// validates the posted manifest and "creates" the App at once), and the conversion.
// ---------------------------------------------------------------------------------------

fn web_routes() -> Router<FakeGitHub> {
    Router::new()
        .route("/settings/apps/new", post(new_app_form))
        .route("/organizations/{org}/settings/apps/new", post(new_app_form))
        .route("/user-attachments/assets/{id}", get(assets_api::get_asset))
}

/// What GitHub's manifest validator refuses, as one line; `None` when it takes it.
pub fn manifest_problem(m: &Value) -> Option<String> {
    fn null_at(v: &Value, path: &str) -> Option<String> {
        match v {
            Value::Null => Some(path.to_string()),
            Value::Array(a) => a
                .iter()
                .enumerate()
                .find_map(|(i, x)| null_at(x, &format!("{path}[{i}]"))),
            Value::Object(o) => o
                .iter()
                .find_map(|(k, x)| null_at(x, &format!("{path}.{k}"))),
            _ => None,
        }
    }
    let Some(obj) = m.as_object() else {
        return Some("the manifest is not a JSON object".into());
    };
    if let Some(p) = null_at(m, "manifest") {
        return Some(format!("{p} is null"));
    }
    let url_field = |v: Option<&Value>, name: &str| match v.and_then(Value::as_str) {
        Some(u) if u.starts_with("http://") || u.starts_with("https://") => None,
        _ => Some(format!("{name} must be an http(s) URL")),
    };
    if let Some(p) = url_field(obj.get("url"), "url") {
        return Some(p);
    }
    if let Some(p) = url_field(m.pointer("/hook_attributes/url"), "hook_attributes.url") {
        return Some(p);
    }
    if let Some(p) = url_field(obj.get("redirect_url"), "redirect_url") {
        return Some(p);
    }
    if let Some(name) = obj.get("name") {
        if !name
            .as_str()
            .is_some_and(|n| !n.is_empty() && n.chars().count() <= 34)
        {
            return Some("name must be 1–34 characters".into());
        }
    }
    if obj.get("public").is_some_and(|p| !p.is_boolean()) {
        return Some("public must be a boolean".into());
    }
    let Some(perms) = obj.get("default_permissions").and_then(Value::as_object) else {
        return Some("default_permissions must be an object".into());
    };
    for (p, level) in perms {
        if !matches!(level.as_str(), Some("read" | "write" | "admin")) {
            return Some(format!(
                "default_permissions.{p} must be read, write or admin"
            ));
        }
    }
    let Some(events) = obj.get("default_events").and_then(Value::as_array) else {
        return Some("default_events must be an array".into());
    };
    if events.iter().any(|e| !e.is_string()) {
        return Some("default_events must be event names".into());
    }
    let known = |p: &str| APP_PERMISSIONS.iter().any(|(k, _)| *k == p);
    if let Some((p, _)) = perms.iter().find(|(p, _)| !known(p)) {
        return Some(format!(
            "default_permissions.{p} is not a permission this fake knows"
        ));
    }
    None
}

async fn new_app_form(
    State(fake): State<FakeGitHub>,
    org: Option<Path<String>>,
    req: Req,
) -> Response {
    let form = parse_query(&String::from_utf8_lossy(&req.body));
    let html_error = |fake: &FakeGitHub, why: String| {
        note_refused(fake, &req, &why);
        (
            StatusCode::UNPROCESSABLE_ENTITY,
            [("content-type", "text/html")],
            format!("<h1>Invalid GitHub App configuration</h1><p>{why}</p>"),
        )
            .into_response()
    };
    let Some(text) = form.get("manifest") else {
        return html_error(&fake, "no `manifest` form field".into());
    };
    let manifest: Value = match serde_json::from_str(text) {
        Ok(v) => v,
        Err(e) => return html_error(&fake, format!("the manifest is not JSON: {e}")),
    };
    if let Some(why) = manifest_problem(&manifest) {
        return html_error(&fake, why);
    }
    let state = req.query.get("state").cloned().unwrap_or_default();
    let owner = org.map(|Path(o)| o).unwrap_or_else(|| "octocat".into());
    let code = format!("{:032x}", rand::random::<u128>());
    fake.inner
        .manifest_codes
        .lock()
        .unwrap()
        .insert(code.clone(), (manifest.clone(), owner));
    let redirect = manifest["redirect_url"].as_str().unwrap();
    let sep = if redirect.contains('?') { '&' } else { '?' };
    let state = percent_encoding::utf8_percent_encode(&state, percent_encoding::NON_ALPHANUMERIC);
    (
        StatusCode::FOUND,
        [(
            "location",
            format!("{redirect}{sep}code={code}&state={state}"),
        )],
    )
        .into_response()
}

/// `POST /app-manifests/{code}/conversions`: GitHub's documented answer, with a freshly
/// made RSA key; from now on the fake is this App (its id, and JWTs signed by that key).
async fn convert_manifest(
    State(fake): State<FakeGitHub>,
    Path(code): Path<String>,
    req: Req,
) -> Response {
    let Some((manifest, owner)) = fake.inner.manifest_codes.lock().unwrap().remove(&code) else {
        return refuse(
            &fake,
            &req,
            404,
            "Not Found",
            "unknown or used manifest code",
        );
    };
    let (pem, public) = new_rsa_key();
    let id = fake.app_id() + 1000;
    let name = manifest["name"].as_str().unwrap_or("kodx").to_string();
    let slug: String = name
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    let webhook_secret = format!("{:032x}", rand::random::<u128>());
    *fake.inner.app.lock().unwrap() = (
        id,
        DecodingKey::from_rsa_pem(public.as_bytes()).expect("openssl's public key"),
    );
    fake.set_slug(&slug);
    let mut st = fake.state();
    let owner_json = user_json(&mut st, &owner, false);
    drop(st);
    json_response(
        201,
        json!({
            "id": id,
            "slug": slug,
            "node_id": format!("A_{id}"),
            "owner": owner_json,
            "name": name,
            "description": manifest.get("description").cloned().unwrap_or(Value::from("")),
            "external_url": manifest["url"],
            "html_url": format!("{}/apps/{slug}", fake.inner.root),
            "created_at": "2024-01-01T00:00:00Z",
            "updated_at": "2024-01-01T00:00:00Z",
            "permissions": manifest["default_permissions"],
            "events": manifest["default_events"],
            "client_id": format!("Iv1.{:016x}", rand::random::<u64>()),
            "client_secret": format!("{:040x}", rand::random::<u128>()),
            "webhook_secret": webhook_secret,
            "pem": pem,
        }),
    )
}

/// A new 2048-bit RSA key (PKCS#1 PEM, as GitHub hands out) and its public key.
fn new_rsa_key() -> (String, String) {
    let run = |args: &[&str], input: Option<&str>| {
        use std::io::Write as _;
        let mut child = std::process::Command::new("openssl")
            .args(args)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("openssl runs");
        if let Some(i) = input {
            child.stdin.take().unwrap().write_all(i.as_bytes()).unwrap();
        } else {
            drop(child.stdin.take());
        }
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "openssl {args:?} failed");
        String::from_utf8(out.stdout).unwrap()
    };
    let pem = run(&["genrsa", "-traditional", "2048"], None);
    let public = run(&["rsa", "-pubout"], Some(&pem));
    (pem, public)
}
