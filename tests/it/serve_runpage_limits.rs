//! The run page's cost under abuse (issue 26), against the real `kodx serve` over real
//! sockets: a 300-step run of 20,000-character `"<` outputs is shown by bounded pages with
//! the pages' headers, a live stream sends only the steps from where the page ends, live
//! streams per run and views per client are limited, and a reader that takes nothing is
//! dropped after `write_timeout_secs`. The load figures are `bench/stress.sh runpages`.

use std::time::{Duration, Instant};

use crate::common::long_run::{escaping_output, write_steps};
use crate::common::serve::{Options, Served, REPO};
use futures_util::StreamExt as _;
use tokio::io::AsyncWriteExt as _;

/// The largest page the server may send (the page's budget is 1 MiB of steps, and the
/// page may end one step past it).
const PAGE_LIMIT: usize = 1_400_000;

async fn served(settings: Option<&'static str>) -> Served {
    Served::start(Options {
        settings,
        ..Options::default()
    })
    .await
}

/// A queued run (no workers: it stays live) with `steps` steps printing `output`; the
/// path of its page.
async fn long_run(s: &Served, steps: u32, output: &str) -> String {
    s.github.add_issue(REPO, 7, "Long", "", "carol");
    let run = s.comment(7, "alice", "/kodx ask go on").await;
    write_steps(&s.db().await, &run.0, steps, output).await;
    let key = kodx::serve::runpage::RunKey::open(&s.dir.path().join("data")).unwrap();
    format!("/runs/{}?token={}", run.0, key.token(&run.0))
}

fn steps_in(page: &str) -> Vec<u32> {
    page.split("<h2>Step ")
        .skip(1)
        .map(|rest| rest[..rest.find('<').unwrap()].parse().unwrap())
        .collect()
}

fn next_link(page: &str) -> Option<String> {
    let at = page.find("\">The next steps")?;
    let start = page[..at].rfind("href=\"").unwrap() + 6;
    Some(page[start..at].replace("&amp;", "&"))
}

