//! One run's sandbox: its container, the named shells in it, the disk watchdog, and the
//! workspace read back out of it ([`Sandbox`]'s export and change set); removed when
//! destroyed or dropped.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bollard::query_parameters::{InspectContainerOptions, KillContainerOptions};
use bollard::Docker;

use super::cleanup::{remove, remove_blocking};
use super::preload::{PreloadSource, PreloadUse, PreloadWant};
use super::runner::Runner;
use super::snapshot::{Snapshot, Workspace};
use super::spare::{open_or_start, SpareShell, FIRST_SPARE_AFTER};
use super::spec::SandboxSpec;
use super::streams::Opener;
use crate::archive::{self, ArchiveLimits, ChangeSet, Exported, Manifest};
use crate::setup_cache::SetupReport;
use crate::shell::{FeedOutput, Shell, Spawned};
use crate::{Finished, Reports, Result, Sandbox, SandboxError};

/// How a sandbox's disk use is bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DiskGuard {
    /// The engine's storage quota: writes past it fail with "No space left on device".
    Quota,
    /// kodx's watchdog: the run is stopped past the limit.
    Watchdog,
    /// No limit (`max_disk_bytes` unset).
    None,
}

/// One run's container. Removed by [`Sandbox::destroy`], or, if that is never called (a
/// panic, a dropped future), when the value is dropped.
pub struct DockerSandbox {
    pub(super) docker: Docker,
    pub(super) id: String,
    run_id: String,
    pub(super) workdir: String,
    output_cap: usize,
    pub(super) archive_limits: ArchiveLimits,
    pub(super) baseline: Mutex<Manifest>,
    shells: Mutex<HashMap<String, Arc<Shell>>>,
    /// The next shell's exec, started ahead.
    spare: SpareShell,
    destroyed: AtomicBool,
    disk_guard: DiskGuard,
    /// The disk watchdog, stopped with the sandbox.
    watchdog: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Set by the watchdog when the disk limit was passed: (limit, bytes written).
    disk_tripped: tokio::sync::watch::Sender<Option<(u64, u64)>>,
    /// How the setup went (the cache's part in it).
    pub(super) setup: Mutex<SetupReport>,
    /// Its container was made warm, ahead of the run.
    pub(super) warm_start: AtomicBool,
    /// The change set from a snapshot ([`super::snapshot`]): whether one can be taken,
    /// and its exec started ahead.
    pub(super) snapshot: Snapshot,
    /// The check runner, started before anything of the repository ran; `None` without
    /// it (or once it was lost): then each check is an engine exec of its own.
    pub(super) runner: tokio::sync::Mutex<Option<Runner>>,
    /// Its address on the sandboxes' network once it was narrowed to the egress proxy.
    pub(super) egress_address: Mutex<Option<std::net::Ipv4Addr>>,
    /// The ready checkout its workspace holds whole, or was brought to from (a preloaded
    /// sandbox's), found by the copy-in.
    pub(super) preload_source: Mutex<Option<PreloadSource>>,
    /// A preloaded sandbox for the next run of its repository ([`super::preload`]).
    pub(super) preload_want: Mutex<Option<PreloadWant>>,
    /// How the copy-in used the preloaded sandbox it was made from, if it was.
    pub(super) preload_use: Mutex<Option<PreloadUse>>,
}

/// Most shells one sandbox keeps at once.
pub const MAX_SHELLS: usize = 16;

