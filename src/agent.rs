//! The agent loop (SPEC §6–7): offers the model exactly the two shell tools, runs its tool
//! calls in the sandbox, feeds the results back, and stops at the first limit: cost cap
//! (planned before every call, never crossed), `max_iterations`, wall-clock timeout,
//! repeated tool failures, cancellation. Every request, response, tool call and result is
//! handed to the caller as a transcript record ([`crate::transcript`]: each message once).

use std::time::{Duration, Instant};

use futures_util::FutureExt;
use serde::Serialize;
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use crate::cost::{request_token_upper_bound, Budget, Price};
use crate::model::{Block, Message, ModelStop, Provider, Request, Role, ToolSpec, Usage};
use crate::sandbox::{Sandbox, DEFAULT_SHELL};

/// Why a run stopped (SPEC §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    CostLimitExceeded,
    MaxIterations,
    Timeout,
    ToolError,
    SetupFailed,
    Cancelled,
    Error,
}

impl StopReason {
    pub fn as_str(self) -> &'static str {
        match self {
            StopReason::EndTurn => "end_turn",
            StopReason::CostLimitExceeded => "cost_limit_exceeded",
            StopReason::MaxIterations => "max_iterations",
            StopReason::Timeout => "timeout",
            StopReason::ToolError => "tool_error",
            StopReason::SetupFailed => "setup_failed",
            StopReason::Cancelled => "cancelled",
            StopReason::Error => "error",
        }
    }
}

/// The limits and model settings of one run.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub model: String,
    pub system_prompt: String,
    pub max_tokens: u32,
    pub temperature: Option<f32>,
    pub price: Price,
    pub cost_limit: f64,
    pub max_iterations: u32,
    /// Wall clock for the whole run.
    pub timeout: Duration,
    /// The longest one `feed_chars` waits (its default `yield_time_ms`).
    pub command_timeout: Duration,
    /// Consecutive failed tool calls that end the run with `tool_error`.
    pub max_tool_failures: u32,
    /// Upper bound of prompt tokens kept in the conversation; past it, the oldest tool
    /// results are elided.
    pub context_tokens: u64,
}

impl AgentConfig {
    pub fn new(model: impl Into<String>, system_prompt: impl Into<String>, price: Price) -> Self {
        AgentConfig {
            model: model.into(),
            system_prompt: system_prompt.into(),
            max_tokens: 8192,
            temperature: None,
            price,
            cost_limit: 1.0,
            max_iterations: 50,
            timeout: Duration::from_secs(30 * 60),
            command_timeout: Duration::from_secs(30),
            max_tool_failures: 5,
            context_tokens: 150_000,
        }
    }
}

/// How a run ended, with its cost.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Outcome {
    pub stop_reason: StopReason,
    /// The model's last text (the answer, or the summary of the change).
    pub last_message: String,
    pub api_calls: u32,
    pub usage: Usage,
    pub usd_cost: f64,
    pub cost_limit: f64,
    pub duration: Duration,
    pub model: String,
    /// What went wrong, in words a user can act on, when the run did not end its turn.
    pub detail: Option<String>,
}

/// What a run reports while it works (for progress lines and status comments).
#[derive(Debug, Clone, PartialEq)]
pub struct Progress {
    pub step: u32,
    /// "thinking" or the tool call being run, e.g. `feed_chars(default): cargo test`.
    pub action: String,
    pub spent: f64,
    pub limit: f64,
    pub elapsed: Duration,
}

pub use crate::transcript::Record;
use crate::transcript::Recorder;

/// The two tools, named and shaped as in the original kodx (SPEC §6).
pub fn tools(command_timeout: Duration) -> Vec<ToolSpec> {
    vec![
        ToolSpec {
            name: "feed_chars".into(),
            description: format!(
                "Type characters into a shell and return what it printed since the last read. \
                 A newline is added unless `chars` is empty or already ends with one; empty `chars` \
                 just reads new output. Returns as soon as the shell is back at its prompt (with \
                 '[exit status: N]'), when a program waits at its own prompt ('[waiting for input]'), \
                 or after `yield_time_ms` with the partial output and '[still running …]': the command \
                 is NOT stopped. Send \"\\x03\" to interrupt (also \"\\x04\", \"\\x1b\" at the start \
                 of `chars`). Output past about 20,000 bytes is cut in the middle. Default and most \
                 yield: {} ms.",
                command_timeout.as_millis()
            ),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "chars": {"type": "string", "description": "What to type. A command, a line for a running program, control escapes, or \"\" to read new output."},
                    "shell_name": {"type": "string", "description": "Which shell (default \"default\")."},
                    "yield_time_ms": {"type": "integer", "minimum": 0, "description": "How long to wait for the prompt before returning partial output."}
                },
                "required": ["chars"],
                "additionalProperties": false
            }),
        },
        ToolSpec {
            name: "create_new_shell".into(),
            description: "Start a fresh shell in the workspace directory. \"default\" replaces the main \
                          shell (its jobs are hung up); a new name adds a parallel shell, e.g. a server in \
                          one and a client in another."
                .into(),
            input_schema: json!({
                "type": "object",
                "properties": {
                    "shell_name": {"type": "string", "description": "Name of the shell (default \"default\")."}
                },
                "additionalProperties": false
            }),
        },
    ]
}

