//! A sandbox's spare shell: the engine exec of its next shell, started ahead of the call
//! that needs it and held by kodx's helper (`kodx-net gate`) until then, so that
//! `create_new_shell` only types the line that runs the shell (bash then reads its rc
//! files at that moment, as a shell started then would). One at most; made again after
//! each use. Without the helper there is none, and every shell starts as it is asked for.

use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;

use bollard::Docker;
use tokio::task::JoinHandle;

use crate::net;
use crate::shell::{Shell, Spawned};
use crate::Result;

/// How long after the sandbox's first shell opens its spare is started: later than a run
/// that ends at once (`kodx run` answered at once) needs, earlier than a model's first
/// answer comes back.
pub(super) const FIRST_SPARE_AFTER: Duration = Duration::from_millis(500);

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Not begun: nothing was asked of the engine yet.
    Waiting,
    /// The exec is being started, or is.
    Spawning,
    /// Taken before it began: it never will.
    Cancelled,
}

struct Slot {
    phase: Arc<Mutex<Phase>>,
    task: JoinHandle<Option<Spawned>>,
}

/// Where a spare shell is started: the sandbox's container and what its shells get.
pub(super) struct SpareShell {
    docker: Docker,
    container: String,
    workdir: String,
    output_cap: usize,
    slot: Mutex<Option<Slot>>,
}

impl SpareShell {
    pub(super) fn new(docker: Docker, container: &str, workdir: &str, output_cap: usize) -> Self {
        SpareShell {
            docker,
            container: container.to_string(),
            workdir: workdir.to_string(),
            output_cap,
            slot: Mutex::new(None),
        }
    }

    /// Starts the next spare shell after `delay`, unless one is there or on its way.
    pub(super) fn schedule(&self, delay: Duration) {
        if net::gate_command().is_none() {
            return;
        }
        let mut slot = self.slot.lock();
        if slot.is_some() {
            return;
        }
        let phase = Arc::new(Mutex::new(Phase::Waiting));
        let (docker, container, workdir, cap) = (
            self.docker.clone(),
            self.container.clone(),
            self.workdir.clone(),
            self.output_cap,
        );
        let task_phase = phase.clone();
        let task = tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            {
                let mut phase = task_phase.lock();
                if *phase == Phase::Cancelled {
                    return None;
                }
                *phase = Phase::Spawning;
            }
            match spawn_ahead(&docker, &container, &workdir, cap).await? {
                Ok(spawned) => Some(spawned),
                Err(e) => {
                    tracing::debug!("starting a spare shell failed: {e}");
                    None
                }
            }
        });
        *slot = Some(Slot { phase, task });
    }

    /// The spare shell when it is started or being started (then it is awaited: that is
    /// sooner than starting another); `None` when there is none, or its start had not
    /// begun (it is called off).
    pub(super) async fn take(&self) -> Option<Spawned> {
        let slot = self.slot.lock().take()?;
        {
            let mut phase = slot.phase.lock();
            if *phase == Phase::Waiting {
                *phase = Phase::Cancelled;
                slot.task.abort();
                return None;
            }
        }
        slot.task.await.ok().flatten()
    }

    /// Drops the spare (the sandbox goes): its exec ends with the container.
    pub(super) fn clear(&self) {
        if let Some(slot) = self.slot.lock().take() {
            slot.task.abort();
        }
    }
}

/// Starts a shell's exec in `container` ahead of its use, held by kodx's helper until it is
/// opened ([`Spawned::open`]); `None` when this kodx has no helper.
pub(super) async fn spawn_ahead(
    docker: &Docker,
    container: &str,
    workdir: &str,
    output_cap: usize,
) -> Option<Result<Spawned>> {
    let gate = net::gate_command()?;
    Some(Shell::spawn(docker, container, workdir, output_cap, gate, true).await)
}

/// Opens `spawned` as the shell `name`, or, when it cannot be opened, starts that shell
/// as without it.
pub(super) async fn open_or_start(
    spawned: Option<Result<Spawned>>,
    docker: &Docker,
    container: &str,
    name: &str,
    workdir: &str,
    output_cap: usize,
    hang_up: Option<u32>,
) -> Result<Arc<Shell>> {
    match spawned {
        Some(Ok(spawned)) => match spawned.open(name, workdir, hang_up).await {
            Ok(shell) => return Ok(shell),
            Err(e) => {
                tracing::warn!("a shell started ahead could not be opened ({e}); starting one")
            }
        },
        Some(Err(e)) => tracing::warn!("a shell started ahead failed ({e}); starting one"),
        None => {}
    }
    Shell::start(docker, container, name, workdir, output_cap, hang_up).await
}
