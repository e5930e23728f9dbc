//! The loop itself: each step checks the limits, plans a request within the budget, calls
//! the model, runs the tool calls it asked for and feeds the results back, until a limit
//! or the model's end of turn stops the run.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use serde_json::Value;

use super::context::{
    elide_old_results, Counts, LAST_CALL_NOTE, MIN_SUMMARY_TOKENS, MIN_USEFUL_TOKENS,
};
use super::steering::{add_to_conversation, steer_message};
use super::tools::{describe_call, tools};
use super::{Agent, AgentConfig, Outcome, Progress, StopReason};
use crate::checks::CheckResult;
use crate::cost::{Budget, PromptLedger};
use crate::model::{Block, Message, ModelStop, Request, Response, Role, ToolSpec, Usage};
use crate::transcript::{append_note, Record, Recorder};

/// Why the loop stopped, and the detail for the outcome.
struct Ended(StopReason, Option<String>);

/// What a step says: go on with the next one, or stop the run.
type Step<T = ()> = ControlFlow<Ended, T>;

/// A tool call the model asked for: its id, the tool's name and the arguments.
type Call = (String, String, Value);

/// What one run keeps from step to step.
struct RunState<'c> {
    cfg: &'c AgentConfig,
    started: Instant,
    deadline: tokio::time::Instant,
    budget: Budget,
    usage: Usage,
    api_calls: u32,
    last_message: String,
    /// Tool calls in a row that failed.
    failures: u32,
    messages: Vec<Message>,
    tool_specs: Vec<ToolSpec>,
    /// Each record holds what is new since the one before (see `crate::transcript`).
    recorder: Recorder,
    ledger: PromptLedger,
    counts: Counts,
    wrap_up_noted: bool,
    /// The planned worst case of the previous call: when what is left is not twice that,
    /// the next calls are the last ones.
    last_worst: f64,
    /// Set for a call made because a limit is near its end (no tools, for the summary):
    /// the run ends after it, for that limit.
    forced_by: Option<Ended>,
    /// Every check result so far, and how many attempts and repair passes there were.
    checks: Vec<CheckResult>,
    attempts: u32,
    repairs: u32,
    /// Tools ran since the last checks (their results may be stale).
    acted_since_check: bool,
}

impl<'c> RunState<'c> {
    fn new(cfg: &'c AgentConfig, messages: Vec<Message>) -> Self {
        RunState {
            cfg,
            started: Instant::now(),
            deadline: tokio::time::Instant::now() + cfg.timeout,
            budget: Budget::new(cfg.cost_limit, cfg.price),
            usage: Usage::default(),
            api_calls: 0,
            last_message: String::new(),
            failures: 0,
            messages,
            tool_specs: tools(cfg.command_timeout),
            recorder: Recorder::default(),
            ledger: PromptLedger::default(),
            counts: Counts::default(),
            wrap_up_noted: false,
            last_worst: 0.0,
            forced_by: None,
            checks: Vec::new(),
            attempts: 0,
            repairs: 0,
            acted_since_check: false,
        }
    }

    fn progress(&self, step: u32, action: String) -> Progress {
        Progress {
            step,
            action,
            spent: self.budget.spent(),
            limit: self.budget.limit(),
            elapsed: self.started.elapsed(),
        }
    }

    fn timed_out(&self) -> Ended {
        Ended(StopReason::Timeout, Some(timeout_detail(self.cfg.timeout)))
    }

