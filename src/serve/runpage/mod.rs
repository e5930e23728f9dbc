//! The run page: `GET /runs/{id}?token=…` shows one run — who asked what, where, its status,
//! timings and cost, and each step of the agent (the model's text, each command typed with
//! what it printed, the step's tokens and cost) — live while it runs (server-sent events at
//! `/runs/{id}/events`, a few lines of inline JS). `GET /runs?token=…` is the operator's
//! list of recent runs. Server-rendered with maud, no external assets.
//!
//! Access: each run's link carries a token, an HMAC-SHA256 of the run id under a server key
//! (32 random bytes in `<KODX_DATA_DIR>/run-pages.key`, mode 0600, made on first start); the
//! operator's list has its own token from the same key. A wrong or missing token, an unknown
//! run, or `run_pages = false` are the same `404` with no content. What is shown is redacted
//! as comments are, and bounded: the first [`MAX_RECORDS`] transcript records, each output
//! cut to [`MAX_OUTPUT_CHARS`].

use std::convert::Infallible;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use maud::{html, Markup, PreEscaped};
use serde::Deserialize;
use tokio::sync::Semaphore;

use crate::db::{Db, Run};
use crate::model::Block;
use crate::serve::keys::OperatorKey;
use crate::serve::setup::page::layout;
use crate::serve::texts::status::{self as comment, redact};
use crate::transcript::Record;

mod key;
pub use key::RunKey;

/// Transcript records one page shows at most.
pub const MAX_RECORDS: i64 = 2_000;
/// Characters of one command's output (or one text) shown at most.
pub const MAX_OUTPUT_CHARS: usize = 20_000;
/// Outputs longer than this are collapsed.
const COLLAPSE_CHARS: usize = 600;
/// Live pages at once (each holds a stream polling the database).
const MAX_STREAMS: usize = 64;

/// The server's run pages: the key of their links, the operator's key (the list), and
/// the database.
pub struct RunPages {
    key: RunKey,
    operator: Arc<OperatorKey>,
    db: Db,
    streams: Arc<Semaphore>,
}

impl RunPages {
    /// Reads the key under `data_dir`, making it (mode 0600) the first time.
    pub fn open(data_dir: &Path, db: Db, operator: Arc<OperatorKey>) -> std::io::Result<RunPages> {
        Ok(RunPages {
            key: RunKey::open(data_dir)?,
            operator,
            db,
            streams: Arc::new(Semaphore::new(MAX_STREAMS)),
        })
    }

    pub fn key(&self) -> &RunKey {
        &self.key
    }

    fn token(&self, run_id: &str) -> String {
        self.key.token(run_id)
    }

    fn allows(&self, expected: &str, given: Option<&str>) -> bool {
        RunKey::allows(expected, given)
    }
}

#[derive(Deserialize)]
struct TokenQuery {
    token: Option<String>,
}

/// The routes (`/runs`, `/runs/{id}`, `/runs/{id}/events`).
pub fn routes(pages: Arc<RunPages>) -> Router {
    Router::new()
        .route("/runs", get(list))
        .route("/runs/{id}", get(page))
        .route("/runs/{id}/events", get(events))
        .with_state(pages)
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "not found\n").into_response()
}

async fn page(
    State(pages): State<Arc<RunPages>>,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<TokenQuery>,
) -> Response {
    if !pages.allows(&pages.token(&id), q.token.as_deref()) {
        return not_found();
    }
    let Ok(Some(run)) = pages.db.get_run(&id).await else {
        return not_found();
    };
    let steps = steps(&pages.db, &id).await;
    let given = given_context(&pages.db, &id).await;
    let live = !run.status.is_final();
    let token = q.token.unwrap_or_default();
    Html(render_page(&run, &steps, given.as_ref(), live, &token).into_string()).into_response()
}

