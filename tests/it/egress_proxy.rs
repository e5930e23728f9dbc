//! kodx's egress proxy (SPEC §12, "Egress by name") on loopback: the real proxy, a real
//! upstream HTTP server, real `CONNECT` tunnels and plain HTTP through `reqwest`. Names
//! resolve through the proxy's own table, so a name can point where a test needs it:
//! an allowed name reaches its server; a name not in `network.allow` gets 403 with the line
//! to add and is recorded; an allowed name resolving to a loopback address the operator did
//! not open is refused (no DNS rebinding); an address with no registered sandbox is closed
//! unanswered.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};

use axum::{extract::Request, routing::get, Router};
use kodx::egress::{AllowList, EgressProxy, Policy, Resolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An upstream server on `ip` answering `hello from <ip>` and keeping each request's
/// headers.
async fn upstream(ip: &str) -> (SocketAddr, Arc<Mutex<Vec<Vec<String>>>>) {
    let seen: Arc<Mutex<Vec<Vec<String>>>> = Arc::default();
    let listener = tokio::net::TcpListener::bind((ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let keep = seen.clone();
    let app = Router::new().route(
        "/{*rest}",
        get(move |req: Request| {
            let keep = keep.clone();
            async move {
                keep.lock().unwrap().push(
                    req.headers()
                        .keys()
                        .map(|k| k.as_str().to_string())
                        .collect(),
                );
                format!("hello from {} {}", addr.ip(), req.uri().path())
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (addr, seen)
}

fn client(proxy: SocketAddr) -> reqwest::Client {
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .proxy(reqwest::Proxy::http(format!("http://{proxy}")).unwrap())
        .build()
        .unwrap()
}

/// Sends `CONNECT target` to the proxy, then a GET through the tunnel; the whole answer.
async fn through_tunnel(proxy: SocketAddr, target: &str) -> String {
    let mut s = tokio::net::TcpStream::connect(proxy).await.unwrap();
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut head = [0u8; 512];
    let n = s.read(&mut head).await.unwrap();
    let head = String::from_utf8_lossy(&head[..n]).to_string();
    if !head.starts_with("HTTP/1.1 200") {
        return head;
    }
    s.write_all(b"GET /tunnel HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    out
}

#[tokio::test]
async fn the_proxy_reaches_allowed_names_only_and_records_the_rest() {
    let (allowed, seen) = upstream("127.0.0.2").await;
    let (rebound, _) = upstream("127.0.0.3").await;
    let ip = |s: &str| s.parse::<IpAddr>().unwrap();
    let hosts = HashMap::from([
        ("allowed.test".to_string(), vec![ip("127.0.0.2")]),
        ("rebind.test".to_string(), vec![ip("127.0.0.3")]),
    ]);
    let proxy = EgressProxy::start("127.0.0.1:0".parse().unwrap(), Resolver::Hosts(hosts), 64)
        .await
        .unwrap();
    let allow = AllowList::parse([
        format!("allowed.test:{}", allowed.port()).as_str(),
        format!("rebind.test:{}", rebound.port()).as_str(),
    ])
    .unwrap();
    let sandbox = proxy.register(
        ip("127.0.0.1"),
        Policy {
            allow,
            // The operator opened 127.0.0.2 only.
            operator: vec!["127.0.0.2/32".parse().unwrap()],
            inject: None,
        },
    );
    let http = client(proxy.addr());

    // Plain HTTP to an allowed name: forwarded, without the proxy's own headers.
    let r = http
        .get(format!("http://allowed.test:{}/plain", allowed.port()))
        .header("proxy-authorization", "Basic c2VjcmV0")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "hello from 127.0.0.2 /plain");
    assert!(!seen.lock().unwrap()[0]
        .iter()
        .any(|h| h.starts_with("proxy-")));

    // A CONNECT tunnel to it.
    let tunnelled = through_tunnel(proxy.addr(), &format!("allowed.test:{}", allowed.port())).await;
    assert!(
        tunnelled.ends_with("hello from 127.0.0.2 /tunnel"),
        "{tunnelled}"
    );

    // Not in network.allow: 403 with the line to add, recorded with its count.
    for _ in 0..2 {
        let r = http.get("http://blocked.test/x").send().await.unwrap();
        assert_eq!(r.status(), 403);
        let body = r.text().await.unwrap();
        assert!(
            body.contains("blocked.test:80 is not in network.allow"),
            "{body}"
        );
        assert!(body.contains("add `blocked.test`"), "{body}");
    }
    let refused = through_tunnel(proxy.addr(), "elsewhere.test:8443").await;
    assert!(refused.starts_with("HTTP/1.1 403"), "{refused}");
    // The same port of an allowed name is not a different name.
    let r = http
        .get(format!("http://allowed.test:{}/", rebound.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);

    // Allowed by name, but it resolves to a loopback address the operator did not open.
    let r = http
        .get(format!("http://rebind.test:{}/", rebound.port()))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    assert!(r
        .text()
        .await
        .unwrap()
        .contains("private, loopback or link-local"));

    let blocked = sandbox.blocked();
    let summary: Vec<(String, u16, u64, Option<String>)> = blocked
        .iter()
        .map(|b| (b.host.clone(), b.port, b.count, b.suggestion.clone()))
        .collect();
    assert_eq!(
        summary,
        vec![
            (
                "allowed.test".to_string(),
                rebound.port(),
                1,
                Some(format!("allowed.test:{}", rebound.port()))
            ),
            (
                "blocked.test".to_string(),
                80,
                2,
                Some("blocked.test".into())
            ),
            (
                "elsewhere.test".to_string(),
                8443,
                1,
                Some("elsewhere.test:8443".into())
            ),
            ("rebind.test".to_string(), rebound.port(), 1, None),
        ]
    );
    assert!(blocked.iter().all(|b| b.first_ms > 0));

    // Once the sandbox is gone, its address gets nothing.
    drop(sandbox);
    let mut s = tokio::net::TcpStream::connect(proxy.addr()).await.unwrap();
    s.write_all(b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\n\r\n")
        .await
        .unwrap();
    let mut buf = Vec::new();
    let n = s.read_to_end(&mut buf).await.unwrap_or(0);
    assert_eq!(n, 0, "{}", String::from_utf8_lossy(&buf));
}
