//! `WEBHOOK_PROXY_URL`: the real `kodx serve` subscribed to a local smee.io-style channel
//! (server-sent events on loopback, one event per forwarded delivery, in smee's shape: the
//! lower-case headers and the `body` JSON). A delivery whose signature holds goes through
//! the normal intake; one whose body does not match its signature is refused loudly; a
//! dropped channel is connected again and the outage logged once. A channel that streams
//! one endless line costs kodx a bounded amount of memory while it keeps answering, and
//! one that answers and closes at once is connected to again with a growing wait.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    crate::common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(help.body, @r"
    **kodx** runs an AI agent in a sandboxed container on a copy of this repository.

    | command | what happens | who may |
    | --- | --- | --- |
    | `/kodx ask <question>` | the agent reads the code and answers here | write access (or read, if the repository allows it) |
    | `/kodx code <request>` | the agent makes the change and opens a pull request (`--base <branch>` first: from and into that branch) | write access |
    | `/kodx continue [$N \| N steps]` | resumes the code run here that a cost, step or time limit stopped, on its branch and pull request, with the repository's limit again (or `$N` / `N steps`) | write access |
    | `/kodx address-reviews [words]` | on a pull request: one run addresses every unresolved review thread, pushes, and replies in each | write access |
    | `/kodx cancel` | stops the runs on this issue or pull request | write access |
    | `/kodx update` | on a pull request kodx opened: merges its base branch into it with a merge commit (no model) | write access |
    | `/kodx go [$N]` | starts the run here that waits for a go-ahead (`confirm_above_usd`), with a cap of at most `$N` if given | write access |
    | `/kodx steer <words>` | gives your words to the run working here, at its next step | write access |
    | `/kodx help` | this message | everyone |

    The command must start a line, outside code blocks and quotes; everything after it is the request. Limits and the model are set in `.github/kodx.yml`; kodx follows the repository's `AGENTS.md` and pull request template, read from the branch the work targets. With `ci_repair`, kodx repairs red CI on the pull requests it opened; with `triggers.label`, labelling an issue starts `/kodx code`.
    "));

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
    // The same help answer as the first delivery's (snapshotted above).
    let again = s.next_bot_comment(9).await;
    assert_eq!(again.body, help.body);
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

