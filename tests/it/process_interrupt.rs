//! Ctrl-C of the kodx process removes every container it made (the real binary, SIGINT).

use std::time::{Duration, Instant};

use crate::common;
use crate::common::*;

/// Containers whose `kodx.process` label names process `pid` of this boot and PID
/// namespace (`<boot>/<namespace>/<pid>/<start time>`).
async fn owned_by(engine: &kodx::sandbox::Engine, pid: u32) -> usize {
    let me = kodx::sandbox::docker::process_identity()
        .expect("this process can be identified")
        .to_string();
    let prefix: Vec<&str> = me.split('/').take(2).collect();
    let want = format!("{}/{}/{pid}/", prefix[0], prefix[1]);
    let list = crate::common::summaries_labelled(engine, "kodx.process").await;
    list.iter()
        .filter(|c| {
            c.labels
                .as_ref()
                .and_then(|l| l.get("kodx.process"))
                .is_some_and(|p| p.starts_with(&want))
        })
        .count()
}

#[tokio::test]
async fn sigint_removes_the_process_containers() {
    let engine = common::require_engine!();
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
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let owner = child.id().unwrap();
    let t = Instant::now();
    while owned_by(&engine, owner).await == 0 {
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
        owned_by(&engine, owner).await,
        0,
        "containers left after Ctrl-C"
    );
}

extern "C" {
    #[link_name = "kill"]
    fn libc_kill(pid: i32, sig: i32) -> i32;
}
