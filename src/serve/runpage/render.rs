//! What the run page shows, from transcript records to HTML: pure, no I/O. Records come in
//! one by one ([`StepReader`]); a step is rendered as soon as the next one starts, so a
//! page never holds more than one step besides the HTML it sends.

use std::time::Duration;

use maud::{html, Markup, PreEscaped};

use crate::db::Run;
use crate::model::Block;
use crate::redact::redact;
use crate::serve::setup::page::layout;
use crate::serve::texts::markup;
use crate::transcript::context::RepoContext;
use crate::transcript::Record;

/// Characters of one command's output (or one text) shown at most.
pub const MAX_OUTPUT_CHARS: usize = 20_000;
/// Outputs longer than this are collapsed.
const COLLAPSE_CHARS: usize = 600;

/// One step of the agent as the page shows it.
#[derive(Default)]
pub(super) struct Step {
    /// The sequence number of its first record (where a page or an update starts).
    pub seq: i64,
    number: u32,
    text: Vec<String>,
    /// (shell and what was typed, its output, whether it failed)
    calls: Vec<(String, String, bool)>,
    tokens: Option<(u64, u64, u64, u64)>,
    pub cost: Option<f64>,
    /// A steer's card instead (`/kodx steer`): who, and their words.
    steer: Option<(String, String)>,
}

/// Whether `record` begins a step of the page (a model's answer, a check kodx ran, or a
/// steer, which has a card of its own).
pub(super) fn starts_step(record: &Record) -> bool {
    matches!(
        record,
        Record::ModelResponse { .. } | Record::Check { .. } | Record::Steer { .. }
    )
}

/// Builds steps from records read in order.
#[derive(Default)]
pub(super) struct StepReader {
    current: Option<Step>,
    /// Tool call id → index of its call in `current`.
    pending: Vec<(String, usize)>,
}

impl StepReader {
    /// Takes record `seq`; returns the step it ends by starting the next one.
    pub fn push(&mut self, seq: i64, record: Record) -> Option<Step> {
        if !starts_step(&record) {
            if let Record::ToolResult {
                id,
                output,
                is_error,
                ..
            } = record
            {
                let at = self.pending.iter().find(|(t, _)| *t == id).map(|p| p.1);
                if let Some(call) = at.and_then(|i| self.current.as_mut()?.calls.get_mut(i)) {
                    call.1 = shown(&output);
                    call.2 = is_error;
                }
            }
            return None;
        }
        let done = self.current.take();
        self.pending.clear();
        let mut s = Step {
            seq,
            ..Default::default()
        };
        match record {
            Record::ModelResponse {
                step,
                response,
                cost_usd,
            } => {
                s.number = step;
                for block in &response.content {
                    match block {
                        Block::Text { text } if !text.trim().is_empty() => {
                            s.text.push(shown(text));
                        }
                        Block::ToolUse { id, name, input } => {
                            let shell = input["shell"].as_str().unwrap_or("default");
                            let typed = match input["chars"].as_str() {
                                Some(chars) => format!("{shell}$ {}", chars.trim_end()),
                                None => format!("{name} {input}"),
                            };
                            self.pending.push((id.clone(), s.calls.len()));
                            s.calls.push((shown(&typed), String::new(), false));
                        }
                        _ => {}
                    }
                }
                let u = &response.usage;
                s.tokens = Some((
                    u.input_tokens,
                    u.output_tokens,
                    u.cache_write_tokens,
                    u.cache_read_tokens,
                ));
                s.cost = Some(cost_usd);
            }
            Record::Check { step, result } => {
                s.number = step;
                s.text.push(shown(&format!(
                    "kodx ran the check {} (attempt {}): {}, {:.1}s",
                    result.name,
                    result.attempt,
                    result.verdict(),
                    result.duration().as_secs_f64()
                )));
                s.calls.push((
                    shown(&format!("check$ {}", result.run)),
                    shown(&result.output),
                    !result.passed,
                ));
            }
            Record::Steer {
                step,
                author,
                words,
                ..
            } => {
                s.number = step;
                s.steer = Some((redact(&author), shown(&words)));
            }
            _ => unreachable!("starts_step"),
        }
        self.current = Some(s);
        done
    }

