//! Making a run's sandbox: the hardened container (dropped capabilities, no new
//! privileges, memory, CPU, process and disk limits, the owner labels) with kodx's files
//! in, started and, while the repository is copied in, fenced; then the setup script, the
//! network cut, and the first shell. A warm sandbox ([`super::warm`]) is such a container
//! made ahead, already fenced. Whatever fails on the way, the container is removed.

use std::collections::HashMap;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bollard::models::{ContainerCreateBody, HostConfig, NetworkDisconnectRequest};
use bollard::query_parameters::CreateContainerOptions;
use bollard::Docker;

use super::cleanup::{creation_gate, register_live, remove};
use super::derived::{kodx_files, SandboxImage};
use super::engine::Engine;
use super::preload::{
    PreloadKey, PreloadSource, PreloadUse, PreloadWant, Preloaded, MAX_PRELOADED_ENTRIES,
};
use super::runner::Runner;
use super::sandbox::{DiskGuard, DockerSandbox};
use super::setup::{exec_checked, CachePlan};
use super::spare::spawn_ahead;
use super::spec::Shape;
use super::spec::{SandboxSpec, DEFAULT_OUTPUT_CAP};
use super::streams::{upload, upload_options, Decided, Have, PackTask};
use super::warm::{WarmSandbox, WarmSource};
use crate::archive::{self, Manifest};
use crate::net::{self, NETWORK_NAME};
use crate::owner::{run_labels, CHECKS_OF_LABEL, PRELOADED_LABEL, RUN_LABEL, WARM_LABEL};
use crate::setup_cache::{SetupCacheUse, SetupReport};
use crate::shell::Spawned;
use crate::{Result, Sandbox, SandboxError};

/// Capabilities kept: what `apt-get`, `pip`, `chown` and servers on high ports need.
/// Everything else Docker grants by default (NET_RAW, MKNOD, SYS_CHROOT, SETFCAP, SETPCAP,
/// AUDIT_WRITE) is dropped.
const KEPT_CAPABILITIES: [&str; 8] = [
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "SETGID",
    "SETUID",
    "NET_BIND_SERVICE",
];

impl Engine {
    /// Starts a run's sandbox: a hardened container with the repository copied in, the setup
    /// script run to the end and the network cut when asked. On any error the container is
    /// removed before returning.
    pub async fn start(&self, spec: &SandboxSpec) -> Result<DockerSandbox> {
        self.start_with_progress(spec, |_| {}).await
    }

    /// As [`Engine::start`], reporting each phase to `progress`.
    pub async fn start_with_progress(
        &self,
        spec: &SandboxSpec,
        progress: impl FnMut(&str),
    ) -> Result<DockerSandbox> {
        self.start_from(spec, None, progress).await
    }

