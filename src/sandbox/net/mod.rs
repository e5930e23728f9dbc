//! The sandbox's network fence (SPEC §6): sandboxes never reach the host kodx runs on, the
//! engine's host, link-local/metadata addresses, or (unless the operator allows them)
//! private ranges.
//!
//! Everything goes through the Docker Engine API, so it works the same with a remote engine
//! (`DOCKER_HOST=tcp://…`) as with the local socket:
//!
//! - Sandboxes join one bridge network kodx creates and reuses, [`NETWORK_NAME`], with
//!   inter-container traffic off (`enable_icc=false`) and no IPv6.
//! - Right after a sandbox starts, before its setup script or any shell runs (the
//!   repository's files go in meanwhile), a short-lived helper container joins the
//!   sandbox's network namespace with `NET_ADMIN` (the sandbox itself never has it; the
//!   helper is made while the sandbox starts) and adds `unreachable` routes there: the gateway
//!   (the host), every address of the engine's host, and the ranges in [`BLOCKED`], minus
//!   what the operator allows. A connect to any of them fails at once with "No route to
//!   host". The helper is a tiny static program compiled by build.rs and embedded here, so
//!   the image needs nothing.
//! - The engine host's addresses come from the same program run once in a helper container
//!   on the host's network (`network_mode: host`), cached for a few minutes.
//!
//! One file per part: `policy` (IPv4 ranges, what is blocked, the plan of one sandbox's
//! routes), `network` (the shared bridge network), `helper` (the helper program and its
//! containers) and `fence` (one sandbox's fence going up).

mod fence;
mod helper;
mod network;
mod policy;

pub use fence::Fencing;
pub use helper::{check_arch, host_addresses, HELPER_LABEL};
pub use network::{ensure_network, SandboxNetwork, NETWORK_LABEL, NETWORK_NAME};
pub use policy::{Cidr, Fence, BLOCKED};
