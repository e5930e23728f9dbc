//! Stress figure of the egress proxy (issue 39), for `bash bench/stress.sh egress`: the
//! real proxy in this bench process, on loopback, serving one registered sandbox address
//! while it holds 1,000 idle connections (connected, nothing sent) and takes a flood of
//! 5,000 `CONNECT`s to names not allowed (each answered 403 and recorded) and 500 tunnels
//! to an allowed upstream, 200 at a time. Printed: the process's resident memory (VmRSS)
//! before and at its highest during the flood, against the target (kodx under 150 MB), and
//! how long an allowed plain request took while it all went on (target: answered within
//! 2 s, as `/healthz`).
//!
//! `serve_under_load` does the same from inside a real sandbox against the real `kodx
//! serve` (this build's binary): a `/kodx ask` whose repository sets `network.allow`, and
//! whose scripted model runs the flood in the sandbox (Python's asyncio, through the proxy
//! the sandbox's `HTTPS_PROXY` names). Printed: `kodx serve`'s resident memory (VmRSS,
//! sampled every 100 ms) before and at its highest, and the slowest `/healthz` answer
//! while the flood went on (targets: under 150 MB, within 2 s).
//!
//!     cargo test --release --test bench -- --ignored --nocapture stress_egress::

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use kodx::egress::{AllowList, EgressProxy, Policy, Resolver};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

fn rss_kb() -> u64 {
    crate::stats::vm_rss_kb(None)
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

/// The flood, run in the sandbox: 1,000 idle connections to the proxy, then 5,000
/// `CONNECT`s to names not allowed and 500 tunnels to the allowed echo upstream, 200 at a
/// time; prints what came of them.
fn in_sandbox_flood(echo_port: u16) -> String {
    format!(
        r#"python3 - <<'PY'
import asyncio, os, time
from collections import Counter
host, port = os.environ['HTTPS_PROXY'].rsplit('/', 1)[1].split(':')
port = int(port)
async def connect(target, payload=None):
    try:
        r, w = await asyncio.wait_for(asyncio.open_connection(host, port), 60)
        w.write(('CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\n' % (target, target)).encode())
        await w.drain()
        head = await asyncio.wait_for(r.readuntil(b'\r\n\r\n'), 60)
        code = head.split()[1].decode()
        if code == '200' and payload:
            w.write(payload)
            await w.drain()
            got = await asyncio.wait_for(r.readexactly(len(payload)), 60)
            code = 'echoed' if got == payload else 'garbled'
        w.close()
        return code
    except Exception as e:
        return type(e).__name__
async def main():
    t = time.time()
    idle = []
    for i in range(1000):
        try:
            idle.append((await asyncio.open_connection(host, port))[1])
        except Exception:
            pass
    print('idle connections:', len(idle), flush=True)
    sem = asyncio.Semaphore(200)
    async def limited(c):
        async with sem:
            return await c
    jobs = [limited(connect('blocked-%d.test:443' % i)) for i in range(5000)]
    jobs += [limited(connect('allowed.test:{echo_port}', b'ping\n')) for i in range(500)]
    got = Counter(await asyncio.gather(*jobs))
    print('flood:', dict(got), 'in %.1f s' % (time.time() - t), flush=True)
    for w in idle:
        w.close()
asyncio.run(main())
PY"#
    )
}

fn rss_of_kb(pid: u32) -> u64 {
    crate::stats::vm_rss_kb(Some(pid))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore]
async fn serve_under_load() {
    use crate::common::serve::{text, usage, Options, Served, REPO};
    let echo = echo_upstream().await;
    let mut s = Served::start(Options {
        workers: true,
        settings: Some(
            "network_allow = [\"127.0.0.2/32\"]\negress_resolve = { \"allowed.test\" = [\"127.0.0.2\"] }\n",
        ),
        ..Options::default()
    })
    .await;
    s.github.set_file(
        REPO,
        ".github/kodx.yml",
        &format!("network:\n  allow: [\"allowed.test:{}\"]\n", echo.port()),
    );
    s.model.reply(
        vec![
            serde_json::json!({"type": "tool_use", "id": "t1", "name": "feed_chars",
            "input": {"chars": in_sandbox_flood(echo.port()), "yield_time_ms": 290000}}),
        ],
        "tool_use",
        usage(1000, 10),
    );
    s.model.reply(text("Flooded."), "end_turn", usage(1100, 10));
    s.github.add_issue(REPO, 7, "Flood", "", "carol");
    let pid = s.kodx_pid();
    let before = rss_of_kb(pid);
    let client = reqwest::Client::new();
    let health = format!("{}/healthz", s.url);
    s.comment(7, "alice", "/kodx ask flood the proxy").await;
    let started = Instant::now();
    let (mut peak_kb, mut slowest_ms, mut answered) = (before, 0.0f64, true);
    while s.model.requests().len() < 2 && started.elapsed() < Duration::from_secs(300) {
        peak_kb = peak_kb.max(rss_of_kb(pid));
        let asked = Instant::now();
        let ok = tokio::time::timeout(Duration::from_secs(5), client.get(&health).send())
            .await
            .is_ok_and(|r| r.is_ok_and(|r| r.status().is_success()));
        answered &= ok;
        slowest_ms = slowest_ms.max(asked.elapsed().as_secs_f64() * 1000.0);
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let took = started.elapsed();
    let requests = s.model.requests();
    let seen = requests
        .get(1)
        .map(|r| r.body.to_string())
        .unwrap_or_default();
    let summary: Vec<&str> = seen
        .split("\\n")
        .filter(|l| l.starts_with("idle connections:") || l.starts_with("flood:"))
        .collect();
    println!(
        "\nkodx serve's egress proxy, flooded from a sandbox in {:.1} s: {}",
        took.as_secs_f64(),
        summary.join("; ")
    );
    println!(
        "  kodx serve RSS before {} MB, highest {} MB (target: under 150 MB: {})",
        before / 1024,
        peak_kb / 1024,
        if peak_kb < 150 * 1024 {
            "met"
        } else {
            "MISSED"
        }
    );
    println!(
        "  /healthz slowest answer {slowest_ms:.0} ms, every one answered: {answered} (target <= 2000 ms: {})",
        if answered && slowest_ms <= 2000.0 { "met" } else { "MISSED" }
    );
    let status = s.finished_status(7).await;
    assert!(
        status.contains("**The egress proxy refused these requests.**"),
        "{status}"
    );
    s.finish().await;
    assert!(summary.len() == 2, "the flood did not report: {seen}");
    assert!(peak_kb < 150 * 1024, "RSS over the target");
    assert!(
        answered && slowest_ms <= 2000.0,
        "/healthz was not answered in time"
    );
}
