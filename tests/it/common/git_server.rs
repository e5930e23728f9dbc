//! A smart-HTTP git server for tests: the real `git http-backend` run as CGI for each
//! request, behind HTTP basic auth as GitHub does it (`x-access-token:<token>`).
//!
//! Every request must carry `Authorization: Basic base64(x-access-token:<token>)` with a
//! token the [`TokenCheck`] accepts for that repository and use (fetch or push); otherwise
//! the answer is `401` with `WWW-Authenticate: Basic realm="git"` (and git's first,
//! anonymous request always gets one), `403` for a token that may not push, or `404` for a
//! repository the token was not minted for ([`accept_github`] asks the fake GitHub). Every request is recorded, so tests can assert that no token was ever in a URL.
//!
//! The server runs on its own thread and runtime, so it serves both blocking tests and
//! tests on any tokio runtime. Repositories are made with the `git` CLI, isolated from the
//! host's configuration (`GIT_CONFIG_NOSYSTEM`, a `HOME` of its own).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Router;
use tokio::io::AsyncWriteExt;

/// Decides whether a token may use the server: `true` lets the request through.
pub type TokenCheck = Arc<dyn Fn(&str, &GitUse) -> Verdict + Send + Sync>;

/// What a request wants: the repository (`owner/name`) and whether it pushes
/// (`git-receive-pack`) or fetches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitUse {
    pub repo: String,
    pub push: bool,
}

/// The answer to a token for a use, as GitHub gives it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Allow,
    /// Unknown or expired token: 401 with a basic-auth challenge.
    Unauthorized,
    /// The token may not do this (e.g. push with `contents: read`): 403.
    Forbidden,
    /// The token was not minted for this repository: 404.
    NotFound,
}

impl GitUse {
    /// From a smart-HTTP path (`/o/r.git/info/refs`, `/o/r.git/git-receive-pack`) and query.
    fn of(path: &str, query: &str) -> GitUse {
        let trimmed = path.trim_start_matches('/');
        let repo = match trimmed.find(".git/") {
            Some(i) => &trimmed[..i],
            None => trimmed.strip_suffix(".git").unwrap_or(trimmed),
        };
        GitUse {
            repo: repo.to_string(),
            push: path.ends_with("/git-receive-pack")
                || query.split('&').any(|kv| kv == "service=git-receive-pack"),
        }
    }
}

/// The user name GitHub expects with an installation token.
pub const USERNAME: &str = "x-access-token";

/// One request as the server saw it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    /// Path and query string, as sent.
    pub path_and_query: String,
    /// The basic-auth user name, if the request carried one.
    pub username: Option<String>,
    /// Whether the credentials were `x-access-token` and a token the check accepted for
    /// this repository and use.
    pub auth_ok: bool,
    /// Whether the request was part of a push (`git-receive-pack`).
    pub push: bool,
    pub content_encoding: Option<String>,
    /// The status answered.
    pub status: u16,
    /// When it arrived.
    pub at: std::time::Instant,
    /// How long the server took to answer (the `git http-backend` it ran, for most).
    pub took: std::time::Duration,
    /// The request body's size in bytes (a push's commands and pack).
    pub body_bytes: usize,
}

struct Shared {
    root: PathBuf,
    home: PathBuf,
    accept: TokenCheck,
    requests: Mutex<Vec<RecordedRequest>>,
}

pub struct GitServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    dir: tempfile::TempDir,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

/// Whether the `git` CLI (with `http-backend`) can be run.
pub fn git_available() -> bool {
    Command::new("git")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
}

fn allow_if(ok: bool) -> Verdict {
    if ok {
        Verdict::Allow
    } else {
        Verdict::Unauthorized
    }
}

/// A check accepting exactly these tokens, for any repository and to push.
pub fn accept_tokens(tokens: &[&str]) -> TokenCheck {
    let tokens: Vec<String> = tokens.iter().map(|t| t.to_string()).collect();
    Arc::new(move |t, _| allow_if(tokens.iter().any(|k| k == t)))
}

/// A check accepting the tokens in a set the test fills as it goes, for any use.
pub fn accept_shared(tokens: Arc<Mutex<std::collections::HashSet<String>>>) -> TokenCheck {
    Arc::new(move |t, _| allow_if(tokens.lock().unwrap().contains(t)))
}

/// The value of an `Authorization` header for basic auth.
pub fn basic_auth(user: &str, password: &str) -> String {
    format!(
        "Basic {}",
        base64_encode(format!("{user}:{password}").as_bytes())
    )
}

