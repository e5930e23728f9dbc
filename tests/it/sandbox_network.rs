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
    assert_eq!(
        out.output.lines().next(),
        Some("ip: RTNETLINK answers: Operation not permitted"),
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
            e.ensure_network(Some(&name)).await
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
    let err = engine.ensure_network(Some(&name)).await;
    let _ = engine.docker().remove_network(&made.id).await;
    let err = err.expect_err("a network kodx did not make");
    assert!(matches!(err, SandboxError::NetworkFence(_)), "{err:?}");
    let msg = err.to_string();
    crate::common::serve::redactions(&[], &[(&name, "[name]")])
        .bind(|| insta::assert_snapshot!(msg, @"the sandbox's network could not be fenced off from the host: a Docker network named [name] exists that kodx did not create; remove it (`docker network rm [name]`) so kodx can make its own"));
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
    assert!(
        hc.pids_limit.is_some_and(|n| (16..=64).contains(&n)),
        "bounded, with room for a few execs starting at once: {:?}",
        hc.pids_limit
    );
    assert_eq!(hc.cap_drop, Some(vec!["ALL".to_string()]));
    let mut caps = hc.cap_add.clone().unwrap();
    caps.sort();
    assert_eq!(caps, kodx::sandbox::net::FENCER_CAPABILITIES);
    assert_fencer_is_kodx(docker, &first).await;
    // The next sandbox uses the same one.
    fenced_run("net-fencer-2").await;
    let again = docker.inspect_container(&name, None).await.unwrap();
    assert_eq!(again.id, first.id);
    // Gone (it exited idle, or someone removed it): made again, and the fence still holds.
    common::remove_forced(docker, first.id.as_deref().unwrap())
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
    let used = file_mtime(docker, third.id.as_deref().unwrap(), "/.kodx-used").await;
    assert!(
        used >= before,
        "last used at {used}, the run began at {before}"
    );
    server.abort();
}

/// The modification time of `path` in container `id`, as the engine's archive of it says.
async fn file_mtime(docker: &bollard::Docker, id: &str, path: &str) -> u64 {
    use futures_util::StreamExt;
    let mut tar = Vec::new();
    let mut stream = docker.download_from_container(
        id,
        Some(bollard::query_parameters::DownloadFromContainerOptions {
            path: path.to_string(),
        }),
    );
    while let Some(chunk) = stream.next().await {
        tar.extend_from_slice(&chunk.unwrap());
    }
    let mut archive = tar::Archive::new(&tar[..]);
    let entry = archive.entries().unwrap().next().unwrap().unwrap();
    entry.header().mtime().unwrap()
}

/// A plug whose end was lost (the fencer went away before the engine said how it ended,
/// here: on purpose, after it ran whole) is taken back and done again: the sandbox starts
/// with one interface, fenced, with the routes a sandbox plugged once has.
#[tokio::test]
async fn a_plug_lost_in_the_fencer_is_taken_back_and_done_again() {
    let engine = common::require_engine!();
    let (port, server) = host_listener().await;
    let targets = host_targets(&engine).await;
    let plain = start(&engine, &spec("net-plug-once")).await;
    kodx::sandbox::net::lose_next_fencer_exec(engine.host(), "plug");
    let replugged = start(&engine, &spec("net-plug-again")).await;
    // Reject routes (unreachable) show with the flags 0201 and no interface.
    let show = "ls /sys/class/net; sort /proc/net/route";
    let mut seen = Vec::new();
    for sandbox in [&plain, &replugged] {
        let out = sandbox
            .feed_chars("default", show, 10 * SEC)
            .await
            .unwrap()
            .output;
        assert!(out.contains("eth0") && out.contains("0201"), "{out}");
        let fenced = sandbox
            .feed_chars("default", &probe(port, &targets), 30 * SEC)
            .await
            .unwrap();
        assert_fenced(&fenced.output, &targets);
        seen.push(out);
    }
    assert_eq!(
        seen[0], seen[1],
        "the same interfaces and routes as a sandbox plugged once"
    );
    plain.destroy().await.unwrap();
    replugged.destroy().await.unwrap();
    server.abort();
}

