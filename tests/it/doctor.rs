//! `kodx doctor` as a maintainer runs it: the real binary against the fake GitHub (which
//! verifies the App JWT), the fake Anthropic (which checks the key on `GET /v1/models`), a
//! SQLite file, and the real Docker engine. Every run gets a cleared environment, so nothing
//! from the machine leaks in.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common;
use crate::common::fake_anthropic::FakeAnthropic;
use crate::common::fake_github::{FakeGitHub, TEST_APP_KEY};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;
use axum::Router;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use kodx::sandbox::Engine;

const APP_ID: u64 = 4242;
const SECRET: &str = "doctor-webhook-secret-5f1c9a";
const MODEL_KEY: &str = "sk-ant-doctor-test-key-0123456789";

/// An RSA key that is not the test App's (a key of some other App), PKCS#1 like GitHub's.
/// Made for this test only.
const OTHER_APP_KEY: &str = "-----BEGIN RSA PRIVATE KEY-----\n\
MIIEowIBAAKCAQEA1SrgthbVJfX8kCZHGh7VMj2kCKTN95uQBTEWGYeJ/oL3O9zY\n\
asrgUx5DvMu9Hdr3cdIREx7Mqxy00HR3MDM8bmXrASz9+OSmBi2ZQUEcbmn1GHG/\n\
Nka9k97p/5PHi0LPBmTe3RPiY9fOu/948aL8fa/7NZVVMAc5qQXIwuRWKUdXes8X\n\
YaDQeqY2DmJlu7vSkPxFu1FruQY3VzHE9Kh5Wbo7tUYwBqt4eh/i5781xARR+yur\n\
lPbmdUoXwZ+KkDF6IVZ+k5bYgIyEdxyM7CSMJul+dqGudo6cVg3c4yEedk6qcZLl\n\
YL5BLaySQo+PEwUM03ubjdcn+BuYHPVqTV5sxwIDAQABAoIBABYtlFyNipac/a53\n\
tQ0UKSVFgYP+tYkt77GClmSIlARdVuCtDP0rZ2RucSi6382z4uu+KdWd7jhdT7ii\n\
bWYf5okr5GPmbPQQwe9BnkDKR+1666uj5ft9J6szVZAoLWohRM3K/97rezHdGZ64\n\
qTomtXNUNGQySb8p+UdLGUShog9AMsPdhhN+7R6byZY/qZbtC8q9kELDstG/n970\n\
UFCAtDsQTbrQ43umd2VPJnLK66JUVJRVQEE50NK1e9zX0MOSdbxBSCOYIpT60rT5\n\
ev/TyNEtMvCgZCR/sgFfcqtn2PjuhBLGB2wNG1eA7lB0SElRw06n5s+ZSSxiSllL\n\
QZaulakCgYEA89iExyYq8raUGHu5+EswGW9lxMoUpG9xEJc371auLX8Ud0I6h+xq\n\
pD3vbnkI2+1v1lAG3fUllT9nJEsvlARI91Ah4aU82LY2JzFhkmwvAb/9jLlKTDkb\n\
U2tvuAtRTFszfCdyil+erCTX/Qpbn319WtceNI6ligGcBPZRfayPqD8CgYEA38rn\n\
LaJG7kjLp7fRafHTnQ49Kl7GtyBXdekP2C1S0YXQQdhMusLLVJwO+U5agAMScx71\n\
GV883OBsOzesobMAvBV69RdXHtEi9VY+PIxuoubMjWhKKGf+q5Asfm5A7eqK0gfk\n\
sHQfUshHy9oJXqNdDumac5ynT2TOgRay1YWGWXkCgYAw+8SocL1d5llXlbsk6o2t\n\
/le2MVX2NkDDMW1WEdaJYybMUiyJ028UsTBgw8WI0GiP56GJgs5a7dKdUtEq7bVu\n\
oNU9i8DuU6QLOXs9O6gxtMyNMUeAilQ37LQTh4p8STHNdesnas/oCrqspSEEp+O/\n\
lMkHi8QrNemOgaCbG0f8ZwKBgCIswhDd7ycERtVd5MThAQfC3ORThNUCQ1jmNl00\n\
zqjgXmUvusfqZ1KMYlz/8iIKVg7uc09kk87HFsAUSHCI/Vu7jANRhSRXm5cLjIWC\n\
jIKj7CjL/EcfWmyon6LPA2tRndFlEy8/DGl/3DbtHPEu0U8trUBqc8JUCpT7+mNQ\n\
+KtBAoGBAMLfz+kvbm5kzTu66alOClno/1Ta9gtmT/4xvjUrZslJ2IqUbzu9VxYb\n\
2zHB0N8v5/Mt5k2btBNAKeOmiFBMyQFNDjVTiNbhLSmdsHt7lK0MeB3zdgu9LseW\n\
SUxcEW77YwrNRDIFoUhyFfF2V42wNCeq/jVjrvH0RN75So4yOD3f\n\
-----END RSA PRIVATE KEY-----\n";

