//! Setup script, network cut, image and engine errors, against the real Docker engine.

use std::time::Duration;

use crate::common;
use crate::common::*;
use kodx::sandbox::{Sandbox, SandboxError, ShellStatus};

#[tokio::test]
async fn setup_script_runs_to_the_end_in_the_workspace_then_is_removed() {
    let engine = common::require_engine!();
    let mut spec = spec("setup-ok");
    spec.setup_script =
        Some("#!/bin/bash\nset -e\nsleep 1\npwd > setup-was-here\necho ready\n".into());
    let sb = start(&engine, &spec).await;
    // Awaited to the end: the file written after `sleep 1` is there at once.
    let out = sb
        .feed_chars("default", "cat setup-was-here; ls /tmp/setup.sh", 10 * SEC)
        .await
        .unwrap();
    assert!(out.output.starts_with("/workspace\n"), "{out:?}");
    // The script is not left behind.
    insta::assert_snapshot!(out.output, @"
    /workspace
    ls: cannot access '/tmp/setup.sh': No such file or directory
    ");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn failing_setup_reports_exit_code_and_tail_and_leaves_no_container() {
    let engine = common::require_engine!();
    let mut spec = spec("setup-fail");
    let mut script = String::new();
    for i in 0..100 {
        script.push_str(&format!("echo line {i}\n"));
    }
    script.push_str("echo 'pip: no matching distribution' >&2\nexit 3\n");
    spec.setup_script = Some(script);
    let err = engine.start(&spec).await.err().expect("setup fails");
    // The last 39 lines of the output and the error (so never line 10).
    let want = (61..100).map(|i| format!("line {i}\n")).collect::<String>()
        + "pip: no matching distribution";
    match &err {
        SandboxError::SetupFailed { exit_code, tail } => {
            assert_eq!(*exit_code, 3);
            assert_eq!(tail, &want);
            assert!(!tail.contains("line 10\n"), "only the tail: {tail}");
        }
        other => panic!("expected SetupFailed, got {other:?}"),
    }
    assert_eq!(err.stop_reason(), "setup_failed");
    assert_eq!(
        err.to_string(),
        format!("setup script failed with exit code 3; last lines of its output:\n{want}")
    );
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn setup_timeout_is_a_setup_failure() {
    let engine = common::require_engine!();
    let mut spec = spec("setup-timeout");
    spec.setup_script = Some("echo starting; sleep 60".into());
    spec.setup_timeout = Duration::from_secs(1);
    let err = engine.start(&spec).await.err().expect("setup times out");
    assert!(matches!(err, SandboxError::SetupTimedOut { .. }), "{err:?}");
    insta::assert_snapshot!(err.to_string(), @"
    setup script did not finish within 1s; last lines of its output:
    starting
    ");
    assert_eq!(err.stop_reason(), "setup_failed");
    assert_gone(&engine, &spec.run_id).await;
}

fn probe(host: &str, port: u16) -> String {
    format!(
        "python3 -c \"import socket; s=socket.create_connection(('{host}', {port}), timeout=3); print('connected')\" 2>&1 | tail -1"
    )
}

/// A listener on the host and a sandbox spec that may reach it: the host is fenced off
/// unless the operator allows it, so the test allows the sandbox network's gateway.
async fn allowed_host_listener(
    engine: &kodx::sandbox::Engine,
    test: &str,
) -> (
    String,
    u16,
    tokio::task::JoinHandle<()>,
    kodx::sandbox::SandboxSpec,
) {
    let (port, task) = common::net::host_listener().await;
    let gateway = common::net::sandbox_gateway(engine).await;
    let mut spec = spec(test);
    spec.allowed_cidrs = vec![kodx::sandbox::Cidr::host(gateway)];
    (gateway.to_string(), port, task, spec)
}

#[tokio::test]
async fn network_is_on_during_setup_and_cut_after() {
    let engine = common::require_engine!();
    let (gateway, port, server, mut spec) = allowed_host_listener(&engine, "net-cut").await;
    spec.setup_script = Some(format!("{} > during-setup.txt\n", probe(&gateway, port)));
    spec.disable_network_after_setup = true;
    let sb = start(&engine, &spec).await;
    let out = sb
        .feed_chars("default", "cat during-setup.txt", 10 * SEC)
        .await
        .unwrap();
    assert_eq!(out.output, "connected\n", "setup had network: {out:?}");
    let out = sb
        .feed_chars("default", &probe(&gateway, port), 20 * SEC)
        .await
        .unwrap();
    assert!(!out.output.contains("connected"), "{out:?}");
    assert!(
        out.output.contains("unreachable") || out.output.contains("Error"),
        "{out:?}"
    );
    // Only the loopback interface is left.
    let out = sb
        .feed_chars("default", "ls /sys/class/net", 10 * SEC)
        .await
        .unwrap();
    assert_eq!(out.output.trim(), "lo", "{out:?}");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
    server.abort();
}

#[tokio::test]
async fn network_stays_on_without_the_cut() {
    let engine = common::require_engine!();
    let (gateway, port, server, spec) = allowed_host_listener(&engine, "net-on").await;
    let sb = start(&engine, &spec).await;
    let out = sb
        .feed_chars("default", &probe(&gateway, port), 20 * SEC)
        .await
        .unwrap();
    assert_eq!(out.output, "connected\n", "{out:?}");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
    server.abort();
}

#[tokio::test]
async fn container_is_hardened() {
    let engine = common::require_engine!();
    let mut spec = spec("hardened");
    spec.limits.pids = 200;
    let sb = start(&engine, &spec).await;
    let info = engine
        .docker()
        .inspect_container(sb.container_id(), None)
        .await
        .unwrap();
    let hc = info.host_config.unwrap();
    assert_eq!(hc.privileged, Some(false));
    assert_eq!(
        hc.security_opt,
        Some(vec!["no-new-privileges:true".to_string()])
    );
    assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
    assert!(!hc.cap_add.clone().unwrap().contains(&"NET_RAW".to_string()));
    assert_eq!(hc.pids_limit, Some(200));
    assert_eq!(hc.memory, Some(1 << 30));
    assert!(hc.binds.unwrap_or_default().is_empty());
    // No host mount: only kodx's helper, read-only, from its volume.
    let mounts = info.mounts.unwrap_or_default();
    assert_eq!(mounts.len(), 1, "{mounts:?}");
    assert_eq!(
        mounts[0].destination.as_deref(),
        Some(kodx::sandbox::net::SANDBOX_HELPER_DIR)
    );
    assert_eq!(mounts[0].rw, Some(false), "{mounts:?}");
    assert_eq!(mounts[0].typ, Some("volume".to_string()), "{mounts:?}");
    assert_eq!(
        info.config.unwrap().labels.unwrap()["kodx.run"],
        spec.run_id
    );
    // Inside: NoNewPrivs set, mknod refused (capability dropped).
    let out = sb
        .feed_chars(
            "default",
            "grep NoNewPrivs /proc/self/status; mknod /tmp/dev c 1 3",
            10 * SEC,
        )
        .await
        .unwrap();
    insta::assert_snapshot!(out.output, @"
    NoNewPrivs:	1
    mknod: /tmp/dev: Operation not permitted
    ");
    assert!(
        matches!(out.status, ShellStatus::Ready { exit_code: Some(1) }),
        "{out:?}"
    );
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn a_missing_image_that_cannot_be_pulled_is_a_clear_error() {
    let engine = common::require_engine!();
    let mut spec = spec("no-image");
    spec.image = "kodx-test-no-such-image:v0".into();
    let err = engine.start(&spec).await.err().expect("no image");
    assert!(
        matches!(err, SandboxError::ImageUnavailable { .. }),
        "{err:?}"
    );
    assert!(
        err.to_string().contains("kodx-test-no-such-image:v0"),
        "{err}"
    );
    assert!(err.to_string().contains("--image"), "{err}");
    assert_gone(&engine, &spec.run_id).await;
}