    /// The step still open at the end of what was read.
    pub fn finish(self) -> Option<Step> {
        self.current
    }
}

/// Redacted and cut to [`MAX_OUTPUT_CHARS`].
pub(super) fn shown(text: &str) -> String {
    let text = redact(text);
    let total = text.chars().count();
    if total <= MAX_OUTPUT_CHARS {
        return text;
    }
    let mut out: String = text.chars().take(MAX_OUTPUT_CHARS).collect();
    out.push_str(&format!(
        "\n… ({} more characters)",
        total - MAX_OUTPUT_CHARS
    ));
    out
}

/// One step's card, appended to `out`.
pub(super) fn render_step(s: &Step, out: &mut String) {
    if let Some((author, words)) = &s.steer {
        let card = html! {
            div.card.step.steer data-seq=(s.seq) {
                h2 { "🧭 steered by @" (author) }
                p.hint { "given to the model before step " (s.number) }
                pre.text { (words) }
            }
        };
        out.push_str(&card.into_string());
        return;
    }
    let card = html! {
        div.card.step data-seq=(s.seq) {
            h2 { "Step " (s.number) }
            @for t in &s.text { pre.text { (t) } }
            @for (typed, output, failed) in &s.calls {
                pre.typed { (typed) }
                @if output.chars().count() > COLLAPSE_CHARS || output.lines().count() > 12 {
                    details { summary { "output (" (output.lines().count()) " lines)" } pre class=(if *failed { "out fail" } else { "out" }) { (output) } }
                } @else if !output.is_empty() {
                    pre class=(if *failed { "out fail" } else { "out" }) { (output) }
                }
            }
            p.hint {
                @if let Some((i, o, w, r)) = s.tokens {
                    "tokens: " (i) " in, " (o) " out, " (w) " cache write, " (r) " cache read"
                }
                @if let Some(c) = s.cost { " · " (crate::cost::format_usd(c)) }
            }
        }
    };
    out.push_str(&card.into_string());
}

pub(super) fn status_class(run: &Run) -> &'static str {
    match run.status.as_str() {
        "succeeded" => "ok",
        "failed" | "cancelled" => "fail",
        _ => "note",
    }
}

/// The run's status as the page says it: a queued run held for `/kodx go` is "awaiting
/// confirmation".
pub(super) fn status_words(run: &Run) -> &'static str {
    if run.is_held() {
        "awaiting confirmation"
    } else {
        run.status.as_str()
    }
}

/// A finished run's wall time, from its acknowledgement (`created_at`) to its end, with the
/// agent's share beside it when the run recorded one: `6.8s (agent 0.2s)`.
pub(super) fn duration(run: &Run) -> Option<String> {
    let end = run.finished_at?;
    let wall = Duration::from_millis((end - run.created_at).max(0) as u64);
    let result = crate::db::RunResult::parse(run.result.as_deref());
    Some(match result.timings_ms.get("agent") {
        Some(&agent) => markup::format_wall(wall, Duration::from_millis(agent)),
        None => markup::format_seconds(wall),
    })
}

/// The repository context card: where it was read, the instructions and the template as
/// given, the nested `AGENTS.md` paths and what was left out.
pub(super) fn render_context(c: &RepoContext) -> Markup {
    let commit = c
        .commit
        .as_deref()
        .map(|c| c.chars().take(12).collect::<String>());
    let (nested, notes) = (&c.nested, &c.notes);
    html! {
        div.card #context {
            h2 { "Repository context" }
            p { "Read from branch " code { (shown(&c.branch)) }
                @if let Some(commit) = commit { " at " code { (commit) } } "." }
            @if let Some(i) = &c.instructions {
                details {
                    summary { "Instructions given: " code { (shown(&i.path)) }
                        @if let Some(via) = &i.via { " (through the link " code { (shown(via)) } ")" }
                        " · " (i.bytes) " bytes"
                        @if i.cut { ", cut" } }
                    pre.text { (shown(&i.text)) }
                }
            } @else {
                p.hint { "No instructions given (no AGENTS.md, CLAUDE.md or .github/copilot-instructions.md to use)." }
            }
            @if !nested.is_empty() {
                p { "Nested AGENTS.md listed: " (shown(&nested.join(", "))) }
            }
            @if let Some(t) = &c.template {
                details {
                    summary { "Pull request template: " code { (shown(&t.path)) } }
                    pre.text { (shown(&t.text)) }
                }
            }
            @for n in notes { p.hint { (shown(n)) } }
        }
    }
}

