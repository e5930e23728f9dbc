//! Drives the real `kodx serve` binary for end-to-end tests: a fake GitHub, a real git
//! server over smart HTTP that only accepts the installation tokens the fake GitHub issued,
//! for the repositories and with the `contents` permission they were minted with,
//! a scripted fake Anthropic, a real SQLite file, and the real Docker engine.

use std::collections::{BTreeSet, HashMap};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use serde_json::{json, Value};
use sha2::Sha256;
use tokio::io::{AsyncBufReadExt, BufReader};

use super::fake_anthropic::FakeAnthropic;
use super::fake_github::{FakeBase, FakeComment, FakeGitHub, FakeHead, TEST_APP_KEY};
use super::git_server::GitServer;

pub const APP_ID: u64 = 4242;
pub const INSTALLATION: u64 = 77;
pub const SECRET: &str = "it's a secret to everybody";
pub const MODEL_KEY: &str = "sk-ant-test-key-0123456789";
pub const REPO: &str = "acme/widgets";
/// The public address [`Served::with_run_pages`] gives kodx: status comments link their
/// run pages under it.
pub const PUBLIC_URL: &str = "https://kodx.example.com";

/// A running `kodx serve` and the fakes around it.
/// Runs `$body` with `$pool` connected to the server's database, SQLite or PostgreSQL.
macro_rules! on_db {
    ($url:expr, $pool:ident => $body:expr) => {{
        let url: &str = $url;
        if url.starts_with("sqlite") {
            let $pool = sqlx::SqlitePool::connect(url)
                .await
                .expect("the server's database");
            let out = $body;
            $pool.close().await;
            out
        } else {
            let $pool = sqlx::PgPool::connect(url)
                .await
                .expect("the server's database");
            let out = $body;
            $pool.close().await;
            out
        }
    }};
}

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
    /// Bot comments a test has read (`next_bot_comment`, `bot_comment_where`), by id.
    read: Mutex<BTreeSet<u64>>,
    /// The reaction target of each run's triggering comment (`comment`).
    triggers: Mutex<HashMap<RunId, String>>,
}

/// A run's id, as the 202 answer to its webhook gave it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RunId(pub String);

impl RunId {
    /// The `kodx.run` label of the run's sandbox container.
    pub fn container_label(&self) -> String {
        format!("kodx-{}", self.0)
    }
}

