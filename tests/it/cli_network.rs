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

/// `--allow-host`: after the setup script the container reaches only kodx's egress proxy,
/// which lets the named host through (an upstream on 127.0.0.2, opened by
/// `--network-allow`; not 127.0.0.1, which the sandbox's `NO_PROXY` keeps its own) and
/// refuses the rest with 403; the refusals are printed at the end.
#[tokio::test]
async fn allow_host_gives_the_egress_proxy_and_prints_what_it_refused() {
    let _engine = common::require_engine!();
    let listener = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let app = axum::Router::new().route(
        "/{*rest}",
        axum::routing::get(|| async { "hello from upstream" }),
    );
    let server = tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let fake = FakeAnthropic::start(KEY).await;
    let script = format!(
        "for u in http://127.0.0.2:{port}/hi http://blocked.example/x; do \
         python3 -c \"import sys, urllib.request as u, urllib.error as e\ntry: print('got', u.urlopen(sys.argv[1], timeout=5).read().decode())\nexcept e.HTTPError as x: print('http', x.code)\nexcept Exception as x: print('error', x)\" $u; done"
    );
    fake.reply(
        vec![json!({"type": "tool_use", "id": "t1", "name": "feed_chars",
            "input": {"chars": script}})],
        "tool_use",
        json!({"input_tokens": 100, "output_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}),
    );
    fake.answer_from_last_tool_result(|out| out.to_string());
    let output = kodx(&fake)
        .args(["run", "-p", "fetch", "--json", "--repo-dir", ""])
        .args(["--network-allow", "127.0.0.2/32", "--allow-host"])
        .arg(format!("127.0.0.2:{port}"))
        .output()
        .await
        .unwrap();
    server.abort();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(0), "{stderr}");
    let result: Value = serde_json::from_slice(&output.stdout).unwrap();
    let text = result["last_message"].as_str().unwrap();
    assert!(text.contains("got hello from upstream"), "{text}\n{stderr}");
    assert!(text.contains("http 403"), "{text}");
    assert!(
        stderr.contains("kodx: the egress proxy refused 1 host(s)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("blocked.example:80 ×1") && stderr.contains("allow with `blocked.example`"),
        "{stderr}"
    );
    let bad = kodx(&fake)
        .args(["run", "-p", "x", "--allow-host", "not a host"])
        .output()
        .await
        .unwrap();
    assert_ne!(bad.status.code(), Some(0));
    assert!(
        String::from_utf8_lossy(&bad.stderr).contains("--allow-host:"),
        "{}",
        String::from_utf8_lossy(&bad.stderr)
    );
}
