//! The workers of `kodx serve` (SPEC §4, §5, §9): they take what the webhook queued and do
//! the slow part — permission checks, the repository's config, the status comment, the
//! clone, the container and the agent — and say on GitHub how it went.
//!
//! Two kinds of work leave the queue: short control jobs (`help`, `cancel`, refusals), taken
//! at once, and runs (`ask`, `code`), at most `max_concurrent_runs` at a time and one per
//! issue. A run is acknowledged (`eyes`, the status comment) as soon as it is queued, even
//! while it waits for a free worker.

mod ack;
mod recovery;
mod run;
mod tasks;

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::agent::StopReason;
use crate::cost::Pricing;
use crate::db::{Db, Run, RunStatus};
use crate::github::GitHubApp;
use crate::serve::config::Settings;
use crate::serve::metrics::Metrics;
use crate::serve::pipeline::ending::Panicked;
use crate::serve::pipeline::{ending, Lease, RunFailure, RunLog, Services};
use tasks::Tasks;

use crate::serve::pipeline::engines::Engines;
use crate::serve::pipeline::resources::ProviderFactory;

/// The queue's side of this process: what it claims, when, and how many at once. What the
/// runs use is in its [`Services`] (`svc`).
pub struct Workers {
    pub(in crate::serve) svc: Services,
    pub wake: Arc<Notify>,
    /// Stops claiming; running runs get `shutdown_grace_secs`, then are stopped.
    pub shutdown: CancellationToken,
    slots: Arc<Semaphore>,
}

/// Connections one egress proxy (one per engine) serves at once; more wait in the
/// kernel's backlog.
const EGRESS_MAX_CONNECTIONS: usize = 1024;

