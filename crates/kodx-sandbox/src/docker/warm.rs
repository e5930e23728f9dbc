//! Warm sandboxes: containers made ahead of any run — created with a run's limits, kodx's
//! files in, started and fenced — so that a run only copies its repository in and opens
//! its shell. Nothing of any run or repository has touched one; it is handed to one run
//! ([`WarmSandbox::claim`] renames it `kodx-<run id>`, as a container made for the run
//! would be named) and removed with that run's sandbox, never given to a second.
//!
//! [`Shape`] is what a container is made as; a run takes a warm sandbox only of its own
//! shape, from a [`WarmSource`] (the server's pool). They are made by
//! [`super::Engine::make_warm`] (in `provision`, with the other containers).

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bollard::query_parameters::RenameContainerOptions;
use bollard::Docker;

use super::cleanup::{remove, remove_blocking};
use super::sandbox::DiskGuard;
use super::spec::{ResourceLimits, SandboxSpec};
use crate::net::Cidr;
use crate::shell::Spawned;
use crate::{Result, SandboxError};

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

/// Where a run may find a warm sandbox of its shape.
pub trait WarmSource: Send + Sync {
    /// A warm sandbox of `shape`, taken out for good (no one else can take it), if there is
    /// one. Taking also tells the source that this shape is in use.
    fn take(&self, shape: &Shape) -> Option<WarmSandbox>;
}

/// A container made warm; removed when dropped unless a run claimed it.
pub struct WarmSandbox {
    docker: Docker,
    id: String,
    shape: Shape,
    guard: DiskGuard,
    made: Instant,
    done: AtomicBool,
    /// Its first shell's exec, started ahead and waiting to be opened.
    shell: Option<Spawned>,
}

impl WarmSandbox {
    /// A container just made warm ([`super::Engine::make_warm`]); removed when dropped
    /// unless claimed.
    pub(super) fn new(
        docker: Docker,
        id: String,
        shape: Shape,
        guard: DiskGuard,
        made: Instant,
    ) -> Self {
        WarmSandbox {
            docker,
            id,
            shape,
            guard,
            made,
            done: AtomicBool::new(false),
            shell: None,
        }
    }

    /// Keeps `shell`, its first shell's exec started ahead, for the run that claims it.
    pub(super) fn set_shell(&mut self, shell: Spawned) {
        self.shell = Some(shell);
    }

    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn shape(&self) -> &Shape {
        &self.shape
    }

    /// When it was made.
    pub fn made(&self) -> Instant {
        self.made
    }

    /// Makes it the container of run `run_id` (named `kodx-<run id>`): its id, how its
    /// disk is bounded, and its first shell's exec when one was started ahead. Fails when
    /// the container is gone or no longer running; it is then removed.
    pub(super) async fn claim(
        mut self,
        run_id: &str,
    ) -> Result<(String, DiskGuard, Option<Spawned>)> {
        let claimed = async {
            self.docker
                .rename_container(
                    &self.id,
                    RenameContainerOptions {
                        name: format!("kodx-{run_id}"),
                    },
                )
                .await
                .map_err(|e| SandboxError::docker("claiming a warm sandbox", e))?;
            // Still up: a container that died idle (the engine restarted, OOM) is no
            // sandbox.
            let running = self
                .docker
                .inspect_container(&self.id, None)
                .await
                .map_err(|e| SandboxError::docker("inspecting a warm sandbox", e))?
                .state
                .and_then(|s| s.running)
                .unwrap_or(false);
            if running {
                Ok(())
            } else {
                Err(SandboxError::InvalidInput(
                    "the warm sandbox is no longer running".into(),
                ))
            }
        };
        match claimed.await {
            Ok(()) => {
                self.done.store(true, Ordering::SeqCst);
                Ok((self.id.clone(), self.guard, self.shell.take()))
            }
            Err(e) => {
                self.remove().await;
                Err(e)
            }
        }
    }

    /// Removes it at once.
    pub async fn remove(self) {
        self.done.store(true, Ordering::SeqCst);
        let _ = remove(&self.docker, &self.id).await;
    }
}

impl Drop for WarmSandbox {
    fn drop(&mut self) {
        if !self.done.swap(true, Ordering::SeqCst) {
            remove_blocking(&self.docker, &self.id);
        }
    }
}