    /// The request of the next step: the conversation (told, once, that a limit is near),
    /// without tools and asking for the summary when it is the last call the step limit
    /// allows, with the oldest tool results elided to fit the context window.
    fn next_request(&mut self) -> (Request, bool) {
        let cfg = self.cfg;
        // Close to a limit: say so once, in the newest tool result, so the model wraps
        // up (finishes, leaves the tree working, summarises) before it is cut off.
        if !self.wrap_up_noted {
            let near = near_limit(
                cfg,
                &self.budget,
                self.last_worst,
                self.api_calls,
                self.deadline,
            );
            if let Some(why) = near {
                self.wrap_up_noted = append_note(&mut self.messages, &wrap_up_note(&why));
            }
        }
        // The last call the step limit allows gets no tools: the run ends with a
        // summary, not in the middle of an action.
        let last_step = self.api_calls + 1 >= cfg.max_iterations;
        let mut request = Request {
            model: cfg.model.clone(),
            system: cfg.system_prompt.clone(),
            messages: self.messages.clone(),
            tools: self.tool_specs.clone(),
            max_tokens: cfg.max_tokens,
            temperature: cfg.temperature,
            answer_only: false,
        };
        if last_step {
            request.answer_only = true;
            append_note(&mut request.messages, LAST_CALL_NOTE);
        }
        elide_old_results(&mut request, cfg.context_tokens, &self.ledger);
        (request, last_step)
    }