/// `VmHWM` (peak) and `VmRSS` of `pid`, in MB.
fn memory_mb(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let field = |name: &str| {
        let line = status.lines().find(|l| l.starts_with(name)).unwrap();
        let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
        kb / 1024
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// A channel that sends `ready`, then one `data:` line without end at full speed until
/// `stop`, then ends that event and forwards what is sent on its queue.
#[derive(Clone)]
struct Flood {
    sent: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    connections: Arc<AtomicUsize>,
    queue: Arc<Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<String>>>>,
}

impl Flood {
    async fn start() -> (Flood, tokio::sync::mpsc::UnboundedSender<String>, String) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let flood = Flood {
            sent: Arc::default(),
            stop: Arc::default(),
            connections: Arc::default(),
            queue: Arc::new(Mutex::new(Some(rx))),
        };
        let f = flood.clone();
        let app = Router::new().route(
            "/AbCdEf123",
            get(move || {
                let f = f.clone();
                async move {
                    f.connections.fetch_add(1, Ordering::SeqCst);
                    let rx = f.queue.lock().unwrap().take();
                    type Chunk = Result<bytes::Bytes, std::convert::Infallible>;
                    let head = futures_util::stream::iter([Ok::<_, std::convert::Infallible>(
                        bytes::Bytes::from_static(b"event: ready\ndata: {}\n\ndata: {\"x\":\""),
                    )]);
                    let chunk = bytes::Bytes::from(vec![b'x'; 256 * 1024]);
                    let (sent, stop) = (f.sent.clone(), f.stop.clone());
                    let line = futures_util::stream::unfold((), move |()| {
                        let (sent, stop, chunk) = (sent.clone(), stop.clone(), chunk.clone());
                        async move {
                            if stop.load(Ordering::SeqCst) {
                                return None;
                            }
                            sent.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                            Some((Ok(chunk), ()))
                        }
                    });
                    let end = futures_util::stream::iter([Ok(bytes::Bytes::from_static(b"\n\n"))]);
                    let forwarded = futures_util::stream::unfold(rx, |rx| async move {
                        let mut rx = rx?;
                        let data = rx.recv().await?;
                        let event: Chunk = Ok(format!("data: {data}\n\n").into());
                        Some((event, Some(rx)))
                    });
                    (
                        [("content-type", "text/event-stream")],
                        axum::body::Body::from_stream(head.chain(line).chain(end).chain(forwarded)),
                    )
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/AbCdEf123", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
        (flood, tx, url)
    }
}

/// Issue 26 (3): the event's bound holds as the bytes arrive. One `data:` line streamed
/// without end at full speed: kodx's peak memory stays under 100 MB and `/healthz`
/// answers within 2 s throughout; once the line ends, the next delivery is taken on the
/// same connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endless_line_from_the_channel_is_skipped_in_bounded_memory() {
    endless_line(Duration::from_secs(20)).await;
}

/// The figure of issue 26 (3) for `bash bench/stress.sh proxy`: 30 s of the endless line
/// (`tests/bench/stress_proxy.rs` runs it on the release build).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a figure: bash bench/stress.sh proxy"]
async fn endless_line_figures() {
    endless_line(Duration::from_secs(30)).await;
}

async fn endless_line(flood_for: Duration) {
    let (flood, queue, url) = Flood::start().await;
    let mut s = Served::start(Options {
        workers: true,
        extra_env: vec![("WEBHOOK_PROXY_URL".into(), url)],
        ..Options::default()
    })
    .await;
    let pid = s.kodx_pid();
    s.wait_for("kodx to subscribe", WAIT, || {
        flood.connections.load(Ordering::SeqCst) == 1
    })
    .await;
    let (start_peak, _) = memory_mb(pid);
    let started = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut rss_max = 0;
    while started.elapsed() < flood_for {
        let asked = Instant::now();
        let (status, body) = tokio::time::timeout(Duration::from_secs(2), s.get("/healthz"))
            .await
            .unwrap_or_else(|_| panic!("/healthz took over 2 s\n{}", s.log()));
        assert_eq!(status, 200, "{body}");
        slowest = slowest.max(asked.elapsed());
        rss_max = rss_max.max(memory_mb(pid).1);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    flood.stop.store(true, Ordering::SeqCst);
    let sent_mb = flood.sent.load(Ordering::Relaxed) >> 20;
    let (peak, rss) = memory_mb(pid);
    eprintln!(
        "endless line for {flood_for:?}: {sent_mb} MB sent; kodx VmHWM {start_peak} MB before, {peak} MB after [target < 100 MB: {}], VmRSS max {rss_max} MB, now {rss} MB; slowest /healthz {slowest:?} [target <= 2 s: {}]",
        if peak < 100 { "ok" } else { "MISSED" },
        if slowest <= Duration::from_secs(2) { "ok" } else { "MISSED" }
    );
    assert!(peak < 100, "VmHWM {peak} MB\n{}", s.log());
    // The bound was really crossed, many times over.
    assert!(sent_mb > 200, "only {sent_mb} MB sent");
    s.wait_for("the skip to be logged", WAIT, || {
        s.log().contains("skipped 1 event(s) over")
    })
    .await;

    // The line ended: the next delivery on the same connection is taken.
    s.github.add_issue(REPO, 7, "Help", "", "carol");
    let body = help_comment(&s, 7).to_string();
    let data = format!(
        r#"{{"x-github-event":"issue_comment","x-github-delivery":"{}","x-hub-signature-256":"{}","body":{body}}}"#,
        delivery_id(),
        sign(SECRET, body.as_bytes())
    );
    queue.send(data).unwrap();
    let help = s.next_bot_comment(7).await;
    crate::common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(help.body, @r"
    **kodx** runs an AI agent in a sandboxed container on a copy of this repository.

    | command | what happens | who may |
    | --- | --- | --- |
    | `/kodx ask <question>` | the agent reads the code and answers here | write access (or read, if the repository allows it) |
    | `/kodx code <request>` | the agent makes the change and opens a pull request (`--base <branch>` first: from and into that branch) | write access |
    | `/kodx continue [$N \| N steps]` | resumes the code run here that a cost, step or time limit stopped, on its branch and pull request, with the repository's limit again (or `$N` / `N steps`) | write access |
    | `/kodx address-reviews [words]` | on a pull request: one run addresses every unresolved review thread, pushes, and replies in each | write access |
    | `/kodx cancel` | stops the runs on this issue or pull request | write access |
    | `/kodx update` | on a pull request kodx opened: merges its base branch into it with a merge commit (no model) | write access |
    | `/kodx go [$N]` | starts the run here that waits for a go-ahead (`confirm_above_usd`), with a cap of at most `$N` if given | write access |
    | `/kodx steer <words>` | gives your words to the run working here, at its next step | write access |
    | `/kodx help` | this message | everyone |

    The command must start a line, outside code blocks and quotes; everything after it is the request. Limits and the model are set in `.github/kodx.yml`; kodx follows the repository's `AGENTS.md` and pull request template, read from the branch the work targets. With `ci_repair`, kodx repairs red CI on the pull requests it opened; with `triggers.label`, labelling an issue starts `/kodx code`.
    "));
    assert_eq!(flood.connections.load(Ordering::SeqCst), 1, "{}", s.log());
    s.finish().await;
}

/// Issue 26 (3): a channel that answers and closes at once is connected to again with a
/// growing wait, not every few hundred milliseconds.
#[tokio::test]
async fn a_channel_that_closes_at_once_is_retried_with_backoff() {
    let connections = Arc::new(AtomicUsize::new(0));
    let c = connections.clone();
    let app = Router::new().route(
        "/AbCdEf123",
        get(move || {
            c.fetch_add(1, Ordering::SeqCst);
            async { ([("content-type", "text/event-stream")], "") }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/AbCdEf123", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let s = Served::start(Options {
        extra_env: vec![("WEBHOOK_PROXY_URL".into(), url)],
        ..Options::default()
    })
    .await;
    s.wait_for("kodx to connect", WAIT, || {
        connections.load(Ordering::SeqCst) >= 1
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let n = connections.load(Ordering::SeqCst);
    eprintln!("a channel that closes at once: {n} connections in ~5 s");
    // 0.5 s, 1 s, 2 s, 4 s (each plus up to half again): at most 5; every ~300 ms was ~17.
    assert!((2..=6).contains(&n), "{n} connections\n{}", s.log());
    // The outage is logged once, not once per connection.
    assert_eq!(
        s.log().matches("connecting again with backoff").count(),
        1,
        "{}",
        s.log()
    );
}
