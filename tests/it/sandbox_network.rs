//! The sandbox's network fence against the real Docker engine: a listener on the host, runs
//! that try to reach it (during setup, after it, after the cut), the metadata address and a
//! private range, an operator-allowed range, `network = "off"`, and the shared network.

use std::collections::HashMap;

use crate::common;
use crate::common::net::*;
use crate::common::*;
use kodx::sandbox::{Cidr, Sandbox, SandboxError};

/// Everything the host answers on, as the sandbox could try it: the sandbox network's
/// gateway and every address of the host.
async fn host_targets(engine: &kodx::sandbox::Engine) -> Vec<String> {
    let mut v = vec![sandbox_gateway(engine).await.to_string()];
    v.extend(host_addresses().iter().map(|a| a.to_string()));
    v.dedup();
    v
}

fn assert_fenced(output: &str, targets: &[String]) {
    let got = probed(output);
    assert_eq!(got.len(), targets.len(), "{output}");
    for (host, result) in got {
        match result {
            Err((errno, ms)) => {
                assert_eq!(errno, EHOSTUNREACH, "{host}: {output}");
                assert!(
                    ms < 1000,
                    "{host} failed at once, not after a timeout: {output}"
                );
            }
            Ok(_) => panic!("the sandbox reached {host}: {output}"),
        }
    }
}

#[tokio::test]
async fn the_host_metadata_and_private_ranges_are_unreachable_during_and_after_setup() {
    let engine = common::require_engine!();
    let (port, server) = host_listener().await;
    let mut targets = host_targets(&engine).await;
    // The cloud metadata service, a private range, carrier-grade NAT.
    targets.extend(["169.254.169.254", "10.255.255.1", "100.64.0.1"].map(String::from));
    let mut spec = spec("net-fenced");
    spec.setup_script = Some(format!(
        "{} > /tmp/during-setup.txt\n",
        probe(port, &targets)
    ));
    let sb = start(&engine, &spec).await;
    let during = sb
        .feed_chars("default", "cat /tmp/during-setup.txt", 10 * SEC)
        .await
        .unwrap();
    assert_fenced(&during.output, &targets);
    let after = sb
        .feed_chars("default", &probe(port, &targets), 30 * SEC)
        .await
        .unwrap();
    assert_fenced(&after.output, &targets);
    // The helper containers that fenced it are gone: only the sandbox is left.
    assert_eq!(containers_of(&engine, &spec.run_id).await.len(), 1);
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
    server.abort();
}

#[tokio::test]
async fn an_operator_allowed_range_is_reachable_and_nothing_else_of_the_host() {
    let engine = common::require_engine!();
    let (port, server) = host_listener().await;
    let gateway = sandbox_gateway(&engine).await;
    let others: Vec<String> = host_addresses()
        .into_iter()
        .filter(|a| *a != gateway)
        .map(|a| a.to_string())
        .collect();
    let mut spec = spec("net-allowed");
    spec.allowed_cidrs = vec![Cidr::host(gateway)];
    let sb = start(&engine, &spec).await;
    let out = sb
        .feed_chars("default", &probe(port, &[gateway.to_string()]), 20 * SEC)
        .await
        .unwrap();
    let got = probed(&out.output);
    assert!(
        matches!(got.as_slice(), [(_, Ok(_))]),
        "the allowed gateway is reachable: {out:?}"
    );
    if !others.is_empty() {
        let out = sb
            .feed_chars("default", &probe(port, &others), 20 * SEC)
            .await
            .unwrap();
        assert_fenced(&out.output, &others);
    }
    sb.destroy().await.unwrap();
    server.abort();
}

#[tokio::test]
async fn the_sandbox_cannot_undo_its_fence() {
    let engine = common::require_engine!();
    let mut spec = spec("net-undo");
    spec.image = BUSYBOX_IMAGE.to_string();
    let sb = start(&engine, &spec).await;
    let out = sb
        .feed_chars(
            "default",
            "ip route del unreachable 169.254.0.0/16; ip route | grep -c unreachable",
            10 * SEC,
        )
        .await
        .unwrap();
    assert!(
        out.output.contains("Operation not permitted"),
        "no NET_ADMIN in the sandbox: {out:?}"
    );
    let count: usize = out
        .output
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0);
    assert!(count >= 8, "the unreachable routes are in place: {out:?}");
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn network_off_means_no_network_even_for_setup() {
    let engine = common::require_engine!();
    let (port, server) = host_listener().await;
    let gateway = sandbox_gateway(&engine).await;
    let mut spec = spec("net-off");
    spec.no_network = true;
    // Even an allowed range is out of reach without a network.
    spec.allowed_cidrs = vec![Cidr::host(gateway)];
    spec.setup_script = Some(format!(
        "{} > /tmp/during-setup.txt\n",
        probe(port, &[gateway.to_string()])
    ));
    let sb = start(&engine, &spec).await;
    let out = sb
        .feed_chars(
            "default",
            "cat /tmp/during-setup.txt; ls /sys/class/net",
            10 * SEC,
        )
        .await
        .unwrap();
    let got = probed(&out.output);
    assert!(
        matches!(got.as_slice(), [(_, Err((errno, _)))] if errno == "101"),
        "ENETUNREACH during setup: {out:?}"
    );
    assert_eq!(out.output.lines().last(), Some("lo"), "{out:?}");
    sb.destroy().await.unwrap();
    server.abort();
}

