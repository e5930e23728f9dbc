//! `kodx serve` with several Docker engines (`[[engines]]`): the machine's engine and
//! further real `dockerd`s on this machine (`tests/engines/engine.sh`: own socket, data
//! root, exec root, bridge and address pool, TLS client certificates on a loopback port).
//! Runs spread over them, `/healthz`, `/metrics` and `kodx doctor` report them, and an
//! engine stopped mid-run ends its run with a clear comment, the next runs go elsewhere,
//! and its orphaned containers are swept when it answers again. Afterwards the first
//! engine must still start containers (a careless second daemon can take its bridge).

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::Duration;

use crate::common;
use crate::common::serve::{text, tool, usage, Options, Served, REPO};
use kodx::sandbox::{Engine, EngineConfig};
use serde_json::Value;

/// A further engine started by `tests/engines/engine.sh` (idempotent; needs root).
struct Extra {
    config: EngineConfig,
    /// Its unix socket, for the docker CLI.
    socket: String,
}

impl Extra {
    /// Starts (or finds) the engine `name` on loopback `port`. `None` (skipped, said on
    /// the terminal) where it cannot run outside CI: not root, or no dockerd.
    fn start(name: &str, port: u16, max_runs: usize) -> Option<Extra> {
        let in_ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/engines/engine.sh");
        let out = std::process::Command::new("bash")
            .arg(&script)
            .args(["start", name, &port.to_string()])
            .output()
            .expect("bash");
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr).to_string();
            let skip_docker = std::env::var("KODX_SKIP_DOCKER").is_ok_and(|v| v == "1");
            if in_ci || (is_root() && !skip_docker) {
                panic!("starting the engine {name} failed: {why}");
            }
            eprintln!("SKIPPED: a second Docker engine cannot start here: {why}");
            return None;
        }
        let lines = String::from_utf8_lossy(&out.stdout).to_string();
        let get = |key: &str| {
            lines
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{key}=")))
                .unwrap_or_else(|| panic!("engine.sh printed no {key}: {lines}"))
                .to_string()
        };
        Some(Extra {
            socket: get("socket"),
            config: EngineConfig {
                name: name.into(),
                host: get("host"),
                tls_cert_path: Some(PathBuf::from(get("certs"))),
                max_runs,
                warm_sandboxes: None,
            },
        })
    }

    fn stop(&self) {
        let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/engines/engine.sh");
        let st = std::process::Command::new("bash")
            .arg(&script)
            .args(["stop", &self.config.name])
            .status()
            .expect("bash");
        assert!(st.success(), "stopping the engine {}", self.config.name);
    }

    /// Its `[[engines]]` table.
    fn toml(&self) -> String {
        let c = &self.config;
        format!(
            "[[engines]]\nname = \"{}\"\nhost = \"{}\"\ntls_cert_path = \"{}\"\nmax_runs = {}\n\n",
            c.name,
            c.host,
            c.tls_cert_path.as_ref().unwrap().display(),
            c.max_runs
        )
    }

    /// Puts a setup cache image of `REPO` on it (labelled as the setup cache labels them),
    /// so placement prefers it for `REPO`'s runs. Returns the tag.
    fn add_setup_cache_image(&self) -> String {
        let tag = format!("kodx-setup:pooltest{:08x}", rand::random::<u32>());
        let sock = format!("unix://{}", self.socket);
        let made = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "c=$(docker -H {sock} create {img} true) && docker -H {sock} commit \
                 --change 'LABEL kodx.setup-cache.scope={REPO}' \
                 --change 'LABEL kodx.setup-cache.key=pooltest' $c {tag} >/dev/null \
                 && docker -H {sock} rm $c >/dev/null",
                img = common::image()
            ))
            .status()
            .unwrap();
        assert!(
            made.success(),
            "making a setup cache image on {}",
            self.config.name
        );
        tag
    }

    /// Removes every setup cache image of `REPO` from it (left by an earlier, failed run of
    /// these tests: only they use their own engines).
    fn clear_setup_cache_images(&self) {
        let sock = format!("unix://{}", self.socket);
        let st = std::process::Command::new("bash")
            .arg("-c")
            .arg(format!(
                "ids=$(docker -H {sock} images -q --filter label=kodx.setup-cache.scope={REPO}); \
                 [ -z \"$ids\" ] || docker -H {sock} rmi -f $ids >/dev/null"
            ))
            .status()
            .unwrap();
        assert!(st.success());
    }

    fn remove_image(&self, tag: &str) {
        let _ = std::process::Command::new("docker")
            .args(["-H", &format!("unix://{}", self.socket), "rmi", tag])
            .output();
    }

    /// A client of it, over TLS as kodx connects.
    async fn engine(&self) -> Engine {
        Engine::connect_to(&self.config)
            .await
            .expect("the engine answers over TLS")
    }
}

