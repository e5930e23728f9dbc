//! The Docker engine behind the sandbox: connecting, hardened containers, copying files in
//! and out as tar streams, the setup script, the network cut, and removal on every path.

use std::collections::HashMap;
use std::fmt;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use bollard::container::LogOutput;
use bollard::exec::{CreateExecOptions, StartExecResults};
use bollard::models::{ContainerCreateBody, HostConfig, NetworkDisconnectRequest};
use bollard::query_parameters::{
    CreateContainerOptions, CreateImageOptions, DownloadFromContainerOptions,
    InspectContainerOptions, KillContainerOptions, ListContainersOptions, RemoveContainerOptions,
    UploadToContainerOptions,
};
use bollard::Docker;
use bytes::{Bytes, BytesMut};
use futures_util::StreamExt;

use super::archive::{self, ArchiveLimits, ChangeSet, Exported, Manifest};
use super::net::{self, Cidr, NETWORK_NAME};
use super::setup_cache::{self, SetupCacheSpec, SetupCacheUse, SetupReport};
use super::shell::{self, FeedOutput, Shell};
use super::term;
use super::{Result, Sandbox, SandboxError};

/// Label every kodx container carries: the run id.
pub const RUN_LABEL: &str = "kodx.run";
/// Label naming the process that owns the container: a random id drawn once per process
/// ([`owner_id`]). A pid would not do: in the shipped image kodx is PID 1 before and after a
/// restart, so its own orphans would look alive.
pub const OWNER_LABEL: &str = "kodx.owner";
/// Label naming the kodx installation (one `kodx serve` database) the container belongs to;
/// see [`Engine::with_instance`]. Two installations sharing an engine never remove each
/// other's containers.
pub const INSTANCE_LABEL: &str = "kodx.instance";
/// Label identifying the owning process as its kernel sees it:
/// `<boot id>/<pid namespace inode>/<pid>/<start time>` ([`process_identity`]). Another
/// process in the same boot and PID namespace can tell for sure whether it is gone.
pub const PROCESS_LABEL: &str = "kodx.process";

/// Resource limits of one sandbox container.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceLimits {
    pub memory_bytes: i64,
    pub nano_cpus: i64,
    pub pids: i64,
}

impl Default for ResourceLimits {
    fn default() -> Self {
        ResourceLimits {
            memory_bytes: 4 << 30,
            nano_cpus: 2_000_000_000,
            pids: 1024,
        }
    }
}

/// How much network a run's sandbox gets: the server's `network` setting, `kodx run
/// --network`. A repository or program can ask for less (`disable_network_after_setup`),
/// never more.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NetworkMode {
    /// Network for the whole run, unless the repository asks for the cut after setup.
    #[default]
    On,
    /// The network is cut after the setup script, whatever the repository asks.
    SetupOnly,
    /// No network at all, not even for the setup script.
    Off,
}

impl NetworkMode {
    pub const NAMES: [&'static str; 3] = ["on", "setup-only", "off"];

    /// Sets `spec`'s network: the stricter of this mode and the repository's or program's
    /// `disable_network_after_setup` (`cut_after_setup`).
    pub fn apply(self, spec: &mut SandboxSpec, cut_after_setup: bool) {
        spec.no_network = self == NetworkMode::Off;
        spec.disable_network_after_setup = cut_after_setup || self == NetworkMode::SetupOnly;
    }
}

impl std::str::FromStr for NetworkMode {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "on" => Ok(NetworkMode::On),
            "setup-only" => Ok(NetworkMode::SetupOnly),
            "off" => Ok(NetworkMode::Off),
            other => Err(format!(
                "network must be one of on, setup-only, off, not {other:?}"
            )),
        }
    }
}

/// Bytes a sandbox may write unless told otherwise (`max_disk_bytes`): 10 GiB.
pub const DEFAULT_MAX_DISK_BYTES: u64 = 10 << 30;

/// Everything needed to start one run's sandbox.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub run_id: String,
    pub image: String,
    /// Host directory copied to `/workspace/repo`; `None` gives an empty `/workspace`.
    pub repo_dir: Option<PathBuf>,
    /// What of `repo_dir` is copied: its files, or its `HEAD` from git objects.
    pub repo_source: RepoSource,
    pub setup_script: Option<String>,
    pub setup_timeout: Duration,
    pub disable_network_after_setup: bool,
    /// No network at all, not even for the setup script (`network = "off"`).
    pub no_network: bool,
    /// Ranges the sandbox may reach although they are private, link-local or the host's
    /// (the operator's `network_allow`).
    pub allowed_cidrs: Vec<Cidr>,
    /// Bytes the container may write to its own filesystem (the workspace, /tmp, installed
    /// packages); `None`: no limit. A storage quota where the engine has one, else a
    /// watchdog that stops the run past it.
    pub max_disk_bytes: Option<u64>,
    /// The longest pause between two checks of the disk watchdog (shorter near the limit).
    pub disk_check_interval: Duration,
    /// Ask the engine for a storage quota: `None` when its storage driver can have one
    /// (overlay2 on xfs, btrfs, zfs, devicemapper), `Some(true)` always, `Some(false)` never.
    /// Refused, the watchdog applies.
    pub disk_quota: Option<bool>,
    pub limits: ResourceLimits,
    /// Keep the result of a successful setup script as a local image and start from it
    /// when the key matches ([`setup_cache`]); `None`: off.
    pub setup_cache: Option<SetupCacheSpec>,
    /// Bytes of output one `feed_chars` returns at most (the middle is cut past that).
    pub output_cap: usize,
    pub archive_limits: ArchiveLimits,
}

impl SandboxSpec {
    pub fn new(run_id: impl Into<String>, image: impl Into<String>) -> Self {
        SandboxSpec {
            run_id: run_id.into(),
            image: image.into(),
            repo_dir: None,
            repo_source: RepoSource::Files,
            setup_script: None,
            setup_timeout: Duration::from_secs(600),
            disable_network_after_setup: false,
            no_network: false,
            allowed_cidrs: Vec::new(),
            max_disk_bytes: Some(DEFAULT_MAX_DISK_BYTES),
            disk_check_interval: Duration::from_secs(10),
            disk_quota: None,
            limits: ResourceLimits::default(),
            setup_cache: None,
            output_cap: 20_000,
            archive_limits: ArchiveLimits::default(),
        }
    }
}

/// How [`SandboxSpec::repo_dir`] becomes `/workspace/repo`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RepoSource {
    /// The directory's files as they are on disk, `.git` included (`kodx run`).
    #[default]
    Files,
    /// A git clone whose files need not be on disk (`kodx serve`'s clone from the
    /// repository cache): the tree of the commit its `HEAD` names is streamed from the git
    /// objects straight into the container, with the clone's `.git`
    /// ([`archive::pack_checkout_to`]). The tree is written once, in the container.
    GitHead,
    /// As [`RepoSource::GitHead`], with a `.git` that holds only that commit (a shallow
    /// repository: [`archive::pack_tip_to`]) instead of the clone's whole history: for runs
    /// that need only the tip (issues and `ask`).
    GitTip,
}

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

/// Chunks of tar in flight between a blocking thread and the Docker connection (64 KiB
/// each at most): what bounds the memory of a copy in or out, whatever the tree holds.
const PIPE_CHUNKS: usize = 8;
const PIPE_CHUNK_BYTES: usize = 64 << 10;

/// Where the repository goes in the container, and the tar's prefix for it. The tar is
/// uploaded at `/` rather than into `/workspace`: Docker refuses a symlink whose target
/// leaves the directory the tar is uploaded to (a repository's `up -> ../..`), and
/// nothing can leave `/`.
const REPO_PREFIX: &str = "workspace/repo";