    /// As [`Engine::start_with_progress`], taking the container from `warm` when it holds
    /// one of the run's [`Shape`] (with the image the run starts from, after the setup
    /// cache's say): started and fenced already, so only the repository, the setup and
    /// the shell are left.
    pub async fn start_from(
        &self,
        spec: &SandboxSpec,
        warm: Option<&dyn WarmSource>,
        mut progress: impl FnMut(&str),
    ) -> Result<DockerSandbox> {
        validate_run_id(&spec.run_id)?;
        if let Some(dir) = &spec.repo_dir {
            let is_dir = std::fs::metadata(dir)
                .map_err(|e| {
                    SandboxError::io(format!("reading the directory {}", dir.display()), e)
                })?
                .is_dir();
            if !is_dir {
                return Err(SandboxError::InvalidInput(format!(
                    "{} is not a directory",
                    dir.display()
                )));
            }
        }
        // Pack on a blocking thread, streamed into the upload once the container runs.
        let pack = spec.repo_dir.clone().map(|dir| PackTask::start(dir, spec));
        self.ensure_image(&spec.image, &mut progress).await?;
        let mut cache = self.setup_cache_plan(spec).await;
        let cached = cache.as_ref().and_then(|c| c.hit.clone());
        let shape = Shape::of(spec, cached.as_deref().unwrap_or(&spec.image));
        // A preloaded sandbox is tied to the server's key and this setup cache key.
        let preload = spec.preload.as_ref().map(|repo| PreloadKey {
            repo: repo.clone(),
            setup: cache.as_ref().map(|c| c.key.clone()),
        });
        let claimed = match warm.and_then(|w| w.take(&shape, preload.as_ref())) {
            Some(w) => match w.claim(&spec.run_id).await {
                Ok(claimed) => Some(claimed),
                // Gone meanwhile (a sweep, an engine restart): start one as without it.
                Err(e) => {
                    tracing::warn!("the warm sandbox could not be used ({e}); starting one");
                    None
                }
            },
            None => None,
        };
        let warm_start = claimed.is_some();
        let (id, guard, fencing, shell, preloaded) = match claimed {
            Some(c) => (c.id, c.guard, None, c.shell, c.preloaded),
            None => {
                progress("creating container");
                let name = format!("kodx-{}", spec.run_id);
                let mut labels = run_labels(&spec.run_id, self.instance.as_deref());
                if let Some(run) = &spec.checks_of {
                    labels.insert(CHECKS_OF_LABEL.to_string(), run.clone());
                }
                let made = match self.make_container(&shape, &name, labels.clone()).await {
                    Ok(made) => made,
                    // The cached image was evicted by another process since the lookup:
                    // set up as without it.
                    Err(e) if cached.is_some() => {
                        tracing::warn!(
                            "the cached setup image is gone ({e}); running the setup script"
                        );
                        if let Some(c) = cache.as_mut() {
                            c.hit = None;
                        }
                        self.make_container(&Shape::of(spec, &spec.image), &name, labels)
                            .await?
                    }
                    Err(e) => return Err(e),
                };
                (made.0, made.1, made.2, None, None)
            }
        };
        let sandbox = DockerSandbox::new(self.docker.clone(), id, spec, shape.workdir, guard);
        if guard == DiskGuard::Watchdog {
            if let Some(limit) = spec.max_disk_bytes {
                sandbox.watch_disk(limit, spec.disk_check_interval);
            }
        }
        let preloaded_at = preloaded.as_ref().map(|p| p.source.commit().to_string());
        let prepared = tokio::select! {
            r = self.prepare(&sandbox, spec, cache.as_ref(), (pack, preloaded), (fencing, shell), &mut progress) => r,
            e = sandbox.disk_exceeded() => Err(e),
        };
        // A setup script killed by the watchdog fails too: the disk limit is the reason.
        let prepared = match (prepared, sandbox.disk_error()) {
            (Err(_), Some(e)) => Err(e),
            (r, _) => r,
        };
        match prepared {
            Ok(()) => {
                sandbox.warm_start.store(warm_start, Ordering::Relaxed);
                // What the next run of this repository can start from.
                let source = sandbox.preload_source.lock().take();
                let entries = sandbox.baseline.lock().len();
                if let (Some(key), Some(source), true) =
                    (preload, source, entries <= MAX_PRELOADED_ENTRIES)
                {
                    *sandbox.preload_want.lock() = Some(PreloadWant {
                        key,
                        shape: Shape::of(spec, cached_image(&cache).unwrap_or(&spec.image)),
                        source,
                        cached: cached_image(&cache).is_some(),
                    });
                }
                if let Some(commit) = preloaded_at {
                    tracing::info!(preloaded = %commit, "the run took a preloaded sandbox");
                }
                Ok(sandbox)
            }
            Err(e) => {
                let _ = sandbox.destroy().await;
                Err(e)
            }
        }
    }

    /// Makes a warm sandbox of `shape`: the container as a run of that shape would have it,
    /// with kodx's files in, started and fenced, carrying this process's owner labels (so
    /// the sweeps of dead processes' containers remove it) and [`WARM_LABEL`].
    pub async fn make_warm(&self, shape: &Shape) -> Result<WarmSandbox> {
        self.make_warm_labelled(shape, None).await
    }

    /// As [`Engine::make_warm`], with the label `label` (name, value) too.
    pub(super) async fn make_warm_labelled(
        &self,
        shape: &Shape,
        label: Option<(&str, &str)>,
    ) -> Result<WarmSandbox> {
        let made = std::time::Instant::now();
        let warm_id = format!("warm-{:016x}", rand::random::<u64>());
        let mut labels = run_labels(&warm_id, self.instance.as_deref());
        labels.insert(WARM_LABEL.to_string(), "1".to_string());
        if let Some((name, value)) = label {
            labels.insert(name.to_string(), value.to_string());
        }
        let name = format!("kodx-{warm_id}");
        let (id, guard, fencing) = self.make_container(shape, &name, labels).await?;
        let mut warm = WarmSandbox::new(self.docker.clone(), id, shape.clone(), guard, made);
        raise_fence(&self.docker, warm.id(), fencing).await?;
        // Its first shell's exec too, waiting (kodx's helper) to be opened by the run.
        match spawn_ahead(&self.docker, warm.id(), shape.workdir, DEFAULT_OUTPUT_CAP).await {
            Some(Ok(s)) => warm.set_shell(s),
            Some(Err(e)) => tracing::debug!("no shell started ahead in a warm sandbox: {e}"),
            None => {}
        }
        Ok(warm)
    }