fn is_root() -> bool {
    std::process::Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// The machine's engine as an `[[engines]]` table.
fn local_toml(max_runs: usize) -> String {
    let host = std::env::var("DOCKER_HOST")
        .ok()
        .filter(|h| h.starts_with("unix://"))
        .unwrap_or_else(|| "unix:///var/run/docker.sock".into());
    format!("[[engines]]\nname = \"local\"\nhost = \"{host}\"\nmax_runs = {max_runs}\n\n")
}

fn settings(engines: &str) -> &'static str {
    Box::leak(
        format!(
            "status_interval_secs = 0.2\nshutdown_grace_secs = 5\nmax_concurrent_runs = 2\n\
             engine_check_secs = 0.5\n\n{engines}"
        )
        .into_boxed_str(),
    )
}

/// Running `kodx.run` containers on `engine`.
async fn sandboxes_on(engine: &Engine) -> usize {
    engine.running_sandboxes().await.unwrap_or(0)
}

/// Every `kodx.run` container on `engine`, running or not.
async fn containers_on(engine: &Engine) -> Vec<String> {
    common::containers_labelled(engine, "kodx.run").await
}

/// The engine a finished run was placed on (its stored result).
async fn engine_of(s: &Served, run: &str) -> String {
    let db = s.db().await;
    let row = db.get_run(run).await.unwrap().expect("the run");
    let result: Value = serde_json::from_str(row.result.as_deref().unwrap_or("{}")).unwrap();
    result["engine"].as_str().unwrap_or_default().to_string()
}

/// The first engine still starts a container (its bridge is intact).
fn first_engine_still_starts_containers() {
    let out = std::process::Command::new("docker")
        .args(["run", "--rm", common::BUSYBOX_IMAGE, "echo", "still-ok"])
        .output()
        .expect("docker");
    assert!(
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("still-ok"),
        "the first engine no longer starts containers: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test]
async fn runs_spread_over_two_engines_and_are_reported() {
    let local = common::require_engine!();
    let Some(second) = Extra::start("second", 23762, 1) else {
        return;
    };
    let remote = second.engine().await;
    let mut s = Served::start(Options {
        workers: true,
        settings: Some(settings(&(local_toml(1) + &second.toml()))),
        ..Options::default()
    })
    .await;
    s.github.add_issue(REPO, 7, "One", "", "carol");
    s.github.add_issue(REPO, 8, "Two", "", "carol");
    // Two asks at once, each a command that takes a moment, then an answer. One engine
    // takes one sandbox: they must go one to each.
    for _ in 0..2 {
        s.model
            .reply(tool("sleep 2; echo worked"), "tool_use", usage(100, 10));
    }
    for _ in 0..2 {
        s.model.reply(text("Done."), "end_turn", usage(100, 10));
    }
    let a = s.comment(7, "alice", "/kodx ask what is here?").await;
    let b = s.comment(8, "alice", "/kodx ask what is there?").await;
    // Both sandboxes run at the same time, one on each engine.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let (l, r) = (sandboxes_on(&local).await, sandboxes_on(&remote).await);
        if l >= 1 && r >= 1 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the runs did not run on both engines at once (local {l}, second {r}); log:\n{}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // /healthz and /metrics while they run.
    let (code, body) = s.get(&s.operator_health_path().await).await;
    assert_eq!(code, 200, "{body}");
    let health: Value = serde_json::from_str(&body).unwrap();
    let names: BTreeSet<&str> = health["engines"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, BTreeSet::from(["local", "second"]), "{body}");
    assert!(
        health["engines"]
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["up"] == true && e["max_runs"] == 1),
        "{body}"
    );
    let (_, metrics) = s.get("/metrics").await;
    for line in [
        "kodx_engine_up{engine=\"second\"} 1",
        "kodx_engine_capacity{engine=\"local\"} 1",
        "kodx_engine_runs{engine=\"second\"} 1",
    ] {
        assert!(
            metrics.lines().any(|l| l == line),
            "{line} not in:\n{metrics}"
        );
    }
    for issue in [7, 8] {
        s.bot_comment_where(issue, "the answer", |c| c.body.contains("Done."))
            .await;
    }
    let placed: BTreeSet<String> = [engine_of(&s, &a).await, engine_of(&s, &b).await]
        .into_iter()
        .collect();
    assert_eq!(
        placed,
        BTreeSet::from(["local".to_string(), "second".to_string()])
    );
    // Both sandboxes go from both engines once the runs are over.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let left = || async {
        let mut left = Vec::new();
        for run in [&a, &b] {
            for engine in [&local, &remote] {
                left.extend(common::containers_of(engine, &run.container_label()).await);
            }
        }
        left
    };
    while !left().await.is_empty() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "sandboxes left after the runs: {:?}",
            left().await
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    s.finish().await;

    // `kodx doctor` checks every engine of the list.
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_kodx"))
        .arg("doctor")
        .env("KODX_CONFIG", s.dir.path().join("kodx.toml"))
        .env("APP_ID", "1")
        .env("PRIVATE_KEY", "not a key")
        .env("WEBHOOK_SECRET", "x")
        .env("KODX_IMAGE", common::image())
        .output()
        .await
        .unwrap();
    let said =
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    for line in [
        "Docker engine `local` (max_runs 1) at",
        "Docker engine `second` (max_runs 1) at tcp://127.0.0.1:23762",
    ] {
        assert!(said.contains(line), "{line:?} not in:\n{said}");
    }
    first_engine_still_starts_containers();
}

