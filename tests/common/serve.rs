//! Drives the real `kodx serve` binary for end-to-end tests: a fake GitHub, a real git
//! server over smart HTTP that only accepts the installation tokens the fake GitHub issued,
//! for the repositories and with the `contents` permission they were minted with,
//! a scripted fake Anthropic, a real SQLite file, and the real Docker engine.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::fake_anthropic::FakeAnthropic;
use super::fake_github::{FakeGitHub, TEST_APP_KEY};
use super::git_server::GitServer;

pub const APP_ID: u64 = 4242;
pub const INSTALLATION: u64 = 77;
pub const SECRET: &str = "it's a secret to everybody";
pub const MODEL_KEY: &str = "sk-ant-test-key-0123456789";
pub const REPO: &str = "acme/widgets";

/// A running `kodx serve` and the fakes around it.
pub struct Served {
    pub url: String,
    pub github: FakeGitHub,
    pub git: GitServer,
    pub model: FakeAnthropic,
    pub clone_url: String,
    pub dir: tempfile::TempDir,
    pub log: Arc<Mutex<String>>,
    child: tokio::process::Child,
    env: Vec<(String, String)>,
    workers: bool,
    pid_namespace: bool,
    fd_limit: Option<u64>,
    http: reqwest::Client,
}

/// What the server is started with beyond the defaults.
#[derive(Default)]
pub struct Options {
    pub workers: bool,
    pub settings: Option<&'static str>,
    pub extra_env: Vec<(String, String)>,
    /// Run `kodx serve` as PID 1 of its own PID namespace (`unshare --pid --fork
    /// --mount-proc`), as in the shipped image where it is the container's init.
    pub pid_namespace: bool,
    /// RLIMIT_NOFILE (soft and hard) of the server process.
    pub fd_limit: Option<u64>,
}

impl Served {
    /// Starts the fakes, a repository `acme/widgets` (on the git server and the fake GitHub,
    /// installation 77, `alice` admin) and `kodx serve` on port 0.
    pub async fn start(opts: Options) -> Served {
        let github = FakeGitHub::start(APP_ID).await;
        github.add_installation(INSTALLATION, "acme");
        // The git server lets a token do what the fake GitHub minted it for, no more.
        let git = GitServer::start(accept_github(github.clone()));
        let clone_url = git.create_repo(
            REPO,
            "main",
            &[
                ("README.md", b"# widgets\n", 0o644),
                ("src/lib.rs", b"pub fn widget() -> u32 { 42 }\n", 0o644),
            ],
        );
        github.add_repo(INSTALLATION, REPO, "main", &clone_url, true);
        // Pull requests can only be opened from branches that exist on the git server.
        let root = git
            .bare_path(REPO)
            .parent()
            .unwrap()
            .parent()
            .unwrap()
            .to_path_buf();
        github.set_branch_exists(move |repo, branch| {
            std::process::Command::new("git")
                .arg("--git-dir")
                .arg(root.join(format!("{repo}.git")))
                .args([
                    "rev-parse",
                    "--verify",
                    "-q",
                    &format!("refs/heads/{branch}"),
                ])
                .output()
                .is_ok_and(|o| o.status.success())
        });
        github.add_user("alice", 1005);
        github.set_bot_user_id(9999);
        github.set_permission(REPO, "alice", "admin");
        let model = FakeAnthropic::start(MODEL_KEY).await;
        let dir = tempfile::tempdir().unwrap();
        let settings = dir.path().join("kodx.toml");
        std::fs::write(
            &settings,
            opts.settings
                .unwrap_or("status_interval_secs = 0.2\nshutdown_grace_secs = 5\n"),
        )
        .unwrap();
        let tmp = dir.path().join("tmp");
        std::fs::create_dir(&tmp).unwrap();
        let key = dir.path().join("app-key.pem");
        std::fs::write(&key, TEST_APP_KEY).unwrap();

        let mut env: Vec<(String, String)> = vec![
            ("APP_ID".into(), APP_ID.to_string()),
            ("PRIVATE_KEY_PATH".into(), key.display().to_string()),
            ("WEBHOOK_SECRET".into(), SECRET.into()),
            ("GITHUB_API_URL".into(), github.url()),
            ("HOST".into(), "127.0.0.1".into()),
            ("PORT".into(), "0".into()),
            (
                "DATABASE_URL".into(),
                format!("sqlite://{}", dir.path().join("kodx.db").display()),
            ),
            ("KODX_CONFIG".into(), settings.display().to_string()),
            ("KODX_IMAGE".into(), super::image()),
            ("ANTHROPIC_API_KEY".into(), MODEL_KEY.into()),
            ("ANTHROPIC_BASE_URL".into(), model.url.clone()),
            ("KODX_LOG".into(), "info,kodx=debug".into()),
            // Clones go there: a killed server's leftovers go with the test's directory.
            ("TMPDIR".into(), tmp.display().to_string()),
        ];
        env.extend(opts.extra_env.iter().cloned());
        let log = Arc::new(Mutex::new(String::new()));
        let (child, url) = spawn(
            &env,
            opts.workers,
            opts.pid_namespace,
            opts.fd_limit,
            dir.path(),
            &log,
        )
        .await;
        Served {
            url,
            github,
            git,
            model,
            clone_url,
            dir,
            log,
            child,
            env,
            workers: opts.workers,
            pid_namespace: opts.pid_namespace,
            fd_limit: opts.fd_limit,
            http: {
                let _ = rustls::crypto::ring::default_provider().install_default();
                reqwest::Client::new()
            },
        }
    }

