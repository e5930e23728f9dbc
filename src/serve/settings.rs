//! The server's own settings (`config/kodx.toml`, SPEC §2): every limit and knob of `kodx
//! serve`, their defaults and their checks. Read by [`super::config::load_settings`].

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::repo_config::ServerMaxima;
use crate::sandbox::{Cidr, EngineConfig, NetworkMode, DEFAULT_MAX_DISK_BYTES};

/// What a process's lease must hold beyond one GitHub request's bound for it to act for
/// a run ([`Settings::lease_margin`]): the lease check's own round trip, and the moment
/// between the check and the request leaving.
pub const LEASE_SLACK: Duration = Duration::from_secs(2);

/// The server's own settings (`config/kodx.toml`); every key is optional.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Settings {
    /// Runs at once on this server.
    pub max_concurrent_runs: usize,
    /// The default sandbox image (a repository's `image` wins); `KODX_IMAGE` sets it too.
    pub image: String,
    /// The default model (a repository's `model` wins).
    pub model: Option<String>,
    /// Ceilings a repository's `.github/kodx.yml` cannot raise.
    pub max_cost_limit: f64,
    pub max_iterations: u32,
    /// The most repair passes a repository's `check_repair` may ask for.
    pub max_check_repair: u32,
    /// The most repair runs a repository's `ci_repair` may ask for, per pull request.
    pub max_ci_repair: u32,
    /// Wall-clock limit of one run, in seconds.
    pub run_timeout_secs: u64,
    /// The longest one `feed_chars` waits for a command, in seconds, unless the run's
    /// program sets `limits.command_timeout`.
    pub command_timeout_secs: u64,
    /// Transcripts of runs that finished longer ago than this many days are deleted (the
    /// runs' summary rows stay).
    pub transcript_days: u32,
    /// Serve the run pages (`/runs/{id}`, `/runs`); links to them need `KODX_PUBLIC_URL`.
    pub run_pages: bool,
    /// How often the status comment may be edited while a run works, in seconds.
    pub status_interval_secs: f64,
    /// How long a shutdown waits for running runs before stopping them, in seconds.
    pub shutdown_grace_secs: u64,
    /// A run left `running` by a dead process is re-queued this many times in all.
    pub max_attempts: u32,
    /// How long a run claimed by this process stays its own without a renewal, in seconds
    /// (`KODX_LEASE_SECS` sets it too); renewed every third of it. With several processes
    /// on PostgreSQL, a run whose process died or stalled is taken over once its lease ran
    /// out. A process acts for a run only while more than [`Settings::lease_margin`] of its
    /// lease is left, so it is at least `github_timeout_secs` + 5.
    pub lease_secs: u64,
    /// How long one GitHub request may take, from sending it to the last byte of the
    /// answer, in seconds (`KODX_GITHUB_TIMEOUT_SECS` sets it too); a request that takes
    /// longer is given up (and tried again, where that is safe).
    pub github_timeout_secs: u64,
    /// Tests of leases only (`KODX_TEST_LEASE_MS`; no config key): a lease this many
    /// milliseconds long, replacing `lease_secs`, with the GitHub request bound and the
    /// slack scaled down with it (3/10 and 1/5 of it, the proportions of a 10 s lease with
    /// a 3 s bound), so a taken-over run is taken over within a second or two.
    #[serde(skip)]
    pub test_lease_ms: Option<u64>,
    /// `KODX_DATA_DIR`, where the secrets' key is kept when `KODX_SECRETS_KEY` is not set
    /// (set from the environment, no config key).
    #[serde(skip)]
    pub secrets_dir: Option<PathBuf>,
    /// Recent issue comments given to an `ask` run as context.
    pub context_comments: usize,
    /// The longest PR diff given to a run as context, in bytes.
    pub max_diff_bytes: usize,
    /// Give the model the images of the issue and the request (at most 5, from GitHub's
    /// own hosts); `false` for a model that reads no images.
    pub images: bool,
    /// A changed file larger than this refuses a code run's commit, in bytes.
    pub max_commit_file_bytes: u64,
    /// Spend per installation per calendar month (UTC), in USD; new runs are refused once
    /// it is reached. None: no budget.
    pub monthly_budget_usd: Option<f64>,
    /// How long a run waits for `/kodx go` (a repository's `confirm_above_usd`) before it
    /// ends by itself, in seconds.
    pub confirm_wait_secs: u64,
    /// How long a merge run's admission asks GitHub again for a pull request's `mergeable`
    /// (which GitHub computes lazily after a push), with backoff from 1 s, in seconds.
    pub mergeable_wait_secs: u64,
    /// The sandboxes' network: `on` (a repository may ask for the cut after setup),
    /// `setup-only` (always cut after setup), `off` (none, not even for setup).
    pub network: NetworkMode,
    /// IPv4 ranges sandboxes may reach although they are private, link-local or the
    /// Docker host's (e.g. a package mirror on the internal network).
    pub network_allow: Vec<Cidr>,
    /// Whether a repository's `network.allow` is honoured: after its setup script the
    /// sandbox reaches the hosts it names through kodx's egress proxy. `false`: such a
    /// repository's sandboxes are cut from the network after setup, and the status
    /// comment says why.
    pub allow_repo_network: bool,
    /// Names kodx's egress proxy resolves to these addresses instead of asking the system's
    /// resolver (an internal mirror's name, pinned); every other name as the system says.
    pub egress_resolve: std::collections::BTreeMap<String, Vec<std::net::IpAddr>>,
    /// Bytes one sandbox may write to its own filesystem; a program's
    /// `limits.max_disk_bytes` may lower it.
    pub max_disk_bytes: u64,
    /// HTTP connections open at once (further capped below the file descriptor limit). At
    /// the cap a new connection replaces the oldest one that has no request in progress.
    pub max_connections: usize,
    /// A connection must send a complete request head within this many seconds of opening
    /// (or of its previous response), or it is closed.
    pub header_timeout_secs: f64,
    /// A response the peer reads nothing of for this many seconds is dropped with its
    /// connection (a write that makes no progress), also once its handler has returned.
    pub write_timeout_secs: f64,
    /// A webhook body must arrive in full within this many seconds of its head (GitHub
    /// itself gives up on a delivery after 10 s), or it is answered `408`.
    pub body_timeout_secs: f64,
    /// Bytes of webhook bodies whose signature is not verified yet, held at once over all
    /// connections. Past it the connection holding the most is refused (`503`), so small
    /// deliveries get through while big unsigned ones are dropped.
    pub unverified_body_bytes: usize,
    /// Where the repository cache keeps one bare mirror per repository
    /// (`KODX_REPO_CACHE_DIR` sets it too). Unset: `mirrors/` next to the SQLite database
    /// (`data/mirrors` by default).
    pub repo_cache_dir: Option<PathBuf>,
    /// Bytes all mirrors together may take before the least recently used go
    /// (`KODX_REPO_CACHE_MAX_BYTES` sets it too); `0` turns the cache off: every run clones
    /// over the network into a temporary directory.
    pub repo_cache_max_bytes: u64,
    // ---- the setup cache (sandbox::setup_cache); 0 in either turns it off ----
    /// Cached setup images kept at most, least recently used removed first.
    pub setup_cache_max_images: usize,
    /// Bytes of cached setup layers kept at most.
    pub setup_cache_max_bytes: u64,
    /// The Docker engines sandboxes run on (`[[engines]]`). Empty: the one engine
    /// `DOCKER_HOST` (or the local socket) names, with `max_concurrent_runs` sandboxes.
    pub engines: Vec<EngineConfig>,
    /// How often each engine is asked whether it answers, in seconds. Two missed answers in
    /// a row take it out of placement and stop its runs.
    pub engine_check_secs: f64,
    /// Sandboxes kept started and fenced on each engine ahead of runs (an engine's own
    /// `warm_sandboxes` first); `0`: none, every run starts its own.
    pub warm_sandboxes: usize,
    /// Warm sandboxes per engine that already hold a repository's checkout (its latest run's
    /// tip), for the repositories with the most recent runs (one each, the rest to the most
    /// recent); `0`: none. Besides `warm_sandboxes`.
    pub warm_repositories: usize,
    /// A warm sandbox waiting this long is removed (and the default image's made again);
    /// an image no run used for this long gets none.
    pub warm_idle_secs: u64,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_concurrent_runs: 2,
            image: "python:3.12".into(),
            model: None,
            max_cost_limit: 10.0,
            max_iterations: 200,
            max_check_repair: 5,
            max_ci_repair: 3,
            run_timeout_secs: 1800,
            command_timeout_secs: 30,
            transcript_days: 30,
            run_pages: true,
            status_interval_secs: 10.0,
            shutdown_grace_secs: 30,
            max_attempts: 2,
            lease_secs: crate::db::DEFAULT_LEASE.as_secs(),
            github_timeout_secs: crate::github::RequestPolicy::default()
                .request_timeout
                .as_secs(),
            test_lease_ms: None,
            context_comments: 20,
            max_diff_bytes: 200_000,
            images: true,
            max_commit_file_bytes: 10 * 1024 * 1024,
            monthly_budget_usd: None,
            confirm_wait_secs: 86_400,
            mergeable_wait_secs: 60,
            network: NetworkMode::On,
            network_allow: Vec::new(),
            allow_repo_network: true,
            egress_resolve: Default::default(),
            max_disk_bytes: DEFAULT_MAX_DISK_BYTES,
            max_connections: 4096,
            header_timeout_secs: 10.0,
            write_timeout_secs: 10.0,
            body_timeout_secs: 15.0,
            unverified_body_bytes: 64 * 1024 * 1024,
            repo_cache_dir: None,
            secrets_dir: None,
            repo_cache_max_bytes: crate::repo_cache::DEFAULT_MAX_BYTES,
            setup_cache_max_images: crate::sandbox::setup_cache::DEFAULT_MAX_IMAGES,
            setup_cache_max_bytes: crate::sandbox::setup_cache::DEFAULT_MAX_BYTES,
            engines: Vec::new(),
            engine_check_secs: 5.0,
            warm_sandboxes: 1,
            warm_repositories: 2,
            warm_idle_secs: 600,
        }
    }
}