/// The images the model was given, as thumbnails served by kodx under the run's token.
pub(super) fn render_images(
    run_id: &str,
    images: &[crate::db::StoredImage],
    token: &str,
) -> Markup {
    html! {
        div.card #images {
            h2 { "Images given to the model" }
            @for i in images {
                @let src = format!("/runs/{run_id}/images/{}?token={token}", i.n);
                @let words = describe(i);
                figure style="display:inline-block;margin:0 1em 1em 0" {
                    a href=(src) {
                        img src=(src) alt={ "image " (i.n + 1) } loading="lazy"
                            style="max-width:240px;max-height:180px;border:1px solid #ccc";
                    }
                    figcaption.hint { (i.n + 1) ". " (words) }
                }
            }
        }
    }
}

/// `PNG, 800×600, 12 KB` for a stored image.
fn describe(i: &crate::db::StoredImage) -> String {
    let kind = crate::image::ImageKind::parse(&i.kind).map_or("image", |k| k.name());
    let size = format!("{} KB", (i.size.max(0) as u64).div_ceil(1024));
    match (i.width, i.height) {
        (Some(w), Some(h)) => format!("{kind}, {w}×{h}, {size}"),
        _ => format!("{kind}, {size}"),
    }
}

/// Replaces the steps from `data-seq` = the event's first line on, updates the cost, and
/// reloads once the run has ended.
const LIVE_JS: &str = "
const steps = document.getElementById('steps');
const es = new EventSource(steps.dataset.events);
es.addEventListener('steps', e => {
  const lines = e.data.split('\\n');
  const from = Number(lines[0]);
  for (const s of steps.querySelectorAll('.step')) { if (Number(s.dataset.seq) >= from) s.remove(); }
  const none = document.getElementById('nostep'); if (none) none.remove();
  steps.insertAdjacentHTML('beforeend', lines.slice(3).join('\\n'));
  document.getElementById('spent').textContent = lines[1];
  document.getElementById('calls').textContent = lines[2];
});
es.addEventListener('end', () => { es.close(); location.reload(); });
";

/// What one page shows besides the run itself.
pub(super) struct PageParts<'a> {
    /// The steps' HTML ([`render_step`]).
    pub steps_html: &'a str,
    pub no_step: bool,
    /// Where this page starts and where the next one does, if the transcript goes on.
    pub from: i64,
    pub next: Option<i64>,
    /// Where live updates start (the last step shown, which may still grow).
    pub live_from: i64,
    /// The repository context (first page only).
    pub given: Option<&'a RepoContext>,
    /// The images the run gave the model (first page only).
    pub images: &'a [crate::db::StoredImage],
    /// While the run works: what it has cost so far, and its API calls.
    pub spent: Option<(f64, u64)>,
    pub token: &'a str,
}

