//! Fitting each request to the context window and to what is left of the budget: eliding
//! the oldest tool results, cutting the newest output, asking the provider for exact token
//! counts, and keeping aside what a last summary call needs.

use serde_json::Value;

use super::Agent;
use crate::cost::{token_upper_bound, Budget, PromptLedger};
use crate::model::{Block, Request, Role, Usage};

/// The smallest output worth a call (a tool call or a short answer fits); below it the
/// budget is spent.
pub(super) const MIN_USEFUL_TOKENS: u32 = 512;

/// The smallest output worth a last call that asks only for the summary.
pub(super) const MIN_SUMMARY_TOKENS: u32 = 256;

/// The least kept of the newest tool output when it is cut to fit the budget.
const MIN_NEWEST_OUTPUT: usize = 1024;

impl Agent<'_> {
    /// Plans `request` within `budget` ([`fit_to_budget`]). When the byte bound would
    /// shorten the request or lower its `max_tokens`, the provider is asked for the exact
    /// count first; if the whole request fits with that, it is sent whole. Returns the
    /// `max_tokens` to send and the prompt bound it was planned with.
    pub(super) async fn plan(
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
}

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

/// The provider's own token counts
/// ([`Provider::count_tokens`](crate::model::Provider::count_tokens)), asked for only when
/// the byte bound would shorten a call or its answer. A count is used with a margin
/// ([`Counts::bound`]); after each call the billed prompt is compared with it, and one
/// billed above its counted bound turns counting off for the rest of the run, so a
/// provider whose counts run low cannot wear the cap down call after call.
#[derive(Debug, Default)]
pub(super) struct Counts {
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
    pub(super) fn check(&mut self, usage: &Usage) {
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

impl Agent<'_> {
    /// The prompt tokens of the shortest request asking for the summary after `request`
    /// (old results elided, the newest output cut, room for the next tool result), apart
    /// from this call's own answer, which [`Budget::keeping_summary`] adds per output token:
    /// what the call with tools is planned to leave room for (docs/cost.md, *The summary
    /// reserve*). By the byte bound; with `count`, by the provider's count of that request
    /// when counts are trusted and it is lower, as the summary call is then planned too.
    pub(super) async fn summary_prompt(
        &self,
        request: &Request,
        ledger: &PromptLedger,
        counts: &Counts,
        count: bool,
    ) -> u64 {
        let mut shortest = request.clone();
        while elide_oldest_result(&mut shortest) {}
        cut_newest_output(&mut shortest, u64::MAX / 2);
        let mut bound = ledger.upper_bound(&shortest);
        if count && !counts.distrusted {
            let counted = tokio::select! {
                c = self.provider.count_tokens(&shortest) => c,
                _ = self.cancel.cancelled() => None,
            };
            if let Some(c) = counted {
                bound = bound.min(Counts::bound(c));
            }
        }
        bound
            + 2 * MIN_NEWEST_OUTPUT as u64
            + crate::cost::REQUEST_OVERHEAD_TOKENS
            + token_upper_bound(LAST_CALL_NOTE)
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
pub(super) const LAST_CALL_NOTE: &str =
    "[kodx: this is the run's last model call and tools are disabled. \
Reply now with a short summary: what you did, the state the files are in, and what is left to do.]";

/// Replaces the oldest tool results with a short note until the request's upper bound of
/// prompt tokens fits `limit`. The newest exchange is never elided.
pub(super) fn elide_old_results(request: &mut Request, limit: u64, ledger: &PromptLedger) {
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
    use crate::model::Message;
    use serde_json::json;

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
}
