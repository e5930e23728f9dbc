//! The Docker engines runs are placed on: the server's `[[engines]]` list, or the one
//! engine `DOCKER_HOST` names. Each engine is connected on first use and asked every
//! `engine_check_secs` whether it answers.
//!
//! - **Placement.** A run goes to an engine that answers and has room (`max_runs`, counting
//!   this process's placements and every process's running sandboxes on it), preferring
//!   the engine that holds the repository's setup cache, then one that has the image
//!   already, then the one with the most room. With room nowhere, the run waits for it.
//! - **Outages.** An engine that misses two answers in a row (checks, or calls made to
//!   place or start a run) is out of placement, and its
//!   runs are stopped (their [`Placement::lost`] token fires). When it answers again, the
//!   containers this process left there for runs that are over are removed, as are those
//!   of dead kodx processes, and it takes runs again.

use parking_lot::Mutex;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use super::warm::WarmPool;
use crate::sandbox::{Engine, EngineConfig, SandboxError, Shape};

/// Where an engine is.
#[derive(Debug, Clone)]
enum Target {
    /// `DOCKER_HOST` (TLS with `DOCKER_TLS_VERIFY`) or the local socket.
    Environment,
    Listed(EngineConfig),
}

/// What a check found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Health {
    /// Not asked yet.
    Unknown,
    Up,
    Down,
}

struct MemberState {
    health: Health,
    /// Checks missed in a row.
    missed: u32,
    /// Why it is down (or the last failed check).
    error: Option<String>,
    /// Runs this process placed here.
    placed: HashSet<String>,
    /// Fired when the engine goes down; replaced when it comes back.
    down: CancellationToken,
}

struct Member {
    name: String,
    target: Target,
    max_runs: usize,
    /// Its warm sandboxes.
    warm: Arc<WarmPool>,
    engine: tokio::sync::Mutex<Option<Engine>>,
    state: Mutex<MemberState>,
}

/// One engine as `/healthz`, `/metrics` and `kodx doctor` show it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct EngineStatus {
    pub name: String,
    pub host: String,
    pub up: bool,
    /// Runs this process placed there.
    pub runs: usize,
    pub max_runs: usize,
    /// Warm sandboxes waiting there, and runs going on in one that was warm.
    pub warm: usize,
    pub warm_in_use: usize,
    /// Warm sandboxes waiting there that hold a repository's checkout.
    pub warm_preloaded: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// A run's place on an engine, held until the run is over.
pub struct Placement {
    pub engine: Engine,
    /// The engine's name in the server's list (`local` for the one default engine).
    pub name: String,
    run_id: String,
    member: Arc<Member>,
    changed: Arc<Notify>,
    down: CancellationToken,
}

impl Placement {
    /// Fires when the engine stops answering while the run is placed there.
    pub fn lost(&self) -> &CancellationToken {
        &self.down
    }

    /// The engine's warm sandboxes, when it keeps any.
    pub fn warm(&self) -> Option<&WarmPool> {
        self.member.warm.enabled().then_some(&*self.member.warm)
    }

    /// Makes up for a warm sandbox taken, in the background.
    pub fn refill(&self) {
        refill(&self.member, &self.engine);
    }
}

/// Brings `member`'s warm pool up to its target on `engine`, in the background.
fn refill(member: &Arc<Member>, engine: &Engine) {
    if member.warm.enabled() {
        let pool = member.warm.clone();
        let engine = engine.clone();
        tokio::spawn(async move { pool.maintain(&engine).await });
    }
}

/// The server's warm sandboxes setting: per engine at most `per_engine` (an engine's own
/// `warm_sandboxes` first), each kept `idle` at most; `default`, the shape of a run with
/// the server's defaults.
#[derive(Debug, Clone)]
pub struct WarmSettings {
    pub per_engine: usize,
    /// Preloaded sandboxes per engine ([`crate::sandbox::PreloadWant`]).
    pub repositories: usize,
    pub idle: Duration,
    pub default: Option<Shape>,
}

impl Drop for Placement {
    fn drop(&mut self) {
        self.member.state.lock().placed.remove(&self.run_id);
        self.changed.notify_waiters();
    }
}

/// Why no engine took a run.
#[derive(Debug, thiserror::Error)]
#[error("no Docker engine answers: {0}")]
pub struct NoEngine(pub String);

/// The engines of this server.
pub struct Engines {
    members: Vec<Arc<Member>>,
    /// The installation's id: labels its containers, names its clones.
    instance: Option<String>,
    /// Room freed or an engine came back.
    changed: Arc<Notify>,
    /// The queue, when several processes share it (PostgreSQL): engine slots are taken
    /// there ([`crate::db::Db::take_engine_slot`]).
    shared: Option<crate::db::Db>,
}

