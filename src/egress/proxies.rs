//! The egress proxies of one process: one listener per engine whose sandboxes it serves,
//! on that engine's sandbox network's gateway (an address of the engine's host that only
//! its sandboxes reach as the proxy: the fence lets a narrowed sandbox reach nothing
//! else, and the proxy closes connections from any address no run registered).
//!
//! The gateway is an address of this machine only when kodx runs on the engine's host (the
//! local socket, or kodx's container on the host's network). For another engine the
//! listener cannot be made, and [`Proxies::on`] says so: such a run's sandbox is cut from
//! the network after its setup instead, and its status comment says why.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};

use super::proxy::{EgressProxy, Resolver};

/// The listeners made so far, by engine and gateway.
pub struct Proxies {
    resolver: Resolver,
    max_connections: usize,
    started: tokio::sync::Mutex<HashMap<(String, Ipv4Addr), EgressProxy>>,
}

impl Proxies {
    /// Proxies resolving names with `resolver`, each serving at most `max_connections`
    /// connections at once.
    pub fn new(resolver: Resolver, max_connections: usize) -> Proxies {
        Proxies {
            resolver,
            max_connections,
            started: Default::default(),
        }
    }

    /// The proxy serving the sandboxes of `engine`, whose network's gateway is `gateway`:
    /// started on the first call (on a port the system picks), the same one afterwards.
    pub async fn on(&self, engine: &str, gateway: Ipv4Addr) -> Result<EgressProxy, String> {
        let mut started = self.started.lock().await;
        let key = (engine.to_string(), gateway);
        if let Some(p) = started.get(&key) {
            return Ok(p.clone());
        }
        let addr = SocketAddr::from((gateway, 0));
        let proxy = EgressProxy::start(addr, self.resolver.clone(), self.max_connections)
            .await
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::AddrNotAvailable => format!(
                    "kodx is not on the host of the Docker engine {engine} (its sandboxes' \
                     gateway {gateway} is not an address of this machine), so its sandboxes \
                     cannot reach kodx's egress proxy"
                ),
                _ => format!("kodx's egress proxy could not listen on {gateway}: {e}"),
            })?;
        tracing::info!(%engine, addr = %proxy.addr(), "egress proxy listening");
        started.insert(key, proxy.clone());
        Ok(proxy)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn one_listener_per_engine_and_a_clear_refusal_off_the_host() {
        let proxies = Proxies::new(Resolver::default(), 8);
        let a = proxies.on("local", Ipv4Addr::LOCALHOST).await.unwrap();
        let b = proxies.on("local", Ipv4Addr::LOCALHOST).await.unwrap();
        assert_eq!(a.addr(), b.addr());
        assert_ne!(a.addr().port(), 0);
        // 192.0.2.1 (TEST-NET-1) is no address of this machine.
        let Err(e) = proxies.on("remote", Ipv4Addr::new(192, 0, 2, 1)).await else {
            panic!("listened on an address that is not this machine's");
        };
        assert!(
            e.contains("not on the host of the Docker engine remote"),
            "{e}"
        );
    }
}