#[tokio::test]
async fn a_long_run_is_shown_by_bounded_pages_with_the_pages_headers() {
    let s = served(None).await;
    let page = long_run(&s, 300, &escaping_output(20_000)).await;
    let http = reqwest::Client::new();
    let mut next = Some(page.clone());
    let (mut seen, mut pages) = (Vec::new(), 0);
    while let Some(path) = next.take() {
        let r = http.get(format!("{}{path}", s.url)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        let h = r.headers().clone();
        assert_eq!(h["cache-control"], "no-store");
        assert_eq!(h["x-frame-options"], "DENY");
        let csp = h["content-security-policy"].to_str().unwrap();
        assert_eq!(
            csp,
            "default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; \
             connect-src 'self'; img-src 'self'; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'"
        );
        let body = r.text().await.unwrap();
        assert!(
            body.len() <= PAGE_LIMIT,
            "page {pages} is {} bytes ({path})",
            body.len()
        );
        seen.extend(steps_in(&body));
        next = next_link(&body);
        if next.is_none() {
            assert!(body.contains("new EventSource"), "the last page is live");
            assert!(body.contains("Spent so far: <strong class=\"cost\" id=\"spent\">$0.30"));
        } else {
            assert!(
                !body.contains("<script"),
                "only the last page follows the run"
            );
        }
        pages += 1;
    }
    assert_eq!(
        seen,
        (1..=300).collect::<Vec<_>>(),
        "every step, once, in order"
    );
    assert!((12..=40).contains(&pages), "{pages} pages");
    // A refusal carries the headers too.
    let r = http
        .get(format!("{}{}", s.url, page.replace("token=", "token=0")))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    assert_eq!(r.headers()["cache-control"], "no-store");
}

/// Reads the first event of a live stream (its whole text); the stream stays open.
async fn first_event(s: &Served, path: &str) -> (String, impl futures_util::Stream + use<>) {
    let r = reqwest::get(format!("{}{path}", s.url)).await.unwrap();
    assert_eq!(r.status(), 200, "{path}");
    let mut body = r.bytes_stream();
    let mut seen = String::new();
    tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(chunk) = body.next().await {
            seen.push_str(&String::from_utf8_lossy(&chunk.unwrap()));
            if seen.contains("\n\n") && seen.contains("event:") {
                break;
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("no event: {seen}"));
    (seen, body)
}

#[tokio::test]
async fn a_live_stream_sends_from_the_pages_end_and_a_run_has_a_few() {
    let s = served(None).await;
    let page = long_run(&s, 300, &escaping_output(20_000)).await;
    let (path, query) = page.split_once('?').unwrap();
    // Step 300 starts at record 897 (three records a step).
    let (event, _first) = first_event(&s, &format!("{path}/events?{query}&from=897")).await;
    for line in ["event: steps", "data: 897"] {
        assert!(event.lines().any(|l| l == line), "{line} not in {event}");
    }
    assert_eq!(steps_in(&event), [300], "only the last step");
    assert!(
        event.contains("data: $0.30"),
        "what the run cost so far: {event}"
    );
    assert!(event.len() < 200_000, "{} bytes", event.len());
    // At most four streams of one run at once.
    let events = format!("{}{path}/events?{query}&from=897", s.url);
    let mut open = Vec::new();
    for _ in 0..3 {
        let r = reqwest::get(&events).await.unwrap();
        assert_eq!(r.status(), 200);
        open.push(r);
    }
    let r = reqwest::get(&events).await.unwrap();
    assert_eq!(r.status(), 429, "a fifth stream of the run");
    assert!(r.headers().contains_key("retry-after"));
}

#[tokio::test]
async fn a_client_gets_a_burst_of_views_then_waits() {
    let s = served(None).await;
    let page = long_run(&s, 2, "ok").await;
    let http = reqwest::Client::new();
    let mut codes = Vec::new();
    for _ in 0..70 {
        let r = http.get(format!("{}{page}", s.url)).send().await.unwrap();
        codes.push(r.status().as_u16());
        if r.status() == 429 {
            let wait: u64 = r.headers()["retry-after"]
                .to_str()
                .unwrap()
                .parse()
                .unwrap();
            assert!((1..=5).contains(&wait), "{wait}");
            break;
        }
        r.text().await.unwrap();
    }
    assert_eq!(codes.last(), Some(&429), "{codes:?}");
    assert!(codes.len() > 30, "a reader's burst is allowed: {codes:?}");
    // /healthz and the metrics are not page views.
    assert_eq!(s.get("/metrics").await.0, 200);
}

/// How many connections the server has open, from its metrics (this request's included).
async fn open_connections(s: &Served) -> u64 {
    let (_, metrics) = s.get("/metrics").await;
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("kodx_http_connections "))
        .unwrap_or_else(|| panic!("{metrics}"))
        .trim()
        .parse()
        .unwrap()
}

#[tokio::test]
async fn a_reader_that_takes_nothing_is_dropped_after_the_write_timeout() {
    let s = served(Some("write_timeout_secs = 1.0\n")).await;
    let page = long_run(&s, 300, &escaping_output(20_000)).await;
    let before = open_connections(&s).await;
    // Pages asked for one after another on one connection, with a tiny receive buffer, and
    // nothing read: far more than the sockets' buffers hold.
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_recv_buffer_size(4096).unwrap();
    let mut c = socket
        .connect(s.url.trim_start_matches("http://").parse().unwrap())
        .await
        .unwrap();
    let pages = (0..16)
        .map(|i| format!("GET {page}&from={} HTTP/1.1\r\nHost: kodx\r\n\r\n", i * 30))
        .collect::<String>();
    c.write_all(pages.as_bytes()).await.unwrap();
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        open_connections(&s).await > before,
        "the reader is connected"
    );
    loop {
        if open_connections(&s).await <= before {
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "a reader that takes nothing still holds its connection after 15 s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(900));
    drop(c);
}
