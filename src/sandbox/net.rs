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

use std::collections::HashMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::str::FromStr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, HostConfig, NetworkCreateRequest};
use bollard::query_parameters::{
    AttachContainerOptions, CreateContainerOptions, ListNetworksOptions, UploadToContainerOptions,
};
use bollard::Docker;
use bytes::Bytes;
use futures_util::StreamExt;

use super::archive;
use super::docker::{register_live, remove, remove_blocking};
use super::owner::{owner_id, process_identity, OWNER_LABEL, PROCESS_LABEL, RUN_LABEL};
use super::{Result, SandboxError};

/// The network every sandbox with network joins. Long-lived and shared by runs and by kodx
/// processes on the same engine; kodx never removes it.
pub const NETWORK_NAME: &str = "kodx-sandbox";
/// Label on the network kodx created (its value says what for).
pub const NETWORK_LABEL: &str = "kodx.network";
/// Label on kodx's short-lived helper containers.
pub const HELPER_LABEL: &str = "kodx.helper";

const ICC_OPTION: &str = "com.docker.network.bridge.enable_icc";

/// Ranges a sandbox never reaches unless the operator allows them (`network_allow`).
pub const BLOCKED: [(&str, &str); 8] = [
    ("0.0.0.0/8", "\"this\" network"),
    ("10.0.0.0/8", "private"),
    ("100.64.0.0/10", "carrier-grade NAT"),
    ("169.254.0.0/16", "link-local, cloud metadata services"),
    ("172.16.0.0/12", "private"),
    ("192.168.0.0/16", "private"),
    ("224.0.0.0/4", "multicast"),
    ("240.0.0.0/4", "reserved, broadcast"),
];

/// The helper program (`native/kodx-net.c`), built for this kodx's architecture.
const HELPER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kodx-net"));
/// Where the helper is put in its container.
const HELPER_PATH: &str = "/.kodx-net";
/// How long the engine host's addresses are reused before they are read again.
const HOST_ADDRS_TTL: Duration = Duration::from_secs(300);
/// The longest a helper container may take, from its start to its exit.
const HELPER_TIMEOUT: Duration = Duration::from_secs(60);
/// The most output a helper's answer may have.
const HELPER_OUTPUT_CAP: usize = 256 * 1024;

/// An IPv4 range, `a.b.c.d/n` (a bare address is `/32`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cidr {
    addr: u32,
    prefix: u8,
}

impl Cidr {
    /// The range of `prefix` bits around `addr` (bits past the prefix are cleared).
    pub fn new(addr: Ipv4Addr, prefix: u8) -> Cidr {
        let prefix = prefix.min(32);
        Cidr {
            addr: u32::from(addr) & mask(prefix),
            prefix,
        }
    }

    pub fn host(addr: Ipv4Addr) -> Cidr {
        Cidr::new(addr, 32)
    }

    pub fn addr(&self) -> Ipv4Addr {
        Ipv4Addr::from(self.addr)
    }

    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `other` lies wholly inside this range.
    pub fn contains(&self, other: &Cidr) -> bool {
        other.prefix >= self.prefix && other.addr & mask(self.prefix) == self.addr
    }

    pub fn contains_addr(&self, addr: Ipv4Addr) -> bool {
        self.contains(&Cidr::host(addr))
    }

    /// `<8 hex digits>/<prefix>`, as the helper reads it.
    fn helper_form(&self) -> String {
        format!("{:08x}/{}", self.addr, self.prefix)
    }
}

fn mask(prefix: u8) -> u32 {
    if prefix == 0 {
        0
    } else {
        u32::MAX << (32 - u32::from(prefix.min(32)))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr(), self.prefix)
    }
}

