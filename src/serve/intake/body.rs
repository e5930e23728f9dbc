//! Reading a webhook body before anyone knows who sent it (issue 9).
//!
//! The signature covers the whole body, so the body is held until its last byte is in.
//! Until then it is untrusted and counted against one [`BodyBudget`] shared by every
//! connection: the body streams into the HMAC as it arrives, under a deadline and the size
//! cap, and its bytes are taken from the budget piece by piece, never on the sender's
//! word (`Content-Length`). Once verified, the bytes leave the budget.
//!
//! Fairness: when the budget is full, the body holding the most bytes is dropped (`503`)
//! to make room for one that would hold less, so GitHub's usual deliveries (well under
//! 1 MB) still get through while unsigned senders hold big bodies open; a big delivery
//! only competes with bigger ones. When no body holds more, the newcomer is refused.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::{Body, Bytes};
use http_body_util::BodyExt as _;
use prometheus_client::metrics::gauge::Gauge;
use tokio_util::sync::CancellationToken;

use crate::webhook::signature::Verifier;
use crate::webhook::SignatureError;

/// The most allocated for a body before any of it arrives (GitHub's usual deliveries fit).
const INITIAL_BUFFER: usize = 64 * 1024;

/// How long a body that needs room waits for the bodies it displaced to let go.
const EVICTION_WAIT: Duration = Duration::from_secs(2);

/// Bytes of unverified bodies held at once, over all connections.
#[derive(Debug)]
pub struct BodyBudget {
    capacity: usize,
    state: Mutex<BudgetState>,
    released: tokio::sync::Notify,
    /// `kodx_webhook_unverified_bytes`.
    gauge: Gauge,
}

#[derive(Debug, Default)]
struct BudgetState {
    used: usize,
    next_id: u64,
    holders: HashMap<u64, Holder>,
}

#[derive(Debug)]
struct Holder {
    held: usize,
    /// Cancelled when this body is dropped to make room.
    evict: CancellationToken,
}

impl BudgetState {
    /// Bytes that evicted holders are about to give back.
    fn leaving(&self) -> usize {
        self.holders
            .values()
            .filter(|h| h.evict.is_cancelled())
            .map(|h| h.held)
            .sum()
    }
}

/// What ended a body's reading early.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BodyError {
    #[error("the body is larger than {0} bytes")]
    TooLarge(usize),
    #[error("the body did not arrive within {0:?}")]
    Timeout(Duration),
    #[error("too many unverified webhook bytes are held right now; this one was dropped")]
    Busy,
    #[error("{0}")]
    Signature(SignatureError),
    #[error("the body could not be read: {0}")]
    Read(String),
}

impl BodyBudget {
    pub fn new(capacity: usize, gauge: Gauge) -> Arc<BodyBudget> {
        Arc::new(BodyBudget {
            capacity,
            state: Mutex::new(BudgetState::default()),
            released: tokio::sync::Notify::new(),
            gauge,
        })
    }

    /// Bytes held right now.
    #[cfg(test)]
    pub fn used(&self) -> usize {
        self.state.lock().used
    }

    /// A new, empty share of the budget for one body.
    pub fn hold(self: &Arc<Self>) -> Hold {
        let mut st = self.state.lock();
        let id = st.next_id;
        st.next_id += 1;
        let evict = CancellationToken::new();
        st.holders.insert(
            id,
            Holder {
                held: 0,
                evict: evict.clone(),
            },
        );
        Hold {
            budget: self.clone(),
            id,
            evicted: evict,
        }
    }
}

/// One body's share of a [`BodyBudget`]; given back when dropped.
#[derive(Debug)]
pub struct Hold {
    budget: Arc<BodyBudget>,
    id: u64,
    evicted: CancellationToken,
}