/// The repository being packed into a tar on a blocking thread: its chunks come out of
/// `body` as they are written, and the task ends with the baseline manifest.
struct PackTask {
    task: tokio::task::JoinHandle<Result<Manifest>>,
    body: tokio::sync::mpsc::Receiver<io::Result<Bytes>>,
    /// What the container already holds of the tree (a cached setup image's checkout),
    /// told before anything is packed: those entries stay out of the tar. Dropped: nothing.
    have: tokio::sync::oneshot::Sender<Option<Arc<Manifest>>>,
}

impl PackTask {
    fn start(dir: PathBuf, source: RepoSource, limits: ArchiveLimits) -> PackTask {
        let (tx, body) = tokio::sync::mpsc::channel(PIPE_CHUNKS);
        let (have, had) = tokio::sync::oneshot::channel::<Option<Arc<Manifest>>>();
        let task = tokio::task::spawn_blocking(move || {
            let had = had.blocking_recv().ok().flatten();
            let started = std::time::Instant::now();
            let mut pipe = Pipe {
                tx,
                buf: BytesMut::new(),
                waited: Duration::ZERO,
            };
            let source = match source {
                RepoSource::Files => archive::PackSource::Dir,
                RepoSource::GitHead => archive::PackSource::Checkout,
                RepoSource::GitTip => archive::PackSource::Tip,
            };
            let packed = archive::pack_over_to(
                &dir,
                source,
                REPO_PREFIX,
                &limits,
                had.as_deref(),
                &mut pipe,
            );
            if let Err(e) = &packed {
                // Ends the upload with an error rather than a short tar.
                let _ = pipe.tx.blocking_send(Err(io::Error::other(e.to_string())));
            }
            let (entries, skipped) = packed
                .as_ref()
                .map_or((0, Default::default()), |(m, s)| (m.len(), *s));
            // Where the copy-in's time goes: reading the repository, or the engine taking
            // the tar (the pipe is full while it writes the files).
            tracing::info!(
                took_ms = started.elapsed().as_millis() as u64,
                engine_ms = pipe.waited.as_millis() as u64,
                entries,
                already_there = skipped.entries,
                "packed the repository into the container"
            );
            packed.map(|(m, _)| m)
        });
        PackTask { task, body, have }
    }
}

/// The writing end of a pipe to an upload body (on a blocking thread).
struct Pipe {
    tx: tokio::sync::mpsc::Sender<io::Result<Bytes>>,
    buf: BytesMut,
    /// Time spent waiting for the upload to take a chunk.
    waited: Duration,
}

impl Pipe {
    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = self.buf.split().freeze();
        let started = std::time::Instant::now();
        let sent = self.tx.blocking_send(Ok(chunk));
        self.waited += started.elapsed();
        sent.map_err(|_| {
            io::Error::new(
                io::ErrorKind::BrokenPipe,
                "the upload to the container stopped",
            )
        })
    }
}

impl Write for Pipe {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        let n = data.len().min(PIPE_CHUNK_BYTES - self.buf.len());
        self.buf.extend_from_slice(&data[..n]);
        if self.buf.len() >= PIPE_CHUNK_BYTES {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

/// Opens tar streams of the workspace, or of one path in it, for the archive code on a
/// blocking thread ([`archive::Open`]): the download runs on the runtime, and its chunks
/// come through a bounded channel.
struct Opener {
    docker: Docker,
    id: String,
    workdir: String,
    handle: tokio::runtime::Handle,
    /// The first Docker error met mid-stream (the tar code only sees an I/O error).
    failure: Arc<Mutex<Option<bollard::errors::Error>>>,
}

type Chunk = std::result::Result<Bytes, bollard::errors::Error>;

impl Opener {
    fn open(&self, rel: &str) -> Result<Option<Box<dyn Read>>> {
        let path = if rel.is_empty() {
            self.workdir.clone()
        } else {
            format!("{}/{rel}", self.workdir)
        };
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Chunk>(PIPE_CHUNKS);
        let (docker, id, asked) = (self.docker.clone(), self.id.clone(), path.clone());
        self.handle.spawn(async move {
            let options = DownloadFromContainerOptions { path: asked };
            let mut stream = docker.download_from_container(&id, Some(options));
            // Stops when the reader is dropped (a refused entry): the connection closes
            // and the engine stops writing the tar.
            while let Some(item) = stream.next().await {
                let last = item.is_err();
                if tx.send(item).await.is_err() || last {
                    break;
                }
            }
        });
        match rx.blocking_recv() {
            None => Ok(Some(Box::new(io::empty()))),
            Some(Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404,
                ..
            })) => Ok(None),
            Some(Err(e)) => Err(SandboxError::docker(
                format!("downloading {path} from the container"),
                e,
            )),
            Some(Ok(first)) => Ok(Some(Box::new(ChunkReader {
                rx,
                buf: first,
                failure: self.failure.clone(),
            }))),
        }
    }

    /// `result`, unless the download itself failed: then that is the error.
    fn verdict<T>(&self, result: Result<T>, what: &str) -> Result<T> {
        match self.failure.lock().unwrap().take() {
            Some(e) if result.is_err() => Err(SandboxError::docker(what, e)),
            _ => result,
        }
    }
}

/// The reading end of a download (on a blocking thread).
struct ChunkReader {
    rx: tokio::sync::mpsc::Receiver<Chunk>,
    buf: Bytes,
    failure: Arc<Mutex<Option<bollard::errors::Error>>>,
}

impl Read for ChunkReader {
    fn read(&mut self, out: &mut [u8]) -> io::Result<usize> {
        while self.buf.is_empty() {
            match self.rx.blocking_recv() {
                None => return Ok(0),
                Some(Ok(chunk)) => self.buf = chunk,
                Some(Err(e)) => {
                    let message = format!("the download from the container failed: {e}");
                    self.failure.lock().unwrap().get_or_insert(e);
                    return Err(io::Error::other(message));
                }
            }
        }
        let n = out.len().min(self.buf.len());
        out[..n].copy_from_slice(&self.buf.split_to(n));
        Ok(n)
    }
}

/// A connection to a Docker engine.
#[derive(Clone)]
pub struct Engine {
    docker: Docker,
    host: String,
    api_version: String,
    /// The installation whose containers this engine handle makes ([`INSTANCE_LABEL`]).
    instance: Option<Arc<str>>,
    facts: Arc<tokio::sync::OnceCell<EngineFacts>>,
    /// The engine refused a storage quota once: later sandboxes use the watchdog at once.
    quota_refused: Arc<AtomicBool>,
}

/// What kodx needs to know of an engine, read once per connection.
#[derive(Debug, Clone)]
pub struct EngineFacts {
    /// `uname -m` of the engine's host (`x86_64`, `aarch64`).
    pub arch: String,
    /// The storage driver (`overlay2`, …) and, where it says, its backing filesystem.
    pub storage_driver: String,
    pub backing_fs: String,
    /// The engine's data root on its host (`/var/lib/docker`).
    pub root_dir: String,
}

impl EngineFacts {
    /// Whether the storage driver can limit a container's writable layer (`--storage-opt
    /// size=…`). overlay2 needs xfs mounted with `pquota`, which the engine does not report:
    /// a refusal is handled where the container is made.
    pub fn may_have_quota(&self) -> bool {
        match self.storage_driver.as_str() {
            "overlay2" => self.backing_fs == "xfs",
            "btrfs" | "zfs" | "devicemapper" | "windowsfilter" => true,
            _ => false,
        }
    }
}

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

fn engine_host() -> String {
    std::env::var("DOCKER_HOST")
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unix:///var/run/docker.sock".to_string())
}