impl Settings {
    pub fn maxima(&self) -> ServerMaxima {
        ServerMaxima {
            cost_limit: self.max_cost_limit,
            max_iterations: self.max_iterations,
        }
    }

    /// Whether runs may use the setup cache at all.
    pub fn setup_cache_on(&self) -> bool {
        self.setup_cache_max_images > 0 && self.setup_cache_max_bytes > 0
    }

    /// How long GitHub is asked for a pull request's `mergeable` (`mergeable_wait_secs`).
    pub fn mergeable_wait(&self) -> Duration {
        Duration::from_secs(self.mergeable_wait_secs)
    }

    /// How long a run waits for `/kodx go` (`confirm_wait_secs`).
    pub fn confirm_wait(&self) -> Duration {
        Duration::from_secs(self.confirm_wait_secs)
    }

    pub fn engine_check_interval(&self) -> Duration {
        Duration::from_secs_f64(self.engine_check_secs)
    }

    pub fn status_interval(&self) -> Duration {
        Duration::from_secs_f64(self.status_interval_secs.max(0.0))
    }

    /// How long a claim holds a run without a renewal (`lease_secs`).
    pub fn lease(&self) -> Duration {
        match self.test_lease_ms {
            Some(ms) => Duration::from_millis(ms),
            None => Duration::from_secs(self.lease_secs),
        }
    }