    /// Makes a warm sandbox of `want.shape` and copies `want.source` into it: a preloaded
    /// sandbox for the runs of `want.key`. Fails when the ready checkout is no longer kept.
    pub async fn make_preloaded(&self, want: &PreloadWant) -> Result<WarmSandbox> {
        let label = (PRELOADED_LABEL, want.key.repo.as_str());
        let mut warm = self.make_warm_labelled(&want.shape, Some(label)).await?;
        let (id, workdir) = (warm.id().to_string(), want.shape.workdir);
        // Over a cached setup image's checkout, as a run from it: only what differs.
        let stored = match want.cached {
            true => self.clear_cached_workspace(&id, workdir).await?,
            false => None,
        };
        let mark = !want.cached;
        let pack =
            PackTask::ready_checkout(want.source.ready.clone(), want.source.key.clone(), mark);
        let marked = pack.marked.clone();
        let manifest = self.copy_repository(&id, pack, &mut |_| {}).await?;
        if let Some(stored) = &stored {
            self.delete_gone((&id, workdir), stored, &manifest).await?;
        }
        warm.set_preloaded(Preloaded {
            key: want.key.clone(),
            source: want.source.clone(),
            manifest: Arc::new(manifest),
            snapshot_ready: mark && marked.load(std::sync::atomic::Ordering::Relaxed),
        });
        Ok(warm)
    }

    /// Makes a container of `shape` named `name` with `labels` and kodx's files in it (the
    /// shells' rc file, the network helper), and starts it. The fence, when there is one,
    /// is returned to be raised before anything runs in it. On error nothing is left.
    pub(super) async fn make_container(
        &self,
        shape: &Shape,
        name: &str,
        labels: HashMap<String, String>,
    ) -> Result<(String, DiskGuard, Option<net::Fencing>)> {
        if !shape.no_network {
            net::check_arch(&self.facts().await?.arch)?;
        }
        let (network, plug) = match shape.no_network {
            true => (None, false),
            false => {
                let (network, fencer) = tokio::join!(
                    net::ensure_network(&self.docker, NETWORK_NAME),
                    net::fencer_ready(&self.docker, &self.host)
                );
                let network = network?;
                let plug = fencer && net::plugs(&self.host, &network);
                (Some(network), plug)
            }
        };
        // A plugged sandbox's fence reads the engine host's addresses itself. Else they are
        // read while the container is made: the fence needs them only once it runs.
        let host_addrs = async {
            match (&network, plug) {
                (None, _) => Ok(None),
                (Some(_), true) => Ok(Some(Default::default())),
                (Some(_), false) => net::host_addresses(&self.docker, &self.host, name)
                    .await
                    .map(Some),
            }
        };
        let made = async {
            // A plugged sandbox is made without a network: the fencer gives it one.
            let network_id = network.as_ref().filter(|_| !plug).map(|n| n.id.as_str());
            let image = self.sandbox_image(&shape.image).await;
            let made = self
                .create_container(shape, &image.name, name, labels.clone(), network_id)
                .await;
            let (image, (id, guard)) = match made {
                // The derived image was removed since this process found it.
                Err(e) if image.has_files => {
                    tracing::warn!(
                        "the sandbox image {} is gone ({e}); copying kodx's files in",
                        image.name
                    );
                    self.forget_derived(&image.name);
                    let made = self
                        .create_container(shape, &shape.image, name, labels.clone(), network_id)
                        .await?;
                    (
                        SandboxImage {
                            name: shape.image.clone(),
                            has_files: false,
                        },
                        made,
                    )
                }
                made => (image, made?),
            };
            let started = async {
                // kodx's own files (the shells' rc file, the helper that is the main
                // process) are in the derived image; else they go in before the start.
                if !image.has_files {
                    upload(&self.docker, &id, "/", archive::pack_files(&kodx_files())).await?;
                }
                self.docker
                    .start_container(&id, None)
                    .await
                    .map_err(|e| SandboxError::docker("starting the container", e))
            };
            match started.await {
                Ok(()) => Ok((id, guard)),
                Err(e) => {
                    let _ = remove(&self.docker, &id).await;
                    Err(e)
                }
            }
        };
        let (host_addrs, made) = tokio::join!(host_addrs, made);
        let (id, guard) = made?;
        let host_addrs = match host_addrs {
            Ok(a) => a,
            Err(e) => {
                let _ = remove(&self.docker, &id).await;
                return Err(e);
            }
        };
        let fencing = match (network, host_addrs) {
            (Some(net), Some(addrs)) => net::Fencing::plan(
                &net,
                plug,
                &addrs,
                &shape.allowed_cidrs,
                &self.host,
                labels.get(RUN_LABEL).map_or(name, String::as_str),
            ),
            _ => None,
        };
        Ok((id, guard, fencing))
    }