impl GitServer {
    /// Starts a server on 127.0.0.1 (a free port) that lets in tokens `accept` approves.
    pub fn start(accept: TokenCheck) -> GitServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let root = dir.path().join("repos");
        let home = dir.path().join("home");
        std::fs::create_dir_all(&root).unwrap();
        std::fs::create_dir_all(&home).unwrap();
        let shared = Arc::new(Shared {
            root,
            home,
            accept,
            requests: Mutex::default(),
        });
        let (addr_tx, addr_rx) = std::sync::mpsc::channel();
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
        let state = shared.clone();
        std::thread::Builder::new()
            .name("git-server".into())
            .spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .expect("runtime");
                rt.block_on(async move {
                    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
                    addr_tx.send(listener.local_addr().unwrap()).unwrap();
                    let app = Router::new().fallback(handle).with_state(state);
                    let stopped = async {
                        let _ = stop_rx.await;
                    };
                    // Stop at once when asked: lingering keep-alive connections must not
                    // keep the thread alive.
                    tokio::select! {
                        r = std::future::IntoFuture::into_future(axum::serve(listener, app)) => r.unwrap(),
                        _ = stopped => {}
                    }
                });
            })
            .expect("server thread");
        let addr = addr_rx.recv().expect("server address");
        GitServer {
            addr,
            shared,
            dir,
            stop: Some(stop_tx),
        }
    }

    /// `http://127.0.0.1:<port>`
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The URL git clones `owner/name` from.
    pub fn clone_url(&self, repo: &str) -> String {
        format!("{}/{repo}.git", self.url())
    }

    /// Where the bare repository `owner/name` lives.
    pub fn bare_path(&self, repo: &str) -> PathBuf {
        self.shared.root.join(format!("{repo}.git"))
    }

    /// Every request so far.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.shared.requests.lock().unwrap().clone()
    }

    /// Creates the bare repository `owner/name` with one commit of `files` (path,
    /// contents, mode such as `0o644`, `0o755` or `0o120000` for a symlink) on
    /// `default_branch`, which `HEAD` points at. Returns its clone URL.
    pub fn create_repo(
        &self,
        repo: &str,
        default_branch: &str,
        files: &[(&str, &[u8], u32)],
    ) -> String {
        let bare = self.bare_path(repo);
        std::fs::create_dir_all(&bare).unwrap();
        self.git(
            &bare,
            &["init", "-q", "--bare", "--initial-branch", default_branch],
        );
        self.commit(
            repo,
            &format!("refs/heads/{default_branch}"),
            None,
            files,
            "Initial commit",
        );
        self.clone_url(repo)
    }

    /// Commits `files` on top of `base` (a full ref or sha of the bare repository; `None`
    /// for a root commit) and sets `target_ref` to it (forced). Returns the new sha.
    pub fn commit(
        &self,
        repo: &str,
        target_ref: &str,
        base: Option<&str>,
        files: &[(&str, &[u8], u32)],
        message: &str,
    ) -> String {
        let bare = self.bare_path(repo);
        let work = tempfile::tempdir_in(self.dir.path()).unwrap();
        let w = work.path();
        self.git(w, &["init", "-q"]);
        if let Some(base) = base {
            let bare_str = bare.to_str().unwrap();
            self.git(w, &["fetch", "-q", bare_str, &format!("{base}:refs/base")]);
            self.git(w, &["checkout", "-q", "-B", "work", "refs/base"]);
        } else {
            self.git(w, &["checkout", "-q", "--orphan", "work"]);
        }
        write_files(w, files);
        self.git(w, &["add", "-A"]);
        self.git(w, &["commit", "-q", "--allow-empty", "-m", message]);
        self.git(
            w,
            &[
                "push",
                "-q",
                bare.to_str().unwrap(),
                &format!("+HEAD:{target_ref}"),
            ],
        );
        self.rev_parse(w, "HEAD").unwrap()
    }

    /// Commits `files` on `branch` (created from the default branch if missing).
    pub fn commit_on_branch(
        &self,
        repo: &str,
        branch: &str,
        files: &[(&str, &[u8], u32)],
        message: &str,
    ) -> String {
        let target = format!("refs/heads/{branch}");
        let base = if self.branch_sha(repo, branch).is_some() {
            target.clone()
        } else {
            self.default_ref(repo)
        };
        self.commit(repo, &target, Some(&base), files, message)
    }

    /// Makes `refs/pull/<n>/head`: a commit of `files` on top of the default branch.
    pub fn create_pull_ref(&self, repo: &str, n: u64, files: &[(&str, &[u8], u32)]) -> String {
        let base = self.default_ref(repo);
        self.commit(
            repo,
            &format!("refs/pull/{n}/head"),
            Some(&base),
            files,
            &format!("Pull request #{n}"),
        )
    }

    /// The ref the bare repository's `HEAD` points at, e.g. `refs/heads/main`.
    pub fn default_ref(&self, repo: &str) -> String {
        let out = self.git(&self.bare_path(repo), &["symbolic-ref", "HEAD"]);
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }

    /// Sets a configuration value of the bare repository (e.g. `receive.denyNonFastForwards`).
    pub fn set_config(&self, repo: &str, key: &str, value: &str) {
        self.git(&self.bare_path(repo), &["config", key, value]);
    }

    /// The sha `refs/heads/<branch>` points at, if it exists.
    pub fn branch_sha(&self, repo: &str, branch: &str) -> Option<String> {
        self.ref_sha(repo, &format!("refs/heads/{branch}"))
    }

    /// The commit a ref or revision points at, if it exists.
    pub fn ref_sha(&self, repo: &str, rev: &str) -> Option<String> {
        self.rev_parse(&self.bare_path(repo), &format!("{rev}^{{commit}}"))
    }

    /// The contents of `path` at `rev`, if it exists there.
    pub fn file_at(&self, repo: &str, rev: &str, path: &str) -> Option<Vec<u8>> {
        let out = self
            .git_cmd(&self.bare_path(repo))
            .args(["show", &format!("{rev}:{path}")])
            .output()
            .unwrap();
        out.status.success().then_some(out.stdout)
    }

    /// The paths the commit `rev` changes against its first parent, sorted.
    pub fn changed_files(&self, repo: &str, rev: &str) -> Vec<String> {
        let out = self.git(
            &self.bare_path(repo),
            &["diff", "--name-only", "-z", &format!("{rev}^"), rev],
        );
        let mut paths: Vec<String> = out
            .stdout
            .split(|b| *b == 0)
            .filter(|p| !p.is_empty())
            .map(|p| String::from_utf8_lossy(p).into_owned())
            .collect();
        paths.sort();
        paths
    }

    /// `(mode, path)` of every file at `rev`, e.g. `(0o100755, "run.sh")`.
    pub fn ls_tree(&self, repo: &str, rev: &str) -> Vec<(u32, String)> {
        let out = self.git(&self.bare_path(repo), &["ls-tree", "-r", "-z", rev]);
        out.stdout
            .split(|b| *b == 0)
            .filter(|e| !e.is_empty())
            .map(|entry| {
                let entry = String::from_utf8_lossy(entry);
                let (meta, path) = entry.split_once('\t').unwrap();
                let mode = meta.split(' ').next().unwrap();
                (u32::from_str_radix(mode, 8).unwrap(), path.to_string())
            })
            .collect()
    }

    /// Number of commits reachable from `rev`.
    pub fn commit_count(&self, repo: &str, rev: &str) -> usize {
        let out = self.git(&self.bare_path(repo), &["rev-list", "--count", rev]);
        String::from_utf8(out.stdout)
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    }

    /// A `git` command in `dir`, isolated from the host's configuration.
    pub fn git_cmd(&self, dir: &Path) -> Command {
        git_command(&self.shared.home, dir)
    }

    /// Runs `git args` in `dir`; panics (with git's stderr) if it fails.
    pub fn git(&self, dir: &Path, args: &[&str]) -> Output {
        let out = self.git_cmd(dir).args(args).output().expect("run git");
        assert!(
            out.status.success(),
            "git {args:?} in {} failed: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    fn rev_parse(&self, dir: &Path, rev: &str) -> Option<String> {
        let out = self
            .git_cmd(dir)
            .args(["rev-parse", "-q", "--verify", rev])
            .output()
            .unwrap();
        out.status
            .success()
            .then(|| String::from_utf8(out.stdout).unwrap().trim().to_string())
    }
}

