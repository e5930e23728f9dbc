//! Egress by name (SPEC §12): what a repository's `network.allow` lets its sandboxes
//! reach ([`allow`]), and kodx's egress proxy that enforces it by name and records what it
//! refused ([`proxy`]); secrets injected on the wire by that proxy ([`inject`], with the
//! run's CA in [`ca`] and the terminated tunnels in `intercept`).
//!
//! Status: the proxy and the allow list are built and tested on loopback; a sandbox is
//! not yet given the proxy (its fence still cuts or keeps the whole network), so a
//! `.github/kodx.yml` with `network:` is refused with that reason.

pub mod allow;
pub mod ca;
pub mod inject;
mod intercept;
pub mod proxy;
mod reply;

pub use allow::{AllowList, AllowRule};
pub use ca::RunCa;
pub use inject::{upstream_roots, Injection, Injector, Refused};
pub use proxy::{Blocked, EgressProxy, Policy, Registration, Resolver};
