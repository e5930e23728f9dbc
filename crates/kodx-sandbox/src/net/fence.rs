//! One sandbox's fence going up: its routes planned ([`Fencing::plan`]), then added in the
//! sandbox's network namespace by the engine's fencer ([`super::fencer`]) with one exec,
//! before anything of the image runs in the sandbox; the namespace is checked for an
//! address on the planned subnet and no IPv6.
//!
//! A sandbox is made without a network and **plugged** by that same exec: the fencer gives
//! it a veth pair on the sandboxes' bridge ([`super::NETWORK_NAME`]), an address from the
//! upper half of the subnet (the engine hands out the lower half), a default route and its
//! resolvers ([`FALLBACK_RESOLVERS`] when the fence blocks the host's). That spares the
//! engine's own endpoint for each sandbox: its embedded DNS and iptables set up in every
//! container of a user-defined network, and their teardown (about 150 ms a sandbox).
//! Where the fencer cannot be used (an engine that refuses it its capabilities or its host
//! PID namespace), sandboxes join the network through the engine and a short-lived helper
//! container joined to the sandbox's namespace adds the routes, as before the fencer.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::net::Ipv4Addr;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bollard::Docker;

use super::fencer;
use super::helper::{exec_in, parse_addresses, run_helper, FencerExec, Helper};
use super::network::{SandboxNetwork, NETWORK_NAME};
use super::policy::{Cidr, Fence};
use crate::error::{Result, SandboxError};

/// How long the engine host's addresses are reused before they are read again.
const HOST_ADDRS_TTL: Duration = Duration::from_secs(300);
/// How long an engine whose fencer failed gets helper containers before it is tried again.
const FENCER_RETRY: Duration = Duration::from_secs(600);

/// The resolvers a plugged sandbox gets when the fence blocks every one of the engine
/// host's (private or link-local resolvers, as most clouds and home routers have).
pub const FALLBACK_RESOLVERS: [Ipv4Addr; 2] =
    [Ipv4Addr::new(1, 1, 1, 1), Ipv4Addr::new(8, 8, 8, 8)];

/// The smallest subnet sandboxes are plugged into (its upper half is kodx's).
const PLUG_MAX_PREFIX: u8 = 28;

/// A sandbox's fence, ready to go up: the routes and the helper's arguments.
#[derive(Debug, Clone)]
pub struct Fencing {
    pub fence: Fence,
    routes: Vec<String>,
    net: SandboxNetwork,
    /// Whether the sandbox was made without a network, for the fencer to plug it.
    plug: bool,
    /// The engine (its host), for the fencer or a helper container.
    engine: String,
    /// The run (or warm sandbox) id a helper container is labelled with.
    run_id: String,
}

/// Whether sandboxes on `engine` are plugged by its fencer (made without a network) or
/// join `net` through the engine: plugged unless the fencer failed there lately or the
/// subnet is too small to share.
pub fn plugs(engine: &str, net: &SandboxNetwork) -> bool {
    let refused_at = refused().lock().get(engine).copied();
    net.subnet.prefix() <= PLUG_MAX_PREFIX
        && refused_at.is_none_or(|at| at.elapsed() >= FENCER_RETRY)
}

/// Makes sure `engine` has its fencer running; when it cannot, marks the engine so its
/// sandboxes join the network through the engine instead. Returns whether the fencer runs.
pub async fn fencer_ready(docker: &Docker, engine: &str) -> bool {
    match fencer::fencer(docker, engine).await {
        Ok(_) => true,
        Err(e) => {
            refuse(engine, &e);
            false
        }
    }
}

/// Marks `engine`'s fencer as failed, as a failure would: its sandboxes join the network
/// through the engine and helper containers fence them, for a while. For tests of that
/// path, on engines where the fencer works.
#[doc(hidden)]
pub fn refuse_fencer(engine: &str) {
    refuse(
        engine,
        &SandboxError::NetworkFence("refused on purpose".into()),
    );
}

/// Makes the next exec of the helper's `command` in `engine`'s fencer count as lost once it
/// ran (as when the fencer goes away before its end is known), so that it is taken back
/// and run again. For tests of that path.
#[doc(hidden)]
pub fn lose_next_fencer_exec(engine: &str, command: &str) {
    to_lose()
        .lock()
        .insert((engine.to_string(), command.to_string()));
}

/// Runs the helper with `args` in `engine`'s fencer, as kodx runs its commands there (an
/// exec lost runs again, three tries in all). For tests of the fencer's execs.
#[doc(hidden)]
pub async fn run_in_fencer(docker: &Docker, engine: &str, args: &[String]) -> Result<String> {
    in_fencer(docker, engine, args, &[]).await
}

