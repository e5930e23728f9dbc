//! `kodx run --network` and `--network-allow`: the real binary, a fake Anthropic API, the
//! real sandbox and a listener on the host.

use crate::common;
use crate::common::fake_anthropic::FakeAnthropic;
use crate::common::net::*;
use serde_json::{json, Value};

const KEY: &str = "sk-ant-cli-net-0123456789";

fn kodx(fake: &FakeAnthropic) -> tokio::process::Command {
    common::kodx_command(fake, KEY)
}

#[tokio::test]
async fn setup_only_with_an_allowed_host_address_reaches_it_in_setup_only() {
    let engine = common::require_engine!();
    let (port, server) = host_listener().await;
    let gateway = sandbox_gateway(&engine).await.to_string();
    let dir = tempfile::tempdir().unwrap();
    let setup = dir.path().join("setup.sh");
    std::fs::write(
        &setup,
        format!(
            "{} > /tmp/setup.txt\n",
            probe(port, std::slice::from_ref(&gateway))
        ),
    )
    .unwrap();
    let fake = FakeAnthropic::start(KEY).await;
    let after = probe(port, std::slice::from_ref(&gateway));
    fake.reply(
        vec![json!({"type": "tool_use", "id": "t1", "name": "feed_chars",
            "input": {"chars": format!("cat /tmp/setup.txt; {after}; ls /sys/class/net")}})],
        "tool_use",
        json!({"input_tokens": 100, "output_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}),
    );
    fake.answer_from_last_tool_result(|out| out.to_string());
    let output = kodx(&fake)
        .args([
            "run",
            "-p",
            "network?",
            "--json",
            "--quiet",
            "--repo-dir",
            "",
        ])
        .args(["--network", "setup-only", "--network-allow"])
        .arg(format!("{gateway}/32"))
        .arg("--setup-script")
        .arg(&setup)
        .output()
        .await
        .unwrap();
    server.abort();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let result: Value = serde_json::from_slice(&output.stdout).unwrap();
    let text = result["last_message"].as_str().unwrap();
    let got = probed(text);
    assert!(
        matches!(got.as_slice(), [(_, Ok(_)), (_, Err((errno, _)))] if errno == "101" || errno == EHOSTUNREACH),
        "reached in setup, no network after: {text}"
    );
    assert!(text.contains("\nlo\n"), "{text}");
}

#[tokio::test]
async fn bad_network_flags_are_refused_with_the_reason() {
    let fake = FakeAnthropic::start(KEY).await;
    let output = kodx(&fake)
        .args(["run", "-p", "x", "--network-allow", "10.1.2.3/8"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_ne!(output.status.code(), Some(0));
    assert!(stderr.contains("did you mean 10.0.0.0/8"), "{stderr}");
    let output = kodx(&fake)
        .args(["run", "-p", "x", "--network", "sometimes"])
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_ne!(output.status.code(), Some(0));
    assert!(stderr.contains("setup-only"), "{stderr}");
    assert!(fake.requests().is_empty());
}
