//! A missing engine is a clear error naming what to do. `DOCKER_HOST` is the process's
//! environment, shared with every other test of this binary: the check runs in a child
//! process (this test binary again), whose `DOCKER_HOST` names a socket that is not there.

use kodx::sandbox::{Engine, SandboxError};

/// Set in the child process: the test checks the error instead of starting the child.
const CHILD_ENV: &str = "KODX_TEST_ENGINE_UNREACHABLE_CHILD";
const NO_ENGINE: &str = "unix:///nonexistent/docker.sock";

#[tokio::test]
async fn unreachable_engine_says_what_to_do() {
    if std::env::var_os(CHILD_ENV).is_none() {
        let name = crate::common::test_name(module_path!(), "unreachable_engine_says_what_to_do");
        let out = tokio::process::Command::new(std::env::current_exe().unwrap())
            .args([name.as_str(), "--exact", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, "1")
            .env("DOCKER_HOST", NO_ENGINE)
            .output()
            .await
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "the child failed:\n{stdout}\n{stderr}"
        );
        // Not zero tests: the name matched, the child ran the check.
        assert!(
            stdout.contains("1 passed"),
            "the child ran no test:\n{stdout}"
        );
        return;
    }
    let err = Engine::connect().await.err().expect("no engine there");
    assert!(
        matches!(err, SandboxError::EngineUnavailable { .. }),
        "{err:?}"
    );
    let msg = err.to_string();
    // Names the address it tried (NO_ENGINE) and what to do.
    insta::assert_snapshot!(msg, @"
    cannot reach the Docker engine at unix:///nonexistent/docker.sock: Socket not found: /nonexistent/docker.sock
    Start the Docker engine (`sudo systemctl start docker`, or `sudo dockerd &`), or point DOCKER_HOST at a running one (tcp://HOST:2376 with DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH for TLS). `kodx doctor` checks it.
    ");
}