/// A fencer removed while an exec runs in it ends the wait at once (the engine may keep
/// such an exec's output open for a minute): the exec runs again in the fencer made
/// anew, and when each of three goes too, the error says so. Seconds, not the minute.
/// (It runs alone: a sandbox of another test plugged by those three fencers would fail.)
#[tokio::test]
async fn a_fencer_removed_during_an_exec_ends_the_wait_and_the_exec_runs_again() {
    let engine = common::require_engine!();
    let docker = engine.docker().clone();
    let name = kodx::sandbox::net::fencer_name();
    let began = std::time::Instant::now();
    let host = engine.host().to_string();
    let running = {
        let docker = docker.clone();
        // `hold` never ends on its own: only the fencer's removal ends it.
        tokio::spawn(async move {
            kodx::sandbox::net::run_in_fencer(&docker, &host, &["hold".to_string()]).await
        })
    };
    let mut removed = Vec::new();
    while removed.len() < 3 && !running.is_finished() {
        let holding = docker
            .top_processes(&name, None::<bollard::query_parameters::TopOptions>)
            .await
            .ok()
            .filter(|top| {
                top.processes
                    .iter()
                    .flatten()
                    .any(|p| p.last().is_some_and(|cmd| cmd.ends_with("kodx-net hold")))
            });
        let id = match holding {
            Some(_) => docker
                .inspect_container(&name, None)
                .await
                .ok()
                .and_then(|c| c.id),
            None => None,
        };
        match id {
            Some(id) if !removed.contains(&id) => {
                let _ = common::remove_forced(&docker, &id).await;
                removed.push(id);
            }
            _ => tokio::time::sleep(std::time::Duration::from_millis(50)).await,
        }
        assert!(began.elapsed() < 40 * SEC, "removed {removed:?} so far");
    }
    let err = running.await.unwrap().unwrap_err().to_string();
    assert_eq!(removed.len(), 3, "{err}");
    assert!(
        err.contains("`hold` never finished in the engine's fencer in 3 tries"),
        "{err}"
    );
    assert!(
        err.contains("the fencer was removed during the exec")
            || err.contains("the fencer stopped during the exec"),
        "{err}"
    );
    assert!(
        began.elapsed() < 30 * SEC,
        "the wait ended with the fencer, not after the helper's timeout: {:?}",
        began.elapsed()
    );
}

/// The fencer `info` is made from kodx's own image (the helper, nothing else), runs the
/// helper, and has no healthcheck.
async fn assert_fencer_is_kodx(
    docker: &bollard::Docker,
    info: &bollard::models::ContainerInspectResponse,
) {
    let image = docker
        .inspect_image(kodx::sandbox::net::helper_image_name())
        .await
        .unwrap();
    assert_eq!(info.image, image.id, "the fencer is of kodx's image");
    let layers = image.root_fs.unwrap().layers.unwrap();
    assert_eq!(layers.len(), 1, "kodx's image is one layer: {layers:?}");
    let config = info.config.clone().unwrap();
    assert_eq!(
        config.healthcheck.and_then(|h| h.test),
        Some(vec!["NONE".to_string()])
    );
    assert_eq!(config.cmd.unwrap()[0], "hold-idle");
}