impl DockerSandbox {
    pub(super) fn new(
        docker: Docker,
        id: String,
        spec: &SandboxSpec,
        workdir: &str,
        disk_guard: DiskGuard,
    ) -> Self {
        DockerSandbox {
            spare: SpareShell::new(docker.clone(), &id, workdir, spec.output_cap),
            docker,
            id,
            run_id: spec.run_id.clone(),
            workdir: workdir.to_string(),
            output_cap: spec.output_cap,
            archive_limits: spec.archive_limits.clone().for_disk(spec.max_disk_bytes),
            baseline: Mutex::new(Manifest::default()),
            shells: Mutex::new(HashMap::new()),
            destroyed: AtomicBool::new(false),
            disk_guard,
            watchdog: Mutex::new(None),
            disk_tripped: tokio::sync::watch::Sender::new(None),
            setup: Mutex::new(SetupReport::default()),
            warm_start: AtomicBool::new(false),
            snapshot: Snapshot::new(spec.change_set_ahead),
            runner: tokio::sync::Mutex::new(None),
            egress_address: Mutex::new(None),
            preload_source: Mutex::new(None),
            preload_want: Mutex::new(None),
            preload_use: Mutex::new(None),
        }
    }

    pub fn container_id(&self) -> &str {
        &self.id
    }

    /// Whether the setup came from the cache, and how long it took.
    pub fn setup_report(&self) -> SetupReport {
        *self.setup.lock()
    }

    /// The address kodx's egress proxy knows this sandbox by, once its network was narrowed
    /// to the proxy ([`super::EgressSpec`]); `None` without it.
    pub fn egress_address(&self) -> Option<std::net::Ipv4Addr> {
        *self.egress_address.lock()
    }

    /// Whether its container was a warm sandbox, made ahead of the run.
    pub fn warm_start(&self) -> bool {
        self.warm_start.load(Ordering::Relaxed)
    }

    /// A preloaded sandbox for the next run of this one's repository: its key, shape and
    /// the ready checkout to fill it from (once; `None` for a run without a key, or whose
    /// checkout is not kept whole).
    pub fn preload_want(&self) -> Option<PreloadWant> {
        self.preload_want.lock().take()
    }

    /// How the copy-in used a preloaded sandbox, when the run's container was one.
    pub fn preload_use(&self) -> Option<PreloadUse> {
        *self.preload_use.lock()
    }

    /// How this sandbox's disk use is bounded: the engine's quota or kodx's watchdog.
    pub fn disk_guard(&self) -> DiskGuard {
        self.disk_guard
    }

    /// Starts the watchdog: the container's writable layer (as the engine counts it) is
    /// checked every `max_interval` at most, more often near the limit; past `limit` the
    /// container is killed and the run stops with [`SandboxError::DiskLimit`].
    pub(super) fn watch_disk(&self, limit: u64, max_interval: Duration) {
        let docker = self.docker.clone();
        let id = self.id.clone();
        let tripped = self.disk_tripped.clone();
        let task = tokio::spawn(async move {
            // A burst of writes at this rate cannot pass the limit by much between checks.
            const RATE: u64 = 1 << 30;
            let min_interval = max_interval.min(Duration::from_secs(1));
            // Not while the container starts: the engine has enough to do then, and the
            // first files (the repository) are still going in.
            tokio::time::sleep(min_interval).await;
            loop {
                let info = docker
                    .inspect_container(&id, Some(InspectContainerOptions { size: true }))
                    .await;
                let used = match info {
                    Ok(info) => info.size_rw.unwrap_or(0).max(0) as u64,
                    Err(bollard::errors::Error::DockerResponseServerError {
                        status_code: 404,
                        ..
                    }) => return,
                    Err(e) => {
                        tracing::warn!("checking the sandbox's disk use failed: {e}");
                        tokio::time::sleep(max_interval).await;
                        continue;
                    }
                };
                if used > limit {
                    tracing::warn!(
                        used,
                        limit,
                        "the sandbox passed its disk limit; stopping it"
                    );
                    // Known before the container dies, so a setup script or a command that
                    // ends with it ends for this reason.
                    tripped.send_replace(Some((limit, used)));
                    if let Err(e) = docker
                        .kill_container(&id, None::<KillContainerOptions>)
                        .await
                    {
                        tracing::warn!("stopping the sandbox past its disk limit failed: {e}");
                    }
                    return;
                }
                let left = Duration::from_secs_f64((limit - used) as f64 / RATE as f64);
                tokio::time::sleep(left.clamp(min_interval, max_interval)).await;
            }
        });
        if let Some(old) = self.watchdog.lock().replace(task) {
            old.abort();
        }
    }