/// Sends the steps again whenever the transcript grows; ends (telling the page to reload
/// once) when the run ends.
async fn events(
    State(pages): State<Arc<RunPages>>,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<TokenQuery>,
) -> Response {
    if !pages.allows(&pages.token(&id), q.token.as_deref()) {
        return not_found();
    }
    let Ok(permit) = pages.streams.clone().try_acquire_owned() else {
        return (StatusCode::SERVICE_UNAVAILABLE, "too many live pages\n").into_response();
    };
    let stream = futures_util::stream::unfold(
        (pages, id, -1i64, false, permit),
        |(pages, id, mut seen, ended, permit)| async move {
            if ended {
                return None;
            }
            loop {
                let run = pages.db.get_run(&id).await.ok().flatten();
                // Only the records after the last one sent are read here.
                let newer = pages
                    .db
                    .transcript_records(&id, seen + 1, MAX_RECORDS)
                    .await
                    .ok()
                    .and_then(|r| r.last().map(|(seq, _)| *seq));
                let over = run.as_ref().is_none_or(|r| r.status.is_final());
                if over {
                    let event = Event::default().event("end").data("ended");
                    return Some((Ok::<_, Infallible>(event), (pages, id, seen, true, permit)));
                }
                if let Some(newer) = newer {
                    seen = newer;
                    let steps = steps(&pages.db, &id).await;
                    let html = render_steps(&steps, true).into_string();
                    let event = Event::default().event("steps").data(html);
                    return Some((Ok(event), (pages, id, seen, false, permit)));
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        },
    );
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

async fn list(State(pages): State<Arc<RunPages>>, Query(q): Query<TokenQuery>) -> Response {
    if !pages.operator.allows(q.token.as_deref()) {
        return not_found();
    }
    let runs = pages.db.recent_runs(100).await.unwrap_or_default();
    let body = html! {
        h1 { "Recent runs" }
        div.card {
            @if runs.is_empty() { p.hint { "No runs yet." } }
            ul.checks {
                @for r in &runs {
                    li {
                        a href={ "/runs/" (r.id) "?token=" (pages.token(&r.id)) } { code { (r.id) } }
                        " " (r.request.repo) "#" (r.request.issue_number) " · " (r.kind().as_str())
                        " · " span class=(status_class(r)) { (r.status.as_str()) }
                        @if let Some(cost) = r.cost_usd { " · " (crate::cost::format_usd(cost)) }
                        @if let Some(d) = duration(r) { " · " (comment::format_duration(d)) }
                    }
                }
            }
        }
    };
    Html(layout("Runs", body).into_string()).into_response()
}

/// One step of the agent as the page shows it.
#[derive(Default)]
struct Step {
    number: u32,
    text: Vec<String>,
    /// (shell and what was typed, its output, whether it failed)
    calls: Vec<(String, String, bool)>,
    tokens: Option<(u64, u64, u64, u64)>,
    cost: Option<f64>,
}

async fn steps(db: &Db, run_id: &str) -> (Vec<Step>, bool) {
    let records = db
        .transcript_records(run_id, 0, MAX_RECORDS + 1)
        .await
        .unwrap_or_default();
    let cut = records.len() as i64 > MAX_RECORDS;
    let mut steps: Vec<Step> = Vec::new();
    let mut pending: Vec<(String, usize, usize)> = Vec::new(); // tool id → (step idx, call idx)
    for (_, line) in records.iter().take(MAX_RECORDS as usize) {
        let Ok(record) = serde_json::from_str::<Record>(line) else {
            continue;
        };
        match record {
            Record::ModelResponse {
                step,
                response,
                cost_usd,
            } => {
                let mut s = Step {
                    number: step,
                    ..Default::default()
                };
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
                            pending.push((id.clone(), steps.len(), s.calls.len()));
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
                steps.push(s);
            }
            Record::Check { step, result } => {
                let mut s = Step {
                    number: step,
                    ..Default::default()
                };
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
                steps.push(s);
            }
            Record::ToolResult {
                id,
                output,
                is_error,
                ..
            } => {
                if let Some((_, si, ci)) = pending.iter().find(|(t, _, _)| *t == id) {
                    if let Some(call) = steps.get_mut(*si).and_then(|s| s.calls.get_mut(*ci)) {
                        call.1 = shown(&output);
                        call.2 = is_error;
                    }
                }
            }
            _ => {}
        }
    }
    (steps, cut)
}

/// What the run's first message carried from the repository (the transcript's `context`
/// record, written before the first request).
async fn given_context(db: &Db, run_id: &str) -> Option<serde_json::Value> {
    let records = db.transcript_records(run_id, 0, 4).await.ok()?;
    records
        .iter()
        .find_map(|(_, line)| match serde_json::from_str(line) {
            Ok(Record::Context { context }) => Some(context),
            _ => None,
        })
}

/// The repository context card: where it was read, the instructions and the template as
/// given, the nested `AGENTS.md` paths and what was left out.
fn render_context(c: &serde_json::Value) -> Markup {
    let s = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_string();
    let commit = c["commit"]
        .as_str()
        .map(|c| c.chars().take(12).collect::<String>());
    let nested: Vec<String> = c["nested"]
        .as_array()
        .map(|a| a.iter().map(s).collect())
        .unwrap_or_default();
    let notes: Vec<String> = c["notes"]
        .as_array()
        .map(|a| a.iter().map(s).collect())
        .unwrap_or_default();
    let i = &c["instructions"];
    let t = &c["template"];
    html! {
        div.card #context {
            h2 { "Repository context" }
            p { "Read from branch " code { (shown(&s(&c["branch"]))) }
                @if let Some(commit) = commit { " at " code { (commit) } } "." }
            @if i.is_object() {
                details {
                    summary { "Instructions given: " code { (shown(&s(&i["path"]))) }
                        @if let Some(via) = i["via"].as_str() { " (through the link " code { (shown(via)) } ")" }
                        " · " (i["bytes"].as_u64().unwrap_or(0)) " bytes"
                        @if i["cut"].as_bool() == Some(true) { ", cut" } }
                    pre.text { (shown(&s(&i["text"]))) }
                }
            } @else {
                p.hint { "No instructions given (no AGENTS.md, CLAUDE.md or .github/copilot-instructions.md to use)." }
            }
            @if !nested.is_empty() {
                p { "Nested AGENTS.md listed: " (shown(&nested.join(", "))) }
            }
            @if t.is_object() {
                details {
                    summary { "Pull request template: " code { (shown(&s(&t["path"]))) } }
                    pre.text { (shown(&s(&t["text"]))) }
                }
            }
            @for n in &notes { p.hint { (shown(n)) } }
        }
    }
}

/// Redacted and cut to [`MAX_OUTPUT_CHARS`].
fn shown(text: &str) -> String {
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

fn status_class(run: &Run) -> &'static str {
    match run.status.as_str() {
        "succeeded" => "ok",
        "failed" | "cancelled" => "fail",
        _ => "note",
    }
}

fn duration(run: &Run) -> Option<Duration> {
    let (start, end) = (run.started_at?, run.finished_at?);
    Some(Duration::from_millis((end - start).max(0) as u64))
}

/// The steps; while the run is `live`, first what they cost so far.
fn render_steps((steps, cut): &(Vec<Step>, bool), live: bool) -> Markup {
    let spent: f64 = steps.iter().filter_map(|s| s.cost).sum();
    html! {
        @if live && !steps.is_empty() {
            p.card { "Spent so far: " strong.cost { (crate::cost::format_usd(spent)) } " · " (steps.len()) " API calls" }
        }
        @if steps.is_empty() { p.hint { "No step yet." } }
        @for s in steps {
            div.card.step {
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
        }
        @if *cut { p.hint { "Only the first " (MAX_RECORDS) " records are shown." } }
    }
}

const LIVE_JS: &str = "
const es = new EventSource(location.pathname + '/events' + location.search);
es.addEventListener('steps', e => { document.getElementById('steps').innerHTML = e.data; });
es.addEventListener('end', () => { es.close(); location.reload(); });
";

fn render_page(
    run: &Run,
    steps: &(Vec<Step>, bool),
    given: Option<&serde_json::Value>,
    live: bool,
    _token: &str,
) -> Markup {
    let r = &run.request;
    let body = html! {
        h1 { "kodx run " code { (run.id) } }
        div.card {
            p { strong { (r.author) } " asked: " code { (shown(&format!("/kodx {} {}", r.job.kind().as_str(), r.job.argument()))) } }
            p { (r.repo) " #" (r.issue_number) @if r.is_pull_request { " (pull request)" } }
            p {
                "Status: " span class=(status_class(run)) { (run.status.as_str()) }
                @if let Some(reason) = &run.stop_reason { " · stop: " code { (reason.as_str()) } }
                @if let Some(d) = duration(run) { " · " (comment::format_duration(d)) }
            }
            @if let Some(cost) = run.cost_usd {
                p { "Cost: " strong.cost { (crate::cost::format_usd(cost)) } " · " (run.api_calls) " API calls" }
            }
            @if let Some(pr) = &run.pr_url { p { "Pull request: " a href=(pr) { (pr) } } }
            @if live { p.hint { "Live: new steps appear as the agent works." } }
        }
        @if let Some(given) = given { (render_context(given)) }
        div #steps { (render_steps(steps, live)) }
        @if live { script { (PreEscaped(LIVE_JS)) } }
    };
    layout(&format!("Run {}", run.id), body)
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
}
