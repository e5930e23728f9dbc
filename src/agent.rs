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

use crate::cost::{token_upper_bound, Budget, Price, PromptLedger};
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

/// Told to a resumed run (`kodx run --resume`) before it goes on.
pub const RESUMED_NOTE: &str = "[kodx: this run was resumed in a new environment: the files are \
as the earlier run left them, but its shells, running processes and anything installed outside \
the repository are gone (the setup script ran again). Continue the task.]";

/// The conversation of an earlier run, ready to go on: tool calls it made but never got
/// results for are answered as interrupted, and `note` (with what the user adds) is told
/// in the newest user message.
pub fn resumed_conversation(mut messages: Vec<Message>, note: &str) -> Vec<Message> {
    // Results already given, by the tool call they answer.
    let answered: std::collections::HashSet<String> = messages
        .iter()
        .flat_map(|m| &m.content)
        .filter_map(|b| match b {
            Block::ToolResult { tool_use_id, .. } => Some(tool_use_id.clone()),
            _ => None,
        })
        .collect();
    let pending: Vec<Block> = messages
        .iter()
        .rev()
        .find(|m| m.role == Role::Assistant)
        .into_iter()
        .flat_map(|m| &m.content)
        .filter_map(|b| match b {
            Block::ToolUse { id, .. } if !answered.contains(id) => Some(Block::ToolResult {
                tool_use_id: id.clone(),
                content: "[the run stopped before this call returned]".into(),
                is_error: true,
            }),
            _ => None,
        })
        .collect();
    if !pending.is_empty() {
        match messages.last_mut() {
            Some(last) if last.role == Role::User => last.content.extend(pending),
            _ => messages.push(Message {
                role: Role::User,
                content: pending,
            }),
        }
    }
    if !append_note(&mut messages, note) {
        messages.push(Message::user_text(note));
    }
    messages
}

