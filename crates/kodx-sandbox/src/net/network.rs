//! The bridge network every sandbox with network joins ([`NETWORK_NAME`]): made once as
//! kodx makes it (no IPv6, no traffic between its containers), reused by every run and
//! every kodx process on the engine, its creation serialised through a lock container, and
//! duplicates of its name healed.

use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use bollard::models::{ContainerCreateBody, HostConfig, NetworkCreateRequest};
use bollard::query_parameters::{CreateContainerOptions, ListNetworksOptions};
use bollard::Docker;

use super::helper::HelperGuard;
use super::image::{helper_image, no_healthcheck, HELPER_LABEL};
use super::policy::Cidr;
use crate::docker::{creation_gate, register_live, remove};
use crate::owner::{owner_id, OWNER_LABEL};
use crate::{Result, SandboxError};

/// The network every sandbox with network joins. Long-lived and shared by runs and by kodx
/// processes on the same engine; kodx never removes it.
pub const NETWORK_NAME: &str = "kodx-sandbox";
/// Label on the network kodx created (its value says what for).
pub const NETWORK_LABEL: &str = "kodx.network";

const ICC_OPTION: &str = "com.docker.network.bridge.enable_icc";

/// The sandboxes' network: its id, subnet, gateway (the host, as sandboxes see it) and
/// the name of its bridge interface on the engine's host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxNetwork {
    pub id: String,
    pub subnet: Cidr,
    pub gateway: Ipv4Addr,
    pub bridge: String,
}

/// The engine's option naming a bridge network's interface; without it the interface is
/// `br-` and the network id's first 12 characters.
const BRIDGE_NAME_OPTION: &str = "com.docker.network.bridge.name";

impl SandboxNetwork {
    fn of(n: &bollard::models::Network, name: &str) -> Result<SandboxNetwork> {
        let config = n
            .ipam
            .as_ref()
            .and_then(|i| i.config.as_ref())
            .and_then(|c| {
                c.iter()
                    .find(|c| c.subnet.as_deref().is_some_and(|s| !s.contains(':')))
            })
            .ok_or_else(|| {
                SandboxError::NetworkFence(format!("the Docker network {name} has no IPv4 subnet"))
            })?;
        let subnet: Cidr = config
            .subnet
            .as_deref()
            .unwrap_or("")
            .parse()
            .map_err(|e| SandboxError::NetworkFence(format!("the subnet of {name}: {e}")))?;
        // Older engines list only the subnet; the gateway is then its first address.
        let gateway = match config.gateway.as_deref().filter(|g| !g.is_empty()) {
            Some(g) => g.parse().map_err(|_| {
                SandboxError::NetworkFence(format!("the gateway of {name} is not IPv4: {g}"))
            })?,
            None => Ipv4Addr::from(u32::from(subnet.addr()) + 1),
        };
        let id = n.id.clone().unwrap_or_default();
        let bridge = match n.options.as_ref().and_then(|o| o.get(BRIDGE_NAME_OPTION)) {
            Some(b) if !b.is_empty() => b.clone(),
            _ => format!("br-{}", id.get(..12).unwrap_or(&id)),
        };
        Ok(SandboxNetwork {
            id,
            subnet,
            gateway,
            bridge,
        })
    }
}

/// Makes sure the network `name` exists as kodx makes it, and returns it. Safe when
/// several kodx processes on one engine do it at once.
///
/// The engine lets two networks share a name, and then refuses to start any container on
/// either ("network … is ambiguous"). So the creation is serialised through a container
/// name, which the engine does keep unique: whoever makes the container `<name>-lock`
/// (never started) creates the network, then removes it. Duplicates left by anything else
/// are healed: the one with the smallest id stays, unused others are removed.
pub async fn ensure_network(docker: &Docker, name: &str) -> Result<SandboxNetwork> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let found = list_named(docker, name).await?;
        match found.as_slice() {
            [one] => {
                check_network(one, name)?;
                return SandboxNetwork::of(one, name);
            }
            [keep, others @ ..] => {
                heal(docker, name, keep, others).await?;
                continue;
            }
            [] => {}
        }
        match take_lock(docker, name).await? {
            Some(lock) => {
                let made = async {
                    if list_named(docker, name).await?.is_empty() {
                        create_network(docker, name).await?;
                    }
                    Ok::<(), SandboxError>(())
                }
                .await;
                lock.remove().await;
                made?;
            }
            None if Instant::now() > deadline => {
                return Err(SandboxError::NetworkFence(format!(
                    "the Docker network {name} was not created within 60s while another kodx \
                     held the container {name}-lock; if no kodx is starting, remove it \
                     (`docker rm -f {name}-lock`)"
                )))
            }
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn create_network(docker: &Docker, name: &str) -> Result<()> {
    let request = NetworkCreateRequest {
        name: name.to_string(),
        driver: Some("bridge".into()),
        internal: Some(false),
        attachable: Some(false),
        enable_ipv6: Some(false),
        options: Some(HashMap::from([(
            ICC_OPTION.to_string(),
            "false".to_string(),
        )])),
        labels: Some(HashMap::from([(
            NETWORK_LABEL.to_string(),
            "sandbox".to_string(),
        )])),
        ..Default::default()
    };
    match docker.create_network(request).await {
        Ok(r) => {
            tracing::info!(network = %name, id = %r.id, "created the Docker network for sandboxes");
            Ok(())
        }
        // Newer engines refuse a second network of the same name: it is there.
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 409, ..
        }) => Ok(()),
        Err(e) => Err(SandboxError::docker(
            format!("creating the Docker network {name} for sandboxes"),
            e,
        )),
    }
}