impl Engines {
    /// The engines of installation `instance` ([`crate::db::Db::instance_id`]): `listed`, or
    /// when empty the one `DOCKER_HOST` names with `default_max_runs` sandboxes.
    pub fn new(instance: Option<String>, listed: &[EngineConfig], default_max_runs: usize) -> Self {
        let member = |name: String, target, max_runs| {
            Arc::new(Member {
                warm: Arc::new(WarmPool::new(&name, 0, Duration::ZERO, None)),
                name,
                target,
                max_runs,
                engine: Default::default(),
                state: Mutex::new(MemberState {
                    health: Health::Unknown,
                    missed: 0,
                    error: None,
                    placed: HashSet::new(),
                    down: CancellationToken::new(),
                }),
            })
        };
        let members = if listed.is_empty() {
            vec![member(
                "local".into(),
                Target::Environment,
                default_max_runs.max(1),
            )]
        } else {
            listed
                .iter()
                .map(|c| member(c.name.clone(), Target::Listed(c.clone()), c.max_runs))
                .collect()
        };
        Engines {
            members,
            instance,
            changed: Arc::new(Notify::new()),
            shared: None,
        }
    }

    /// Each engine keeps warm sandboxes as `warm` says.
    pub fn with_warm(mut self, warm: &WarmSettings) -> Self {
        for m in &mut self.members {
            let per_engine = match &m.target {
                Target::Listed(c) => c.warm_sandboxes.unwrap_or(warm.per_engine),
                Target::Environment => warm.per_engine,
            };
            if let Some(m) = Arc::get_mut(m) {
                m.warm = Arc::new(
                    WarmPool::new(&m.name, per_engine, warm.idle, warm.default.clone())
                        .preloading(warm.repositories),
                );
            }
        }
        self
    }

    /// Removes every engine's warm sandboxes and makes no more: at shutdown.
    pub async fn close_warm(&self) {
        futures_util::future::join_all(self.members.iter().map(|m| m.warm.close())).await;
    }

    /// Engine slots counted in `db` too, for processes sharing its queue (PostgreSQL).
    pub fn shared_through(mut self, db: crate::db::Db) -> Self {
        self.shared = db.is_shared().then_some(db);
        self
    }

    pub fn instance(&self) -> Option<&str> {
        self.instance.as_deref()
    }

    /// The connected engine of `member`, connecting when needed.
    async fn connect(&self, member: &Member) -> Result<Engine, SandboxError> {
        let mut slot = member.engine.lock().await;
        if let Some(e) = slot.as_ref() {
            return Ok(e.clone());
        }
        let mut engine = match &member.target {
            Target::Environment => Engine::connect().await?,
            Target::Listed(c) => Engine::connect_to(c).await?,
        };
        if let Some(instance) = &self.instance {
            engine = engine.with_instance(instance.clone());
        }
        *slot = Some(engine.clone());
        Ok(engine)
    }

    /// Every engine that answers now (for recovery at start); those that do not are
    /// skipped with a warning.
    pub async fn answering(&self) -> Vec<(String, Engine)> {
        let mut out = Vec::new();
        for m in &self.members {
            match self.connect(m).await {
                Ok(e) => out.push((m.name.clone(), e)),
                Err(e) => {
                    tracing::warn!(engine = %m.name, "the Docker engine does not answer: {e}")
                }
            }
        }
        out
    }

