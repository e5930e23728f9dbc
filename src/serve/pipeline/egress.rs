//! A run's sandbox and kodx's egress proxy (SPEC §12, "Egress by name"). A repository
//! that sets `network.allow` (or names a secret with `hosts:`) gets, after its setup
//! script, a sandbox that reaches only the proxy of its engine
//! ([`crate::egress::Proxies`]), which lets the allowed names through, puts the run's
//! injected secrets on the wire to their hosts only (terminating TLS with the run's own
//! CA, which the sandbox trusts), and records what it refused; the run's end shows that
//! (status comment, pull request, run page).
//!
//! Such a repository never keeps the whole network after setup: when the proxy cannot be
//! used (the operator forbids it, the server gives no network after setup, or kodx is not
//! on the engine's host) the sandbox is cut from the network instead, and the status
//! comment says why.

use std::net::IpAddr;
use std::sync::Arc;

use super::ending::RunLog;
use super::{Placement, Services};
use crate::db::Run;
use crate::egress::{AllowList, EgressProxy, Injection, Injector, Policy, RunCa};
use crate::repo_config::RepoConfig;
use crate::sandbox::{DockerSandbox, EgressSpec, NetworkMode, SandboxSpec};
use crate::serve::texts;

/// What a run's sandbox may reach through the proxy, and the placeholders its shells hold
/// for the secrets the proxy injects.
#[derive(Clone)]
pub(super) struct RunEgress {
    policy: Policy,
    placeholders: Vec<String>,
}

/// Upstreams' TLS is checked against the system's roots, read once per process.
fn roots() -> rustls::RootCertStore {
    static ROOTS: std::sync::OnceLock<rustls::RootCertStore> = std::sync::OnceLock::new();
    ROOTS.get_or_init(crate::egress::upstream_roots).clone()
}

/// What the run's sandbox may reach through the proxy, when the repository's
/// `network.allow` (or a secret's `hosts:`) is used; `injected`, the secrets with `hosts:`
/// the run got. The spec is set to cut the network after setup either way; why the proxy
/// is not used goes to `log`.
pub(super) fn policy(
    svc: &Services,
    run: &Run,
    config: &RepoConfig,
    spec: &mut SandboxSpec,
    injected: Vec<Injection>,
    log: &RunLog,
) -> Option<RunEgress> {
    let injects = config.secrets.iter().any(|s| s.hosts.is_some());
    let allow = match &config.network_allow {
        Some(allow) => allow.clone(),
        None if injects => AllowList::default(),
        None => return None,
    };
    let settings = &svc.settings;
    let refused = if !settings.allow_repo_network {
        Some("this kodx's operator does not allow it (`allow_repo_network = false`)")
    } else if spec.no_network {
        Some("this kodx gives sandboxes no network (`network = \"off\"`)")
    } else if settings.network == NetworkMode::SetupOnly {
        Some("this kodx cuts every sandbox from the network after its setup (`network = \"setup-only\"`)")
    } else {
        None
    };
    spec.disable_network_after_setup = true;
    if let Some(why) = refused {
        *log.egress_note.lock() = Some(texts::egress::not_used(why));
        return None;
    }
    let placeholders: Vec<String> = injected.iter().map(|i| i.name.clone()).collect();
    let inject = match injected.is_empty() {
        true => None,
        false => match RunCa::new(&run.id) {
            Ok(ca) => Some(Arc::new(Injector::new(ca, injected, roots()))),
            Err(e) => {
                tracing::error!("the run's CA could not be made: {e}");
                *log.egress_note.lock() = Some(texts::egress::not_injected(&e));
                None
            }
        },
    };
    let placeholders = match inject {
        Some(_) => placeholders,
        None => Vec::new(),
    };
    let policy = Policy {
        allow,
        operator: settings
            .network_allow
            .iter()
            .map(|c| ipnet::IpNet::V4((*c).into()))
            .collect(),
        inject,
    };
    Some(RunEgress {
        policy,
        placeholders,
    })
}

/// The run's spec on the engine it is placed on: narrowed to that engine's proxy, or (when
/// kodx cannot serve it) cut after setup with the reason in `log`.
pub(super) async fn on_engine(
    svc: &Services,
    placement: &Placement,
    (spec, egress): (&SandboxSpec, &RunEgress),
    log: &RunLog,
) -> (SandboxSpec, Option<EgressProxy>) {
    let mut spec = spec.clone();
    let proxy = async {
        let network = crate::sandbox::net::ensure_network(
            placement.engine.docker(),
            crate::sandbox::net::NETWORK_NAME,
        )
        .await
        .map_err(|e| e.to_string())?;
        svc.egress.on(&placement.name, network.gateway).await
    };
    match proxy.await {
        Ok(proxy) => {
            spec.egress = Some(EgressSpec {
                port: proxy.addr().port(),
                ca_pem: egress
                    .policy
                    .inject
                    .as_ref()
                    .map(|i| i.ca().cert_pem().to_string()),
                placeholders: egress.placeholders.clone(),
            });
            (spec, Some(proxy))
        }
        Err(why) => {
            tracing::warn!(engine = %placement.name, "the egress proxy cannot serve this run: {why}");
            *log.egress_note.lock() = Some(texts::egress::not_used(&why));
            spec.egress = None;
            (spec, None)
        }
    }
}

/// Registers the started sandbox at `proxy` with the run's policy, for as long as the run
/// works.
pub(super) fn register(
    proxy: &EgressProxy,
    sandbox: &DockerSandbox,
    egress: &RunEgress,
    log: &RunLog,
) {
    match sandbox.egress_address() {
        Some(addr) => {
            *log.egress.lock() = Some(proxy.register(IpAddr::V4(addr), egress.policy.clone()))
        }
        None => tracing::warn!("the sandbox was not narrowed to the egress proxy"),
    }
}

/// The agent is done: the sandbox leaves the proxy, and what the proxy refused is kept for
/// the run page and told in the status comment (and the pull request).
pub(super) async fn finish(svc: &Services, run: &Run, log: &RunLog) {
    let Some(registration) = log.egress.lock().take() else {
        return;
    };
    let blocked = registration.blocked();
    drop(registration);
    if let Err(e) = svc.db.set_egress_blocked(&run.id, &blocked).await {
        tracing::warn!("keeping what the egress proxy refused failed: {e}");
    }
    if !blocked.is_empty() {
        tracing::info!(
            hosts = blocked.len(),
            "the egress proxy refused requests of the run"
        );
        *log.egress_note.lock() = Some(texts::egress::blocked(&blocked));
    }
}
