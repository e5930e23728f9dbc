//! Egress by name (SPEC §12): what a repository's `network.allow` lets its sandboxes
//! reach ([`allow`]), and kodx's egress proxy that enforces it by name and records what it
//! refused ([`proxy`]); secrets injected on the wire by that proxy ([`inject`], with the
//! run's CA in [`ca`] and the terminated tunnels in `intercept`).
//!
//! A run whose repository sets `network.allow` gets a sandbox narrowed to the proxy after
//! its setup script (`kodx_sandbox::EgressSpec`); [`proxies`] keeps one listener per engine
//! in this process, on that engine's sandbox network's gateway.

pub mod allow;
pub mod ca;
pub mod inject;
mod intercept;
pub mod proxies;
pub mod proxy;
mod reply;
pub mod report;

pub use allow::{AllowList, AllowRule};
pub use ca::RunCa;
pub use inject::{upstream_roots, Injection, Injector, Refused};
pub use proxies::Proxies;
pub use proxy::{Blocked, EgressProxy, Policy, Registration, Resolver};
