//! `WEBHOOK_PROXY_URL`: the real `kodx serve` subscribed to a local smee.io-style channel
//! (server-sent events on loopback, one event per forwarded delivery, in smee's shape: the
//! lower-case headers and the `body` JSON). A delivery whose signature holds goes through
//! the normal intake; one whose body does not match its signature is refused loudly; a
//! dropped channel is connected again and the outage logged once.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use crate::common::serve::{
    delivery_id, issue_comment, sign, IssueComment, Options, Served, REPO, SECRET,
};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::routing::get;
use axum::Router;
use futures_util::StreamExt as _;
use serde_json::Value;
use tokio::sync::broadcast;

/// A channel: every message sent is one event to each subscriber; `close` ends the streams.
#[derive(Clone)]
struct Channel {
    events: broadcast::Sender<Option<String>>,
    connections: Arc<AtomicUsize>,
}

impl Channel {
    async fn start() -> (Channel, String) {
        let (events, _) = broadcast::channel(64);
        let channel = Channel {
            events,
            connections: Arc::new(AtomicUsize::new(0)),
        };
        let c = channel.clone();
        let app = Router::new().route(
            "/AbCdEf123",
            get(move || {
                let c = c.clone();
                async move {
                    c.connections.fetch_add(1, Ordering::SeqCst);
                    let rx = c.events.subscribe();
                    let ready = futures_util::stream::once(async {
                        Ok::<_, std::convert::Infallible>(
                            Event::default().event("ready").data("{}"),
                        )
                    });
                    // Each message an event, until `close` (or the sender goes).
                    let forwarded = futures_util::stream::unfold(rx, |mut rx| async move {
                        match rx.recv().await {
                            Ok(Some(data)) => Some((Ok(Event::default().data(data)), rx)),
                            _ => None,
                        }
                    });
                    Sse::new(ready.chain(forwarded)).keep_alive(KeepAlive::default())
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/AbCdEf123", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (channel, url)
    }

    /// Forwards a delivery as smee.io does: its headers and the body's JSON text.
    fn forward(&self, event: &str, delivery: &str, signature: &str, body_json: &str) {
        let data = format!(
            r#"{{"host":"smee.io","x-github-event":"{event}","x-github-delivery":"{delivery}","x-hub-signature-256":"{signature}","content-type":"application/json","body":{body_json},"query":{{}},"timestamp":1764000000000}}"#
        );
        self.events.send(Some(data)).expect("kodx is subscribed");
    }

    fn close(&self) {
        let _ = self.events.send(None);
    }

    fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

fn help_comment(s: &Served, issue: u64) -> Value {
    let id = s
        .github
        .add_comment(REPO, issue, "alice", "/kodx help", false);
    issue_comment(&IssueComment {
        clone_url: &s.clone_url,
        number: issue,
        comment_id: id,
        body: "/kodx help",
        ..Default::default()
    })
}

const WAIT: Duration = Duration::from_secs(30);

#[tokio::test]
async fn deliveries_through_a_proxy_channel_are_verified_and_queued() {
    let (channel, url) = Channel::start().await;
    let mut s = Served::start(Options {
        workers: true,
        extra_env: vec![("WEBHOOK_PROXY_URL".into(), url)],
        ..Options::default()
    })
    .await;
    s.wait_for("kodx to subscribe", WAIT, || channel.connections() == 1)
        .await;
    // The channel's path is its secret: never logged.
    assert!(!s.log().contains("AbCdEf123"), "{}", s.log());

    // A delivery forwarded with its body unchanged: verified and queued as a webhook is.
    s.github.add_issue(REPO, 7, "Help", "", "carol");
    let body = help_comment(&s, 7).to_string();
    channel.forward(
        "issue_comment",
        &delivery_id(),
        &sign(SECRET, body.as_bytes()),
        &body,
    );
    let help = s.next_bot_comment(7).await;
    assert!(help.body.contains("/kodx"), "{}", help.body);

    // A delivery the channel re-serialised (GitHub signed other bytes): refused, loudly.
    s.github.add_issue(REPO, 8, "Help", "", "carol");
    let payload = help_comment(&s, 8);
    let signed = serde_json::to_string_pretty(&payload).unwrap();
    channel.forward(
        "issue_comment",
        &delivery_id(),
        &sign(SECRET, signed.as_bytes()),
        &payload.to_string(),
    );
    s.wait_for("the refusal", WAIT, || {
        s.log().contains("REFUSED a forwarded delivery")
    })
    .await;
    // And one with no signature at all.
    let body = help_comment(&s, 8).to_string();
    channel.forward("issue_comment", &delivery_id(), "", &body);
    s.wait_for("the second refusal", WAIT, || {
        s.log().matches("REFUSED a forwarded delivery").count() == 2
    })
    .await;

    // The channel drops the stream: kodx connects again (the outage logged once) and
    // receives what comes next.
    channel.close();
    s.wait_for("kodx to connect again", WAIT, || channel.connections() == 2)
        .await;
    s.wait_for("the reconnection", WAIT, || {
        s.log().contains("webhook proxy channel connected again")
    })
    .await;
    assert_eq!(
        s.log().matches("connecting again with backoff").count(),
        1,
        "{}",
        s.log()
    );
    s.github.add_issue(REPO, 9, "Help", "", "carol");
    let body = help_comment(&s, 9).to_string();
    channel.forward(
        "issue_comment",
        &delivery_id(),
        &sign(SECRET, body.as_bytes()),
        &body,
    );
    let help = s.next_bot_comment(9).await;
    assert!(help.body.contains("/kodx"), "{}", help.body);
    // Nothing came of the refused deliveries (`finish` fails on any unread bot comment).
    s.finish().await;
}

#[tokio::test]
async fn an_invalid_proxy_url_is_one_clear_line() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_kodx"))
        .arg("serve")
        .env("APP_ID", "1")
        .env("PRIVATE_KEY", "x")
        .env("WEBHOOK_SECRET", "s")
        .env("WEBHOOK_PROXY_URL", "smee.io/abc")
        .env("PORT", "0")
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("WEBHOOK_PROXY_URL must be an http(s) URL"),
        "{err}"
    );
}
