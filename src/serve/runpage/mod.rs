//! The run page: `GET /runs/{id}?token=…` shows one run — who asked what, where, its status,
//! timings and cost, and each step of the agent (the model's text, each command typed with
//! what it printed, the step's tokens and cost) — live while it runs (server-sent events at
//! `/runs/{id}/events`, a few lines of inline JS). `GET /runs?token=…` is the operator's
//! list of recent runs; `GET /usage?token=…` what finished runs cost ([`usage`]).
//! `GET /runs/{id}/images/{n}?token=…` is image `n` the run gave the model, shown as a
//! thumbnail on its page (served from the database under the run's own token, with the
//! type its bytes were found to be and `nosniff`: no third-party address is embedded).
//! Server-rendered with maud, no external assets.
//!
//! Access: each run's link carries a token, an HMAC-SHA256 of the run id under a server key
//! (32 random bytes in `<KODX_DATA_DIR>/run-pages.key`, mode 0600, made on first start); the
//! operator's list has its own token from the same key. A wrong or missing token, an unknown
//! run, or `run_pages = false` are the same `404` with no content. What is shown is redacted
//! as comments are.
//!
//! Cost: links are posted in public comments, so a view's cost is bounded whatever the run
//! and whoever asks. The transcript is shown by pages ([`read`]: `?from=<record>`, at most
//! [`read::STEPS_PER_PAGE`] steps or about [`read::PAGE_BYTES`] of HTML, read a few records
//! at a time); a rendered page is kept for the next viewer ([`cache`]) and sent as slices
//! of the one copy; views per client, views at once and live streams per run are limited
//! ([`limits`]); a reader that takes nothing for `write_timeout_secs` is dropped with its
//! connection (in the listener). A live stream sends only the steps from the last one
//! shown on. Every answer is `no-store`, not framable, under a strict CSP.

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path as UrlPath, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::get;
use axum::{Extension, Router};
use bytes::Bytes;
use maud::html;
use serde::Deserialize;
use tokio::sync::Semaphore;

use crate::db::{Db, Run};
use crate::serve::intake::listen::ConnectionHandle;
use crate::serve::keys::OperatorKey;
use crate::serve::setup::page::{layout, page_headers};

mod cache;
mod key;
mod limits;
mod read;
mod render;
mod usage;

pub use key::RunKey;
pub use render::MAX_OUTPUT_CHARS;

use cache::PageCache;
use limits::{Refused, Streams, Viewers};
use render::{duration, status_class};

/// Pages rendered at once (the others wait, then mostly find their page cached).
const RENDERS_AT_ONCE: usize = 2;
/// How often a live stream looks for new records.
const POLL: Duration = Duration::from_millis(500);
/// What the pages may load and do: their own inline style and script, live updates and
/// the run's images from this server, nothing else.
const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; \
                   connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
                   frame-ancestors 'none'";
/// Images read from the database at once (each at most 5 MiB held while it is sent).
const IMAGE_READS: usize = 4;

/// The server's run pages: the key of their links, the operator's key (the list), and
/// the database.
pub struct RunPages {
    key: RunKey,
    operator: Arc<OperatorKey>,
    db: Db,
    streams: Arc<Streams>,
    viewers: Arc<Viewers>,
    cache: PageCache,
    renders: Semaphore,
    /// The server's monthly budget per installation (`/usage` shows what is left).
    monthly_budget: Option<f64>,
    /// `/usage` views read at once (each reads every run of its period: apart from
    /// `renders`, so run pages never wait for one).
    usage_reads: Semaphore,
    /// Run images read at once ([`IMAGE_READS`]).
    image_reads: Semaphore,
}

impl RunPages {
    /// Reads the key under `data_dir`, making it (mode 0600) the first time.
    pub fn open(data_dir: &Path, db: Db, operator: Arc<OperatorKey>) -> std::io::Result<RunPages> {
        Ok(RunPages {
            key: RunKey::open(data_dir)?,
            operator,
            db,
            streams: Default::default(),
            viewers: Default::default(),
            cache: PageCache::new(cache::CACHE_BYTES),
            renders: Semaphore::new(RENDERS_AT_ONCE),
            monthly_budget: None,
            usage_reads: Semaphore::new(1),
            image_reads: Semaphore::new(IMAGE_READS),
        })
    }