fn unavailable(host: &str, reason: impl ToString) -> SandboxError {
    let reason = reason.to_string();
    let hint = if reason.contains("ermission denied") {
        "Run kodx as a user that may use the Docker socket (e.g. in the `docker` group), or set DOCKER_HOST.".to_string()
    } else {
        "Start the Docker engine (`sudo systemctl start docker`, or `sudo dockerd &`), or point DOCKER_HOST \
         at a running one (tcp://HOST:2376 with DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH for TLS). \
         `kodx doctor` checks it."
            .to_string()
    };
    SandboxError::EngineUnavailable {
        host: host.to_string(),
        reason,
        hint,
    }
}

impl Engine {
    /// Connects to `DOCKER_HOST` (TLS when `DOCKER_TLS_VERIFY` is set) or the local socket,
    /// negotiates the API version and checks that the engine answers.
    pub async fn connect() -> Result<Engine> {
        let host = engine_host();
        let tls = std::env::var("DOCKER_TLS_VERIFY").is_ok_and(|v| !v.is_empty() && v != "0");
        let docker = if tls {
            Docker::connect_with_ssl_defaults()
        } else {
            Docker::connect_with_defaults()
        }
        .map_err(|e| unavailable(&host, e))?;
        Self::negotiated(docker, host).await
    }

    /// Connects to one engine of the server's list (`[[engines]]`), over TLS for `tcp://`.
    pub async fn connect_to(config: &super::engines::EngineConfig) -> Result<Engine> {
        let docker = config.client().map_err(|e| unavailable(&config.host, e))?;
        Self::negotiated(docker, config.host.clone()).await
    }

    /// Negotiates the API version and checks that the engine answers.
    async fn negotiated(docker: Docker, host: String) -> Result<Engine> {
        let docker = tokio::time::timeout(Duration::from_secs(10), docker.negotiate_version())
            .await
            .map_err(|_| unavailable(&host, "no answer within 10s"))?
            .map_err(|e| unavailable(&host, e))?;
        let api_version = docker.client_version().to_string();
        tracing::info!(host = %host, api_version = %api_version, "connected to the Docker engine");
        Ok(Engine {
            docker,
            host,
            api_version,
            instance: None,
            facts: Default::default(),
            quota_refused: Default::default(),
        })
    }

    /// Containers made through this handle carry `instance` as their [`INSTANCE_LABEL`], and
    /// [`Engine::sweep_instance_orphans`] removes the ones other processes of the same
    /// instance left behind. `kodx serve` uses the id kept in its database.
    pub fn with_instance(mut self, instance: impl Into<String>) -> Engine {
        self.instance = Some(Arc::from(instance.into()));
        self
    }

    /// The installation set by [`Engine::with_instance`].
    pub fn instance(&self) -> Option<&str> {
        self.instance.as_deref()
    }

    /// The engine's architecture and storage driver (asked once per connection).
    pub async fn facts(&self) -> Result<&EngineFacts> {
        self.facts
            .get_or_try_init(|| async {
                let info = self
                    .docker
                    .info()
                    .await
                    .map_err(|e| SandboxError::docker("reading the Docker engine's info", e))?;
                let backing_fs = info
                    .driver_status
                    .unwrap_or_default()
                    .into_iter()
                    .find(|kv| kv.first().is_some_and(|k| k == "Backing Filesystem"))
                    .and_then(|kv| kv.get(1).cloned())
                    .unwrap_or_default();
                Ok(EngineFacts {
                    arch: info.architecture.unwrap_or_default(),
                    storage_driver: info.driver.unwrap_or_default(),
                    backing_fs,
                    root_dir: info.docker_root_dir.unwrap_or_default(),
                })
            })
            .await
    }