#[tokio::test]
async fn an_engine_that_stops_answering_ends_its_run_clearly_and_the_next_runs_go_elsewhere() {
    let local = common::require_engine!();
    let Some(flaky) = Extra::start("flaky", 23763, 1) else {
        return;
    };
    // Listed first, and holding the repository's setup cache (the machine's engine may
    // hold one from other tests): with room on both, the first one listed takes the run.
    let cache = flaky.add_setup_cache_image();
    let mut s = Served::start(Options {
        workers: true,
        settings: Some(settings(&(flaky.toml() + &local_toml(1)))),
        ..Options::default()
    })
    .await;
    let remote = flaky.engine().await;
    let run = s.code_run_in_its_first_command().await;
    assert_eq!(sandboxes_on(&remote).await, 1, "{}", s.log());

    // The engine goes away in the middle of the run.
    flaky.stop();
    let c = s
        .bot_comment_where(7, "the engine-lost comment", |c| {
            c.body.contains("stopped answering")
        })
        .await;
    common::serve::redactions(&[&run.0], &[]).bind(|| insta::assert_snapshot!(c.body, @r#"
    <!-- kodx:{"run":"[run]","v":1} -->
    ### ❌ failed

    > /kodx code write one.txt

    ```text
    The Docker engine `flaky` stopped answering while this run worked, so the run was stopped there. New runs go to the engines that answer: run the command again to retry.
    ```

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 1 | 1,000 | 10 | 0 | 0 | $0.0032 of $2.00 | [duration] (agent [duration]) | `error` |

    <sub>kodx run <code>[run]</code></sub>
    "#));
    assert_eq!(
        s.model.requests().len(),
        1,
        "no model call after the engine was lost"
    );
    let row = s.db().await.get_run(&run).await.unwrap().unwrap();
    assert_eq!(row.status, kodx::db::RunStatus::Failed);
    assert!(
        s.github.created_pulls(REPO).is_empty(),
        "nothing was pushed"
    );
    // /healthz: the engine is out, the server still answers with the other one.
    let (code, body) = s.get(&s.operator_health_path().await).await;
    assert_eq!(code, 200, "{body}");
    let health: Value = serde_json::from_str(&body).unwrap();
    let flaky_status = health["engines"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "flaky")
        .unwrap()
        .clone();
    assert_eq!(flaky_status["up"], false, "{body}");

    // The next run goes to the engine that answers.
    s.github.add_issue(REPO, 8, "Next", "", "carol");
    s.model
        .reply(tool("echo next-run"), "tool_use", usage(100, 10));
    s.model
        .reply(text("Next answer."), "end_turn", usage(100, 10));
    let next = s.comment(8, "alice", "/kodx ask and now?").await;
    s.bot_comment_where(8, "the answer", |c| c.body.contains("Next answer."))
        .await;
    assert_eq!(engine_of(&s, &next).await, "local");

    // The engine comes back: the lost run's container is swept by its owner label, and
    // the engine takes runs again.
    let flaky = Extra::start("flaky", 23763, 1).expect("the engine starts again");
    let remote = flaky.engine().await;
    let health = s.operator_health_path().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let left = containers_on(&remote).await;
        let (_, body) = s.get(&health).await;
        let back = body.contains("\"name\":\"flaky\"")
            && serde_json::from_str::<Value>(&body).unwrap()["engines"]
                .as_array()
                .unwrap()
                .iter()
                .any(|e| e["name"] == "flaky" && e["up"] == true);
        if left.is_empty() && back {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the orphaned container was not swept ({left:?}) or the engine is not back; log:\n{}",
            s.log()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    s.finish().await;
    flaky.remove_image(&cache);
    drop(local);
    first_engine_still_starts_containers();
}

/// With room on both engines, a run goes to the one that holds its repository's setup
/// cache, even when it is listed second. (Two engines of this test's own: the machine's
/// engine may hold a cache of the test repository from other tests.)
#[tokio::test]
async fn placement_prefers_the_engine_holding_the_repository_setup_cache() {
    let _local = common::require_engine!();
    let Some(plain) = Extra::start("plain", 23764, 1) else {
        return;
    };
    let cached = Extra::start("cached", 23765, 1).expect("a second engine of this test");
    plain.clear_setup_cache_images();
    cached.clear_setup_cache_images();
    let tag = cached.add_setup_cache_image();
    let mut s = Served::start(Options {
        workers: true,
        settings: Some(settings(&(plain.toml() + &cached.toml()))),
        ..Options::default()
    })
    .await;
    s.github.add_issue(REPO, 7, "Q", "", "carol");
    s.model.reply(text("Here."), "end_turn", usage(100, 10));
    let run = s.comment(7, "alice", "/kodx ask where?").await;
    s.bot_comment_where(7, "the answer", |c| c.body.contains("Here."))
        .await;
    let placed = engine_of(&s, &run).await;
    s.finish().await;
    cached.remove_image(&tag);
    assert_eq!(placed, "cached", "the engine holding the setup cache");

    // Without the cache, the first listed (both have the image and the same room).
    s = Served::start(Options {
        workers: true,
        settings: Some(settings(&(plain.toml() + &cached.toml()))),
        ..Options::default()
    })
    .await;
    s.github.add_issue(REPO, 7, "Q", "", "carol");
    s.model.reply(text("There."), "end_turn", usage(100, 10));
    let run = s.comment(7, "alice", "/kodx ask where now?").await;
    s.bot_comment_where(7, "the answer", |c| c.body.contains("There."))
        .await;
    assert_eq!(engine_of(&s, &run).await, "plain");
    s.finish().await;
}

/// `kodx doctor` against `DOCKER_HOST` over TLS with the certificates in `cert_dir`, the
/// system roots being `system_ca` alone (`SSL_CERT_FILE`, which the system roots' loader
/// reads first).
fn doctor_over_tls(host: &str, cert_dir: &std::path::Path, system_ca: &std::path::Path) -> String {
    let home = tempfile::tempdir().unwrap();
    let empty = tempfile::tempdir().unwrap();
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kodx"))
        .arg("doctor")
        .current_dir(home.path())
        .env_clear()
        .env("PATH", std::env::var("PATH").unwrap_or_default())
        .env("HOME", home.path())
        .env("DOCKER_HOST", host)
        .env("DOCKER_TLS_VERIFY", "1")
        .env("DOCKER_CERT_PATH", cert_dir)
        .env("SSL_CERT_FILE", system_ca)
        .env("SSL_CERT_DIR", empty.path())
        .output()
        .expect("kodx doctor runs");
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("kodx doctor → {:?}\n{stdout}", out.status.code());
    stdout
}

/// `DOCKER_HOST` over TLS trusts only `DOCKER_CERT_PATH/ca.pem`, as Docker's own client
/// does: an engine whose certificate another CA signed is refused even when the system
/// trusts that CA.
#[tokio::test]
async fn a_tls_docker_host_trusts_only_its_ca_pem() {
    let _local = common::require_engine!();
    let Some(second) = Extra::start("second", 23762, 1) else {
        return;
    };
    let certs = second.config.tls_cert_path.clone().unwrap();
    let host = second.config.host.clone();
    let ok_line = format!("ok    Docker engine at {host}");
    // The engine's own CA in ca.pem: trusted.
    let out = doctor_over_tls(&host, &certs, &certs.join("ca.pem"));
    assert!(out.contains(&ok_line), "{out}");

    // The same client certificate with another CA in ca.pem, the engine's CA among the
    // system's roots: refused.
    let other = tempfile::tempdir().unwrap();
    for f in ["cert.pem", "key.pem"] {
        std::fs::copy(certs.join(f), other.path().join(f)).unwrap();
    }
    let made = std::process::Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=kodx-test-other-ca"])
        .arg("-keyout")
        .arg(other.path().join("ca-key.pem"))
        .arg("-out")
        .arg(other.path().join("ca.pem"))
        .output()
        .expect("openssl runs");
    assert!(
        made.status.success(),
        "{}",
        String::from_utf8_lossy(&made.stderr)
    );
    let out = doctor_over_tls(&host, other.path(), &certs.join("ca.pem"));
    assert!(!out.contains(&ok_line), "{out}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("FAIL") && l.contains(&host)),
        "{out}"
    );
}