    /// Makes the container of `shape`; returns its id and how its disk use is bounded.
    async fn create_container(
        &self,
        shape: &Shape,
        image: &str,
        name: &str,
        labels: HashMap<String, String>,
        network: Option<&str>,
    ) -> Result<(String, DiskGuard)> {
        let limits = &shape.limits;
        // kodx's helper (the main process, shells started ahead, the snapshot) from its
        // read-only volume: nothing in the sandbox can replace it.
        let helper = match net::has_helper() {
            true => Some(net::helper_volume(&self.docker).await?),
            false => None,
        };
        let host_config = HostConfig {
            mounts: helper.map(|v| vec![net::helper_mount(&v)]),
            init: Some(true),
            privileged: Some(false),
            security_opt: Some(vec!["no-new-privileges:true".to_string()]),
            cap_drop: Some(vec!["ALL".to_string()]),
            cap_add: Some(KEPT_CAPABILITIES.iter().map(|c| c.to_string()).collect()),
            memory: Some(limits.memory_bytes),
            memory_swap: Some(limits.memory_bytes),
            nano_cpus: Some(limits.nano_cpus),
            pids_limit: Some(limits.pids),
            network_mode: Some(network.unwrap_or("none").to_string()),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            // Keeps the container alive without running anything of the image (the
            // helper's `hold`); the engine's init (PID 1) reaps what the model's shells
            // leave behind.
            cmd: Some(net::hold_command()),
            entrypoint: Some(vec![]),
            // Nothing of the image runs but what kodx runs: not its healthcheck either.
            healthcheck: Some(net::no_healthcheck()),
            working_dir: Some(shape.workdir.to_string()),
            labels: Some(labels),
            tty: Some(false),
            host_config: Some(host_config),
            ..Default::default()
        };
        let try_quota = match (shape.max_disk_bytes, shape.disk_quota) {
            (None, _) | (_, Some(false)) => false,
            (Some(_), Some(true)) => true,
            (Some(_), None) => {
                !self.quota_refused.load(Ordering::Relaxed) && self.facts().await?.may_have_quota()
            }
        };
        // Held until the container is registered, so an interrupt's cleanup cannot miss it.
        let _creating = creation_gate().read().await;
        let create = |body: ContainerCreateBody| {
            self.docker.create_container(
                Some(CreateContainerOptions {
                    name: Some(name.to_string()),
                    ..Default::default()
                }),
                body,
            )
        };
        let failed =
            |e| SandboxError::docker(format!("creating the container from {}", shape.image), e);
        let (created, guard) = match shape.max_disk_bytes.filter(|_| try_quota) {
            Some(limit) => {
                let mut with_quota = body.clone();
                if let Some(hc) = with_quota.host_config.as_mut() {
                    hc.storage_opt = Some(HashMap::from([("size".to_string(), limit.to_string())]));
                }
                match create(with_quota).await {
                    Ok(c) => (c, DiskGuard::Quota),
                    // "--storage-opt is supported only for overlay over xfs with 'pquota'
                    // mount option", and the like: the watchdog takes over.
                    Err(bollard::errors::Error::DockerResponseServerError {
                        status_code,
                        message,
                    }) if status_code != 409 => {
                        let created = create(body).await.map_err(failed)?;
                        // Made without the quota: the quota was what the engine refused.
                        tracing::info!(reason = %message, "the engine has no storage quota for containers; kodx watches their disk use instead");
                        self.quota_refused.store(true, Ordering::Relaxed);
                        (created, DiskGuard::Watchdog)
                    }
                    Err(e) => return Err(failed(e)),
                }
            }
            None => {
                let guard = if shape.max_disk_bytes.is_some() {
                    DiskGuard::Watchdog
                } else {
                    DiskGuard::None
                };
                (create(body).await.map_err(failed)?, guard)
            }
        };
        let id = created.id;
        register_live(&self.docker, &id);
        Ok((id, guard))
    }

