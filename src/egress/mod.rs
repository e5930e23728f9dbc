//! Egress by name (SPEC §12): what a repository's `network.allow` lets its sandboxes
//! reach ([`allow`]), and kodx's egress proxy that enforces it by name and records what it
//! refused ([`proxy`]).
//!
//! Status: the proxy and the allow list are built and tested on loopback; a sandbox is
//! not yet given the proxy (its fence still cuts or keeps the whole network), so a
//! `.github/kodx.yml` with `network:` is refused with that reason.

pub mod allow;
pub mod proxy;

pub use allow::{AllowList, AllowRule};
pub use proxy::{Blocked, EgressProxy, Policy, Registration, Resolver};
