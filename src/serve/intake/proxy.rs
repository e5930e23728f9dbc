//! `WEBHOOK_PROXY_URL` (Probot's name): webhooks through a smee.io channel, for a server
//! GitHub cannot reach (a laptop behind NAT). The App's webhook URL is the channel; kodx
//! subscribes to it (server-sent events) and feeds every forwarded delivery through the
//! same intake as the webhook endpoint, after verifying its signature exactly as there.
//!
//! A channel forwards each delivery as one event whose data is JSON: the request's headers
//! (lower-case names) and `body`. smee.io parses the body and serialises it again, so the
//! signature, made over GitHub's bytes, is checked over the `body` text exactly as the
//! channel sent it; when the channel's serialisation differs from GitHub's, the check fails
//! and the delivery is refused, loudly — signature checks are never turned off.
//!
//! Bounded: one event's bytes are capped (GitHub's 25 MiB body and its headers) as they
//! arrive, before anything parses them ([`sse`]): a longer event is skipped, never held.
//! Every reconnection waits (exponential backoff with jitter, capped); the wait starts
//! from its base again only after a connection that stayed up, so a channel that answers
//! and closes at once is not hammered. An outage is logged once.

use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::serve::intake::http::{intake, HttpState, MAX_BODY_BYTES};
use crate::serve::intake::sse;

/// The most bytes one forwarded event may take (the body and the headers around it).
const MAX_EVENT_BYTES: usize = MAX_BODY_BYTES + (1 << 20);

/// The first wait before connecting again, and the longest.
const BACKOFF_BASE: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

/// A connection that stayed up this long was a healthy one: the backoff starts over.
const HEALTHY: Duration = Duration::from_secs(30);

/// A connection silent this long (not even a keep-alive) is given up.
const SILENCE: Duration = Duration::from_secs(120);

/// Skipped over-long events are logged at most this often (with how many there were).
const SKIP_LOG_EVERY: Duration = Duration::from_secs(60);

/// A delivery as a channel forwards it.
#[derive(Deserialize)]
struct Forwarded<'a> {
    #[serde(rename = "x-github-event")]
    event: Option<String>,
    #[serde(rename = "x-github-delivery")]
    delivery: Option<String>,
    #[serde(rename = "x-hub-signature-256")]
    signature: Option<String>,
    /// The body's JSON text, byte for byte as the channel sent it.
    #[serde(borrow)]
    body: Option<&'a serde_json::value::RawValue>,
}

/// Receives deliveries from the channel at `url` until `shutdown`.
pub async fn forward(url: String, st: HttpState, shutdown: CancellationToken) {
    let client = match reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .build()
    {
        Ok(c) => c,
        Err(e) => {
            tracing::error!("the webhook proxy client could not be built: {e}");
            return;
        }
    };
    let shown = shown_url(&url);
    let mut failures: u32 = 0;
    // Since when the channel is down, and whether that was said (once per outage, and a
    // channel that answers and closes at once is one outage until a connection holds).
    let mut outage: Option<Instant> = None;
    let mut said_down = false;
    let mut said_back = false;
    loop {
        let mut up_since: Option<Instant> = None;
        let mut connected = || {
            match outage.take() {
                Some(since) if !said_back => {
                    tracing::info!(channel = %shown, "webhook proxy channel connected again after {:.0?}", since.elapsed());
                    said_back = true;
                }
                Some(_) => {
                    tracing::debug!(channel = %shown, "webhook proxy channel connected again")
                }
                None => {
                    tracing::info!(channel = %shown, "receiving webhooks from the proxy channel")
                }
            }
            up_since = Some(Instant::now());
        };
        let ended = tokio::select! {
            ended = receive(&client, &url, &st, &mut connected) => ended,
            _ = shutdown.cancelled() => return,
        };
        // Only a connection that stayed up resets the backoff: one that is answered and
        // closed at once counts as a failure like one refused.
        if up_since.is_some_and(|t| t.elapsed() >= HEALTHY) {
            failures = 0;
            (said_down, said_back) = (false, false);
        }
        failures = failures.saturating_add(1);
        let wait = crate::backoff::delay(BACKOFF_BASE, BACKOFF_MAX, failures);
        if !said_down {
            tracing::warn!(channel = %shown, "webhook proxy channel: {ended}; connecting again with backoff (logged once until it is back)");
            said_down = true;
        } else {
            tracing::debug!(channel = %shown, "webhook proxy channel: {ended}; connecting again in {wait:.1?}");
        }
        outage.get_or_insert_with(Instant::now);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = shutdown.cancelled() => return,
        }
    }
}