/// What one `kodx doctor` run printed.
struct Outcome {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Outcome {
    fn lines(&self) -> Vec<&str> {
        self.stdout.lines().collect()
    }

    /// The first line with `tag` (`ok`, `FAIL`, `note`) that contains `needle`.
    fn line(&self, tag: &str, needle: &str) -> Option<&str> {
        self.stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(tag) && l.contains(needle))
    }

    fn expect(&self, tag: &str, needle: &str) -> &str {
        self.line(tag, needle).unwrap_or_else(|| {
            panic!(
                "no `{tag}` line containing {needle:?} in:\n{}\nstderr:\n{}",
                self.stdout, self.stderr
            )
        })
    }

    fn failures(&self) -> Vec<&str> {
        self.lines()
            .into_iter()
            .filter(|l| l.starts_with("FAIL"))
            .collect()
    }

    fn everything(&self) -> String {
        format!("{}\n{}", self.stdout, self.stderr)
    }
}

/// Runs `kodx doctor ARGS` in `dir` with only `env` (plus PATH, HOME and the Docker
/// variables of this process, unless `env` sets them).
async fn doctor(dir: &Path, env: &[(&str, String)], args: &[&str]) -> Outcome {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_kodx"));
    cmd.arg("doctor")
        .args(args)
        .current_dir(dir)
        .env_clear()
        .stdin(Stdio::null());
    for name in [
        "PATH",
        "HOME",
        "DOCKER_HOST",
        "DOCKER_CERT_PATH",
        "DOCKER_TLS_VERIFY",
    ] {
        if let Ok(v) = std::env::var(name) {
            cmd.env(name, v);
        }
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("kodx doctor finishes within 2 minutes")
        .expect("kodx runs");
    // Shown with --nocapture, and with a failing test's output.
    eprintln!(
        "kodx doctor {args:?} → {:?}\n{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout)
    );
    Outcome {
        code: out.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

/// Whether this machine's Docker engine answers (in CI it must).
async fn docker_answers() -> bool {
    let ok = Engine::connect().await.is_ok();
    if !ok {
        assert!(
            !std::env::var("CI").is_ok_and(|v| v == "true" || v == "1"),
            "CI=true but no Docker engine"
        );
    }
    ok
}

fn shipped_config() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("config/kodx.toml")
        .display()
        .to_string()
}

/// The fakes and the environment of a fully configured `kodx serve`.
struct Setup {
    dir: tempfile::TempDir,
    github: FakeGitHub,
    model: FakeAnthropic,
    env: Vec<(&'static str, String)>,
}

impl Setup {
    async fn new() -> Setup {
        let github = FakeGitHub::start(APP_ID).await;
        let model = FakeAnthropic::start(MODEL_KEY).await;
        let dir = tempfile::tempdir().unwrap();
        let env = vec![
            ("APP_ID", APP_ID.to_string()),
            // The PEM itself, with real newlines: none of its lines may ever be printed.
            ("PRIVATE_KEY", TEST_APP_KEY.to_string()),
            ("WEBHOOK_SECRET", SECRET.to_string()),
            ("GITHUB_API_URL", github.url()),
            (
                "DATABASE_URL",
                format!("sqlite://{}", db_path(&dir).display()),
            ),
            ("KODX_CONFIG", shipped_config()),
            ("KODX_IMAGE", common::BUSYBOX_IMAGE.to_string()),
            ("ANTHROPIC_API_KEY", MODEL_KEY.to_string()),
            ("ANTHROPIC_BASE_URL", model.url.clone()),
        ];
        Setup {
            dir,
            github,
            model,
            env,
        }
    }

    fn set(&mut self, name: &'static str, value: impl Into<String>) {
        self.env.retain(|(k, _)| *k != name);
        self.env.push((name, value.into()));
    }

    async fn run(&self) -> Outcome {
        doctor(self.dir.path(), &self.env, &[]).await
    }

    /// The fakes saw nothing malformed.
    fn assert_clean(&self) {
        assert!(
            self.github.refused().is_empty(),
            "{:?}",
            self.github.refused()
        );
        assert!(
            self.model.rejected().is_empty(),
            "{:?}",
            self.model.rejected()
        );
    }
}

fn db_path(dir: &tempfile::TempDir) -> PathBuf {
    dir.path().join("state").join("kodx.db")
}

/// Asserts that no secret of the setup appears anywhere in what doctor printed.
fn assert_no_secret(out: &Outcome) {
    let all = out.everything();
    assert!(!all.contains(SECRET), "webhook secret printed:\n{all}");
    assert!(!all.contains(MODEL_KEY), "model key printed:\n{all}");
    for key in [TEST_APP_KEY, OTHER_APP_KEY] {
        for line in key.lines().filter(|l| !l.starts_with("-----")) {
            assert!(!all.contains(line), "a private key line printed:\n{all}");
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn all_checks_pass_without_printing_a_secret() {
    if !docker_answers().await {
        eprintln!("\n*** SKIPPED: no Docker engine; doctor cannot pass without one ***\n");
        return;
    }
    let s = Setup::new().await;
    let out = s.run().await;
    assert_eq!(out.code, 0, "{}\n{}", out.stdout, out.stderr);
    assert!(out.failures().is_empty(), "{}", out.stdout);
    let config = out.expect("ok", "configuration");
    let checkout = [(env!("CARGO_MANIFEST_DIR"), "[checkout]")];
    common::serve::redactions(&[], &checkout).bind(|| insta::assert_snapshot!(config, @"ok    configuration: App 4242, listening on 0.0.0.0:3000, settings from [checkout]/config/kodx.toml"));
    out.expect("ok", "private key");
    out.expect("ok", "webhook secret");
    let gh = out.expect("ok", "GitHub at");
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(gh, @r#"ok    GitHub at http://127.0.0.1:[port]: the key belongs to App "kodx" (id 4242); it comments as kodx[bot]"#));
    out.expect("ok", "permissions and webhook events");
    assert!(out.line("warn", "optional").is_none(), "{}", out.stdout);
    out.expect("ok", "Docker engine");
    // Which fence and which disk bound apply on this engine (overlay2 on ext4 here: no
    // quota, so the watchdog; the watchdog is named either way).
    let net = out.expect("ok", "sandbox network: plugged in and fenced");
    let arch = [(std::env::consts::ARCH, "[arch]")];
    common::serve::redactions(&[], &arch).bind(|| insta::assert_snapshot!(net, @"ok    sandbox network: plugged in and fenced by kodx's helper for [arch] (host, link-local and private ranges unreachable), through the engine's fencer container kodx-fencer-[hex]"));
    // A sandbox narrowed to the egress proxy reaches it (the proxy's 403 for a name nobody
    // allows is the proof).
    let egress = out.expect("ok", "egress proxy:");
    assert!(
        egress.contains("a sandbox reaches it on the sandboxes' gateway"),
        "{egress}"
    );
    let disk = out.expect("ok", "sandbox disk:");
    assert!(disk.contains("watchdog"), "{disk}");
    // The warm sandboxes: the shipped setting, and how many wait on the engine now.
    let warm = out.expect("ok", "warm sandboxes:");
    // How many wait depends on what else runs on the engine.
    let mut waiting = common::serve::redactions(&[], &[]);
    waiting.add_filter(r"sandboxes: \d+ waiting", "sandboxes: [n] waiting");
    waiting.bind(|| insta::assert_snapshot!(warm, @"ok    warm sandboxes: [n] waiting on this engine (warm_sandboxes = 1 per server; `kodx serve` makes them at start, each an idle container with a run's limits)"));
    // And those holding a repository's checkout (`warm_repositories`).
    let preloaded = out.expect("ok", "preloaded sandboxes:");
    waiting.bind(|| insta::assert_snapshot!(preloaded, @"ok    preloaded sandboxes: [n] waiting on this engine (warm_repositories = 2 per engine; `kodx serve` makes them after a repository's runs, each holding its latest checkout for its runs alone)"));
    out.expect("ok", "database");
    out.expect("ok", "ANTHROPIC_API_KEY");
    // The webhook secret is long enough: no note about it.
    assert!(
        out.line("note", "webhook secret").is_none(),
        "{}",
        out.stdout
    );
    assert_no_secret(&out);

    // Really asked: GitHub for /app with the App JWT, Anthropic for its models, and the
    // database file was made (with its schema) where DATABASE_URL says.
    let app_calls: Vec<_> = s
        .github
        .requests()
        .into_iter()
        .filter(|r| r.method == "GET" && r.path.ends_with("/app"))
        .collect();
    assert!(!app_calls.is_empty());
    assert!(app_calls.iter().all(|r| r
        .authorization
        .as_deref()
        .is_some_and(|a| a.starts_with("Bearer "))));
    assert!(
        s.github.unauthorized().is_empty(),
        "{:?}",
        s.github.unauthorized()
    );
    assert_eq!(s.model.model_listings(), 1);
    assert!(
        s.model.requests().is_empty(),
        "doctor must not send a (paid) message"
    );
    assert!(db_path(&s.dir).is_file());
    s.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_of_another_app_fails_naming_app_id() {
    let mut s = Setup::new().await;
    s.set("PRIVATE_KEY", OTHER_APP_KEY);
    let out = s.run().await;
    assert_ne!(out.code, 0, "{}", out.stdout);
    // The key itself is fine: it signs. GitHub refuses what it signed.
    out.expect("ok", "private key");
    let fail = out.expect("FAIL", "GitHub");
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(fail, @"FAIL  GitHub (http://127.0.0.1:[port]) refused the App JWT for APP_ID 4242 (401: A JSON web token could not be decoded) — the private key does not belong to APP_ID: check APP_ID (App settings → About) or generate a new private key there; check this machine's clock too"));
    assert!(!s.github.unauthorized().is_empty());
    assert!(out.line("ok", "GitHub at").is_none());
    assert_no_secret(&out);
    s.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_key_that_is_not_a_key_fails_before_github_is_asked() {
    let mut s = Setup::new().await;
    s.set(
        "PRIVATE_KEY",
        "-----BEGIN RSA PRIVATE KEY-----\nbm90IGEga2V5\n-----END RSA PRIVATE KEY-----\n",
    );
    let out = s.run().await;
    assert_ne!(out.code, 0);
    let fail = out.expect("FAIL", "private key");
    insta::assert_snapshot!(fail, @"FAIL  private key: GitHub App configuration: the App private key (PRIVATE_KEY / PRIVATE_KEY_PATH) is unusable: it is not a valid RSA private key in PEM (InvalidKeyFormat); download a new one from the App's settings page");
    assert!(s.github.requests().is_empty(), "no JWT, no call");
}

#[tokio::test(flavor = "multi_thread")]
async fn unreachable_github_fails_naming_github_api_url() {
    let mut s = Setup::new().await;
    // A port that was just free: connections to it are refused.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    s.set("GITHUB_API_URL", format!("http://127.0.0.1:{closed}"));
    let out = s.run().await;
    assert_ne!(out.code, 0);
    let fail = out.expect("FAIL", "GitHub");
    let closed = [(&*format!("127.0.0.1:{closed}"), "127.0.0.1:[closed]")];
    common::serve::redactions(&[], &closed).bind(|| insta::assert_snapshot!(fail, @"FAIL  GitHub: cannot reach GITHUB_API_URL=http://127.0.0.1:[closed]: Service Error: client error (Connect) — check GITHUB_API_URL (https://api.github.com, or https://HOST/api/v3 for GitHub Enterprise Server) and that this machine can reach it (DNS, proxy, firewall)"));
    // The other checks still ran.
    out.expect("ok", "private key");
    out.expect("ok", "database");
    out.expect("ok", "ANTHROPIC_API_KEY");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_database_url_fails() {
    let mut s = Setup::new().await;
    // The database's directory would have to be made inside a regular file.
    let file = s.dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    s.set(
        "DATABASE_URL",
        format!("sqlite://{}/kodx.db", file.display()),
    );
    let out = s.run().await;
    assert_ne!(out.code, 0);
    let fail = out.expect("FAIL", "database");
    let file = file.display().to_string();
    let file = [(file.as_str(), "[dir]/not-a-dir")];
    common::serve::redactions(&[], &file).bind(|| insta::assert_snapshot!(fail, @"FAIL  database sqlite://[dir]/not-a-dir/kodx.db: cannot create the directory [dir]/not-a-dir for the database file [dir]/not-a-dir/kodx.db: [dir]/not-a-dir is a file, not a directory — set DATABASE_URL to a SQLite file in a writable directory (sqlite:///data/kodx.db, or sqlite://data/kodx.db relative to the working directory)"));

    // A PostgreSQL URL is refused, and its password never printed.
    s.set(
        "DATABASE_URL",
        "postgres://kodx:hunter2-pw@db.internal/kodx",
    );
    let out = s.run().await;
    assert_ne!(out.code, 0);
    out.expect("FAIL", "database");
    assert!(!out.everything().contains("hunter2-pw"), "{}", out.stdout);
    s.assert_clean();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_refused_model_key_fails_and_is_not_printed() {
    let mut s = Setup::new().await;
    let wrong = "sk-ant-doctor-wrong-key-9876543210";
    s.set("ANTHROPIC_API_KEY", wrong);
    let out = s.run().await;
    assert_ne!(out.code, 0);
    let fail = out.expect("FAIL", "ANTHROPIC_API_KEY");
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(fail, @"FAIL  ANTHROPIC_API_KEY: the key is refused by http://127.0.0.1:[port] (401) — create a new key (https://console.anthropic.com/settings/keys) and set ANTHROPIC_API_KEY"));
    assert!(!out.everything().contains(wrong), "{}", out.everything());
    assert_eq!(s.model.model_listings(), 0);

    // An API that cannot be reached is a note, not a failure of the key.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    s.set("ANTHROPIC_API_KEY", MODEL_KEY);
    s.set("ANTHROPIC_BASE_URL", format!("http://127.0.0.1:{closed}"));
    let out = s.run().await;
    let note = out.expect("note", "ANTHROPIC_API_KEY");
    let closed = [(&*format!("127.0.0.1:{closed}"), "127.0.0.1:[closed]")];
    common::serve::redactions(&[], &closed).bind(|| insta::assert_snapshot!(note, @"note  ANTHROPIC_API_KEY: cannot reach http://127.0.0.1:[closed] (error sending request: client error (Connect): tcp connect error: Connection refused (os error 111)); the key is set but was not checked"));
    assert!(
        out.line("FAIL", "ANTHROPIC_API_KEY").is_none(),
        "{}",
        out.stdout
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn partial_configuration_fails_naming_what_is_missing() {
    let dir = tempfile::tempdir().unwrap();
    let out = doctor(dir.path(), &[("APP_ID", APP_ID.to_string())], &[]).await;
    assert_ne!(out.code, 0);
    let fail = out.expect("FAIL", "configuration");
    insta::assert_snapshot!(fail, @"FAIL  configuration: kodx serve needs PRIVATE_KEY or PRIVATE_KEY_PATH (the App's private key, downloaded from its settings), and WEBHOOK_SECRET (the secret set in the App's webhook settings) (or none of the App's variables, to set the App up in the browser) — set the variables `kodx serve` reads (see docs/deploy.md)");
    // Meant to serve, so a missing model key fails too.
    out.expect("FAIL", "no model API key");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_secret_pasted_into_the_wrong_variable_is_not_echoed() {
    // APP_ID got the webhook secret by mistake: the configuration error quotes what APP_ID
    // holds, and doctor must blank it.
    let mut s = Setup::new().await;
    s.set("APP_ID", SECRET);
    let out = s.run().await;
    assert_ne!(out.code, 0);
    let fail = out.expect("FAIL", "configuration");
    insta::assert_snapshot!(fail, @r#"FAIL  configuration: APP_ID must be the GitHub App's numeric id (App settings → About → App ID), got "[REDACTED]" — set the variables `kodx serve` reads (see docs/deploy.md)"#);
    assert_no_secret(&out);
}

#[tokio::test(flavor = "multi_thread")]
async fn not_configured_is_a_note_and_only_docker_decides() {
    let dir = tempfile::tempdir().unwrap();
    let docker = docker_answers().await;
    let out = doctor(dir.path(), &[], &[]).await;
    out.expect("note", "kodx serve is not configured");
    out.expect("note", "no model API key");
    assert!(out.line("ok", "GitHub").is_none() && out.line("ok", "database").is_none());
    if docker {
        assert_eq!(out.code, 0, "{}", out.stdout);
        assert!(out.failures().is_empty(), "{}", out.stdout);
        out.expect("ok", "Docker engine");
    }
    // No database was made in the working directory.
    assert!(!dir.path().join("data").exists());

    // With an engine that does not answer, that is the one failure.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let env = [("DOCKER_HOST", format!("tcp://127.0.0.1:{closed}"))];
    let out = doctor(dir.path(), &env, &[]).await;
    assert_ne!(out.code, 0);
    let failures = out.failures();
    assert_eq!(failures.len(), 1, "{}", out.stdout);
    let closed = [(&*format!("127.0.0.1:{closed}"), "127.0.0.1:[closed]")];
    common::serve::redactions(&[], &closed).bind(|| insta::assert_snapshot!(failures[0], @"FAIL  DOCKER_HOST=tcp://127.0.0.1:[closed]: a tcp:// engine needs DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH (a directory with ca.pem, cert.pem and key.pem): the Docker API over plain TCP gives root on that host to anyone who reaches the port (or KODX_ALLOW_PLAIN_LOOPBACK_ENGINE=1 for a test engine on a loopback address)"));
}

#[tokio::test(flavor = "multi_thread")]
async fn missing_app_permissions_and_events_fail() {
    // An App whose settings lack contents/pull_requests write and two of the events: a
    // small /app that checks the JWT the way GitHub does (RS256, iss = the App id).
    let public = DecodingKey::from_rsa_pem(include_bytes!("../data/test-app-key.pub.pem")).unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let app = Router::new().route(
        "/app",
        get({
            let seen = seen.clone();
            move |headers: HeaderMap| {
                let seen = seen.clone();
                let public = public.clone();
                async move {
                    let jwt = headers
                        .get("authorization")
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.strip_prefix("Bearer "))
                        .unwrap_or_default();
                    let mut v = Validation::new(Algorithm::RS256);
                    v.set_required_spec_claims(&["exp", "iat", "iss"]);
                    let ok = jsonwebtoken::decode::<serde_json::Value>(jwt, &public, &v)
                        .is_ok_and(|d| d.claims["iss"].as_str() == Some(APP_ID.to_string().as_str()));
                    if !ok || headers.get("user-agent").is_none() {
                        return (
                            StatusCode::UNAUTHORIZED,
                            axum::Json(serde_json::json!({"message": "Bad credentials"})),
                        );
                    }
                    seen.fetch_add(1, Ordering::SeqCst);
                    (
                        StatusCode::OK,
                        axum::Json(serde_json::json!({
                            "id": APP_ID,
                            "slug": "half-app",
                            "name": "half-app",
                            "permissions": {"issues": "write", "metadata": "read", "contents": "read"},
                            "events": ["issues"],
                        })),
                    )
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let mut s = Setup::new().await;
    s.set("GITHUB_API_URL", url);
    let out = s.run().await;
    assert_ne!(out.code, 0);
    out.expect("ok", "GitHub at");
    let fail = out.expect("FAIL", "GitHub App lacks");
    insta::assert_snapshot!(fail, @"FAIL  GitHub App lacks permissions contents: write, pull_requests: write and events issue_comment, pull_request_review_comment — add them under the App's settings → Permissions & events, then accept the new permissions on each installation");
    for present in ["issues: write", "metadata"] {
        assert!(!fail.contains(present), "{present} is granted: {fail}");
    }
    // What the pull request's life needs is optional: a warning naming each and its use.
    let warn = out.expect("warn", "optional");
    insta::assert_snapshot!(warn, @"warn  GitHub App lacks the optional permission checks: write (the `kodx` Check Run; CI repair), permission actions: write (job logs in CI repair reports; failed jobs re-run before a repair), permission statuses: read (commit statuses in CI repair), event pull_request_review (commands in a review's body), event check_suite (CI repair), event workflow_run (CI repair), event push (keeping kodx's pull requests mergeable): kodx works without them, minus those; add them under the App's settings → Permissions & events");
    assert!(seen.load(Ordering::SeqCst) >= 1);
}

#[tokio::test(flavor = "multi_thread")]
async fn healthz_mode_exits_0_on_200_and_1_otherwise() {
    // 200 first, then 503 with the body kodx serve gives when Docker does not answer.
    let calls = Arc::new(AtomicUsize::new(0));
    let app = Router::new().route(
        "/healthz",
        get({
            let calls = calls.clone();
            move || {
                let n = calls.fetch_add(1, Ordering::SeqCst);
                async move {
                    if n == 0 {
                        (StatusCode::OK, r#"{"database":"ok","docker":"ok"}"#)
                    } else {
                        (
                            StatusCode::SERVICE_UNAVAILABLE,
                            r#"{"database":"ok","docker":"no answer within 3 s"}"#,
                        )
                    }
                }
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/healthz", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });

    let dir = tempfile::tempdir().unwrap();
    // No Docker engine and no configuration: --healthz checks nothing else.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let env = [("DOCKER_HOST", format!("tcp://127.0.0.1:{closed}"))];

    let out = doctor(dir.path(), &env, &["--healthz", &url]).await;
    assert_eq!(out.code, 0, "{}{}", out.stdout, out.stderr);
    assert_eq!(out.stdout, "", "quiet when healthy");

    let out = doctor(dir.path(), &env, &["--healthz", &url]).await;
    assert_eq!(out.code, 1);
    common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(out.stdout, @r#"unhealthy: http://127.0.0.1:[port]/healthz answered 503: {"database":"ok","docker":"no answer within [duration]"}"#));
    assert_eq!(calls.load(Ordering::SeqCst), 2);

    let out = doctor(
        dir.path(),
        &env,
        &["--healthz", &format!("http://127.0.0.1:{closed}/healthz")],
    )
    .await;
    assert_eq!(out.code, 1);
    assert!(out.stdout.starts_with("unhealthy:"), "{}", out.stdout);
}

/// A plain TCP port in front of this machine's engine socket, as `dockerd -H tcp://` without
/// TLS would be: every connection is copied to `/var/run/docker.sock`.
async fn plain_tcp_engine() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut tcp, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut unix) = tokio::net::UnixStream::connect("/var/run/docker.sock").await
                {
                    let _ = tokio::io::copy_bidirectional(&mut tcp, &mut unix).await;
                }
            });
        }
    });
    port
}

/// `DOCKER_HOST=tcp://` without TLS is refused as an `[[engines]]` entry is, with one
/// sentence saying what to set, though the engine there answers; a loopback test engine
/// may be opted in.
#[tokio::test(flavor = "multi_thread")]
async fn docker_host_over_plain_tcp_fails_saying_what_to_set() {
    if !docker_answers().await || !Path::new("/var/run/docker.sock").exists() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = plain_tcp_engine().await;
    let host = format!("tcp://127.0.0.1:{port}");
    let env = [
        ("DOCKER_HOST", host.clone()),
        ("DOCKER_TLS_VERIFY", String::new()),
        ("DOCKER_CERT_PATH", String::new()),
    ];
    let out = doctor(dir.path(), &env, &[]).await;
    assert_ne!(out.code, 0, "{}", out.stdout);
    assert!(out.line("ok", "Docker engine").is_none(), "{}", out.stdout);
    let failures = out.failures();
    assert_eq!(failures.len(), 1, "{}", out.stdout);
    let expected = kodx::sandbox::engines::EnvEngine::from_vars(|name| {
        (name == "DOCKER_HOST").then(|| host.clone())
    })
    .unwrap_err();
    assert_eq!(
        failures[0],
        format!("FAIL  {expected}").as_str(),
        "{}",
        out.stdout
    );
    let engine = [(host.as_str(), "tcp://127.0.0.1:[engine]")];
    common::serve::redactions(&[], &engine).bind(|| insta::assert_snapshot!(expected, @"DOCKER_HOST=tcp://127.0.0.1:[engine]: a tcp:// engine needs DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH (a directory with ca.pem, cert.pem and key.pem): the Docker API over plain TCP gives root on that host to anyone who reaches the port (or KODX_ALLOW_PLAIN_LOOPBACK_ENGINE=1 for a test engine on a loopback address)"));

    let mut opted_in = env.to_vec();
    opted_in.push(("KODX_ALLOW_PLAIN_LOOPBACK_ENGINE", "1".into()));
    let out = doctor(dir.path(), &opted_in, &[]).await;
    out.expect("ok", &format!("Docker engine at {host}"));
    assert!(out.failures().is_empty(), "{}", out.stdout);
}