impl FromStr for Cidr {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Cidr, String> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (s, None),
        };
        if addr.contains(':') {
            return Err(format!(
                "{s:?} is an IPv6 range; sandboxes have no IPv6, so only IPv4 ranges can be allowed"
            ));
        }
        let ip: Ipv4Addr = addr.parse().map_err(|_| {
            format!("{s:?} is not an IPv4 range such as 10.1.0.0/16 or 192.168.5.7")
        })?;
        let prefix = match prefix {
            None => 32,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|&p| p <= 32)
                .ok_or_else(|| format!("{s:?}: the prefix length must be 0 to 32"))?,
        };
        let cidr = Cidr::new(ip, prefix);
        if cidr.addr() != ip {
            return Err(format!(
                "{s:?} has address bits past its prefix length; did you mean {cidr}?"
            ));
        }
        Ok(cidr)
    }
}

impl<'de> serde::Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Cidr, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The routes that fence one sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Fence {
    /// Ranges made unreachable.
    pub blocked: Vec<Cidr>,
    /// Allowed ranges inside a blocked one, routed normally through the gateway.
    pub via_gateway: Vec<Cidr>,
}

impl Fence {
    /// The routes for a sandbox at `own` (its address and subnet) behind `gateway`: the
    /// gateway, `host_addrs` (the engine host's addresses) and [`BLOCKED`] are unreachable,
    /// except what `allowed` covers.
    pub fn plan(gateway: Ipv4Addr, own: Cidr, host_addrs: &[Ipv4Addr], allowed: &[Cidr]) -> Fence {
        let mut candidates: Vec<Cidr> = BLOCKED
            .iter()
            .map(|(c, _)| c.parse().expect("valid built-in range"))
            .collect();
        candidates.push(Cidr::host(gateway));
        candidates.extend(
            host_addrs
                .iter()
                .filter(|a| !a.is_loopback() && !a.is_unspecified())
                .map(|a| Cidr::host(*a)),
        );
        // The sandbox's own subnet keeps its connected route: a block equal to it could not
        // be added, and its neighbours are cut off by the network (enable_icc=false).
        candidates.retain(|c| *c != own && !allowed.iter().any(|a| a.contains(c)));
        candidates.sort();
        candidates.dedup();
        // A range inside a wider blocked one needs no route of its own (a host with many
        // private addresses makes few routes), unless it is on the sandbox's subnet, whose
        // connected route would win over the wider block.
        let wider = candidates.clone();
        candidates.retain(|c| own.contains(c) || !wider.iter().any(|b| b != c && b.contains(c)));
        let mut via_gateway: Vec<Cidr> = allowed
            .iter()
            .filter(|a| {
                !own.contains(a)
                    && candidates
                        .iter()
                        .any(|b| b.prefix < a.prefix && b.contains(a))
            })
            .copied()
            .collect();
        via_gateway.sort();
        via_gateway.dedup();
        Fence {
            blocked: candidates,
            via_gateway,
        }
    }

    /// The helper's arguments: the gateway routes first, then the unreachable ones.
    fn helper_args(&self, gateway: Ipv4Addr) -> Vec<String> {
        let mut args = vec!["routes".to_string()];
        args.extend(
            self.via_gateway
                .iter()
                .map(|c| format!("g{}/{:08x}", c.helper_form(), u32::from(gateway))),
        );
        args.extend(self.blocked.iter().map(|c| format!("u{}", c.helper_form())));
        args
    }
}

/// What the helper printed: the addresses of the namespace it ran in.
#[derive(Debug, Default, PartialEq)]
struct Addresses {
    v4: Vec<Ipv4Addr>,
    v6: Vec<std::net::Ipv6Addr>,
}

fn parse_addresses(out: &str) -> Result<Addresses> {
    let mut a = Addresses::default();
    for line in out.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let bad = || SandboxError::NetworkFence(format!("the network helper printed {line:?}"));
        match line.split_once(' ') {
            Some(("4", hex)) if hex.len() == 8 => {
                let v = u32::from_str_radix(hex, 16).map_err(|_| bad())?;
                a.v4.push(Ipv4Addr::from(v));
            }
            Some(("6", hex)) if hex.len() == 32 => {
                let v = u128::from_str_radix(hex, 16).map_err(|_| bad())?;
                a.v6.push(std::net::Ipv6Addr::from(v));
            }
            _ => return Err(bad()),
        }
    }
    a.v4.sort();
    a.v4.dedup();
    a.v6.sort();
    a.v6.dedup();
    Ok(a)
}