    /// Brings a started container to where the run begins: fenced (unless it was made
    /// warm, fenced already), the repository in, the setup script run (or its cached
    /// result used), the network cut when asked, and the default shell open.
    async fn prepare(
        &self,
        sandbox: &DockerSandbox,
        spec: &SandboxSpec,
        cache: Option<&CachePlan>,
        (pack, preloaded): (Option<PackTask>, Option<Preloaded>),
        (fencing, ready): (Option<net::Fencing>, Option<Spawned>),
        progress: &mut impl FnMut(&str),
    ) -> Result<()> {
        let hit = cache.is_some_and(|c| c.hit.is_some());
        // The network is fenced while the files go in: nothing runs in the container
        // (setup script, shells) before both are done. The first shell's exec starts
        // meanwhile, as kodx's helper waiting to be told to run the shell (after the setup
        // and the network cut): the engine's part of a shell is off the path.
        let early = async {
            match ready {
                // A warm sandbox's, started with it.
                Some(shell) if shell.output_cap() == spec.output_cap => Some(Ok(shell)),
                _ => {
                    spawn_ahead(&self.docker, &sandbox.id, &sandbox.workdir, spec.output_cap).await
                }
            }
        };
        // The check runner too: it makes itself untouchable by the sandbox's processes
        // (non-dumpable) as it starts, and no process of the repository's may run before
        // it has (the setup script and the shells wait for this join), so none could reach
        // its stdout, where it reports the checks (`runner`).
        let runner = async {
            match spec.checks_ahead {
                true => Runner::start(&self.docker, &sandbox.id).await,
                false => None,
            }
        };
        let (prepared, early, runner) = tokio::join!(
            async {
                tokio::try_join!(
                    raise_fence(&self.docker, &sandbox.id, fencing),
                    self.copy_in(sandbox, spec, hit, (pack, preloaded), progress)
                )
            },
            early,
            runner
        );
        let ((), cleaned) = prepared?;
        match runner {
            Some(Ok(runner)) => *sandbox.runner.lock().await = Some(runner),
            Some(Err(e)) => tracing::warn!(
                "the check runner did not start ({e}); each check will run as an engine exec of its own"
            ),
            None => {}
        }
        let report = match (&spec.setup_script, cache) {
            (Some(_), Some(_)) if hit => SetupReport {
                cache: SetupCacheUse::Hit,
                took: cleaned,
            },
            (Some(_), cache) => {
                self.run_setup_script(sandbox, spec, cache, progress)
                    .await?
            }
            (None, _) => SetupReport::default(),
        };
        *sandbox.setup.lock() = report;
        match &spec.egress {
            Some(egress) if !spec.no_network => {
                progress("narrowing the network to the egress proxy");
                self.narrow_network(sandbox, egress).await?;
            }
            _ if spec.disable_network_after_setup && !spec.no_network => {
                progress("cutting the network");
                cut_network(&self.docker, &self.host, &sandbox.id).await?;
            }
            _ => {}
        }
        progress("starting the shell");
        sandbox.open_first_shell(early).await
    }

