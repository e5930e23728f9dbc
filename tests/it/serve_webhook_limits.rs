//! The webhook endpoint of the real `kodx serve` under senders without the secret (issue 9):
//! deadlines on heads and bodies, the size cap applied before the body is read, the budget
//! of unverified body bytes, and the connection cap below the descriptor limit. Raw TCP on
//! loopback, so a test controls exactly which bytes are sent and when.

use std::time::{Duration, Instant};

use crate::common::serve::{delivery_id, issue_comment, IssueComment, Options, Served};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn addr(s: &Served) -> String {
    s.url.trim_start_matches("http://").to_string()
}

fn ask(s: &Served, comment_id: u64) -> serde_json::Value {
    issue_comment(&IssueComment {
        clone_url: &s.clone_url,
        comment_id,
        body: "/kodx ask why?",
        ..IssueComment::default()
    })
}

/// A request head for `/webhook` with a well-formed (but wrong) signature.
fn head(content_length: usize) -> String {
    format!(
        "POST /webhook HTTP/1.1\r\nHost: kodx\r\nContent-Type: application/json\r\n\
         X-GitHub-Event: issue_comment\r\nX-GitHub-Delivery: {}\r\n\
         X-Hub-Signature-256: sha256={}\r\nContent-Length: {content_length}\r\n\r\n",
        delivery_id(),
        "ab".repeat(32)
    )
}

/// What the server sends before closing (or until `limit`): the bytes, and whether it
/// closed the connection.
async fn read_until_closed(stream: &mut TcpStream, limit: Duration) -> (String, bool) {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = Instant::now() + limit;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return (String::from_utf8_lossy(&got).into(), true),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return (String::from_utf8_lossy(&got).into(), false),
        }
    }
}

/// A connection that opens and sends nothing, or stops in the middle of its head, is
/// closed once `header_timeout_secs` passes: it cannot hold a descriptor for ever.
#[tokio::test]
async fn connections_without_a_complete_head_are_closed_after_the_header_timeout() {
    let s = Served::start(Options {
        settings: Some("header_timeout_secs = 0.5\n"),
        ..Options::default()
    })
    .await;
    let mut silent = TcpStream::connect(addr(&s)).await.unwrap();
    let mut partial = TcpStream::connect(addr(&s)).await.unwrap();
    partial
        .write_all(b"POST /webhook HTTP/1.1\r\nHost: kodx\r\nX-GitHub-Event: ping\r\n")
        .await
        .unwrap();
    let started = Instant::now();
    let (_, closed) = read_until_closed(&mut silent, Duration::from_secs(10)).await;
    assert!(closed, "an idle connection stays open after 10 s");
    let (_, closed) = read_until_closed(&mut partial, Duration::from_secs(10)).await;
    assert!(
        closed,
        "a connection with half a head stays open after 10 s"
    );
    assert!(started.elapsed() >= Duration::from_millis(400));
    // A keep-alive connection idle after its request is closed the same way.
    let mut kept = TcpStream::connect(addr(&s)).await.unwrap();
    kept.write_all(b"GET /metrics HTTP/1.1\r\nHost: kodx\r\n\r\n")
        .await
        .unwrap();
    let (answer, closed) = read_until_closed(&mut kept, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        closed,
        "an idle keep-alive connection stays open after 10 s"
    );
}

/// A body that stops arriving is answered 408 once `body_timeout_secs` passes, and its
/// connection closed.
#[tokio::test]
async fn a_body_that_stops_arriving_is_answered_408() {
    let s = Served::start(Options {
        settings: Some("body_timeout_secs = 0.5\n"),
        ..Options::default()
    })
    .await;
    let mut c = TcpStream::connect(addr(&s)).await.unwrap();
    c.write_all(head(1000).as_bytes()).await.unwrap();
    c.write_all(&[b' '; 500]).await.unwrap();
    let (answer, closed) = read_until_closed(&mut c, Duration::from_secs(10)).await;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(closed);
    let (_, metrics) = s.get("/metrics").await;
    assert!(
        metrics.contains("kodx_webhooks_total{event=\"issue_comment\",result=\"timeout\"} 1"),
        "{metrics}"
    );
}

/// A declared length over GitHub's 25 MiB cap is refused on the head: the answer comes
/// while the sender has sent no byte of the body.
#[tokio::test]
async fn a_declared_length_over_the_cap_is_refused_before_the_body_is_read() {
    let s = Served::start(Options::default()).await;
    let mut c = TcpStream::connect(addr(&s)).await.unwrap();
    c.write_all(head(25 * 1024 * 1024 + 1).as_bytes())
        .await
        .unwrap();
    let mut buf = [0u8; 512];
    let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
        .await
        .expect("kodx answers without waiting for the body")
        .unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    // A missing signature is refused on the head too.
    let mut c = TcpStream::connect(addr(&s)).await.unwrap();
    c.write_all(
        b"POST /webhook HTTP/1.1\r\nHost: kodx\r\nX-GitHub-Event: ping\r\nContent-Length: 1000000\r\n\r\n",
    )
    .await
    .unwrap();
    let n = tokio::time::timeout(Duration::from_secs(5), c.read(&mut buf))
        .await
        .expect("kodx answers without waiting for the body")
        .unwrap();
    let answer = String::from_utf8_lossy(&buf[..n]);
    assert!(answer.starts_with("HTTP/1.1 401"), "{answer}");
}