impl Hold {
    /// Takes `n` more bytes, displacing bigger bodies if the budget is full.
    pub async fn grow(&self, n: usize) -> Result<(), BodyError> {
        let budget = &*self.budget;
        let deadline = tokio::time::Instant::now() + EVICTION_WAIT;
        loop {
            let released = budget.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut st = budget.state.lock();
                if self.evicted.is_cancelled() {
                    return Err(BodyError::Busy);
                }
                let mine = st.holders.get(&self.id).map_or(0, |h| h.held);
                if mine + n > budget.capacity {
                    return Err(BodyError::TooLarge(budget.capacity));
                }
                if st.used + n <= budget.capacity {
                    st.used += n;
                    if let Some(h) = st.holders.get_mut(&self.id) {
                        h.held += n;
                    }
                    budget.gauge.set(st.used as i64);
                    return Ok(());
                }
                let mut short = (st.used + n - budget.capacity).saturating_sub(st.leaving());
                if short > 0 {
                    // Displace the biggest bodies that hold more than this one would.
                    let mut bigger: Vec<(usize, &Holder)> = st
                        .holders
                        .iter()
                        .filter(|(id, h)| {
                            **id != self.id && !h.evict.is_cancelled() && h.held > mine + n
                        })
                        .map(|(_, h)| (h.held, h))
                        .collect();
                    bigger.sort_by_key(|b| std::cmp::Reverse(b.0));
                    let mut victims = Vec::new();
                    for (held, h) in bigger {
                        if short == 0 {
                            break;
                        }
                        short = short.saturating_sub(held);
                        victims.push(h.evict.clone());
                    }
                    if short > 0 {
                        return Err(BodyError::Busy);
                    }
                    for v in victims {
                        v.cancel();
                    }
                }
            }
            if tokio::time::timeout_at(deadline, released).await.is_err() {
                return Err(BodyError::Busy);
            }
        }
    }

    /// Resolves when this body was displaced to make room for a smaller one.
    pub async fn evicted(&self) {
        self.evicted.cancelled().await
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let budget = &*self.budget;
        let mut st = budget.state.lock();
        if let Some(h) = st.holders.remove(&self.id) {
            st.used -= h.held;
            budget.gauge.set(st.used as i64);
        }
        drop(st);
        budget.released.notify_waiters();
    }
}

/// Reads `body` into memory within `limit` bytes and `timeout`, taking its bytes from
/// `budget` as they arrive and feeding them to `verifier`. Returns the body once its
/// signature is verified; its bytes have then left the budget.
pub async fn read_verified(
    body: Body,
    mut verifier: Verifier,
    budget: &Arc<BodyBudget>,
    limit: usize,
    size_hint: Option<usize>,
    timeout: Duration,
) -> Result<Bytes, BodyError> {
    let hold = budget.hold();
    let read = async {
        // The declared length is only a hint, and a small one: thousands of connections
        // may each declare 25 MiB and send nothing. The buffer grows with what arrives,
        // and the budget counts that.
        let mut buf = Vec::with_capacity(size_hint.unwrap_or(0).min(INITIAL_BUFFER));
        let mut body = body;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| BodyError::Read(e.to_string()))?;
            let Ok(data) = frame.into_data() else {
                continue; // trailers
            };
            if buf.len() + data.len() > limit {
                return Err(BodyError::TooLarge(limit));
            }
            hold.grow(data.len()).await?;
            verifier.update(&data);
            buf.extend_from_slice(&data);
        }
        Ok(buf)
    };
    let buf = tokio::select! {
        r = tokio::time::timeout(timeout, read) => match r {
            Ok(r) => r?,
            Err(_) => return Err(BodyError::Timeout(timeout)),
        },
        _ = hold.evicted() => return Err(BodyError::Busy),
    };
    verifier.finish().map_err(BodyError::Signature)?;
    drop(hold);
    Ok(Bytes::from(buf))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(capacity: usize) -> Arc<BodyBudget> {
        BodyBudget::new(capacity, Gauge::default())
    }

    #[tokio::test]
    async fn bytes_are_counted_and_given_back() {
        let b = budget(100);
        let a = b.hold();
        a.grow(60).await.unwrap();
        let c = b.hold();
        c.grow(40).await.unwrap();
        assert_eq!(b.used(), 100);
        drop(a);
        assert_eq!(b.used(), 40);
        drop(c);
        assert_eq!(b.used(), 0);
    }

    #[tokio::test]
    async fn a_smaller_body_displaces_the_biggest() {
        let b = budget(100);
        let big = b.hold();
        big.grow(70).await.unwrap();
        let mid = b.hold();
        mid.grow(30).await.unwrap();
        let small = b.hold();
        let bb = b.clone();
        // The biggest holder notices it was displaced and lets go, as a reader would.
        let watcher = tokio::spawn(async move {
            big.evicted().await;
            drop(big);
            bb.used()
        });
        small.grow(10).await.unwrap();
        assert!(watcher.await.unwrap() <= 40);
        assert_eq!(b.used(), 40);
        // Nobody holds more than `mid` would after 20 more: refused, nothing displaced.
        let other = b.hold();
        other.grow(50).await.unwrap();
        assert_eq!(mid.grow(20).await, Err(BodyError::Busy));
        // More than the whole budget: too large.
        let huge = b.hold();
        assert_eq!(huge.grow(101).await, Err(BodyError::TooLarge(100)));
    }
}
