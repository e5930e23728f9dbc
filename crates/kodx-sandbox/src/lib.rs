//! The sandbox engine: one hardened Docker container per run, named PTY shells inside it,
//! a setup script, a network cut, and safe export of the workspace (SPEC §6).
//!
//! [`Sandbox`] is the seam the agent talks to; [`DockerSandbox`] is the real thing, made by
//! [`Engine::start`].

pub mod archive;
pub mod docker;
pub mod engines;
pub mod error;
pub mod gitconfig;
pub mod hostfs;
pub mod net;
pub mod owner;
pub mod ready;
pub mod redact;
pub mod setup_cache;
pub mod shell;
pub mod term;

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;

pub use archive::{Change, ChangeKind, ChangeSet, Contents, Exported, NewEntry};
pub use docker::{
    DiskGuard, DockerSandbox, EgressSpec, Engine, NetworkMode, PreloadKey, PreloadWant, RepoSource,
    ResourceLimits, SandboxSpec, SetupSecret, Shape, WarmSandbox, WarmSource,
    DEFAULT_MAX_DISK_BYTES,
};
pub use engines::EngineConfig;
pub use error::{Result, SandboxError};
pub use net::{Cidr, BLOCKED};
pub use setup_cache::{SetupCacheSpec, SetupCacheUse, SetupReport};
pub use shell::{FeedOutput, ShellStatus};

/// The shell `feed_chars` uses when the model names none.
pub const DEFAULT_SHELL: &str = "default";

/// How a command run to its end ([`Sandbox::run_to_end`]) went.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// What it printed, cleaned and bounded.
    pub output: String,
    /// Bytes cut from the middle of `output`.
    pub omitted_bytes: u64,
    /// Its exit code, as the engine reports it; `None` when it did not end.
    pub exit_code: Option<i64>,
    /// It ran past its timeout and was killed.
    pub timed_out: bool,
}

/// How one command of [`Sandbox::run_all`] went.
#[derive(Debug)]
pub enum Ran {
    /// It ran: to its end, to its timeout, or until kodx lost it (then without an exit
    /// code, never a pass).
    Done(Finished),
    /// What was left of `within` was spent before its turn: it did not start.
    NotStarted,
    /// kodx could not run it.
    Failed(SandboxError),
}

/// Where [`Sandbox::run_all`] reports each command as it ends, in order.
pub type Reports = tokio::sync::mpsc::UnboundedSender<Ran>;

/// A run's workspace with named shells, as the model's two tools see it.
#[async_trait]
pub trait Sandbox: Send + Sync {
    /// Starts a fresh shell under `name` in the workspace directory; `"default"` replaces
    /// the main shell, a new name adds a parallel one. Returns a line for the model.
    async fn create_new_shell(&self, name: &str) -> Result<String>;

    /// Types `chars` into the shell `name` and returns what it printed since the last read:
    /// as soon as it is back at its prompt, or partial output at `yield_time`.
    async fn feed_chars(&self, name: &str, chars: &str, yield_time: Duration)
        -> Result<FeedOutput>;

    /// Runs `command` with `bash -c` in the workspace directory, stdin from `/dev/null`, as
    /// its own process (not in a shell the model types into) to its end or `timeout`, which
    /// kills it and what it started. The exit code is the engine's: nothing in the sandbox
    /// can forge it, as it could a shell's prompt. Output: stdout and stderr as one stream,
    /// cleaned of escapes, its middle cut past `cap` bytes.
    async fn run_to_end(&self, command: &str, timeout: Duration, cap: usize) -> Result<Finished> {
        let _ = (command, timeout, cap);
        Err(SandboxError::InvalidInput(
            "this sandbox cannot run a command to its end".into(),
        ))
    }

    /// Runs `commands` (each with its timeout) one after another as [`Sandbox::run_to_end`]
    /// runs one, each bounded by its timeout and by what is left of `within`; a command
    /// whose turn comes after `within` is not started. Each one's outcome goes to
    /// `reports` as it ends, one per command, in order; one that is never reported (the
    /// batch ended early, or `Err`) did not pass. Output: each command's own, bounded by
    /// `cap` as `run_to_end` bounds it. The default runs them one `run_to_end` each.
    async fn run_all(
        &self,
        commands: &[(String, Duration)],
        within: Duration,
        cap: usize,
        reports: Reports,
    ) -> Result<()> {
        run_one_by_one(self, commands, within, cap, &reports).await;
        Ok(())
    }

    /// Writes the whole final workspace to `dest`, replacing what was there. Files the
    /// repository ignores that are over a size limit are left out and listed.
    async fn export_workspace(&self, dest: &Path) -> Result<Exported>;

    /// The exact change set against what was copied in.
    async fn change_set(&self) -> Result<ChangeSet>;

    /// The workspace directory inside the sandbox (`/workspace/repo` or `/workspace`).
    fn workdir(&self) -> &str;

    /// Resolves when the sandbox stopped on its own — it wrote past its disk limit — with
    /// the reason, in words for the maintainer; never resolves otherwise. The agent ends the
    /// run with it.
    async fn halted(&self) -> String {
        std::future::pending().await
    }

    /// Removes the sandbox at once. Idempotent.
    async fn destroy(&self) -> Result<()>;
}

/// [`Sandbox::run_all`] as one [`Sandbox::run_to_end`] per command.
pub async fn run_one_by_one<S: Sandbox + ?Sized>(
    sandbox: &S,
    commands: &[(String, Duration)],
    within: Duration,
    cap: usize,
    reports: &Reports,
) {
    let end = std::time::Instant::now() + within;
    for (command, timeout) in commands {
        let left = end.saturating_duration_since(std::time::Instant::now());
        let ran = if left.is_zero() {
            Ran::NotStarted
        } else {
            match sandbox.run_to_end(command, (*timeout).min(left), cap).await {
                Ok(done) => Ran::Done(done),
                Err(e) => Ran::Failed(e),
            }
        };
        let _ = reports.send(ran);
    }
}
