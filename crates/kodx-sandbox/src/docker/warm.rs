//! Warm sandboxes: containers made ahead of any run — created with a run's limits, kodx's
//! files in, started and fenced — so that a run only copies its repository in and opens
//! its shell. Nothing of any run has touched one (nor of any repository, but the one a
//! preloaded sandbox was filled with, from a ready checkout); it is handed to one run
//! ([`WarmSandbox::claim`] renames it `kodx-<run id>`, as a container made for the run
//! would be named) and removed with that run's sandbox, never given to a second.
//!
//! [`Shape`] is what a container is made as; a run takes a warm sandbox only of its own
//! shape, from a [`WarmSource`] (the server's pool). They are made by
//! [`super::Engine::make_warm`] (in `provision`, with the other containers). A preloaded
//! one ([`super::preload`]) also holds a repository's checkout, for that repository's runs
//! alone.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use bollard::query_parameters::RenameContainerOptions;
use bollard::Docker;

use super::cleanup::{remove, remove_blocking};
use super::preload::{PreloadKey, Preloaded};
use super::sandbox::DiskGuard;
use super::spec::Shape;
use crate::shell::Spawned;
use crate::{Result, SandboxError};

/// Where a run may find a warm sandbox of its shape.
pub trait WarmSource: Send + Sync {
    /// A warm sandbox of `shape`, taken out for good (no one else can take it), if there is
    /// one: one preloaded for `preload` first ([`super::preload`]), else an empty one.
    /// Never one preloaded for another key, or for any when `preload` is `None`. Taking
    /// also tells the source that this shape is in use.
    fn take(&self, shape: &Shape, preload: Option<&PreloadKey>) -> Option<WarmSandbox>;
}

/// A warm sandbox made a run's container ([`WarmSandbox::claim`]).
pub(super) struct Claimed {
    pub(super) id: String,
    pub(super) guard: DiskGuard,
    /// Its first shell's exec, when one was started ahead.
    pub(super) shell: Option<Spawned>,
    pub(super) preloaded: Option<Preloaded>,
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
    /// The repository checkout it holds, if it was preloaded.
    preloaded: Option<Preloaded>,
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
            preloaded: None,
        }
    }

    /// Records the checkout copied into it ([`super::Engine::make_preloaded`]).
    pub(super) fn set_preloaded(&mut self, preloaded: Preloaded) {
        self.preloaded = Some(preloaded);
    }

    /// The runs it is kept for, when it holds a repository's checkout.
    pub fn preloaded_for(&self) -> Option<&PreloadKey> {
        self.preloaded.as_ref().map(|p| &p.key)
    }

    /// The commit of the checkout it holds, when preloaded.
    pub fn preloaded_commit(&self) -> Option<&str> {
        self.preloaded.as_ref().map(|p| p.source.commit())
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
    pub(super) async fn claim(mut self, run_id: &str) -> Result<Claimed> {
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
                Ok(Claimed {
                    id: self.id.clone(),
                    guard: self.guard,
                    shell: self.shell.take(),
                    preloaded: self.preloaded.take(),
                })
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