impl Workers {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        db: Db,
        app: GitHubApp,
        engine: Arc<Engines>,
        settings: Settings,
        metrics: Arc<Metrics>,
        wake: Arc<Notify>,
        providers: Arc<dyn ProviderFactory>,
        pricing: Pricing,
        shutdown: CancellationToken,
    ) -> Arc<Workers> {
        let slots = Arc::new(Semaphore::new(settings.max_concurrent_runs));
        Arc::new(Workers {
            svc: Services {
                db,
                app,
                engine,
                metrics,
                providers,
                pricing,
                run_links: std::sync::OnceLock::new(),
                github_web: std::sync::OnceLock::new(),
                worker_id: format!(
                    "{}-{}-{:08x}",
                    hostname(),
                    std::process::id(),
                    rand::random::<u32>()
                ),
                running: Mutex::new(HashMap::new()),
                acks: Mutex::new(HashMap::new()),
                steer_wakes: Default::default(),
                egress: crate::egress::Proxies::new(
                    crate::egress::Resolver::Pinned(
                        settings.egress_resolve.clone().into_iter().collect(),
                    ),
                    EGRESS_MAX_CONNECTIONS,
                ),
                settings,
            },
            wake,
            shutdown,
            slots,
        })
    }

    /// Claims and starts work until shutdown; returns when the last run has ended.
    pub async fn run(self: Arc<Self>) {
        let mut tasks = Tasks::default();
        // Old transcripts go daily (and at start, in `recover`).
        let pruner = {
            let this = self.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep(Duration::from_secs(86_400)) => {}
                        _ = this.shutdown.cancelled() => return,
                    }
                    this.prune_transcripts().await;
                }
            })
        };
        // Leases: renewed while this process runs its runs (through the shutdown grace
        // too); on a shared queue, runs whose lease expired are taken back as well.
        let leases = {
            let this = self.clone();
            tokio::spawn(async move {
                let every = this.svc.db.lease() / 3;
                loop {
                    tokio::time::sleep(every).await;
                    if let Err(e) = this.svc.db.renew_leases(&this.svc.worker_id).await {
                        tracing::warn!("renewing the leases of running runs failed: {e}");
                    }
                    if this.svc.db.is_shared() {
                        // A run another process took back stops here (after a pause past
                        // its lease, say).
                        let held: Vec<Lease> = this
                            .svc
                            .running
                            .lock()
                            .values()
                            .map(|h| h.lease.clone())
                            .collect();
                        for lease in held {
                            lease.holds().await;
                        }
                    }
                    if this.svc.db.is_shared() && !this.shutdown.is_cancelled() {
                        this.requeue_orphans().await;
                        crate::serve::commands::cancel::apply_requests(&this.svc).await;
                        this.wake.notify_one();
                    }
                }
            })
        };
        // On a shared queue, other processes' queued runs and cancels wake this one at once.
        let listener = tokio::spawn(self.clone().listen_for_wakeups());
        loop {
            if self.shutdown.is_cancelled() {
                break;
            }
            self.dispatch(&mut tasks).await;
            for p in tasks.reap() {
                self.panicked(p).await;
            }
            tokio::select! {
                _ = self.wake.notified() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = self.shutdown.cancelled() => {}
            }
        }
        // Shutdown: no new work. Runs get the grace period, then are stopped; a stopped run
        // stays `running` in the database and is queued again when kodx starts.
        let grace = Duration::from_secs(self.svc.settings.shutdown_grace_secs);
        if !tasks.is_empty() {
            tracing::info!(
                "shutting down: waiting up to {}s for {} task(s)",
                grace.as_secs(),
                tasks.len()
            );
        }
        let waited = tokio::time::timeout(grace, self.join_all(&mut tasks)).await;
        if waited.is_err() {
            for handle in self.svc.running.lock().values() {
                handle.cancel.cancel();
            }
            self.join_all(&mut tasks).await;
        }
        pruner.abort();
        leases.abort();
        listener.abort();
        self.svc.engine.close_warm().await;
        let n = crate::sandbox::docker::remove_all_live().await;
        if n > 0 {
            tracing::info!("removed {n} sandbox container(s) at shutdown");
        }
    }

    /// Turns the database's notifications into wake-ups (PostgreSQL; returns at once on
    /// SQLite). A lost connection is logged once per outage and retried every second;
    /// meanwhile the one-second poll carries on.
    async fn listen_for_wakeups(self: Arc<Self>) {
        let mut outage = false;
        loop {
            match self.svc.db.listen().await {
                Ok(None) => return,
                Ok(Some(mut notifications)) => {
                    if outage {
                        tracing::info!("listening for queue notifications again");
                    }
                    // Anything queued or cancelled while not listening.
                    self.wake.notify_one();
                    crate::serve::commands::cancel::apply_requests(&self.svc).await;
                    self.svc.heard_of_a_steer();
                    loop {
                        match notifications.next().await {
                            Ok(crate::db::Wakeup::Queued) => self.wake.notify_one(),
                            Ok(crate::db::Wakeup::Steer) => self.svc.heard_of_a_steer(),
                            Ok(crate::db::Wakeup::Cancel) => {
                                crate::serve::commands::cancel::apply_requests(&self.svc).await
                            }
                            Err(e) => {
                                tracing::warn!(
                                    "queue notifications stopped: {e}; polling meanwhile"
                                );
                                outage = true;
                                break;
                            }
                        }
                    }
                }
                Err(e) if !outage => {
                    tracing::warn!("cannot listen for queue notifications: {e}; polling meanwhile");
                    outage = true;
                }
                Err(_) => {}
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = self.shutdown.cancelled() => return,
            }
        }
    }

    /// Waits for every task to end.
    async fn join_all(self: &Arc<Self>, tasks: &mut Tasks) {
        while let Some(ended) = tasks.join_next().await {
            if let Some(p) = ended {
                self.panicked(p).await;
            }
        }
    }

    /// A task that panicked: its run fails as an internal error (nothing else would ever
    /// finish it), with a log line and the status comment saying so.
    async fn panicked(self: &Arc<Self>, p: Panicked) {
        tracing::error!(run_id = %p.run_id, "a worker task panicked: {}", p.message);
        self.svc.forget_ack(&p.run_id);
        if self.svc.running.lock().remove(&p.run_id).is_some() {
            self.svc.metrics.run_ended();
        }
        self.wake.notify_one();
        let run = match self.svc.db.get_run(&p.run_id).await {
            Ok(Some(run)) if !run.status.is_final() => run,
            Ok(_) => return,
            Err(e) => {
                tracing::error!(run_id = %p.run_id, "reading the run of a panicked task failed: {e}");
                return;
            }
        };
        let failure = RunFailure::Internal(anyhow::Error::new(p));
        ending::conclude(
            &self.svc,
            &run,
            Err(failure),
            &RunLog::default(),
            Instant::now(),
        )
        .await;
    }

    async fn dispatch(self: &Arc<Self>, tasks: &mut Tasks) {
        // Control jobs first: they are quick and a cancel must not wait for a slot.
        loop {
            match self.svc.db.claim_control(&self.svc.worker_id).await {
                Ok(Some(job)) => {
                    let this = self.clone();
                    let span = run_span(&job);
                    let id = job.id.clone();
                    tasks.spawn(
                        &id,
                        async move { crate::serve::commands::control(&this.svc, job).await }
                            .instrument(span),
                    );
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::error!("claiming a job failed: {e}");
                    break;
                }
            }
        }
        // Acknowledge queued runs (eyes, status comment) even while they wait.
        match self.svc.db.runs_with_status(RunStatus::Queued).await {
            Ok(queued) => {
                self.svc.metrics.set_queued(queued.len() as i64);
                let now = crate::db::now_ms();
                for run in queued.into_iter().filter(|r| r.is_work()) {
                    // Waiting for `/kodx go`: ended once its time has passed.
                    if let Some(until) = run.held_until {
                        if until <= now {
                            self.expire_hold(tasks, &run, now).await;
                        }
                        continue;
                    }
                    if run.status_comment_id.is_some() || self.svc.acks.lock().contains_key(&run.id)
                    {
                        continue;
                    }
                    let this = self.clone();
                    let span = run_span(&run);
                    tasks.spawn(
                        &run.id.clone(),
                        async move {
                            this.ensure_acknowledged(&run).await;
                        }
                        .instrument(span),
                    );
                }
            }
            Err(e) => tracing::error!("listing queued runs failed: {e}"),
        }
        // Runs, while there are free slots.
        loop {
            let Ok(permit) = self.slots.clone().try_acquire_owned() else {
                break;
            };
            // The lease runs from no earlier than this.
            let claimed_at = Instant::now();
            match self.svc.db.claim_run(&self.svc.worker_id).await {
                Ok(Some(run)) => {
                    let this = self.clone();
                    let span = run_span(&run);
                    tasks.spawn(
                        &run.id.clone(),
                        async move {
                            this.work(run, claimed_at).await;
                            drop(permit);
                            this.wake.notify_one();
                        }
                        .instrument(span),
                    );
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::error!("claiming a run failed: {e}");
                    break;
                }
            }
        }
    }
}

