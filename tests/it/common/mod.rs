//! Shared helpers for the tests that run against the real Docker engine.
#![allow(dead_code)]

pub mod billing;
pub mod db;
pub mod fake_anthropic;
pub mod fake_github;
pub mod fake_openai;
pub mod follow_up;
pub mod git_server;
pub mod images;
pub mod long_run;
pub mod net;
pub mod openapi;
pub mod serve;
pub mod synthetic;
pub mod tar_flood;

use std::collections::HashMap;
use std::time::Duration;

use bollard::query_parameters::{ListContainersOptions, TopOptions};
use kodx::sandbox::{DockerSandbox, Engine, SandboxSpec};

/// This process's peak resident memory so far (VmHWM), in bytes.
pub fn peak_rss() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let kb: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .expect("VmHWM in /proc/self/status");
    kb * 1024
}

/// Whether `needle` stands anywhere in `hay`.
pub fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// `kodx` (the CLI) against the fake Anthropic at `fake` with API key `key`, on the test
/// image, with the built-in prices and no stdin.
pub fn kodx_command(fake: &fake_anthropic::FakeAnthropic, key: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_kodx"));
    cmd.env("ANTHROPIC_BASE_URL", &fake.url)
        .env("ANTHROPIC_API_KEY", key)
        .env("KODX_IMAGE", image())
        .env_remove("KODX_PRICING")
        .stdin(std::process::Stdio::null());
    cmd
}

/// The locally built test image (`tests/images/build.sh`).
pub fn image() -> String {
    std::env::var("KODX_TEST_IMAGE").unwrap_or_else(|_| "kodx-test:bookworm".to_string())
}

pub const BUSYBOX_IMAGE: &str = "kodx-test:busybox";

/// Whether the person running the tests asked to skip the Docker tests (`KODX_SKIP_DOCKER=1`).
fn skip_docker() -> bool {
    std::env::var("KODX_SKIP_DOCKER").is_ok_and(|v| v == "1" || v == "true")
}

/// The engine for a test that needs Docker. Without an engine or the test images the test
/// fails, saying what to do, unless `KODX_SKIP_DOCKER=1` asks to skip: then `None`, and a
/// line on the terminal names the skipped test. In CI (`CI=true`) it always fails: Docker
/// tests never skip there. Tests use [`require_engine!`], which returns early on `None`.
pub async fn engine() -> Option<Engine> {
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let skip = |why: String| -> Option<Engine> {
        if in_ci {
            panic!("CI=true: {why}; Docker tests are never skipped in CI");
        }
        if !skip_docker() {
            panic!(
                "{why}; start dockerd and run `bash tests/images/build.sh` (or `bash .ci/run`), \
                 or set KODX_SKIP_DOCKER=1 to skip the Docker tests"
            );
        }
        // Straight to the terminal: libtest would swallow an eprintln! of a passing test.
        let test = std::thread::current().name().unwrap_or("?").to_string();
        let _ = std::io::Write::write_all(
            &mut std::io::stderr(),
            format!("SKIPPED {test}: {why} (KODX_SKIP_DOCKER=1)\n").as_bytes(),
        );
        None
    };
    let engine = match Engine::connect().await {
        Ok(e) => e,
        Err(e) => return skip(format!("no Docker engine ({e})")),
    };
    for img in [image(), BUSYBOX_IMAGE.to_string()] {
        if engine.docker().inspect_image(&img).await.is_err() {
            return skip(format!("test image {img} is missing"));
        }
    }
    Some(engine)
}

/// `let engine = require_engine!();`: the Docker engine, or the test returns at once when
/// `KODX_SKIP_DOCKER=1` asked to skip Docker tests; without an engine it fails ([`engine`]).
#[allow(unused_macros)]
macro_rules! require_engine {
    () => {
        match $crate::common::engine().await {
            Some(engine) => engine,
            None => return,
        }
    };
}
#[allow(unused_imports)]
pub(crate) use require_engine;

/// The name libtest gives a test of this binary, for running it alone in a child process
/// (this test binary again, with `--exact`): the module path without the crate's name, then
/// the function: `test_name(module_path!(), "fetch_child")` in `repo_cache` is
/// `repo_cache::fetch_child`.
pub fn test_name(module_path: &str, function: &str) -> String {
    match module_path.split_once("::") {
        Some((_crate, module)) => format!("{module}::{function}"),
        None => function.to_string(),
    }
}

pub fn run_id(test: &str) -> String {
    format!("t-{test}-{:08x}", rand::random::<u32>())
}