/// One run of the agent loop.
pub struct Agent<'a> {
    pub provider: &'a dyn Provider,
    pub sandbox: &'a dyn Sandbox,
    pub config: AgentConfig,
    pub cancel: CancellationToken,
}

struct Ended(StopReason, Option<String>);

impl Agent<'_> {
    pub async fn run(
        &self,
        prompt: &str,
        mut progress: impl FnMut(&Progress),
        mut transcript: impl FnMut(&Record),
    ) -> Outcome {
        let started = Instant::now();
        let cfg = &self.config;
        let deadline = tokio::time::Instant::now() + cfg.timeout;
        let mut budget = Budget::new(cfg.cost_limit, cfg.price);
        let mut usage = Usage::default();
        let mut api_calls = 0u32;
        let mut last_message = String::new();
        let mut failures = 0u32;
        let mut messages = vec![Message::user_text(prompt)];
        let tool_specs = tools(cfg.command_timeout);
        // Each record holds what is new since the one before (see `crate::transcript`).
        let mut recorder = Recorder::default();

        let ended: Ended = 'run: loop {
            if self.cancel.is_cancelled() {
                break Ended(StopReason::Cancelled, None);
            }
            if let Some(why) = self.sandbox.halted().now_or_never() {
                break Ended(StopReason::Error, Some(why));
            }
            if tokio::time::Instant::now() >= deadline {
                break Ended(StopReason::Timeout, Some(timeout_detail(cfg.timeout)));
            }
            if api_calls >= cfg.max_iterations {
                break Ended(
                    StopReason::MaxIterations,
                    Some(format!(
                        "the run made its {} model calls (max_iterations)",
                        cfg.max_iterations
                    )),
                );
            }
            let mut request = Request {
                model: cfg.model.clone(),
                system: cfg.system_prompt.clone(),
                messages: messages.clone(),
                tools: tool_specs.clone(),
                max_tokens: cfg.max_tokens,
                temperature: cfg.temperature,
            };
            elide_old_results(&mut request, cfg.context_tokens);
            messages.clone_from(&request.messages);
            let upper = request_token_upper_bound(&request);
            let min_useful = cfg.max_tokens.min(1024);
            match budget.plan_call(upper, cfg.max_tokens, min_useful) {
                Ok(max_tokens) => request.max_tokens = max_tokens,
                Err(reached) => {
                    break Ended(StopReason::CostLimitExceeded, Some(reached.to_string()))
                }
            }
            let step = api_calls + 1;
            progress(&Progress {
                step,
                action: "thinking".into(),
                spent: budget.spent(),
                limit: budget.limit(),
                elapsed: started.elapsed(),
            });
            transcript(&recorder.request(step, &request));
            let response = tokio::select! {
                r = self.provider.complete(&request) => r,
                _ = self.cancel.cancelled() => break Ended(StopReason::Cancelled, None),
                why = self.sandbox.halted() => break Ended(StopReason::Error, Some(why)),
                _ = tokio::time::sleep_until(deadline) => break Ended(StopReason::Timeout, Some(timeout_detail(cfg.timeout))),
            };
            let response = match response {
                Ok(r) => r,
                Err(e) => {
                    break Ended(
                        StopReason::Error,
                        Some(format!("the model call failed: {e}")),
                    )
                }
            };
            api_calls += 1;
            usage.add(&response.usage);
            let cost = budget.record(&response.usage);
            transcript(&recorder.note(Record::ModelResponse {
                step,
                response: response.clone(),
                cost_usd: cost,
            }));
            let text = Message {
                role: Role::Assistant,
                content: response.content.clone(),
            }
            .text();
            if !text.trim().is_empty() {
                last_message = text;
            }
            let calls: Vec<(String, String, Value)> = response
                .content
                .iter()
                .filter_map(|b| match b {
                    Block::ToolUse { id, name, input } => {
                        Some((id.clone(), name.clone(), input.clone()))
                    }
                    _ => None,
                })
                .collect();
            if response.content.is_empty() {
                // An empty turn: nothing to send back as the assistant's message.
                if response.stop == ModelStop::EndTurn {
                    break Ended(StopReason::EndTurn, None);
                }
            } else {
                messages.push(Message {
                    role: Role::Assistant,
                    content: response.content.clone(),
                });
            }
            if calls.is_empty() {
                if response.stop == ModelStop::MaxTokens {
                    messages.push(Message::user_text(
                        "Your reply was cut off at the output limit. Continue where you stopped, briefly.",
                    ));
                    continue;
                }
                break Ended(StopReason::EndTurn, None);
            }
            let mut results = Vec::new();
            for (id, name, input) in calls {
                transcript(&recorder.note(Record::ToolCall {
                    step,
                    id: id.clone(),
                    name: name.clone(),
                }));
                progress(&Progress {
                    step,
                    action: describe_call(&name, &input),
                    spent: budget.spent(),
                    limit: budget.limit(),
                    elapsed: started.elapsed(),
                });
                let outcome = tokio::select! {
                    r = self.call_tool(&name, &input) => r,
                    _ = self.cancel.cancelled() => break 'run Ended(StopReason::Cancelled, None),
                    why = self.sandbox.halted() => break 'run Ended(StopReason::Error, Some(why)),
                    _ = tokio::time::sleep_until(deadline) => break 'run Ended(StopReason::Timeout, Some(timeout_detail(cfg.timeout))),
                };
                let (output, is_error) = match outcome {
                    Ok(out) => {
                        failures = 0;
                        (out, false)
                    }
                    Err(e) => {
                        failures += 1;
                        (e, true)
                    }
                };
                transcript(&recorder.note(Record::ToolResult {
                    step,
                    id: id.clone(),
                    output: output.clone(),
                    is_error,
                }));
                results.push(Block::ToolResult {
                    tool_use_id: id,
                    content: output,
                    is_error,
                });
            }
            messages.push(Message {
                role: Role::User,
                content: results,
            });
            if failures >= cfg.max_tool_failures {
                break Ended(
                    StopReason::ToolError,
                    Some(format!("{failures} tool calls in a row failed")),
                );
            }
        };
        let outcome = Outcome {
            stop_reason: ended.0,
            last_message,
            api_calls,
            usage,
            usd_cost: budget.spent(),
            cost_limit: budget.limit(),
            duration: started.elapsed(),
            model: cfg.model.clone(),
            detail: ended.1,
        };
        transcript(&Record::Stop {
            outcome: serde_json::to_value(&outcome).unwrap_or(Value::Null),
        });
        outcome
    }

    /// Runs one tool call; `Err` carries the message the model gets back as an error.
    async fn call_tool(&self, name: &str, input: &Value) -> Result<String, String> {
        let obj = input.as_object().ok_or_else(|| {
            format!(
                "the arguments of {name} must be a JSON object, got: {}",
                shorten(&input.to_string())
            )
        })?;
        let shell = match obj.get("shell_name") {
            None | Some(Value::Null) => DEFAULT_SHELL.to_string(),
            Some(Value::String(s)) => s.clone(),
            Some(other) => return Err(format!("shell_name must be a string, got {other}")),
        };
        match name {
            "create_new_shell" => {
                if let Some(k) = obj.keys().find(|k| *k != "shell_name") {
                    return Err(format!("create_new_shell takes only shell_name, not {k:?}"));
                }
                self.sandbox
                    .create_new_shell(&shell)
                    .await
                    .map_err(|e| e.to_string())
            }
            "feed_chars" => {
                if let Some(k) = obj
                    .keys()
                    .find(|k| !["chars", "shell_name", "yield_time_ms"].contains(&k.as_str()))
                {
                    return Err(format!(
                        "feed_chars takes chars, shell_name and yield_time_ms, not {k:?}"
                    ));
                }
                let chars = match obj.get("chars") {
                    Some(Value::String(s)) => s.as_str(),
                    Some(other) => return Err(format!("chars must be a string, got {other}")),
                    None => {
                        return Err("feed_chars needs chars (use \"\" to read new output)".into())
                    }
                };
                let max = self.config.command_timeout;
                let yield_time = match obj.get("yield_time_ms") {
                    None | Some(Value::Null) => max,
                    Some(v) => match v.as_u64() {
                        Some(ms) => Duration::from_millis(ms).min(max),
                        None => {
                            return Err(format!(
                                "yield_time_ms must be a non-negative integer, got {v}"
                            ))
                        }
                    },
                };
                self.sandbox
                    .feed_chars(&shell, chars, yield_time)
                    .await
                    .map(|out| out.render())
                    .map_err(|e| e.to_string())
            }
            other => Err(format!(
                "unknown tool {other:?}: the tools are feed_chars and create_new_shell"
            )),
        }
    }
}

