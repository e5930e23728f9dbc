//! The fencer: one small container per engine that plugs and fences every sandbox with
//! one engine exec, instead of a helper container per sandbox (create, copy in, start,
//! wait, remove: about 225 ms of engine calls each time).
//!
//! It is made from kodx's own image ([`super::image`]: the helper and nothing else, no
//! healthcheck), never from a run's or a repository's. It runs kodx's helper
//! (`hold-idle`) in the engine host's PID and network namespaces with
//! [`FENCER_CAPABILITIES`] (all others dropped, no new privileges, 32 MiB, 16 processes,
//! nothing listening); `kodx-net plug <pid> …` run in it gives a sandbox its interface on
//! the sandboxes' bridge (an isolated port, behind the bridge's filter), enters the
//! sandbox's network namespace and adds the routes there, and writes the sandbox's
//! resolvers through its root; `kodx-net addrs` lists the engine host's addresses.
//! Nothing of a sandbox or of a repository runs in it, and nothing but the engine's API
//! reaches it; a container found under its name that is not exactly that is removed. It
//! is shared by every kodx process using the engine (named after the helper's hash, so a
//! kodx with another helper makes its own), made by the first that needs it, and made
//! with auto-remove: once no fence was raised for [`IDLE_SECS`], it exits and the engine
//! removes it.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use bollard::models::{ContainerCreateBody, ContainerInspectResponse, HostConfig};
use bollard::query_parameters::CreateContainerOptions;
use bollard::Docker;
use sha2::{Digest, Sha256};

use super::image::{helper_image, no_healthcheck, HELPER, HELPER_LABEL, IMAGE_HELPER_PATH};
use crate::{Result, SandboxError};

/// Seconds without a fence raised after which the fencer exits (and is removed).
pub const IDLE_SECS: u64 = 1800;
/// Name prefix of fencer containers: `kodx-fencer-<12 hex digits of the helper's hash>`.
pub const FENCER_PREFIX: &str = "kodx-fencer-";

/// Changed with the fencer's container settings: a kodx with other settings makes its own.
const FENCER_VERSION: &[u8] = b"fencer 4: kodx's own image";

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
/// kodx's own image. One found under the fencer's name that is not kodx's (another image,
/// another command, a healthcheck, other privileges) is removed and made again.
pub(super) async fn fencer(docker: &Docker, engine: &str) -> Result<String> {
    if let Some(id) = known().lock().get(engine) {
        return Ok(id.clone());
    }
    let image = helper_image(docker).await?;
    let name = fencer_name();
    let id = match running(docker, &name, &image).await? {
        Some(id) => id,
        None => make(docker, &name, &image).await?,
    };
    known().lock().insert(engine.to_string(), id.clone());
    Ok(id)
}

/// The capabilities the fencer runs with: entering a sandbox's network namespace takes
/// `SYS_ADMIN`, opening it (and the sandbox's root, for its resolvers) takes `SYS_PTRACE`
/// (the sandbox's init runs as another user or with capabilities the fencer lacks), and
/// its interface, addresses, routes and the bridge's filter take `NET_ADMIN`.
pub const FENCER_CAPABILITIES: [&str; 3] = ["NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE"];

/// Whether the container `info` is a fencer as this kodx makes it: of kodx's image
/// (`image`, its id), running the helper's `hold-idle`, no healthcheck, no other privileges.
fn is_kodx_fencer(info: &ContainerInspectResponse, image: &str) -> bool {
    let config = info.config.clone().unwrap_or_default();
    let host = info.host_config.clone().unwrap_or_default();
    // Engines may spell them `CAP_NET_ADMIN` or `net_admin`.
    let plain = |caps: Option<Vec<String>>| -> Vec<String> {
        let mut caps: Vec<String> = caps
            .unwrap_or_default()
            .iter()
            .map(|c| {
                let c = c.to_ascii_uppercase();
                c.strip_prefix("CAP_").map(str::to_string).unwrap_or(c)
            })
            .collect();
        caps.sort();
        caps
    };
    let caps = plain(host.cap_add.clone());
    info.image.as_deref() == Some(image)
        && config.entrypoint.as_deref() == Some(&[IMAGE_HELPER_PATH.to_string()][..])
        && config
            .cmd
            .as_ref()
            .and_then(|c| c.first())
            .map(String::as_str)
            == Some("hold-idle")
        && config
            .healthcheck
            .as_ref()
            .and_then(|h| h.test.as_ref())
            .and_then(|t| t.first())
            .map(String::as_str)
            == Some("NONE")
        && host.privileged != Some(true)
        && plain(host.cap_drop.clone()) == ["ALL"]
        && caps == FENCER_CAPABILITIES
        && host.binds.as_ref().is_none_or(|b| b.is_empty())
        && host.mounts.as_ref().is_none_or(|m| m.is_empty())
}

