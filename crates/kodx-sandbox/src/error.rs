//! Errors of the sandbox engine. Each variant a caller can branch on is typed; every
//! message says what happened in words a maintainer can act on.

use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// No Docker engine answered. `hint` says what to do about it.
    #[error("cannot reach the Docker engine at {host}: {reason}\n{hint}")]
    EngineUnavailable {
        host: String,
        reason: String,
        hint: String,
    },

    /// The environment names an engine kodx will not use (`DOCKER_HOST=tcp://` without TLS):
    /// the one-line sentence says what to set.
    #[error("{0}")]
    EngineRefused(String),

    /// The image is not present and could not be pulled.
    #[error("image {image:?} is not available: {reason}")]
    ImageUnavailable { image: String, reason: String },

    /// The setup script exited non-zero (stop reason `setup_failed`).
    #[error("setup script failed with exit code {exit_code}; last lines of its output:\n{tail}")]
    SetupFailed { exit_code: i64, tail: String },

    /// The setup script ran past its own timeout (stop reason `setup_failed`).
    #[error("setup script did not finish within {}s; last lines of its output:\n{tail}", timeout.as_secs())]
    SetupTimedOut { timeout: Duration, tail: String },

    /// A tar stream (from the container, or a host tree) broke one of the safety rules:
    /// absolute path, `..`, a link leaving the tree, a device file, a size limit.
    #[error("unsafe archive: {0}")]
    UnsafeArchive(String),

    /// The sandbox's network could not be fenced off from the host and private ranges, so
    /// it is not started.
    #[error("the sandbox's network could not be fenced off from the host: {0}")]
    NetworkFence(String),

    /// The sandbox wrote more than its disk limit and was stopped.
    #[error("the sandbox wrote {} to its disk, over its limit of {} (max_disk_bytes), and was stopped", human_bytes(*used), human_bytes(*limit))]
    DiskLimit { limit: u64, used: u64 },

    /// A shell name that was never created.
    #[error("no shell named {0:?}: call create_new_shell with that name first")]
    UnknownShell(String),

    /// Refused for a run this process no longer holds (a shared queue's fencing).
    #[error("not run: this process lost the run's lease; another process runs it now")]
    LeaseLost,

    /// The input is not acceptable (bad shell name, bad path, …).
    #[error("{0}")]
    InvalidInput(String),

    /// A Docker Engine API call failed.
    #[error("{context}: {source}")]
    Docker {
        context: String,
        #[source]
        source: bollard::errors::Error,
    },

    /// A host filesystem operation failed.
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
}

impl SandboxError {
    /// The run's stop reason when this error ends it (SPEC §7).
    pub fn stop_reason(&self) -> &'static str {
        match self {
            SandboxError::SetupFailed { .. } | SandboxError::SetupTimedOut { .. } => "setup_failed",
            _ => "error",
        }
    }

    pub(crate) fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        SandboxError::Io {
            context: context.into(),
            source,
        }
    }

    pub(crate) fn docker(context: impl Into<String>, source: bollard::errors::Error) -> Self {
        SandboxError::Docker {
            context: context.into(),
            source,
        }
    }
}

pub type Result<T, E = SandboxError> = std::result::Result<T, E>;

/// `1.5 GiB`, `320.0 MiB`, `512 bytes`.
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if n < 1024 {
        return format!("{n} bytes");
    }
    let mut v = n as f64 / 1024.0;
    let mut unit = 0;
    while v >= 1024.0 && unit < UNITS.len() - 1 {
        v /= 1024.0;
        unit += 1;
    }
    format!("{v:.1} {}", UNITS[unit])
}
