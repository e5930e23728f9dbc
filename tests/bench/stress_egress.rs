//! Stress figure of the egress proxy (issue 39), for `bash bench/stress.sh egress`: the
//! real proxy in this bench process, on loopback, serving one registered sandbox address
//! while it holds 1,000 idle connections (connected, nothing sent) and takes a flood of
//! 5,000 `CONNECT`s to names not allowed (each answered 403 and recorded) and 500 tunnels
//! to an allowed upstream, 200 at a time. Printed: the process's resident memory (VmRSS)
//! before and at its highest during the flood, against the target (kodx under 150 MB), and
//! how long an allowed plain request took while it all went on (target: answered within
//! 2 s, as `/healthz`).
//!
//! The proxy is not yet started by `kodx serve` (issue 39's wiring is left), so the figure is
//! the bench process's, which holds nothing else of weight.
//!
//!     cargo test --release --test bench -- --ignored --nocapture stress_egress::

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use kodx::egress::{AllowList, EgressProxy, Policy, Resolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn rss_kb() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

/// An upstream that answers every line it reads with the line, until the peer closes.
async fn echo_upstream() -> SocketAddr {
    let l = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else {
                return;
            };
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n) = s.read(&mut buf).await {
                    if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    addr
}

async fn connect_line(proxy: SocketAddr, target: &str) -> Option<(TcpStream, String)> {
    let mut s = TcpStream::connect(proxy).await.ok()?;
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes())
        .await
        .ok()?;
    let mut head = vec![0u8; 256];
    let n = s.read(&mut head).await.ok()?;
    Some((
        s,
        String::from_utf8_lossy(&head[..n])
            .lines()
            .next()?
            .to_string(),
    ))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn egress_proxy_under_load() {
    let echo = echo_upstream().await;
    let hosts = HashMap::from([(
        "allowed.test".to_string(),
        vec!["127.0.0.2".parse::<IpAddr>().unwrap()],
    )]);
    let proxy = EgressProxy::start("127.0.0.1:0".parse().unwrap(), Resolver::Hosts(hosts), 4096)
        .await
        .unwrap();
    let addr = proxy.addr();
    let _sandbox = proxy.register(
        "127.0.0.1".parse().unwrap(),
        Policy {
            allow: AllowList::parse([format!("allowed.test:{}", echo.port()).as_str()]).unwrap(),
            operator: vec!["127.0.0.2/32".parse().unwrap()],
            inject: None,
        },
    );
    let before = rss_kb();
    let mut idle = Vec::new();
    for _ in 0..1000 {
        idle.push(TcpStream::connect(addr).await.unwrap());
    }
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(rss_kb()));
    let sampler = {
        let peak = peak.clone();
        tokio::spawn(async move {
            loop {
                peak.fetch_max(rss_kb(), std::sync::atomic::Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        })
    };
    let started = Instant::now();
    let flood = tokio::spawn(async move {
        let mut refused = 0usize;
        for wave in 0..25 {
            let mut tasks = Vec::new();
            for i in 0..200 {
                tasks.push(tokio::spawn(async move {
                    connect_line(addr, &format!("blocked-{wave}-{i}.test:443")).await
                }));
            }
            for t in tasks {
                if let Ok(Some((_, line))) = t.await {
                    refused += usize::from(line.contains("403"));
                }
            }
        }
        refused
    });
    let tunnels = tokio::spawn(async move {
        let mut open = Vec::new();
        for _ in 0..500 {
            if let Some((s, line)) =
                connect_line(addr, &format!("allowed.test:{}", echo.port())).await
            {
                if line.contains("200") {
                    open.push(s);
                }
            }
        }
        let mut echoed = 0usize;
        for s in open.iter_mut() {
            let mut buf = [0u8; 8];
            if s.write_all(b"ping\n").await.is_ok() && s.read(&mut buf).await.is_ok_and(|n| n == 5)
            {
                echoed += 1;
            }
        }
        echoed
    });
    // An allowed plain request while the flood goes on.
    tokio::time::sleep(Duration::from_millis(100)).await;
    let asked = Instant::now();
    let answered = tokio::time::timeout(
        Duration::from_secs(10),
        connect_line(addr, &format!("allowed.test:{}", echo.port())),
    )
    .await
    .ok()
    .flatten()
    .is_some_and(|(_, line)| line.contains("200"));
    let answer_ms = asked.elapsed().as_secs_f64() * 1000.0;
    let refused = flood.await.unwrap();
    let echoed = tunnels.await.unwrap();
    let took = started.elapsed();
    sampler.abort();
    let peak_kb = peak
        .load(std::sync::atomic::Ordering::Relaxed)
        .max(rss_kb());
    println!(
        "\negress proxy: 1,000 idle connections, 5,000 refused CONNECTs ({refused} answered 403) and 500 tunnels ({echoed} echoed) in {:.1} s",
        took.as_secs_f64()
    );
    println!(
        "  RSS before {} MB, highest {} MB (target: kodx under 150 MB: {})",
        before / 1024,
        peak_kb / 1024,
        if peak_kb < 150 * 1024 {
            "met"
        } else {
            "MISSED"
        }
    );
    println!(
        "  an allowed CONNECT during the flood answered in {answer_ms:.1} ms (target <= 2000 ms: {})",
        if answered && answer_ms <= 2000.0 {
            "met"
        } else {
            "MISSED"
        }
    );
    drop(idle);
    assert!(peak_kb < 150 * 1024, "RSS over the target");
    assert!(
        answered && answer_ms <= 2000.0,
        "the allowed CONNECT was not answered in time"
    );
    assert_eq!(refused, 5000, "every refused CONNECT answered 403");
}
