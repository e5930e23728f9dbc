//! The warm pool of one engine: up to `warm_sandboxes` containers made ahead of runs
//! ([`crate::sandbox::WarmSandbox`]: started, fenced, empty), so that a run only copies its
//! repository in and opens its shell.
//!
//! - **Which.** For the shapes runs use ([`Shape`]: image, limits, network): the server's
//!   default, and each shape a run used in the last `warm_idle_secs`, most recent first,
//!   one each, the rest to the most recent. An image not on the engine is not pulled for
//!   the pool; the first run that uses it pulls it.
//! - **Preloaded** (`warm_repositories`, [`crate::sandbox::PreloadWant`]): for the
//!   repositories with runs in the last `warm_idle_secs`, most recent first, one each, the
//!   rest to the most recent, a warm sandbox already holding the checkout of the
//!   repository's latest run, for that repository's runs alone (same installation, same
//!   setup cache key). One holding an older checkout stays until one with the newer is made.
//! - **Handed out once.** [`WarmSource::take`] removes it from the pool for good; the run
//!   claims it and its container is removed with the run. A refill starts when the run's
//!   sandbox is ready, and makes each sandbox once no run on the engine is starting its
//!   sandbox or reading its change set (the two steps a container's start, its copy-in
//!   above all, slows down: they take the engine and the disk).
//! - **Removed** when it has waited `warm_idle_secs` (the default shape's is made again, so
//!   its fence and image are never older than that), at shutdown ([`WarmPool::close`]),
//!   by the engine's sweeps when its process is gone, and on the engine's return after an
//!   outage.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sandbox::{Engine, PreloadKey, PreloadWant, Shape, WarmSandbox, WarmSource};

/// How long a shape whose making failed is not tried again.
const RETRY_AFTER: Duration = Duration::from_secs(60);
/// How long [`WarmPool::still_while`] waits for a warm sandbox being made.
const STILL_WAIT: Duration = Duration::from_secs(30);
/// Longest a fill waits for the engine's runs to be past their start and their change
/// set; then it makes the sandbox all the same.
const BUSY_WAIT: Duration = Duration::from_secs(20);

/// One engine's warm sandboxes.
pub struct WarmPool {
    engine: String,
    target: usize,
    /// Preloaded sandboxes kept at most.
    repositories: usize,
    idle: Duration,
    state: Mutex<PoolState>,
    /// Runs going on in a container that was warm.
    in_use: Arc<AtomicUsize>,
    /// Runs on the engine starting their sandbox or reading their change set now.
    busy: Arc<AtomicUsize>,
    /// Made, handed out, removed idle: for the logs and the tests.
    pub made: AtomicU64,
    pub handed_out: AtomicU64,
    /// Preloaded ones made and handed out.
    pub preloaded_made: AtomicU64,
    pub preloaded_handed_out: AtomicU64,
    pub removed_idle: AtomicU64,
    closed: AtomicBool,
    /// One fill at a time.
    filling: tokio::sync::Mutex<()>,
}

#[derive(Default)]
struct PoolState {
    ready: Vec<WarmSandbox>,
    /// Shapes runs used, with when, most recent first.
    used: Vec<(Shape, Instant)>,
    /// The shape of a run with the server's defaults.
    default: Option<Shape>,
    /// Shapes whose making failed, and when.
    failed: HashMap<Shape, Instant>,
    /// The latest run's wish of each repository whose runs may take a preloaded sandbox,
    /// with when, most recent first.
    wants: Vec<(PreloadWant, Instant)>,
    /// Repositories whose preloaded sandbox could not be made, and when.
    preload_failed: HashMap<PreloadKey, Instant>,
}

/// What a fill makes next.
enum Next {
    Empty(Shape),
    Preloaded(Box<PreloadWant>),
}

/// Held by a run whose container was warm; counted in [`WarmPool::in_use`]. Also held
/// by a run starting its sandbox or reading its change set ([`WarmPool::busy_guard`]).
pub struct InUse(Arc<AtomicUsize>);