/// The architecture the helper was built for (`uname -m` spelling).
fn helper_arch() -> &'static str {
    std::env::consts::ARCH
}

/// Checks that the embedded helper can run on an engine reporting `engine_arch`.
pub fn check_arch(engine_arch: &str) -> Result<()> {
    let normal = match engine_arch {
        "amd64" | "x86_64" => "x86_64",
        "arm64" | "aarch64" => "aarch64",
        other => other,
    };
    if HELPER.is_empty() {
        return Err(SandboxError::NetworkFence(format!(
            "this kodx was built for {} without the sandbox network helper, so it cannot fence \
             a sandbox's network; use network = \"off\" (kodx run: --network off), or a kodx \
             built for x86_64 or aarch64 Linux",
            helper_arch()
        )));
    }
    if normal != helper_arch() {
        return Err(SandboxError::NetworkFence(format!(
            "the Docker engine runs on {engine_arch}, but this kodx carries its sandbox network \
             helper for {}; run a kodx built for {normal}, or use network = \"off\" \
             (kodx run: --network off)",
            helper_arch()
        )));
    }
    Ok(())
}

/// The sandboxes' network: its id, subnet and gateway (the host, as sandboxes see it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxNetwork {
    pub id: String,
    pub subnet: Cidr,
    pub gateway: Ipv4Addr,
}

impl SandboxNetwork {
    fn of(n: &bollard::models::Network, name: &str) -> Result<SandboxNetwork> {
        let config = n
            .ipam
            .as_ref()
            .and_then(|i| i.config.as_ref())
            .and_then(|c| {
                c.iter()
                    .find(|c| c.subnet.as_deref().is_some_and(|s| !s.contains(':')))
            })
            .ok_or_else(|| {
                SandboxError::NetworkFence(format!("the Docker network {name} has no IPv4 subnet"))
            })?;
        let subnet: Cidr = config
            .subnet
            .as_deref()
            .unwrap_or("")
            .parse()
            .map_err(|e| SandboxError::NetworkFence(format!("the subnet of {name}: {e}")))?;
        // Older engines list only the subnet; the gateway is then its first address.
        let gateway = match config.gateway.as_deref().filter(|g| !g.is_empty()) {
            Some(g) => g.parse().map_err(|_| {
                SandboxError::NetworkFence(format!("the gateway of {name} is not IPv4: {g}"))
            })?,
            None => Ipv4Addr::from(u32::from(subnet.addr()) + 1),
        };
        Ok(SandboxNetwork {
            id: n.id.clone().unwrap_or_default(),
            subnet,
            gateway,
        })
    }
}