impl std::ops::Deref for RunId {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for RunId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// How long a driver wait lasts before it fails with the server's log.
pub const WAIT: Duration = Duration::from_secs(120);

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
    /// `DATABASE_URL` (default: a SQLite file in the test's directory).
    pub database_url: Option<String>,
    /// Start without the App's variables (setup mode, unless an App was saved).
    pub setup_mode: bool,
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
        // Branches, trees and blobs are the git server's; pull requests can only be
        // opened from branches that exist there.
        let dirs = root.clone();
        github.set_git_dir(move |repo| Some(dirs.join(format!("{repo}.git"))));
        github.set_branch_sha(move |repo, branch| {
            std::process::Command::new("git")
                .arg("--git-dir")
                .arg(root.join(format!("{repo}.git")))
                .args([
                    "rev-parse",
                    "--verify",
                    "-q",
                    &format!("refs/heads/{branch}^{{commit}}"),
                ])
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
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
        let database_url = opts
            .database_url
            .clone()
            .unwrap_or_else(|| format!("sqlite://{}", dir.path().join("kodx.db").display()));
        let key = dir.path().join("app-key.pem");
        std::fs::write(&key, TEST_APP_KEY).unwrap();

        let mut env: Vec<(String, String)> = vec![
            ("APP_ID".into(), APP_ID.to_string()),
            ("PRIVATE_KEY_PATH".into(), key.display().to_string()),
            ("WEBHOOK_SECRET".into(), SECRET.into()),
            ("GITHUB_API_URL".into(), github.url()),
            ("HOST".into(), "127.0.0.1".into()),
            ("PORT".into(), "0".into()),
            ("DATABASE_URL".into(), database_url.clone()),
            ("KODX_CONFIG".into(), settings.display().to_string()),
            ("KODX_IMAGE".into(), super::image()),
            ("ANTHROPIC_API_KEY".into(), MODEL_KEY.into()),
            ("ANTHROPIC_BASE_URL".into(), model.url.clone()),
            ("KODX_LOG".into(), "info,kodx=debug".into()),
            // Clones go there: a killed server's leftovers go with the test's directory.
            ("TMPDIR".into(), tmp.display().to_string()),
        ];
        // No warm sandboxes unless the test's settings ask for them: the tests of other
        // things see the engine as before (tests/it/serve_warm.rs covers the pool).
        if !opts.settings.is_some_and(|s| s.contains("warm_sandboxes")) {
            env.push(("KODX_WARM_SANDBOXES".into(), "0".into()));
        }
        if !opts
            .settings
            .is_some_and(|s| s.contains("warm_repositories"))
        {
            env.push(("KODX_WARM_REPOSITORIES".into(), "0".into()));
        }
        if opts.setup_mode {
            env.retain(|(k, _)| {
                !["APP_ID", "PRIVATE_KEY_PATH", "WEBHOOK_SECRET"].contains(&k.as_str())
            });
        }
        env.extend(opts.extra_env.iter().cloned());
        let log = Arc::new(Mutex::new(String::new()));
        let (child, url) = spawn(
            &env,
            if opts.workers { &[] } else { &["--no-workers"] },
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
            read: Mutex::new(BTreeSet::new()),
            triggers: Mutex::new(HashMap::new()),
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
            if self.workers { &[] } else { &["--no-workers"] },
            self.pid_namespace,
            self.fd_limit,
            self.dir.path(),
            &self.log,
        )
        .await;
        self.child = child;
        self.url = url;
    }

    /// Another `kodx serve` process with `args` (e.g. `--role worker`) on the same
    /// database, fakes and settings, logging into the same log; its URL. The test stops it
    /// (it is killed when dropped).
    pub async fn spawn_another(&self, args: &[&str]) -> (tokio::process::Child, String) {
        spawn(
            &self.env,
            args,
            false,
            self.fd_limit,
            self.dir.path(),
            &self.log,
        )
        .await
    }

    /// [`Served::spawn_another`] with its environment changed: `set` added (replacing what
    /// it names), `unset` removed.
    pub async fn spawn_another_with(
        &self,
        args: &[&str],
        set: &[(&str, &str)],
        unset: &[&str],
    ) -> (tokio::process::Child, String) {
        let mut env: Vec<(String, String)> = self
            .env
            .iter()
            .filter(|(k, _)| !unset.contains(&k.as_str()) && !set.iter().any(|(s, _)| s == k))
            .cloned()
            .collect();
        env.extend(set.iter().map(|(k, v)| (k.to_string(), v.to_string())));
        spawn(&env, args, false, self.fd_limit, self.dir.path(), &self.log).await
    }

    /// Whether the `kodx serve` process is stopped (`SIGSTOP`).
    pub fn is_stopped(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.kodx_pid()))
            .ok()
            .and_then(|stat| {
                // The state follows the command's name, which is in parentheses.
                let (_, after) = stat.rsplit_once(')')?;
                after.split_whitespace().next().map(|state| state == "T")
            })
            .unwrap_or(false)
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