fn timeout_detail(timeout: Duration) -> String {
    format!("the run reached its time limit of {}s", timeout.as_secs())
}

fn shorten(s: &str) -> String {
    if s.chars().count() <= 200 {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(200).collect::<String>())
    }
}

/// `feed_chars(default): cargo test` — for progress lines.
fn describe_call(name: &str, input: &Value) -> String {
    let shell = input["shell_name"].as_str().unwrap_or(DEFAULT_SHELL);
    match input["chars"].as_str() {
        Some(chars) => {
            let first = chars.lines().next().unwrap_or("");
            format!(
                "{name}({shell}): {}",
                shorten(first).chars().take(60).collect::<String>()
            )
        }
        None => format!("{name}({shell})"),
    }
}

/// Replaces the oldest tool results with a short note until the request's upper bound of
/// prompt tokens fits `limit`. The newest exchange is never elided.
fn elide_old_results(request: &mut Request, limit: u64) {
    let last = request.messages.len().saturating_sub(2);
    for i in 0..last {
        if request_token_upper_bound(request) <= limit {
            return;
        }
        for block in &mut request.messages[i].content {
            if let Block::ToolResult { content, .. } = block {
                if content.len() > 200 && !content.starts_with("[elided") {
                    *content = format!(
                        "[elided: {} bytes of old output, to keep the conversation within the context window]",
                        content.len()
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn two_tools_with_object_schemas() {
        let t = tools(Duration::from_secs(30));
        let names: Vec<&str> = t.iter().map(|t| t.name.as_str()).collect();
        assert_eq!(names, ["feed_chars", "create_new_shell"]);
        for tool in &t {
            assert_eq!(tool.input_schema["type"], "object");
        }
        assert_eq!(t[0].input_schema["required"], json!(["chars"]));
        assert!(t[0].description.contains("30000 ms"));
    }

    #[test]
    fn stop_reasons_spell_as_in_the_spec() {
        let all = [
            (StopReason::EndTurn, "end_turn"),
            (StopReason::CostLimitExceeded, "cost_limit_exceeded"),
            (StopReason::MaxIterations, "max_iterations"),
            (StopReason::Timeout, "timeout"),
            (StopReason::ToolError, "tool_error"),
            (StopReason::SetupFailed, "setup_failed"),
            (StopReason::Cancelled, "cancelled"),
            (StopReason::Error, "error"),
        ];
        for (r, s) in all {
            assert_eq!(r.as_str(), s);
            assert_eq!(serde_json::to_value(r).unwrap(), json!(s));
        }
    }

    #[test]
    fn old_bulky_results_are_elided_first() {
        let big = "x".repeat(50_000);
        let mut messages = vec![Message::user_text("go")];
        for i in 0..4 {
            messages.push(Message {
                role: Role::Assistant,
                content: vec![Block::ToolUse {
                    id: format!("t{i}"),
                    name: "feed_chars".into(),
                    input: json!({"chars": "cat big"}),
                }],
            });
            messages.push(Message {
                role: Role::User,
                content: vec![Block::ToolResult {
                    tool_use_id: format!("t{i}"),
                    content: big.clone(),
                    is_error: false,
                }],
            });
        }
        let mut req = Request {
            model: "m".into(),
            system: String::new(),
            messages,
            tools: vec![],
            max_tokens: 100,
            temperature: None,
        };
        elide_old_results(&mut req, 120_000);
        assert!(request_token_upper_bound(&req) <= 120_000);
        let Block::ToolResult { content, .. } = &req.messages[2].content[0] else {
            panic!()
        };
        assert!(content.starts_with("[elided: 50000 bytes"), "{content}");
        let Block::ToolResult { content, .. } = &req.messages[8].content[0] else {
            panic!()
        };
        assert_eq!(content.len(), 50_000, "the newest result is kept");
    }

    #[test]
    fn calls_are_described_briefly() {
        assert_eq!(
            describe_call("feed_chars", &json!({"chars": "cargo test\nmore"})),
            "feed_chars(default): cargo test"
        );
        assert_eq!(
            describe_call("create_new_shell", &json!({"shell_name": "srv"})),
            "create_new_shell(srv)"
        );
    }
}