/// Makes sure the network `name` exists as kodx makes it, and returns it. Safe when
/// several kodx processes on one engine do it at once.
///
/// The engine lets two networks share a name, and then refuses to start any container on
/// either ("network … is ambiguous"). So the creation is serialised through a container
/// name, which the engine does keep unique: whoever makes the container `<name>-lock`
/// (never started) creates the network, then removes it. Duplicates left by anything else
/// are healed: the one with the smallest id stays, unused others are removed.
pub async fn ensure_network(docker: &Docker, name: &str, image: &str) -> Result<SandboxNetwork> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let found = list_named(docker, name).await?;
        match found.as_slice() {
            [one] => {
                check_network(one, name)?;
                return SandboxNetwork::of(one, name);
            }
            [keep, others @ ..] => {
                heal(docker, name, keep, others).await?;
                continue;
            }
            [] => {}
        }
        match take_lock(docker, name, image).await? {
            Some(lock) => {
                let made = async {
                    if list_named(docker, name).await?.is_empty() {
                        create_network(docker, name).await?;
                    }
                    Ok::<(), SandboxError>(())
                }
                .await;
                lock.remove().await;
                made?;
            }
            None if Instant::now() > deadline => {
                return Err(SandboxError::NetworkFence(format!(
                    "the Docker network {name} was not created within 60s while another kodx \
                     held the container {name}-lock; if no kodx is starting, remove it \
                     (`docker rm -f {name}-lock`)"
                )))
            }
            None => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

async fn create_network(docker: &Docker, name: &str) -> Result<()> {
    let request = NetworkCreateRequest {
        name: name.to_string(),
        driver: Some("bridge".into()),
        internal: Some(false),
        attachable: Some(false),
        enable_ipv6: Some(false),
        options: Some(HashMap::from([(
            ICC_OPTION.to_string(),
            "false".to_string(),
        )])),
        labels: Some(HashMap::from([(
            NETWORK_LABEL.to_string(),
            "sandbox".to_string(),
        )])),
        ..Default::default()
    };
    match docker.create_network(request).await {
        Ok(r) => {
            tracing::info!(network = %name, id = %r.id, "created the Docker network for sandboxes");
            Ok(())
        }
        // Newer engines refuse a second network of the same name: it is there.
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 409, ..
        }) => Ok(()),
        Err(e) => Err(SandboxError::docker(
            format!("creating the Docker network {name} for sandboxes"),
            e,
        )),
    }
}

/// Leaves only `keep` of several networks called `name`: the others are removed when no
/// container uses them.
async fn heal(
    docker: &Docker,
    name: &str,
    keep: &bollard::models::Network,
    others: &[bollard::models::Network],
) -> Result<()> {
    for other in others {
        let Some(id) = other.id.as_deref() else {
            continue;
        };
        let in_use = match docker.inspect_network(id, None).await {
            Ok(n) => n.containers.is_some_and(|c| !c.is_empty()),
            Err(_) => continue,
        };
        let removed = !in_use
            && match docker.remove_network(id).await {
                Ok(()) => true,
                Err(bollard::errors::Error::DockerResponseServerError {
                    status_code: 404, ..
                }) => true,
                Err(_) => false,
            };
        if !removed {
            return Err(SandboxError::NetworkFence(format!(
                "several Docker networks are named {name} and the engine starts no container \
                 on an ambiguous name; remove all but {} when no run uses them \
                 (`docker network ls --filter name={name}`)",
                keep.id.as_deref().unwrap_or("one")
            )));
        }
        tracing::warn!(network = %name, id, "removed a duplicate of the sandbox network");
    }
    Ok(())
}

