//! kodx's egress proxy (SPEC §12, "Egress by name"): one per process, serving every
//! sandbox. A sandbox is known by its address: while its run lasts it is registered with
//! its repository's `network.allow` and the operator's `network_allow` ranges
//! ([`EgressProxy::register`]); a connection from any other address is closed unanswered.
//!
//! It tunnels `CONNECT host:port` and forwards plain HTTP (absolute-form requests) only to
//! allowed names. It resolves a name itself and connects to the addresses it got, in order,
//! skipping every private, loopback, link-local, multicast or reserved one unless the
//! operator's ranges include it: a name cannot lead a sandbox into the host or another
//! sandbox (no DNS rebinding, since the address checked is the one connected to).
//! Everything else gets `403` with the line to add, and is recorded for the run's
//! reports: host, port, count, first time (at most [`MAX_BLOCKED`] distinct ones).
//!
//! A sandbox whose policy has an [`Injector`] (secrets injected on the wire,
//! [`super::inject`]) also reaches the hosts its secrets' `hosts:` name; its `CONNECT`
//! tunnels are read inside their TLS ([`super::intercept`]) and its plain HTTP requests
//! have their placeholders replaced, or are refused, before anything is sent upstream.
//!
//! Bounds: at most `max_connections` connections at once (more wait in the kernel's
//! backlog), a request head read within 10 s and at most 16 KiB, each upstream connect
//! within 5 s and each resolution within 5 s.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use parking_lot::Mutex;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use super::allow::{normalize_host, AllowList, AllowRule};
use super::inject::Injector;
use super::intercept;
use super::reply::{empty, text, Body, CONNECT_TIMEOUT, HEADER_TIMEOUT, MAX_HEAD_BYTES};

/// The most distinct blocked `(host, port)` a run records.
pub const MAX_BLOCKED: usize = 100;
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(5);

/// How names are resolved: the system's resolver, or a fixed table (tests, and operators
/// who pin names).
#[derive(Debug, Clone, Default)]
pub enum Resolver {
    #[default]
    System,
    Hosts(HashMap<String, Vec<IpAddr>>),
    /// These names as the table says, every other one through the system's resolver (the
    /// server's `egress_resolve`).
    Pinned(HashMap<String, Vec<IpAddr>>),
}

impl Resolver {
    async fn lookup(&self, host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
        match self {
            Resolver::Pinned(table) if table.contains_key(host) => {
                Box::pin(Resolver::Hosts(table.clone()).lookup(host, port)).await
            }
            Resolver::System | Resolver::Pinned(_) => {
                let found = tokio::time::timeout(
                    RESOLVE_TIMEOUT,
                    tokio::net::lookup_host((host.to_string(), port)),
                )
                .await
                .map_err(|_| std::io::Error::other("the name did not resolve within 5 s"))??;
                Ok(found.collect())
            }
            Resolver::Hosts(table) => Ok(table
                .get(host)
                .map(|ips| ips.iter().map(|ip| SocketAddr::new(*ip, port)).collect())
                .unwrap_or_default()),
        }
    }
}

/// What one sandbox may reach.
#[derive(Debug, Clone, Default)]
pub struct Policy {
    /// The repository's `network.allow`.
    pub allow: AllowList,
    /// The operator's `network_allow` ranges: addresses in them are reachable although
    /// private.
    pub operator: Vec<ipnet::IpNet>,
    /// The run's secrets injected on the wire. Naming a host in a secret's `hosts:`
    /// allows it, as if `network.allow` named it; with an injector every `CONNECT` whose
    /// client speaks TLS is terminated by the proxy (the sandbox trusts the run's CA) so
    /// that placeholders are replaced for their hosts and refused everywhere else.
    pub inject: Option<Arc<Injector>>,
}

impl Policy {
    /// Whether `host:port` may be reached by name.
    fn allows(&self, host: &str, port: u16) -> bool {
        self.allow.allows(host, port) || self.inject.as_ref().is_some_and(|i| i.allows(host, port))
    }
}

/// A request the proxy refused.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Blocked {
    pub host: String,
    pub port: u16,
    pub count: u64,
    /// Unix milliseconds of the first one.
    pub first_ms: i64,
    /// Why, in a few words.
    pub why: String,
    /// The `network.allow` entry that would allow it (none when the name is allowed but
    /// resolves only to addresses a sandbox never reaches).
    pub suggestion: Option<String>,
}