/// Sandboxes are made without an engine network and plugged in by the fencer: each gets
/// its own address from the upper half of the subnet (the engine hands out the lower),
/// reaches what the operator allows through it but not its neighbour, keeps only resolvers
/// its fence lets through (else the public fallbacks), and its host end goes with it.
#[tokio::test]
async fn sandboxes_are_plugged_in_with_their_own_addresses_and_leave_nothing_behind() {
    let engine = common::require_engine!();
    let (port, server) = host_listener().await;
    let gateway = sandbox_gateway(&engine).await;
    let net = engine
        .docker()
        .inspect_network(kodx::sandbox::net::NETWORK_NAME, None)
        .await
        .unwrap();
    let subnet: Cidr = net.ipam.unwrap().config.unwrap()[0]
        .subnet
        .clone()
        .unwrap()
        .parse()
        .unwrap();
    let bridge = format!("br-{}", &net.id.unwrap()[..12]);
    // The host's first IPv4 resolver (what the engine writes into a sandbox), when it is
    // one the fence blocks: the second sandbox is allowed to reach it, and keeps it.
    let resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
    let host_resolver: Option<std::net::Ipv4Addr> = resolv
        .lines()
        .filter_map(|l| l.strip_prefix("nameserver"))
        .filter_map(|a| a.trim().parse().ok())
        .find(|a: &std::net::Ipv4Addr| !a.is_loopback());
    let blocked_resolver = host_resolver.filter(|a| a.is_private() || a.is_link_local());
    let mut a = spec("net-plug-a");
    a.allowed_cidrs = vec![Cidr::host(gateway)];
    let mut b = spec("net-plug-b");
    b.allowed_cidrs = vec![Cidr::host(gateway)];
    b.allowed_cidrs.extend(blocked_resolver.map(Cidr::host));
    let (sa, sb) = tokio::join!(start(&engine, &a), start(&engine, &b));
    let own_address = format!(
        "python3 -c \"import socket; s=socket.socket(socket.AF_INET, socket.SOCK_DGRAM); \
         s.connect(('{gateway}', 9)); print('addr', s.getsockname()[0])\"; {}; \
         grep '^nameserver' /etc/resolv.conf",
        probe(port, &[gateway.to_string()])
    );
    let mut addrs = Vec::new();
    for (sandbox, spec) in [(&sa, &a), (&sb, &b)] {
        let info = engine
            .docker()
            .inspect_container(sandbox.container_id(), None)
            .await
            .unwrap();
        assert_eq!(
            info.host_config.unwrap().network_mode.as_deref(),
            Some("none"),
            "made without an engine network"
        );
        let out = sandbox
            .feed_chars("default", &own_address, 20 * SEC)
            .await
            .unwrap()
            .output;
        let addr: std::net::Ipv4Addr = out
            .lines()
            .find_map(|l| l.trim().strip_prefix("addr "))
            .unwrap_or_else(|| panic!("{out}"))
            .parse()
            .unwrap();
        let offset = u32::from(addr) - u32::from(subnet.addr());
        let size = 1u32 << (32 - subnet.prefix());
        assert!(
            subnet.contains_addr(addr) && offset >= size / 2 && offset < size - 1,
            "{addr}: the upper half of {subnet}, not its broadcast address"
        );
        assert!(
            matches!(probed(&out).as_slice(), [(_, Ok(_))]),
            "the allowed gateway is reachable: {out}"
        );
        let port_dir = format!("/sys/class/net/kx{:08x}", u32::from(addr));
        let master = std::fs::read_link(format!("{port_dir}/master")).unwrap();
        assert!(
            master.ends_with(&bridge),
            "{master:?} is the bridge {bridge}"
        );
        let resolvers: Vec<std::net::Ipv4Addr> = out
            .lines()
            .filter_map(|l| l.trim().strip_prefix("nameserver"))
            .filter_map(|a| a.trim().parse().ok())
            .collect();
        assert!(!resolvers.is_empty(), "{out}");
        for r in &resolvers {
            let allowed = spec.allowed_cidrs.iter().any(|c| c.contains_addr(*r));
            assert!(
                allowed || !(r.is_private() || r.is_link_local() || r.is_loopback()),
                "{r} is a resolver the fence blocks: {out}"
            );
        }
        if blocked_resolver.is_some() && spec.run_id == a.run_id {
            assert_eq!(
                resolvers,
                kodx::sandbox::net::FALLBACK_RESOLVERS,
                "the host's resolver is blocked: the fallbacks: {out}"
            );
        }
        if let (Some(r), true) = (blocked_resolver, spec.run_id == b.run_id) {
            assert!(
                resolvers.contains(&r),
                "the allowed resolver {r} is kept: {out}"
            );
        }
        addrs.push(addr);
    }
    assert_ne!(addrs[0], addrs[1], "each sandbox has its own address");
    // Neighbours are unreachable by route (at once), not only by the engine's rule for
    // enable_icc=false (a timeout), which an engine run with --iptables=false lacks.
    sb.feed_chars(
        "default",
        "python3 -m http.server 8000 >/dev/null 2>&1 & sleep 1",
        20 * SEC,
    )
    .await
    .unwrap();
    let out = sa
        .feed_chars("default", &probe(8000, &[addrs[1].to_string()]), 20 * SEC)
        .await
        .unwrap();
    assert_fenced(&out.output, &[addrs[1].to_string()]);
    sa.destroy().await.unwrap();
    sb.destroy().await.unwrap();
    // The kernel tears a namespace down in the background: within seconds.
    for addr in addrs {
        let port_dir = format!("/sys/class/net/kx{:08x}", u32::from(addr));
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
        while std::path::Path::new(&port_dir).exists() && std::time::Instant::now() < deadline {
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        assert!(
            !std::path::Path::new(&port_dir).exists(),
            "{port_dir} went with its sandbox"
        );
    }
    server.abort();
}

/// Where the engine's fencer cannot be used, sandboxes join the network through the engine
/// and a helper container per sandbox raises the fence: as fenced, and the cut after the
/// setup still cuts.
#[tokio::test]
async fn without_the_fencer_sandboxes_join_through_the_engine_and_are_fenced_by_helpers() {
    let engine = common::require_engine!();
    let (port, server) = host_listener().await;
    let targets = host_targets(&engine).await;
    kodx::sandbox::net::refuse_fencer(engine.host());
    let mut cut = spec("net-no-fencer");
    cut.setup_script = Some("true".into());
    cut.disable_network_after_setup = true;
    let sb = start(&engine, &cut).await;
    let info = engine
        .docker()
        .inspect_container(sb.container_id(), None)
        .await
        .unwrap();
    let mode = info.host_config.unwrap().network_mode.unwrap_or_default();
    assert_ne!(mode, "none", "joined through the engine");
    // Cut after the setup: no network at all.
    let out = sb
        .feed_chars("default", &probe(port, &targets), 30 * SEC)
        .await
        .unwrap();
    for (host, result) in probed(&out.output) {
        assert!(result.is_err(), "{host} reached after the cut: {out:?}");
    }
    let networks = engine
        .docker()
        .inspect_container(sb.container_id(), None)
        .await
        .unwrap()
        .network_settings
        .and_then(|n| n.networks)
        .unwrap_or_default();
    assert!(networks.is_empty(), "disconnected: {networks:?}");
    sb.destroy().await.unwrap();
    // And fenced while it was on, by a helper container (gone now).
    let on = spec("net-no-fencer-2");
    let sb = start(&engine, &on).await;
    let out = sb
        .feed_chars("default", &probe(port, &targets), 30 * SEC)
        .await
        .unwrap();
    assert_fenced(&out.output, &targets);
    assert_eq!(containers_of(&engine, &on.run_id).await.len(), 1);
    sb.destroy().await.unwrap();
    server.abort();
}