    /// Makes sure the sandboxes' network (`kodx-sandbox`, or `name`) exists as kodx makes
    /// it — a bridge without IPv6 and without traffic between its containers — and returns
    /// its id. Created once and reused; safe when several kodx processes do it at once.
    /// `image` (any image on the engine) makes the short-lived lock container.
    pub async fn ensure_network(&self, name: Option<&str>, image: &str) -> Result<String> {
        net::ensure_network(&self.docker, name.unwrap_or(NETWORK_NAME), image)
            .await
            .map(|n| n.id)
    }

    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    /// The Docker API version in use after negotiation (e.g. `1.41`).
    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    /// Makes sure `image` is present, pulling it when absent. `progress` gets one line per
    /// pull status change.
    pub async fn ensure_image(&self, image: &str, mut progress: impl FnMut(&str)) -> Result<()> {
        if self.docker.inspect_image(image).await.is_ok() {
            return Ok(());
        }
        progress(&format!("pulling image {image}"));
        let (name, tag) = split_image(image);
        let mut stream = self.docker.create_image(
            Some(CreateImageOptions {
                from_image: Some(name.to_string()),
                tag: Some(tag.to_string()),
                ..Default::default()
            }),
            None,
            None,
        );
        let mut last = String::new();
        while let Some(item) = stream.next().await {
            match item {
                Ok(info) => {
                    if let Some(status) = info.status {
                        let line = match info.id {
                            Some(id) => format!("{id}: {status}"),
                            None => status,
                        };
                        if line != last {
                            progress(&line);
                            last = line;
                        }
                    }
                }
                Err(e) => {
                    return Err(SandboxError::ImageUnavailable {
                        image: image.to_string(),
                        reason: format!(
                            "it is not on this engine and pulling it failed: {e}. Pull or build it \
                             yourself (`docker pull {image}`), or choose another with --image"
                        ),
                    })
                }
            }
        }
        self.docker
            .inspect_image(image)
            .await
            .map(|_| ())
            .map_err(|e| SandboxError::ImageUnavailable {
                image: image.to_string(),
                reason: format!("the pull ended but the image is still missing: {e}"),
            })
    }

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
        let pack = spec
            .repo_dir
            .clone()
            .map(|dir| PackTask::start(dir, spec.repo_source, spec.archive_limits.clone()));
        self.ensure_image(&spec.image, &mut progress).await?;
        let cache = self.setup_cache_plan(spec).await;
        let workdir = if spec.repo_dir.is_some() {
            "/workspace/repo"
        } else {
            "/workspace"
        };
        let network = if spec.no_network {
            None
        } else {
            net::check_arch(&self.facts().await?.arch)?;
            Some(tokio::try_join!(
                net::ensure_network(&self.docker, NETWORK_NAME, &spec.image),
                net::host_addresses(&self.docker, &self.host, &spec.image, &spec.run_id),
            )?)
        };
        progress("creating container");
        let mut cache = cache;
        let network_id = network.as_ref().map(|(n, _)| n.id.as_str());
        let created = match cache.as_ref().and_then(|c| c.hit.as_deref()) {
            Some(cached) => {
                match self
                    .create_container(spec, cached, workdir, network_id)
                    .await
                {
                    Ok(c) => Ok(c),
                    // Evicted by another process since the lookup: set up as without it.
                    Err(e) => {
                        tracing::warn!(
                            "the cached setup image is gone ({e}); running the setup script"
                        );
                        if let Some(c) = cache.as_mut() {
                            c.hit = None;
                        }
                        self.create_container(spec, &spec.image, workdir, network_id)
                            .await
                    }
                }
            }
            None => {
                self.create_container(spec, &spec.image, workdir, network_id)
                    .await
            }
        };
        let (id, guard) = created?;
        let sandbox = DockerSandbox::new(self.docker.clone(), id, spec, workdir, guard);
        if guard == DiskGuard::Watchdog {
            if let Some(limit) = spec.max_disk_bytes {
                sandbox.watch_disk(limit, spec.disk_check_interval);
            }
        }
        let network = network.as_ref().map(|(n, addrs)| (n, addrs.as_slice()));
        let prepared = tokio::select! {
            r = self.prepare(&sandbox, spec, cache.as_ref(), pack, network, &mut progress) => r,
            e = sandbox.disk_exceeded() => Err(e),
        };
        // A setup script killed by the watchdog fails too: the disk limit is the reason.
        let prepared = match (prepared, sandbox.disk_error()) {
            (Err(_), Some(e)) => Err(e),
            (r, _) => r,
        };
        match prepared {
            Ok(()) => Ok(sandbox),
            Err(e) => {
                let _ = sandbox.destroy().await;
                Err(e)
            }
        }
    }

    /// What the setup cache has for `spec`: `None` when it is off for this run (not asked
    /// for, no setup script, or the key cannot be made: then the run sets up as without it).
    async fn setup_cache_plan(&self, spec: &SandboxSpec) -> Option<CachePlan> {
        let (cache, script) = (spec.setup_cache.as_ref()?, spec.setup_script.as_ref()?);
        let base = match self.docker.inspect_image(&spec.image).await {
            Ok(i) => i,
            Err(e) => {
                tracing::warn!(
                    "setup cache off for this run: inspecting {}: {e}",
                    spec.image
                );
                return None;
            }
        };
        let base_id = base.id?;
        let mut patterns: Vec<String> = setup_cache::DEFAULT_KEY_FILES
            .iter()
            .map(|p| p.to_string())
            .collect();
        patterns.extend(cache.key_files.iter().cloned());
        let files = match spec.repo_dir.clone() {
            Some(dir) => {
                // From where the copy-in takes the files: the disk, or a clone's objects
                // when nothing is checked out.
                let read = move || {
                    if setup_cache::only_git(&dir) {
                        setup_cache::key_files_at_head(&dir, &patterns)
                    } else {
                        setup_cache::key_files(&dir, &patterns)
                    }
                };
                match tokio::task::spawn_blocking(read).await {
                    Ok(Ok(files)) => files,
                    Ok(Err(e)) => {
                        tracing::warn!("setup cache off for this run: {e}");
                        return None;
                    }
                    Err(e) => {
                        tracing::warn!("setup cache off for this run: {e}");
                        return None;
                    }
                }
            }
            None => Vec::new(),
        };
        // One installation's images never serve another's runs on a shared engine.
        let scope = format!(
            "{}\n{}",
            self.instance.as_deref().unwrap_or(""),
            cache.scope
        );
        let key = setup_cache::cache_key(&setup_cache::KeyInputs {
            image_id: &base_id,
            scope: &scope,
            script,
            network: !spec.no_network,
            files: &files,
        });
        let hit = setup_cache::lookup(&self.docker, &key).await;
        if hit.is_some() {
            setup_cache::touch(&self.docker, &key).await;
        }
        tracing::info!(key = %&key[..16], hit = hit.is_some(), files = files.len(), "setup cache");
        Some(CachePlan {
            key,
            base_id,
            base_config: base.config.unwrap_or_default(),
            hit,
            spec: cache.clone(),
        })
    }

    /// Makes the container from `image`; returns its id and how its disk use is bounded.
    async fn create_container(
        &self,
        spec: &SandboxSpec,
        image: &str,
        workdir: &str,
        network: Option<&str>,
    ) -> Result<(String, DiskGuard)> {
        let mut labels = HashMap::from([
            (RUN_LABEL.to_string(), spec.run_id.clone()),
            (OWNER_LABEL.to_string(), owner_id().to_string()),
        ]);
        if let Some(instance) = &self.instance {
            labels.insert(INSTANCE_LABEL.to_string(), instance.to_string());
        }
        if let Some(process) = process_identity() {
            labels.insert(PROCESS_LABEL.to_string(), process.to_string());
        }
        let host_config = HostConfig {
            init: Some(true),
            privileged: Some(false),
            security_opt: Some(vec!["no-new-privileges:true".to_string()]),
            cap_drop: Some(vec!["ALL".to_string()]),
            cap_add: Some(KEPT_CAPABILITIES.iter().map(|c| c.to_string()).collect()),
            memory: Some(spec.limits.memory_bytes),
            memory_swap: Some(spec.limits.memory_bytes),
            nano_cpus: Some(spec.limits.nano_cpus),
            pids_limit: Some(spec.limits.pids),
            network_mode: Some(network.unwrap_or("none").to_string()),
            ..Default::default()
        };
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            // Keeps the container alive without anything installed in the image; the
            // engine's init (PID 1) reaps what the model's shells leave behind.
            cmd: Some(vec![
                "/bin/sh".to_string(),
                "-c".to_string(),
                "while :; do sleep 86400; done".to_string(),
            ]),
            entrypoint: Some(vec![]),
            working_dir: Some(workdir.to_string()),
            labels: Some(labels),
            tty: Some(false),
            host_config: Some(host_config),
            ..Default::default()
        };
        let try_quota = match (spec.max_disk_bytes, spec.disk_quota) {
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
                    name: Some(format!("kodx-{}", spec.run_id)),
                    ..Default::default()
                }),
                body,
            )
        };
        let failed =
            |e| SandboxError::docker(format!("creating the container from {}", spec.image), e);
        let (created, guard) = match spec.max_disk_bytes.filter(|_| try_quota) {
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
                let guard = if spec.max_disk_bytes.is_some() {
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

    async fn prepare(
        &self,
        sandbox: &DockerSandbox,
        spec: &SandboxSpec,
        cache: Option<&CachePlan>,
        pack: Option<PackTask>,
        network: Option<(&net::SandboxNetwork, &[std::net::Ipv4Addr])>,
        progress: &mut impl FnMut(&str),
    ) -> Result<()> {
        let id = sandbox.id.as_str();
        let hit = cache.is_some_and(|c| c.hit.is_some());
        let cleaned = std::sync::Mutex::new(None);
        // The fence's helper container is made while the sandbox starts, so only the
        // helper's own start is left for after.
        let fencing = async {
            match network {
                Some((net, host_addrs)) => {
                    net::Fencing::prepare(
                        &self.docker,
                        &spec.image,
                        &spec.run_id,
                        id,
                        net,
                        host_addrs,
                        &spec.allowed_cidrs,
                    )
                    .await
                }
                None => Ok(None),
            }
        };
        let started = async {
            self.docker
                .start_container(id, None)
                .await
                .map_err(|e| SandboxError::docker("starting the container", e))
        };
        let (fencing, ()) = tokio::try_join!(fencing, started)?;
        // The network is fenced while the files go in: nothing runs in the container
        // (setup script, shells) before both are done.
        let fence = async {
            match fencing {
                Some(f) => f.apply().await.map(|f| {
                    tracing::debug!(
                        blocked = f.blocked.len(),
                        allowed = f.via_gateway.len(),
                        "sandbox network fenced"
                    );
                }),
                None => Ok(()),
            }
        };
        let files = async {
            // kodx's own files in /tmp: the shells' rc file and the setup script.
            // Uploaded at `/` so that an image without /tmp gets one.
            let mut files = vec![("tmp/.kodx/bashrc", shell::BASHRC.as_bytes(), 0o644)];
            match &spec.setup_script {
                Some(script) if !hit => files.push(("tmp/setup.sh", script.as_bytes(), 0o700)),
                _ => {}
            }
            upload(&self.docker, id, "/", archive::pack_files(&files)).await?;
            let started = std::time::Instant::now();
            // The checkout the cached image holds: this run's goes in over it, only what
            // differs. An image without it (made by an older kodx) is cleaned first.
            let stored = if hit && pack.is_some() {
                let stored = stored_manifest(&self.docker, id).await;
                let command = match stored {
                    Some(_) => format!("cd '{}' && rm -rf ./.git", sandbox.workdir),
                    None => format!("sh {}", setup_cache::CLEAN_SCRIPT),
                };
                exec_checked(
                    &self.docker,
                    id,
                    &command,
                    "clearing the cached image's workspace",
                )
                .await?;
                stored.map(Arc::new)
            } else {
                None
            };
            if let Some(PackTask { task, body, have }) = pack {
                let _ = have.send(stored.clone());
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
                    .map_err(|e| {
                        SandboxError::docker("copying the repository into the container", e)
                    });
                let packed = task.await.map_err(|e| {
                    SandboxError::InvalidInput(format!("packing the repository: {e}"))
                })?;
                let manifest = match (packed, uploaded) {
                    (Ok(manifest), Ok(())) => manifest,
                    // The upload stopped first: the engine's error is the one that says why.
                    (Err(SandboxError::Io { source, .. }), Err(e))
                        if source.kind() == io::ErrorKind::BrokenPipe =>
                    {
                        return Err(e)
                    }
                    (Err(e), _) | (Ok(_), Err(e)) => return Err(e),
                };
                if let Some(script) = stored.as_ref().and_then(|stored| {
                    setup_cache::delta_script(&sandbox.workdir, stored, &manifest)
                }) {
                    let files = [(&DELTA_SCRIPT[1..], script.as_bytes(), 0o644)];
                    upload(&self.docker, id, "/", archive::pack_files(&files)).await?;
                    exec_checked(
                        &self.docker,
                        id,
                        &format!("sh {DELTA_SCRIPT}; rm -f {DELTA_SCRIPT}"),
                        "removing what the cached image has and this checkout does not",
                    )
                    .await?;
                }
                *sandbox.baseline.lock().unwrap() = manifest;
            }
            if hit {
                *cleaned.lock().unwrap() = Some(started.elapsed());
            }
            Ok(())
        };
        tokio::try_join!(fence, files)?;
        let report = match (&spec.setup_script, cache) {
            (Some(_), Some(_)) if hit => SetupReport {
                cache: SetupCacheUse::Hit,
                took: cleaned.into_inner().unwrap(),
            },
            (Some(_), cache) => {
                progress("running the setup script");
                let started = std::time::Instant::now();
                run_setup(&self.docker, id, &sandbox.workdir, spec.setup_timeout).await?;
                let took = started.elapsed();
                if let Some(plan) = cache {
                    progress("saving the setup to the cache");
                    if let Err(e) = self.save_setup(sandbox, plan).await {
                        tracing::warn!("the setup was not cached: {e}");
                    }
                }
                SetupReport {
                    cache: if cache.is_some() {
                        SetupCacheUse::Miss
                    } else {
                        SetupCacheUse::Off
                    },
                    took: Some(took),
                }
            }
            (None, _) => SetupReport::default(),
        };
        *sandbox.setup.lock().unwrap() = report;
        if spec.disable_network_after_setup && !spec.no_network {
            progress("cutting the network");
            cut_network(&self.docker, id).await?;
        }
        progress("starting the shell");
        sandbox.create_new_shell("default").await?;
        Ok(())
    }

    /// Commits the container after its setup as the cached image of `plan`'s key, then
    /// evicts what is over the cache's bounds.
    async fn save_setup(&self, sandbox: &DockerSandbox, plan: &CachePlan) -> Result<()> {
        let script = {
            let baseline = sandbox.baseline.lock().unwrap();
            setup_cache::clean_script(&sandbox.workdir, &baseline)
        };
        let stored = sandbox.baseline.lock().unwrap().without_git().to_bytes();
        let files = [
            (&setup_cache::CLEAN_SCRIPT[1..], script.as_bytes(), 0o644),
            (&setup_cache::MANIFEST_FILE[1..], stored.as_slice(), 0o644),
        ];
        upload(&self.docker, &sandbox.id, "/", archive::pack_files(&files)).await?;
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let config = setup_cache::committed_config(
            &plan.base_config,
            &plan.key,
            &plan.spec.scope,
            &plan.base_id,
            created,
        );
        let image = setup_cache::commit(&self.docker, &sandbox.id, &plan.key, config).await?;
        tracing::info!(image = %image, key = %&plan.key[..16], "setup cached");
        let removed =
            setup_cache::evict(&self.docker, plan.spec.max_images, plan.spec.max_bytes).await?;
        if removed > 0 {
            tracing::info!("evicted {removed} setup cache image(s)");
        }
        Ok(())
    }

    /// Removes `kodx.run` containers that no live run owns: those whose run id `keep` says
    /// no to. Returns how many were removed.
    pub async fn sweep(&self, keep: impl Fn(&HashMap<String, String>) -> bool) -> Result<usize> {
        self.sweep_labelled(RUN_LABEL, keep).await
    }

    /// The containers carrying `label` (`key` or `key=value`); stopped ones too with `all`.
    async fn labelled(
        &self,
        label: &str,
        all: bool,
    ) -> Result<Vec<bollard::models::ContainerSummary>> {
        self.docker
            .list_containers(Some(ListContainersOptions {
                all,
                filters: Some(HashMap::from([(
                    "label".to_string(),
                    vec![label.to_string()],
                )])),
                ..Default::default()
            }))
            .await
            .map_err(|e| SandboxError::docker("listing kodx containers", e))
    }

    /// Removes the containers carrying `label` (`key` or `key=value`) that `keep` says no to.
    async fn sweep_labelled(
        &self,
        label: &str,
        keep: impl Fn(&HashMap<String, String>) -> bool,
    ) -> Result<usize> {
        let list = self.labelled(label, true).await?;
        let mut removed = 0;
        for c in list {
            let labels = c.labels.unwrap_or_default();
            if !labels.contains_key(RUN_LABEL) || keep(&labels) {
                continue;
            }
            if let Some(id) = c.id {
                if remove(&self.docker, &id).await.is_ok() {
                    tracing::info!(container = %id, run = ?labels.get(RUN_LABEL), "removed an orphaned sandbox container");
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// Removes the containers left behind by kodx processes that are certainly gone (a
    /// crash, a `kill -9`): those whose [`PROCESS_LABEL`] names this boot and this PID
    /// namespace, and a process that no longer runs there. Everything else is kept: live
    /// processes, other hosts, other PID namespaces (another container, or this process's
    /// previous life as PID 1 of one) — there a pid proves nothing — and containers of kodx
    /// versions without the label.
    pub async fn sweep_dead_owners(&self) -> Result<usize> {
        let Some(me) = process_identity() else {
            return Ok(0);
        };
        self.sweep_labelled(PROCESS_LABEL, |labels| {
            labels
                .get(PROCESS_LABEL)
                .and_then(|p| process_alive(me, p))
                .unwrap_or(true)
        })
        .await
    }

    /// Removes the containers of this engine's instance ([`Engine::with_instance`]) that
    /// another process made: at the start of `kodx serve`, before any run, those are the
    /// orphans of an earlier life of this installation, however it ended. Does nothing
    /// without an instance.
    pub async fn sweep_instance_orphans(&self) -> Result<usize> {
        let Some(instance) = self.instance.as_deref() else {
            return Ok(0);
        };
        let me = owner_id();
        self.sweep_labelled(&format!("{INSTANCE_LABEL}={instance}"), |labels| {
            labels.get(OWNER_LABEL).map(String::as_str) == Some(me)
        })
        .await
    }

    /// Removes the containers this process made (its [`OWNER_LABEL`]) whose run is not in
    /// `live`: after the engine came back from an outage, those of runs that ended while it
    /// was away. Returns how many were removed.
    pub async fn sweep_own_except(
        &self,
        live: &std::collections::HashSet<String>,
    ) -> Result<usize> {
        let me = owner_id();
        self.sweep_labelled(&format!("{OWNER_LABEL}={me}"), |labels| {
            labels.get(RUN_LABEL).is_some_and(|run| live.contains(run))
        })
        .await
    }

    /// Sandboxes running on this engine now, made by any kodx process (its running
    /// [`RUN_LABEL`] containers).
    pub async fn running_sandboxes(&self) -> Result<usize> {
        Ok(self.labelled(RUN_LABEL, false).await?.len())
    }

    /// Whether this engine holds a setup cache image made for `scope` (a repository).
    pub async fn has_setup_cache_for(&self, scope: &str) -> bool {
        let label = format!("{}={scope}", setup_cache::SCOPE_LABEL);
        self.docker
            .list_images(Some(bollard::query_parameters::ListImagesOptions {
                filters: Some(HashMap::from([("label".to_string(), vec![label])])),
                ..Default::default()
            }))
            .await
            .is_ok_and(|l| !l.is_empty())
    }

    /// Whether `image` is on this engine already (no pull needed).
    pub async fn has_image(&self, image: &str) -> bool {
        self.docker.inspect_image(image).await.is_ok()
    }

    /// Removes every container of run `run_id` (its [`RUN_LABEL`]), whoever made it: before
    /// a run is started again, so its container's name (`kodx-<run id>`) is free. Returns
    /// how many were removed.
    pub async fn remove_run_containers(&self, run_id: &str) -> Result<usize> {
        self.sweep_labelled(&format!("{RUN_LABEL}={run_id}"), |labels| {
            labels.get(RUN_LABEL).map(String::as_str) != Some(run_id)
        })
        .await
    }
}

fn split_image(image: &str) -> (&str, &str) {
    // `registry:5000/name:tag` — the tag is after the last colon that follows the last slash.
    let slash = image.rfind('/').map_or(0, |i| i + 1);
    if image.contains('@') {
        return (image, "");
    }
    match image[slash..].rfind(':') {
        Some(i) => (&image[..slash + i], &image[slash + i + 1..]),
        None => (image, "latest"),
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

/// This process's owner id ([`OWNER_LABEL`]): 16 random hex digits, drawn once.
pub fn owner_id() -> &'static str {
    static OWNER: OnceLock<String> = OnceLock::new();
    OWNER.get_or_init(|| format!("{:016x}", rand::random::<u64>()))
}

/// Who a process is to the kernel: boot, PID namespace, pid and start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessIdentity {
    boot: u128,
    pid_namespace: u64,
    pid: u32,
    /// Clock ticks after boot (`/proc/PID/stat` field 22): tells a reused pid apart.
    start_time: u64,
}

impl fmt::Display for ProcessIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:032x}/{}/{}/{}",
            self.boot, self.pid_namespace, self.pid, self.start_time
        )
    }
}

impl std::str::FromStr for ProcessIdentity {
    type Err = ();

    fn from_str(s: &str) -> std::result::Result<Self, ()> {
        let mut parts = s.split('/');
        let mut next = || parts.next().ok_or(());
        let id = ProcessIdentity {
            boot: u128::from_str_radix(next()?, 16).map_err(|_| ())?,
            pid_namespace: next()?.parse().map_err(|_| ())?,
            pid: next()?.parse().map_err(|_| ())?,
            start_time: next()?.parse().map_err(|_| ())?,
        };
        if parts.next().is_some() {
            return Err(());
        }
        Ok(id)
    }
}

/// This process's identity ([`PROCESS_LABEL`]); `None` without a readable `/proc`.
pub fn process_identity() -> Option<ProcessIdentity> {
    static ME: OnceLock<Option<ProcessIdentity>> = OnceLock::new();
    *ME.get_or_init(|| {
        let pid = std::process::id();
        // A /proc of another PID namespace (a PID namespace without its own /proc mounted)
        // would name other processes: then this process cannot be identified.
        let seen: u32 = std::fs::read_to_string("/proc/self/stat")
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        if seen != pid {
            return None;
        }
        Some(ProcessIdentity {
            boot: boot_id()?,
            pid_namespace: pid_namespace("self")?,
            pid,
            start_time: start_time(pid)?,
        })
    })
}

fn boot_id() -> Option<u128> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    u128::from_str_radix(&text.trim().replace('-', ""), 16).ok()
}