fn to_lose() -> &'static Mutex<std::collections::HashSet<(String, String)>> {
    static TO_LOSE: OnceLock<Mutex<std::collections::HashSet<(String, String)>>> = OnceLock::new();
    TO_LOSE.get_or_init(Default::default)
}

fn lose_on_purpose(engine: &str, command: &str) -> bool {
    to_lose()
        .lock()
        .remove(&(engine.to_string(), command.to_string()))
}

fn refuse(engine: &str, e: &SandboxError) {
    refused().lock().insert(engine.to_string(), Instant::now());
    tracing::warn!(
        "the engine's network fencer cannot be used ({e}); sandboxes join the network \
         through the engine and are fenced by helper containers, for the next {} minutes",
        FENCER_RETRY.as_secs() / 60
    );
}

/// Cuts a plugged sandbox's network: the fencer removes its interface. Checks that no
/// address but loopback is left.
pub async fn unplug(docker: &Docker, engine: &str, id: &str) -> Result<()> {
    let pid = init_pid(docker, id).await?;
    let args = ["unplug".to_string(), pid.to_string()];
    let out = in_fencer(docker, engine, &args, &[]).await?;
    let addrs = parse_addresses(&out)?;
    if let Some(a) = addrs.v4.iter().find(|a| !a.is_loopback()) {
        return Err(SandboxError::NetworkFence(format!(
            "the network cut failed: the sandbox still has the address {a}"
        )));
    }
    Ok(())
}

/// Narrows the running sandbox `id` on `net` to kodx's egress proxy at the gateway's TCP
/// `port` (SPEC §12, "Egress by name"): its output filter keeps loopback and that port
/// alone, and its default route and the gateway's unreachable route go, so any other
/// connect fails at once. A plugged sandbox is narrowed by the engine's fencer; one that
/// joined through the engine by a helper container in its namespace. Returns the
/// sandbox's address on `net`: the one the proxy knows it by.
pub async fn narrow(
    docker: &Docker,
    engine: &str,
    id: &str,
    run_id: &str,
    net: &SandboxNetwork,
    port: u16,
) -> Result<Ipv4Addr> {
    let plugged = docker
        .inspect_container(id, None)
        .await
        .map_err(|e| SandboxError::docker("inspecting the sandbox's network", e))?
        .host_config
        .and_then(|h| h.network_mode)
        .as_deref()
        == Some("none");
    let gw = format!("{:08x}", u32::from(net.gateway));
    let mut args = vec![
        "narrow".to_string(),
        "-".to_string(),
        gw.clone(),
        port.to_string(),
        format!("g00000000/0/{gw}"),
        format!("u{gw}/32"),
    ];
    let out = if plugged {
        args[1] = init_pid(docker, id).await?.to_string();
        // Narrowing again is narrowing: nothing to undo.
        in_fencer(docker, engine, &args, &[]).await?
    } else {
        run_helper(
            docker,
            run_id,
            &format!("container:{id}"),
            &["NET_ADMIN"],
            &args,
        )
        .await?
    };
    let addrs = parse_addresses(&out)?;
    addrs
        .v4
        .iter()
        .copied()
        .find(|a| net.subnet.contains_addr(*a))
        .ok_or_else(|| {
            SandboxError::NetworkFence(format!(
                "narrowing the network to the egress proxy left the sandbox no address on {} \
                 (it has {:?})",
                net.subnet, addrs.v4
            ))
        })
}

/// How many times one helper command is tried in an engine's fencer.
const FENCER_TRIES: usize = 3;