struct Entry {
    policy: Policy,
    blocked: Mutex<BTreeMap<(String, u16), Blocked>>,
}

impl Entry {
    fn block(&self, host: &str, port: u16, why: &str, suggest: bool) {
        let mut blocked = self.blocked.lock();
        let key = (host.to_string(), port);
        if let Some(b) = blocked.get_mut(&key) {
            b.count = b.count.saturating_add(1);
            return;
        }
        if blocked.len() >= MAX_BLOCKED {
            return;
        }
        let first_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as i64)
            .unwrap_or_default();
        blocked.insert(
            key,
            Blocked {
                host: host.to_string(),
                port,
                count: 1,
                first_ms,
                why: why.to_string(),
                suggestion: suggest.then(|| AllowRule::suggestion(host, port)),
            },
        );
    }
}

type Registry = Arc<Mutex<HashMap<IpAddr, Arc<Entry>>>>;

/// The proxy: its address, and the sandboxes it serves.
#[derive(Clone)]
pub struct EgressProxy {
    addr: SocketAddr,
    registry: Registry,
}

/// A sandbox's place at the proxy, for as long as it is kept.
pub struct Registration {
    ip: IpAddr,
    entry: Arc<Entry>,
    registry: Registry,
}

impl Registration {
    /// What was refused so far, in the order of host and port.
    pub fn blocked(&self) -> Vec<Blocked> {
        self.entry.blocked.lock().values().cloned().collect()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut reg = self.registry.lock();
        if reg
            .get(&self.ip)
            .is_some_and(|e| Arc::ptr_eq(e, &self.entry))
        {
            reg.remove(&self.ip);
        }
    }
}

impl EgressProxy {
    /// Listens on `addr` and serves until the process ends.
    pub async fn start(
        addr: SocketAddr,
        resolver: Resolver,
        max_connections: usize,
    ) -> std::io::Result<EgressProxy> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let registry: Registry = Arc::default();
        let shared = Arc::new(Shared {
            registry: registry.clone(),
            resolver,
        });
        let slots = Arc::new(Semaphore::new(max_connections.max(1)));
        tokio::spawn(async move {
            loop {
                let Ok(permit) = slots.clone().acquire_owned().await else {
                    return;
                };
                let (stream, peer) = match listener.accept().await {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        tracing::warn!("the egress proxy could not accept a connection: {e}");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                };
                let shared = shared.clone();
                tokio::spawn(async move {
                    shared.connection(stream, peer).await;
                    drop(permit);
                });
            }
        });
        Ok(EgressProxy { addr, registry })
    }

    /// The address the proxy listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Serves the sandbox at `ip` with `policy` until the registration is dropped (a
    /// second registration of the same address replaces the first).
    pub fn register(&self, ip: IpAddr, policy: Policy) -> Registration {
        let entry = Arc::new(Entry {
            policy,
            blocked: Mutex::default(),
        });
        self.registry.lock().insert(ip, entry.clone());
        Registration {
            ip,
            entry,
            registry: self.registry.clone(),
        }
    }
}

struct Shared {
    registry: Registry,
    resolver: Resolver,
}

impl Shared {
    async fn connection(self: Arc<Self>, stream: TcpStream, peer: SocketAddr) {
        // An address no sandbox has: closed unanswered.
        let Some(entry) = self.registry.lock().get(&peer.ip()).cloned() else {
            tracing::debug!(%peer, "egress proxy: a connection from no sandbox, closed");
            return;
        };
        let tunnels: Arc<Mutex<Vec<tokio::task::JoinHandle<()>>>> = Arc::default();
        let service = {
            let (shared, tunnels) = (self.clone(), tunnels.clone());
            hyper::service::service_fn(move |req| {
                let (shared, entry, tunnels) = (shared.clone(), entry.clone(), tunnels.clone());
                async move { Ok::<_, Infallible>(shared.serve(req, entry, &tunnels).await) }
            })
        };
        let conn = hyper::server::conn::http1::Builder::new()
            .timer(hyper_util::rt::TokioTimer::new())
            .header_read_timeout(HEADER_TIMEOUT)
            .max_buf_size(MAX_HEAD_BYTES)
            .serve_connection(TokioIo::new(stream), service)
            .with_upgrades();
        if let Err(e) = conn.await {
            tracing::debug!(%peer, "egress proxy connection ended: {e}");
        }
        // A tunnel outlives the HTTP exchange: the connection's slot is held until it ends.
        let open: Vec<_> = std::mem::take(&mut *tunnels.lock());
        for t in open {
            let _ = t.await;
        }
    }

