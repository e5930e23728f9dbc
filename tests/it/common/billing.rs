//! A model that bills from the Anthropic request body kodx would send, as Anthropic bills
//! it, and always asks for another command: the cap's workload (issue 41, item 4), for
//! `tests/it/agent_cache.rs` and `bench/cap.sh`.
//!
//! The real agent loop runs in process against it and a workspace whose every command
//! prints ~3,000 tokens (12 KB) of text; each answer is 400 output tokens (or, with
//! `max_out`, the whole `max_tokens`), at `claude-sonnet-4-5` prices. [`Billing`] says how
//! the prompt is billed.

use std::collections::HashSet;
use std::path::Path;
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use kodx::agent::{Agent, AgentConfig, Outcome};
use kodx::cost::{Price, Pricing};
use kodx::model::{Block, ModelStop, Provider, ProviderError, Request, Response, Usage};
use kodx::sandbox::{ChangeSet, Exported, FeedOutput, Sandbox, ShellStatus};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

/// Tool output per call: ~3,000 tokens.
const OUTPUT_BYTES: usize = 12_000;
/// Output tokens of each answer, unless the model generates its whole `max_tokens`.
pub const ANSWER_TOKENS: u64 = 400;
pub const MODEL: &str = "claude-sonnet-4-5";

/// How the fake provider bills a request's prompt.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Billing {
    /// No cache: every prompt token at the input price (an OpenAI-like provider without
    /// cached tokens).
    Plain,
    /// Prefixes ending at a `cache_control` breakpoint are kept; the longest kept prefix
    /// of a request is read at the cache-read price, the rest up to its last breakpoint
    /// written at the cache-write price, what follows the last breakpoint at the input
    /// price.
    Cached,
    /// The same with a cache that never keeps anything (expired, evicted): the dearest a
    /// provider can bill a request, everything up to its last breakpoint written again.
    Evicted,
}

/// One run's setting.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    pub cap: f64,
    pub billing: Billing,
    /// The model answers `count_tokens` exactly.
    pub counts: bool,
    /// Every answer is `max_tokens` long.
    pub max_out: bool,
}

/// Tokens of a piece of the request: 4 bytes a token, as English text and code run.
fn tokens(bytes: usize) -> u64 {
    bytes.div_ceil(4) as u64
}

/// One model call as billed.
#[derive(Debug, Clone)]
pub struct Call {
    pub answer_only: bool,
    pub max_tokens: u32,
    pub usage: Usage,
    pub cost: f64,
}

/// A model that always asks for another command (or, when it may not call a tool, answers
/// with a summary), billing as [`Billing`] says.
pub struct CapModel {
    setting: Setting,
    price: Price,
    /// Keys of the prefixes the cache holds.
    cache: Mutex<HashSet<u64>>,
    pub calls: Mutex<Vec<Call>>,
}

fn key(parts: &[&Value]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in parts {
        p.to_string().hash(&mut h);
    }
    h.finish()
}

impl CapModel {
    pub fn new(setting: Setting) -> CapModel {
        CapModel {
            setting,
            price: Pricing::builtin().price(MODEL).unwrap(),
            cache: Mutex::new(HashSet::new()),
            calls: Mutex::new(Vec::new()),
        }
    }

    /// The prompt's usage, from the request body kodx would send to Anthropic.
    fn prompt_usage(&self, request: &Request) -> Usage {
        let body = kodx::providers::anthropic::request_body(request);
        let null = Value::Null;
        let system = body.get("system").unwrap_or(&null);
        let tools = body.get("tools").unwrap_or(&null);
        let choice = body.get("tool_choice").unwrap_or(&null);
        // The frame (tools, system and the tool-use preamble) and each block of each
        // message, in the order the provider reads them, with its token count, its
        // breakpoint and the key of the prefix it ends.
        let frame_tokens = tokens(system.to_string().len() + tools.to_string().len()) + 350;
        let frame_breakpoint = system.to_string().contains("cache_control");
        let frame_key = key(&[tools, system]);
        let mut pieces = vec![(frame_tokens, frame_breakpoint, frame_key)];
        // tool_choice is part of the messages' prefix: changing it invalidates their cache.
        let mut chain = key(&[&json!(frame_key), choice]);
        for message in body["messages"].as_array().unwrap() {
            for block in message["content"].as_array().unwrap() {
                let mut plain = block.clone();
                let breakpoint = plain.as_object_mut().unwrap().remove("cache_control");
                let text = plain.to_string();
                chain = key(&[&json!(chain), &message["role"], &json!(text)]);
                pieces.push((tokens(text.len()) + 4, breakpoint.is_some(), chain));
            }
        }
        let total: u64 = pieces.iter().map(|p| p.0).sum();
        if self.setting.billing == Billing::Plain {
            return Usage {
                input_tokens: total,
                ..Usage::default()
            };
        }
        let last_breakpoint = pieces.iter().rposition(|p| p.1);
        let mut cache = self.cache.lock().unwrap();
        if self.setting.billing == Billing::Evicted {
            cache.clear();
        }
        let mut usage = Usage::default();
        let Some(last) = last_breakpoint else {
            usage.input_tokens = total;
            return usage;
        };
        // The longest kept prefix at a block boundary up to the last breakpoint is read.
        let hit = (0..=last).rev().find(|&i| cache.contains(&pieces[i].2));
        for (i, piece) in pieces.iter().enumerate() {
            if hit.is_some_and(|h| i <= h) {
                usage.cache_read_tokens += piece.0;
            } else if i <= last {
                usage.cache_write_tokens += piece.0;
            } else {
                usage.input_tokens += piece.0;
            }
        }
        for piece in &pieces[..=last] {
            if piece.1 {
                cache.insert(piece.2);
            }
        }
        usage
    }
}