impl Agent<'_> {
    /// Plans `request` within `budget` ([`fit_to_budget`]). When the byte bound would
    /// shorten the request or lower its `max_tokens`, the provider is asked for the exact
    /// count first; if the whole request fits with that, it is sent whole. Returns the
    /// `max_tokens` to send and the prompt bound it was planned with.
    async fn plan(
        &self,
        request: &mut Request,
        budget: &Budget,
        ledger: &PromptLedger,
        counts: &mut Counts,
        min_useful: u32,
    ) -> Result<(u32, u64), crate::cost::CostLimitReached> {
        counts.sent = None;
        let mut by_bytes = request.clone();
        let planned = fit_to_budget(&mut by_bytes, budget, ledger, min_useful);
        let whole = matches!(planned, Ok(p) if !p.shortened && p.max_tokens == request.max_tokens);
        if !whole && !counts.distrusted {
            let count = tokio::select! {
                c = self.provider.count_tokens(request) => c,
                _ = self.cancel.cancelled() => None,
            };
            if let Some(count) = count {
                let bound = Counts::bound(count).min(ledger.upper_bound(request));
                if let Ok(n) = budget.plan_call(bound, request.max_tokens, min_useful) {
                    let better = match planned {
                        Ok(p) => p.shortened || n > p.max_tokens,
                        Err(_) => true,
                    };
                    if better {
                        counts.sent = Some(bound);
                        return Ok((n, bound));
                    }
                }
            }
        }
        *request = by_bytes;
        planned.map(|p| (p.max_tokens, p.upper))
    }

    pub async fn run(
        &self,
        prompt: &str,
        progress: impl FnMut(&Progress),
        transcript: impl FnMut(&Record),
    ) -> Outcome {
        self.resume(vec![Message::user_text(prompt)], progress, transcript)
            .await
    }

    /// Runs the loop from `messages` (ending with the user's turn), e.g. an earlier run's
    /// conversation made ready by [`resumed_conversation`].
    pub async fn resume(
        &self,
        messages: Vec<Message>,
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
        let mut messages = messages;
        let tool_specs = tools(cfg.command_timeout);
        // Each record holds what is new since the one before (see `crate::transcript`).
        let mut recorder = Recorder::default();
        let mut ledger = PromptLedger::default();
        let mut counts = Counts::default();
        let mut wrap_up_noted = false;
        // The planned worst case of the previous call: when what is left is not twice
        // that, the next calls are the last ones.
        let mut last_worst = 0.0;
        // Set for a call made because a limit is near its end (no tools, for the
        // summary): the run ends after it, for that limit.
        let mut forced_by: Option<Ended> = None;

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
            // Close to a limit: say so once, in the newest tool result, so the model wraps
            // up (finishes, leaves the tree working, summarises) before it is cut off.
            if !wrap_up_noted {
                if let Some(why) = near_limit(cfg, &budget, last_worst, api_calls, deadline) {
                    wrap_up_noted = append_note(&mut messages, &wrap_up_note(&why));
                }
            }
            // The last call the step limit allows gets no tools: the run ends with a
            // summary, not in the middle of an action.
            let last_step = api_calls + 1 >= cfg.max_iterations;
            let mut request = Request {
                model: cfg.model.clone(),
                system: cfg.system_prompt.clone(),
                messages: messages.clone(),
                tools: tool_specs.clone(),
                max_tokens: cfg.max_tokens,
                temperature: cfg.temperature,
                answer_only: false,
            };
            if last_step {
                request.answer_only = true;
                append_note(&mut request.messages, LAST_CALL_NOTE);
            }
            elide_old_results(&mut request, cfg.context_tokens, &ledger);
            // Within the budget: shorten what is sent (oldest tool results first) until
            // the call's worst case fits; when even the shortest request does not fit
            // with a useful output, one last call without tools may still fit with a
            // shorter one, for the summary; else the run stops here.
            let min_useful = cfg.max_tokens.min(MIN_USEFUL_TOKENS);
            let reserve = if request.answer_only {
                0.0
            } else {
                summary_reserve(&request, &budget, &ledger, cfg.max_tokens)
            };
            let planned = self
                .plan(
                    &mut request,
                    &budget.reserving(reserve),
                    &ledger,
                    &mut counts,
                    min_useful,
                )
                .await;
            let planned = match planned {
                Ok(n) => Ok(n),
                Err(reached) if !request.answer_only => {
                    let mut last = request.clone();
                    last.answer_only = true;
                    append_note(&mut last.messages, LAST_CALL_NOTE);
                    let min_summary = cfg.max_tokens.min(MIN_SUMMARY_TOKENS);
                    match self
                        .plan(&mut last, &budget, &ledger, &mut counts, min_summary)
                        .await
                    {
                        Ok(n) => {
                            request = last;
                            forced_by = Some(Ended(
                                StopReason::CostLimitExceeded,
                                Some(format!("{reached}; the last call asked for a summary")),
                            ));
                            Ok(n)
                        }
                        Err(_) => Err(reached),
                    }
                }
                Err(reached) => Err(reached),
            };
            match planned {
                Ok((max_tokens, upper)) => {
                    request.max_tokens = max_tokens;
                    last_worst = budget.worst_case(upper, max_tokens);
                }
                Err(reached) => {
                    break Ended(StopReason::CostLimitExceeded, Some(reached.to_string()))
                }
            }
            if last_step && forced_by.is_none() {
                forced_by = Some(Ended(
                    StopReason::MaxIterations,
                    Some(format!(
                        "the run made its {} model calls (max_iterations); the last one asked for a summary",
                        cfg.max_iterations
                    )),
                ));
            }
            // What was elided stays elided: later requests keep the same prefix (cache).
            messages.clone_from(&request.messages);
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
            counts.check(&response.usage);
            ledger.record(&request, &response.usage);
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
            if let Some(ended) = forced_by.take() {
                // The summary call: whatever it answered, the limit ends the run here.
                break ended;
            }
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

/// The smallest output worth a call (a tool call or a short answer fits); below it the
/// budget is spent.
const MIN_USEFUL_TOKENS: u32 = 512;

/// The smallest output worth a last call that asks only for the summary.
const MIN_SUMMARY_TOKENS: u32 = 256;

/// The least kept of the newest tool output when it is cut to fit the budget.
const MIN_NEWEST_OUTPUT: usize = 1024;

/// Plans `request` within the budget, shortening what it sends until its worst case fits
/// with at least `min_useful` output tokens: first the oldest tool results are elided, then
/// the newest tool output is cut in the middle (down to [`MIN_NEWEST_OUTPUT`] bytes).
/// Returns the `max_tokens` to send, or why not even the shortest request fits.
fn fit_to_budget(
    request: &mut Request,
    budget: &Budget,
    ledger: &PromptLedger,
    min_useful: u32,
) -> Result<Planned, crate::cost::CostLimitReached> {
    let mut shortened = false;
    loop {
        let upper = ledger.upper_bound(request);
        match budget.plan_call(upper, request.max_tokens, min_useful) {
            Ok(max_tokens) => {
                return Ok(Planned {
                    max_tokens,
                    upper,
                    shortened,
                })
            }
            Err(reached) => {
                shortened = true;
                if elide_oldest_result(request) {
                    continue;
                }
                // Prompt tokens the budget allows with the smallest useful output.
                let price = budget.price();
                let room = budget.remaining() - budget.worst_case(0, min_useful);
                let allowed = if price.prompt_worst() > 0.0 && room > 0.0 {
                    (room * 1e6 / price.prompt_worst()).floor() as u64
                } else {
                    0
                };
                let over = upper.saturating_sub(allowed) + 64;
                if !cut_newest_output(request, over) {
                    return Err(reached);
                }
            }
        }
    }
}

/// A call planned by [`fit_to_budget`].
#[derive(Debug, Clone, Copy)]
struct Planned {
    max_tokens: u32,
    /// The bound of the prompt tokens it sends.
    upper: u64,
    /// Whether the request was shortened (results elided or cut) to fit.
    shortened: bool,
}

/// The provider's own token counts ([`Provider::count_tokens`]), asked for only when the
/// byte bound would shorten a call or its answer. A count is used with a margin
/// ([`Counts::bound`]); after each call the billed prompt is compared with it, and one
/// billed above its counted bound turns counting off for the rest of the run, so a
/// provider whose counts run low cannot wear the cap down call after call.
#[derive(Debug, Default)]
struct Counts {
    /// Counting was turned off: a call billed more than its counted bound.
    distrusted: bool,
    /// The counted bound of the request about to be sent, if it was planned with one.
    sent: Option<u64>,
}

impl Counts {
    /// The bound a provider's count stands for: the count plus 5 % and 64 tokens (Anthropic
    /// calls its count an estimate that may differ from the billed prompt "by a small
    /// amount"; it includes system tokens that are not billed).
    fn bound(count: u64) -> u64 {
        count + count / 20 + 64
    }

    /// After a call: whether its billed prompt stayed within the counted bound it was
    /// planned with.
    fn check(&mut self, usage: &Usage) {
        if let Some(bound) = self.sent.take() {
            let billed = usage.prompt_tokens();
            if billed > bound {
                tracing::warn!(
                    billed,
                    bound,
                    "a call billed more prompt tokens than its counted bound; kodx plans with byte bounds for the rest of the run"
                );
                self.distrusted = true;
            }
        }
    }
}

/// What to keep aside for a last call asking for the summary: the worst case of the
/// shortest such request after this one (old results elided, the newest output cut, room
/// for this call's answer), at [`MIN_SUMMARY_TOKENS`]. Kept only while it is at most 10 %
/// of the limit: with a smaller budget the summary is made when it happens to fit, so
/// most of the budget still goes to the work.
fn summary_reserve(
    request: &Request,
    budget: &Budget,
    ledger: &PromptLedger,
    max_tokens: u32,
) -> f64 {
    let mut shortest = request.clone();
    while elide_oldest_result(&mut shortest) {}
    cut_newest_output(&mut shortest, u64::MAX / 2);
    let next = ledger.upper_bound(&shortest)
        + 2 * MIN_NEWEST_OUTPUT as u64
        + crate::cost::REQUEST_OVERHEAD_TOKENS
        + token_upper_bound(LAST_CALL_NOTE);
    let reserve = budget.worst_case(next, max_tokens.min(MIN_SUMMARY_TOKENS));
    if reserve <= 0.1 * budget.limit() {
        reserve
    } else {
        0.0
    }
}

/// Cuts `bytes` (plus the note's own length) out of the middle of the newest tool result,
/// keeping at least [`MIN_NEWEST_OUTPUT`] bytes; false when it is already that short.
fn cut_newest_output(request: &mut Request, bytes: u64) -> bool {
    let Some(last) = request.messages.last_mut() else {
        return false;
    };
    if last.role != Role::User {
        return false;
    }
    let Some(content) = last.content.iter_mut().rev().find_map(|b| match b {
        Block::ToolResult { content, .. } => Some(content),
        _ => None,
    }) else {
        return false;
    };
    const NOTE: usize = 80;
    if content.len() <= MIN_NEWEST_OUTPUT + NOTE {
        return false;
    }
    let keep = content
        .len()
        .saturating_sub(bytes as usize + NOTE)
        .max(MIN_NEWEST_OUTPUT);
    let mut head = keep / 2;
    while !content.is_char_boundary(head) {
        head -= 1;
    }
    let mut tail = content.len() - (keep - keep / 2);
    while !content.is_char_boundary(tail) {
        tail += 1;
    }
    *content = format!(
        "{}\n[... {} bytes cut to fit the remaining budget ...]\n{}",
        &content[..head],
        tail - head,
        &content[tail..]
    );
    true
}

/// Told with the last call, which has no tools.
const LAST_CALL_NOTE: &str = "[kodx: this is the run's last model call and tools are disabled. \
Reply now with a short summary: what you did, the state the files are in, and what is left to do.]";

/// Which limit is within 15 % of its end, in words for the model; None while all are far.
fn near_limit(
    cfg: &AgentConfig,
    budget: &Budget,
    last_worst: f64,
    api_calls: u32,
    deadline: tokio::time::Instant,
) -> Option<String> {
    const NEAR: f64 = 0.15;
    if budget.limit() > 0.0
        && (budget.remaining() < NEAR * budget.limit() || budget.remaining() < 2.0 * last_worst)
    {
        return Some(format!(
            "{} of the {} cost limit is left",
            crate::cost::format_usd(budget.remaining()),
            crate::cost::format_usd(budget.limit())
        ));
    }
    let steps_left = cfg.max_iterations.saturating_sub(api_calls);
    if cfg.max_iterations > 1
        && f64::from(steps_left) <= (NEAR * f64::from(cfg.max_iterations)).ceil()
    {
        return Some(format!(
            "{steps_left} of {} model calls are left",
            cfg.max_iterations
        ));
    }
    let left = deadline.saturating_duration_since(tokio::time::Instant::now());
    if left.as_secs_f64() < NEAR * cfg.timeout.as_secs_f64() {
        return Some(format!(
            "{}s of the {}s time limit are left",
            left.as_secs(),
            cfg.timeout.as_secs()
        ));
    }
    None
}

fn wrap_up_note(why: &str) -> String {
    format!(
        "[kodx: this run is close to its limit: {why}. Wrap up now: do not start new work, \
         leave the files in a working state, and end your turn with a short summary of what you \
         did and what is left.]"
    )
}

/// Appends `note` to the newest message when it is the user's (after its last tool result
/// or text); false when there is none to append to.
fn append_note(messages: &mut [Message], note: &str) -> bool {
    let Some(last) = messages.last_mut() else {
        return false;
    };
    if last.role != Role::User {
        return false;
    }
    match last.content.last_mut() {
        Some(Block::ToolResult { content, .. }) => {
            content.push_str("\n\n");
            content.push_str(note);
            true
        }
        Some(Block::Text { text }) => {
            text.push_str("\n\n");
            text.push_str(note);
            true
        }
        _ => false,
    }
}

/// Replaces the oldest tool results with a short note until the request's upper bound of
/// prompt tokens fits `limit`. The newest exchange is never elided.
fn elide_old_results(request: &mut Request, limit: u64, ledger: &PromptLedger) {
    while ledger.upper_bound(request) > limit {
        if !elide_oldest_result(request) {
            return;
        }
    }
}

/// Elides the oldest tool result still worth eliding (over 200 bytes), outside the newest
/// exchange; false when there is none.
fn elide_oldest_result(request: &mut Request) -> bool {
    let last = request.messages.len().saturating_sub(2);
    for message in &mut request.messages[..last] {
        for block in &mut message.content {
            if let Block::ToolResult { content, .. } = block {
                if content.len() > 200 && !content.starts_with("[elided") {
                    *content = format!(
                        "[elided: {} bytes of old output, to keep the conversation within the context window and budget]",
                        content.len()
                    );
                    return true;
                }
            }
        }
    }
    // Every old result is short: then the model's own old words (long commands it typed,
    // long text it wrote), oldest first. What it did stays readable in the results' order
    // and its tool calls keep their ids.
    for message in &mut request.messages[..last] {
        if message.role != Role::Assistant {
            continue;
        }
        for block in &mut message.content {
            match block {
                Block::Text { text } if text.len() > 200 && !text.starts_with("[elided") => {
                    *text = format!("[elided: {} bytes of old text]", text.len());
                    return true;
                }
                Block::ToolUse { input, .. } => {
                    if let Some(fields) = input.as_object_mut() {
                        for value in fields.values_mut() {
                            if let Value::String(v) = value {
                                if v.len() > 200 && !v.starts_with("[elided") {
                                    *v = format!("[elided: {} bytes of an old command]", v.len());
                                    return true;
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
        }
    }
    false
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

    /// A request of `messages` and nothing else.
    fn request_of(messages: Vec<Message>) -> Request {
        Request {
            model: "m".into(),
            system: String::new(),
            messages,
            tools: vec![],
            max_tokens: 100,
            temperature: None,
            answer_only: false,
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
        let mut req = request_of(messages);
        elide_old_results(&mut req, 120_000, &PromptLedger::default());
        assert!(crate::cost::request_token_upper_bound(&req) <= 120_000);
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
    fn then_the_models_old_long_commands_and_text_are_elided() {
        let long = "y".repeat(5_000);
        let mut messages = vec![Message::user_text("go")];
        for i in 0..3 {
            messages.push(Message {
                role: Role::Assistant,
                content: vec![
                    Block::Text { text: long.clone() },
                    Block::ToolUse {
                        id: format!("t{i}"),
                        name: "feed_chars".into(),
                        input: json!({"chars": long.clone(), "shell": "default"}),
                    },
                ],
            });
            messages.push(Message {
                role: Role::User,
                content: vec![Block::ToolResult {
                    tool_use_id: format!("t{i}"),
                    content: "ok".into(),
                    is_error: false,
                }],
            });
        }
        let mut req = request_of(messages);
        let mut n = 0;
        while elide_oldest_result(&mut req) {
            n += 1;
        }
        // Two old exchanges, a text and a command each; the newest exchange is kept.
        assert_eq!(n, 4);
        let Block::ToolUse { id, input, .. } = &req.messages[1].content[1] else {
            panic!()
        };
        assert_eq!(id, "t0");
        assert_eq!(input["chars"], "[elided: 5000 bytes of an old command]");
        assert_eq!(input["shell"], "default");
        let Block::Text { text } = &req.messages[3].content[0] else {
            panic!()
        };
        assert_eq!(text, "[elided: 5000 bytes of old text]");
        let Block::ToolUse { input, .. } = &req.messages[5].content[1] else {
            panic!()
        };
        assert_eq!(
            input["chars"].as_str().unwrap().len(),
            5_000,
            "the newest is kept"
        );
    }

    #[test]
    fn a_resumed_conversation_answers_interrupted_calls_and_ends_with_the_note() {
        let call = |id: &str| Block::ToolUse {
            id: id.into(),
            name: "feed_chars".into(),
            input: json!({"chars": "sleep 99"}),
        };
        let result = |id: &str| Block::ToolResult {
            tool_use_id: id.into(),
            content: "ok".into(),
            is_error: false,
        };
        // Two calls, one answered before the run stopped.
        let messages = vec![
            Message::user_text("go"),
            Message {
                role: Role::Assistant,
                content: vec![call("a"), call("b")],
            },
            Message {
                role: Role::User,
                content: vec![result("a")],
            },
        ];
        let m = resumed_conversation(messages, "NOTE");
        assert_eq!(m.len(), 3);
        let Block::ToolResult {
            tool_use_id,
            content,
            is_error,
        } = &m[2].content[1]
        else {
            panic!("{m:?}")
        };
        assert_eq!(tool_use_id, "b");
        assert!(content.starts_with("[the run stopped before this call returned]"));
        assert!(content.ends_with("NOTE") && *is_error);
        // A conversation that ended with the model's answer gets a new user turn.
        let m = resumed_conversation(
            vec![
                Message::user_text("go"),
                Message {
                    role: Role::Assistant,
                    content: vec![Block::Text {
                        text: "done".into(),
                    }],
                },
            ],
            "NOTE",
        );
        assert_eq!(m.last().unwrap().role, Role::User);
        assert_eq!(m.last().unwrap().text(), "NOTE");
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
