//! How `kodx serve` holds its HTTP connections (issue 9): an accept loop that survives file
//! descriptor exhaustion, a cap on open connections below the descriptor limit, and a
//! deadline on every request head.
//!
//! GitHub does not retry a delivery it could not make, so the endpoint must keep
//! answering while someone holds connections open without sending anything:
//! - every connection must send a complete request head within `header_timeout_secs` of
//!   opening or of its previous response (hyper's header read timeout), or it is closed;
//! - a connection whose peer reads nothing of its response for `write_timeout_secs` is
//!   closed, also once the handler has returned and only the body is left to write;
//! - at most `max_connections` are open. At the cap a new connection replaces the oldest
//!   one that has no request in progress (first those that never sent one, once they had
//!   250 ms to do so, then idle keep-alive ones, then those still sending an unverified
//!   webhook body). A connection whose request is being handled is never displaced; when
//!   every one is, the new connection is closed at once;
//! - the soft `RLIMIT_NOFILE` is raised to the hard limit at start, and the connection cap
//!   stays below it with a reserve for the database, Docker, git and GitHub;
//! - when `accept` fails anyway (EMFILE/ENFILE: descriptors taken elsewhere), the loop
//!   backs off briefly and goes on serving the connections it has.
//!
//! A displaced connection keeps its slot until its socket is closed, and while the only
//! candidates are still in their 250 ms grace, accepting pauses: new connections wait in
//! the kernel's accept queue (4096 deep), so descriptors never run past the cap.
//!
//! `/healthz` needs no reserve of its own: a new connection finds a slot while any
//! connection is idle or sending an unverified body, which is all an attacker without the
//! webhook secret can hold for long (a `/healthz` or `/metrics` request of theirs is busy
//! only while it is answered).

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Router;
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tower::ServiceExt as _;

use super::write_timeout::WriteTimeout;

/// Descriptors kept free for everything but HTTP connections: a quarter of the limit, but
/// at least `FD_RESERVE_MIN` and at most `FD_RESERVE_MAX` (and never more than half).
const FD_RESERVE_MIN: u64 = 256;
const FD_RESERVE_DIVISOR: u64 = 4;
const FD_RESERVE_MAX: u64 = 4096;

/// The longest request head (request line and headers) kodx reads.
const MAX_HEAD_BYTES: usize = 64 * 1024;

/// How long `accept` rests after running out of descriptors.
const ACCEPT_BACKOFF: Duration = Duration::from_millis(50);

/// The listen backlog asked for (the kernel caps it at `net.core.somaxconn`). Deeper
/// than tokio's 1024, so a burst of connections is queued rather than dropped, which
/// would cost every dropped client a 1 s SYN retransmission.
const LISTEN_BACKLOG: u32 = 4096;

/// Binds `addr` for `serve_http`, with a deep accept queue and address reuse.
pub fn bind(addr: std::net::SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()?
    } else {
        tokio::net::TcpSocket::new_v6()?
    };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// How the listener is served.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Open connections at once (before the descriptor limit lowers it).
    pub max_connections: usize,
    /// A request head must be complete within this.
    pub header_timeout: Duration,
    /// A write that makes no progress for this long (the peer reads nothing) closes the
    /// connection, also after the handler has returned ([`super::write_timeout`]).
    pub write_timeout: Duration,
    /// How long a shutdown waits for requests in progress.
    pub shutdown_wait: Duration,
}

/// Connection counters for `/metrics`.
#[derive(Debug, Clone, Default)]
pub struct ConnectionMetrics {
    /// `kodx_http_connections`: open right now.
    pub open: Gauge,
    /// `kodx_http_connections_displaced`: closed to make room for a new one.
    pub displaced: Counter,
    /// `kodx_http_connections_refused`: closed at once, every slot being busy.
    pub refused: Counter,
    /// `kodx_http_accept_errors`: `accept` failures (descriptor exhaustion and others).
    pub accept_errors: Counter,
}

const IDLE: u8 = 0;
const BUSY: u8 = 1;
const UNVERIFIED: u8 = 2;

/// A new connection is not displaced before it had this long to send its head: a real
/// client sends it at once, but under a flood the server may admit many connections
/// before it reads the first byte of one. While every displaceable connection is younger,
/// accepting pauses (new connections wait in the kernel's accept queue).
const GRACE: Duration = Duration::from_millis(250);

/// The longest the accept loop waits for a displaced connection to close before it looks
/// again (it is normally woken as soon as one closes).
const CLOSE_WAIT: Duration = Duration::from_millis(20);

/// What [`Registry::admit`] decided.
#[derive(Debug)]
enum Admit {
    Open(Arc<Conn>),
    /// Try again once a connection's task has ended, or after this long (a connection
    /// becomes displaceable then).
    Wait(Option<Duration>),
    /// Every open connection is handling a request.
    Refuse,
}