/// The fencer named `name` when it runs and is kodx's (made from `image`); waits a little
/// for one another process is starting, or one that is exiting to be gone. One that is
/// not kodx's is removed.
async fn running(docker: &Docker, name: &str, image: &str) -> Result<Option<String>> {
    for _ in 0..50 {
        match docker.inspect_container(name, None).await {
            Ok(info) if !is_kodx_fencer(&info, image) => {
                tracing::warn!(
                    container = name,
                    image = info
                        .config
                        .as_ref()
                        .and_then(|c| c.image.as_deref())
                        .unwrap_or("?"),
                    "a container named as kodx's network fencer is not kodx's: removing it"
                );
                let id = info.id.unwrap_or_else(|| name.to_string());
                match crate::docker::remove(docker, &id).await {
                    Ok(()) => return Ok(None),
                    // Another process is removing it: wait for it to be gone.
                    Err(e) if e.to_string().contains("already in progress") => {}
                    Err(e) => {
                        return Err(SandboxError::NetworkFence(format!(
                            "the container {name} is not kodx's network fencer and could not be \
                             removed ({e}); remove it (`docker rm -f {name}`)"
                        )))
                    }
                }
            }
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
    // Made but never started (a process ended between the two), or stuck: made anew.
    tracing::warn!(
        container = name,
        "the network fencer has not been running for 5s: making it again"
    );
    crate::docker::remove(docker, name).await.map_err(|e| {
        SandboxError::NetworkFence(format!(
            "the container {name} neither runs nor goes away ({e}); remove it (`docker rm -f {name}`)"
        ))
    })?;
    Ok(None)
}

/// Makes and starts the fencer; when another process made it first, that one.
async fn make(docker: &Docker, name: &str, image: &str) -> Result<String> {
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        entrypoint: Some(vec![IMAGE_HELPER_PATH.to_string()]),
        healthcheck: Some(no_healthcheck()),
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
            cap_add: Some(FENCER_CAPABILITIES.map(String::from).to_vec()),
            security_opt: Some(vec!["no-new-privileges:true".to_string()]),
            memory: Some(32 << 20),
            // Each exec is the helper (one task) and, while it starts, the runtime's init
            // (several threads): 8 sandboxes starting at once held 11 here. A limit hit
            // fails the exec ("exit code 126"), which kodx then runs again.
            pids_limit: Some(64),
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
                if let Some(id) = running(docker, name, image).await? {
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
    let started = async {
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
            let _ = crate::docker::remove(docker, &id).await;
            Err(e)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bollard::models::{ContainerConfig, HealthConfig};

    fn fencer(image: &str, caps: &[&str]) -> ContainerInspectResponse {
        ContainerInspectResponse {
            image: Some(image.to_string()),
            config: Some(ContainerConfig {
                entrypoint: Some(vec![IMAGE_HELPER_PATH.to_string()]),
                cmd: Some(vec!["hold-idle".to_string(), IDLE_SECS.to_string()]),
                healthcheck: Some(HealthConfig {
                    test: Some(vec!["NONE".to_string()]),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            host_config: Some(HostConfig {
                cap_drop: Some(vec!["ALL".to_string()]),
                cap_add: Some(caps.iter().map(|c| c.to_string()).collect()),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn only_a_fencer_of_kodx_image_with_its_capabilities_is_kodx_s() {
        let ours = fencer("sha256:kodx", &FENCER_CAPABILITIES);
        assert!(is_kodx_fencer(&ours, "sha256:kodx"));
        // However the engine spells the capabilities.
        let spelled = fencer(
            "sha256:kodx",
            &["CAP_SYS_PTRACE", "cap_net_admin", "SYS_ADMIN"],
        );
        assert!(is_kodx_fencer(&spelled, "sha256:kodx"));
        // Another image, one more capability, a healthcheck, another command: not kodx's.
        assert!(!is_kodx_fencer(&ours, "sha256:repository"));
        let more = fencer(
            "sha256:kodx",
            &["NET_ADMIN", "SYS_ADMIN", "SYS_PTRACE", "SYS_CHROOT"],
        );
        assert!(!is_kodx_fencer(&more, "sha256:kodx"));
        let mut checked = ours.clone();
        checked.config.as_mut().unwrap().healthcheck = Some(HealthConfig {
            test: Some(vec!["CMD-SHELL".to_string(), "true".to_string()]),
            ..Default::default()
        });
        assert!(!is_kodx_fencer(&checked, "sha256:kodx"));
        let mut other = ours;
        other.config.as_mut().unwrap().cmd = Some(vec!["sleep".to_string()]);
        assert!(!is_kodx_fencer(&other, "sha256:kodx"));
    }
}