    /// The disk limit error, once the watchdog tripped.
    pub(super) fn disk_error(&self) -> Option<SandboxError> {
        self.disk_tripped
            .borrow()
            .map(|(limit, used)| SandboxError::DiskLimit { limit, used })
    }

    /// Resolves when the watchdog trips; never otherwise.
    pub(super) async fn disk_exceeded(&self) -> SandboxError {
        let mut rx = self.disk_tripped.subscribe();
        let tripped = rx.wait_for(|v| v.is_some()).await.map(|v| *v);
        match tripped {
            Ok(Some((limit, used))) => SandboxError::DiskLimit { limit, used },
            _ => std::future::pending().await,
        }
    }

    fn stop_watchdog(&self) {
        if let Some(task) = self.watchdog.lock().take() {
            task.abort();
        }
    }

    /// Opens the sandbox's first shell, `default`: `early` when its exec was started ahead
    /// (while the sandbox was fenced and filled), else a new one. Its spare follows.
    pub(super) async fn open_first_shell(&self, early: Option<Result<Spawned>>) -> Result<()> {
        let shell = open_or_start(
            early,
            &self.docker,
            &self.id,
            "default",
            &self.workdir,
            self.output_cap,
            None,
        )
        .await?;
        self.shells.lock().insert("default".to_string(), shell);
        self.spare.schedule(FIRST_SPARE_AFTER);
        self.snapshot
            .start_ahead(&self.docker, &self.id, &self.workdir);
        Ok(())
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    fn shell(&self, name: &str) -> Result<Arc<Shell>> {
        self.shells
            .lock()
            .get(name)
            .cloned()
            .ok_or_else(|| SandboxError::UnknownShell(name.to_string()))
    }

    /// Opens tar streams of the workspace for the archive code on a blocking thread.
    pub(super) fn opener(&self) -> Opener {
        Opener {
            docker: self.docker.clone(),
            id: self.id.clone(),
            workdir: self.workdir.clone(),
            handle: tokio::runtime::Handle::current(),
            failure: Arc::default(),
        }
    }

    pub(super) fn root_name(&self) -> &str {
        self.workdir.rsplit('/').next().unwrap_or("workspace")
    }
}

impl Drop for DockerSandbox {
    fn drop(&mut self) {
        if !self.destroyed.swap(true, Ordering::SeqCst) {
            self.stop_watchdog();
            self.spare.clear();
            self.snapshot.abort();
            self.shells.lock().clear();
            remove_blocking(&self.docker, &self.id);
        }
    }
}

fn validate_shell_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(SandboxError::InvalidInput(format!(
            "shell name {name:?} must be 1-64 characters of letters, digits, '-', '_' or '.'"
        )))
    }
}

#[async_trait]
impl Sandbox for DockerSandbox {
    async fn create_new_shell(&self, name: &str) -> Result<String> {
        validate_shell_name(name)?;
        {
            let shells = self.shells.lock();
            if !shells.contains_key(name) && shells.len() >= MAX_SHELLS {
                return Err(SandboxError::InvalidInput(format!(
                    "{MAX_SHELLS} shells are open already; reuse one, or replace one with create_new_shell(\"<its name>\")"
                )));
            }
        }
        let old_pid = self.shells.lock().get(name).and_then(|old| old.pid());
        let spare = self.spare.take().await.map(Ok);
        let shell = open_or_start(
            spare,
            &self.docker,
            &self.id,
            name,
            &self.workdir,
            self.output_cap,
            old_pid,
        )
        .await;
        self.spare.schedule(Duration::ZERO);
        let shell = shell?;
        let replaced = self.shells.lock().insert(name.to_string(), shell).is_some();
        Ok(format!(
            "{} shell {name:?} in {}.",
            if replaced { "Replaced" } else { "Started" },
            self.workdir
        ))
    }