/// One open connection, as the registry and its handlers see it.
#[derive(Debug)]
struct Conn {
    admitted: Instant,
    state: AtomicU8,
    /// Whether a request has ever started on it.
    served: std::sync::atomic::AtomicBool,
    close: CancellationToken,
}

/// The handle a request handler finds in its request's extensions.
#[derive(Debug, Clone)]
pub struct ConnectionHandle(Arc<Conn>, std::net::SocketAddr);

impl ConnectionHandle {
    /// The address the connection came from (a proxy's, behind one).
    pub fn peer(&self) -> std::net::SocketAddr {
        self.1
    }

    /// Marks the connection as sending a body nobody has verified yet, until the guard
    /// is dropped: it may then be displaced like an idle one.
    pub fn unverified(&self) -> UnverifiedGuard {
        self.0.state.store(UNVERIFIED, Ordering::Relaxed);
        UnverifiedGuard(self.0.clone())
    }
}

/// See [`ConnectionHandle::unverified`].
#[derive(Debug)]
pub struct UnverifiedGuard(Arc<Conn>);

impl Drop for UnverifiedGuard {
    fn drop(&mut self) {
        let _ =
            self.0
                .state
                .compare_exchange(UNVERIFIED, BUSY, Ordering::Relaxed, Ordering::Relaxed);
    }
}

/// The open connections, oldest first.
struct Registry {
    conns: Mutex<Conns>,
    max: usize,
    metrics: ConnectionMetrics,
    /// Notified when a connection's task has ended (its descriptor is closed).
    freed: tokio::sync::Notify,
}

/// The open connections, oldest first, and how many of them are displaced but not yet
/// closed (they still hold their descriptor, so they still count).
#[derive(Default)]
struct Conns {
    open: BTreeMap<u64, Arc<Conn>>,
    closing: usize,
}

impl Registry {
    /// Makes room for connection `id` at `now`, displacing one if at the cap: the oldest
    /// that never sent a request (once it had [`GRACE`] to do so), else the oldest idle
    /// keep-alive one, else the oldest still sending an unverified body.
    fn admit(&self, id: u64, now: Instant) -> Admit {
        let mut guard = self.conns.lock();
        let Conns {
            open: conns,
            closing,
        } = &mut *guard;
        if conns.len() >= self.max {
            if *closing > 0 {
                // A displaced connection is on its way out: its slot comes free soon.
                return Admit::Wait(None);
            }
            let state = |c: &Conn| c.state.load(Ordering::Relaxed);
            let fresh = |c: &Conn| state(c) == IDLE && !c.served.load(Ordering::Relaxed);
            // Ids grow with admission, so the first fresh one is the oldest.
            let oldest_fresh = conns.iter().find(|(_, c)| fresh(c));
            let mut wait = None;
            let victim = match oldest_fresh {
                Some((id, c)) if now.saturating_duration_since(c.admitted) >= GRACE => Some(*id),
                Some((_, c)) => {
                    wait = Some(GRACE.saturating_sub(now.saturating_duration_since(c.admitted)));
                    None
                }
                None => None,
            };
            let pick = |want: &dyn Fn(&Conn) -> bool| {
                conns.iter().find(|(_, c)| want(c)).map(|(id, _)| *id)
            };
            let victim = victim
                .or_else(|| pick(&|c| state(c) == IDLE && c.served.load(Ordering::Relaxed)))
                .or_else(|| pick(&|c| state(c) == UNVERIFIED));
            return match (victim.and_then(|v| conns.get(&v)), wait) {
                (Some(old), _) => {
                    // It keeps its slot until its task has closed it.
                    old.close.cancel();
                    *closing += 1;
                    self.metrics.displaced.inc();
                    Admit::Wait(None)
                }
                (None, Some(wait)) => Admit::Wait(Some(wait.max(Duration::from_millis(1)))),
                (None, None) => {
                    self.metrics.refused.inc();
                    Admit::Refuse
                }
            };
        }
        let conn = Arc::new(Conn {
            admitted: now,
            state: AtomicU8::new(IDLE),
            served: std::sync::atomic::AtomicBool::new(false),
            close: CancellationToken::new(),
        });
        conns.insert(id, conn.clone());
        self.metrics.open.set(conns.len() as i64);
        Admit::Open(conn)
    }

    fn remove(&self, id: u64) {
        let mut conns = self.conns.lock();
        if let Some(c) = conns.open.remove(&id) {
            if c.close.is_cancelled() {
                conns.closing -= 1;
            }
        }
        self.metrics.open.set(conns.open.len() as i64);
        drop(conns);
        self.freed.notify_waiters();
    }
}

