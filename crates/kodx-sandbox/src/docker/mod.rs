//! The Docker engine behind the sandbox: connecting, hardened containers, copying files in
//! and out as tar streams, the setup script, the network cut, and removal on every path.
//!
//! One file per job: `spec` (what a run asks of its sandbox), `engine` (the connection,
//! images and the sweeps of orphaned containers), `provision` (making and preparing a
//! sandbox's container), `derived` (the image a sandbox is made from, kodx's files in),
//! `setup` (the setup script and the setup cache's part in it), `egress` (the network
//! narrowed to kodx's egress proxy after the setup), `exec` (a command run to
//! its end as an engine exec of its own), `runner` and `frames` (the check runner: every
//! check of an attempt through one exec, and its wire format),
//! `streams` (the tar streams in and out), `sandbox` (one run's container and its shells),
//! `spare` (a sandbox's next shell, started ahead), `warm` (containers made ahead of runs),
//! `preload` (warm ones holding a repository's checkout)
//! and `cleanup` (removal on every path). Who owns a container — its labels and this
//! process's identity — is [`crate::owner`], shared with the network fence and the
//! setup cache.

mod apply;
mod cleanup;
mod derived;
mod egress;
mod engine;
mod exec;
mod frames;
mod preload;
mod provision;
mod runner;
mod sandbox;
mod setup;
mod snapshot;
mod spare;
mod spec;
mod streams;
mod warm;

pub use cleanup::remove_all_live;
pub(super) use cleanup::{creation_gate, register_live, remove, remove_blocking};
pub use derived::{DERIVED_BASE_LABEL, DERIVED_LABEL, DERIVED_REPO};
pub use engine::{Engine, EngineFacts};
pub use preload::{
    PreloadKey, PreloadSource, PreloadUse, PreloadWant, MAX_DELTA_CHANGES, MAX_PRELOADED_ENTRIES,
};
pub use sandbox::{DiskGuard, DockerSandbox, MAX_SHELLS};
pub use spec::Shape;
pub use spec::{
    EgressSpec, NetworkMode, RepoSource, ResourceLimits, SandboxSpec, SetupSecret,
    DEFAULT_MAX_DISK_BYTES,
};
pub use warm::{WarmSandbox, WarmSource};
// The owner labels were first defined here; callers still name them through this module.
pub use super::owner::{
    owner_id, process_identity, ProcessIdentity, INSTANCE_LABEL, OWNER_LABEL, PRELOADED_LABEL,
    PROCESS_LABEL, RUN_LABEL, WARM_LABEL, WARM_NAME_PREFIX,
};
