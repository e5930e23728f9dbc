//! Fencing on a shared queue: a run is this process's only while the database says so.
//! A process paused or cut off past its lease may find, when it goes on, that another
//! process took the run back and runs it. Every write to the run carries its [`Lease`]
//! (worker and epoch) in its `WHERE` and changes nothing once the lease is gone, the end
//! of the run included ([`crate::db::Db::finish`]). What no `WHERE` can fence — a model
//! call, a command in the container, a status-comment edit, a push, a pull request — is
//! preceded by the run's [`Fence`] asking the database whether this claim still holds the
//! run, extending the lease when it does. Once lost, the run is cancelled here and nothing
//! more of it happens here: no comment, no push, no end written.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::db::{Db, Lease, Run};

/// One run's hold on its lease, shared by everything that acts for the run.
#[derive(Clone)]
pub(in crate::serve) struct Fence {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    run_id: String,
    lease: Lease,
    cancel: CancellationToken,
    lost: AtomicBool,
    /// When the database last confirmed the hold (the lease runs from then).
    confirmed: Mutex<Instant>,
}

impl Fence {
    /// The fence of `run`, claimed by `worker` just now (`run` as the claim returned it);
    /// losing it cancels `cancel`.
    pub fn new(db: Db, run: &Run, worker: &str, cancel: CancellationToken) -> Fence {
        Fence {
            inner: Arc::new(Inner {
                db,
                run_id: run.id.clone(),
                lease: Lease {
                    worker: worker.to_string(),
                    epoch: run.attempts,
                },
                cancel,
                lost: AtomicBool::new(false),
                confirmed: Mutex::new(Instant::now()),
            }),
        }
    }

    /// Whether this process still holds the run (and may act for it); extends the lease
    /// when it does. On SQLite a run is always its one process's. When the database cannot
    /// be asked, the hold stands while the last confirmed lease has not run out.
    pub async fn holds(&self) -> bool {
        let inner = &self.inner;
        if inner.lost.load(Ordering::SeqCst) {
            return false;
        }
        if !inner.db.is_shared() {
            return true;
        }
        match inner.db.hold_lease(&inner.run_id, &inner.lease).await {
            Ok(true) => {
                *inner.confirmed.lock() = Instant::now();
                true
            }
            Ok(false) => {
                self.lose();
                false
            }
            Err(e) => {
                let since = inner.confirmed.lock().elapsed();
                // A margin for the clocks and the time the check itself took.
                let valid = inner.db.lease() * 2 / 3;
                tracing::warn!("checking the run's lease failed: {e}");
                if since < valid {
                    return true;
                }
                self.lose();
                false
            }
        }
    }

    /// The claim this fence guards: what every write for the run carries.
    pub fn lease(&self) -> &Lease {
        &self.inner.lease
    }

    /// Whether the run was lost (it must end here without a trace).
    pub fn is_lost(&self) -> bool {
        self.inner.lost.load(Ordering::SeqCst)
    }

    /// Marks the run lost (a write carrying its lease changed nothing).
    pub fn lose(&self) {
        if !self.inner.lost.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                "this process lost the run's lease (it was paused or cut off from the database past the lease); another process runs it now, so it stops here without touching GitHub"
            );
            self.inner.cancel.cancel();
        }
    }
}