/// Leaves only `keep` of several networks called `name`: the others are removed when no
/// container uses them.
async fn heal(
    docker: &Docker,
    name: &str,
    keep: &bollard::models::Network,
    others: &[bollard::models::Network],
) -> Result<()> {
    for other in others {
        let Some(id) = other.id.as_deref() else {
            continue;
        };
        let in_use = match docker.inspect_network(id, None).await {
            Ok(n) => n.containers.is_some_and(|c| !c.is_empty()),
            Err(_) => continue,
        };
        let removed = !in_use
            && match docker.remove_network(id).await {
                Ok(()) => true,
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => true,
                Err(_) => false,
            };
        if !removed {
            return Err(SandboxError::NetworkFence(format!(
                "several Docker networks are named {name} and the engine starts no container \
                 on an ambiguous name; remove all but {} when no run uses them \
                 (`docker network ls --filter name={name}`)",
                keep.id.as_deref().unwrap_or("one")
            )));
        }
        tracing::warn!(network = %name, id, "removed a duplicate of the sandbox network");
    }
    Ok(())
}

/// Makes the container `<name>-lock`; `None` when another process holds it (one older
/// than a minute is taken as left by a crash, and removed).
async fn take_lock(docker: &Docker, name: &str) -> Result<Option<HelperGuard>> {
    let lock = format!("{name}-lock");
    let body = ContainerCreateBody {
        image: Some(helper_image(docker).await?),
        healthcheck: Some(no_healthcheck()),
        entrypoint: Some(vec!["/nonexistent".to_string()]),
        labels: Some(HashMap::from([
            (OWNER_LABEL.to_string(), owner_id().to_string()),
            (HELPER_LABEL.to_string(), "lock".to_string()),
        ])),
        host_config: Some(HostConfig {
            network_mode: Some("none".to_string()),
            ..Default::default()
        }),
        ..Default::default()
    };
    // Held until registered, as for sandboxes: an interrupt's cleanup cannot miss it.
    let _creating = creation_gate().read().await;
    let created = docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(lock.clone()),
                ..Default::default()
            }),
            body,
        )
        .await;
    match created {
        Ok(c) => {
            register_live(docker, &c.id);
            Ok(Some(HelperGuard::new(docker, c.id)))
        }
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 409, ..
        }) => {
            if let Ok(info) = docker.inspect_container(&lock, None).await {
                let age = info
                    .created
                    .as_deref()
                    .and_then(unix_seconds)
                    .map(|t| now_seconds().saturating_sub(t));
                if age.is_some_and(|a| a > 60) {
                    tracing::warn!(lock = %lock, "removing a stale network lock");
                    let _ = remove(docker, info.id.as_deref().unwrap_or(&lock)).await;
                }
            }
            Ok(None)
        }
        Err(e) => Err(SandboxError::docker(
            format!("creating the lock container {lock} for the sandbox network"),
            e,
        )),
    }
}

fn now_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Seconds since the epoch of an RFC 3339 time in UTC (`2026-11-23T12:03:48.06Z`), as the
/// engine writes them.
fn unix_seconds(t: &str) -> Option<u64> {
    if !t.ends_with('Z') {
        return None;
    }
    u64::try_from(chrono::DateTime::parse_from_rfc3339(t).ok()?.timestamp()).ok()
}

/// Networks named exactly `name`, smallest id first.
async fn list_named(docker: &Docker, name: &str) -> Result<Vec<bollard::models::Network>> {
    let mut found: Vec<_> = docker
        .list_networks(Some(ListNetworksOptions {
            filters: Some(HashMap::from([(
                "name".to_string(),
                vec![name.to_string()],
            )])),
        }))
        .await
        .map_err(|e| SandboxError::docker(format!("listing the Docker network {name}"), e))?
        .into_iter()
        .filter(|n| n.name.as_deref() == Some(name))
        .collect();
    found.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(found)
}

fn check_network(n: &bollard::models::Network, name: &str) -> Result<()> {
    let labelled = n
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(NETWORK_LABEL));
    if !labelled {
        return Err(SandboxError::NetworkFence(format!(
            "a Docker network named {name} exists that kodx did not create; remove it \
             (`docker network rm {name}`) so kodx can make its own"
        )));
    }
    let icc_off = n
        .options
        .as_ref()
        .and_then(|o| o.get(ICC_OPTION))
        .is_some_and(|v| v == "false");
    if n.driver.as_deref() != Some("bridge")
        || !icc_off
        || n.internal == Some(true)
        || n.enable_ipv6 == Some(true)
    {
        return Err(SandboxError::NetworkFence(format!(
            "the Docker network {name} is not as kodx makes it (a bridge without IPv6 and \
             with {ICC_OPTION}=false); remove it (`docker network rm {name}`, when no run is \
             active) so kodx makes it again"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_times_read_as_unix_seconds() {
        assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            unix_seconds("2026-11-23T12:03:48.06126126Z"),
            Some(1_795_435_428)
        );
        assert_eq!(unix_seconds("2000-03-01T00:00:00Z"), Some(951_868_800));
        assert_eq!(unix_seconds("2026-11-23T12:03:48+02:00"), None);
        assert_eq!(unix_seconds("garbage"), None);
        assert_eq!(
            unix_seconds("0001-01-01T00:00:00Z"),
            None,
            "Docker's zero time"
        );
    }
}