    /// Sends `signal` (`STOP`, `CONT`, …) to the `kodx serve` process.
    pub fn signal(&self, signal: &str) {
        unsafe_kill(self.kodx_pid(), signal);
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

    /// Starts a `/kodx code` run on #7 and waits until its first command (`sleep 300`
    /// after writing one.txt) runs in its container; then the model has answered once.
    pub async fn code_run_in_its_first_command(&self) -> RunId {
        self.github.add_issue(REPO, 7, "Slow", "", "carol");
        self.model.reply(
            tool("echo one > one.txt; sleep 300"),
            "tool_use",
            usage(1000, 10),
        );
        let run = self.comment(7, "alice", "/kodx code write one.txt").await;
        self.wait_for("the first model call", Duration::from_secs(120), || {
            !self.model.requests().is_empty()
        })
        .await;
        run
    }

    /// Pull request `number` from a new branch `feature` (adding `f.txt`) onto `base`, and
    /// `/kodx code` on it whose one command writes the number of commits its container's
    /// history holds into `count.txt` on the branch; the run.
    pub async fn code_run_counting_a_pulls_commits(&self, number: u64, base: &str) -> RunId {
        let head =
            self.git
                .commit_on_branch(REPO, "feature", &[("f.txt", b"f\n", 0o644)], "feature");
        self.git.commit(
            REPO,
            &format!("refs/pull/{number}/head"),
            Some(&head),
            &[],
            "same",
        );
        self.add_branch_pull(BranchPull {
            number,
            title: "Feature",
            body: "Adds f.txt",
            author: "alice",
            branch: "feature",
            head: &head,
            base,
            diff: "+f\n",
        });
        self.model.reply(
            tool("git log --format=%H | wc -l > count.txt"),
            "tool_use",
            usage(1000, 10),
        );
        self.model
            .reply(text("Counted."), "end_turn", usage(1100, 10));
        self.comment(number, "alice", "/kodx code count the commits")
            .await
    }

    /// Adds pull request `pull.number` from a branch of the test repository onto `main`.
    pub fn add_branch_pull(&self, pull: BranchPull<'_>) {
        self.github.add_pull(
            REPO,
            pull.number,
            pull.title,
            pull.body,
            pull.author,
            FakeHead {
                ref_name: pull.branch.into(),
                sha: pull.head.into(),
                repo: Some(REPO.into()),
                clone_url: self.clone_url.clone(),
            },
            FakeBase {
                ref_name: "main".into(),
                sha: pull.base.into(),
            },
            pull.diff,
        );
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

    /// Posts a delivery signed with the server's secret to another `kodx serve` at `url`
    /// (one started by `spawn_another`).
    pub async fn deliver_to(
        &self,
        url: &str,
        event: &str,
        delivery: &str,
        body: &Value,
    ) -> (u16, Value) {
        let body = body.to_string().into_bytes();
        let sig = sign(SECRET, &body);
        self.post_raw_to(url, event, Some(delivery), Some(&sig), body)
            .await
    }

    pub async fn post_raw(
        &self,
        event: &str,
        delivery: Option<&str>,
        signature: Option<&str>,
        body: Vec<u8>,
    ) -> (u16, Value) {
        let url = self.url.clone();
        self.post_raw_to(&url, event, delivery, signature, body)
            .await
    }

    async fn post_raw_to(
        &self,
        url: &str,
        event: &str,
        delivery: Option<&str>,
        signature: Option<&str>,
        body: Vec<u8>,
    ) -> (u16, Value) {
        let mut req = self
            .http
            .post(format!("{url}/webhook"))
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

    /// Runs the real `kodx operator-link` with this server's environment and directory
    /// (so its `KODX_DATA_DIR`): its output, its error output, and whether it succeeded.
    pub async fn operator_link_cli(&self, args: &[&str]) -> (String, String, bool) {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kodx"))
            .arg("operator-link")
            .args(args)
            .env_remove("PRIVATE_KEY")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir(self.dir.path())
            .output()
            .await
            .expect("kodx operator-link runs");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            out.status.success(),
        )
    }

    /// The value of `name` in the server's environment (e.g. `DATABASE_URL`).
    pub fn kodx_env(&self, name: &str) -> String {
        self.env
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.clone())
            .unwrap_or_else(|| panic!("{name} is not set"))
    }

    /// Runs the real `kodx ARGS` with this server's environment and directory (its
    /// `DATABASE_URL`, `KODX_CONFIG`, `KODX_DATA_DIR`): its output, its error output and
    /// its exit code.
    pub async fn kodx_cli(&self, args: &[&str]) -> (String, String, Option<i32>) {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kodx"))
            .args(args)
            .env_remove("PRIVATE_KEY")
            .envs(self.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .current_dir(self.dir.path())
            .output()
            .await
            .expect("kodx runs");
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
            out.status.code(),
        )
    }

    /// The path and query of a fresh operator link to `/healthz`'s details (`kodx
    /// operator-link`'s second line, less the public URL).
    pub async fn operator_health_path(&self) -> String {
        let (out, err, ok) = self.operator_link_cli(&[]).await;
        assert!(ok, "kodx operator-link failed: {err}");
        let line = out.lines().nth(1).expect("a /healthz link");
        line[line.find("/healthz").expect("a /healthz link")..].to_string()
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

    // ---------------------------------------------------------------------------------
    // The domain driver: post a command, read the bot's comments, finish.
    // ---------------------------------------------------------------------------------

    /// `author` writes `body` on issue or pull request `issue` (as a person would, on the
    /// fake GitHub) and its signed `issue_comment` webhook is delivered; the server must
    /// answer 202 with a queued run, whose id is returned.
    pub async fn comment(&self, issue: u64, author: &str, body: &str) -> RunId {
        let (status, answer, comment_id) = self.comment_answer(issue, author, body).await;
        assert_eq!(status, 202, "{answer}");
        let run = RunId(
            answer["run_id"]
                .as_str()
                .unwrap_or_else(|| panic!("no run_id in the 202 answer: {answer}"))
                .to_string(),
        );
        self.triggers
            .lock()
            .unwrap()
            .insert(run.clone(), format!("{REPO}/issues/comments/{comment_id}"));
        run
    }

    /// `comment` without the checks: the status, the answer and the new comment's id.
    pub async fn comment_answer(&self, issue: u64, author: &str, body: &str) -> (u16, Value, u64) {
        let id = self.github.add_comment(REPO, issue, author, body, false);
        let payload = issue_comment(&IssueComment {
            clone_url: &self.clone_url,
            number: issue,
            is_pr: self.github.is_pull(REPO, issue),
            comment_id: id,
            author,
            body,
            ..IssueComment::default()
        });
        let (status, answer) = self
            .deliver("issue_comment", &delivery_id(), &payload)
            .await;
        (status, answer, id)
    }

    /// Where reactions to `run`'s triggering comment go (`acme/widgets/issues/comments/ID`).
    pub fn trigger(&self, run: &RunId) -> String {
        self.triggers
            .lock()
            .unwrap()
            .get(run)
            .unwrap_or_else(|| panic!("run {run} was not started by Served::comment"))
            .clone()
    }

    /// The reactions (content) kodx put on `target`, in order.
    pub fn reactions_on(&self, target: &str) -> Vec<String> {
        self.github
            .reactions()
            .into_iter()
            .filter(|(t, _, _)| t == target)
            .map(|(_, c, _)| c)
            .collect()
    }

    /// Waits until kodx has reacted `content` on `target` (woken by the fake GitHub).
    pub async fn reaction(&self, target: &str, content: &str) {
        self.until(&format!("the {content} reaction on {target}"), || {
            self.reactions_on(target)
                .iter()
                .any(|c| c == content)
                .then_some(())
        })
        .await
    }

    /// The next bot comment on `issue` the test has not read yet, as it is now (a status
    /// comment may be edited later: `bot_comment_where` waits for a state). Woken by the
    /// fake GitHub; fails after `WAIT` with the server's log.
    pub async fn next_bot_comment(&self, issue: u64) -> FakeComment {
        self.until(&format!("a new bot comment on #{issue}"), || {
            let read = self.read.lock().unwrap();
            bot_comments(self, issue)
                .into_iter()
                .find(|c| !read.contains(&c.id))
        })
        .await
        .tap_read(self)
    }

    /// With workers and `KODX_PUBLIC_URL` ([`PUBLIC_URL`]), so status comments link the
    /// run pages.
    pub async fn with_run_pages() -> Served {
        Served::start(Options {
            workers: true,
            extra_env: vec![("KODX_PUBLIC_URL".into(), PUBLIC_URL.into())],
            ..Options::default()
        })
        .await
    }

    /// The status comment on `issue` once its run has finished (a `✅`, `❌` or `⚠️`
    /// header).
    pub async fn finished_status(&self, issue: u64) -> String {
        self.bot_comment_where(issue, "the run to finish", |c| {
            ["### ✅", "### ❌", "### ⚠️"]
                .iter()
                .any(|h| c.body.contains(h))
        })
        .await
        .body
    }

    /// The run page a status comment `body` links (under [`PUBLIC_URL`]), fetched.
    pub async fn linked_run_page(&self, body: &str) -> String {
        let start = body
            .find(&format!("{PUBLIC_URL}/runs/"))
            .unwrap_or_else(|| panic!("no run page link in {body}"));
        let rest = &body[start + PUBLIC_URL.len()..];
        let path = &rest[..rest.find('"').unwrap()];
        reqwest::get(format!("{}{path}", self.url))
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    /// The transcript records of `run` whose `type` is `kind`, in order.
    pub async fn records(&self, run: &str, kind: &str) -> Vec<Value> {
        let db = self.db().await;
        db.transcript_records(run, 0, 1000)
            .await
            .unwrap()
            .iter()
            .map(|(_, line)| serde_json::from_str::<Value>(line).unwrap())
            .filter(|r| r["type"] == kind)
            .collect()
    }

    /// The first bot comment on `issue` for which `pred` holds (waiting for it, woken by
    /// the fake GitHub); it counts as read.
    pub async fn bot_comment_where(
        &self,
        issue: u64,
        what: &str,
        pred: impl Fn(&FakeComment) -> bool,
    ) -> FakeComment {
        self.until(&format!("{what} on #{issue}"), || {
            bot_comments(self, issue).into_iter().find(|c| pred(c))
        })
        .await
        .tap_read(self)
    }

    /// Waits until `f` gives a value, checking it again whenever the fake GitHub handled a
    /// request; fails after `WAIT` with the server's log and the bot's comments.
    pub async fn until<T>(&self, what: &str, mut f: impl FnMut() -> Option<T>) -> T {
        let mut changed = self.github.changed();
        let deadline = tokio::time::Instant::now() + WAIT;
        loop {
            changed.borrow_and_update();
            if let Some(t) = f() {
                return t;
            }
            match tokio::time::timeout_at(deadline, changed.changed()).await {
                Ok(r) => r.expect("the fake GitHub lives as long as the test"),
                Err(_) => panic!(
                    "timed out after {WAIT:?} waiting for {what}\n--- kodx serve log ---\n{}\n--- bot comments ---\n{:#?}",
                    self.log(),
                    self.github.all_comments(REPO).into_iter().filter(|(_, c)| c.is_bot).collect::<Vec<_>>()
                ),
            }
        }
    }

    /// The database of the server (for the tests that read a run's row).
    pub async fn db(&self) -> kodx::db::Db {
        kodx::db::Db::open(&self.database_url()).await.unwrap()
    }

    fn database_url(&self) -> String {
        self.env
            .iter()
            .find(|(k, _)| k == "DATABASE_URL")
            .map(|(_, v)| v.clone())
            .expect("DATABASE_URL is set")
    }

    /// Ends the test in one place: once the queue is empty (with workers), stops the server
    /// with SIGTERM (a graceful stop finishes what is in flight, so nothing can happen
    /// after), then fails on anything left over: a bot comment the test did not read, a
    /// container of this installation, an installation token in anything kodx wrote or
    /// sent (model requests, comments and their edits, pull requests, GitHub requests, git
    /// URLs, transcripts, its log), a request the fake GitHub refused as malformed or one
    /// the fake model rejected.
    ///
    /// The server stays stopped; the test may look at the fakes afterwards, knowing nothing
    /// more will happen.
    pub async fn finish(&mut self) {
        let url = self.database_url();
        if self.workers && self.child.id().is_some() {
            let deadline = Instant::now() + WAIT;
            loop {
                let pending: Vec<(String, String, String)> = on_db!(&url, pool => sqlx::query_as(
                    "SELECT id, kind, status FROM runs WHERE status IN ('queued', 'running')",
                )
                .fetch_all(&pool)
                .await
                .unwrap());
                if pending.is_empty() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "finish: runs still pending after {WAIT:?}: {pending:?}\n--- kodx serve log ---\n{}",
                    self.log()
                );
                // The database has no notification to wait on.
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        if self.child.id().is_some() {
            let status = self.terminate().await;
            assert!(
                status.success(),
                "kodx serve exited with {status:?}\n{}",
                self.log()
            );
        }
        let mut problems = Vec::new();
        let read = self.read.lock().unwrap().clone();
        for (number, c) in self.github.all_comments(REPO) {
            if c.is_bot && !read.contains(&c.id) {
                problems.push(format!(
                    "a bot comment on #{number} nobody read: {:?}",
                    c.body
                ));
            }
        }
        problems.extend(
            self.github
                .refused()
                .into_iter()
                .map(|r| format!("GitHub refused: {r}")),
        );
        problems.extend(
            self.model
                .rejected()
                .into_iter()
                .map(|r| format!("the model rejected: {r:?}")),
        );
        let instance: Option<String> = on_db!(&url, pool =>
            sqlx::query_scalar("SELECT value FROM kodx_meta WHERE key = 'instance'")
                .fetch_optional(&pool)
                .await
                .unwrap());
        if let (Some(instance), Ok(engine)) = (instance, kodx::sandbox::Engine::connect().await) {
            let label = format!("{}={instance}", kodx::sandbox::docker::INSTANCE_LABEL);
            for id in super::containers_labelled(&engine, &label).await {
                problems.push(format!(
                    "container {id} of this installation was left behind"
                ));
            }
        }
        let transcripts: Vec<String> = on_db!(&url, pool =>
            sqlx::query_scalar("SELECT record FROM transcripts")
                .fetch_all(&pool)
                .await
                .unwrap());
        let log = self.log();
        let mut written: Vec<(String, String)> = Vec::new();
        for r in self.model.requests() {
            written.push(("a model request".into(), r.body.to_string()));
        }
        for (number, c) in self.github.all_comments(REPO) {
            for text in std::iter::once(&c.body).chain(&c.edits) {
                written.push((format!("a comment on #{number}"), text.clone()));
            }
        }
        for p in self.github.created_pulls(REPO) {
            for text in std::iter::once(&p.body).chain(&p.edits) {
                written.push((format!("pull request #{}", p.number), text.clone()));
            }
            written.push((format!("the title of #{}", p.number), p.title.clone()));
        }
        for r in self.github.requests() {
            let what = format!("GitHub request {} {}", r.method, r.path);
            written.push((what.clone(), r.body.clone()));
            written.push((what, format!("{}?{}", r.path, r.query.unwrap_or_default())));
        }
        for r in self.git.requests() {
            written.push(("a git URL".into(), r.path_and_query.clone()));
        }
        for t in &transcripts {
            written.push(("the transcript".into(), t.clone()));
        }
        written.push(("the server log".into(), log.clone()));
        for token in self.github.issued_tokens() {
            for (what, text) in &written {
                if text.contains(&token) {
                    problems.push(format!("an installation token in {what}"));
                }
            }
        }
        assert!(
            problems.is_empty(),
            "finish:\n  {}\n--- kodx serve log ---\n{log}",
            problems.join("\n  ")
        );
    }

    /// Sends SIGTERM and waits for the process to exit.
    pub async fn stop(mut self) -> std::process::ExitStatus {
        self.terminate().await
    }
}

async fn spawn(
    env: &[(String, String)],
    args: &[&str],
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
    cmd.arg("serve").args(args);
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

/// After setup made a new App: the same server refuses a webhook signed with the old
/// secret, takes one signed with `new_secret` and acts as the new App (`/kodx help` on #7 is
/// answered; the fake GitHub checks every App JWT against the new App's id and key).
pub async fn new_app_takes_webhooks(s: &Served, new_secret: &str) {
    s.github.add_issue(REPO, 7, "Widgets", "body", "alice");
    let id = s.github.add_comment(REPO, 7, "alice", "/kodx help", false);
    let body = issue_comment(&IssueComment {
        clone_url: &s.clone_url,
        comment_id: id,
        body: "/kodx help",
        ..IssueComment::default()
    })
    .to_string()
    .into_bytes();
    let (status, answer) = s
        .post_raw(
            "issue_comment",
            Some(&delivery_id()),
            Some(&sign(SECRET, &body)),
            body.clone(),
        )
        .await;
    assert_eq!(status, 401, "the old secret is not this App's: {answer}");
    let (status, answer) = s
        .post_raw(
            "issue_comment",
            Some(&delivery_id()),
            Some(&sign(new_secret, &body)),
            body,
        )
        .await;
    assert!(status == 200 || status == 202, "{status} {answer}");
    let comment = s.next_bot_comment(7).await;
    assert!(comment.body.contains("/kodx"), "{}", comment.body);
    assert!(
        s.github.unauthorized().is_empty(),
        "{:?}",
        s.github.unauthorized()
    );
}

/// A pull request from a branch of the test repository ([`Served::add_branch_pull`]).
pub struct BranchPull<'a> {
    pub number: u64,
    pub title: &'a str,
    pub body: &'a str,
    pub author: &'a str,
    pub branch: &'a str,
    pub head: &'a str,
    pub base: &'a str,
    pub diff: &'a str,
}

/// A scripted model turn that types `chars` into the default shell (`feed_chars`).
pub fn tool(chars: &str) -> Vec<Value> {
    vec![
        json!({"type": "tool_use", "id": format!("t{}", rand::random::<u16>()),
                "name": "feed_chars", "input": {"chars": chars}}),
    ]
}

/// A scripted model turn that only says `t`.
pub fn text(t: &str) -> Vec<Value> {
    vec![json!({"type": "text", "text": t})]
}

/// A Messages API `usage` block.
/// SIGTERM to another `kodx serve` process the test started; it must exit cleanly within
/// `within`.
pub async fn terminate(child: &mut tokio::process::Child, within: Duration) {
    let pid = child.id().expect("running") as i32;
    // SAFETY: kill(2) with a pid this test spawned and has not reaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    let status = tokio::time::timeout(within, child.wait())
        .await
        .unwrap_or_else(|_| panic!("stops within {within:?}"))
        .unwrap();
    assert!(status.success(), "{status:?}");
}

/// Snapshot settings for what kodx wrote (bot comments, pull request bodies): what changes
/// from run to run is filtered out — the ids in `runs` (`[run]`, and their 8-character
/// form in branch names `[run8]`), the values in `vary` (replaced by their names), other
/// run ids and commit hashes (`[hex]`), durations, ports, temporary paths and times; a
/// zero-width space shows as `[zwsp]`. Costs
/// stay: the fake model's usage is scripted.
pub fn redactions(runs: &[&str], vary: &[(&str, &str)]) -> insta::Settings {
    let mut settings = insta::Settings::clone_current();
    for run in runs {
        settings.add_filter(&regex_escape(run), "[run]");
        settings.add_filter(&regex_escape(&run[..8.min(run.len())]), "[run8]");
    }
    settings.add_filter(r"<code>[0-9a-f]{8,}</code>", "<code>[run]</code>");
    for (value, name) in vary {
        settings.add_filter(&regex_escape(value), *name);
    }
    settings.add_filter(r"\b[0-9a-f]{7,40}\b", "[hex]");
    settings.add_filter(
        r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(:\d{2}(\.\d+)?)?Z?",
        "[time]",
    );
    settings.add_filter(r"\b\d+(\.\d+)? ?(ms|s|min)\b", "[duration]");
    settings.add_filter(r"127\.0\.0\.1:\d+", "127.0.0.1:[port]");
    settings.add_filter(r"/tmp/[^\s)`'\x22]+", "[tmp]");
    // The zero-width space kodx puts into mentions and closing keywords, shown (a literal
    // one in a snapshot is invisible to a reader, and clippy refuses it).
    settings.add_filter("\u{200B}", "[zwsp]");
    settings
}

/// `text` as a regular expression that matches only itself.
fn regex_escape(text: &str) -> String {
    text.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
}

/// The cost table's duration cell, `6.8s (agent 0.2s)` or `1m 2s (agent 40.1s)`, as
/// seconds: the run's wall time and the agent's share.
pub fn wall_and_agent(body: &str) -> (f64, f64) {
    let row = body
        .lines()
        .find(|l| l.starts_with("| claude-"))
        .unwrap_or_else(|| panic!("no cost table in\n{body}"));
    let cell = row.split(" | ").nth(7).unwrap();
    let (wall, agent) = cell.split_once(" (agent ").unwrap();
    let secs = |t: &str| -> f64 {
        t.trim_end_matches(')')
            .split(' ')
            .map(|part| {
                let (n, unit) = part.split_at(part.len() - 1);
                let n: f64 = n.parse().unwrap_or_else(|_| panic!("{cell}"));
                n * match unit {
                    "h" => 3600.0,
                    "m" => 60.0,
                    _ => 1.0,
                }
            })
            .sum()
    };
    (secs(wall), secs(agent))
}

pub fn usage(input: u64, output: u64) -> Value {
    json!({"input_tokens": input, "output_tokens": output,
           "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0})
}

/// Marks a comment the driver handed out as read (see `Served::finish`).
trait TapRead {
    fn tap_read(self, s: &Served) -> Self;
}

impl TapRead for FakeComment {
    fn tap_read(self, s: &Served) -> Self {
        s.read.lock().unwrap().insert(self.id);
        self
    }
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

/// An `issue_comment.created` delivery (see `issue_comment`).
#[derive(Clone, Debug)]
pub struct IssueComment<'a> {
    /// The repository's clone URL (`Served::clone_url`).
    pub clone_url: &'a str,
    pub number: u64,
    /// The issue is a pull request.
    pub is_pr: bool,
    pub comment_id: u64,
    pub author: &'a str,
    /// `User` or `Bot`.
    pub user_type: &'a str,
    pub body: &'a str,
}

impl Default for IssueComment<'_> {
    fn default() -> Self {
        IssueComment {
            clone_url: "",
            number: 7,
            is_pr: false,
            comment_id: 1,
            author: "alice",
            user_type: "User",
            body: "",
        }
    }
}

/// An `issue_comment.created` payload as GitHub sends it (the fields kodx reads and a
/// realistic set of the others).
pub fn issue_comment(c: &IssueComment<'_>) -> Value {
    let IssueComment {
        clone_url,
        number,
        is_pr,
        comment_id,
        author,
        user_type,
        body,
    } = *c;
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