    async fn serve(
        self: Arc<Self>,
        mut req: Request<Incoming>,
        entry: Arc<Entry>,
        tunnels: &Mutex<Vec<tokio::task::JoinHandle<()>>>,
    ) -> Response<Body> {
        let connect = req.method() == Method::CONNECT;
        let target = if connect {
            req.uri()
                .authority()
                .map(|a| (a.host().to_string(), a.port_u16().unwrap_or(443)))
        } else if req.uri().scheme_str() == Some("http") {
            req.uri()
                .authority()
                .map(|a| (a.host().to_string(), a.port_u16().unwrap_or(80)))
        } else {
            None
        };
        let Some((host, port)) = target else {
            return text(
                StatusCode::BAD_REQUEST,
                "kodx egress proxy: send `CONNECT host:port`, or a plain HTTP request with an absolute http:// URL\n",
            );
        };
        let host = normalize_host(&host);
        let inject = entry.policy.inject.clone();
        if let (false, Some(injector)) = (connect, &inject) {
            // Plain HTTP: placeholders replaced, or the request refused before anything is
            // sent (a name not allowed at all is refused as such by `open`).
            if entry.policy.allows(&host, port) {
                let target = req
                    .uri()
                    .path_and_query()
                    .map(|p| p.as_str().to_string())
                    .unwrap_or_default();
                if let Err(refused) = injector.apply(&host, port, &target, req.headers_mut()) {
                    entry.block(&host, port, &refused.why, false);
                    return text(StatusCode::FORBIDDEN, &refused.message(&host, port));
                }
            }
        }
        let upstream = match self.open(&entry, &host, port).await {
            Ok(s) => s,
            Err(refused) => return refused,
        };
        if !connect {
            let mut answer = forward(req, upstream).await;
            if let Some(injector) = &inject {
                injector.scrub(answer.headers_mut());
            }
            return answer;
        }
        let on = hyper::upgrade::on(req);
        let tunnel = inject.map(|injector| self.tunnel(injector, &entry, &host, port));
        tunnels.lock().push(tokio::spawn(async move {
            match (on.await, tunnel) {
                (Ok(upgraded), Some(tunnel)) => intercept::serve(tunnel, upgraded, upstream).await,
                (Ok(upgraded), None) => {
                    let mut client = TokioIo::new(upgraded);
                    let mut upstream = upstream;
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                }
                (Err(e), _) => tracing::debug!("egress proxy: the tunnel did not open: {e}"),
            }
        }));
        Response::new(empty())
    }

    /// What an intercepted tunnel to `host:port` needs of the proxy: another connection
    /// through the same checks, and the record of what it refused.
    fn tunnel(
        self: &Arc<Self>,
        injector: Arc<Injector>,
        entry: &Arc<Entry>,
        host: &str,
        port: u16,
    ) -> intercept::Tunnel {
        let (shared, at, name) = (self.clone(), entry.clone(), host.to_string());
        let reconnect: intercept::Reconnect = Arc::new(move || {
            let (shared, entry, host) = (shared.clone(), at.clone(), name.clone());
            Box::pin(async move { shared.open(&entry, &host, port).await })
        });
        let (at, name) = (entry.clone(), host.to_string());
        let record: intercept::Record = Arc::new(move |why| at.block(&name, port, why, false));
        intercept::Tunnel {
            injector,
            host: host.to_string(),
            port,
            reconnect,
            record,
        }
    }

