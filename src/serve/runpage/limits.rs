//! How much of the server run pages may take, whoever holds a link (links are posted in
//! public comments): views per client (a token bucket and a few at once), views being
//! sent at once over all clients, and live streams per run and in all.
//!
//! A client is its connection's address (an IPv6 address counts by its /64, which one
//! host commonly holds whole). Behind a proxy every client has the proxy's address: the
//! per-client limits then hold for all viewers together, which keeps the server safe and
//! only makes pages refuse sooner.

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;

/// Views one client may have being sent at once.
pub const VIEWS_AT_ONCE_PER_CLIENT: u32 = 4;
/// Views being sent at once over all clients.
pub const VIEWS_AT_ONCE: u32 = 64;
/// Views a client may make in a burst, then [`VIEWS_PER_MINUTE`].
pub const VIEWS_BURST: f64 = 60.0;
pub const VIEWS_PER_MINUTE: f64 = 120.0;
/// Clients remembered at once; past it, a new client waits until one is forgotten.
const MAX_CLIENTS: usize = 10_000;
/// Live streams of one run at once (its one token opens them all).
pub const STREAMS_PER_RUN: usize = 4;
/// Live streams at once over all runs (each polls the database).
pub const MAX_STREAMS: usize = 64;
/// A page body is sent in slices of this, each a view into the shared page.
const SLICE: usize = 64 * 1024;

/// Why a view or a stream was refused.
#[derive(Debug, PartialEq)]
pub(super) enum Refused {
    /// Too many at once (for this client, this run, or in all): try again soon.
    Busy,
    /// The client made too many views: the next is allowed in this many seconds.
    Rate(u64),
}

#[derive(Default)]
struct Client {
    sending: u32,
    tokens: f64,
    at: Option<Instant>,
}

#[derive(Default)]
struct ViewState {
    clients: HashMap<IpAddr, Client>,
    sending: u32,
}

/// The views of every client.
#[derive(Default)]
pub(super) struct Viewers(Mutex<ViewState>);

/// One view being sent; dropped with its body (sent, or its connection closed).
pub(super) struct ViewGuard(Arc<Viewers>, IpAddr);

impl Drop for ViewGuard {
    fn drop(&mut self) {
        let mut state = self.0 .0.lock();
        state.sending = state.sending.saturating_sub(1);
        if let Some(c) = state.clients.get_mut(&self.1) {
            c.sending = c.sending.saturating_sub(1);
        }
    }
}

/// The key a client is counted under.
fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
        v4 => v4,
    }
}

impl Viewers {
    /// Admits one view by `ip` at `now`, or says why not.
    pub fn admit(self: &Arc<Self>, ip: IpAddr, now: Instant) -> Result<ViewGuard, Refused> {
        let key = client_key(ip);
        let mut state = self.0.lock();
        if state.sending >= VIEWS_AT_ONCE {
            return Err(Refused::Busy);
        }
        if !state.clients.contains_key(&key) && state.clients.len() >= MAX_CLIENTS {
            // Forget the clients that are back to a full bucket and send nothing.
            state
                .clients
                .retain(|_, c| c.sending > 0 || refilled(c, now) < VIEWS_BURST);
            if state.clients.len() >= MAX_CLIENTS {
                return Err(Refused::Busy);
            }
        }
        let c = state.clients.entry(key).or_default();
        c.tokens = refilled(c, now);
        c.at = Some(now);
        if c.sending >= VIEWS_AT_ONCE_PER_CLIENT {
            return Err(Refused::Busy);
        }
        if c.tokens < 1.0 {
            let wait = (1.0 - c.tokens) * 60.0 / VIEWS_PER_MINUTE;
            return Err(Refused::Rate(wait.ceil() as u64));
        }
        c.tokens -= 1.0;
        c.sending += 1;
        state.sending += 1;
        Ok(ViewGuard(self.clone(), key))
    }
}

/// The client's tokens at `now` (a new client has a full bucket).
fn refilled(c: &Client, now: Instant) -> f64 {
    match c.at {
        None => VIEWS_BURST,
        Some(at) => {
            let minutes = now.saturating_duration_since(at).as_secs_f64() / 60.0;
            (c.tokens + minutes * VIEWS_PER_MINUTE).min(VIEWS_BURST)
        }
    }
}