    /// `start` with workers and the default test settings.
    pub async fn with_workers() -> Served {
        Served::start(Options {
            workers: true,
            ..Options::default()
        })
        .await
    }

    /// Starts `kodx serve` again on the same database (after `terminate` or `kill`).
    pub async fn restart(&mut self) {
        let (child, url) = spawn(
            &self.env,
            self.workers,
            self.pid_namespace,
            self.fd_limit,
            self.dir.path(),
            &self.log,
        )
        .await;
        self.child = child;
        self.url = url;
    }

    /// The host's pid of the `kodx serve` process (inside a PID namespace it is PID 1 there,
    /// a child of `unshare` here).
    pub fn kodx_pid(&self) -> u32 {
        let pid = self.child.id().expect("kodx serve is running");
        if !self.pid_namespace {
            return pid;
        }
        let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
            .expect("unshare's children");
        children
            .split_whitespace()
            .next()
            .and_then(|c| c.parse().ok())
            .expect("unshare has forked kodx serve")
    }

    /// SIGTERM, then waits for the process to exit.
    pub async fn terminate(&mut self) -> std::process::ExitStatus {
        if self.child.id().is_some() {
            unsafe_kill(self.kodx_pid(), "TERM");
        }
        tokio::time::timeout(Duration::from_secs(60), self.child.wait())
            .await
            .expect("kodx serve exits after SIGTERM")
            .unwrap()
    }