/// Raises the soft descriptor limit to the hard one and returns the soft limit now in
/// force (`None` if it cannot be read).
pub fn raise_fd_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read and write the struct passed.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return None;
        }
        if lim.rlim_cur < lim.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: lim.rlim_max,
                rlim_max: lim.rlim_max,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raised) == 0 {
                lim.rlim_cur = lim.rlim_max;
            }
        }
    }
    Some(lim.rlim_cur)
}

/// The connection cap under a descriptor limit of `fd_limit`.
pub fn connection_cap(max_connections: usize, fd_limit: Option<u64>) -> usize {
    let Some(limit) = fd_limit else {
        return max_connections;
    };
    let reserve = (limit / FD_RESERVE_DIVISOR)
        .clamp(FD_RESERVE_MIN, FD_RESERVE_MAX)
        .min(limit / 2);
    let room = limit.saturating_sub(reserve).max(2);
    max_connections.min(usize::try_from(room).unwrap_or(usize::MAX))
}

/// Serves `router` on `listener` until `shutdown`; then stops accepting, lets requests in
/// progress finish (within `limits.shutdown_wait`) and returns.
pub async fn serve_http(
    listener: TcpListener,
    router: Router,
    limits: ConnectionLimits,
    metrics: ConnectionMetrics,
    shutdown: CancellationToken,
) {
    let fd_limit = raise_fd_limit();
    let max = connection_cap(limits.max_connections, fd_limit);
    if max < limits.max_connections {
        tracing::warn!(
            max_connections = limits.max_connections,
            fd_limit,
            "max_connections lowered to {max} to stay below the open file limit \
             (raise it with `ulimit -n` or LimitNOFILE=)"
        );
    }
    tracing::info!(max_connections = max, fd_limit, header_timeout = ?limits.header_timeout,
        write_timeout = ?limits.write_timeout, "HTTP limits");
    let registry = Arc::new(Registry {
        conns: Mutex::new(Conns::default()),
        max,
        metrics,
        freed: tokio::sync::Notify::new(),
    });
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .max_buf_size(MAX_HEAD_BYTES);
    let builder = Arc::new(builder);
    let tracker = TaskTracker::new();
    let mut next_id: u64 = 0;
    let mut last_error_log: Option<Instant> = None;
    loop {
        let accepted = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            a = listener.accept() => a,
        };
        let (stream, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                registry.metrics.accept_errors.inc();
                let exhausted = matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE));
                if last_error_log.is_none_or(|t| t.elapsed() > Duration::from_secs(10)) {
                    last_error_log = Some(Instant::now());
                    if exhausted {
                        tracing::error!(
                            "accept failed: {e}; serving the open connections and retrying \
                             (raise the open file limit, or lower max_connections)"
                        );
                    } else {
                        tracing::warn!("accept failed: {e}; retrying");
                    }
                }
                tokio::select! {
                    _ = shutdown.cancelled() => break,
                    _ = tokio::time::sleep(ACCEPT_BACKOFF) => {}
                }
                continue;
            }
        };
        let id = next_id;
        next_id += 1;
        let conn = loop {
            let freed = registry.freed.notified();
            tokio::pin!(freed);
            freed.as_mut().enable();
            match registry.admit(id, Instant::now()) {
                Admit::Open(conn) => break Some(conn),
                Admit::Refuse => break None,
                Admit::Wait(wait) => tokio::select! {
                    _ = shutdown.cancelled() => break None,
                    _ = freed => {}
                    _ = tokio::time::sleep(wait.unwrap_or(CLOSE_WAIT)) => {}
                },
            }
        };
        let Some(conn) = conn else {
            tracing::debug!(%peer, "every connection is busy: closing a new one");
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let router = router.clone();
        let builder = builder.clone();
        let registry = registry.clone();
        let shutdown = shutdown.clone();
        let stream = WriteTimeout::new(stream, limits.write_timeout);
        tracker.spawn(async move {
            serve_connection(stream, peer, conn, router, &builder, shutdown).await;
            registry.remove(id);
        });
        // Let the connections run before taking the next one: under a flood of new
        // connections the ones already open (a delivery, /healthz) are answered first,
        // and the rest wait in the kernel's accept queue.
        tokio::task::yield_now().await;
    }
    drop(listener);
    tracker.close();
    if tokio::time::timeout(limits.shutdown_wait, tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!(
            "{} HTTP connection(s) still open after {:?}; closing them",
            tracker.len(),
            limits.shutdown_wait
        );
    }
}

