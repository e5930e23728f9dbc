//! One sandbox's fence going up: its routes planned ([`Fence::plan`]) and the helper
//! container that adds them made while the sandbox starts, then run in the sandbox's
//! network namespace, which is checked for an address on the planned subnet and no IPv6.

use std::net::Ipv4Addr;

use bollard::Docker;

use super::helper::{parse_addresses, Helper};
use super::network::{SandboxNetwork, NETWORK_NAME};
use super::policy::{Cidr, Fence};
use crate::sandbox::{Result, SandboxError};

/// A sandbox's fence, ready to go up: the routes, and the helper container that adds
/// them, made (and loaded) before the sandbox starts so that only its start is left.
pub struct Fencing {
    pub fence: Fence,
    helper: Helper,
    subnet: Cidr,
}

impl Fencing {
    /// Plans the routes for a sandbox `id` (created, not necessarily started) on `net`, and
    /// makes the helper container that will add them in its network namespace. `None` when
    /// the operator allowed everything (`0.0.0.0/0`): there is nothing to fence.
    pub async fn prepare(
        docker: &Docker,
        image: &str,
        run_id: &str,
        id: &str,
        net: &SandboxNetwork,
        host_addrs: &[Ipv4Addr],
        allowed: &[Cidr],
    ) -> Result<Option<Fencing>> {
        let fence = Fence::plan(net.gateway, net.subnet, host_addrs, allowed);
        if fence.blocked.is_empty() {
            return Ok(None);
        }
        let helper = Helper::create(
            docker,
            image,
            run_id,
            &format!("container:{id}"),
            &["NET_ADMIN"],
            &fence.helper_args(net.gateway),
        )
        .await?;
        Ok(Some(Fencing {
            fence,
            helper,
            subnet: net.subnet,
        }))
    }

    /// Adds the routes in the (running) sandbox's namespace, and checks what the helper
    /// saw there: an address on the planned subnet, and no IPv6 address.
    pub async fn apply(self) -> Result<Fence> {
        let out = self.helper.run().await?;
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
}