pub fn spec(test: &str) -> SandboxSpec {
    let mut s = SandboxSpec::new(run_id(test), image());
    s.limits.memory_bytes = 1 << 30;
    s
}

/// Containers carrying this run id, running or not.
pub async fn containers_of(engine: &Engine, run_id: &str) -> Vec<String> {
    containers_labelled(engine, &format!("kodx.run={run_id}")).await
}

/// Containers with the label `key=value`, running or not.
pub async fn containers_labelled(engine: &Engine, label: &str) -> Vec<String> {
    labelled(engine, label, true).await
}

/// The running containers carrying `label`.
#[allow(dead_code)]
pub async fn running_containers_labelled(engine: &Engine, label: &str) -> Vec<String> {
    labelled(engine, label, false).await
}

async fn labelled(engine: &Engine, label: &str, all: bool) -> Vec<String> {
    listed(engine, label, all)
        .await
        .into_iter()
        .filter_map(|c| c.id)
        .collect()
}

/// Asserts that the run's container is gone (waiting briefly for a removal in flight).
pub async fn assert_gone(engine: &Engine, run_id: &str) {
    for _ in 0..50 {
        if containers_of(engine, run_id).await.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("container of run {run_id} was left behind");
}

/// Waits until a process whose command line contains `needle` runs in a container labelled
/// `kodx.run=<run_label>`, as `docker top` lists them: the command a test means to interrupt
/// is running, not just sent. Fails after `timeout`.
pub async fn wait_for_process(engine: &Engine, run_label: &str, needle: &str, timeout: Duration) {
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        for id in running_containers_labelled(engine, &format!("kodx.run={run_label}")).await {
            // An error (the container stopping meanwhile) counts as not yet.
            let Ok(top) = engine.docker().top_processes(&id, None::<TopOptions>).await else {
                continue;
            };
            // `ps -ef`: the command and its arguments are the last column.
            let running = top
                .processes
                .unwrap_or_default()
                .iter()
                .any(|p| p.last().is_some_and(|cmd| cmd.contains(needle)));
            if running {
                return;
            }
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "no process `{needle}` in the container of {run_label} after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts a sandbox; the caller destroys it and calls `assert_gone`.
pub async fn start(engine: &Engine, spec: &SandboxSpec) -> DockerSandbox {
    engine.start(spec).await.expect("sandbox starts")
}

pub const SEC: Duration = Duration::from_secs(1);

/// Removes the container `id` (or name) as `docker rm -f` does: what the engine said.
#[allow(dead_code)]
pub async fn remove_forced(
    docker: &bollard::Docker,
    id: &str,
) -> Result<(), bollard::errors::Error> {
    docker
        .remove_container(
            id,
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
}

/// A change set as `path kind` lines in its order (`added`, `deleted`, `modified
/// content=B mode=B`).
#[allow(dead_code)]
pub fn described(set: &kodx::sandbox::ChangeSet) -> Vec<String> {
    use kodx::sandbox::ChangeKind;
    set.changes
        .iter()
        .map(|c| {
            let kind = match &c.kind {
                ChangeKind::Added(_) => "added".to_string(),
                ChangeKind::Deleted => "deleted".to_string(),
                ChangeKind::Modified {
                    content_changed,
                    mode_changed,
                    ..
                } => format!("modified content={content_changed} mode={mode_changed}"),
            };
            format!("{} {kind}", c.path)
        })
        .collect()
}

/// A sandbox's change set against its copied-in checkout, one sorted line per path
/// (`added P`, `modified P`, `deleted P`).
#[allow(dead_code)]
pub async fn change_lines(sb: &impl kodx::sandbox::Sandbox) -> Vec<String> {
    let set = sb.change_set().await.unwrap();
    let mut out: Vec<String> = set
        .added()
        .map(|c| format!("added {}", c.path))
        .chain(set.modified().map(|c| format!("modified {}", c.path)))
        .chain(set.deleted().map(|c| format!("deleted {}", c.path)))
        .collect();
    out.sort();
    out
}

/// The containers carrying `label` (`key` or `key=value`), running or not, as the engine
/// lists them (labels, names).
#[allow(dead_code)]
pub async fn summaries_labelled(
    engine: &Engine,
    label: &str,
) -> Vec<bollard::models::ContainerSummary> {
    listed(engine, label, true).await
}

async fn listed(engine: &Engine, label: &str, all: bool) -> Vec<bollard::models::ContainerSummary> {
    engine
        .docker()
        .list_containers(Some(ListContainersOptions {
            all,
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![label.to_string()],
            )])),
            ..Default::default()
        }))
        .await
        .unwrap()
}