    /// Places run `run_id` (running under `lease`; image `image`, repository `scope`) on an
    /// engine, waiting while every engine that answers is full. Fails at once when none
    /// answers.
    pub async fn place(
        &self,
        run_id: &str,
        lease: &crate::db::Lease,
        image: &str,
        scope: &str,
    ) -> Result<Placement, NoEngine> {
        loop {
            // Registered before looking, so room freed meanwhile is not missed.
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let mut candidates: Vec<((bool, bool, usize), usize, Engine)> = Vec::new();
            let mut reasons = Vec::new();
            let mut any_up = false;
            for (i, m) in self.members.iter().enumerate() {
                let placed = {
                    let st = m.state.lock();
                    if st.health == Health::Down {
                        reasons.push(format!(
                            "{}: {}",
                            m.name,
                            st.error.as_deref().unwrap_or("down")
                        ));
                        continue;
                    }
                    st.placed.len()
                };
                let engine = match self.connect(m).await {
                    Ok(e) => e,
                    Err(e) => {
                        self.missed(m, &e.to_string());
                        reasons.push(format!("{}: {e}", m.name));
                        continue;
                    }
                };
                let running = match engine.running_sandboxes().await {
                    Ok(n) => n,
                    Err(e) => {
                        self.missed(m, &e.to_string());
                        reasons.push(format!("{}: {e}", m.name));
                        continue;
                    }
                };
                any_up = true;
                let used = placed.max(running);
                if used >= m.max_runs {
                    continue;
                }
                let score = (
                    engine.has_setup_cache_for(scope).await,
                    engine.has_image(image).await,
                    m.max_runs - used,
                );
                candidates.push((score, i, engine));
            }
            // Best first; among equals, the first listed (a stable sort).
            candidates.sort_by_key(|c| std::cmp::Reverse(c.0));
            for (_, i, engine) in candidates {
                let m = &self.members[i];
                // Re-checked under the lock: another run may have taken the last room.
                let down = {
                    let mut st = m.state.lock();
                    if st.health == Health::Down || st.placed.len() >= m.max_runs {
                        continue;
                    }
                    st.placed.insert(run_id.to_string());
                    st.down.clone()
                };
                let placement = Placement {
                    engine,
                    name: m.name.clone(),
                    run_id: run_id.to_string(),
                    member: m.clone(),
                    changed: self.changed.clone(),
                    down,
                };
                // Processes sharing the queue share the engines: the database counts
                // their runs on it (dropping the placement gives the local slot back).
                if let Some(db) = &self.shared {
                    match db
                        .take_engine_slot(run_id, lease, &m.name, m.max_runs)
                        .await
                    {
                        Ok(true) => {}
                        Ok(false) => continue,
                        Err(e) => {
                            tracing::warn!(engine = %m.name, "counting the engine's runs in the database failed: {e}");
                            continue;
                        }
                    }
                }
                return Ok(placement);
            }
            if !any_up {
                return Err(NoEngine(reasons.join("; ")));
            }
            // Full everywhere: wait for room (or an engine's return), looking again now
            // and then for other processes' sandboxes that ended.
            let _ = tokio::time::timeout(Duration::from_secs(1), changed).await;
        }
    }

    /// One failed answer of `member` (a check, a connection, a call): the second in a row
    /// takes it out of placement.
    fn missed(&self, member: &Member, error: &str) {
        let down = {
            let mut st = member.state.lock();
            st.missed += 1;
            st.error = Some(error.to_string());
            st.missed >= 2 && st.health != Health::Down
        };
        if down {
            self.mark_down(member, error);
        }
    }

    /// Takes `member` out of placement, firing its runs' [`Placement::lost`].
    fn mark_down(&self, member: &Member, error: &str) {
        let mut st = member.state.lock();
        st.error = Some(error.to_string());
        if st.health != Health::Down {
            tracing::warn!(engine = %member.name, "the Docker engine stopped answering: {error}");
            st.health = Health::Down;
            st.down.cancel();
        }
    }

    /// A run found the engine named `name` not answering (counts as a missed check).
    pub fn report_failure(&self, name: &str, error: &str) {
        if let Some(m) = self.members.iter().find(|m| m.name == name) {
            self.missed(m, error);
        }
    }

    /// Asks each engine once whether it answers (all at once), and acts on what changed.
    pub async fn check(&self) {
        futures_util::future::join_all(self.members.iter().map(|m| self.check_one(m))).await;
    }

    async fn check_one(&self, m: &Member) {
        let answer = match self.connect(m).await {
            Ok(engine) => {
                match tokio::time::timeout(Duration::from_secs(3), engine.docker().ping()).await {
                    Ok(Ok(_)) => Ok(engine),
                    Ok(Err(e)) => Err(e.to_string()),
                    Err(_) => Err("no answer within 3 s".to_string()),
                }
            }
            Err(e) => Err(e.to_string()),
        };
        match answer {
            Ok(engine) => {
                let was = m.state.lock().health;
                if was == Health::Down {
                    self.came_back(m, &engine).await;
                } else {
                    let mut st = m.state.lock();
                    st.health = Health::Up;
                    st.missed = 0;
                    st.error = None;
                }
            }
            Err(error) => self.missed(m, &error),
        }
    }

