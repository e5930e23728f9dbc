//! A missing image is pulled with progress: a real registry (Debian's docker-registry) on
//! loopback, a unique image pushed to it and removed locally, then pulled back by kodx.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::common;
use crate::common::*;
use kodx::sandbox::Sandbox;

struct Registry {
    child: std::process::Child,
    _dir: tempfile::TempDir,
    port: u16,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_registry() -> Option<Registry> {
    if Command::new("docker-registry")
        .arg("--version")
        .output()
        .is_err()
    {
        let in_ci = std::env::var("CI").is_ok_and(|v| v == "true" || v == "1");
        assert!(
            !in_ci,
            "CI=true but docker-registry is not installed (.ci/run installs it)"
        );
        eprintln!(
            "\n*** SKIPPED: docker-registry not installed (apt-get install docker-registry) ***\n"
        );
        return None;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = dir.path().join("config.yml");
    std::fs::write(
        &config,
        format!(
            "version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {}\nhttp:\n  addr: 127.0.0.1:{port}\n",
            dir.path().join("data").display()
        ),
    )
    .unwrap();
    let child = Command::new("docker-registry")
        .arg("serve")
        .arg(&config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let registry = Registry {
        child,
        _dir: dir,
        port,
    };
    let t = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            t.elapsed() < Duration::from_secs(20),
            "registry did not start"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(registry)
}

fn docker(args: &[&str]) -> String {
    let out = Command::new("docker")
        .args(args)
        .output()
        .expect("docker CLI");
    assert!(
        out.status.success(),
        "docker {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test]
async fn a_missing_image_is_pulled_with_progress() {
    let engine = common::require_engine!();
    let Some(registry) = start_registry() else {
        return;
    };
    // A unique one-layer image (busybox plus a random file), pushed, then removed locally.
    let reference = format!(
        "127.0.0.1:{}/kodx-pull-test:{:08x}",
        registry.port,
        rand::random::<u32>()
    );
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::copy("/bin/busybox", root.join("bin/busybox")).unwrap();
    std::os::unix::fs::symlink("busybox", root.join("bin/sh")).unwrap();
    std::os::unix::fs::symlink("busybox", root.join("bin/sleep")).unwrap();
    std::os::unix::fs::symlink("busybox", root.join("bin/echo")).unwrap();
    std::fs::write(root.join("unique"), rand::random::<u64>().to_string()).unwrap();
    let tar = dir.path().join("image.tar");
    let ok = Command::new("tar")
        .arg("-C")
        .arg(&root)
        .arg("-cf")
        .arg(&tar)
        .arg(".")
        .status()
        .unwrap();
    assert!(ok.success());
    docker(&[
        "import",
        "--change",
        "ENV PATH=/bin",
        tar.to_str().unwrap(),
        &reference,
    ]);
    docker(&["push", &reference]);
    docker(&["rmi", &reference]);
    assert!(engine.docker().inspect_image(&reference).await.is_err());

    let mut lines = Vec::new();
    engine
        .ensure_image(&reference, |l| lines.push(l.to_string()))
        .await
        .unwrap();
    assert!(engine.docker().inspect_image(&reference).await.is_ok());
    let all = lines.join("\n");
    assert!(all.contains(&format!("pulling image {reference}")), "{all}");
    assert!(
        all.contains("Pull complete") || all.contains("Download complete"),
        "{all}"
    );

    // And a sandbox starts from it.
    let mut spec = spec("pulled");
    spec.image = reference.clone();
    let sb = start(&engine, &spec).await;
    let out = sb
        .feed_chars("default", "echo from the pulled image", 10 * SEC)
        .await
        .unwrap();
    assert_eq!(out.output, "from the pulled image\n");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
    docker(&["rmi", &reference]);
}