    async fn feed_chars(
        &self,
        name: &str,
        chars: &str,
        yield_time: Duration,
    ) -> Result<FeedOutput> {
        self.shell(name)?.feed(chars, yield_time).await
    }

    async fn run_to_end(&self, command: &str, timeout: Duration, cap: usize) -> Result<Finished> {
        self.exec_to_end(command, timeout, cap).await
    }

    async fn run_all(
        &self,
        commands: &[(String, Duration)],
        within: Duration,
        cap: usize,
        reports: Reports,
    ) -> Result<()> {
        self.run_batch(commands, within, cap, reports).await
    }

    async fn export_workspace(&self, dest: &Path) -> Result<Exported> {
        let opener = self.opener();
        let root = self.root_name().to_string();
        let dest = dest.to_path_buf();
        let limits = self.archive_limits.clone();
        let baseline = self.baseline.lock().clone();
        tokio::task::spawn_blocking(move || {
            let mut open = |path: &str| opener.open(path);
            let exported =
                archive::replace_dir_from(&mut open, &root, &dest, &limits, Some(&baseline));
            opener.verdict(exported, "downloading the workspace")
        })
        .await
        .map_err(|e| SandboxError::InvalidInput(format!("export task failed: {e}")))?
    }

    async fn change_set(&self) -> Result<ChangeSet> {
        if let Some(set) = self.snapshot_change_set().await {
            return Ok(set);
        }
        self.full_change_set().await
    }

    fn workdir(&self) -> &str {
        &self.workdir
    }

    async fn halted(&self) -> String {
        self.disk_exceeded().await.to_string()
    }

    async fn destroy(&self) -> Result<()> {
        if self.destroyed.swap(true, Ordering::SeqCst) {
            return Ok(());
        }
        self.stop_watchdog();
        self.spare.clear();
        self.snapshot.abort();
        self.shells.lock().clear();
        remove(&self.docker, &self.id).await
    }
}

impl DockerSandbox {
    /// Whether the change set can come from a snapshot (the copy-in left its marker).
    pub fn snapshot_ready(&self) -> bool {
        self.snapshot.is_ready()
    }

    /// The change set from the helper's snapshot, when the copy-in left its marker; `None`
    /// when there is none to take or it failed (said in the log): then read the whole
    /// workspace.
    pub async fn snapshot_change_set(&self) -> Option<ChangeSet> {
        if !self.snapshot.is_ready() {
            return None;
        }
        let workspace = Workspace {
            docker: &self.docker,
            id: &self.id,
            workdir: &self.workdir,
            opener: self.opener(),
            root: self.root_name().to_string(),
            baseline: self.baseline.lock().clone(),
            limits: self.archive_limits.clone(),
        };
        self.snapshot.change_set(workspace).await
    }

    /// The change set from the whole workspace read back and compared with the baseline:
    /// what [`Sandbox::change_set`] falls back to when the snapshot cannot be used.
    pub async fn full_change_set(&self) -> Result<ChangeSet> {
        let opener = self.opener();
        let root = self.root_name().to_string();
        let baseline = self.baseline.lock().clone();
        let limits = self.archive_limits.clone();
        tokio::task::spawn_blocking(move || {
            let mut open = |path: &str| opener.open(path);
            let changes = archive::change_set_from(&mut open, &root, &baseline, &limits);
            opener.verdict(changes, "downloading the workspace")
        })
        .await
        .map_err(|e| SandboxError::InvalidInput(format!("change set task failed: {e}")))?
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_names_are_checked() {
        assert!(validate_shell_name("server").is_ok());
        assert!(validate_shell_name("a b").is_err());
        assert!(validate_shell_name(&"x".repeat(65)).is_err());
    }
}