/// The inode of a process's PID namespace (`/proc/<pid>/ns/pid` → `pid:[4026531836]`).
fn pid_namespace(pid: &str) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    let link = link.to_str()?;
    link.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from its end.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process a [`PROCESS_LABEL`] names still runs, as far as `me` can tell:
/// `None` when it cannot (another boot, another PID namespace, an unreadable label).
fn process_alive(me: ProcessIdentity, label: &str) -> Option<bool> {
    let other: ProcessIdentity = label.parse().ok()?;
    if other.boot != me.boot || other.pid_namespace != me.pid_namespace {
        return None;
    }
    Some(start_time(other.pid) == Some(other.start_time))
}

async fn upload(docker: &Docker, id: &str, path: &str, tar: Vec<u8>) -> Result<()> {
    docker
        .upload_to_container(
            id,
            Some(upload_options(path)),
            bollard::body_full(Bytes::from(tar)),
        )
        .await
        .map_err(|e| SandboxError::docker(format!("copying files to {path} in the container"), e))
}

/// Where a run from a cached setup image puts the script that deletes what its checkout
/// no longer has ([`setup_cache::delta_script`]).
const DELTA_SCRIPT: &str = "/tmp/.kodx/delta.sh";

/// The checkout a cached setup image holds ([`setup_cache::MANIFEST_FILE`]), read from the
/// container made from it; `None` when it has none or it cannot be read (the run then
/// cleans the image's checkout and copies its own whole).
async fn stored_manifest(docker: &Docker, id: &str) -> Option<Manifest> {
    let path = setup_cache::MANIFEST_FILE;
    let options = DownloadFromContainerOptions {
        path: path.to_string(),
    };
    let mut stream = docker.download_from_container(id, Some(options));
    // The file and its tar headers.
    let max = setup_cache::MAX_MANIFEST_BYTES + (64 << 10);
    let mut tar = Vec::new();
    while let Some(chunk) = stream.next().await {
        match chunk {
            Ok(chunk) if (tar.len() + chunk.len()) as u64 <= max => tar.extend_from_slice(&chunk),
            Ok(_) => {
                tracing::warn!(
                    "the cached image's manifest is over {} bytes; copying the whole checkout",
                    setup_cache::MAX_MANIFEST_BYTES
                );
                return None;
            }
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => return None,
            Err(e) => {
                tracing::warn!(
                    "reading the cached image's manifest: {e}; copying the whole checkout"
                );
                return None;
            }
        }
    }
    let read = || -> std::result::Result<Manifest, String> {
        let mut archive = tar::Archive::new(tar.as_slice());
        let mut entry = archive
            .entries()
            .and_then(|mut e| e.next().transpose())
            .map_err(|e| e.to_string())?
            .ok_or("an empty archive")?;
        let mut bytes = Vec::new();
        entry
            .by_ref()
            .take(setup_cache::MAX_MANIFEST_BYTES)
            .read_to_end(&mut bytes)
            .map_err(|e| e.to_string())?;
        Manifest::from_bytes(&bytes)
    };
    match read() {
        Ok(manifest) => Some(manifest),
        Err(e) => {
            tracing::warn!(
                "the cached image's manifest cannot be read ({e}); copying the whole checkout"
            );
            None
        }
    }
}