impl Drop for InUse {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

impl WarmPool {
    /// The pool of engine `engine`: `target` warm sandboxes at most, each kept
    /// `idle` at most; `default`, the shape of a run with the server's defaults.
    pub fn new(engine: &str, target: usize, idle: Duration, default: Option<Shape>) -> Self {
        WarmPool {
            engine: engine.to_string(),
            target,
            idle,
            state: Mutex::new(PoolState {
                default,
                ..Default::default()
            }),
            in_use: Arc::default(),
            busy: Arc::default(),
            repositories: 0,
            made: AtomicU64::new(0),
            handed_out: AtomicU64::new(0),
            preloaded_made: AtomicU64::new(0),
            preloaded_handed_out: AtomicU64::new(0),
            removed_idle: AtomicU64::new(0),
            closed: AtomicBool::new(false),
            filling: tokio::sync::Mutex::new(()),
        }
    }

    /// As it is, keeping up to `repositories` preloaded sandboxes too.
    pub fn preloading(mut self, repositories: usize) -> Self {
        self.repositories = repositories;
        self
    }

    pub fn enabled(&self) -> bool {
        self.target > 0 || self.repositories > 0
    }

    /// Warm sandboxes waiting now.
    pub fn warm(&self) -> usize {
        self.state.lock().ready.len()
    }

    /// Preloaded sandboxes among them.
    pub fn preloaded(&self) -> usize {
        let st = self.state.lock();
        st.ready
            .iter()
            .filter(|w| w.preloaded_for().is_some())
            .count()
    }

    /// Keeps a preloaded sandbox as `want` says for the next run of its repository (the
    /// repository's earlier wish goes, whatever its setup cache key).
    pub fn want_preload(&self, want: PreloadWant) {
        if self.repositories == 0 {
            return;
        }
        let mut st = self.state.lock();
        st.wants.retain(|(w, _)| w.key.repo != want.key.repo);
        st.preload_failed.remove(&want.key);
        st.wants.insert(0, (want, Instant::now()));
    }

    /// Counts a run starting its sandbox or reading its change set on the engine until
    /// the guard is dropped: no warm sandbox is made meanwhile.
    pub fn busy_guard(&self) -> InUse {
        self.busy.fetch_add(1, Ordering::Relaxed);
        InUse(self.busy.clone())
    }

