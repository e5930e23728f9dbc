//! The HTTP side of `kodx serve` (SPEC §3, §10): the webhook endpoint, `/healthz` and
//! `/metrics`.
//!
//! The webhook handler only verifies, reads and stores: a command is written to the
//! database together with its delivery id, in one transaction, before `202` is answered;
//! everything slow happens in the workers, which the handler wakes.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{DefaultBodyLimit, Query, Request, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde_json::json;
use tokio::sync::Notify;

use crate::db::{Accepted, Db, NewDelivery};
use crate::job::RunRequest;
use crate::serve::intake::body::{read_verified, BodyBudget, BodyError};
use crate::serve::intake::event::{triage, Triage};
use crate::serve::intake::listen::ConnectionHandle;
use crate::serve::metrics::Metrics;
use crate::webhook::WebhookSecrets;

/// GitHub caps payloads at 25 MB; anything larger is refused with `413`.
pub const MAX_BODY_BYTES: usize = 25 * 1024 * 1024;

/// What the handlers share.
#[derive(Clone)]
pub struct HttpState {
    pub secrets: WebhookSecrets,
    pub db: Db,
    pub metrics: Arc<Metrics>,
    /// Woken when a run is queued.
    pub wake: Arc<Notify>,
    pub health: Arc<dyn HealthCheck>,
    /// This App's id: its own check suites' events are not CI to repair.
    pub app_id: u64,
    /// Opens `/healthz`'s details (`?token=` of `kodx operator-link`).
    pub operator: Arc<crate::serve::keys::OperatorKey>,
    /// Bytes of bodies not verified yet, over all connections.
    pub budget: Arc<BodyBudget>,
    /// A body must be in within this of its head.
    pub body_timeout: Duration,
}

/// What `/healthz` asks besides the database.
#[async_trait::async_trait]
pub trait HealthCheck: Send + Sync {
    /// `Err` names what is wrong with the Docker engine(s): none answers.
    async fn docker(&self) -> Result<(), String>;

    /// Each engine as last checked.
    fn engines(&self) -> Vec<crate::serve::pipeline::engines::EngineStatus> {
        Vec::new()
    }
}

