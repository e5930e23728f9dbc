//! The agent loop against a validating fake Anthropic API and the real sandbox.

use std::time::{Duration, Instant};

use crate::common;
use crate::common::fake_anthropic::FakeAnthropic;
use crate::common::*;
use kodx::agent::{Agent, AgentConfig, Outcome, Record, StopReason};
use kodx::cost::Pricing;
use kodx::providers::{AnthropicClient, RetryPolicy};
use kodx::sandbox::{DockerSandbox, Sandbox};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

const KEY: &str = "sk-ant-agent-test-0123456789";

fn tool(id: &str, name: &str, input: Value) -> Value {
    json!({"type": "tool_use", "id": id, "name": name, "input": input})
}

fn usage(input: u64, output: u64, write: u64, read: u64) -> Value {
    json!({"input_tokens": input, "output_tokens": output, "cache_creation_input_tokens": write, "cache_read_input_tokens": read})
}

fn config() -> AgentConfig {
    let price = Pricing::builtin().price("claude-sonnet-4-5").unwrap();
    let mut c = AgentConfig::new("claude-sonnet-4-5", "You work in a container.", price);
    c.max_tokens = 1024;
    c.command_timeout = Duration::from_secs(10);
    c
}

async fn run(
    fake: &FakeAnthropic,
    sb: &DockerSandbox,
    cfg: AgentConfig,
    cancel: CancellationToken,
) -> (Outcome, Vec<Record>) {
    let client = AnthropicClient::new(&fake.url, KEY).with_retry(RetryPolicy {
        max_attempts: 2,
        base_delay: Duration::from_millis(10),
        ..Default::default()
    });
    let agent = Agent {
        provider: &client,
        sandbox: sb,
        verifier: None,
        config: cfg,
        cancel,
        steering: None,
    };
    let mut records = Vec::new();
    let outcome = agent
        .run("Make a file.", |_| {}, |r| records.push(r.clone()))
        .await;
    (outcome, records)
}

fn tool_results(fake: &FakeAnthropic, request: usize) -> Vec<Value> {
    let body = &fake.requests()[request].body;
    let last = body["messages"].as_array().unwrap().last().unwrap().clone();
    last["content"].as_array().unwrap().clone()
}