#[tokio::test]
async fn the_network_is_made_once_even_by_concurrent_processes() {
    let engine = common::require_engine!();
    let name = format!("kodx-test-net-{:08x}", rand::random::<u32>());
    // Separate connections, as separate kodx processes would have.
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let name = name.clone();
        tasks.push(tokio::spawn(async move {
            let e = kodx::sandbox::Engine::connect().await.unwrap();
            e.ensure_network(Some(&name), &image()).await
        }));
    }
    let mut ids = Vec::new();
    for t in tasks {
        ids.push(t.await.unwrap().expect("the network"));
    }
    let listed: Vec<_> = engine
        .docker()
        .list_networks(Some(bollard::query_parameters::ListNetworksOptions {
            filters: Some(HashMap::from([("name".to_string(), vec![name.clone()])])),
        }))
        .await
        .unwrap()
        .into_iter()
        .filter(|n| n.name.as_deref() == Some(name.as_str()))
        .collect();
    let cleanup = || async {
        for n in &listed {
            let _ = engine
                .docker()
                .remove_network(n.id.as_deref().unwrap())
                .await;
        }
    };
    if listed.len() != 1 || ids.iter().any(|i| *i != ids[0]) {
        cleanup().await;
        panic!("one network, one id: {ids:?}, {listed:#?}");
    }
    let n = &listed[0];
    let icc = n
        .options
        .as_ref()
        .and_then(|o| o.get("com.docker.network.bridge.enable_icc"))
        .cloned();
    let labelled = n
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key("kodx.network"));
    let ipv6 = n.enable_ipv6;
    cleanup().await;
    assert_eq!(icc.as_deref(), Some("false"));
    assert!(labelled);
    assert_ne!(ipv6, Some(true));
    // No lock container is left.
    let lock = engine
        .docker()
        .inspect_container(&format!("{name}-lock"), None)
        .await;
    assert!(lock.is_err(), "the lock container is removed");
}

#[tokio::test]
async fn a_foreign_network_of_that_name_is_refused_with_a_clear_message() {
    let engine = common::require_engine!();
    let name = format!("kodx-test-foreign-{:08x}", rand::random::<u32>());
    let made = engine
        .docker()
        .create_network(bollard::models::NetworkCreateRequest {
            name: name.clone(),
            ..Default::default()
        })
        .await
        .unwrap();
    let err = engine.ensure_network(Some(&name), &image()).await;
    let _ = engine.docker().remove_network(&made.id).await;
    let err = err.expect_err("a network kodx did not make");
    assert!(matches!(err, SandboxError::NetworkFence(_)), "{err:?}");
    let msg = err.to_string();
    assert!(
        msg.contains("kodx did not create") && msg.contains(&format!("docker network rm {name}")),
        "{msg}"
    );
}

/// The engine's fencer raises every sandbox's fence with one exec (no helper container
/// per sandbox): it runs hardened (no network, only the capabilities it needs, auto-removed
/// when it exits), is shared by the sandboxes after it, and is made again when it is gone.
#[tokio::test]
async fn one_hardened_fencer_fences_every_sandbox_and_is_made_again_when_gone() {
    let engine = common::require_engine!();
    let (port, server) = host_listener().await;
    let targets = host_targets(&engine).await;
    let name = kodx::sandbox::net::fencer_name();
    assert!(name.starts_with(kodx::sandbox::net::FENCER_PREFIX));
    let docker = engine.docker();
    let fenced_run = |run: &'static str| {
        let engine = engine.clone();
        let targets = targets.clone();
        async move {
            let sb = start(&engine, &spec(run)).await;
            let out = sb
                .feed_chars("default", &probe(port, &targets), 30 * SEC)
                .await
                .unwrap();
            assert_fenced(&out.output, &targets);
            sb.destroy().await.unwrap();
        }
    };
    fenced_run("net-fencer-1").await;
    let first = docker.inspect_container(&name, None).await.unwrap();
    let hc = first.host_config.clone().unwrap();
    assert_eq!(first.state.as_ref().unwrap().running, Some(true));
    assert_eq!(hc.network_mode.as_deref(), Some("host"));
    assert_eq!(hc.pid_mode.as_deref(), Some("host"));
    assert_eq!(hc.auto_remove, Some(true));
    assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
    let mut caps = hc.cap_add.clone().unwrap();
    caps.sort();
    assert_eq!(caps, ["NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"]);
    // The next sandbox uses the same one.
    fenced_run("net-fencer-2").await;
    let again = docker.inspect_container(&name, None).await.unwrap();
    assert_eq!(again.id, first.id);
    // Gone (it exited idle, or someone removed it): made again, and the fence still holds.
    docker
        .remove_container(
            first.id.as_deref().unwrap(),
            Some(bollard::query_parameters::RemoveContainerOptions {
                force: true,
                ..Default::default()
            }),
        )
        .await
        .unwrap();
    let before = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    fenced_run("net-fencer-3").await;
    let third = docker.inspect_container(&name, None).await.unwrap();
    assert_ne!(third.id, first.id);
    // It raised that fence (not a helper container): it marks each use on its own disk.
    let used = exec_out(
        docker,
        third.id.as_deref().unwrap(),
        "stat -c %Y /.kodx-used",
    )
    .await;
    assert!(
        used.trim().parse::<u64>().unwrap() >= before,
        "last used at {used}, the run began at {before}"
    );
    server.abort();
}

/// What `command` (under `sh -c`) prints in container `id`.
async fn exec_out(docker: &bollard::Docker, id: &str, command: &str) -> String {
    use futures_util::StreamExt;
    let exec = docker
        .create_exec(
            id,
            bollard::exec::CreateExecOptions {
                cmd: Some(vec!["sh", "-c", command]),
                attach_stdout: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut out = String::new();
    if let bollard::exec::StartExecResults::Attached { mut output, .. } =
        docker.start_exec(&exec.id, None).await.unwrap()
    {
        while let Some(Ok(chunk)) = output.next().await {
            out.push_str(&chunk.to_string());
        }
    }
    out
}
