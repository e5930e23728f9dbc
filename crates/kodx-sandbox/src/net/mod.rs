//! The sandbox's network fence (SPEC §6): sandboxes never reach the host kodx runs on, the
//! engine's host, link-local/metadata addresses, or (unless the operator allows them)
//! private ranges.
//!
//! Everything goes through the Docker Engine API, so it works the same with a remote engine
//! (`DOCKER_HOST=tcp://…`) as with the local socket:
//!
//! - Sandboxes join one bridge network kodx creates and reuses, [`NETWORK_NAME`], with
//!   inter-container traffic off (`enable_icc=false`) and no IPv6.
//! - A sandbox's main process is kodx's helper (`hold`), a tiny static program compiled
//!   by build.rs and embedded here, so the image needs nothing and nothing of the image
//!   runs before the fence is up. kodx loads it into the engine as its own image
//!   (`kodx-helper:<hash>`, [`image`]) and every sandbox runs it from a read-only volume
//!   filled from that image. The sandbox is made without a network. Right after it
//!   starts, before its setup script or any shell runs (the repository's files go in
//!   meanwhile), the engine's fencer (one small container per engine, made from kodx's
//!   image and nothing else, `fencer`) plugs it into that bridge with one exec (a veth
//!   pair on an isolated bridge port, an address, a default route, resolvers it can
//!   reach, nftables filters in the sandbox and on the host against broadcast, multicast
//!   and the subnet) and adds `unreachable` routes: the gateway (the host), every address
//!   of the engine's host, and the ranges in [`BLOCKED`], minus what the operator allows.
//!   A connect to any of them fails at once with "No route to host". The sandbox's own
//!   processes never have `NET_ADMIN` or `NET_RAW`. Where the fencer cannot run, the
//!   sandbox joins the network through the engine and a short-lived helper container (of
//!   kodx's image) joined to the sandbox's namespace adds the routes and the sandbox's
//!   filter instead.
//! - The engine host's addresses come from the same program, run in the fencer (or a
//!   helper container) on the host's network, cached for a few minutes.
//!
//! One file per part: `policy` (IPv4 ranges, what is blocked, the plan of one sandbox's
//! routes), `network` (the shared bridge network), `image` (kodx's own image and the
//! helper's volume), `helper` (the helper's commands, its exec and its containers),
//! `fencer` (the engine's fencer) and `fence` (one sandbox's fence going up, and the engine
//! host's addresses read through the fencer).

mod fence;
mod fencer;
mod helper;
mod image;
mod network;
mod policy;

pub use fence::{
    fencer_ready, host_addresses, lose_next_fencer_exec, narrow, plugs, refuse_fencer,
    run_in_fencer, unplug, Fencing, FALLBACK_RESOLVERS,
};
pub use fencer::{fencer_name, FENCER_CAPABILITIES, FENCER_PREFIX, IDLE_SECS as FENCER_IDLE_SECS};
pub use helper::{
    check_arch, checks_command, gate_command, has_helper, hold_command, snapshot_command,
};
pub use image::{
    helper_image_name, helper_mount, helper_volume, no_healthcheck, remove_old_helpers,
    HELPER_IMAGE_REPO, HELPER_LABEL, SANDBOX_HELPER_DIR, SANDBOX_HELPER_PATH,
};
pub use network::{ensure_network, SandboxNetwork, NETWORK_LABEL, NETWORK_NAME};
pub use policy::{Cidr, Fence, BLOCKED};
