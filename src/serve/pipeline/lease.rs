//! A run's lease on a shared queue: a run is this process's only while the database says so.
//! A process paused or cut off past its lease may find, when it goes on, that another
//! process took the run back and runs it. Every write to the run carries its [`db::Lease`]
//! (worker and epoch) in its `WHERE` and changes nothing once the lease is gone, the end
//! of the run included ([`crate::db::Db::finish`]). What no `WHERE` can guard — a model
//! call, a command in the container, a push, and every GitHub write (a status-comment edit,
//! a pull request, a Check Run, a review reply) — is preceded by the run's [`Lease`] asking
//! the database whether this claim still holds the run, extending the lease when it does.
//! Once lost, the run is cancelled here and nothing more of it happens here: no comment, no
//! push, no end written.
//!
//! A check is worth something only if it comes after the last slow step the action depends
//! on, and if the lease it confirms outlasts the action. So GitHub writes are checked by
//! the client itself, right before each attempt ([`Lease::guard`] makes a run's clients;
//! [`crate::github::WriteGuard`]); a push is checked once git has read the branch's refs
//! ([`Lease::holds_blocking`]); and a check passes only when more than the margin — one
//! GitHub request's bound and a little more ([`crate::serve::config::Settings::lease_margin`])
//! — is left of the lease it confirmed, counted from when it was asked: a process stopped
//! while the database answered finds, when it goes on, that its answer is too old, and
//! asks again.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::db::{self, Db, Run};
use crate::github::{Installation, WriteGuard};

/// Answers that came too late to act on before a check gives up and takes the run as lost.
const MAX_LATE_ANSWERS: u32 = 3;

/// One run's hold on its lease, shared by everything that acts for the run.
#[derive(Clone)]
pub(in crate::serve) struct Lease {
    inner: Arc<Inner>,
}

struct Inner {
    db: Db,
    run_id: String,
    lease: db::Lease,
    cancel: CancellationToken,
    lost: AtomicBool,
    /// How much of the lease must be left to act ([`Lease::new`]).
    margin: Duration,
    /// Until when the lease surely holds, by this process's monotonic clock: when the
    /// check (or the claim) that last extended it was asked, plus the lease's length. The
    /// database set the lease from its own later "now", so the lease holds at least that
    /// long.
    until: Mutex<Instant>,
}

impl Lease {
    /// The lease of `run`, claimed by `worker` with a claim asked at `claimed_at` (`run`
    /// as the claim returned it); losing it cancels `cancel`. It acts only while more than
    /// `margin` of the lease is left.
    pub fn new(
        db: Db,
        run: &Run,
        worker: &str,
        cancel: CancellationToken,
        claimed_at: Instant,
        margin: Duration,
    ) -> Lease {
        let until = claimed_at + db.lease();
        Lease {
            inner: Arc::new(Inner {
                db,
                run_id: run.id.clone(),
                lease: db::Lease {
                    worker: worker.to_string(),
                    epoch: run.attempts,
                },
                cancel,
                lost: AtomicBool::new(false),
                margin,
                until: Mutex::new(until),
            }),
        }
    }

    /// Whether this process still holds the run and may act for it now: the database
    /// confirms the claim (extending the lease) and more than the margin of that lease is
    /// left. On SQLite a run is always its one process's. An answer that came too late (the
    /// process was stopped while it waited, say) is asked again; when the database cannot
    /// be asked, the hold stands while the last confirmed lease has more than the margin
    /// left.
    pub async fn holds(&self) -> bool {
        let inner = &self.inner;
        if inner.lost.load(Ordering::SeqCst) {
            return false;
        }
        if !inner.db.is_shared() {
            return true;
        }
        for _ in 0..MAX_LATE_ANSWERS {
            let asked = Instant::now();
            match inner.db.hold_lease(&inner.run_id, &inner.lease).await {
                Ok(true) => {
                    let until = asked + inner.db.lease();
                    *inner.until.lock() = until;
                    if self.leaves_margin(until) {
                        return true;
                    }
                    tracing::warn!(
                        took_ms = asked.elapsed().as_millis() as u64,
                        "the run's lease was confirmed too late to act on; asking again"
                    );
                }
                Ok(false) => {
                    self.lose();
                    return false;
                }
                Err(e) => {
                    tracing::warn!("checking the run's lease failed: {e}");
                    if self.leaves_margin(*inner.until.lock()) {
                        return true;
                    }
                    self.lose();
                    return false;
                }
            }
        }
        tracing::warn!("the database kept answering too late to act on the run's lease");
        self.lose();
        false
    }

    /// [`holds`](Self::holds), from a thread outside the runtime (a push's callback) that
    /// may block: `runtime` is the runtime the lease's database runs on.
    pub fn holds_blocking(&self, runtime: &tokio::runtime::Handle) -> bool {
        runtime.block_on(self.holds())
    }

    /// Whether a lease that holds until `until` has more than the margin left now.
    fn leaves_margin(&self, until: Instant) -> bool {
        Instant::now() + self.inner.margin < until
    }