/// What the helper with `args` printed in `engine`'s fencer (made when there is none). A
/// fencer found gone is made again; one that failed is looked up afresh next. An exec
/// whose end was lost (its fencer went away during it) runs again, in the fencer made
/// anew, after `undo` (the helper's arguments that take back whatever part of `args` was
/// done; empty when `args` can simply run again). [`FENCER_TRIES`] tries in all.
async fn in_fencer(
    docker: &Docker,
    engine: &str,
    args: &[String],
    undo: &[String],
) -> Result<String> {
    // Why the tries so far ended without an answer.
    let mut lost: Vec<String> = Vec::new();
    let mut undone = true;
    for attempt in 0..FENCER_TRIES {
        let fencer = fencer::fencer(docker, engine).await?;
        if !undone {
            match exec_in(docker, &fencer, undo).await {
                FencerExec::Ran(Ok(_)) => undone = true,
                FencerExec::Ran(Err(e)) => {
                    fencer::forget(engine);
                    return Err(e);
                }
                FencerExec::Lost(why) => {
                    fencer::forget(engine);
                    lost.push(format!("its undo: {why}"));
                    continue;
                }
            }
        }
        match exec_in(docker, &fencer, args).await {
            FencerExec::Ran(Ok(_)) if attempt == 0 && lose_on_purpose(engine, &args[0]) => {
                fencer::forget(engine);
                lost.push("lost on purpose after it ran".to_string());
                undone = undo.is_empty();
            }
            FencerExec::Ran(Ok(out)) => return Ok(out),
            // Exited idle or removed since it was last seen: made again. Nothing ran.
            FencerExec::Ran(Err(SandboxError::Docker { source, .. })) if gone(&source) => {
                fencer::forget(engine);
                lost.push(format!("the fencer was gone ({source})"));
            }
            FencerExec::Ran(Err(e)) => {
                fencer::forget(engine);
                return Err(e);
            }
            FencerExec::Lost(why) => {
                tracing::warn!(
                    command = %args[0],
                    "the network helper's exec in the engine's fencer was lost ({why}); \
                     it runs again"
                );
                fencer::forget(engine);
                lost.push(why);
                undone = undo.is_empty();
            }
        }
    }
    Err(SandboxError::NetworkFence(format!(
        "the network helper's `{}` never finished in the engine's fencer in {FENCER_TRIES} \
         tries ({})",
        args[0],
        lost.join("; ")
    )))
}

/// The engine host's addresses, read by the engine's fencer on the host's network (or a
/// helper container there), kept for
/// [`HOST_ADDRS_TTL`] per engine in this process.
pub async fn host_addresses(
    docker: &Docker,
    engine: &str,
    run_id: &str,
) -> Result<Arc<Vec<Ipv4Addr>>> {
    type Cache = Mutex<HashMap<String, (Instant, Arc<Vec<Ipv4Addr>>)>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some((at, addrs)) = cache.lock().get(engine) {
        if at.elapsed() < HOST_ADDRS_TTL {
            return Ok(addrs.clone());
        }
    }
    // From the engine's fencer, on the host's network (one exec); else from a helper
    // container there.
    let out = match in_fencer(docker, engine, &["addrs".to_string()], &[]).await {
        Ok(out) => out,
        Err(e) => {
            tracing::debug!("reading the host's addresses through the fencer failed ({e}); using a helper container");
            run_helper(docker, run_id, "host", &[], &["addrs".to_string()])
                .await
                .map_err(|e| {
                    SandboxError::NetworkFence(format!(
                    "reading the Docker host's addresses (to keep sandboxes from reaching it) failed: {e}"
                ))
                })?
        }
    };
    let addrs = Arc::new(parse_addresses(&out)?.v4);
    cache
        .lock()
        .insert(engine.to_string(), (Instant::now(), addrs.clone()));
    Ok(addrs)
}

/// The sandbox's init, as the engine host sees it.
async fn init_pid(docker: &Docker, id: &str) -> Result<i64> {
    docker
        .inspect_container(id, None)
        .await
        .map_err(|e| SandboxError::docker("inspecting the sandbox", e))?
        .state
        .and_then(|s| s.pid)
        .filter(|p| *p > 0)
        .ok_or_else(|| SandboxError::NetworkFence("the sandbox is not running".into()))
}

impl Fencing {
    /// Plans the routes for a sandbox of `run_id` on `net` of `engine`.
    /// `None` when the operator allowed everything (`0.0.0.0/0`) and the sandbox joined
    /// through the engine: there is nothing to do.
    /// `plug`: the sandbox was made without a network, and the fencer gives it one; it
    /// also reads the engine host's addresses then, so `host_addrs` is empty.
    pub fn plan(
        net: &SandboxNetwork,
        plug: bool,
        host_addrs: &[Ipv4Addr],
        allowed: &[Cidr],
        engine: &str,
        run_id: &str,
    ) -> Option<Self> {
        let fence = Fence::plan(net.gateway, net.subnet, host_addrs, allowed);
        if fence.blocked.is_empty() && !plug {
            return None;
        }
        let mut routes = fence.helper_args(net.gateway);
        routes.remove(0); // "routes"
                          // Not routes: what the helper leaves reachable (of the engine host's addresses,
                          // which it reads itself when it plugs; of the subnet, in the sandbox's output
                          // filter), and the subnet, whose broadcasts and neighbours that filter drops.
        routes.extend(allowed.iter().map(|a| format!("a{}", a.helper_form())));
        routes.push(format!("n{}", net.subnet.helper_form()));
        Some(Fencing {
            fence,
            routes,
            net: net.clone(),
            plug,
            engine: engine.to_string(),
            run_id: run_id.to_string(),
        })
    }

