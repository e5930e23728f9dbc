//! One sandbox's fence going up: its routes planned ([`Fencing::plan`]), then added in the
//! sandbox's network namespace by the engine's fencer ([`super::fencer`]) with one exec,
//! before anything of the image runs in the sandbox; the namespace is checked for an
//! address on the planned subnet and no IPv6. Where the fencer cannot be used (an engine
//! that refuses it its capabilities or its host PID namespace), a short-lived helper
//! container joined to the sandbox's namespace adds them, as before the fencer.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use bollard::Docker;

use super::fencer;
use super::helper::{exec_in, parse_addresses, Helper};
use super::network::{SandboxNetwork, NETWORK_NAME};
use super::policy::{Cidr, Fence};
use crate::sandbox::{Result, SandboxError};

/// How long an engine whose fencer failed gets helper containers before it is tried again.
const FENCER_RETRY: Duration = Duration::from_secs(600);

/// A sandbox's fence, ready to go up: the routes and the helper's arguments.
#[derive(Debug, Clone)]
pub struct Fencing {
    pub fence: Fence,
    routes: Vec<String>,
    subnet: Cidr,
    /// The engine (its host) and an image on it, for the fencer or a helper container.
    engine: String,
    image: String,
    /// The run (or warm sandbox) id a helper container is labelled with.
    run_id: String,
}

impl Fencing {
    /// Plans the routes for a sandbox of `run_id` from `image` on `net` of `engine`.
    /// `None` when the operator allowed everything (`0.0.0.0/0`): there is nothing to fence.
    pub fn plan(
        net: &SandboxNetwork,
        host_addrs: &[Ipv4Addr],
        allowed: &[Cidr],
        engine: &str,
        image: &str,
        run_id: &str,
    ) -> Option<Self> {
        let fence = Fence::plan(net.gateway, net.subnet, host_addrs, allowed);
        if fence.blocked.is_empty() {
            return None;
        }
        let mut routes = fence.helper_args(net.gateway);
        routes.remove(0); // "routes"
        Some(Fencing {
            fence,
            routes,
            subnet: net.subnet,
            engine: engine.to_string(),
            image: image.to_string(),
            run_id: run_id.to_string(),
        })
    }

    /// Adds the routes in the namespace of the running sandbox `id`, whose main process is
    /// the helper's `hold` (nothing of its image has run), and checks what the helper saw
    /// there: an address on the planned subnet, and no IPv6 address.
    pub async fn apply(self, docker: &Docker, id: &str) -> Result<Fence> {
        let out = match self.by_fencer(docker, id).await {
            Ok(out) => out,
            Err(e) => {
                refused().lock().insert(self.engine.clone(), Instant::now());
                tracing::warn!(
                    "the engine's network fencer could not fence the sandbox ({e}); fencing \
                     it with a helper container, and so for the next {} minutes",
                    FENCER_RETRY.as_secs() / 60
                );
                let mut args = vec!["routes".to_string()];
                args.extend(self.routes.iter().cloned());
                Helper::create(
                    docker,
                    &self.image,
                    &self.run_id,
                    &format!("container:{id}"),
                    &["NET_ADMIN"],
                    &args,
                )
                .await?
                .run()
                .await?
            }
        };
        let addrs = parse_addresses(&out)?;
        if let Some(v6) = addrs.v6.iter().find(|a| !a.is_loopback()) {
            return Err(SandboxError::NetworkFence(format!(
                "the sandbox has the IPv6 address {v6}, which kodx does not fence; the network \
                 {NETWORK_NAME} must be without IPv6"
            )));
        }
        if !addrs.v4.iter().any(|a| self.subnet.contains_addr(*a)) {
            return Err(SandboxError::NetworkFence(format!(
                "the sandbox has no address on {}, the subnet of {NETWORK_NAME} the routes were \
                 planned for (it has {:?})",
                self.subnet, addrs.v4
            )));
        }
        Ok(self.fence)
    }

    /// The routes added by the engine's fencer, in the namespace of the sandbox's init;
    /// a fencer found gone is made again once.
    async fn by_fencer(&self, docker: &Docker, id: &str) -> Result<String> {
        let refused_at = refused().lock().get(&self.engine).copied();
        if refused_at.is_some_and(|at| at.elapsed() < FENCER_RETRY) {
            return Err(SandboxError::NetworkFence(
                "the fencer failed on this engine lately".into(),
            ));
        }
        let pid = docker
            .inspect_container(id, None)
            .await
            .map_err(|e| SandboxError::docker("inspecting the sandbox", e))?
            .state
            .and_then(|s| s.pid)
            .filter(|p| *p > 0)
            .ok_or_else(|| SandboxError::NetworkFence("the sandbox is not running".into()))?;
        let mut args = vec!["fence".to_string(), pid.to_string()];
        args.extend(self.routes.iter().cloned());
        let mut tries = 0;
        loop {
            tries += 1;
            let fencer = fencer::fencer(docker, &self.engine, &self.image).await?;
            match exec_in(docker, &fencer, &args).await {
                // Exited idle or removed since it was last seen: made again.
                Err(SandboxError::Docker { source, .. }) if tries == 1 && gone(&source) => {
                    fencer::forget(&self.engine);
                }
                Err(e) => {
                    fencer::forget(&self.engine);
                    return Err(e);
                }
                Ok(out) => return Ok(out),
            }
        }
    }
}

/// Whether the engine said the container is not there or not running.
fn gone(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404 | 409,
            ..
        }
    )
}

/// Engines whose fencer failed, and when.
fn refused() -> &'static Mutex<HashMap<String, Instant>> {
    static REFUSED: OnceLock<Mutex<HashMap<String, Instant>>> = OnceLock::new();
    REFUSED.get_or_init(Default::default)
}