    /// SIGKILL: the process dies at once, as in a crash.
    pub async fn kill(&mut self) {
        if self.pid_namespace && self.child.id().is_some() {
            // kill -9 of kodx itself (the namespace's init: everything in it dies too);
            // `unshare` then exits.
            unsafe_kill(self.kodx_pid(), "KILL");
            let _ = tokio::time::timeout(Duration::from_secs(30), self.child.wait()).await;
        }
        let _ = self.child.kill().await;
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Posts a delivery signed with the server's secret.
    pub async fn deliver(&self, event: &str, delivery: &str, body: &Value) -> (u16, Value) {
        let body = body.to_string().into_bytes();
        let sig = sign(SECRET, &body);
        self.post_raw(event, Some(delivery), Some(&sig), body).await
    }

    pub async fn post_raw(
        &self,
        event: &str,
        delivery: Option<&str>,
        signature: Option<&str>,
        body: Vec<u8>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .post(format!("{}/webhook", self.url))
            .header("content-type", "application/json")
            .header("x-github-event", event)
            .header("user-agent", "GitHub-Hookshot/test");
        if let Some(d) = delivery {
            req = req.header("x-github-delivery", d);
        }
        if let Some(s) = signature {
            req = req.header("x-hub-signature-256", s);
        }
        let resp = req.body(body).send().await.expect("kodx serve answers");
        let status = resp.status().as_u16();
        let text = resp.text().await.unwrap_or_default();
        let json = serde_json::from_str(&text).unwrap_or(Value::String(text));
        (status, json)
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        let resp = self
            .http
            .get(format!("{}{path}", self.url))
            .send()
            .await
            .expect("kodx serve answers");
        (
            resp.status().as_u16(),
            resp.text().await.unwrap_or_default(),
        )
    }

    /// Waits until `cond` holds, or fails with the server's log.
    pub async fn wait_for(&self, what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
        let start = Instant::now();
        while !cond() {
            if start.elapsed() > timeout {
                panic!(
                    "timed out after {timeout:?} waiting for {what}\n--- kodx serve log ---\n{}\n--- comments ---\n{:#?}",
                    self.log(),
                    self.github.comments(REPO, 7)
                );
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub async fn stop(mut self) -> std::process::ExitStatus {
        self.terminate().await
    }
}

async fn spawn(
    env: &[(String, String)],
    workers: bool,
    pid_namespace: bool,
    fd_limit: Option<u64>,
    dir: &std::path::Path,
    log: &Arc<Mutex<String>>,
) -> (tokio::process::Child, String) {
    let mut cmd = if pid_namespace {
        // `--kill-child`: should the test die, kodx dies with `unshare`.
        let mut cmd = tokio::process::Command::new("unshare");
        cmd.args(["--pid", "--fork", "--mount-proc", "--kill-child"])
            .arg(env!("CARGO_BIN_EXE_kodx"));
        cmd
    } else {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_kodx"))
    };
    cmd.arg("serve");
    if !workers {
        cmd.arg("--no-workers");
    }
    cmd.env_remove("PRIVATE_KEY")
        .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    if let Some(n) = fd_limit {
        // SAFETY: only setrlimit, which is async-signal-safe, runs between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                let lim = libc::rlimit {
                    rlim_cur: n as libc::rlim_t,
                    rlim_max: n as libc::rlim_t,
                };
                if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let mut child = cmd.spawn().expect("kodx serve starts");
    let (tx, rx) = tokio::sync::oneshot::channel();
    let stderr = child.stderr.take().unwrap();
    {
        let log = log.clone();
        tokio::spawn(async move {
            let mut tx = Some(tx);
            let mut lines = BufReader::new(stderr).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(addr) = line.strip_prefix("kodx serve: listening on ") {
                    if let Some(tx) = tx.take() {
                        let _ = tx.send(addr.to_string());
                    }
                }
                let mut l = log.lock().unwrap();
                l.push_str(&line);
                l.push('\n');
            }
        });
    }
    let url = match tokio::time::timeout(Duration::from_secs(30), rx).await {
        Ok(Ok(url)) => url,
        _ => panic!(
            "kodx serve did not start; its log:\n{}",
            log.lock().unwrap()
        ),
    };
    (child, url)
}

/// A git server check that asks the fake GitHub what each token was minted for (see
/// `FakeGitHub::git_access`): its repositories and `contents` permission.
pub fn accept_github(github: FakeGitHub) -> super::git_server::TokenCheck {
    use super::fake_github::GitVerdict;
    use super::git_server::Verdict;
    Arc::new(move |t, u| match github.git_access(t, &u.repo, u.push) {
        GitVerdict::Allow => Verdict::Allow,
        GitVerdict::Unauthorized => Verdict::Unauthorized,
        GitVerdict::Forbidden => Verdict::Forbidden,
        GitVerdict::NotFound => Verdict::NotFound,
    })
}

fn unsafe_kill(pid: u32, signal: &str) {
    let _ = std::process::Command::new("kill")
        .arg(format!("-{signal}"))
        .arg(pid.to_string())
        .status();
}

/// A Messages API `usage` block.
pub fn usage(input: u64, output: u64) -> Value {
    json!({"input_tokens": input, "output_tokens": output,
           "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0})
}

/// The comments kodx (a bot) wrote on issue or PR `number`.
pub fn bot_comments(s: &Served, number: u64) -> Vec<super::fake_github::FakeComment> {
    s.github
        .comments(REPO, number)
        .into_iter()
        .filter(|c| c.is_bot)
        .collect()
}

pub fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret.as_bytes()).unwrap();
    mac.update(body);
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

pub fn delivery_id() -> String {
    format!("{:032x}", rand::random::<u128>())
}

/// An `issue_comment.created` payload as GitHub sends it (the fields kodx reads and a
/// realistic set of the others).
pub fn issue_comment(
    clone_url: &str,
    number: u64,
    is_pr: bool,
    comment_id: u64,
    author: &str,
    user_type: &str,
    body: &str,
) -> Value {
    let user = |login: &str, kind: &str| {
        json!({
            "login": login, "id": 1000 + login.len(), "node_id": "MDQ6VXNlcjE=",
            "avatar_url": "https://avatars.githubusercontent.com/u/1?v=4",
            "url": format!("https://api.github.com/users/{login}"),
            "html_url": format!("https://github.com/{login}"),
            "type": kind, "site_admin": false
        })
    };
    let mut issue = json!({
        "url": format!("https://api.github.com/repos/{REPO}/issues/{number}"),
        "html_url": format!("https://github.com/{REPO}/issues/{number}"),
        "id": 5000 + number, "node_id": "I_kwDOA", "number": number,
        "title": "Widgets are slow", "user": user("carol", "User"),
        "labels": [], "state": "open", "locked": false, "assignee": null, "assignees": [],
        "comments": 1, "created_at": "2026-11-20T10:00:00Z", "updated_at": "2026-11-20T10:00:00Z",
        "closed_at": null, "author_association": "CONTRIBUTOR", "body": "They are slow."
    });
    if is_pr {
        issue["pull_request"] = json!({
            "url": format!("https://api.github.com/repos/{REPO}/pulls/{number}"),
            "html_url": format!("https://github.com/{REPO}/pull/{number}"),
            "diff_url": format!("https://github.com/{REPO}/pull/{number}.diff"),
            "patch_url": format!("https://github.com/{REPO}/pull/{number}.patch"),
            "merged_at": null
        });
    }
    json!({
        "action": "created",
        "issue": issue,
        "comment": {
            "url": format!("https://api.github.com/repos/{REPO}/issues/comments/{comment_id}"),
            "html_url": format!("https://github.com/{REPO}/issues/{number}#issuecomment-{comment_id}"),
            "id": comment_id, "node_id": "IC_kwDOA", "user": user(author, user_type),
            "created_at": "2026-11-22T10:00:00Z", "updated_at": "2026-11-22T10:00:00Z",
            "author_association": "OWNER", "body": body,
            "reactions": {"total_count": 0}, "performed_via_github_app": null
        },
        "repository": {
            "id": 123456, "node_id": "R_kgDOA", "name": "widgets", "full_name": REPO,
            "private": true, "owner": user("acme", "Organization"),
            "html_url": format!("https://github.com/{REPO}"),
            "clone_url": clone_url, "default_branch": "main"
        },
        "sender": user(author, user_type),
        "installation": {"id": INSTALLATION, "node_id": "MDIzOkludGVncmF0aW9uSW5zdGFsbGF0aW9uNzc="}
    })
}