impl Workers {
    /// Ends a run that waited for `/kodx go` past its time, if no other process ended it
    /// (or started it) first; its status comment says so.
    async fn expire_hold(self: &Arc<Self>, tasks: &mut Tasks, run: &Run, now: i64) {
        let ended = match self.svc.db.expire_hold(&run.id, now).await {
            Ok(Some(ended)) => ended,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(run_id = %run.id, "ending a run that waited too long failed: {e}");
                return;
            }
        };
        tracing::info!(run_id = %run.id, "nobody said /kodx go in time: run ended");
        let this = self.clone();
        let span = run_span(&ended);
        tasks.spawn(
            &ended.id.clone(),
            async move {
                let why =
                    crate::serve::texts::confirm::unconfirmed(this.svc.settings.confirm_wait());
                let done = ending::failed_done(&ended, StopReason::Cancelled, why);
                crate::serve::pipeline::status::post_done(&this.svc, &ended, &done).await;
            }
            .instrument(span),
        );
    }
}

fn run_span(run: &Run) -> tracing::Span {
    tracing::info_span!("run", repo = %run.request.repo, issue = run.request.issue_number, run_id = %run.id, command = %run.kind())
}

fn hostname() -> String {
    std::fs::read_to_string("/etc/hostname")
        .ok()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "kodx".into())
}