#[tokio::test]
async fn a_tool_conversation_really_changes_the_workspace_and_costs_exactly() {
    let engine = common::require_engine!();
    let fake = FakeAnthropic::start(KEY).await;
    fake.reply(
        vec![tool(
            "t1",
            "feed_chars",
            json!({"chars": "echo hello > made.txt"}),
        )],
        "tool_use",
        usage(100, 20, 1500, 0),
    );
    fake.reply(
        vec![tool(
            "t2",
            "feed_chars",
            json!({"chars": "cat made.txt; uname -s"}),
        )],
        "tool_use",
        usage(50, 20, 100, 1500),
    );
    fake.reply(
        vec![json!({"type": "text", "text": "Created made.txt."})],
        "end_turn",
        usage(40, 10, 60, 1600),
    );
    let spec = spec("agent-ok");
    let sb = start(&engine, &spec).await;
    let (outcome, records) = run(&fake, &sb, config(), CancellationToken::new()).await;
    assert_eq!(outcome.stop_reason, StopReason::EndTurn, "{outcome:?}");
    assert_eq!(outcome.last_message, "Created made.txt.");
    assert_eq!(outcome.api_calls, 3);
    assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
    // The model saw what the container really printed.
    let results = tool_results(&fake, 2);
    assert_eq!(results[0]["content"], "hello\nLinux\n[exit status: 0]");
    // Exact cost: input 190 × $3, output 50 × $15, cache write 1660 × $3.75, read 3100 × $0.30 per million.
    let want = (190.0 * 3.0 + 50.0 * 15.0 + 1660.0 * 3.75 + 3100.0 * 0.30) / 1e6;
    assert!(
        (outcome.usd_cost - want).abs() < 1e-12,
        "{} vs {want}",
        outcome.usd_cost
    );
    assert_eq!(outcome.usage.cache_write_tokens, 1660);
    // The change is in the workspace.
    let cs = sb.change_set().await.unwrap();
    assert_eq!(cs.changes.len(), 1);
    assert_eq!(cs.changes[0].path, "made.txt");
    // The transcript has every request, response, call and result, and never the key.
    let kinds: Vec<&str> = records
        .iter()
        .map(|r| match r {
            Record::ModelRequest { .. } => "request",
            Record::ModelResponse { .. } => "response",
            Record::ToolCall { .. } => "call",
            Record::ToolResult { .. } => "result",
            Record::Stop { .. } => "stop",
            Record::Context { .. } => "context",
            Record::Check { .. } => "check",
            Record::Steer { .. } => "steer",
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "request", "response", "call", "result", "request", "response", "call", "result",
            "request", "response", "stop"
        ]
    );
    let all = serde_json::to_string(&records).unwrap();
    assert!(!all.contains(KEY));
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn the_cost_cap_is_never_crossed() {
    let engine = common::require_engine!();
    let fake = FakeAnthropic::start(KEY).await;
    // Each call bills the most output it may (1,024 tokens) and a prompt as large as a
    // request of this size can be (a token covers at least one byte), all cache writes.
    for i in 0..50 {
        fake.reply(
            vec![tool(
                &format!("t{i}"),
                "feed_chars",
                json!({"chars": "true"}),
            )],
            "tool_use",
            usage(0, 1024, 2500, 0),
        );
    }
    let spec = spec("agent-cap");
    let sb = start(&engine, &spec).await;
    let mut cfg = config();
    cfg.cost_limit = 0.10;
    let (outcome, _) = run(&fake, &sb, cfg, CancellationToken::new()).await;
    assert_eq!(
        outcome.stop_reason,
        StopReason::CostLimitExceeded,
        "{outcome:?}"
    );
    assert!(outcome.usd_cost <= 0.10, "spent {}", outcome.usd_cost);
    assert!(outcome.api_calls >= 2, "{}", outcome.api_calls);
    assert_eq!(
        fake.requests().len() as u32,
        outcome.api_calls,
        "no call past the cap was made"
    );
    assert!(outcome.detail.unwrap().contains('$'));
    // The Python kodx spent $0.0116 with --cost-limit 0.001: kodx makes no call it cannot pay.
    let fake2 = FakeAnthropic::start(KEY).await;
    let mut cfg = config();
    cfg.cost_limit = 0.001;
    let (outcome, _) = run(&fake2, &sb, cfg, CancellationToken::new()).await;
    assert_eq!(outcome.stop_reason, StopReason::CostLimitExceeded);
    assert!(outcome.usd_cost <= 0.001);
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn max_iterations_timeout_and_cancel_stop_the_run() {
    let engine = common::require_engine!();
    let spec = spec("agent-limits");
    let sb = start(&engine, &spec).await;

    let fake = FakeAnthropic::start(KEY).await;
    for i in 0..10 {
        fake.reply(
            vec![tool(
                &format!("t{i}"),
                "feed_chars",
                json!({"chars": "true"}),
            )],
            "tool_use",
            usage(10, 5, 0, 0),
        );
    }
    let mut cfg = config();
    cfg.max_iterations = 3;
    let (outcome, _) = run(&fake, &sb, cfg, CancellationToken::new()).await;
    assert_eq!(outcome.stop_reason, StopReason::MaxIterations);
    assert_eq!(outcome.api_calls, 3);

    let fake = FakeAnthropic::start(KEY).await;
    fake.reply(
        vec![tool("s", "feed_chars", json!({"chars": "sleep 30"}))],
        "tool_use",
        usage(10, 5, 0, 0),
    );
    let mut cfg = config();
    cfg.timeout = Duration::from_secs(2);
    cfg.command_timeout = Duration::from_secs(60);
    let t = Instant::now();
    let (outcome, _) = run(&fake, &sb, cfg, CancellationToken::new()).await;
    assert_eq!(outcome.stop_reason, StopReason::Timeout);
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());

    // Cancellation from outside stops a run in the middle of a command.
    sb.feed_chars("default", "\\x03", Duration::from_secs(5))
        .await
        .unwrap();
    let fake = FakeAnthropic::start(KEY).await;
    fake.reply(
        vec![tool("s", "feed_chars", json!({"chars": "sleep 30"}))],
        "tool_use",
        usage(10, 5, 0, 0),
    );
    let cancel = CancellationToken::new();
    let c2 = cancel.clone();
    let (e2, run_id) = (engine.clone(), spec.run_id.clone());
    tokio::spawn(async move {
        wait_for_process(&e2, &run_id, "sleep 30", Duration::from_secs(30)).await;
        c2.cancel();
    });
    let t = Instant::now();
    let (outcome, _) = run(&fake, &sb, config(), cancel).await;
    assert_eq!(outcome.stop_reason, StopReason::Cancelled);
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn bad_tool_calls_go_back_to_the_model_and_repeated_ones_end_the_run() {
    let engine = common::require_engine!();
    let spec = spec("agent-tools");
    let sb = start(&engine, &spec).await;
    let fake = FakeAnthropic::start(KEY).await;
    fake.reply(
        vec![
            tool("a", "rm_everything", json!({})),
            tool("b", "feed_chars", json!({"chars": 5})),
            tool(
                "c",
                "feed_chars",
                json!({"chars": "echo ok", "shell_name": "nope"}),
            ),
            tool("d", "create_new_shell", json!({"shell_name": "srv"})),
        ],
        "tool_use",
        usage(10, 5, 0, 0),
    );
    fake.reply(
        vec![json!({"type": "text", "text": "Sorry."})],
        "end_turn",
        usage(10, 5, 0, 0),
    );
    let (outcome, _) = run(&fake, &sb, config(), CancellationToken::new()).await;
    assert_eq!(outcome.stop_reason, StopReason::EndTurn, "{outcome:?}");
    let results = tool_results(&fake, 1);
    assert_eq!(results.len(), 4);
    assert_eq!(results[0]["is_error"], true);
    insta::assert_snapshot!(results[0]["content"].as_str().unwrap(), @r#"unknown tool "rm_everything": the tools are feed_chars and create_new_shell"#);
    insta::assert_snapshot!(results[1]["content"].as_str().unwrap(), @"chars must be a string, got 5");
    insta::assert_snapshot!(results[2]["content"].as_str().unwrap(), @r#"no shell named "nope": call create_new_shell with that name first"#);
    assert_eq!(results[3]["is_error"], false);
    assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());

    let fake = FakeAnthropic::start(KEY).await;
    for i in 0..10 {
        fake.reply(
            vec![tool(&format!("x{i}"), "no_such_tool", json!({}))],
            "tool_use",
            usage(10, 5, 0, 0),
        );
    }
    let (outcome, _) = run(&fake, &sb, config(), CancellationToken::new()).await;
    assert_eq!(outcome.stop_reason, StopReason::ToolError);
    assert_eq!(outcome.api_calls, 5);
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn the_loop_works_the_same_over_an_openai_compatible_server() {
    use crate::common::fake_openai::FakeOpenAi;
    use kodx::providers::OpenAiClient;
    let engine = common::require_engine!();
    let fake = FakeOpenAi::start(None).await;
    fake.reply(
        None,
        &[
            ("c1", "feed_chars", "{not json"),
            ("c2", "feed_chars", r#"{"chars":"echo via openai > o.txt"}"#),
        ],
        (800, 20, 0),
    );
    fake.reply(Some("All done."), &[], (900, 5, 768));
    let spec = spec("agent-openai");
    let sb = start(&engine, &spec).await;
    let client = OpenAiClient::new(&fake.url, None);
    let price = Pricing::builtin().price("gpt-4.1").unwrap();
    let mut cfg = AgentConfig::new("gpt-4.1", "You work in a container.", price);
    cfg.command_timeout = Duration::from_secs(10);
    let agent = Agent {
        provider: &client,
        sandbox: &sb,
        verifier: None,
        config: cfg,
        cancel: CancellationToken::new(),
        steering: None,
    };
    let outcome = agent.run("Write o.txt", |_| {}, |_| {}).await;
    assert_eq!(outcome.stop_reason, StopReason::EndTurn, "{outcome:?}");
    assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
    let sent = &fake.requests()[1]["messages"];
    let tool_msgs: Vec<&Value> = sent
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    assert_eq!(tool_msgs.len(), 2);
    insta::assert_snapshot!(tool_msgs[0]["content"].as_str().unwrap(), @r#"Error: the arguments of feed_chars must be a JSON object, got: "{not json""#);
    insta::assert_snapshot!(tool_msgs[1]["content"].as_str().unwrap(), @"[exit status: 0]");
    // gpt-4.1: $2 input, $8 output, $0.50 cached input per million.
    let want = ((800.0 + 132.0) * 2.0 + 25.0 * 8.0 + 768.0 * 0.5) / 1e6;
    assert!(
        (outcome.usd_cost - want).abs() < 1e-12,
        "{} vs {want}",
        outcome.usd_cost
    );
    let cs = sb.change_set().await.unwrap();
    assert_eq!(cs.changes[0].path, "o.txt");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn a_reply_cut_at_max_tokens_is_continued_not_taken_as_the_end() {
    let engine = common::require_engine!();
    let fake = FakeAnthropic::start(KEY).await;
    fake.reply(
        vec![json!({"type": "text", "text": "The answer is a long"})],
        "max_tokens",
        usage(10, 1024, 0, 0),
    );
    fake.reply(
        vec![json!({"type": "text", "text": "list, now complete."})],
        "end_turn",
        usage(10, 20, 0, 0),
    );
    let spec = spec("agent-max-tokens");
    let sb = start(&engine, &spec).await;
    let (outcome, _) = run(&fake, &sb, config(), CancellationToken::new()).await;
    assert_eq!(outcome.stop_reason, StopReason::EndTurn);
    assert_eq!(outcome.api_calls, 2);
    assert_eq!(outcome.last_message, "list, now complete.");
    let second = &fake.requests()[1].body["messages"];
    let last = second.as_array().unwrap().last().unwrap();
    insta::assert_snapshot!(last["content"][0]["text"].as_str().unwrap(), @"Your reply was cut off at the output limit. Continue where you stopped, briefly.");
    assert!(fake.rejected().is_empty(), "{:?}", fake.rejected());
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}