    /// Waits (up to [`BUSY_WAIT`]) until no run on the engine is starting its sandbox or
    /// reading its change set.
    async fn until_idle(&self) {
        let started = Instant::now();
        while self.busy.load(Ordering::Relaxed) > 0 && started.elapsed() < BUSY_WAIT {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Runs going on in a container that was warm.
    pub fn in_use(&self) -> usize {
        self.in_use.load(Ordering::Relaxed)
    }

    /// Counts a run in a container that was warm until the guard is dropped.
    pub fn in_use_guard(&self) -> InUse {
        self.in_use.fetch_add(1, Ordering::Relaxed);
        InUse(self.in_use.clone())
    }

    /// How many of each shape the pool keeps now: the shapes used within `idle` and the
    /// default, most recent first, one each within the target, the rest to the first.
    fn wanted(&self, st: &PoolState, now: Instant) -> Vec<(Shape, usize)> {
        let mut shapes: Vec<Shape> = st
            .used
            .iter()
            .filter(|(_, at)| now.duration_since(*at) < self.idle)
            .map(|(s, _)| s.clone())
            .collect();
        if let Some(d) = &st.default {
            if !shapes.contains(d) {
                shapes.push(d.clone());
            }
        }
        shapes.truncate(self.target);
        let extra = self.target.saturating_sub(shapes.len());
        shapes
            .into_iter()
            .enumerate()
            .map(|(i, s)| (s, if i == 0 { 1 + extra } else { 1 }))
            .collect()
    }

    /// How many preloaded sandboxes of each repository the pool keeps now: the repositories
    /// with runs within `idle`, most recent first, one each within `repositories`, the rest
    /// to the first.
    fn wanted_preloads(&self, st: &PoolState, now: Instant) -> Vec<(PreloadWant, usize)> {
        let mut wants: Vec<PreloadWant> = st
            .wants
            .iter()
            .filter(|(_, at)| now.duration_since(*at) < self.idle)
            .map(|(w, _)| w.clone())
            .collect();
        wants.truncate(self.repositories);
        let extra = self.repositories.saturating_sub(wants.len());
        wants
            .into_iter()
            .enumerate()
            .map(|(i, w)| (w, if i == 0 { 1 + extra } else { 1 }))
            .collect()
    }

    /// Brings the pool to what it should hold on `engine`: warm sandboxes that waited too
    /// long or whose shape is no longer wanted go, missing ones are made (one at a time).
    /// Returns at once when another call is at it.
    pub async fn maintain(&self, engine: &Engine) {
        if !self.enabled() {
            return;
        }
        let Ok(_filling) = self.filling.try_lock() else {
            return;
        };
        let mut retried: Option<Shape> = None;
        loop {
            if self.closed.load(Ordering::SeqCst) {
                return;
            }
            self.until_idle().await;
            let now = Instant::now();
            let (stale, next) = self.plan(now);
            for w in stale {
                self.removed_idle.fetch_add(1, Ordering::Relaxed);
                tracing::debug!(engine = %self.engine, container = %w.id(), "removed a warm sandbox that waited too long or is no longer wanted");
                w.remove().await;
            }
            let made = match next {
                None => return,
                Some(Next::Empty(shape)) => {
                    // Not pulled for the pool: the first run with the image pulls it.
                    if !engine.has_image(&shape.image).await {
                        self.state.lock().failed.insert(shape, Instant::now());
                        continue;
                    }
                    match engine.make_warm(&shape).await {
                        // The first failure of a shape is tried again at once, quietly: a
                        // sandbox can be removed by hand (or by the engine) between its
                        // start and its plug, and the helper then finds no process to plug
                        // (`errno 2`).
                        Err(e) if retried.as_ref() != Some(&shape) => {
                            tracing::debug!(engine = %self.engine, image = %shape.image, "making a warm sandbox failed, trying again: {e}");
                            retried = Some(shape);
                            continue;
                        }
                        Err(e) => {
                            tracing::warn!(engine = %self.engine, image = %shape.image, "could not make a warm sandbox (runs start theirs as without one): {e}");
                            self.state.lock().failed.insert(shape, Instant::now());
                            continue;
                        }
                        Ok(w) => w,
                    }
                }
                Some(Next::Preloaded(want)) => match engine.make_preloaded(&want).await {
                    Ok(w) => {
                        self.preloaded_made.fetch_add(1, Ordering::Relaxed);
                        w
                    }
                    Err(e) => {
                        tracing::warn!(engine = %self.engine, commit = %want.source.commit(), "could not make a preloaded sandbox (the repository's runs copy their checkout in): {e}");
                        self.state
                            .lock()
                            .preload_failed
                            .insert(want.key, Instant::now());
                        continue;
                    }
                },
            };
            self.made.fetch_add(1, Ordering::Relaxed);
            if self.closed.load(Ordering::SeqCst) {
                made.remove().await;
                return;
            }
            tracing::debug!(engine = %self.engine, container = %made.id(), image = %made.shape().image, preloaded = made.preloaded_commit().unwrap_or("-"), "made a warm sandbox");
            self.state.lock().ready.push(made);
        }
    }

    /// What the pool holds that should go (waited too long, no longer wanted, an older
    /// checkout once the newer one's are there), and what it should make next: a missing
    /// empty one first (quick), then a missing preloaded one.
    fn plan(&self, now: Instant) -> (Vec<WarmSandbox>, Option<Next>) {
        let mut st = self.state.lock();
        st.used
            .retain(|(_, at)| now.duration_since(*at) < self.idle);
        st.wants
            .retain(|(_, at)| now.duration_since(*at) < self.idle);
        let wanted = self.wanted(&st, now);
        let preloads = self.wanted_preloads(&st, now);
        let mut keep = HashMap::<Shape, usize>::new();
        // Per repository: preloaded ones holding the wanted checkout, and older ones.
        let mut current = HashMap::<PreloadKey, usize>::new();
        let mut older: Vec<WarmSandbox> = Vec::new();
        let mut stale = Vec::new();
        for w in std::mem::take(&mut st.ready) {
            if now.duration_since(w.made()) >= self.idle {
                stale.push(w);
                continue;
            }
            match w.preloaded_for() {
                None => {
                    let quota = wanted
                        .iter()
                        .find(|(s, _)| s == w.shape())
                        .map_or(0, |(_, n)| *n);
                    let kept = keep.entry(w.shape().clone()).or_default();
                    if *kept >= quota {
                        stale.push(w);
                    } else {
                        *kept += 1;
                        st.ready.push(w);
                    }
                }
                Some(key) => match preloads.iter().find(|(p, _)| &p.key == key) {
                    None => stale.push(w),
                    Some((p, n)) => {
                        let kept = current.entry(key.clone()).or_default();
                        let same = w.preloaded_commit() == Some(p.source.commit());
                        if w.shape() != &p.shape {
                            // No run of the repository takes it now (another image, limits).
                            stale.push(w);
                        } else if !same {
                            older.push(w);
                        } else if *kept >= *n {
                            stale.push(w);
                        } else {
                            *kept += 1;
                            st.ready.push(w);
                        }
                    }
                },
            }
        }
        // An older checkout serves (its difference goes in) until the newer one is made:
        // within the repository's quota, with the newer ones counted first.
        let mut older_kept = HashMap::<PreloadKey, usize>::new();
        for w in older {
            let Some(key) = w.preloaded_for().cloned() else {
                stale.push(w);
                continue;
            };
            let quota = preloads
                .iter()
                .find(|(p, _)| p.key == key)
                .map_or(0, |(_, n)| *n);
            let newer = current.get(&key).copied().unwrap_or(0);
            let kept = older_kept.entry(key).or_default();
            if newer + *kept < quota {
                *kept += 1;
                st.ready.push(w);
            } else {
                stale.push(w);
            }
        }
        let retry =
            |at: Option<&Instant>| at.is_none_or(|at| now.duration_since(*at) >= RETRY_AFTER);
        let empty = wanted
            .into_iter()
            .find(|(s, n)| keep.get(s).copied().unwrap_or(0) < *n && retry(st.failed.get(s)));
        let next = match empty {
            Some((s, _)) => Some(Next::Empty(s)),
            None => preloads
                .into_iter()
                .find(|(p, n)| {
                    current.get(&p.key).copied().unwrap_or(0) < *n
                        && retry(st.preload_failed.get(&p.key))
                })
                .map(|(p, _)| Next::Preloaded(Box::new(p))),
        };
        (stale, next)
    }

    /// Forgets every warm sandbox (the engine was away: they may be gone) and removes
    /// those still there.
    pub async fn clear(&self) {
        let all = std::mem::take(&mut self.state.lock().ready);
        for w in all {
            w.remove().await;
        }
    }

    /// Runs `f` with the pool still and empty: waits (up to 30 s) for a warm sandbox being
    /// made, removes every warm sandbox, and makes none until `f` is done. For the sweeps
    /// after an engine outage, which remove every container of this process that no run
    /// owns: a warm sandbox being made meanwhile was one of them, removed between its start
    /// and its plug (the helper's "opening a namespace of the sandbox: errno 2").
    pub async fn still_while<F: std::future::Future>(&self, f: F) -> F::Output {
        let filling = tokio::time::timeout(STILL_WAIT, self.filling.lock()).await;
        if filling.is_err() {
            tracing::warn!(engine = %self.engine, "a warm sandbox is still being made after {}s; sweeping all the same", STILL_WAIT.as_secs());
        }
        self.clear().await;
        f.await
    }

    /// Removes every warm sandbox and makes no more: at shutdown.
    pub async fn close(&self) {
        self.closed.store(true, Ordering::SeqCst);
        self.clear().await;
    }
}

impl WarmSource for WarmPool {
    fn take(&self, shape: &Shape, preload: Option<&PreloadKey>) -> Option<WarmSandbox> {
        let mut st = self.state.lock();
        st.used.retain(|(s, _)| s != shape);
        st.used.insert(0, (shape.clone(), Instant::now()));
        st.failed.remove(shape);
        // The repository's own checkout first (the newest), else an empty one; never
        // another key's.
        let preloaded = preload.and_then(|key| {
            let newest = st
                .wants
                .iter()
                .find(|(w, _)| &w.key == key)
                .map(|(w, _)| w.source.commit().to_string());
            let mine = |w: &WarmSandbox| w.shape() == shape && w.preloaded_for() == Some(key);
            st.ready
                .iter()
                .position(|w| mine(w) && w.preloaded_commit() == newest.as_deref())
                .or_else(|| st.ready.iter().position(mine))
        });
        let i = match preloaded {
            Some(i) => {
                self.preloaded_handed_out.fetch_add(1, Ordering::Relaxed);
                i
            }
            None => st
                .ready
                .iter()
                .position(|w| w.shape() == shape && w.preloaded_for().is_none())?,
        };
        self.handed_out.fetch_add(1, Ordering::Relaxed);
        Some(st.ready.swap_remove(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sandbox::SandboxSpec;

    fn shape(image: &str) -> Shape {
        let mut spec = SandboxSpec::new("r", image);
        spec.repo_dir = Some(".".into());
        Shape::of(&spec, image)
    }

    /// The sweeps after an engine outage wait for a warm sandbox being made (a fill holds
    /// `filling`), and no fill starts while they run: the sandbox cannot be swept between
    /// its start and its plug.
    #[tokio::test]
    async fn the_sweeps_after_an_outage_wait_for_a_warm_sandbox_being_made() {
        let pool = Arc::new(WarmPool::new("e", 1, Duration::from_secs(60), None));
        let making = pool.filling.lock().await;
        let p = pool.clone();
        let sweep =
            tokio::spawn(
                async move { p.still_while(async { p.filling.try_lock().is_err() }).await },
            );
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert!(!sweep.is_finished(), "the sweep waits for the fill");
        drop(making);
        assert!(sweep.await.unwrap(), "no fill while the sweep runs");
        assert!(pool.filling.try_lock().is_ok(), "fills go on after it");
    }

    #[test]
    fn the_default_and_recent_shapes_share_the_target_most_recent_first() {
        let pool = WarmPool::new("e", 3, Duration::from_secs(60), Some(shape("default")));
        let now = Instant::now();
        let st = |used: Vec<(Shape, Instant)>| PoolState {
            used,
            default: Some(shape("default")),
            ..Default::default()
        };
        // Nothing used yet: all for the default.
        assert_eq!(pool.wanted(&st(vec![]), now), vec![(shape("default"), 3)]);
        // A recent image first, the default after.
        assert_eq!(
            pool.wanted(&st(vec![(shape("a"), now)]), now),
            vec![(shape("a"), 2), (shape("default"), 1)]
        );
        // More shapes than the target: the most recent ones.
        let used = vec![(shape("c"), now), (shape("b"), now), (shape("a"), now)];
        assert_eq!(
            pool.wanted(&st(used), now),
            vec![(shape("c"), 1), (shape("b"), 1), (shape("a"), 1)]
        );
        // A shape not used within the idle time is no longer wanted.
        let old = now.checked_sub(Duration::from_secs(120)).unwrap_or(now);
        let wanted = pool.wanted(&st(vec![(shape("a"), old)]), now);
        assert!(
            old == now || wanted == vec![(shape("default"), 3)],
            "{wanted:?}"
        );
        // Taking one marks its shape as used, first.
        let _ = pool.take(&shape("z"), None);
        assert_eq!(pool.state.lock().used[0].0, shape("z"));
        assert_eq!(
            pool.handed_out.load(Ordering::Relaxed),
            0,
            "none was waiting"
        );
    }
}