/// One connection to the channel: delivers its events until it ends; returns why.
async fn receive(
    client: &reqwest::Client,
    url: &str,
    st: &HttpState,
    connected: &mut (dyn FnMut() + Send),
) -> String {
    let response = match client
        .get(url)
        .header("accept", "text/event-stream")
        .send()
        .await
    {
        Ok(r) => r,
        Err(e) => return format!("cannot connect: {e}"),
    };
    if !response.status().is_success() {
        return format!("the channel answered {}", response.status());
    }
    connected();
    let mut bytes = response.bytes_stream();
    let mut reader = sse::Reader::new(MAX_EVENT_BYTES);
    let mut frames = Vec::new();
    let mut skipped = SkipLog::default();
    loop {
        let chunk = match tokio::time::timeout(SILENCE, bytes.next()).await {
            Err(_) => return format!("nothing came for {} s", SILENCE.as_secs()),
            Ok(None) => return "the channel closed the stream".into(),
            Ok(Some(Err(e))) => return format!("the stream broke: {e}"),
            Ok(Some(Ok(chunk))) => chunk,
        };
        reader.push(&chunk, &mut frames);
        for frame in frames.drain(..) {
            match frame {
                sse::Frame::TooLarge => skipped.one(),
                // smee.io also sends `ready` and `ping` events; deliveries are plain messages.
                sse::Frame::Event { event, data } if event == "message" && !data.is_empty() => {
                    deliver(st, &data).await
                }
                sse::Frame::Event { .. } => {}
            }
        }
    }
}

/// Over-long events skipped, logged at most once per [`SKIP_LOG_EVERY`].
#[derive(Default)]
struct SkipLog {
    unlogged: u64,
    logged_at: Option<Instant>,
}

impl SkipLog {
    fn one(&mut self) {
        self.unlogged += 1;
        if self.logged_at.is_some_and(|t| t.elapsed() < SKIP_LOG_EVERY) {
            return;
        }
        tracing::warn!(
            "webhook proxy: skipped {} event(s) over {MAX_EVENT_BYTES} bytes without reading them (GitHub sends no larger delivery)",
            self.unlogged
        );
        self.unlogged = 0;
        self.logged_at = Some(Instant::now());
    }
}

/// Verifies one forwarded delivery and passes it to the intake.
async fn deliver(st: &HttpState, data: &[u8]) {
    let forwarded: Forwarded = match serde_json::from_slice(data) {
        Ok(f) => f,
        Err(e) => {
            tracing::warn!(
                "webhook proxy: an event that is not a forwarded delivery was ignored: {e}"
            );
            return;
        }
    };
    let event = forwarded.event.as_deref().unwrap_or("").trim();
    let delivery = forwarded.delivery.as_deref().unwrap_or("");
    let Some(body) = forwarded.body else {
        st.metrics.webhook(event, "bad_request");
        tracing::warn!(
            event,
            delivery,
            "webhook proxy: a forwarded delivery without a body was ignored"
        );
        return;
    };
    let body = body.get().as_bytes();
    if let Err(e) = st.secrets.verify(forwarded.signature.as_deref(), body) {
        st.metrics.webhook(event, "unauthorized");
        tracing::error!(
            event,
            delivery,
            "webhook proxy: REFUSED a forwarded delivery: {e}. Either it was not sent by GitHub with this App's secret, or the channel re-serialised its JSON body (smee.io parses and re-encodes it, which can change its bytes); kodx never accepts a delivery it cannot verify. Point the App's webhook at kodx directly (KODX_PUBLIC_URL) or use a channel that forwards the body unchanged."
        );
        return;
    }
    let answer = intake(st, event, Some(delivery), body).await;
    tracing::info!(
        event,
        delivery,
        status = answer.status().as_u16(),
        "webhook proxy: delivery received"
    );
}

/// The channel's URL without its path: the path is the channel's only secret.
fn shown_url(url: &str) -> String {
    match reqwest::Url::parse(url) {
        Ok(u) => format!("{}://{}/…", u.scheme(), u.host_str().unwrap_or("?")),
        Err(_) => "(invalid URL)".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_channel_is_never_shown_whole() {
        assert_eq!(shown_url("https://smee.io/AbCdEf123"), "https://smee.io/…");
    }

    #[test]
    fn a_forwarded_body_keeps_its_bytes() {
        let data = r#"{"x-github-event":"issue_comment","x-github-delivery":"d1","x-hub-signature-256":"sha256=00","body":{"b":1,"a":"x\u00e9"},"query":{},"timestamp":1}"#;
        let f: Forwarded = serde_json::from_str(data).unwrap();
        assert_eq!(f.event.as_deref(), Some("issue_comment"));
        assert_eq!(f.body.unwrap().get(), r#"{"b":1,"a":"x\u00e9"}"#);
    }
}