    /// An engine answers again: what this process left there for runs that are over goes,
    /// and dead processes' containers too; then it takes runs again.
    async fn came_back(&self, m: &Member, engine: &Engine) {
        // Its warm sandboxes may be gone with it: made again, after the sweeps (which would
        // remove one being made, before its plug).
        let live = m.state.lock().placed.clone();
        let (own, dead) = m
            .warm
            .still_while(async {
                (
                    engine.sweep_own_except(&live).await,
                    engine.sweep_dead_owners().await,
                )
            })
            .await;
        let removed = own.as_ref().map_or(0, |n| *n) + dead.as_ref().map_or(0, |n| *n);
        if let Err(e) = own.and(dead) {
            tracing::warn!(engine = %m.name, "could not sweep the engine's old containers: {e}");
        }
        {
            let mut st = m.state.lock();
            st.health = Health::Up;
            st.missed = 0;
            st.error = None;
            st.down = CancellationToken::new();
        }
        tracing::info!(
            engine = %m.name,
            removed,
            "the Docker engine answers again; removed the containers of runs that ended while it was away"
        );
        self.changed.notify_waiters();
    }

    /// Checks every engine each `interval` until `stop`.
    pub async fn watch(self: Arc<Self>, interval: Duration, stop: CancellationToken) {
        loop {
            self.check().await;
            // Warm pools kept up on the engines that answer (in the background: a slow
            // engine does not hold the checks up).
            for m in &self.members {
                if m.warm.enabled() && m.state.lock().health == Health::Up {
                    if let Some(engine) = m.engine.lock().await.clone() {
                        refill(m, &engine);
                    }
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(interval) => {}
                _ = stop.cancelled() => return,
            }
        }
    }

    /// Every engine as last seen.
    pub fn statuses(&self) -> Vec<EngineStatus> {
        self.members
            .iter()
            .map(|m| {
                let st = m.state.lock();
                EngineStatus {
                    name: m.name.clone(),
                    host: match &m.target {
                        Target::Environment => std::env::var("DOCKER_HOST")
                            .ok()
                            .filter(|h| !h.is_empty())
                            .unwrap_or_else(|| "unix:///var/run/docker.sock".into()),
                        Target::Listed(c) => c.host.clone(),
                    },
                    up: st.health != Health::Down,
                    runs: st.placed.len(),
                    max_runs: m.max_runs,
                    warm: m.warm.warm(),
                    warm_in_use: m.warm.in_use(),
                    warm_preloaded: m.warm.preloaded(),
                    error: st.error.clone(),
                }
            })
            .collect()
    }

    /// `Ok` when at least one engine answers; else what each one said.
    pub async fn ping(&self) -> Result<(), String> {
        let mut errors = Vec::new();
        for m in &self.members {
            let r = match self.connect(m).await {
                Ok(engine) => engine.docker().ping().await.map(|_| ()).map_err(|e| {
                    format!(
                        "the Docker engine at {} does not answer: {e}",
                        engine.host()
                    )
                }),
                Err(e) => Err(e.to_string()),
            };
            match r {
                Ok(()) => return Ok(()),
                Err(e) if self.members.len() == 1 => return Err(e),
                Err(e) => errors.push(format!("{}: {e}", m.name)),
            }
        }
        Err(errors.join("; "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gone(name: &str) -> EngineConfig {
        EngineConfig {
            name: name.into(),
            host: format!("unix:///nonexistent/kodx-test-{name}.sock"),
            tls_cert_path: None,
            max_runs: 1,
            warm_sandboxes: None,
        }
    }

    #[tokio::test]
    async fn an_engine_is_out_after_two_missed_checks_and_placement_says_why() {
        let lease = crate::db::Lease {
            worker: "w".into(),
            epoch: 1,
        };
        let engines = Engines::new(None, &[gone("a"), gone("b")], 2);
        engines.check().await;
        // One missed check is not an outage.
        assert!(engines.statuses().iter().all(|s| s.up && s.error.is_some()));
        engines.check().await;
        let statuses = engines.statuses();
        assert!(statuses.iter().all(|s| !s.up), "{statuses:?}");
        let err = engines
            .place("r1", &lease, "img", "acme/widgets")
            .await
            .err()
            .unwrap();
        assert!(err.0.contains("a: ") && err.0.contains("b: "), "{err}");
        let health = engines.ping().await.unwrap_err();
        assert!(health.contains("a: ") && health.contains("b: "), "{health}");
    }

    #[tokio::test]
    async fn without_a_list_there_is_one_engine_named_local() {
        let engines = Engines::new(Some("inst".into()), &[], 3);
        let s = engines.statuses();
        assert_eq!(s.len(), 1);
        assert_eq!(
            (s[0].name.as_str(), s[0].max_runs, s[0].runs),
            ("local", 3, 0)
        );
        assert_eq!(engines.instance(), Some("inst"));
    }
}