pub(super) fn render_page(run: &Run, p: &PageParts<'_>) -> Markup {
    let r = &run.request;
    let here = format!("/runs/{}?token={}", run.id, p.token);
    let live = p.spent.is_some();
    let body = html! {
        h1 { "kodx run " code { (run.id) } }
        div.card {
            p { strong { (r.author) } " asked: " code { (shown(&format!("/kodx {} {}", r.job.kind().as_str(), r.job.argument()))) } }
            p { (r.repo) " #" (r.issue_number) @if r.is_pull_request { " (pull request)" } }
            p {
                "Status: " span class=(status_class(run)) { (status_words(run)) }
                @if let Some(by) = &run.confirmed_by { " · started by " (by) " with " code { "/kodx go" } }
                @if let Some(reason) = &run.stop_reason { " · stop: " code { (reason.as_str()) } }
                @if let Some(d) = duration(run) { " · " (d) }
            }
            @if let Some(cost) = run.cost_usd {
                p { "Cost: " strong.cost { (crate::cost::format_usd(cost)) } " · " (run.api_calls) " API calls" }
            }
            @if let Some(pr) = &run.pr_url { p { "Pull request: " a href=(pr) { (pr) } } }
            @if let Some(m) = &run.mergeable_state { p { "Mergeable state (as GitHub said when kodx decided): " code { (m) } } }
            @if live { p.hint { "Live: new steps appear as the agent works." } }
        }
        @if let Some(blocked) = &run.egress_blocked { (render_blocked(blocked)) }
        @if let Some(given) = p.given { (render_context(given)) }
        @if !p.images.is_empty() { (render_images(&run.id, p.images, p.token)) }
        @if let Some((spent, calls)) = p.spent {
            p.card { "Spent so far: " strong.cost #spent { (crate::cost::format_usd(spent)) } " · " span #calls { (calls) } " API calls" }
        }
        @if p.from > 0 { p { a href=(here) { "← the first steps" } } }
        @let events = format!("/runs/{}/events?token={}&from={}", run.id, p.token, p.live_from);
        div #steps data-events=(events) {
            @if p.no_step { p.hint #nostep { @if p.from > 0 { "No step from here." } @else { "No step yet." } } }
            (PreEscaped(p.steps_html))
        }
        @if let Some(next) = p.next { p { a href={ (here) "&from=" (next) } { "The next steps →" } } }
        @if live && p.next.is_none() { script { (PreEscaped(LIVE_JS)) } }
    };
    layout(&format!("Run {}", run.id), body)
}

/// What kodx's egress proxy refused for the run (stored as JSON): host, port, count, the
/// first time and the `network.allow` entry that would allow it.
fn render_blocked(stored: &str) -> Markup {
    use crate::egress::report::{clean_host, clock};
    let blocked: Vec<crate::egress::Blocked> = serde_json::from_str(stored).unwrap_or_default();
    html! {
        div.card #egress {
            @if blocked.is_empty() {
                p { "Network: through kodx's egress proxy; it refused nothing." }
            } @else {
                p { "Network: kodx's egress proxy refused these requests. Add a host's entry to " code { "network.allow" } " in " code { ".github/kodx.yml" } " to allow it." }
                table {
                    tr { th { "host" } th { "port" } th { "requests" } th { "first" } th { "add to network.allow" } }
                    @for b in &blocked {
                        tr {
                            td { code { (clean_host(&b.host)) } }
                            td { (b.port) }
                            td { (b.count) }
                            td { (clock(b.first_ms)) }
                            td { @if let Some(s) = &b.suggestion { code { (clean_host(s)) } } @else { (b.why) } }
                        }
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_output_is_cut_and_secrets_redacted() {
        let long = "x".repeat(MAX_OUTPUT_CHARS + 10);
        assert!(shown(&long).ends_with("(10 more characters)"));
        let secret = "token ghs_abcdefghijklmnopqrstuvwxyz0123456789 here";
        assert!(!shown(secret).contains("ghs_abcdefghijklmnopqrstuvwxyz0123456789"));
    }

    #[test]
    fn a_steer_has_a_card_of_its_own() {
        let mut reader = StepReader::default();
        let steer = Record::Steer {
            step: 3,
            author: "alice".into(),
            words: "use <b>v2</b>".into(),
            message: "@alice (a writer) steered this run …".into(),
        };
        assert!(starts_step(&steer));
        assert!(reader.push(7, steer).is_none());
        let mut html = String::new();
        render_step(&reader.finish().unwrap(), &mut html);
        insta::assert_snapshot!(html, @r#"<div class="card step steer" data-seq="7"><h2>🧭 steered by @alice</h2><p class="hint">given to the model before step 3</p><pre class="text">use &lt;b&gt;v2&lt;/b&gt;</pre></div>"#);
    }
}