/// What the setup cache has for one run ([`Engine::setup_cache_plan`]).
struct CachePlan {
    key: String,
    base_id: String,
    base_config: bollard::models::ImageConfig,
    /// The cached image's id when there is one.
    hit: Option<String>,
    spec: SetupCacheSpec,
}

/// Runs `sh -c command` in the container to its end; fails unless it exits 0.
async fn exec_checked(docker: &Docker, id: &str, command: &str, what: &str) -> Result<()> {
    let exec = docker
        .create_exec(
            id,
            CreateExecOptions {
                cmd: Some(vec!["/bin/sh", "-c", command]),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| SandboxError::docker(what, e))?;
    if let StartExecResults::Attached { mut output, .. } =
        docker
            .start_exec(&exec.id, None)
            .await
            .map_err(|e| SandboxError::docker(what, e))?
    {
        while let Some(Ok(_)) = output.next().await {}
    }
    let code = docker
        .inspect_exec(&exec.id)
        .await
        .map_err(|e| SandboxError::docker(what, e))?
        .exit_code
        .unwrap_or(-1);
    if code != 0 {
        return Err(SandboxError::InvalidInput(format!(
            "{what}: exit code {code}"
        )));
    }
    Ok(())
}

fn upload_options(path: &str) -> UploadToContainerOptions {
    UploadToContainerOptions {
        path: path.to_string(),
        ..Default::default()
    }
}

/// Runs `/tmp/setup.sh` with bash (sh when the image has no bash) in `workdir`, to the end
/// or its timeout; removes the script afterwards.
async fn run_setup(docker: &Docker, id: &str, workdir: &str, timeout: Duration) -> Result<()> {
    // One stream (2>&1): the tail a maintainer reads keeps the order the script wrote it
    // in; two pipes read side by side can put an error line before the output it followed.
    let script = "if command -v bash >/dev/null 2>&1; then bash /tmp/setup.sh 2>&1; \
                  else sh /tmp/setup.sh 2>&1; fi; rc=$?; rm -f /tmp/setup.sh; exit $rc";
    let exec = docker
        .create_exec(
            id,
            CreateExecOptions {
                cmd: Some(vec!["/bin/sh", "-c", script]),
                env: Some(vec!["DEBIAN_FRONTEND=noninteractive"]),
                working_dir: Some(workdir),
                attach_stdout: Some(true),
                attach_stderr: Some(true),
                ..Default::default()
            },
        )
        .await
        .map_err(|e| SandboxError::docker("creating the setup script's process", e))?;
    let StartExecResults::Attached { mut output, .. } = docker
        .start_exec(&exec.id, None)
        .await
        .map_err(|e| SandboxError::docker("starting the setup script", e))?
    else {
        return Err(SandboxError::InvalidInput(
            "setup script started detached".into(),
        ));
    };
    // Cleaned as it comes: a script may print without end, or escapes that would each
    // fill a line. The decoder keeps a head and a tail of the text, the message its tail.
    const KEEP: usize = 32 * 1024;
    let mut printed = term::Decoder::new("", KEEP);
    let collect = async {
        while let Some(Ok(item)) = output.next().await {
            if let LogOutput::StdOut { message } | LogOutput::StdErr { message } = item {
                printed.feed(&message);
            }
        }
    };
    let finished = tokio::time::timeout(timeout, collect).await.is_ok();
    let tail_text = last_lines(&printed.take_text(2 * KEEP), 40);
    if !finished {
        return Err(SandboxError::SetupTimedOut {
            timeout,
            tail: tail_text,
        });
    }
    let code = docker
        .inspect_exec(&exec.id)
        .await
        .map_err(|e| SandboxError::docker("reading the setup script's exit code", e))?
        .exit_code
        .unwrap_or(-1);
    if code != 0 {
        return Err(SandboxError::SetupFailed {
            exit_code: code,
            tail: tail_text,
        });
    }
    Ok(())
}

/// The last `n` lines of `text` (at most 8,000 bytes), without trailing blanks (cursor
/// moves print them).
fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.trim_end().lines().map(str::trim_end).collect();
    let start = lines.len().saturating_sub(n);
    let mut out = lines[start..]
        .join("\n")
        .trim_start_matches('\n')
        .to_string();
    if out.len() > 8000 {
        let cut = out.len() - 8000;
        let cut = (cut..out.len())
            .find(|&i| out.is_char_boundary(i))
            .unwrap_or(0);
        out = out[cut..].to_string();
    }
    out
}