async fn serve_connection(
    stream: WriteTimeout<tokio::net::TcpStream>,
    peer: std::net::SocketAddr,
    conn: Arc<Conn>,
    router: Router,
    builder: &http1::Builder,
    shutdown: CancellationToken,
) {
    let handle = ConnectionHandle(conn.clone(), peer);
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        let router = router.clone();
        let handle = handle.clone();
        async move {
            handle.0.state.store(BUSY, Ordering::Relaxed);
            handle.0.served.store(true, Ordering::Relaxed);
            req.extensions_mut().insert(handle.clone());
            let response = router.oneshot(req).await;
            handle.0.state.store(IDLE, Ordering::Relaxed);
            response as Result<_, Infallible>
        }
    });
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    let mut draining = false;
    loop {
        tokio::select! {
            r = connection.as_mut() => {
                if let Err(e) = r {
                    tracing::debug!("HTTP connection ended: {e}");
                }
                break;
            }
            _ = conn.close.cancelled() => break,
            _ = shutdown.cancelled(), if !draining => {
                connection.as_mut().graceful_shutdown();
                draining = true;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_stays_below_the_descriptor_limit() {
        assert_eq!(connection_cap(1024, None), 1024);
        assert_eq!(connection_cap(1024, Some(1_048_576)), 1024);
        // 1024 descriptors: 256 kept back.
        assert_eq!(connection_cap(1024, Some(1024)), 768);
        // 8,000: a quarter kept back; 20,000: at most 4096.
        assert_eq!(connection_cap(100_000, Some(8_000)), 6_000);
        assert_eq!(connection_cap(100_000, Some(20_000)), 15_904);
        // Tiny limits keep half.
        assert_eq!(connection_cap(1024, Some(256)), 128);
        assert_eq!(connection_cap(1024, Some(3)), 2);
    }

    fn registry(max: usize) -> Registry {
        Registry {
            conns: Mutex::new(Conns::default()),
            max,
            metrics: ConnectionMetrics::default(),
            freed: tokio::sync::Notify::new(),
        }
    }

    /// Admits `id`; when a connection is displaced for it, its task "ends" (as the real
    /// one does once cancelled) and the admission is tried again.
    fn open(r: &Registry, id: u64, now: Instant) -> Arc<Conn> {
        loop {
            match r.admit(id, now) {
                Admit::Open(c) => return c,
                Admit::Wait(None) => {
                    let gone: Vec<u64> = {
                        let conns = r.conns.lock();
                        assert_eq!(conns.closing, 1);
                        conns
                            .open
                            .iter()
                            .filter(|(_, c)| c.close.is_cancelled())
                            .map(|(id, _)| *id)
                            .collect()
                    };
                    // Until then it still holds its slot.
                    assert!(matches!(r.admit(id, now), Admit::Wait(None)));
                    r.remove(gone[0]);
                }
                other => panic!("expected a slot, got {other:?}"),
            }
        }
    }

    #[test]
    fn at_the_cap_the_oldest_connection_without_a_request_makes_room() {
        let r = registry(3);
        let t0 = Instant::now();
        let later = |ms: u64| t0 + Duration::from_millis(ms);
        let set = |c: &Conn, state: u8| {
            c.state.store(state, Ordering::Relaxed);
            c.served.store(true, Ordering::Relaxed);
        };
        let a = open(&r, 0, t0);
        let b = open(&r, 1, t0);
        let c = open(&r, 2, t0);
        set(&a, BUSY); // handling a request
        set(&b, IDLE); // kept alive after a request
                       // c never sent a request: it goes first, once it had its grace, then the next
                       // one like it.
        let d = open(&r, 3, later(300));
        assert!(c.close.is_cancelled() && !b.close.is_cancelled());
        // d is young: the idle keep-alive b goes instead.
        let e = open(&r, 4, later(310));
        assert!(b.close.is_cancelled() && !d.close.is_cancelled());
        // Now a (busy), d and e (young, fresh): wait until d is old enough.
        match r.admit(5, later(320)) {
            Admit::Wait(Some(w)) => assert_eq!(w, Duration::from_millis(230)),
            other => panic!("expected to wait, got {other:?}"),
        }
        let f = open(&r, 5, later(550));
        assert!(d.close.is_cancelled() && !e.close.is_cancelled());
        // An unverified body goes when nothing idle is left.
        set(&e, UNVERIFIED);
        set(&f, BUSY);
        let g = open(&r, 6, later(560));
        assert!(e.close.is_cancelled());
        set(&g, BUSY);
        // Only busy ones are left: the new connection is refused, none is displaced.
        assert!(matches!(r.admit(7, later(2000)), Admit::Refuse));
        assert!(![&a, &f, &g].iter().any(|c| c.close.is_cancelled()));
        assert_eq!(r.conns.lock().open.len(), 3);
        assert_eq!(r.metrics.displaced.get(), 4);
    }

    #[test]
    fn when_every_connection_is_busy_a_new_one_is_refused() {
        let r = registry(2);
        for id in 0..2 {
            let c = open(&r, id, Instant::now());
            c.state.store(BUSY, Ordering::Relaxed);
        }
        assert!(matches!(r.admit(2, Instant::now()), Admit::Refuse));
        assert_eq!(r.metrics.refused.get(), 1);
    }
}