/// Makes the container `<name>-lock`; `None` when another process holds it (one older
/// than a minute is taken as left by a crash, and removed).
async fn take_lock(docker: &Docker, name: &str, image: &str) -> Result<Option<HelperGuard>> {
    let lock = format!("{name}-lock");
    let body = ContainerCreateBody {
        image: Some(image.to_string()),
        entrypoint: Some(vec!["/nonexistent".to_string()]),
        labels: Some(HashMap::from([
            (OWNER_LABEL.to_string(), owner_id().to_string()),
            (HELPER_LABEL.to_string(), "lock".to_string()),
        ])),
        host_config: Some(HostConfig {
            network_mode: Some("none".to_string()),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = docker
        .create_container(
            Some(CreateContainerOptions {
                name: Some(lock.clone()),
                ..Default::default()
            }),
            body,
        )
        .await;
    match created {
        Ok(c) => {
            register_live(docker, &c.id);
            Ok(Some(HelperGuard {
                docker: docker.clone(),
                id: c.id,
                done: false,
            }))
        }
        Err(bollard::errors::Error::DockerResponseServerError {
            status_code: 409, ..
        }) => {
            if let Ok(info) = docker.inspect_container(&lock, None).await {
                let age = info
                    .created
                    .as_deref()
                    .and_then(unix_seconds)
                    .map(|t| now_seconds().saturating_sub(t));
                if age.is_some_and(|a| a > 60) {
                    tracing::warn!(lock = %lock, "removing a stale network lock");
                    let _ = remove(docker, info.id.as_deref().unwrap_or(&lock)).await;
                }
            }
            Ok(None)
        }
        Err(e) => Err(SandboxError::docker(
            format!("creating the lock container {lock} for the sandbox network"),
            e,
        )),
    }
}

fn now_seconds() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Seconds since the epoch of an RFC 3339 time in UTC (`2026-11-23T12:03:48.06Z`), as the
/// engine writes them.
fn unix_seconds(t: &str) -> Option<u64> {
    if !t.ends_with('Z') {
        return None;
    }
    u64::try_from(chrono::DateTime::parse_from_rfc3339(t).ok()?.timestamp()).ok()
}

/// Networks named exactly `name`, smallest id first.
async fn list_named(docker: &Docker, name: &str) -> Result<Vec<bollard::models::Network>> {
    let mut found: Vec<_> = docker
        .list_networks(Some(ListNetworksOptions {
            filters: Some(HashMap::from([(
                "name".to_string(),
                vec![name.to_string()],
            )])),
        }))
        .await
        .map_err(|e| SandboxError::docker(format!("listing the Docker network {name}"), e))?
        .into_iter()
        .filter(|n| n.name.as_deref() == Some(name))
        .collect();
    found.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(found)
}

fn check_network(n: &bollard::models::Network, name: &str) -> Result<()> {
    let labelled = n
        .labels
        .as_ref()
        .is_some_and(|l| l.contains_key(NETWORK_LABEL));
    if !labelled {
        return Err(SandboxError::NetworkFence(format!(
            "a Docker network named {name} exists that kodx did not create; remove it \
             (`docker network rm {name}`) so kodx can make its own"
        )));
    }
    let icc_off = n
        .options
        .as_ref()
        .and_then(|o| o.get(ICC_OPTION))
        .is_some_and(|v| v == "false");
    if n.driver.as_deref() != Some("bridge")
        || !icc_off
        || n.internal == Some(true)
        || n.enable_ipv6 == Some(true)
    {
        return Err(SandboxError::NetworkFence(format!(
            "the Docker network {name} is not as kodx makes it (a bridge without IPv6 and \
             with {ICC_OPTION}=false); remove it (`docker network rm {name}`, when no run is \
             active) so kodx makes it again"
        )));
    }
    Ok(())
}

/// The engine host's addresses, read by the helper on the host's network and kept for
/// [`HOST_ADDRS_TTL`] per engine.
pub async fn host_addresses(
    docker: &Docker,
    engine: &str,
    image: &str,
    run_id: &str,
) -> Result<Arc<Vec<Ipv4Addr>>> {
    type Cache = Mutex<HashMap<String, (Instant, Arc<Vec<Ipv4Addr>>)>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some((at, addrs)) = cache.lock().unwrap().get(engine) {
        if at.elapsed() < HOST_ADDRS_TTL {
            return Ok(addrs.clone());
        }
    }
    let out = run_helper(docker, image, run_id, "host", &[], &["addrs".to_string()])
        .await
        .map_err(|e| {
            SandboxError::NetworkFence(format!(
            "reading the Docker host's addresses (to keep sandboxes from reaching it) failed: {e}"
        ))
        })?;
    let addrs = Arc::new(parse_addresses(&out)?.v4);
    cache
        .lock()
        .unwrap()
        .insert(engine.to_string(), (Instant::now(), addrs.clone()));
    Ok(addrs)
}

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

/// Runs the helper with `args` in a container of `image` on `network_mode`, with only the
/// capabilities `caps`; returns what it printed. The container is removed on every path.
async fn run_helper(
    docker: &Docker,
    image: &str,
    run_id: &str,
    network_mode: &str,
    caps: &[&str],
    args: &[String],
) -> Result<String> {
    Helper::create(docker, image, run_id, network_mode, caps, args)
        .await?
        .run()
        .await
}

/// A helper container, made with the program in it, not started yet. Removed when run,
/// or when dropped.
struct Helper {
    guard: HelperGuard,
}

impl Helper {
    async fn create(
        docker: &Docker,
        image: &str,
        run_id: &str,
        network_mode: &str,
        caps: &[&str],
        args: &[String],
    ) -> Result<Helper> {
        let mut labels = HashMap::from([
            (RUN_LABEL.to_string(), run_id.to_string()),
            (OWNER_LABEL.to_string(), owner_id().to_string()),
            (HELPER_LABEL.to_string(), "net".to_string()),
        ]);
        // So a helper left by a killed process is swept with its sandbox
        // (`Engine::sweep_dead_owners`).
        if let Some(process) = process_identity() {
            labels.insert(PROCESS_LABEL.to_string(), process.to_string());
        }
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            entrypoint: Some(vec![HELPER_PATH.to_string()]),
            cmd: Some(args.to_vec()),
            user: Some("0:0".to_string()),
            working_dir: Some("/".to_string()),
            labels: Some(labels),
            tty: Some(false),
            attach_stdout: Some(true),
            attach_stderr: Some(true),
            network_disabled: Some(false),
            host_config: Some(HostConfig {
                network_mode: Some(network_mode.to_string()),
                // An engine remapping user namespaces allows the host's network only with
                // the host's user namespace.
                userns_mode: (network_mode == "host").then(|| "host".to_string()),
                privileged: Some(false),
                cap_drop: Some(vec!["ALL".to_string()]),
                cap_add: Some(caps.iter().map(|c| c.to_string()).collect()),
                security_opt: Some(vec!["no-new-privileges:true".to_string()]),
                memory: Some(64 << 20),
                pids_limit: Some(16),
                ..Default::default()
            }),
            ..Default::default()
        };
        let created = docker
            .create_container(None::<CreateContainerOptions>, body)
            .await
            .map_err(|e| SandboxError::docker("creating the network helper container", e))?;
        register_live(docker, &created.id);
        let guard = HelperGuard {
            docker: docker.clone(),
            id: created.id,
            done: false,
        };
        let tar = archive::pack_files(&[(&HELPER_PATH[1..], HELPER, 0o755)]);
        docker
            .upload_to_container(
                &guard.id,
                Some(UploadToContainerOptions {
                    path: "/".to_string(),
                    ..Default::default()
                }),
                bollard::body_full(Bytes::from(tar)),
            )
            .await
            .map_err(|e| SandboxError::docker("copying the network helper in", e))?;
        Ok(Helper { guard })
    }

    async fn run(self) -> Result<String> {
        let Helper { guard } = self;
        let docker = &guard.docker;
        let run = async {
            let mut attached = docker
                .attach_container(
                    &guard.id,
                    Some(AttachContainerOptions {
                        stdout: true,
                        stderr: true,
                        stream: true,
                        ..Default::default()
                    }),
                )
                .await
                .map_err(|e| SandboxError::docker("attaching to the network helper", e))?;
            docker
                .start_container(&guard.id, None)
                .await
                .map_err(|e| SandboxError::docker("starting the network helper", e))?;
            let mut stdout = Vec::new();
            let mut stderr = Vec::new();
            while let Some(item) = attached.output.next().await {
                match item {
                    Ok(LogOutput::StdOut { message }) if stdout.len() < HELPER_OUTPUT_CAP => {
                        stdout.extend_from_slice(&message)
                    }
                    Ok(LogOutput::StdErr { message }) if stderr.len() < HELPER_OUTPUT_CAP => {
                        stderr.extend_from_slice(&message)
                    }
                    Ok(_) => {}
                    Err(_) => break,
                }
            }
            let code = match docker.wait_container(&guard.id, None).next().await {
                Some(Ok(r)) => r.status_code,
                Some(Err(bollard::errors::Error::DockerContainerWaitError { code, .. })) => code,
                Some(Err(e)) => {
                    return Err(SandboxError::docker("waiting for the network helper", e))
                }
                None => -1,
            };
            if code != 0 {
                let said = String::from_utf8_lossy(&stderr);
                let said = said.trim();
                return Err(SandboxError::NetworkFence(format!(
                    "the network helper failed (exit code {code}){}",
                    if said.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", said.chars().take(500).collect::<String>())
                    }
                )));
            }
            Ok(String::from_utf8_lossy(&stdout).into_owned())
        };
        let result = match tokio::time::timeout(HELPER_TIMEOUT, run).await {
            Ok(r) => r,
            Err(_) => Err(SandboxError::NetworkFence(format!(
                "the network helper did not finish within {}s",
                HELPER_TIMEOUT.as_secs()
            ))),
        };
        guard.remove().await;
        result
    }
}

/// Removes a helper container when dropped (a cancelled run), or at once with `remove`.
struct HelperGuard {
    docker: Docker,
    id: String,
    done: bool,
}

impl HelperGuard {
    async fn remove(mut self) {
        self.done = true;
        let _ = remove(&self.docker, &self.id).await;
    }
}

impl Drop for HelperGuard {
    fn drop(&mut self) {
        if !self.done {
            remove_blocking(&self.docker, &self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    #[test]
    fn ranges_parse_strictly() {
        assert_eq!(c("10.1.0.0/16").to_string(), "10.1.0.0/16");
        assert_eq!(c("192.168.5.7").to_string(), "192.168.5.7/32");
        assert_eq!(c("0.0.0.0/0").prefix(), 0);
        let e = "10.1.2.3/8".parse::<Cidr>().unwrap_err();
        assert!(e.contains("did you mean 10.0.0.0/8"), "{e}");
        assert!("fd00::/8".parse::<Cidr>().unwrap_err().contains("IPv6"));
        assert!("10.0.0.0/33"
            .parse::<Cidr>()
            .unwrap_err()
            .contains("0 to 32"));
        assert!("example.com".parse::<Cidr>().is_err());
        assert!(c("10.0.0.0/8").contains(&c("10.1.0.0/16")));
        assert!(!c("10.1.0.0/16").contains(&c("10.0.0.0/8")));
        assert!(c("0.0.0.0/0").contains(&c("8.8.8.8")));
        assert!(!c("172.16.0.0/12").contains(&c("172.32.0.0/16")));
    }

    #[test]
    fn the_fence_blocks_host_gateway_and_private_ranges() {
        let gw: Ipv4Addr = "172.18.0.1".parse().unwrap();
        let own = c("172.18.0.0/16");
        let host = ["192.0.2.2".parse().unwrap(), "127.0.0.1".parse().unwrap()];
        let f = Fence::plan(gw, own, &host, &[]);
        for must in [
            "172.18.0.1/32",
            "192.0.2.2/32",
            "169.254.0.0/16",
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
            "100.64.0.0/10",
        ] {
            assert!(f.blocked.contains(&c(must)), "{must} in {f:?}");
        }
        assert!(
            !f.blocked.iter().any(|b| b.contains(&c("127.0.0.1"))),
            "loopback stays the sandbox's own"
        );
        // The gateway is inside 172.16/12 but keeps its own route: the subnet's connected
        // route (172.18/16) is more specific than the /12.
        let many: Vec<Ipv4Addr> = (1..=200u32)
            .map(|i| Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 9, 0, 0)) + i))
            .collect();
        let f2 = Fence::plan(gw, own, &many, &[]);
        assert_eq!(f2.blocked.len(), f.blocked.len() - 1, "{f2:?}");
        assert!(f.via_gateway.is_empty());
        assert_eq!(
            f.helper_args(gw)[..2],
            ["routes".to_string(), "u00000000/8".to_string()]
        );
    }

    #[test]
    fn allowed_ranges_are_cut_out_of_the_fence() {
        let gw: Ipv4Addr = "172.18.0.1".parse().unwrap();
        let own = c("172.18.0.0/16");
        let host = ["192.0.2.2".parse().unwrap(), "10.0.0.5".parse().unwrap()];
        let allowed = [c("10.1.0.0/16"), c("192.0.2.0/24"), c("172.18.0.1")];
        let f = Fence::plan(gw, own, &host, &allowed);
        // Blocks inside an allowed range go.
        assert!(!f.blocked.contains(&c("192.0.2.2")), "{f:?}");
        assert!(!f.blocked.contains(&c("172.18.0.1")), "{f:?}");
        // A host address outside every allowed range stays blocked (here by 10/8, which
        // holds it: no route of its own).
        assert!(f.blocked.contains(&c("10.0.0.0/8")), "{f:?}");
        assert!(!f.blocked.contains(&c("10.0.0.5")), "{f:?}");
        // An allowed range inside a blocked one is routed through the gateway; one in no
        // blocked range needs nothing, nor does one on the sandbox's own subnet.
        assert_eq!(f.via_gateway, vec![c("10.1.0.0/16")]);
        let args = f.helper_args(gw);
        assert_eq!(args[1], "g0a010000/16/ac120001");
        // Allowing everything leaves nothing blocked.
        let all = Fence::plan(gw, own, &host, &[c("0.0.0.0/0")]);
        assert!(
            all.blocked.is_empty() && all.via_gateway.is_empty(),
            "{all:?}"
        );
    }

    #[test]
    fn a_subnet_equal_to_a_blocked_range_keeps_its_route() {
        let f = Fence::plan("10.0.0.1".parse().unwrap(), c("10.0.0.0/8"), &[], &[]);
        assert!(!f.blocked.contains(&c("10.0.0.0/8")));
        assert!(f.blocked.contains(&c("10.0.0.1")));
    }

    #[test]
    fn helper_output_parses() {
        let a = parse_addresses(
            "4 7f000001\n4 c0000202\n4 c0000202\n6 00000000000000000000000000000001\n6 fe80000000000000000000fffe000001\n",
        )
        .unwrap();
        assert_eq!(
            a.v4,
            vec![
                "127.0.0.1".parse::<Ipv4Addr>().unwrap(),
                "192.0.2.2".parse().unwrap()
            ]
        );
        assert_eq!(a.v6.len(), 2);
        assert!(parse_addresses("4 zz\n").is_err());
        assert!(parse_addresses("hello\n").is_err());
    }

    #[test]
    fn engine_times_read_as_unix_seconds() {
        assert_eq!(unix_seconds("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(
            unix_seconds("2026-11-23T12:03:48.06126126Z"),
            Some(1_795_435_428)
        );
        assert_eq!(unix_seconds("2000-03-01T00:00:00Z"), Some(951_868_800));
        assert_eq!(unix_seconds("2026-11-23T12:03:48+02:00"), None);
        assert_eq!(unix_seconds("garbage"), None);
        assert_eq!(
            unix_seconds("0001-01-01T00:00:00Z"),
            None,
            "Docker's zero time"
        );
    }

    #[test]
    fn the_helper_is_embedded_for_this_architecture() {
        assert!(HELPER.starts_with(b"\x7fELF"), "build.rs built the helper");
        assert!(check_arch(std::env::consts::ARCH).is_ok());
        let other = if std::env::consts::ARCH == "x86_64" {
            "aarch64"
        } else {
            "x86_64"
        };
        let e = check_arch(other).unwrap_err().to_string();
        assert!(e.contains(other) && e.contains("network = \"off\""), "{e}");
    }
}