    /// The same pages, `/usage` showing the monthly budget `budget` (per installation).
    pub fn with_budget(mut self, budget: Option<f64>) -> RunPages {
        self.monthly_budget = budget;
        self
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

#[derive(Deserialize)]
struct PageQuery {
    token: Option<String>,
    /// The transcript record the page (or the stream) starts at.
    from: Option<i64>,
}

/// The routes (`/runs`, `/runs/{id}`, `/runs/{id}/events`, `/usage`), every answer with
/// the pages' headers.
pub fn routes(pages: Arc<RunPages>) -> Router {
    Router::new()
        .route("/runs", get(list))
        .route("/runs/{id}", get(page))
        .route("/runs/{id}/events", get(events))
        .route("/runs/{id}/images/{n}", get(image))
        .route("/usage", get(usage_page))
        .with_state(pages)
        .layer(axum::middleware::map_response(|r: Response| async move {
            (page_headers(CSP), r).into_response()
        }))
}

fn not_found() -> Response {
    (StatusCode::NOT_FOUND, "not found\n").into_response()
}

fn refused(why: Refused, what: &str) -> Response {
    let wait = match why {
        Refused::Busy => 2,
        Refused::Rate(s) => s.max(1),
    };
    (
        StatusCode::TOO_MANY_REQUESTS,
        [("retry-after", wait.to_string())],
        format!("too many {what}; try again in {wait} s\n"),
    )
        .into_response()
}

/// Everything a page shows of the run's row: a cached page is used only while it is the
/// same.
fn fingerprint(run: &Run) -> String {
    format!(
        "{}|{:?}|{:?}|{}|{:?}|{:?}|{:?}",
        run.status.as_str(),
        run.stop_reason.as_ref().map(|r| r.as_str()),
        run.cost_usd,
        run.api_calls,
        run.pr_url,
        run.started_at,
        run.finished_at
    )
}

async fn page(
    State(pages): State<Arc<RunPages>>,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<PageQuery>,
    conn: Option<Extension<ConnectionHandle>>,
) -> Response {
    if !pages.allows(&pages.token(&id), q.token.as_deref()) {
        return not_found();
    }
    let client = conn.map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |c| c.peer().ip());
    let view = match pages.viewers.admit(client, Instant::now()) {
        Ok(view) => view,
        Err(why) => return refused(why, "page views"),
    };
    let Ok(Some(run)) = pages.db.get_run(&id).await else {
        return not_found();
    };
    let from = q.from.unwrap_or(0).max(0);
    let Ok(end) = pages.db.next_transcript_seq(&id).await else {
        return (StatusCode::SERVICE_UNAVAILABLE, "try again\n").into_response();
    };
    let key = format!("{id}|{from}|{end}|{}", fingerprint(&run));
    let html = match pages.cache.get(&key) {
        Some(html) => html,
        None => {
            // Viewers of one page wait for one render, then share it.
            let _render = pages.renders.acquire().await;
            match pages.cache.get(&key) {
                Some(html) => html,
                None => match render(&pages, &run, from, q.token.as_deref().unwrap_or("")).await {
                    Ok(html) => {
                        pages.cache.put(key, html.clone());
                        html
                    }
                    Err(e) => {
                        tracing::warn!(run_id = %id, "run page: {e}");
                        return (StatusCode::SERVICE_UNAVAILABLE, "try again\n").into_response();
                    }
                },
            }
        }
    };
    (
        [("content-type", "text/html; charset=utf-8")],
        limits::page_body(html, view),
    )
        .into_response()
}

/// One page of run `run` from record `from`.
async fn render(
    pages: &RunPages,
    run: &Run,
    from: i64,
    token: &str,
) -> Result<Bytes, crate::db::DbError> {
    let live = !run.status.is_final();
    let chunk = read::read_steps(&pages.db, &run.id, from, i64::MAX).await?;
    let given = match from {
        0 => read::given_context(&pages.db, &run.id).await,
        _ => None,
    };
    let images = match from {
        0 => pages.db.run_images(&run.id).await?,
        _ => Vec::new(),
    };
    let spent = match live {
        true => Some(read::costs(&pages.db, &run.id, 0, i64::MAX).await?),
        false => None,
    };
    let html = render::render_page(
        run,
        &render::PageParts {
            steps_html: &chunk.html,
            no_step: chunk.steps == 0,
            from,
            next: chunk.next,
            live_from: chunk.last_step.unwrap_or(from),
            given: given.as_ref(),
            images: &images,
            spent,
            token,
        },
    );
    Ok(Bytes::from(html.into_string()))
}

/// Image `n` the run gave the model, under the run's token: its bytes with the type they
/// were found to be, never sniffed as anything else.
async fn image(
    State(pages): State<Arc<RunPages>>,
    UrlPath((id, n)): UrlPath<(String, i64)>,
    Query(q): Query<TokenQuery>,
) -> Response {
    if !pages.allows(&pages.token(&id), q.token.as_deref()) {
        return not_found();
    }
    let _read = pages.image_reads.acquire().await;
    let found = match pages.db.run_image(&id, n).await {
        Ok(found) => found,
        Err(e) => {
            tracing::warn!(run_id = %id, "run image: {e}");
            return (StatusCode::SERVICE_UNAVAILABLE, "try again\n").into_response();
        }
    };
    let Some((kind, bytes)) = found else {
        return not_found();
    };
    let Some(kind) = crate::image::ImageKind::parse(&kind) else {
        return not_found();
    };
    (
        [
            ("content-type", kind.media_type()),
            ("x-content-type-options", "nosniff"),
            ("content-disposition", "inline"),
        ],
        bytes,
    )
        .into_response()
}

/// Where a live stream is.
struct Follow {
    pages: Arc<RunPages>,
    id: String,
    /// The first record of the steps the next update sends (the last step sent may grow).
    start: i64,
    /// The last record taken in.
    seen: i64,
    spent: Option<(f64, u64)>,
    ended: bool,
    _guard: limits::StreamGuard,
}

/// Sends the steps from the last one shown on whenever the transcript grows (each update
/// one page's worth at most); ends (telling the page to reload once) when the run ends.
async fn events(
    State(pages): State<Arc<RunPages>>,
    UrlPath(id): UrlPath<String>,
    Query(q): Query<PageQuery>,
) -> Response {
    if !pages.allows(&pages.token(&id), q.token.as_deref()) {
        return not_found();
    }
    let guard = match pages.streams.admit(&id) {
        Ok(guard) => guard,
        Err(why) => return refused(why, "live pages of this run"),
    };
    let start = q.from.unwrap_or(0).max(0);
    let follow = Follow {
        pages,
        id,
        start,
        seen: start - 1,
        spent: None,
        ended: false,
        _guard: guard,
    };
    let stream = futures_util::stream::unfold(follow, |mut f| async move {
        if f.ended {
            return None;
        }
        loop {
            match next_update(&mut f).await {
                Ok(Some(event)) => return Some((Ok::<_, std::convert::Infallible>(event), f)),
                Ok(None) => {}
                Err(e) => tracing::debug!(run_id = %f.id, "live run page: {e}"),
            }
            tokio::time::sleep(POLL).await;
        }
    });
    Sse::new(stream)
        .keep_alive(KeepAlive::default())
        .into_response()
}

/// The stream's next event, if there is one now.
async fn next_update(f: &mut Follow) -> Result<Option<Event>, crate::db::DbError> {
    let db = &f.pages.db;
    let over = db.get_run(&f.id).await?.is_none_or(|r| r.status.is_final());
    if over {
        f.ended = true;
        return Ok(Some(Event::default().event("end").data("ended")));
    }
    if db.next_transcript_seq(&f.id).await? <= f.seen + 1 {
        return Ok(None);
    }
    let (mut cost, mut calls) = match f.spent {
        Some(spent) => spent,
        None => read::costs(db, &f.id, 0, f.start).await?,
    };
    let from = f.start;
    let chunk = read::read_steps(db, &f.id, from, f.seen).await?;
    cost += chunk.spent.0;
    calls += chunk.spent.1;
    f.spent = Some((cost, calls));
    f.seen = chunk.read_to;
    f.start = match (chunk.next, chunk.last_step) {
        (Some(next), _) => next,
        (None, Some(last)) => last,
        (None, None) => f.start,
    };
    if chunk.steps == 0 {
        return Ok(None);
    }
    // A carriage return cannot travel in an event; as a character reference it shows the same.
    let data = format!(
        "{from}\n{}\n{calls}\n{}",
        crate::cost::format_usd(cost),
        chunk.html.replace('\r', "&#13;")
    );
    Ok(Some(Event::default().event("steps").data(data)))
}

async fn list(State(pages): State<Arc<RunPages>>, Query(q): Query<TokenQuery>) -> Response {
    if !pages.operator.allows(q.token.as_deref()) {
        return not_found();
    }
    let runs = pages.db.recent_runs(100).await.unwrap_or_default();
    let body = html! {
        h1 { "Recent runs" }
        p.hint { a href={ "/usage?token=" (q.token.as_deref().unwrap_or("")) } { "Usage: spend per repository, person and day" } }
        div.card {
            @if runs.is_empty() { p.hint { "No runs yet." } }
            ul.checks {
                @for r in &runs {
                    li {
                        a href={ "/runs/" (r.id) "?token=" (pages.token(&r.id)) } { code { (r.id) } }
                        " " (r.request.repo) "#" (r.request.issue_number) " · " (r.kind().as_str())
                        " · " span class=(status_class(r)) { (r.status.as_str()) }
                        @if let Some(cost) = r.cost_usd { " · " (crate::cost::format_usd(cost)) }
                        @if let Some(d) = duration(r) { " · " (d) }
                    }
                }
            }
        }
    };
    Html(layout("Runs", body).into_string()).into_response()
}

async fn usage_page(
    State(pages): State<Arc<RunPages>>,
    Query(q): Query<usage::UsageQuery>,
) -> Response {
    if !pages.operator.allows(q.token.as_deref()) {
        return not_found();
    }
    let _read = pages.usage_reads.acquire().await;
    usage::page(&pages.db, pages.monthly_budget, &q).await
}