/// Disconnects the container from every network and checks that none is left.
async fn cut_network(docker: &Docker, id: &str) -> Result<()> {
    let networks = |info: bollard::models::ContainerInspectResponse| -> Vec<String> {
        info.network_settings
            .and_then(|n| n.networks)
            .map(|n| n.into_keys().collect())
            .unwrap_or_default()
    };
    let info = docker
        .inspect_container(id, None)
        .await
        .map_err(|e| SandboxError::docker("inspecting the container's networks", e))?;
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

pub(super) async fn remove(docker: &Docker, id: &str) -> Result<()> {
    let res = docker
        .remove_container(
            id,
            Some(RemoveContainerOptions {
                force: true,
                v: true,
                ..Default::default()
            }),
        )
        .await;
    unregister_live(id);
    match res {
        Ok(()) => Ok(()),
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 404, ..
        }) => Ok(()),
        Err(e) => Err(SandboxError::docker(format!("removing container {id}"), e)),
    }
}

/// Containers this process created and has not removed yet, for removal on Ctrl-C.
fn live() -> &'static Mutex<HashMap<String, Docker>> {
    static LIVE: OnceLock<Mutex<HashMap<String, Docker>>> = OnceLock::new();
    LIVE.get_or_init(Default::default)
}

pub(super) fn register_live(docker: &Docker, id: &str) {
    live()
        .lock()
        .unwrap()
        .insert(id.to_string(), docker.clone());
}

fn unregister_live(id: &str) {
    live().lock().unwrap().remove(id);
}

/// Creations in flight hold it for reading; the cleanup on interrupt takes it for writing.
fn creation_gate() -> &'static tokio::sync::RwLock<()> {
    static GATE: OnceLock<tokio::sync::RwLock<()>> = OnceLock::new();
    GATE.get_or_init(Default::default)
}

/// Removes every container this process still owns, including one being created right
/// now, and lets no new one be created afterwards. For signal handlers: call it, then exit.
pub async fn remove_all_live() -> usize {
    // Never released: the process is about to exit, and must not make new containers.
    std::mem::forget(creation_gate().write().await);
    let all: Vec<(String, Docker)> = live().lock().unwrap().drain().collect();
    let n = all.len();
    futures_util::future::join_all(all.iter().map(|(id, d)| remove(d, id))).await;
    n
}

/// One run's container. Removed by [`Sandbox::destroy`], or, if that is never called (a
/// panic, a dropped future), when the value is dropped.
pub struct DockerSandbox {
    docker: Docker,
    id: String,
    run_id: String,
    workdir: String,
    output_cap: usize,
    archive_limits: ArchiveLimits,
    baseline: Mutex<Manifest>,
    shells: Mutex<HashMap<String, Arc<Shell>>>,
    destroyed: AtomicBool,
    disk_guard: DiskGuard,
    /// The disk watchdog, stopped with the sandbox.
    watchdog: Mutex<Option<tokio::task::JoinHandle<()>>>,
    /// Set by the watchdog when the disk limit was passed: (limit, bytes written).
    disk_tripped: tokio::sync::watch::Sender<Option<(u64, u64)>>,
    /// How the setup went (the cache's part in it).
    setup: Mutex<SetupReport>,
}

/// Most shells one sandbox keeps at once.
pub const MAX_SHELLS: usize = 16;

