//! A sandbox's disk use is bounded (`max_disk_bytes`): the engine's storage quota where it
//! has one, else kodx's watchdog, which stops the run with a clear message. Against the
//! real Docker engine (here overlay2 on ext4: no quota, the watchdog applies).

use std::time::Duration;

use crate::common;
use crate::common::fake_anthropic::FakeAnthropic;
use crate::common::*;
use kodx::agent::{Agent, AgentConfig, StopReason};
use kodx::cost::Pricing;
use kodx::providers::AnthropicClient;
use kodx::sandbox::{DiskGuard, Sandbox, SandboxError};
use serde_json::json;
use tokio_util::sync::CancellationToken;

const LIMIT: u64 = 64 << 20;

fn small_disk(test: &str) -> kodx::sandbox::SandboxSpec {
    let mut s = spec(test);
    s.max_disk_bytes = Some(LIMIT);
    s.disk_check_interval = Duration::from_millis(200);
    s
}

/// The engine here has no storage quota; elsewhere the quota would apply instead.
async fn engine_has_no_quota(engine: &kodx::sandbox::Engine) -> bool {
    !engine.facts().await.unwrap().may_have_quota()
}

#[tokio::test]
async fn writing_past_max_disk_bytes_stops_the_sandbox_with_the_reason() {
    let engine = common::require_engine!();
    if !engine_has_no_quota(&engine).await {
        eprintln!("this engine has a storage quota; the watchdog is not used");
        return;
    }
    let spec = small_disk("disk-watchdog");
    let sb = start(&engine, &spec).await;
    assert_eq!(sb.disk_guard(), DiskGuard::Watchdog);
    // Well under the limit: nothing happens.
    sb.feed_chars(
        "default",
        "dd if=/dev/zero of=small bs=1M count=8 2>/dev/null; sleep 1",
        10 * SEC,
    )
    .await
    .unwrap();
    assert!(
        tokio::time::timeout(Duration::from_millis(500), sb.halted())
            .await
            .is_err(),
        "8 MiB of 64 MiB does not stop it"
    );
    // Past it, the watchdog stops the container and says why.
    let _ = sb
        .feed_chars(
            "default",
            "dd if=/dev/zero of=big bs=1M count=400",
            30 * SEC,
        )
        .await;
    let why = tokio::time::timeout(Duration::from_secs(20), sb.halted())
        .await
        .expect("the watchdog stops the sandbox");
    // How much it wrote before it was stopped varies; the limit and the reason do not.
    let mut settings = insta::Settings::clone_current();
    settings.add_filter(r"wrote \d+(\.\d+)? MiB", "wrote [size] MiB");
    settings.bind(|| insta::assert_snapshot!(why, @"the sandbox wrote [size] MiB to its disk, over its limit of 64.0 MiB (max_disk_bytes), and was stopped"));
    // Its processes are gone at once: nothing writes any more.
    let mut running = true;
    for _ in 0..50 {
        let info = engine
            .docker()
            .inspect_container(sb.container_id(), None)
            .await
            .unwrap();
        running = info.state.and_then(|s| s.running) != Some(false);
        if !running {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!running, "the container is stopped");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn a_setup_script_filling_the_disk_fails_the_start_with_the_reason() {
    let engine = common::require_engine!();
    if !engine_has_no_quota(&engine).await {
        return;
    }
    let mut spec = small_disk("disk-setup");
    spec.setup_script = Some("dd if=/dev/zero of=/tmp/fill bs=1M count=400\nsleep 30\n".into());
    let err = engine.start(&spec).await.err().expect("the start fails");
    assert!(matches!(err, SandboxError::DiskLimit { .. }), "{err:?}");
    assert!(err.to_string().contains("max_disk_bytes"), "{err}");
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn a_quota_the_engine_refuses_falls_back_to_the_watchdog() {
    let engine = common::require_engine!();
    let mut forced = small_disk("disk-quota");
    // Ask for the quota whatever the driver says.
    forced.disk_quota = Some(true);
    let sb = start(&engine, &forced).await;
    let info = engine
        .docker()
        .inspect_container(sb.container_id(), None)
        .await
        .unwrap();
    let storage_opt = info.host_config.and_then(|h| h.storage_opt);
    if engine_has_no_quota(&engine).await {
        assert_eq!(sb.disk_guard(), DiskGuard::Watchdog);
        assert!(
            storage_opt.as_ref().is_none_or(|o| o.is_empty()),
            "{storage_opt:?}"
        );
    } else {
        assert_eq!(sb.disk_guard(), DiskGuard::Quota);
        assert_eq!(
            storage_opt.and_then(|o| o.get("size").cloned()),
            Some(LIMIT.to_string())
        );
    }
    sb.destroy().await.unwrap();
    // No limit, no guard.
    let mut unlimited = spec("disk-none");
    unlimited.max_disk_bytes = None;
    let sb = start(&engine, &unlimited).await;
    assert_eq!(sb.disk_guard(), DiskGuard::None);
    sb.destroy().await.unwrap();
}

#[tokio::test]
async fn an_agent_run_past_the_disk_limit_ends_as_an_error_naming_it() {
    let engine = common::require_engine!();
    if !engine_has_no_quota(&engine).await {
        return;
    }
    const KEY: &str = "sk-ant-disk-test-0123456789";
    let fake = FakeAnthropic::start(KEY).await;
    let usage = json!({"input_tokens": 100, "output_tokens": 20, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0});
    fake.reply(
        vec![json!({"type": "tool_use", "id": "t1", "name": "feed_chars",
            "input": {"chars": "dd if=/dev/zero of=big bs=1M count=400; sleep 60"}})],
        "tool_use",
        usage.clone(),
    );
    fake.reply(
        vec![json!({"type": "text", "text": "done"})],
        "end_turn",
        usage,
    );
    let spec = small_disk("disk-agent");
    let sb = start(&engine, &spec).await;
    let price = Pricing::builtin().price("claude-sonnet-4-5").unwrap();
    let mut cfg = AgentConfig::new("claude-sonnet-4-5", "You work in a container.", price);
    cfg.max_tokens = 1024;
    cfg.command_timeout = Duration::from_secs(60);
    let client = AnthropicClient::new(&fake.url, KEY);
    let agent = Agent {
        provider: &client,
        sandbox: &sb,
        verifier: None,
        config: cfg,
        cancel: CancellationToken::new(),
        steering: None,
    };
    let started = std::time::Instant::now();
    let outcome = agent.run("Fill the disk.", |_| {}, |_| {}).await;
    assert_eq!(outcome.stop_reason, StopReason::Error, "{outcome:?}");
    let detail = outcome.detail.unwrap_or_default();
    assert!(detail.contains("max_disk_bytes"), "{detail}");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "stopped by the watchdog, not by the command's 60 s: {:?}",
        started.elapsed()
    );
    assert_eq!(fake.requests().len(), 1, "no model call after the stop");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}