    /// Takes in the model's answer: usage, cost, its record and its text. Returns the tool
    /// calls it asks for.
    fn take_response(
        &mut self,
        step: u32,
        request: &Request,
        response: &Response,
        transcript: &mut impl FnMut(&Record),
    ) -> Vec<Call> {
        self.api_calls += 1;
        self.usage.add(&response.usage);
        self.counts.check(&response.usage);
        self.ledger.record(request, &response.usage);
        let cost = self.budget.record(&response.usage);
        transcript(&self.recorder.note(Record::ModelResponse {
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
            self.last_message = text;
        }
        response
            .content
            .iter()
            .filter_map(|b| match b {
                Block::ToolUse { id, name, input } => {
                    Some((id.clone(), name.clone(), input.clone()))
                }
                _ => None,
            })
            .collect()
    }

    /// The outcome of the run, also told to the transcript as its last record.
    fn finish(self, ended: Ended, transcript: &mut impl FnMut(&Record)) -> Outcome {
        let outcome = Outcome {
            stop_reason: ended.0,
            last_message: self.last_message,
            api_calls: self.api_calls,
            usage: self.usage,
            usd_cost: self.budget.spent(),
            cost_limit: self.budget.limit(),
            duration: self.started.elapsed(),
            model: self.cfg.model.clone(),
            detail: ended.1,
            checks: self.checks,
        };
        transcript(&Record::Stop {
            outcome: serde_json::to_value(&outcome).unwrap_or(Value::Null),
        });
        outcome
    }
}

impl Agent<'_> {
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
    /// conversation made ready by [`super::resumed_conversation`].
    pub async fn resume(
        &self,
        messages: Vec<Message>,
        mut progress: impl FnMut(&Progress),
        mut transcript: impl FnMut(&Record),
    ) -> Outcome {
        let mut run = RunState::new(&self.config, messages);
        // A new conversation is told the checks that will judge it.
        if !self.config.checks.is_empty() && run.messages.len() == 1 {
            run.messages[0].content.push(Block::Text {
                text: crate::checks::told(&self.config.checks),
            });
        }
        let ended = loop {
            if let ControlFlow::Break(ended) =
                self.step(&mut run, &mut progress, &mut transcript).await
            {
                match self
                    .after_end(&mut run, ended, &mut progress, &mut transcript)
                    .await
                {
                    ControlFlow::Break(ended) => break ended,
                    ControlFlow::Continue(()) => {}
                }
            }
        };
        run.finish(ended, &mut transcript)
    }

    /// What follows the loop's end when the repository has checks (SPEC §11): after the
    /// model ends its turn, kodx runs them; red ones go back to the model while repair
    /// passes, time and (through the usual planning) budget remain. A run a cost or step
    /// limit stopped gets its checks run once more, for the record, without a repair.
    async fn after_end(
        &self,
        run: &mut RunState<'_>,
        ended: Ended,
        progress: &mut impl FnMut(&Progress),
        transcript: &mut impl FnMut(&Record),
    ) -> Step {
        let cfg = run.cfg;
        if cfg.checks.is_empty() || self.cancel.is_cancelled() {
            return ControlFlow::Break(ended);
        }
        let final_only = match ended.0 {
            StopReason::EndTurn => false,
            StopReason::CostLimitExceeded | StopReason::MaxIterations => true,
            _ => return ControlFlow::Break(ended),
        };
        if final_only && run.attempts > 0 && !run.acted_since_check {
            return ControlFlow::Break(ended);
        }
        run.attempts += 1;
        let (attempt, step) = (run.attempts, run.api_calls);
        progress(&run.progress(step, format!("running the checks (attempt {attempt})")));
        let deadline = run.deadline.into_std();
        let results = {
            let run = &*run;
            let mut each = |r: &CheckResult| {
                progress(&run.progress(step, format!("check {}: {}", r.name, r.verdict())));
            };
            tokio::select! {
                r = crate::checks::verify::run_apart(
                    self.verifier,
                    self.sandbox,
                    &cfg.checks,
                    &cfg.checks_guard,
                    attempt,
                    deadline,
                    &mut each,
                ) => r,
                _ = self.cancel.cancelled() => return ControlFlow::Break(Ended(StopReason::Cancelled, None)),
            }
        };
        for r in &results {
            transcript(&Record::Check {
                step,
                result: r.clone(),
            });
        }
        run.acted_since_check = false;
        let red = results.iter().any(|r| !r.passed);
        let repair = red
            && !final_only
            && run.repairs < cfg.check_repair
            && tokio::time::Instant::now() < run.deadline;
        let report = repair
            .then(|| crate::checks::failure_report(&results, cfg.check_repair - run.repairs - 1));
        run.checks.extend(results);
        let Some(report) = report else {
            return ControlFlow::Break(ended);
        };
        run.repairs += 1;
        if let Some(v) = self.verifier {
            v.another();
        }
        match run.messages.last_mut() {
            Some(last) if last.role == Role::User => {
                last.content.push(Block::Text { text: report })
            }
            _ => run.messages.push(Message::user_text(&report)),
        }
        ControlFlow::Continue(())
    }

    /// One step: a model call and the tool calls it asks for.
    async fn step(
        &self,
        run: &mut RunState<'_>,
        progress: &mut impl FnMut(&Progress),
        transcript: &mut impl FnMut(&Record),
    ) -> Step {
        self.check_limits(run)?;
        self.take_steers(run, transcript).await;
        let (mut request, last_step) = run.next_request();
        self.plan_within_budget(run, &mut request).await?;
        if last_step && run.forced_by.is_none() {
            run.forced_by = Some(Ended(
                StopReason::MaxIterations,
                Some(format!(
                    "the run made its {} model calls (max_iterations); the last one asked for a summary",
                    run.cfg.max_iterations
                )),
            ));
        }
        // What was elided stays elided: later requests keep the same prefix (cache).
        run.messages.clone_from(&request.messages);
        let step = run.api_calls + 1;
        progress(&run.progress(step, "thinking".into()));
        transcript(&run.recorder.request(step, &request));
        let response = self.call_model(run, &request).await?;
        let calls = run.take_response(step, &request, &response, transcript);
        if let Some(ended) = run.forced_by.take() {
            // The summary call: whatever it answered, the limit ends the run here.
            return ControlFlow::Break(ended);
        }
        if response.content.is_empty() {
            // An empty turn: nothing to send back as the assistant's message.
            if response.stop == ModelStop::EndTurn {
                return ControlFlow::Break(Ended(StopReason::EndTurn, None));
            }
        } else {
            run.messages.push(Message {
                role: Role::Assistant,
                content: response.content.clone(),
            });
        }
        if calls.is_empty() {
            if response.stop == ModelStop::MaxTokens {
                run.messages.push(Message::user_text(
                    "Your reply was cut off at the output limit. Continue where you stopped, briefly.",
                ));
                return ControlFlow::Continue(());
            }
            return ControlFlow::Break(Ended(StopReason::EndTurn, None));
        }
        run.acted_since_check = true;
        if let Some(v) = self.verifier {
            v.work_changed();
        }
        let results = self
            .run_tools(run, step, calls, progress, transcript)
            .await?;
        run.messages.push(Message {
            role: Role::User,
            content: results,
        });
        if run.failures >= run.cfg.max_tool_failures {
            return ControlFlow::Break(Ended(
                StopReason::ToolError,
                Some(format!("{} tool calls in a row failed", run.failures)),
            ));
        }
        ControlFlow::Continue(())
    }

    /// The steers given since the last step, added to the conversation before the next
    /// request (each told to the transcript).
    async fn take_steers(&self, run: &mut RunState<'_>, transcript: &mut impl FnMut(&Record)) {
        let Some(steering) = self.steering else {
            return;
        };
        let steers = tokio::select! {
            s = steering.take() => s,
            _ = self.cancel.cancelled() => return,
        };
        let step = run.api_calls + 1;
        for steer in steers {
            let message = steer_message(&steer);
            add_to_conversation(&mut run.messages, message.clone());
            transcript(&run.recorder.note(Record::Steer {
                step,
                author: steer.author,
                words: steer.words,
                message,
            }));
        }
    }

    /// Stops the run before its next call when it was cancelled, the sandbox halted, the
    /// time is up or the step limit is reached.
    fn check_limits(&self, run: &RunState<'_>) -> Step {
        if self.cancel.is_cancelled() {
            return ControlFlow::Break(Ended(StopReason::Cancelled, None));
        }
        if let Some(why) = self.sandbox.halted().now_or_never() {
            return ControlFlow::Break(Ended(StopReason::Error, Some(why)));
        }
        if tokio::time::Instant::now() >= run.deadline {
            return ControlFlow::Break(run.timed_out());
        }
        if run.api_calls >= run.cfg.max_iterations {
            return ControlFlow::Break(Ended(
                StopReason::MaxIterations,
                Some(format!(
                    "the run made its {} model calls (max_iterations)",
                    run.cfg.max_iterations
                )),
            ));
        }
        ControlFlow::Continue(())
    }

    /// Within the budget: shortens what `request` sends (oldest tool results first) until
    /// the call's worst case fits, and sets its `max_tokens`. When even the shortest
    /// request does not fit with a useful output, one last call without tools may still
    /// fit with a shorter one, for the summary; else the run stops here.
    async fn plan_within_budget(&self, run: &mut RunState<'_>, request: &mut Request) -> Step {
        let cfg = run.cfg;
        let min_useful = cfg.max_tokens.min(MIN_USEFUL_TOKENS);
        let min_summary = cfg.max_tokens.min(MIN_SUMMARY_TOKENS);
        // A call with tools leaves room for a last call asking for the summary, always: the
        // run never ends right after a tool call while the limit could pay for a summary.
        // A call asking only for the summary writes nothing to the cache past the tools and
        // system prompt: its messages are planned at most at the input price.
        let frame = crate::cost::frame_token_upper_bound(request);
        let summary_budget = run.budget.answer_only(frame);
        let keeping = |prompt: u64| run.budget.keeping_summary(prompt, frame, min_summary);
        let (mut planning, mut reserved_for) = (summary_budget.clone(), u64::MAX);
        if !request.answer_only {
            reserved_for = self
                .summary_prompt(request, &run.ledger, &run.counts, false)
                .await;
            planning = keeping(reserved_for);
        }
        let mut planned = self
            .plan(request, &planning, &run.ledger, &mut run.counts, min_useful)
            .await;
        // Too tight by the byte bound: the provider's count of the summary request, if lower.
        if planned.is_err() && !request.answer_only {
            let counted = self
                .summary_prompt(request, &run.ledger, &run.counts, true)
                .await;
            if counted < reserved_for {
                planning = keeping(counted);
                planned = self
                    .plan(request, &planning, &run.ledger, &mut run.counts, min_useful)
                    .await;
            }
        }
        // A cap that cannot hold the first call with tools beside the reserve makes it in
        // the whole budget: some work rather than a summary of none (docs/cost.md).
        if planned.is_err() && !request.answer_only && run.api_calls == 0 {
            let whole = self
                .plan(
                    request,
                    &run.budget,
                    &run.ledger,
                    &mut run.counts,
                    min_useful,
                )
                .await;
            if whole.is_ok() {
                planned = whole;
            }
        }
        let planned = match planned {
            Ok(n) => Ok(n),
            Err(mut reached) if !request.answer_only => {
                // Said against the whole limit: the call with the summary kept after it.
                reached.needed += run.budget.limit() - planning.limit();
                reached.limit = run.budget.limit();
                let mut last = request.clone();
                last.answer_only = true;
                append_note(&mut last.messages, LAST_CALL_NOTE);
                match self
                    .plan(
                        &mut last,
                        &summary_budget,
                        &run.ledger,
                        &mut run.counts,
                        min_summary,
                    )
                    .await
                {
                    Ok(n) => {
                        *request = last;
                        run.forced_by = Some(Ended(
                            StopReason::CostLimitExceeded,
                            Some(format!("{reached}; the last call asked for a summary")),
                        ));
                        Ok(n)
                    }
                    // Told against the whole limit and the smallest call, the summary.
                    Err(summary) => Err(summary),
                }
            }
            Err(reached) => Err(reached),
        };
        match planned {
            Ok((max_tokens, upper)) => {
                request.max_tokens = max_tokens;
                run.last_worst = run.budget.worst_case(upper, max_tokens);
                ControlFlow::Continue(())
            }
            Err(reached) => ControlFlow::Break(Ended(
                StopReason::CostLimitExceeded,
                Some(reached.to_string()),
            )),
        }
    }

    /// Sends `request`, unless the run is cancelled, the sandbox halts or the time runs
    /// out first.
    async fn call_model(&self, run: &RunState<'_>, request: &Request) -> Step<Response> {
        let response = tokio::select! {
            r = self.provider.complete(request) => r,
            _ = self.cancel.cancelled() => return ControlFlow::Break(Ended(StopReason::Cancelled, None)),
            why = self.sandbox.halted() => return ControlFlow::Break(Ended(StopReason::Error, Some(why))),
            _ = tokio::time::sleep_until(run.deadline) => return ControlFlow::Break(run.timed_out()),
        };
        match response {
            Ok(r) => ControlFlow::Continue(r),
            Err(e) => ControlFlow::Break(Ended(
                StopReason::Error,
                Some(format!("the model call failed: {e}")),
            )),
        }
    }

    /// Runs the tool calls of one step in order, recording each call and result. Returns
    /// the results, for the next (user) message.
    async fn run_tools(
        &self,
        run: &mut RunState<'_>,
        step: u32,
        calls: Vec<Call>,
        progress: &mut impl FnMut(&Progress),
        transcript: &mut impl FnMut(&Record),
    ) -> Step<Vec<Block>> {
        let mut results = Vec::new();
        for (id, name, input) in calls {
            transcript(&run.recorder.note(Record::ToolCall {
                step,
                id: id.clone(),
                name: name.clone(),
            }));
            progress(&run.progress(step, describe_call(&name, &input)));
            let outcome = tokio::select! {
                r = self.call_tool(&name, &input) => r,
                _ = self.cancel.cancelled() => return ControlFlow::Break(Ended(StopReason::Cancelled, None)),
                why = self.sandbox.halted() => return ControlFlow::Break(Ended(StopReason::Error, Some(why))),
                _ = tokio::time::sleep_until(run.deadline) => return ControlFlow::Break(run.timed_out()),
            };
            let (output, is_error) = match outcome {
                Ok(out) => {
                    run.failures = 0;
                    (out, false)
                }
                Err(e) => {
                    run.failures += 1;
                    (e, true)
                }
            };
            transcript(&run.recorder.note(Record::ToolResult {
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
        ControlFlow::Continue(results)
    }
}

fn timeout_detail(timeout: Duration) -> String {
    format!("the run reached its time limit of {}s", timeout.as_secs())
}

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
