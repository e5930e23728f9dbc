//! The third hardening pass against the real Docker engine: nothing of a repository's image
//! runs in the engine's privileged fencer or before a sandbox's fence (an image with a
//! `HEALTHCHECK`, an impostor under the fencer's name), broadcasts reach neither the host
//! nor another sandbox (real UDP listeners), and kodx's helper in a sandbox cannot be
//! replaced.

use std::collections::HashMap;
use std::time::Duration;

use crate::common;
use crate::common::net::*;
use crate::common::*;
use kodx::sandbox::Sandbox;

/// The test image with a `HEALTHCHECK` every second that leaves a mark where it runs,
/// made once (a commit of a container of the test image with that config).
async fn image_with_healthcheck(docker: &bollard::Docker) -> String {
    const NAME: &str = "kodx-test:healthcheck";
    if docker.inspect_image(NAME).await.is_ok() {
        return NAME.to_string();
    }
    let created = docker
        .create_container(
            None::<bollard::query_parameters::CreateContainerOptions>,
            bollard::models::ContainerCreateBody {
                image: Some(image()),
                cmd: Some(vec!["true".to_string()]),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let config = bollard::models::ContainerConfig {
        cmd: Some(vec!["bash".to_string()]),
        env: Some(vec![
            "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
        ]),
        healthcheck: Some(bollard::models::HealthConfig {
            test: Some(vec![
                "CMD-SHELL".to_string(),
                "echo ran > /tmp/healthcheck-ran; echo ran > /healthcheck-ran".to_string(),
            ]),
            interval: Some(1_000_000_000),
            timeout: Some(1_000_000_000),
            retries: Some(1),
            start_period: Some(0),
            ..Default::default()
        }),
        ..Default::default()
    };
    let (repo, tag) = NAME.split_once(':').unwrap();
    docker
        .commit_container(
            bollard::query_parameters::CommitContainerOptions {
                container: Some(created.id.clone()),
                repo: Some(repo.to_string()),
                tag: Some(tag.to_string()),
                ..Default::default()
            },
            config,
        )
        .await
        .unwrap();
    let _ = common::remove_forced(docker, &created.id).await;
    NAME.to_string()
}

fn healthcheck_of(config: Option<bollard::models::ContainerConfig>) -> Option<Vec<String>> {
    config.and_then(|c| c.healthcheck).and_then(|h| h.test)
}

/// A repository's image with a `HEALTHCHECK`, and a container of that image waiting under
/// the fencer's name: the fencer kodx uses is made from kodx's own image (the impostor is
/// removed, never used), and neither it nor the sandbox ever runs the image's healthcheck.
#[tokio::test]
async fn a_repository_image_never_runs_in_the_fencer_or_outside_what_kodx_runs() {
    let engine = common::require_engine!();
    let docker = engine.docker();
    let hc_image = image_with_healthcheck(docker).await;
    // The impostor: the repository's image under the fencer's name, running, with the
    // capabilities a fencer has.
    let name = kodx::sandbox::net::fencer_name();
    let _ = common::remove_forced(docker, &name).await;
    let impostor = docker
        .create_container(
            Some(bollard::query_parameters::CreateContainerOptions {
                name: Some(name.clone()),
                ..Default::default()
            }),
            bollard::models::ContainerCreateBody {
                image: Some(hc_image.clone()),
                cmd: Some(vec!["sleep".to_string(), "600".to_string()]),
                host_config: Some(bollard::models::HostConfig {
                    network_mode: Some("host".to_string()),
                    pid_mode: Some("host".to_string()),
                    cap_drop: Some(vec!["ALL".to_string()]),
                    cap_add: Some(
                        kodx::sandbox::net::FENCER_CAPABILITIES
                            .map(String::from)
                            .to_vec(),
                    ),
                    auto_remove: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    docker.start_container(&impostor.id, None).await.unwrap();

    let mut spec = spec("fencer-hc");
    spec.image = hc_image.clone();
    let sb = start(&engine, &spec).await;
    // The fencer that plugged it (another test may remove the shared fencer meanwhile, and
    // a process then makes it again).
    let mut fencer = None;
    for _ in 0..100 {
        if let Ok(f) = docker.inspect_container(&name, None).await {
            fencer = Some(f);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let fencer = fencer.expect("a fencer runs");
    assert_ne!(
        fencer.id.as_deref(),
        Some(impostor.id.as_str()),
        "the impostor was not used"
    );
    assert!(
        docker.inspect_container(&impostor.id, None).await.is_err(),
        "the impostor is gone"
    );
    let helper = docker
        .inspect_image(kodx::sandbox::net::helper_image_name())
        .await
        .unwrap();
    assert_eq!(fencer.image, helper.id, "the fencer is of kodx's image");
    assert_eq!(
        healthcheck_of(fencer.config.clone()),
        Some(vec!["NONE".to_string()])
    );
    assert_eq!(helper.root_fs.unwrap().layers.unwrap().len(), 1);
    assert_eq!(
        healthcheck_of(helper.config.map(|c| bollard::models::ContainerConfig {
            healthcheck: c.healthcheck,
            ..Default::default()
        })),
        Some(vec!["NONE".to_string()])
    );

    // The sandbox, and the image it was made from (kodx's derived one), have no
    // healthcheck, and the image's never ran in it.
    let info = docker
        .inspect_container(sb.container_id(), None)
        .await
        .unwrap();
    assert_eq!(
        healthcheck_of(info.config.clone()),
        Some(vec!["NONE".to_string()])
    );
    let made_from = docker
        .inspect_image(info.image.as_deref().unwrap())
        .await
        .unwrap();
    assert_eq!(
        made_from
            .config
            .and_then(|c| c.healthcheck)
            .and_then(|h| h.test),
        Some(vec!["NONE".to_string()]),
        "the derived image {:?} has no healthcheck",
        info.image
    );
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let out = sb
        .feed_chars(
            "default",
            "ls /tmp/healthcheck-ran /healthcheck-ran 2>&1 | grep -c 'No such file'",
            10 * SEC,
        )
        .await
        .unwrap();
    assert_eq!(
        out.output.lines().last().map(str::trim),
        Some("2"),
        "the image's healthcheck never ran: {out:?}"
    );
    let state = docker
        .inspect_container(sb.container_id(), None)
        .await
        .unwrap()
        .state
        .unwrap();
    assert!(state.health.is_none(), "no health state: {state:?}");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

/// A UDP listener on every address of the host; what it received, sender and payload.
async fn udp_listener() -> (u16, tokio::task::JoinHandle<Vec<(String, String)>>) {
    let socket = tokio::net::UdpSocket::bind(("0.0.0.0", 0)).await.unwrap();
    let port = socket.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let mut got = Vec::new();
        let mut buf = [0u8; 512];
        while let Ok(Ok((n, from))) =
            tokio::time::timeout(Duration::from_secs(60), socket.recv_from(&mut buf)).await
        {
            let text = String::from_utf8_lossy(&buf[..n]).into_owned();
            let done = text == "control-end";
            got.push((from.to_string(), text));
            if done {
                break;
            }
        }
        got
    });
    (port, task)
}

/// Broadcasts from a sandbox — to 255.255.255.255 and to the subnet's broadcast address,
/// from a socket bound to its address, which routes do not stop — and a multicast and a
/// `MSG_DONTROUTE` datagram to the host's side of the bridge reach neither a UDP listener
/// on the host nor one in the sandbox next to it.
#[tokio::test]
async fn broadcasts_from_a_sandbox_reach_neither_the_host_nor_its_neighbour() {
    let engine = common::require_engine!();
    let gateway = sandbox_gateway(&engine).await;
    let subnet = sandbox_subnet(&engine).await;
    let broadcast = std::net::Ipv4Addr::from(
        u32::from(subnet.addr()) | (u32::MAX >> u32::from(subnet.prefix())),
    );
    let (port, received) = udp_listener().await;
    let (a, b) = (spec("fencer-bcast-a"), spec("fencer-bcast-b"));
    let (sender, neighbour) = tokio::join!(start(&engine, &a), start(&engine, &b));
    // The neighbour listens on every address for a few seconds.
    let listen = format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.bind(('0.0.0.0', {port}))\n\
         s.settimeout(5)\n\
         try:\n\
         \x20   print('neighbour got', s.recvfrom(512))\n\
         except OSError as e:\n\
         \x20   print('neighbour got nothing', e)\n"
    );
    neighbour
        .feed_chars(
            "default",
            &format!(
                "cat > /tmp/listen.py <<'EOF'\n{listen}EOF\n\
                 python3 /tmp/listen.py > /tmp/neighbour.txt 2>&1 &\nsleep 0.5"
            ),
            10 * SEC,
        )
        .await
        .unwrap();
    let script = format!(
        "import socket\n\
         s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         s.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)\n\
         probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n\
         probe.connect(('1.1.1.1', 9))\n\
         s.bind((probe.getsockname()[0], 0))\n\
         for to, flags in [('255.255.255.255', 0), ('{broadcast}', 0), ('224.0.0.1', 0), ('{gateway}', socket.MSG_DONTROUTE)]:\n\
         \x20   try:\n\
         \x20       s.sendto(b'from-sandbox ' + to.encode(), flags, (to, {port}))\n\
         \x20       print('sent', to)\n\
         \x20   except OSError as e:\n\
         \x20       print('refused', to, e.errno)\n"
    );
    let out = sender
        .feed_chars(
            "default",
            &format!("cat > /tmp/bcast.py <<'EOF'\n{script}EOF\npython3 /tmp/bcast.py; sleep 1"),
            20 * SEC,
        )
        .await
        .unwrap();
    assert!(out.output.contains("255.255.255.255"), "{out:?}");
    // The listener works: datagrams from the host itself arrive.
    let control = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    control.send_to(b"control", ("127.0.0.1", port)).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    control
        .send_to(b"control-end", ("127.0.0.1", port))
        .unwrap();
    let got = received.await.unwrap();
    let texts: Vec<&str> = got.iter().map(|(_, t)| t.as_str()).collect();
    assert_eq!(
        texts,
        ["control", "control-end"],
        "nothing from the sandbox reached the host ({got:?}); the sandbox said {out:?}"
    );
    // The neighbour's listener ends on its own (its 5 s timeout, or a datagram): `wait` in
    // the shell that started it returns then.
    let heard = neighbour
        .feed_chars("default", "wait; cat /tmp/neighbour.txt", 10 * SEC)
        .await
        .unwrap();
    assert!(
        heard.output.contains("neighbour got nothing"),
        "nothing from the sandbox reached its neighbour: {heard:?}"
    );
    sender.destroy().await.unwrap();
    neighbour.destroy().await.unwrap();
}

/// kodx's helper in a sandbox (its main process, the shells started ahead, the snapshot)
/// comes from a read-only volume: root in the sandbox cannot replace, remove or move it,
/// and the change set still comes out right.
#[tokio::test]
async fn root_in_a_sandbox_cannot_replace_kodx_helper() {
    let engine = common::require_engine!();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("kept.txt"), "kept\n").unwrap();
    let mut spec = spec("fencer-helper-ro");
    spec.repo_dir = Some(dir.path().to_path_buf());
    spec.setup_script = Some(format!(
        "cp /bin/true {0} 2>>/tmp/tries.txt; rm -f {0} 2>>/tmp/tries.txt; \
         mv {1} /tmp/moved 2>>/tmp/tries.txt; \
         printf '#!/bin/sh\\nexit 0\\n' > {0} 2>>/tmp/tries.txt; true\n",
        kodx::sandbox::net::SANDBOX_HELPER_PATH,
        kodx::sandbox::net::SANDBOX_HELPER_DIR,
    ));
    let sb = start(&engine, &spec).await;
    let out = sb
        .feed_chars(
            "default",
            "cat /tmp/tries.txt; echo new > added.txt",
            10 * SEC,
        )
        .await
        .unwrap();
    let refused = out.output.matches("Read-only file system").count()
        + out.output.matches("Device or resource busy").count();
    assert!(refused >= 3, "every try was refused: {out:?}");
    let info = engine
        .docker()
        .inspect_container(sb.container_id(), None)
        .await
        .unwrap();
    let mounts = info.mounts.unwrap_or_default();
    let helper = mounts
        .iter()
        .find(|m| m.destination.as_deref() == Some(kodx::sandbox::net::SANDBOX_HELPER_DIR))
        .unwrap_or_else(|| panic!("the helper's mount: {mounts:?}"));
    assert_eq!(helper.rw, Some(false), "read-only: {helper:?}");
    assert_eq!(change_lines(&sb).await, ["added added.txt"]);
    let labels: HashMap<String, String> = engine
        .docker()
        .inspect_volume(helper.name.as_deref().unwrap())
        .await
        .unwrap()
        .labels;
    assert!(
        labels.keys().any(|k| k.starts_with("kodx.")),
        "the volume is kodx's: {labels:?}"
    );
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}