    /// How long one GitHub request may take (`github_timeout_secs`).
    pub fn github_timeout(&self) -> Duration {
        match self.test_lease_ms {
            Some(ms) => Duration::from_millis(ms * 3 / 10),
            None => Duration::from_secs(self.github_timeout_secs),
        }
    }

    /// How much of its lease a process must have left to act for a run — a GitHub write,
    /// a push, a model call, a command: one GitHub request's bound and [`LEASE_SLACK`]
    /// more, so that whatever a write allowed now does, it does before the lease can run
    /// out and another process take the run.
    pub fn lease_margin(&self) -> Duration {
        match self.test_lease_ms {
            Some(ms) => self.github_timeout() + Duration::from_millis(ms / 5),
            None => self.github_timeout() + LEASE_SLACK,
        }
    }

    /// The GitHub client's retry and timeout policy: each request bounded by
    /// `github_timeout_secs`.
    pub fn github_policy(&self) -> crate::github::RequestPolicy {
        let default = crate::github::RequestPolicy::default();
        crate::github::RequestPolicy {
            connect_timeout: default.connect_timeout.min(self.github_timeout()),
            request_timeout: self.github_timeout(),
            ..default
        }
    }

    /// `lease_secs` against `github_timeout_secs`: a lease must leave time to act once the
    /// margin is set aside.
    pub(super) fn check_lease(&self, source: &str) -> Result<(), ConfigError> {
        if !(1..=300).contains(&self.github_timeout_secs) {
            return Err(ConfigError(format!(
                "{source}: `github_timeout_secs` must be between 1 and 300 seconds"
            )));
        }
        let least = self.github_timeout_secs + LEASE_SLACK.as_secs() + 3;
        if !(least..=3600).contains(&self.lease_secs) {
            return Err(ConfigError(format!(
                "{source}: `lease_secs` must be between {least} (`github_timeout_secs` + 5: a \
                 process acts for a run only with more than one GitHub request's time and 2 s \
                 of its lease left) and 3600 seconds, got {}",
                self.lease_secs
            )));
        }
        Ok(())
    }