/// The live streams open, per run.
#[derive(Default)]
pub(super) struct Streams(Mutex<HashMap<String, usize>>);

/// One open stream; dropped with it.
pub(super) struct StreamGuard(Arc<Streams>, String);

impl Drop for StreamGuard {
    fn drop(&mut self) {
        let mut runs = self.0 .0.lock();
        if let Some(n) = runs.get_mut(&self.1) {
            *n -= 1;
            if *n == 0 {
                runs.remove(&self.1);
            }
        }
    }
}

impl Streams {
    pub fn admit(self: &Arc<Self>, run_id: &str) -> Result<StreamGuard, Refused> {
        let mut runs = self.0.lock();
        let total: usize = runs.values().sum();
        let this = runs.get(run_id).copied().unwrap_or(0);
        if total >= MAX_STREAMS || this >= STREAMS_PER_RUN {
            return Err(Refused::Busy);
        }
        *runs.entry(run_id.to_string()).or_default() += 1;
        Ok(StreamGuard(self.clone(), run_id.to_string()))
    }
}

/// `page` as a response body of slices into it, holding `guard` until it is sent or
/// dropped.
pub(super) fn page_body(page: Bytes, guard: ViewGuard) -> axum::body::Body {
    let slices = futures_util::stream::unfold((page, 0, guard), |(page, at, guard)| async move {
        if at >= page.len() {
            return None;
        }
        let end = (at + SLICE).min(page.len());
        let slice = page.slice(at..end);
        Some((Ok::<_, Infallible>(slice), (page, end, guard)))
    });
    axum::body::Body::from_stream(slices)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_client_gets_a_burst_then_a_view_a_second_and_a_few_at_once() {
        let v = Arc::new(Viewers::default());
        let t0 = Instant::now();
        let ip: IpAddr = "203.0.113.7".parse().unwrap();
        let mut held = Vec::new();
        for _ in 0..VIEWS_AT_ONCE_PER_CLIENT {
            held.push(v.admit(ip, t0).unwrap());
        }
        assert_eq!(v.admit(ip, t0).err(), Some(Refused::Busy), "a few at once");
        // Another client is not held up by this one.
        let other: IpAddr = "198.51.100.1".parse().unwrap();
        drop(v.admit(other, t0).unwrap());
        held.clear();
        for _ in VIEWS_AT_ONCE_PER_CLIENT..VIEWS_BURST as u32 {
            drop(v.admit(ip, t0).unwrap());
        }
        assert_eq!(v.admit(ip, t0).err(), Some(Refused::Rate(1)));
        drop(v.admit(ip, t0 + Duration::from_secs(1)).unwrap());
        // One host's IPv6 addresses are one client.
        let a: IpAddr = "2001:db8:1:2::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:ffff::9".parse().unwrap();
        for _ in 0..VIEWS_BURST as u32 {
            drop(v.admit(a, t0).unwrap());
        }
        assert!(matches!(v.admit(b, t0), Err(Refused::Rate(_))));
    }

    #[test]
    fn views_at_once_are_bounded_over_all_clients() {
        let v = Arc::new(Viewers::default());
        let t0 = Instant::now();
        let held: Vec<_> = (0..VIEWS_AT_ONCE)
            .map(|i| {
                v.admit(IpAddr::from([10, 0, (i / 200) as u8, i as u8]), t0)
                    .unwrap()
            })
            .collect();
        assert_eq!(
            v.admit("10.9.9.9".parse().unwrap(), t0).err(),
            Some(Refused::Busy)
        );
        drop(held);
        assert!(v.admit("10.9.9.9".parse().unwrap(), t0).is_ok());
    }

    #[test]
    fn streams_are_bounded_per_run_and_in_all() {
        let s = Arc::new(Streams::default());
        let one: Vec<_> = (0..STREAMS_PER_RUN)
            .map(|_| s.admit("r1").unwrap())
            .collect();
        assert!(s.admit("r1").is_err());
        let mut others = Vec::new();
        for i in 0.. {
            match s.admit(&format!("r{}", 2 + i / STREAMS_PER_RUN)) {
                Ok(g) => others.push(g),
                Err(_) => break,
            }
        }
        assert_eq!(one.len() + others.len(), MAX_STREAMS);
        drop(one);
        assert!(s.admit("r1").is_ok());
        assert!(s.0.lock().get("r1").is_none(), "forgotten once closed");
    }
}
