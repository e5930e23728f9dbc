//! `kodx run --allow-host`: the same egress by name as a repository's `network.allow` in
//! `kodx serve` (SPEC §12): after the setup script the container reaches only an egress
//! proxy this process starts on the sandboxes' gateway, which lets the named hosts
//! through; what it refused is printed at the end.

use std::net::IpAddr;

use anyhow::Context as _;
use kodx::egress::{AllowList, EgressProxy, Policy, Registration, Resolver};
use kodx::sandbox::{Cidr, DockerSandbox, EgressSpec, Engine, SandboxSpec};

/// Connections the proxy of one `kodx run` serves at once.
const MAX_CONNECTIONS: usize = 256;

/// The run's proxy and what it lets through.
pub struct CliEgress {
    proxy: EgressProxy,
    policy: Policy,
}

impl CliEgress {
    /// With `--allow-host`: starts the proxy on `engine`'s sandbox network and narrows
    /// `spec` to it after setup. `None` without the flag.
    pub async fn prepare(
        engine: &Engine,
        hosts: &[String],
        operator: &[Cidr],
        spec: &mut SandboxSpec,
    ) -> anyhow::Result<Option<CliEgress>> {
        if hosts.is_empty() {
            return Ok(None);
        }
        let allow = AllowList::parse(hosts.iter().map(String::as_str))
            .map_err(|e| anyhow::anyhow!("--allow-host: {e}"))?;
        if spec.no_network {
            anyhow::bail!("--allow-host needs a network: it cannot go with --network off");
        }
        let network =
            kodx::sandbox::net::ensure_network(engine.docker(), kodx::sandbox::net::NETWORK_NAME)
                .await
                .context("--allow-host: the sandboxes' network")?;
        let proxies = kodx::egress::Proxies::new(Resolver::System, MAX_CONNECTIONS);
        let proxy = proxies
            .on(engine.host(), network.gateway)
            .await
            .map_err(|e| anyhow::anyhow!("--allow-host: {e}"))?;
        spec.egress = Some(EgressSpec {
            port: proxy.addr().port(),
            ca_pem: None,
            placeholders: Vec::new(),
        });
        spec.disable_network_after_setup = true;
        let policy = Policy {
            allow,
            operator: operator
                .iter()
                .map(|c| ipnet::IpNet::V4((*c).into()))
                .collect(),
            inject: None,
        };
        Ok(Some(CliEgress { proxy, policy }))
    }

    /// Serves the started sandbox until the registration is dropped.
    pub fn register(&self, sandbox: &DockerSandbox) -> Option<Registration> {
        let addr = sandbox.egress_address()?;
        Some(self.proxy.register(IpAddr::V4(addr), self.policy.clone()))
    }
}
