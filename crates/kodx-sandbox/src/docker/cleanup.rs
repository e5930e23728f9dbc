//! Removal of sandbox containers on every path: at once, from a `Drop` (a panic, a dropped
//! future), and all together on Ctrl-C, for which the containers this process made and has
//! not removed yet are kept in a registry.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use bollard::query_parameters::RemoveContainerOptions;
use bollard::Docker;

use crate::{Result, SandboxError};

pub(crate) async fn remove(docker: &Docker, id: &str) -> Result<()> {
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

pub(crate) fn register_live(docker: &Docker, id: &str) {
    live().lock().insert(id.to_string(), docker.clone());
}

fn unregister_live(id: &str) {
    live().lock().remove(id);
}

/// Creations in flight hold it for reading; the cleanup on interrupt takes it for writing.
pub(crate) fn creation_gate() -> &'static tokio::sync::RwLock<()> {
    static GATE: OnceLock<tokio::sync::RwLock<()>> = OnceLock::new();
    GATE.get_or_init(Default::default)
}

/// Removes every container this process still owns, including one being created right
/// now, and lets no new one be created afterwards. For signal handlers: call it, then exit.
pub async fn remove_all_live() -> usize {
    // Never released: the process is about to exit, and must not make new containers.
    std::mem::forget(creation_gate().write().await);
    let all: Vec<(String, Docker)> = live().lock().drain().collect();
    let n = all.len();
    futures_util::future::join_all(all.iter().map(|(id, d)| remove(d, id))).await;
    n
}

/// Removes a container from a synchronous context (a `Drop`).
pub(crate) fn remove_blocking(docker: &Docker, id: &str) {
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