    /// Copies the setup script and the repository into the started container. On a cache
    /// hit the repository goes in over the cached image's checkout, and the result is how
    /// long bringing that up to date took. Into a preloaded sandbox, only what differs
    /// from its checkout goes.
    async fn copy_in(
        &self,
        sandbox: &DockerSandbox,
        spec: &SandboxSpec,
        hit: bool,
        (pack, preloaded): (Option<PackTask>, Option<Preloaded>),
        progress: &mut impl FnMut(&str),
    ) -> Result<Option<Duration>> {
        let (id, workdir) = (sandbox.id.as_str(), sandbox.workdir.as_str());
        match &spec.setup_script {
            Some(script) if !hit => {
                let files = [("tmp/setup.sh", script.as_bytes(), 0o700)];
                upload(&self.docker, id, "/", archive::pack_files(&files)).await?;
            }
            _ => {}
        }
        let started = std::time::Instant::now();
        let Some(mut pack) = pack else {
            return Ok(hit.then(|| started.elapsed()));
        };
        let (marked, kept) = (pack.marked.clone(), pack.source.clone());
        let (manifest, snapshot_ready) = match preloaded {
            Some(pre) => {
                let held = pre.source.clone();
                let copied = self
                    .copy_over_preloaded(sandbox, pack, pre, progress)
                    .await?;
                // A whole copy names the run's tip; else the held checkout stays the source.
                *sandbox.preload_source.lock() = Some(match (&spec.ready, kept.lock().take()) {
                    (Some(ready), Some(key)) => PreloadSource {
                        ready: ready.clone(),
                        key,
                    },
                    _ => held,
                });
                copied
            }
            None => {
                let stored = match hit {
                    true => self.clear_cached_workspace(id, workdir).await?,
                    false => None,
                };
                pack.tell(match &stored {
                    Some(m) => Have::Stored(m.clone()),
                    None => Have::Nothing,
                });
                let manifest = self.copy_repository(id, pack, progress).await?;
                if let Some(stored) = &stored {
                    self.delete_gone((id, workdir), stored, &manifest).await?;
                }
                if let (Some(ready), Some(key)) = (&spec.ready, kept.lock().take()) {
                    *sandbox.preload_source.lock() = Some(PreloadSource {
                        ready: ready.clone(),
                        key,
                    });
                }
                // Only a whole checkout, in a container nothing has run in, gets a snapshot.
                (manifest, marked.load(Ordering::Relaxed) && !hit)
            }
        };
        sandbox.snapshot.set_ready(snapshot_ready);
        *sandbox.baseline.lock() = manifest;
        Ok(hit.then(|| started.elapsed()))
    }

    /// Brings a preloaded sandbox's checkout (`pre`) to the run's tip: nothing at the same
    /// tip, the difference at one the clone can diff with, else the whole checkout into the
    /// emptied workspace (or, over a cached setup image's, the tree packed over it).
    /// Returns the run's baseline and whether a snapshot can give the change set.
    async fn copy_over_preloaded(
        &self,
        sandbox: &DockerSandbox,
        mut pack: PackTask,
        pre: Preloaded,
        progress: &mut impl FnMut(&str),
    ) -> Result<(Manifest, bool)> {
        let (id, workdir) = (sandbox.id.as_str(), sandbox.workdir.as_str());
        let marked = pack.marked.clone();
        pack.tell(Have::Preloaded {
            key: pre.source.key.clone(),
            manifest: pre.manifest.clone(),
            mark: pre.snapshot_ready,
        });
        let decided = pack.decision().await;
        *sandbox.preload_use.lock() = Some(match decided {
            Some(Decided::Same) => PreloadUse::SameTip,
            Some(Decided::Delta(_)) => PreloadUse::Difference,
            Some(Decided::Whole) => PreloadUse::Whole,
            _ => PreloadUse::PackedOver,
        });
        match decided {
            Some(Decided::Same) => {
                progress("the preloaded checkout is at this tip: nothing to copy");
                let manifest = pack.task.await.map_err(|e| {
                    SandboxError::InvalidInput(format!("packing the repository: {e}"))
                })??;
                Ok((manifest, pre.snapshot_ready))
            }
            Some(Decided::Delta(removed)) => {
                progress("copying what changed since the preloaded tip");
                self.remove_paths(id, workdir, &removed).await?;
                let manifest = self.copy_repository(id, pack, progress).await?;
                Ok((
                    manifest,
                    pre.snapshot_ready && marked.load(Ordering::Relaxed),
                ))
            }
            Some(Decided::Whole) => {
                exec_checked(
                    &self.docker,
                    id,
                    &format!("cd '{workdir}' && rm -rf -- ..?* .[!.]* *"),
                    "emptying the preloaded checkout",
                )
                .await?;
                let manifest = self.copy_repository(id, pack, progress).await?;
                Ok((manifest, marked.load(Ordering::Relaxed)))
            }
            // `None`: the pack failed before deciding; the copy says why.
            Some(Decided::Over) | None => {
                exec_checked(
                    &self.docker,
                    id,
                    &format!("cd '{workdir}' && rm -rf ./.git"),
                    "clearing the preloaded checkout's .git",
                )
                .await?;
                let manifest = self.copy_repository(id, pack, progress).await?;
                self.delete_gone((id, workdir), &pre.manifest, &manifest)
                    .await?;
                Ok((manifest, false))
            }
        }
    }