    /// Adds the routes in the namespace of the running sandbox `id`, whose main process is
    /// the helper's `hold` (nothing of its image has run), and checks what the helper saw
    /// there: an address on the planned subnet, and no IPv6 address.
    pub async fn apply(self, docker: &Docker, id: &str) -> Result<Fence> {
        let out = match self.by_fencer(docker, id).await {
            Ok(out) => out,
            // Made without a network: only the fencer can give it one.
            Err(e) if self.plug => {
                refuse(&self.engine, &e);
                return Err(SandboxError::NetworkFence(format!(
                    "the engine's network fencer could not give the sandbox its network ({e}); \
                     the next sandboxes on this engine join the network through the engine"
                )));
            }
            Err(e) => {
                refuse(&self.engine, &e);
                let mut args = vec!["routes".to_string()];
                args.extend(self.routes.iter().cloned());
                Helper::create(
                    docker,
                    &self.run_id,
                    &format!("container:{id}"),
                    &["NET_ADMIN"],
                    &args,
                )
                .await?
                .run()
                .await?
            }
        };
        let addrs = parse_addresses(&out)?;
        if let Some(v6) = addrs.v6.iter().find(|a| !a.is_loopback()) {
            return Err(SandboxError::NetworkFence(format!(
                "the sandbox has the IPv6 address {v6}, which kodx does not fence; the network \
                 {NETWORK_NAME} must be without IPv6"
            )));
        }
        if !addrs.v4.iter().any(|a| self.net.subnet.contains_addr(*a)) {
            return Err(SandboxError::NetworkFence(format!(
                "the sandbox has no address on {}, the subnet of {NETWORK_NAME} the routes were \
                 planned for (it has {:?})",
                self.net.subnet, addrs.v4
            )));
        }
        Ok(self.fence)
    }

    /// The routes added by the engine's fencer (after plugging the sandbox in, when it was
    /// made without a network), in the namespace of the sandbox's init.
    async fn by_fencer(&self, docker: &Docker, id: &str) -> Result<String> {
        let refused_at = refused().lock().get(&self.engine).copied();
        if refused_at.is_some_and(|at| at.elapsed() < FENCER_RETRY) {
            return Err(SandboxError::NetworkFence(
                "the fencer failed on this engine lately".into(),
            ));
        }
        let pid = init_pid(docker, id).await?;
        let mut args = match self.plug {
            true => self.plug_args(pid),
            false => vec!["fence".to_string(), pid.to_string()],
        };
        args.extend(self.routes.iter().cloned());
        // What an interrupted plug or fence left (the routes added, the interface made)
        // goes before it runs again: both refuse to add what is there already.
        let mut undo = vec![
            if self.plug { "unplug" } else { "unroute" }.to_string(),
            pid.to_string(),
        ];
        undo.extend(self.routes.iter().cloned());
        in_fencer(docker, &self.engine, &args, &undo).await
    }

    /// `plug PID BRIDGE NET GATEWAY FIRST COUNT DNS`: the upper half of the subnet (but its
    /// broadcast address) is kodx's; the engine hands out addresses from the bottom up.
    fn plug_args(&self, pid: i64) -> Vec<String> {
        let size = 1u64 << (32 - u32::from(self.net.subnet.prefix()));
        let dns = FALLBACK_RESOLVERS
            .iter()
            .map(|a| format!("{:08x}", u32::from(*a)))
            .collect::<Vec<_>>()
            .join(",");
        vec![
            "plug".to_string(),
            pid.to_string(),
            self.net.bridge.clone(),
            self.net.subnet.helper_form(),
            format!("{:08x}", u32::from(self.net.gateway)),
            (size / 2).to_string(),
            (size / 2 - 1).to_string(),
            dns,
        ]
    }
}

/// Whether the engine said the container is not there or not running.
fn gone(e: &bollard::errors::Error) -> bool {
    matches!(
        e,
        bollard::errors::Error::DockerResponseServerError {
            status_code: 404 | 409,
            ..
        }
    )
}

/// Engines whose fencer failed, and when.
fn refused() -> &'static Mutex<HashMap<String, Instant>> {
    static REFUSED: OnceLock<Mutex<HashMap<String, Instant>>> = OnceLock::new();
    REFUSED.get_or_init(Default::default)
}
