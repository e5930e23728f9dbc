//! The agent loop (SPEC §6–7): offers the model exactly the two shell tools, runs its tool
//! calls in the sandbox, feeds the results back, and stops at the first limit: cost cap
//! (planned before every call, never crossed), `max_iterations`, wall-clock timeout,
//! repeated tool failures, cancellation. Every request, response, tool call and result is
//! handed to the caller as a transcript record ([`crate::transcript`]: each message once).

use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::checks::verify::Verifier;
use crate::checks::{CheckResult, CheckSpec};
use crate::cost::Price;
use crate::model::{Provider, Usage};
use crate::sandbox::Sandbox;

mod context;
mod run_loop;
mod steering;
mod tools;

pub use crate::transcript::{resumed_conversation, Record, RESUMED_NOTE};
pub use steering::{steer_message, Steer, Steering};
pub use tools::tools;

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
    /// The repository's checks, run by the loop when the model ends its turn.
    pub checks: Vec<CheckSpec>,
    /// How many times the model is given failing checks to repair.
    pub check_repair: u32,
    /// The files the checks depend on, besides `.github/` and those their commands name.
    pub checks_guard: crate::checks::guard::Guard,
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
            checks: Vec::new(),
            check_repair: crate::checks::DEFAULT_CHECK_REPAIR,
            checks_guard: Default::default(),
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
    /// Every check of every attempt, in order ([`crate::checks::latest`] is what was
    /// delivered).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<CheckResult>,
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

/// One run of the agent loop.
pub struct Agent<'a> {
    pub provider: &'a dyn Provider,
    pub sandbox: &'a dyn Sandbox,
    /// Where the repository's checks run, apart from `sandbox` (SPEC §12). Without one, a
    /// run with checks reports them not run: they never run in the agent's sandbox.
    pub verifier: Option<&'a dyn Verifier>,
    pub config: AgentConfig,
    pub cancel: CancellationToken,
    /// Where words given to the run while it works come from (SPEC §12, "Steering and
    /// pictures"), taken before each model request.
    pub steering: Option<&'a dyn Steering>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

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
}