    pub fn header_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.header_timeout_secs)
    }

    pub fn write_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.write_timeout_secs)
    }

    pub fn body_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.body_timeout_secs)
    }

    pub(super) fn check(&self, source: &str) -> Result<(), ConfigError> {
        let bad = |key: &str, why: &str| {
            Err(ConfigError(format!(
                "{source}: `{key}` {why} (fix the file or remove the key for the default)"
            )))
        };
        if self.max_concurrent_runs == 0 || self.max_concurrent_runs > 256 {
            return bad("max_concurrent_runs", "must be between 1 and 256");
        }
        if !(self.max_cost_limit.is_finite() && self.max_cost_limit > 0.0) {
            return bad("max_cost_limit", "must be a positive amount in USD");
        }
        if self.max_iterations == 0 {
            return bad("max_iterations", "must be at least 1");
        }
        if self.run_timeout_secs == 0 {
            return bad("run_timeout_secs", "must be at least 1");
        }
        if self.command_timeout_secs == 0 {
            return bad("command_timeout_secs", "must be at least 1");
        }
        if self.transcript_days == 0 {
            return bad("transcript_days", "must be at least 1");
        }
        if !(self.status_interval_secs.is_finite() && self.status_interval_secs >= 0.0) {
            return bad("status_interval_secs", "must be zero or more seconds");
        }
        if self.max_attempts == 0 {
            return bad("max_attempts", "must be at least 1");
        }
        self.check_lease(source)?;
        if let Some(b) = self.monthly_budget_usd {
            if !(b.is_finite() && b > 0.0) {
                return bad("monthly_budget_usd", "must be a positive amount in USD");
            }
        }
        if !(1..=30 * 86_400).contains(&self.confirm_wait_secs) {
            return bad(
                "confirm_wait_secs",
                "must be between 1 and 2592000 seconds (30 days)",
            );
        }
        if self.mergeable_wait_secs > 600 {
            return bad("mergeable_wait_secs", "must be at most 600 seconds");
        }
        if self.max_commit_file_bytes == 0 {
            return bad("max_commit_file_bytes", "must be at least 1");
        }
        if self.image.trim().is_empty() {
            return bad("image", "must name an image");
        }
        if self.max_disk_bytes < 1 << 20 {
            return bad("max_disk_bytes", "must be at least 1048576 (1 MiB)");
        }
        if self.max_connections < 2 {
            return bad("max_connections", "must be at least 2");
        }
        let seconds = |v: f64| v.is_finite() && (0.01..=3600.0).contains(&v);
        if !seconds(self.header_timeout_secs) {
            return bad(
                "header_timeout_secs",
                "must be between 0.01 and 3600 seconds",
            );
        }
        if !seconds(self.write_timeout_secs) {
            return bad(
                "write_timeout_secs",
                "must be between 0.01 and 3600 seconds",
            );
        }
        if !seconds(self.body_timeout_secs) {
            return bad("body_timeout_secs", "must be between 0.01 and 3600 seconds");
        }
        if self.unverified_body_bytes < 64 * 1024 {
            return bad("unverified_body_bytes", "must be at least 65536 (64 KiB)");
        }
        if self.warm_sandboxes > crate::sandbox::engines::MAX_WARM {
            return bad(
                "warm_sandboxes",
                &format!(
                    "must be between 0 and {}",
                    crate::sandbox::engines::MAX_WARM
                ),
            );
        }
        if self.warm_repositories > crate::sandbox::engines::MAX_WARM {
            return bad(
                "warm_repositories",
                &format!(
                    "must be between 0 and {}",
                    crate::sandbox::engines::MAX_WARM
                ),
            );
        }
        if !(10..=86_400).contains(&self.warm_idle_secs) {
            return bad("warm_idle_secs", "must be between 10 and 86400 seconds");
        }
        if !(self.engine_check_secs.is_finite() && (0.1..=300.0).contains(&self.engine_check_secs))
        {
            return bad("engine_check_secs", "must be between 0.1 and 300 seconds");
        }
        if let Err(e) = crate::sandbox::engines::check_list(&self.engines) {
            return Err(ConfigError(format!("{source}: [[engines]]: {e}")));
        }
        Ok(())
    }
}

/// A configuration problem, worded for the person starting the server.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);
