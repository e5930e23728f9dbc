//! Shared helpers for the tests that run against the real Docker engine.
#![allow(dead_code)]

pub mod fake_anthropic;
pub mod fake_github;
pub mod fake_openai;
pub mod git_server;
pub mod net;
pub mod serve;

use std::collections::HashMap;
use std::time::Duration;

use bollard::query_parameters::ListContainersOptions;
use kodx::sandbox::{DockerSandbox, Engine, SandboxSpec};

/// The locally built test image (`tests/images/build.sh`).
pub fn image() -> String {
    std::env::var("KODX_TEST_IMAGE").unwrap_or_else(|_| "kodx-test:bookworm".to_string())
}

pub const BUSYBOX_IMAGE: &str = "kodx-test:busybox";

/// The engine, or `None` (with a loud message) when there is none outside CI. In CI a
/// missing engine or image fails the test: Docker tests are never skipped silently there.
pub async fn engine() -> Option<Engine> {
    let in_ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
    let engine = match Engine::connect().await {
        Ok(e) => e,
        Err(e) if !in_ci => {
            eprintln!(
                "\n*** SKIPPED: no Docker engine ({e}); run `bash .ci/run` or start dockerd ***\n"
            );
            return None;
        }
        Err(e) => panic!("CI=true but no Docker engine: {e}"),
    };
    for img in [image(), BUSYBOX_IMAGE.to_string()] {
        if engine.docker().inspect_image(&img).await.is_err() {
            if in_ci {
                panic!("CI=true but test image {img} is missing: run tests/images/build.sh");
            }
            eprintln!(
                "\n*** SKIPPED: test image {img} missing; run `bash tests/images/build.sh` ***\n"
            );
            return None;
        }
    }
    Some(engine)
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
    engine
        .docker()
        .list_containers(Some(ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![label.to_string()],
            )])),
            ..Default::default()
        }))
        .await
        .unwrap()
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

/// Starts a sandbox; the caller destroys it and calls `assert_gone`.
pub async fn start(engine: &Engine, spec: &SandboxSpec) -> DockerSandbox {
    engine.start(spec).await.expect("sandbox starts")
}

pub const SEC: Duration = Duration::from_secs(1);