impl DockerSandbox {
    fn new(
        docker: Docker,
        id: String,
        spec: &SandboxSpec,
        workdir: &str,
        disk_guard: DiskGuard,
    ) -> Self {
        DockerSandbox {
            docker,
            id,
            run_id: spec.run_id.clone(),
            workdir: workdir.to_string(),
            output_cap: spec.output_cap,
            archive_limits: spec.archive_limits.clone(),
            baseline: Mutex::new(Manifest::default()),
            shells: Mutex::new(HashMap::new()),
            destroyed: AtomicBool::new(false),
            disk_guard,
            watchdog: Mutex::new(None),
            disk_tripped: tokio::sync::watch::Sender::new(None),
            setup: Mutex::new(SetupReport::default()),
        }
    }

    pub fn container_id(&self) -> &str {
        &self.id
    }

    /// Whether the setup came from the cache, and how long it took.
    pub fn setup_report(&self) -> SetupReport {
        *self.setup.lock().unwrap()
    }

    /// How this sandbox's disk use is bounded: the engine's quota or kodx's watchdog.
    pub fn disk_guard(&self) -> DiskGuard {
        self.disk_guard
    }

    /// Starts the watchdog: the container's writable layer (as the engine counts it) is
    /// checked every `max_interval` at most, more often near the limit; past `limit` the
    /// container is killed and the run stops with [`SandboxError::DiskLimit`].
    fn watch_disk(&self, limit: u64, max_interval: Duration) {
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
        if let Some(old) = self.watchdog.lock().unwrap().replace(task) {
            old.abort();
        }
    }

    /// The disk limit error, once the watchdog tripped.
    fn disk_error(&self) -> Option<SandboxError> {
        self.disk_tripped
            .borrow()
            .map(|(limit, used)| SandboxError::DiskLimit { limit, used })
    }

    /// Resolves when the watchdog trips; never otherwise.
    async fn disk_exceeded(&self) -> SandboxError {
        let mut rx = self.disk_tripped.subscribe();
        let tripped = rx.wait_for(|v| v.is_some()).await.map(|v| *v);
        match tripped {
            Ok(Some((limit, used))) => SandboxError::DiskLimit { limit, used },
            _ => std::future::pending().await,
        }
    }

    fn stop_watchdog(&self) {
        if let Some(task) = self.watchdog.lock().unwrap().take() {
            task.abort();
        }
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    fn shell(&self, name: &str) -> Result<Arc<Shell>> {
        self.shells
            .lock()
            .unwrap()
            .get(name)
            .cloned()
            .ok_or_else(|| SandboxError::UnknownShell(name.to_string()))
    }

    /// Opens tar streams of the workspace for the archive code on a blocking thread.
    fn opener(&self) -> Opener {
        Opener {
            docker: self.docker.clone(),
            id: self.id.clone(),
            workdir: self.workdir.clone(),
            handle: tokio::runtime::Handle::current(),
            failure: Arc::default(),
        }
    }

    fn root_name(&self) -> &str {
        self.workdir.rsplit('/').next().unwrap_or("workspace")
    }
}

/// Removes a container from a synchronous context (a `Drop`).
pub(super) fn remove_blocking(docker: &Docker, id: &str) {
    let docker = docker.clone();
    let id = id.to_string();
    // Drop cannot await, and the runtime may be shutting down (a panicking test, the
    // end of main): remove on a thread of its own and wait for it, bounded.
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build();
        if let Ok(rt) = rt {
            let _ = rt.block_on(remove(&docker, &id));
        }
        let _ = tx.send(());
    });
    let _ = rx.recv_timeout(Duration::from_secs(15));
}

impl Drop for DockerSandbox {
    fn drop(&mut self) {
        if !self.destroyed.swap(true, Ordering::SeqCst) {
            self.stop_watchdog();
            self.shells.lock().unwrap().clear();
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
            let shells = self.shells.lock().unwrap();
            if !shells.contains_key(name) && shells.len() >= MAX_SHELLS {
                return Err(SandboxError::InvalidInput(format!(
                    "{MAX_SHELLS} shells are open already; reuse one, or replace one with create_new_shell(\"<its name>\")"
                )));
            }
        }
        let old_pid = self
            .shells
            .lock()
            .unwrap()
            .get(name)
            .and_then(|old| old.pid());
        let shell = Shell::start(
            &self.docker,
            &self.id,
            name,
            &self.workdir,
            self.output_cap,
            old_pid,
        )
        .await?;
        let replaced = self
            .shells
            .lock()
            .unwrap()
            .insert(name.to_string(), shell)
            .is_some();
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

    async fn export_workspace(&self, dest: &Path) -> Result<Exported> {
        let opener = self.opener();
        let root = self.root_name().to_string();
        let dest = dest.to_path_buf();
        let limits = self.archive_limits.clone();
        let baseline = self.baseline.lock().unwrap().clone();
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
        let opener = self.opener();
        let root = self.root_name().to_string();
        let baseline = self.baseline.lock().unwrap().clone();
        let limits = self.archive_limits.clone();
        tokio::task::spawn_blocking(move || {
            let mut open = |path: &str| opener.open(path);
            let changes = archive::change_set_from(&mut open, &root, &baseline, &limits);
            opener.verdict(changes, "downloading the workspace")
        })
        .await
        .map_err(|e| SandboxError::InvalidInput(format!("change set task failed: {e}")))?
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
        self.shells.lock().unwrap().clear();
        remove(&self.docker, &self.id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_split_into_name_and_tag() {
        assert_eq!(split_image("python:3.12"), ("python", "3.12"));
        assert_eq!(split_image("python"), ("python", "latest"));
        assert_eq!(
            split_image("registry:5000/team/img:v1"),
            ("registry:5000/team/img", "v1")
        );
        assert_eq!(
            split_image("registry:5000/img"),
            ("registry:5000/img", "latest")
        );
    }

    #[test]
    fn names_are_checked() {
        assert!(validate_run_id("abc-123_x").is_ok());
        assert!(validate_run_id("").is_err());
        assert!(validate_run_id("a/b").is_err());
        assert!(validate_shell_name("server").is_ok());
        assert!(validate_shell_name("a b").is_err());
        assert!(validate_shell_name(&"x".repeat(65)).is_err());
    }

    #[test]
    fn process_identities_round_trip_and_tell_who_is_alive() {
        let me = process_identity().expect("/proc is readable");
        let text = me.to_string();
        assert_eq!(text.parse::<ProcessIdentity>(), Ok(me));
        assert_eq!(process_alive(me, &text), Some(true));
        let other_ns = ProcessIdentity {
            pid_namespace: me.pid_namespace + 1,
            ..me
        };
        assert_eq!(process_alive(me, &other_ns.to_string()), None);
        let reused = ProcessIdentity {
            start_time: me.start_time + 1,
            ..me
        };
        assert_eq!(process_alive(me, &reused.to_string()), Some(false));
        assert_eq!(process_alive(me, "myhost/1"), None, "an old host/pid label");
        assert!("1/2/3".parse::<ProcessIdentity>().is_err());
        assert!(format!("{text}/9").parse::<ProcessIdentity>().is_err());
        assert_eq!(owner_id(), owner_id());
        assert_eq!(owner_id().len(), 16);
    }

    #[test]
    fn setup_tail_keeps_last_lines() {
        let text: String = (0..100).map(|i| format!("l{i}\n")).collect();
        let t = last_lines(&text, 3);
        assert_eq!(t, "l97\nl98\nl99");
        assert_eq!(last_lines("a   \n   \nb \n", 40), "a\n\nb");
        assert_eq!(last_lines("   \nb \n", 40), "b");
    }
}
