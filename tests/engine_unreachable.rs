//! A missing engine is a clear error naming what to do (own test binary: it sets DOCKER_HOST).

use kodx::sandbox::{Engine, SandboxError};

#[tokio::test]
async fn unreachable_engine_says_what_to_do() {
    // SAFETY: the only test in this binary; nothing else reads the environment meanwhile.
    unsafe { std::env::set_var("DOCKER_HOST", "unix:///nonexistent/docker.sock") };
    let err = Engine::connect().await.err().expect("no engine there");
    assert!(
        matches!(err, SandboxError::EngineUnavailable { .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    assert!(msg.contains("unix:///nonexistent/docker.sock"), "{msg}");
    assert!(msg.contains("Start the Docker engine"), "{msg}");
    assert!(msg.contains("DOCKER_HOST"), "{msg}");
}
