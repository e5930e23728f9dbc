//! A listener on the host and probes run in a sandbox, for the network fence's tests.

use std::net::Ipv4Addr;

use kodx::sandbox::Engine;

/// A TCP listener on every address of the host (`0.0.0.0`, a random port) that answers
/// each connection with a line. Returns the port and the task serving it.
pub async fn host_listener() -> (u16, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind(("0.0.0.0", 0)).await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut s, _)) = listener.accept().await {
            let _ = s.write_all(b"HTTP/1.0 200 OK\r\n\r\nreachable").await;
        }
    });
    (port, task)
}

/// The subnet of kodx's sandbox network (made if missing).
#[allow(dead_code)]
pub async fn sandbox_subnet(engine: &Engine) -> kodx::sandbox::Cidr {
    sandbox_gateway(engine).await;
    let net = engine
        .docker()
        .inspect_network(kodx::sandbox::net::NETWORK_NAME, None)
        .await
        .unwrap();
    net.ipam.unwrap().config.unwrap()[0]
        .subnet
        .clone()
        .unwrap()
        .parse()
        .unwrap()
}

/// The gateway of kodx's sandbox network (made if missing): the host, as sandboxes see it.
pub async fn sandbox_gateway(engine: &Engine) -> Ipv4Addr {
    engine
        .ensure_network(None)
        .await
        .expect("the sandbox network");
    let net = engine
        .docker()
        .inspect_network(kodx::sandbox::net::NETWORK_NAME, None)
        .await
        .unwrap();
    let config = net
        .ipam
        .and_then(|i| i.config)
        .and_then(|c| c.into_iter().next())
        .expect("the network's IPAM config");
    match config.gateway {
        Some(g) if !g.is_empty() => g.parse().unwrap(),
        _ => {
            // Older engines list only the subnet; the gateway is its first address.
            let subnet = config.subnet.expect("subnet");
            let base: Ipv4Addr = subnet.split('/').next().unwrap().parse().unwrap();
            Ipv4Addr::from(u32::from(base) + 1)
        }
    }
}

/// The host's own IPv4 addresses besides loopback (the engine runs on this host in tests).
pub fn host_addresses() -> Vec<Ipv4Addr> {
    let out = std::process::Command::new("hostname")
        .arg("-I")
        .output()
        .expect("hostname -I");
    let mut v: Vec<Ipv4Addr> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .filter_map(|a| a.parse().ok())
        .filter(|a: &Ipv4Addr| !a.is_loopback())
        .collect();
    v.sort();
    v.dedup();
    v
}

/// A shell command that tries a TCP connection to each of `hosts` on `port` (3 s timeout)
/// and prints one line each: `<host> ok <ms>` or `<host> err <errno> <ms>`.
pub fn probe(port: u16, hosts: &[String]) -> String {
    format!(
        "python3 -c \"exec('import socket,sys,time\\nfor h in sys.argv[2:]:\\n t=time.monotonic()\\n try:\\n  socket.create_connection((h,int(sys.argv[1])),timeout=3).close(); r=\\'ok\\'\\n except OSError as e:\\n  r=\\'err %s\\' % e.errno\\n print(h,r,int((time.monotonic()-t)*1000))')\" {port} {}",
        hosts.join(" ")
    )
}

/// One line of `probe`: `Ok(ms)` or `Err((errno, ms))`.
pub type Probed = Result<u64, (String, u64)>;

/// What `probe` printed: `(host, Ok(ms))` or `(host, Err((errno, ms)))`.
pub fn probed(output: &str) -> Vec<(String, Probed)> {
    output
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            match f.as_slice() {
                [h, "ok", ms] => Some((h.to_string(), Ok(ms.parse().ok()?))),
                [h, "err", errno, ms] => {
                    Some((h.to_string(), Err((errno.to_string(), ms.parse().ok()?))))
                }
                _ => None,
            }
        })
        .collect()
}

/// errno of "No route to host": what the fence's unreachable routes answer at once.
pub const EHOSTUNREACH: &str = "113";
