//! What a run asks of its sandbox: the image, the repository and how it is copied in, the
//! setup script, the network, and the limits on memory, CPU, processes and disk.

use std::path::PathBuf;
use std::time::Duration;

use crate::archive::ArchiveLimits;
use crate::net::Cidr;
use crate::ready::ReadyRepo;
use crate::setup_cache::SetupCacheSpec;

/// Resource limits of one sandbox container.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
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
/// Bytes of a command's output a shell returns before cutting the middle, unless the run says.
pub const DEFAULT_OUTPUT_CAP: usize = 20_000;

/// Everything needed to start one run's sandbox.
#[derive(Debug, Clone)]
pub struct SandboxSpec {
    pub run_id: String,
    pub image: String,
    /// Host directory copied to `/workspace/repo`; `None` gives an empty `/workspace`.
    pub repo_dir: Option<PathBuf>,
    /// What of `repo_dir` is copied: its files, or its `HEAD` from git objects.
    pub repo_source: RepoSource,
    /// Where the repository's ready checkouts are kept ([`crate::ready`]): a
    /// [`RepoSource::GitTip`] clone is streamed from there when its tip was packed before,
    /// and kept there when it was not. Unused for other sources and on a setup cache hit
    /// (only the delta goes in then). `None`: off.
    pub ready: Option<ReadyRepo>,
    /// The runs whose preloaded warm sandboxes this run may take, and keep one for next
    /// ([`super::preload`]): the server's key of the run's installation and repository.
    /// `None`: none (a checks' sandbox, `kodx run`).
    pub preload: Option<String>,
    pub setup_script: Option<String>,
    /// Variables only the setup script's process gets (a repository's `setup_only`
    /// secrets): not in the container's environment, not in any shell, not in a setup
    /// cache image (a setup with them runs without the cache); processes the setup left
    /// running with them are stopped when it ends, and their values are cut from what the
    /// setup printed.
    pub setup_secrets: Vec<SetupSecret>,
    pub setup_timeout: Duration,
    pub disable_network_after_setup: bool,
    /// No network at all, not even for the setup script (`network = "off"`).
    pub no_network: bool,
    /// Ranges the sandbox may reach although they are private, link-local or the host's
    /// (the operator's `network_allow`).
    pub allowed_cidrs: Vec<Cidr>,
    /// After the setup script, the sandbox reaches only kodx's egress proxy (a
    /// repository's `network.allow`) instead of what `disable_network_after_setup` says.
    pub egress: Option<EgressSpec>,
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
    /// when the key matches ([`crate::setup_cache`]); `None`: off.
    pub setup_cache: Option<SetupCacheSpec>,
    /// Bytes of output one `feed_chars` returns at most (the middle is cut past that).
    pub output_cap: usize,
    pub archive_limits: ArchiveLimits,
    /// The run ends with a change set (a code run): the snapshot's exec is started as soon
    /// as the sandbox is ready, so it is off the run's path at the end.
    pub change_set_ahead: bool,
    /// The sandbox runs the checks of this run ([`crate::owner::CHECKS_OF_LABEL`]).
    pub checks_of: Option<String>,
    /// The sandbox runs checks (a checks' sandbox, kodx's `checks::verify`): kodx's check
    /// runner is started while the sandbox is prepared, so that each attempt's checks go
    /// through it (`docker/runner.rs`); without it they run one engine exec each. Costs the
    /// runner's start (an engine exec, beside the copy-in).
    pub checks_ahead: bool,
}

impl SandboxSpec {
    pub fn new(run_id: impl Into<String>, image: impl Into<String>) -> Self {
        SandboxSpec {
            run_id: run_id.into(),
            image: image.into(),
            repo_dir: None,
            repo_source: RepoSource::Files,
            ready: None,
            preload: None,
            setup_script: None,
            setup_secrets: Vec::new(),
            setup_timeout: Duration::from_secs(600),
            disable_network_after_setup: false,
            no_network: false,
            allowed_cidrs: Vec::new(),
            egress: None,
            max_disk_bytes: Some(DEFAULT_MAX_DISK_BYTES),
            disk_check_interval: Duration::from_secs(10),
            disk_quota: None,
            limits: ResourceLimits::default(),
            setup_cache: None,
            output_cap: DEFAULT_OUTPUT_CAP,
            archive_limits: ArchiveLimits::default(),
            change_set_ahead: false,
            checks_of: None,
            checks_ahead: false,
        }
    }
}

/// kodx's egress proxy as a sandbox sees it (SPEC §12, "Egress by name"): after the setup
/// script the sandbox keeps its interface but reaches only the proxy, at its network's
/// gateway (the engine's host) on `port`; its shells get `HTTP_PROXY`, `HTTPS_PROXY` (and
/// lower-case) pointing there and `NO_PROXY` for its own servers.
#[derive(Clone, PartialEq, Eq)]
pub struct EgressSpec {
    /// The proxy's port on the gateway.
    pub port: u16,
    /// A CA certificate (PEM) the sandbox trusts besides the image's own: the run's, for
    /// secrets injected on the wire. Added to the system bundle where the setup left it
    /// writable, and named by `SSL_CERT_FILE`, `NODE_EXTRA_CA_CERTS`, `REQUESTS_CA_BUNDLE`,
    /// `PIP_CERT`, `CARGO_HTTP_CAINFO`, `GIT_SSL_CAINFO` and `CURL_CA_BUNDLE`.
    pub ca_pem: Option<String>,
    /// Secrets injected on the wire: each variable holds the placeholder
    /// `kodx-secret:NAME`, which the proxy replaces for that secret's hosts only.
    pub placeholders: Vec<String>,
}

impl std::fmt::Debug for EgressSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EgressSpec")
            .field("port", &self.port)
            .field("ca", &self.ca_pem.is_some())
            .field("placeholders", &self.placeholders)
            .finish()
    }
}

/// A variable of the setup script's environment alone; its `Debug` never shows the value.
#[derive(Clone, PartialEq, Eq)]
pub struct SetupSecret {
    pub name: String,
    pub value: String,
}

impl std::fmt::Debug for SetupSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SetupSecret({}=[REDACTED])", self.name)
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
    /// ([`crate::archive::pack_checkout_to`]). The tree is written once, in the container.
    GitHead,
    /// As [`RepoSource::GitHead`], with a `.git` that holds only that commit (a shallow
    /// repository: [`crate::archive::pack_tip_to`]) instead of the clone's whole history: for runs
    /// that need only the tip (issues and `ask`).
    GitTip,
}

/// What the engine fixes of a container when it creates it: two runs of one shape can
/// start from the same kind of warm sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Shape {
    /// The image the container is made from (a setup cache image on a hit).
    pub image: String,
    pub workdir: &'static str,
    pub limits: ResourceLimits,
    pub no_network: bool,
    pub allowed_cidrs: Vec<Cidr>,
    pub max_disk_bytes: Option<u64>,
    pub disk_quota: Option<bool>,
}

impl Shape {
    /// The shape of `spec`'s container, made from `image`.
    pub fn of(spec: &SandboxSpec, image: &str) -> Shape {
        let mut allowed_cidrs = spec.allowed_cidrs.clone();
        allowed_cidrs.sort();
        allowed_cidrs.dedup();
        Shape {
            image: image.to_string(),
            workdir: if spec.repo_dir.is_some() {
                "/workspace/repo"
            } else {
                "/workspace"
            },
            limits: spec.limits.clone(),
            no_network: spec.no_network,
            allowed_cidrs,
            max_disk_bytes: spec.max_disk_bytes,
            disk_quota: spec.disk_quota,
        }
    }
}