    /// `gh`, whose every write asks this lease first, right before it is sent: how the
    /// run's stages get their GitHub clients.
    pub fn guard(&self, gh: &Installation) -> Installation {
        gh.guarded(Arc::new(self.clone()))
    }

    /// The claim this lease guards: what every write for the run carries.
    pub fn lease(&self) -> &db::Lease {
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

#[async_trait::async_trait]
impl WriteGuard for Lease {
    async fn allows(&self) -> bool {
        self.holds().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::db::test_databases;
    use crate::db::{Accepted, NewDelivery, NewRun};
    use crate::job::{Job, Trigger};

    /// A code run claimed by `process-a` on a fresh PostgreSQL database whose leases last
    /// `lease`, asked at the returned instant; `None` when PostgreSQL is skipped.
    async fn claimed(test: &str, lease: Duration) -> Option<(Db, Run, Instant)> {
        let Some(admin) = test_databases::postgres_admin_url() else {
            eprintln!("SKIPPED {test}: KODX_SKIP_POSTGRES=1");
            return None;
        };
        let url = test_databases::fresh_postgres_database(&admin).await;
        let db = Db::open(&url).await.unwrap().with_lease(lease);
        let delivery = NewDelivery {
            id: "d1".into(),
            event: "issue_comment".into(),
            action: Some("created".into()),
            installation_id: Some(42),
            repo: Some("octo/widgets".into()),
        };
        let run = NewRun {
            installation_id: 42,
            repo: "octo/widgets".into(),
            issue_number: 1,
            is_pull_request: false,
            author: "alice".into(),
            author_id: 7001,
            clone_url: "https://github.com/octo/widgets.git".into(),
            default_branch: "main".into(),
            job: Job::Code {
                request: "fix it".into(),
                base: None,
            },
            trigger: Trigger::IssueComment(5),
        };
        let Accepted::Queued { .. } = db.accept(&delivery, Some(&run)).await.unwrap() else {
            panic!("queued")
        };
        let asked = Instant::now();
        let run = db.claim_run("process-a").await.unwrap().expect("claimed");
        Some((db, run, asked))
    }

    fn lease(db: &Db, run: &Run, asked: Instant, margin: Duration) -> (Lease, CancellationToken) {
        let cancel = CancellationToken::new();
        let lease = Lease::new(db.clone(), run, "process-a", cancel.clone(), asked, margin);
        (lease, cancel)
    }

    #[tokio::test]
    async fn a_check_passes_only_while_more_than_the_margin_is_left() {
        let test = "a_check_passes_only_while_more_than_the_margin_is_left";
        let Some((db, run, asked)) = claimed(test, Duration::from_secs(10)).await else {
            return;
        };
        let (held, _) = lease(&db, &run, asked, Duration::from_secs(5));
        assert!(held.holds().await);
        assert!(held.allows().await);
        assert!(!held.is_lost());
        // A margin the lease cannot leave: every answer is too late to act on, so the run
        // is given up rather than acted for.
        let (late, cancel) = lease(&db, &run, asked, Duration::from_secs(10));
        assert!(!late.holds().await);
        assert!(late.is_lost() && cancel.is_cancelled());
        assert!(!late.allows().await);
        db.close().await;
    }

    #[tokio::test]
    async fn a_run_taken_over_is_lost_and_its_writes_are_withheld() {
        let test = "a_run_taken_over_is_lost_and_its_writes_are_withheld";
        let Some((db, run, asked)) = claimed(test, Duration::from_secs(1)).await else {
            return;
        };
        let (lease, cancel) = lease(&db, &run, asked, Duration::from_millis(100));
        assert!(lease.holds().await);
        // Stopped past its lease: another process takes the run over.
        tokio::time::sleep(Duration::from_millis(1_200)).await;
        assert_eq!(db.recover("process-b", 3).await.unwrap().len(), 1);
        db.claim_run("process-b")
            .await
            .unwrap()
            .expect("taken over");
        assert!(!lease.allows().await);
        assert!(lease.is_lost() && cancel.is_cancelled());
        db.close().await;
    }

    #[tokio::test]
    async fn without_the_database_the_last_lease_counts_down_to_the_margin() {
        let test = "without_the_database_the_last_lease_counts_down_to_the_margin";
        let Some((db, run, asked)) = claimed(test, Duration::from_secs(10)).await else {
            return;
        };
        let (fresh, _) = lease(&db, &run, asked, Duration::from_secs(5));
        let old = asked - Duration::from_secs(6);
        let (stale, cancel) = lease(&db, &run, old, Duration::from_secs(5));
        db.close().await;
        // The claim's lease has 10 s left: more than the margin.
        assert!(fresh.holds().await);
        // One claimed 6 s earlier has 4 s left: less than the margin, so it is given up.
        assert!(!stale.holds().await);
        assert!(stale.is_lost() && cancel.is_cancelled());
    }
}