/// The routes; `intake: false` (`--role worker`) answers webhooks with `404`.
pub fn router(state: HttpState, intake: bool) -> Router {
    let webhook = if intake {
        post(webhook)
    } else {
        post(not_an_intake)
    };
    Router::new()
        .route("/webhook", webhook.clone())
        .route("/api/github/webhooks", webhook)
        .route("/healthz", get(healthz))
        .route("/metrics", get(metrics))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// A webhook sent to a worker-only process: nothing is read or stored.
async fn not_an_intake() -> Response {
    answer(
        StatusCode::NOT_FOUND,
        serde_json::json!({
            "error": "this kodx serve process runs with --role worker and takes no webhooks; \
                      point the GitHub App's webhook URL at a process with --role all or intake"
        }),
    )
}

fn answer(status: StatusCode, body: serde_json::Value) -> Response {
    (status, Json(body)).into_response()
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// Refusals answered before the whole body was read: the connection is not reused.
fn refuse(
    st: &HttpState,
    event: &str,
    status: StatusCode,
    result: &'static str,
    why: String,
) -> Response {
    st.metrics.webhook(event, result);
    tracing::warn!(event, "webhook refused: {why}");
    let mut r = answer(status, json!({ "error": why }));
    r.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    r
}

/// The longest a refused body is drained after its answer.
const LINGER: Duration = Duration::from_secs(5);

/// Reads and discards a refused body for a while (nothing is kept), so a client still
/// sending it gets to read the answer instead of a reset connection (a closed socket with
/// unread data answers the sender with RST). The connection counts as idle meanwhile.
fn linger(body: axum::body::Body, body_timeout: Duration) {
    use http_body_util::BodyExt as _;
    tokio::spawn(async move {
        let mut body = body;
        let _ = tokio::time::timeout(LINGER.min(body_timeout), async {
            while let Some(Ok(_)) = body.frame().await {}
        })
        .await;
    });
}

async fn webhook(State(st): State<HttpState>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let headers = &parts.headers;
    let event = header(headers, "x-github-event").unwrap_or("").trim();
    // What can be refused on the head alone is refused before any of the body is read:
    // a declared length over GitHub's cap, then a missing or malformed signature.
    let declared = header(headers, "content-length").and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(len) = declared.filter(|&l| l > MAX_BODY_BYTES as u64) {
        linger(body, st.body_timeout);
        return refuse(
            &st,
            event,
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!("the body ({len} bytes) is over GitHub's 25 MiB cap"),
        );
    }
    let verifier = match st.secrets.verifier(header(headers, "x-hub-signature-256")) {
        Ok(v) => v,
        Err(e) => {
            linger(body, st.body_timeout);
            return refuse(
                &st,
                event,
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                e.to_string(),
            );
        }
    };
    // The body streams into the HMAC under the size cap, the deadline and the budget of
    // unverified bytes; meanwhile the connection may be displaced like an idle one.
    let unverified = parts
        .extensions
        .get::<ConnectionHandle>()
        .map(|c| c.unverified());
    let hint = declared.and_then(|l| usize::try_from(l).ok());
    let read = read_verified(
        body,
        verifier,
        &st.budget,
        MAX_BODY_BYTES,
        hint,
        st.body_timeout,
    )
    .await;
    drop(unverified);
    let body = match read {
        Ok(body) => body,
        Err(e @ BodyError::TooLarge(_)) => {
            return refuse(
                &st,
                event,
                StatusCode::PAYLOAD_TOO_LARGE,
                "too_large",
                e.to_string(),
            )
        }
        Err(e @ BodyError::Timeout(_)) => {
            return refuse(
                &st,
                event,
                StatusCode::REQUEST_TIMEOUT,
                "timeout",
                e.to_string(),
            )
        }
        Err(e @ BodyError::Busy) => {
            return refuse(
                &st,
                event,
                StatusCode::SERVICE_UNAVAILABLE,
                "busy",
                e.to_string(),
            )
        }
        Err(e @ BodyError::Read(_)) => {
            return refuse(
                &st,
                event,
                StatusCode::BAD_REQUEST,
                "bad_request",
                e.to_string(),
            )
        }
        Err(BodyError::Signature(e)) => {
            st.metrics.webhook(event, "unauthorized");
            tracing::warn!(event, "webhook refused: {e}");
            return answer(StatusCode::UNAUTHORIZED, json!({ "error": e.to_string() }));
        }
    };
    let delivery = header(headers, "x-github-delivery");
    intake(&st, event, delivery, &body).await
}

/// Stores a delivery whose signature was verified (from the webhook endpoint, or forwarded
/// by a webhook proxy channel) and answers it: `202` with the run id for a command.
pub(in crate::serve) async fn intake(
    st: &HttpState,
    event: &str,
    delivery: Option<&str>,
    body: &[u8],
) -> Response {
    let bad = |reason: String| {
        st.metrics.webhook(event, "bad_request");
        tracing::warn!(event, "webhook not readable: {reason}");
        answer(StatusCode::BAD_REQUEST, json!({ "error": reason }))
    };
    let Some(delivery) = delivery
        .map(str::trim)
        .filter(|d| !d.is_empty() && d.len() <= 128)
    else {
        return bad("the X-GitHub-Delivery header is missing or too long".into());
    };
    let triaged = match triage(event, body) {
        Ok(t) => t,
        Err(e) => return bad(e.0),
    };
    let ignored = |reason: &str| {
        st.metrics.webhook(event, "ignored");
        answer(StatusCode::OK, json!({ "ignored": reason }))
    };
    // CI on a pull request is kodx's only when kodx opened it; the repair works for whoever
    // asked for that pull request.
    let triaged = match triaged {
        Triage::Ci { app_id, .. } if app_id == Some(st.app_id) => {
            return ignored("kodx's own check suite")
        }
        Triage::Ci {
            mut request, pulls, ..
        } => match st.db.pull_kodx_opened(&request.repo, &pulls).await {
            Ok(Some((pull, author, author_id))) => {
                request.issue_number = pull;
                request.author = author;
                request.author_id = author_id;
                Triage::Command(request)
            }
            Ok(None) => return ignored("not a pull request kodx opened"),
            Err(e) => return internal(st, event, &e.to_string()),
        },
        other => other,
    };
    let (record, run) = match &triaged {
        Triage::Ignore(reason) => return ignored(reason),
        Triage::Ci { .. } => unreachable!("CI events were resolved above"),
        Triage::Push {
            request,
            branch,
            after,
        } => return push(st, event, delivery, request, branch, after).await,
        Triage::Installation {
            id,
            account,
            action,
        } => {
            if let Err(e) = st.db.record_installation(*id, account, action).await {
                return internal(st, event, &e.to_string());
            }
            (
                NewDelivery {
                    id: delivery.to_string(),
                    event: event.to_string(),
                    action: Some(action.clone()),
                    installation_id: Some(*id),
                    repo: None,
                },
                None,
            )
        }
        Triage::Command(c) => (
            NewDelivery {
                id: delivery.to_string(),
                event: event.to_string(),
                action: None,
                installation_id: Some(c.installation_id),
                repo: Some(c.repo.clone()),
            },
            Some(RunRequest::clone(c)),
        ),
    };
    match st.db.accept(&record, run.as_ref()).await {
        Ok(Accepted::Queued { run_id }) => {
            st.metrics.webhook(event, "queued");
            st.wake.notify_one();
            if let Triage::Command(c) = &triaged {
                tracing::info!(run_id = %run_id, repo = %c.repo, issue = c.issue_number,
                    command = c.job.kind().as_str(), "run queued");
            }
            answer(StatusCode::ACCEPTED, json!({ "run_id": run_id }))
        }
        Ok(Accepted::Recorded) => {
            st.metrics.webhook(event, "recorded");
            answer(StatusCode::OK, json!({ "ignored": "recorded" }))
        }
        Ok(Accepted::Duplicate) => {
            st.metrics.webhook(event, "duplicate");
            answer(
                StatusCode::OK,
                json!({ "ignored": "duplicate delivery (this X-GitHub-Delivery was handled before)" }),
            )
        }
        Ok(Accepted::DuplicateTrigger { run_id }) => {
            st.metrics.webhook(event, "replayed");
            tracing::warn!(event, delivery, run_id = %run_id,
                "a new delivery id for a comment or issue that already started a run: ignored");
            answer(
                StatusCode::OK,
                json!({ "ignored": format!("duplicate command (this comment or issue already started run {run_id})") }),
            )
        }
        Err(e) => internal(st, event, &e.to_string()),
    }
}

/// A push to a branch (SPEC §12): a merge run for each open pull request kodx opened into
/// it (at most [`crate::db::MAX_PULLS_PER_PUSH`]), each stored under the delivery's id (the
/// second on under `<id>/<pull>`); its admission decides whether it runs.
async fn push(
    st: &HttpState,
    event: &str,
    delivery: &str,
    request: &RunRequest,
    branch: &str,
    after: &str,
) -> Response {
    let pulls = match st.db.pulls_on_base(&request.repo, branch).await {
        Ok(pulls) => pulls,
        Err(e) => return internal(st, event, &e.to_string()),
    };
    if pulls.is_empty() {
        st.metrics.webhook(event, "ignored");
        return answer(
            StatusCode::OK,
            json!({ "ignored": "no open pull request kodx opened goes into this branch" }),
        );
    }
    let mut queued = Vec::new();
    for (i, p) in pulls.iter().enumerate() {
        let mut run = request.clone();
        run.issue_number = p.pull;
        run.author = p.author.clone();
        run.author_id = p.author_id;
        run.trigger = crate::job::Trigger::merge(p.pull, "push", after);
        let record = NewDelivery {
            id: match i {
                0 => delivery.to_string(),
                _ => format!("{delivery}/{}", p.pull),
            },
            event: event.to_string(),
            action: None,
            installation_id: Some(run.installation_id),
            repo: Some(run.repo.clone()),
        };
        match st.db.accept(&record, Some(&run)).await {
            Ok(Accepted::Queued { run_id }) => {
                tracing::info!(run_id = %run_id, repo = %run.repo, pull = p.pull, branch,
                    "merge run queued after a push to the base");
                queued.push(run_id);
            }
            // Handled before (a redelivery).
            Ok(_) => {}
            Err(e) => return internal(st, event, &e.to_string()),
        }
    }
    if queued.is_empty() {
        st.metrics.webhook(event, "duplicate");
        return answer(
            StatusCode::OK,
            json!({ "ignored": "duplicate push (its merge runs were queued before)" }),
        );
    }
    st.metrics.webhook(event, "queued");
    st.wake.notify_one();
    answer(StatusCode::ACCEPTED, json!({ "run_ids": queued }))
}

fn internal(st: &HttpState, event: &str, error: &str) -> Response {
    st.metrics.webhook(event, "error");
    tracing::error!(event, "webhook could not be stored: {error}");
    // 500 makes GitHub show the failure; the delivery can be redelivered from the App's
    // settings once the database is back.
    answer(
        StatusCode::INTERNAL_SERVER_ERROR,
        json!({ "error": "kodx could not store this delivery; see the server log" }),
    )
}

#[derive(serde::Deserialize)]
struct TokenQuery {
    token: Option<String>,
}

/// `200 {"status": "ok"}` or `503 {"status": "unavailable"}` for anyone (a load balancer,
/// Fly's checks); with the operator's token (`?token=` or `Authorization: Bearer`, from
/// `kodx operator-link`) also what was checked: the database, the engines and their
/// errors, which name addresses and are not for the public.
async fn healthz(
    State(st): State<HttpState>,
    Query(q): Query<TokenQuery>,
    headers: HeaderMap,
) -> Response {
    let limit = Duration::from_secs(3);
    let db = match tokio::time::timeout(limit, st.db.ping()).await {
        Ok(Ok(())) => Ok(()),
        Ok(Err(e)) => Err(e.to_string()),
        Err(_) => Err("no answer within 3 s".to_string()),
    };
    let docker = match tokio::time::timeout(limit, st.health.docker()).await {
        Ok(r) => r,
        Err(_) => Err("no answer within 3 s".to_string()),
    };
    let (code, status) = if db.is_ok() && docker.is_ok() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "unavailable")
    };
    let bearer = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "));
    if !st.operator.allows(q.token.as_deref().or(bearer)) {
        return answer(code, json!({ "status": status }));
    }
    let field = |r: &Result<(), String>| match r {
        Ok(()) => "ok".to_string(),
        Err(e) => e.clone(),
    };
    let body = json!({
        "status": status,
        "database": field(&db),
        "docker": field(&docker),
        "engines": st.health.engines(),
    });
    answer(code, body)
}

async fn metrics(State(st): State<HttpState>) -> Response {
    if let Ok(Ok(counts)) = tokio::time::timeout(Duration::from_secs(2), st.db.counts()).await {
        st.metrics.set_queued(counts.queued);
    }
    for e in st.health.engines() {
        st.metrics.engine(&e);
    }
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        st.metrics.render(),
    )
        .into_response()
}
