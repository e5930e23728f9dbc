//! Ctrl-C of the kodx process removes every container it made (the real binary, SIGINT).

mod common;

use std::time::{Duration, Instant};

use common::*;

async fn owned_by(engine: &kodx::sandbox::Engine, owner: &str) -> usize {
    containers_labelled(engine, &format!("kodx.owner={owner}"))
        .await
        .len()
}

#[tokio::test]
async fn sigint_removes_the_process_containers() {
    let Some(engine) = engine().await else { return };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();
    // A long benchmark keeps sandboxes alive; interrupt it mid-way.
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_kodx"))
        .args([
            "bench",
            "sandbox",
            "--image",
            &image(),
            "--reps",
            "1",
            "--echo-reps",
            "10000000",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let owner = format!("{host}/{}", child.id().unwrap());
    let t = Instant::now();
    while owned_by(&engine, &owner).await == 0 {
        assert!(
            t.elapsed() < Duration::from_secs(60),
            "the benchmark made no container"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pid = child.id().unwrap() as i32;
    // SAFETY: plain kill(2) on our own child.
    assert_eq!(unsafe { libc_kill(pid, 2) }, 0);
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("kodx exits after SIGINT")
        .unwrap();
    assert_eq!(status.code(), Some(130));
    assert_eq!(
        owned_by(&engine, &owner).await,
        0,
        "containers left after Ctrl-C"
    );
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