    /// Streams the repository, as `pack` packs it, into the container. Returns the
    /// manifest of the repository.
    pub(super) async fn copy_repository(
        &self,
        id: &str,
        pack: PackTask,
        progress: &mut impl FnMut(&str),
    ) -> Result<Manifest> {
        let PackTask { task, body, .. } = pack;
        progress("copying the repository");
        let chunks = futures_util::stream::unfold(body, |mut rx| async move {
            rx.recv().await.map(|chunk| (chunk, rx))
        });
        let uploaded = self
            .docker
            .upload_to_container(
                id,
                Some(upload_options("/")),
                bollard::body_try_stream(chunks),
            )
            .await
            .map_err(|e| SandboxError::docker("copying the repository into the container", e));
        let packed = task
            .await
            .map_err(|e| SandboxError::InvalidInput(format!("packing the repository: {e}")))?;
        match (packed, uploaded) {
            (Ok(manifest), Ok(())) => Ok(manifest),
            // The upload stopped first: the engine's error is the one that says why.
            (Err(SandboxError::Io { source, .. }), Err(e))
                if source.kind() == io::ErrorKind::BrokenPipe =>
            {
                Err(e)
            }
            (Err(e), _) | (Ok(_), Err(e)) => Err(e),
        }
    }
}

/// The cached setup image a run starts from, on a hit.
fn cached_image(cache: &Option<CachePlan>) -> Option<&str> {
    cache.as_ref().and_then(|c| c.hit.as_deref())
}

/// Adds the fence's routes in the started sandbox `id`, when there is a fence to raise.
pub(super) async fn raise_fence(
    docker: &Docker,
    id: &str,
    fencing: Option<net::Fencing>,
) -> Result<()> {
    match fencing {
        Some(f) => f.apply(docker, id).await.map(|f| {
            tracing::debug!(
                blocked = f.blocked.len(),
                allowed = f.via_gateway.len(),
                "sandbox network fenced"
            );
        }),
        None => Ok(()),
    }
}

fn validate_run_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if ok {
        Ok(())
    } else {
        Err(SandboxError::InvalidInput(format!(
            "run id {id:?} must be 1-64 characters of letters, digits, '-' or '_'"
        )))
    }
}

/// Cuts the container's network: a plugged sandbox (made without a network) loses its
/// interface through the engine's fencer (`engine`, made if gone); one that joined
/// networks through the engine is disconnected from each. Checks that none is left.
async fn cut_network(docker: &Docker, engine: &str, id: &str) -> Result<()> {
    let networks = |info: bollard::models::ContainerInspectResponse| -> Vec<String> {
        info.network_settings
            .and_then(|n| n.networks)
            .map(|n| n.into_keys().filter(|n| n != "none").collect())
            .unwrap_or_default()
    };
    let info = docker
        .inspect_container(id, None)
        .await
        .map_err(|e| SandboxError::docker("inspecting the container's networks", e))?;
    let plugged = info
        .host_config
        .as_ref()
        .and_then(|h| h.network_mode.as_deref())
        == Some("none");
    if plugged {
        return net::unplug(docker, engine, id).await;
    }
    for net in networks(info) {
        docker
            .disconnect_network(
                &net,
                NetworkDisconnectRequest {
                    container: id.to_string(),
                    force: Some(true),
                },
            )
            .await
            .map_err(|e| SandboxError::docker(format!("disconnecting network {net}"), e))?;
    }
    let left = networks(
        docker
            .inspect_container(id, None)
            .await
            .map_err(|e| SandboxError::docker("checking the network cut", e))?,
    );
    if !left.is_empty() {
        return Err(SandboxError::InvalidInput(format!(
            "the network cut failed: the container is still on {}",
            left.join(", ")
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_checked() {
        assert!(validate_run_id("abc-123_x").is_ok());
        assert!(validate_run_id("").is_err());
        assert!(validate_run_id("a/b").is_err());
    }
}