impl Drop for GitServer {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

/// A `git` command in `dir` that ignores the host's system and global configuration.
/// Runs `cmd` (git) with `args`, failing the test with git's stderr; its stdout.
pub fn git_ok(mut cmd: Command, args: &[&str]) -> String {
    let out = cmd.args(args).output().unwrap();
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

pub fn git_command(home: &Path, dir: &Path) -> Command {
    let mut cmd = Command::new("git");
    cmd.current_dir(dir)
        .env_remove("XDG_CONFIG_HOME")
        .env_remove("GIT_DIR")
        .env_remove("GIT_WORK_TREE")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("HOME", home)
        .env("GIT_TERMINAL_PROMPT", "0")
        .env("GIT_AUTHOR_NAME", "Test Author")
        .env("GIT_AUTHOR_EMAIL", "author@example.com")
        .env("GIT_COMMITTER_NAME", "Test Author")
        .env("GIT_COMMITTER_EMAIL", "author@example.com")
        .stdin(Stdio::null());
    cmd
}

/// Writes `(path, contents, mode)` under `dir`; mode `0o120000` makes a symlink to
/// `contents`.
pub fn write_files(dir: &Path, files: &[(&str, &[u8], u32)]) {
    use std::os::unix::fs::PermissionsExt;
    for (path, contents, mode) in files {
        let full = dir.join(path);
        if let Some(parent) = full.parent() {
            std::fs::create_dir_all(parent).unwrap();
        }
        let _ = std::fs::remove_file(&full);
        if mode & 0o170000 == 0o120000 {
            let target = std::str::from_utf8(contents).unwrap();
            std::os::unix::fs::symlink(target, &full).unwrap();
        } else {
            std::fs::write(&full, contents).unwrap();
            std::fs::set_permissions(&full, std::fs::Permissions::from_mode(mode & 0o777)).unwrap();
        }
    }
}

async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let method = req.method().as_str().to_string();
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let path_and_query = req
        .uri()
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_default();
    let headers = req.headers().clone();
    let content_encoding = header_str(&headers, header::CONTENT_ENCODING);
    let wants = GitUse::of(&path, &query);
    let began = std::time::Instant::now();
    let body_bytes = std::sync::atomic::AtomicUsize::new(0);
    let (username, verdict) = match credentials(&headers) {
        Some((user, token)) => {
            let verdict = if user == USERNAME {
                (shared.accept)(&token, &wants)
            } else {
                Verdict::Unauthorized
            };
            (Some(user), verdict)
        }
        None => (None, Verdict::Unauthorized),
    };
    let auth_ok = verdict == Verdict::Allow;
    let push = wants.push;
    let record = |status: StatusCode| {
        shared.requests.lock().unwrap().push(RecordedRequest {
            method: method.clone(),
            path_and_query: path_and_query.clone(),
            username: username.clone(),
            auth_ok,
            push,
            content_encoding: content_encoding.clone(),
            status: status.as_u16(),
            at: began,
            took: began.elapsed(),
            body_bytes: body_bytes.load(std::sync::atomic::Ordering::Relaxed),
        });
    };
    match verdict {
        Verdict::Allow | Verdict::Unauthorized => {}
        Verdict::Forbidden => {
            record(StatusCode::FORBIDDEN);
            return (
                StatusCode::FORBIDDEN,
                format!("Permission to {}.git denied to the token.\n", wants.repo),
            )
                .into_response();
        }
        Verdict::NotFound => {
            record(StatusCode::NOT_FOUND);
            return (StatusCode::NOT_FOUND, "Repository not found.\n").into_response();
        }
    }
    if !auth_ok {
        record(StatusCode::UNAUTHORIZED);
        return (
            StatusCode::UNAUTHORIZED,
            [(header::WWW_AUTHENTICATE, "Basic realm=\"git\"")],
            "authentication required\n",
        )
            .into_response();
    }
    if path.split('/').any(|seg| seg == "..") {
        record(StatusCode::BAD_REQUEST);
        return (StatusCode::BAD_REQUEST, "bad path\n").into_response();
    }
    let body = match axum::body::to_bytes(req.into_body(), 256 << 20).await {
        Ok(b) => {
            body_bytes.store(b.len(), std::sync::atomic::Ordering::Relaxed);
            b
        }
        Err(e) => {
            record(StatusCode::BAD_REQUEST);
            return (StatusCode::BAD_REQUEST, format!("bad body: {e}\n")).into_response();
        }
    };

    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("http-backend")
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", &shared.home)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_PROJECT_ROOT", &shared.root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("SERVER_PROTOCOL", "HTTP/1.1")
        .env("REQUEST_METHOD", &method)
        .env("PATH_INFO", &path)
        .env("QUERY_STRING", &query)
        .env("CONTENT_LENGTH", body.len().to_string())
        .env("REMOTE_ADDR", "127.0.0.1")
        // A named user turns on receive-pack (push), as on an authenticated server.
        .env("REMOTE_USER", USERNAME)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(ct) = header_str(&headers, header::CONTENT_TYPE) {
        cmd.env("CONTENT_TYPE", ct);
    }
    // http-backend inflates gzip request bodies itself when told of them.
    if let Some(ce) = &content_encoding {
        cmd.env("HTTP_CONTENT_ENCODING", ce);
    }
    if let Some(proto) = headers.get("git-protocol").and_then(|v| v.to_str().ok()) {
        cmd.env("HTTP_GIT_PROTOCOL", proto);
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => {
            record(StatusCode::INTERNAL_SERVER_ERROR);
            return (
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("cannot run git http-backend: {e}\n"),
            )
                .into_response();
        }
    };
    let mut stdin = child.stdin.take().unwrap();
    let writer = tokio::spawn(async move {
        // http-backend may stop reading early (e.g. on a bad request); that is its call.
        let _ = stdin.write_all(&body).await;
        let _ = stdin.shutdown().await;
    });
    let output = child.wait_with_output().await;
    let _ = writer.await;
    let output = match output {
        Ok(o) => o,
        Err(e) => {
            record(StatusCode::INTERNAL_SERVER_ERROR);
            return (StatusCode::INTERNAL_SERVER_ERROR, format!("{e}\n")).into_response();
        }
    };
    let response = match parse_cgi(&output.stdout) {
        Some(r) => r,
        None => {
            eprintln!(
                "git http-backend gave no CGI response for {method} {path_and_query}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            (
                StatusCode::BAD_GATEWAY,
                "git http-backend gave no CGI response\n",
            )
                .into_response()
        }
    };
    record(response.status());
    response
}

/// Splits a CGI response into status, headers and body.
pub fn parse_cgi(out: &[u8]) -> Option<Response> {
    let (head_len, sep_len) = find(out, b"\r\n\r\n")
        .map(|i| (i, 4))
        .or_else(|| find(out, b"\n\n").map(|i| (i, 2)))?;
    let head = std::str::from_utf8(&out[..head_len]).ok()?;
    let body = out[head_len + sep_len..].to_vec();
    let mut status = StatusCode::OK;
    let mut builder = Response::builder();
    for line in head.lines() {
        let (name, value) = line.split_once(':')?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split(' ').next()?.parse::<u16>().ok()?;
            status = StatusCode::from_u16(code).ok()?;
        } else {
            builder = builder.header(name.trim(), HeaderValue::from_str(value).ok()?);
        }
    }
    builder.status(status).body(Body::from(body)).ok()
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn header_str(headers: &HeaderMap, name: header::HeaderName) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

/// `(user, password)` from an `Authorization: Basic …` header.
fn credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let (scheme, encoded) = value.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = String::from_utf8(base64_decode(encoded.trim())?).ok()?;
    let (user, password) = decoded.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

pub fn base64_encode(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

/// Standard base64 with padding; `None` if malformed.
pub fn base64_decode(text: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

/// A server that accepts `token`, or `None` (loudly) without a `git` CLI outside CI.
pub fn start_or_skip(token: &str) -> Option<GitServer> {
    if git_available() {
        return Some(GitServer::start(accept_tokens(&[token])));
    }
    if std::env::var("CI").is_ok_and(|v| v == "true" || v == "1") {
        panic!("CI=true but the git CLI (with http-backend) is missing");
    }
    eprintln!("\n*** SKIPPED: no git CLI to run git http-backend; install git ***\n");
    None
}

/// Fails if any request put `token` in its URL, or carried credentials the server refused
/// or failed; only git's first, anonymous probe goes without credentials (a 401).
pub fn assert_requests_clean(srv: &GitServer, token: &str) {
    let requests = srv.requests();
    assert!(!requests.is_empty());
    for r in &requests {
        assert!(!r.path_and_query.contains(token), "token in URL: {r:?}");
        if r.username.is_some() {
            assert!(r.auth_ok, "refused credentials: {r:?}");
            assert!(r.status < 400, "request failed: {r:?}");
        } else {
            assert_eq!(r.status, 401, "{r:?}");
        }
    }
}
