//! The fencer: one small container per engine that plugs and fences every sandbox with
//! one engine exec, instead of a helper container per sandbox (create, copy in, start,
//! wait, remove: about 225 ms of engine calls each time).
//!
//! It runs kodx's helper (`hold-idle`) in the engine host's PID and network namespaces with
//! `CAP_SYS_ADMIN`, `CAP_NET_ADMIN`, `CAP_SYS_PTRACE` and `CAP_SYS_CHROOT` (all others
//! dropped, no new privileges, 32 MiB, 16 processes, nothing listening); `kodx-net plug
//! <pid> …` run in it gives a sandbox its interface on the sandboxes' bridge, enters the
//! sandbox's network namespace and adds the routes there, and writes the sandbox's
//! resolvers from inside its mount namespace; `kodx-net addrs` lists the engine host's
//! addresses. Nothing of a sandbox or of a repository runs in it, and nothing but the
//! engine's API reaches it. It is shared by every kodx process using the engine (named
//! after the helper's hash, so a kodx with another helper makes its own), made by the
//! first that needs it, and made with auto-remove: once no fence was raised for
//! [`IDLE_SECS`], it exits and the engine removes it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use bollard::models::{ContainerCreateBody, HostConfig};
use bollard::query_parameters::CreateContainerOptions;
use bollard::Docker;
use bytes::Bytes;
use sha2::{Digest, Sha256};

use super::helper::{HELPER, HELPER_LABEL, HELPER_PATH};
use crate::sandbox::archive;
use crate::sandbox::{Result, SandboxError};

/// Seconds without a fence raised after which the fencer exits (and is removed).
pub const IDLE_SECS: u64 = 1800;
/// Name prefix of fencer containers: `kodx-fencer-<12 hex digits of the helper's hash>`.
pub const FENCER_PREFIX: &str = "kodx-fencer-";

/// Changed with the fencer's container settings: a kodx with other settings makes its own.
const FENCER_VERSION: &[u8] = b"fencer 3: plugs sandboxes";

/// This kodx's fencer's name.
pub fn fencer_name() -> String {
    static NAME: OnceLock<String> = OnceLock::new();
    NAME.get_or_init(|| {
        let hash = hex::encode(
            Sha256::new()
                .chain_update(FENCER_VERSION)
                .chain_update(HELPER)
                .finalize(),
        );
        format!("{FENCER_PREFIX}{}", &hash[..12])
    })
    .clone()
}

/// The fencer's container id per engine, as last found or made.
fn known() -> &'static Mutex<HashMap<String, String>> {
    static KNOWN: OnceLock<Mutex<HashMap<String, String>>> = OnceLock::new();
    KNOWN.get_or_init(Default::default)
}

/// Forgets the fencer of `engine` (it failed or is gone): the next fence finds or makes it
/// again.
pub(super) fn forget(engine: &str) {
    known().lock().remove(engine);
}

/// The running fencer of `engine` (its host string, the cache key): found, or made from
/// `image` (any image on the engine: only the helper runs in it).
pub(super) async fn fencer(docker: &Docker, engine: &str, image: &str) -> Result<String> {
    if let Some(id) = known().lock().get(engine) {
        return Ok(id.clone());
    }
    let name = fencer_name();
    let id = match running(docker, &name).await? {
        Some(id) => id,
        None => make(docker, &name, image).await?,
    };
    known().lock().insert(engine.to_string(), id.clone());
    Ok(id)
}

/// The fencer named `name` when it runs; waits a little for one another process is
/// starting, or one that is exiting to be gone.
async fn running(docker: &Docker, name: &str) -> Result<Option<String>> {
    for _ in 0..50 {
        match docker.inspect_container(name, None).await {
            Ok(info) => {
                let state = info.state.unwrap_or_default();
                if state.running == Some(true) {
                    return Ok(info.id);
                }
            }
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404, ..
            }) => return Ok(None),
            Err(e) => return Err(SandboxError::docker("looking for the network fencer", e)),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(SandboxError::NetworkFence(format!(
        "the container {name} neither runs nor goes away"
    )))
}

/// Makes and starts the fencer; when another process made it first, that one.
async fn make(docker: &Docker, name: &str, image: &str) -> Result<String> {
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        entrypoint: Some(vec![HELPER_PATH.to_string()]),
        cmd: Some(vec!["hold-idle".to_string(), IDLE_SECS.to_string()]),
        user: Some("0:0".to_string()),
        working_dir: Some("/".to_string()),
        labels: Some(HashMap::from([(
            HELPER_LABEL.to_string(),
            "fencer".to_string(),
        )])),
        host_config: Some(HostConfig {
            // The host's network: where the engine host's addresses are read.
            network_mode: Some("host".to_string()),
            pid_mode: Some("host".to_string()),
            // Sandboxes' namespaces belong to the engine's user namespace on an engine
            // that remaps users; entering one takes the host's.
            userns_mode: Some("host".to_string()),
            privileged: Some(false),
            cap_drop: Some(vec!["ALL".to_string()]),
            cap_add: Some(
                // SYS_CHROOT with SYS_ADMIN: entering a sandbox's mount namespace, to
                // write its resolvers.
                ["SYS_ADMIN", "NET_ADMIN", "SYS_PTRACE", "SYS_CHROOT"]
                    .map(String::from)
                    .to_vec(),
            ),
            security_opt: Some(vec!["no-new-privileges:true".to_string()]),
            memory: Some(32 << 20),
            pids_limit: Some(16),
            auto_remove: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(name.to_string()),
                ..Default::default()
            }),
            body,
        )
        .await;
    let id = match created {
        Ok(c) => c.id,
        // Another process (or task) is making it. The engine reserves the name before the
        // container can be looked up by it: a moment of "no such container" is expected.
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 409, ..
        }) => {
            for _ in 0..20 {
                if let Some(id) = running(docker, name).await? {
                    return Ok(id);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            return Err(SandboxError::NetworkFence(format!(
                "the container {name} went away"
            )));
        }
        Err(e) => return Err(SandboxError::docker("creating the network fencer", e)),
    };
    let tar = archive::pack_files(&[(&HELPER_PATH[1..], HELPER, 0o755)]);
    let started = async {
        docker
            .upload_to_container(
                &id,
                Some(bollard::query_parameters::UploadToContainerOptions {
                    path: "/".to_string(),
                    ..Default::default()
                }),
                bollard::body_full(Bytes::from(tar)),
            )
            .await
            .map_err(|e| SandboxError::docker("copying the helper into the network fencer", e))?;
        docker
            .start_container(&id, None)
            .await
            .map_err(|e| SandboxError::docker("starting the network fencer", e))
    };
    match started.await {
        Ok(()) => {
            tracing::info!(name, "made the network fencer for this engine's sandboxes");
            Ok(id)
        }
        Err(e) => {
            let _ = crate::sandbox::docker::remove(docker, &id).await;
            Err(e)
        }
    }
}