#[async_trait]
impl Provider for CapModel {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    async fn count_tokens(&self, request: &Request) -> Option<u64> {
        if !self.setting.counts {
            return None;
        }
        let mut plain = self.setting;
        plain.billing = Billing::Plain;
        let counter = CapModel::new(plain);
        Some(counter.prompt_usage(request).input_tokens)
    }

    async fn complete(&self, request: &Request) -> Result<Response, ProviderError> {
        let mut usage = self.prompt_usage(request);
        usage.output_tokens = if self.setting.max_out {
            request.max_tokens as u64
        } else {
            ANSWER_TOKENS.min(request.max_tokens as u64)
        };
        let cost = self.price.cost(&usage);
        let mut calls = self.calls.lock().unwrap();
        calls.push(Call {
            answer_only: request.answer_only,
            max_tokens: request.max_tokens,
            usage,
            cost,
        });
        let n = calls.len();
        let (content, stop) = if request.answer_only {
            let text = "Summary: listed the parts; the rest is left.";
            (vec![Block::Text { text: text.into() }], ModelStop::EndTurn)
        } else {
            let call = Block::ToolUse {
                id: format!("t{n}"),
                name: "feed_chars".into(),
                input: json!({"chars": format!("cat part{n}.txt")}),
            };
            (vec![call], ModelStop::ToolUse)
        };
        Ok(Response {
            content,
            stop,
            usage,
            model: request.model.clone(),
        })
    }
}

/// A workspace whose every command prints 12 KB of text, at once.
pub struct ChattySandbox;

#[async_trait]
impl Sandbox for ChattySandbox {
    async fn create_new_shell(&self, name: &str) -> kodx::sandbox::Result<String> {
        Ok(format!("shell {name} started"))
    }

    async fn feed_chars(
        &self,
        name: &str,
        chars: &str,
        _yield_time: Duration,
    ) -> kodx::sandbox::Result<FeedOutput> {
        let line = format!("{chars}: the quick brown fox jumps over the lazy dog 0123456789\n");
        let output: String = line.repeat(OUTPUT_BYTES / line.len() + 1)[..OUTPUT_BYTES].into();
        Ok(FeedOutput {
            shell: name.into(),
            output,
            status: ShellStatus::Ready { exit_code: Some(0) },
            omitted_bytes: 0,
            untyped_bytes: 0,
            elapsed: Duration::ZERO,
        })
    }

    async fn export_workspace(&self, _dest: &Path) -> kodx::sandbox::Result<Exported> {
        Ok(Exported::default())
    }

    async fn change_set(&self) -> kodx::sandbox::Result<ChangeSet> {
        Ok(ChangeSet::default())
    }

    fn workdir(&self) -> &str {
        "/workspace"
    }

    async fn destroy(&self) -> kodx::sandbox::Result<()> {
        Ok(())
    }
}

/// Runs the loop until the cap (or `max_iterations`) stops it; the outcome and every call.
pub async fn run(setting: Setting, max_iterations: u32) -> (Outcome, Vec<Call>) {
    let model = CapModel::new(setting);
    let system = kodx::program::Program::builtin("code")
        .expect("the built-in code program")
        .system_prompt;
    let mut cfg = AgentConfig::new(MODEL, system, model.price);
    cfg.cost_limit = setting.cap;
    cfg.max_iterations = max_iterations;
    let agent = Agent {
        provider: &model,
        sandbox: &ChattySandbox,
        verifier: None,
        config: cfg,
        cancel: CancellationToken::new(),
        steering: None,
    };
    let outcome = agent.run("List every part.", |_| {}, |_| {}).await;
    let calls = model.calls.lock().unwrap().clone();
    (outcome, calls)
}