    /// Decides and connects: the upstream stream, or the refusal to answer (recorded).
    async fn open(
        &self,
        entry: &Entry,
        host: &str,
        port: u16,
    ) -> Result<TcpStream, Response<Body>> {
        let policy = &entry.policy;
        if !policy.allows(host, port) {
            entry.block(host, port, "not in network.allow", true);
            return Err(text(
                StatusCode::FORBIDDEN,
                &format!(
                    "kodx egress proxy: {host}:{port} is not in network.allow of .github/kodx.yml; \
                     a maintainer can add `{}` there\n",
                    AllowRule::suggestion(host, port)
                ),
            ));
        }
        let addrs = match host.parse::<IpAddr>() {
            Ok(ip) => vec![SocketAddr::new(ip, port)],
            Err(_) => match self.resolver.lookup(host, port).await {
                Ok(a) => a,
                Err(e) => {
                    entry.block(host, port, "the name did not resolve", false);
                    return Err(text(
                        StatusCode::BAD_GATEWAY,
                        &format!("kodx egress proxy: {host} did not resolve: {e}\n"),
                    ));
                }
            },
        };
        let reachable: Vec<SocketAddr> = addrs
            .into_iter()
            .filter(|a| {
                !never_reached(a.ip()) || policy.operator.iter().any(|n| n.contains(&a.ip()))
            })
            .collect();
        if reachable.is_empty() {
            entry.block(
                host,
                port,
                "resolves only to private, loopback or link-local addresses",
                false,
            );
            return Err(text(
                StatusCode::FORBIDDEN,
                &format!(
                    "kodx egress proxy: {host} resolves only to private, loopback or link-local \
                     addresses, which a sandbox never reaches (the operator's network_allow can \
                     open a range)\n"
                ),
            ));
        }
        let mut last = String::new();
        for addr in reachable {
            match tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(addr)).await {
                Ok(Ok(s)) => return Ok(s),
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "no answer within 5 s".to_string(),
            }
        }
        Err(text(
            StatusCode::BAD_GATEWAY,
            &format!("kodx egress proxy: {host}:{port} could not be reached: {last}\n"),
        ))
    }
}

/// Sends a plain HTTP request on `upstream` in origin form, without the proxy's own headers.
async fn forward(req: Request<Incoming>, upstream: TcpStream) -> Response<Body> {
    let (mut parts, body) = req.into_parts();
    let origin = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str().to_string())
        .unwrap_or_else(|| "/".to_string());
    if let Some(host) = parts.uri.authority().map(|a| a.as_str().to_string()) {
        if let Ok(v) = host.parse() {
            parts.headers.insert(hyper::header::HOST, v);
        }
    }
    parts.uri = match origin.parse() {
        Ok(u) => u,
        Err(_) => {
            return text(
                StatusCode::BAD_REQUEST,
                "kodx egress proxy: a bad request target\n",
            )
        }
    };
    for h in ["proxy-authorization", "proxy-connection"] {
        parts.headers.remove(h);
    }
    let (mut sender, conn) =
        match hyper::client::conn::http1::handshake(TokioIo::new(upstream)).await {
            Ok(pair) => pair,
            Err(e) => {
                return text(
                    StatusCode::BAD_GATEWAY,
                    &format!("kodx egress proxy: the upstream server failed: {e}\n"),
                )
            }
        };
    tokio::spawn(async move {
        let _ = conn.await;
    });
    match sender.send_request(Request::from_parts(parts, body)).await {
        Ok(resp) => resp.map(|b| b.boxed()),
        Err(e) => text(
            StatusCode::BAD_GATEWAY,
            &format!("kodx egress proxy: the upstream server failed: {e}\n"),
        ),
    }
}

/// Addresses a sandbox never reaches through the proxy unless the operator allows them:
/// the ranges the fence blocks, loopback, and their IPv6 kin.
pub fn never_reached(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => {
            v4.is_loopback()
                || v4.is_unspecified()
                || crate::sandbox::BLOCKED.iter().any(|(range, _)| {
                    range
                        .parse::<ipnet::Ipv4Net>()
                        .is_ok_and(|n| n.contains(&v4))
                })
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return never_reached(IpAddr::V4(v4));
            }
            let first = v6.segments()[0];
            v6.is_loopback()
                || v6.is_unspecified()
                || v6.is_multicast()
                || (first & 0xffc0) == 0xfe80
                || (first & 0xfe00) == 0xfc00
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_sandbox_never_reaches() {
        for ip in [
            "127.0.0.1",
            "10.1.2.3",
            "172.17.0.1",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "0.0.0.0",
            "::1",
            "fe80::1",
            "fd00::1",
            "::ffff:10.0.0.1",
            "ff02::1",
        ] {
            assert!(never_reached(ip.parse().unwrap()), "{ip}");
        }
        for ip in ["203.0.113.7", "1.1.1.1", "2001:db8::1", "::ffff:1.1.1.1"] {
            assert!(!never_reached(ip.parse().unwrap()), "{ip}");
        }
    }
}
