//! The steers of a run running here (SPEC §12, "Steering and pictures"): the agent asks at
//! each step boundary ([`RunSteering`]); the rows are read only when this process heard of
//! a steer since the last read (its own `/kodx steer` answer, or PostgreSQL's `steer`
//! notification), and at most every [`SAFETY_NET`] otherwise, for a notification lost
//! while the listener reconnected. A steer still untaken when the run ends is named in
//! the final status comment ([`too_late`]).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{Services, StatusComment};
use crate::agent::{Steer, Steering};

/// The longest a run goes without looking for steers it was not told of.
pub(in crate::serve) const SAFETY_NET: Duration = Duration::from_secs(30);

impl Services {
    /// A steer was stored for some run: the runs of this process look at their next step.
    pub(in crate::serve) fn heard_of_a_steer(&self) {
        self.steer_wakes.fetch_add(1, Ordering::SeqCst);
    }
}

/// The [`Steering`] of one run of `kodx serve`.
pub(in crate::serve) struct RunSteering<'a> {
    svc: &'a Services,
    run_id: String,
    /// Named who steered from the next edit on.
    status: StatusComment,
    /// The wake count and time of the last read (none yet: the first step reads).
    last: Mutex<Option<(u64, Instant)>>,
}

impl<'a> RunSteering<'a> {
    pub(in crate::serve) fn new(svc: &'a Services, run_id: &str, status: StatusComment) -> Self {
        RunSteering {
            svc,
            run_id: run_id.to_string(),
            status,
            last: Mutex::new(None),
        }
    }

    /// Whether to read the rows now, and if so, marks the read.
    fn due(&self) -> bool {
        let wakes = self.svc.steer_wakes.load(Ordering::SeqCst);
        let mut last = self.last.lock();
        let due = match *last {
            None => true,
            Some((seen, at)) => seen != wakes || at.elapsed() >= SAFETY_NET,
        };
        if due {
            *last = Some((wakes, Instant::now()));
        }
        due
    }
}

impl RunSteering<'_> {
    /// Runs `work` (the agent), and names whoever steers meanwhile in the status comment as
    /// soon as this process hears of it, so no progress edit before the next step drops
    /// the name the `/kodx steer` answer put up (the words reach the model at that step).
    pub(in crate::serve) async fn announcing<T>(
        &self,
        work: impl std::future::Future<Output = T>,
    ) -> T {
        tokio::pin!(work);
        let mut seen = self.svc.steer_wakes.load(Ordering::SeqCst);
        loop {
            tokio::select! {
                out = &mut work => return out,
                _ = tokio::time::sleep(ANNOUNCE_EVERY) => {
                    let now = self.svc.steer_wakes.load(Ordering::SeqCst);
                    if now == seen {
                        continue;
                    }
                    seen = now;
                    match self.svc.db.steerers(&self.run_id).await {
                        Ok(who) => who.iter().for_each(|w| self.status.steered_by(w)),
                        Err(e) => tracing::warn!(run_id = %self.run_id, "reading who steered failed: {e}"),
                    }
                }
            }
        }
    }
}

/// How often a running run looks whether this process heard of a steer (an atomic read;
/// the database is read only when it did).
const ANNOUNCE_EVERY: Duration = Duration::from_millis(500);

#[async_trait::async_trait]
impl Steering for RunSteering<'_> {
    async fn take(&self) -> Vec<Steer> {
        if !self.due() {
            return Vec::new();
        }
        let rows = match self.svc.db.take_steers(&self.run_id).await {
            Ok(rows) => rows,
            Err(e) => {
                tracing::warn!(run_id = %self.run_id, "reading the run's steers failed: {e}");
                // Read again at the next step.
                *self.last.lock() = None;
                return Vec::new();
            }
        };
        rows.into_iter()
            .map(|row| {
                tracing::info!(run_id = %self.run_id, by = %row.author, "steer given to the model");
                self.status.steered_by(&row.author);
                Steer {
                    author: row.author,
                    standing: "a writer".to_string(),
                    words: row.body,
                }
            })
            .collect()
    }
}

/// The note of the final status comment about the steers nobody took (they came after the
/// run's last step), taken so no other process names them again; none when there are none.
pub(in crate::serve) async fn too_late(svc: &Services, run_id: &str) -> Option<String> {
    match svc.db.take_steers(run_id).await {
        Ok(rows) if rows.is_empty() => None,
        Ok(rows) => {
            let authors: Vec<String> = rows.into_iter().map(|r| r.author).collect();
            Some(crate::serve::texts::steer::too_late(&authors))
        }
        Err(e) => {
            tracing::warn!(run_id, "reading the run's late steers failed: {e}");
            None
        }
    }
}