/// Unsigned senders holding big bodies open cannot pin more than `unverified_body_bytes`:
/// past it the body holding the most is answered 503 (and dropped), and a signed delivery
/// still gets through.
#[tokio::test]
async fn unverified_bodies_past_the_budget_are_refused_and_a_signed_delivery_gets_through() {
    const BUDGET: usize = 1024 * 1024;
    let s = Served::start(Options {
        settings: Some("unverified_body_bytes = 1048576\nbody_timeout_secs = 60\n"),
        ..Options::default()
    })
    .await;
    // Six senders, each declaring 600 KB and holding after 400 KB: 2.4 MB in all.
    let mut senders = Vec::new();
    let mut most_held = 0;
    for _ in 0..6 {
        let mut c = TcpStream::connect(addr(&s)).await.unwrap();
        c.write_all(head(600_000).as_bytes()).await.unwrap();
        c.write_all(&vec![b' '; 400_000]).await.unwrap();
        senders.push(c);
        let (_, metrics) = s.get("/metrics").await;
        most_held = most_held.max(gauge(&metrics, "kodx_webhook_unverified_bytes").unwrap_or(0));
    }
    // Wait for the refusals: at most two 400 KB bodies fit in 1 MiB, so four senders or
    // more get a 503 once the server has read as far as they sent.
    let refusal = |answer: &String| answer.starts_with("HTTP/1.1 503");
    let mut answers = vec![String::new(); senders.len()];
    let deadline = Instant::now() + Duration::from_secs(10);
    while answers.iter().filter(|a| refusal(a)).count() < 4 && Instant::now() < deadline {
        for (c, answer) in senders.iter_mut().zip(&mut answers) {
            if !refusal(answer) {
                answer.push_str(&read_until_closed(c, Duration::from_millis(20)).await.0);
            }
        }
    }
    // The others, held, get no answer meanwhile.
    let mut refused = 0;
    for (c, answer) in senders.iter_mut().zip(&mut answers) {
        if !refusal(answer) {
            answer.push_str(&read_until_closed(c, Duration::from_millis(200)).await.0);
        }
        if refusal(answer) {
            refused += 1;
        } else {
            assert_eq!(answer, "", "a held body gets no answer yet");
        }
    }
    assert!(
        refused >= 4,
        "at most two 400 KB bodies fit in 1 MiB: {refused} refused"
    );
    assert!(most_held <= BUDGET as u64, "{most_held} bytes held");
    let (status, answer) = s
        .deliver("issue_comment", &delivery_id(), &ask(&s, 21))
        .await;
    assert_eq!(status, 202, "{answer}");
    let (_, metrics) = s.get("/metrics").await;
    let held = gauge(&metrics, "kodx_webhook_unverified_bytes").expect("the gauge is exported");
    assert!(held <= BUDGET as u64, "{held}");
    assert!(
        metrics.contains("kodx_webhooks_total{event=\"issue_comment\",result=\"busy\"}"),
        "{metrics}"
    );
}

/// A gauge's value, if the server has it.
fn gauge(metrics: &str, name: &str) -> Option<u64> {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{name} ")))
        .and_then(|v| v.trim().parse().ok())
}

/// More idle connections than the server has descriptors for: new connections replace
/// the oldest idle ones, `accept` never runs out of descriptors, `/healthz` answers and a
/// signed delivery is queued.
#[tokio::test]
async fn a_connection_flood_past_the_descriptor_limit_does_not_starve_the_endpoint() {
    let s = Served::start(Options {
        fd_limit: Some(256),
        ..Options::default()
    })
    .await;
    let mut idle = Vec::new();
    for _ in 0..400 {
        idle.push(TcpStream::connect(addr(&s)).await.unwrap());
    }
    // The flood is in; the endpoint still answers (how fast: tests/bench/stress_webhook.rs).
    let (status, _) = tokio::time::timeout(Duration::from_secs(10), s.get("/healthz"))
        .await
        .expect("/healthz answers during the flood");
    assert!(status == 200 || status == 503, "{status}");
    let (status, answer) = tokio::time::timeout(
        Duration::from_secs(10),
        s.deliver("issue_comment", &delivery_id(), &ask(&s, 22)),
    )
    .await
    .expect("a signed delivery is answered during the flood");
    assert_eq!(status, 202, "{answer}");
    let (_, metrics) = s.get("/metrics").await;
    let open = gauge(&metrics, "kodx_http_connections").expect("the gauge is exported");
    assert!(
        open <= 128,
        "{open} connections open under a limit of 256 descriptors"
    );
    assert!(!s.log().contains("Too many open files"), "{}", s.log());
    drop(idle);
}
