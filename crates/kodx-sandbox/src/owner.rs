//! Who owns a sandbox container: the labels every kodx container carries (its run, and the
//! process and installation that made it), this process's owner id, and its identity as the
//! kernel sees it, so that the orphans of a process that is gone can be told from the
//! containers of a live one. The engine's sweeps read them, and so do the setup cache
//! (which blanks them in the images it commits) and the network helpers (which carry them).

use std::collections::HashMap;
use std::fmt;
use std::sync::OnceLock;

/// Label every kodx container carries: the run id.
pub const RUN_LABEL: &str = "kodx.run";
/// Label naming the process that owns the container: a random id drawn once per process
/// ([`owner_id`]). A pid would not do: in the shipped image kodx is PID 1 before and after a
/// restart, so its own orphans would look alive.
pub const OWNER_LABEL: &str = "kodx.owner";
/// Label naming the kodx installation (one `kodx serve` database) the container belongs to;
/// see [`Engine::with_instance`](super::Engine::with_instance). Two installations sharing an engine never remove each
/// other's containers.
pub const INSTANCE_LABEL: &str = "kodx.instance";
/// Label identifying the owning process as its kernel sees it:
/// `<boot id>/<pid namespace inode>/<pid>/<start time>` ([`process_identity`]). Another
/// process in the same boot and PID namespace can tell for sure whether it is gone.
pub const PROCESS_LABEL: &str = "kodx.process";

/// Label on a container made warm, ahead of any run (`1`). Its [`RUN_LABEL`] is its own
/// `warm-<hex>` id, and its name `kodx-warm-<hex>` until a run claims it by renaming it.
pub const WARM_LABEL: &str = "kodx.warm";
/// Label on a preloaded warm sandbox: the server's key of the runs it is kept for (the
/// installation and the repository, `<installation>/<owner>/<name>`).
pub const PRELOADED_LABEL: &str = "kodx.preloaded";
/// Names of warm sandboxes no run has claimed start with it (after the engine's `/`).
pub const WARM_NAME_PREFIX: &str = "kodx-warm-";

/// On a sandbox made for a run's checks (SPEC §12): the run's id. Not a run of its own:
/// an engine's count of running sandboxes leaves it out, and the run's removal takes it.
pub const CHECKS_OF_LABEL: &str = "kodx.checks-of";

/// This process's owner id ([`OWNER_LABEL`]): 16 random hex digits, drawn once.
pub fn owner_id() -> &'static str {
    static OWNER: OnceLock<String> = OnceLock::new();
    OWNER.get_or_init(|| format!("{:016x}", rand::random::<u64>()))
}

/// The labels of a container made for run `run_id` by this process: the run, the owner
/// ([`OWNER_LABEL`]), the installation `instance` when there is one, and this process's
/// identity ([`PROCESS_LABEL`]) when it is known.
pub fn run_labels(run_id: &str, instance: Option<&str>) -> HashMap<String, String> {
    let mut labels = HashMap::from([
        (RUN_LABEL.to_string(), run_id.to_string()),
        (OWNER_LABEL.to_string(), owner_id().to_string()),
    ]);
    if let Some(instance) = instance {
        labels.insert(INSTANCE_LABEL.to_string(), instance.to_string());
    }
    if let Some(process) = process_identity() {
        labels.insert(PROCESS_LABEL.to_string(), process.to_string());
    }
    labels
}

/// Who a process is to the kernel: boot, PID namespace, pid and start time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProcessIdentity {
    boot: u128,
    pid_namespace: u64,
    pid: u32,
    /// Clock ticks after boot (`/proc/PID/stat` field 22): tells a reused pid apart.
    start_time: u64,
}

impl fmt::Display for ProcessIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:032x}/{}/{}/{}",
            self.boot, self.pid_namespace, self.pid, self.start_time
        )
    }
}

impl std::str::FromStr for ProcessIdentity {
    type Err = ();

    fn from_str(s: &str) -> std::result::Result<Self, ()> {
        let mut parts = s.split('/');
        let mut next = || parts.next().ok_or(());
        let id = ProcessIdentity {
            boot: u128::from_str_radix(next()?, 16).map_err(|_| ())?,
            pid_namespace: next()?.parse().map_err(|_| ())?,
            pid: next()?.parse().map_err(|_| ())?,
            start_time: next()?.parse().map_err(|_| ())?,
        };
        if parts.next().is_some() {
            return Err(());
        }
        Ok(id)
    }
}

/// This process's identity ([`PROCESS_LABEL`]); `None` without a readable `/proc`.
pub fn process_identity() -> Option<ProcessIdentity> {
    static ME: OnceLock<Option<ProcessIdentity>> = OnceLock::new();
    *ME.get_or_init(|| {
        let pid = std::process::id();
        // A /proc of another PID namespace (a PID namespace without its own /proc mounted)
        // would name other processes: then this process cannot be identified.
        let seen: u32 = std::fs::read_to_string("/proc/self/stat")
            .ok()?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        if seen != pid {
            return None;
        }
        Some(ProcessIdentity {
            boot: boot_id()?,
            pid_namespace: pid_namespace("self")?,
            pid,
            start_time: start_time(pid)?,
        })
    })
}

fn boot_id() -> Option<u128> {
    let text = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    u128::from_str_radix(&text.trim().replace('-', ""), 16).ok()
}

/// The inode of a process's PID namespace (`/proc/<pid>/ns/pid` → `pid:[4026531836]`).
fn pid_namespace(pid: &str) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    let link = link.to_str()?;
    link.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

fn start_time(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from its end.
    let after = &stat[stat.rfind(')')? + 1..];
    after.split_whitespace().nth(19)?.parse().ok()
}

/// Whether the process a [`PROCESS_LABEL`] names still runs, as far as `me` can tell:
/// `None` when it cannot (another boot, another PID namespace, an unreadable label).
pub(super) fn process_alive(me: ProcessIdentity, label: &str) -> Option<bool> {
    let other: ProcessIdentity = label.parse().ok()?;
    if other.boot != me.boot || other.pid_namespace != me.pid_namespace {
        return None;
    }
    Some(start_time(other.pid) == Some(other.start_time))
}

/// The config an image committed from a kodx container must carry: the base image's, with
/// `labels` added. The engine merges the container's config into what is not set here;
/// labels cannot be removed that way, so kodx's own container labels are set empty.
pub fn image_config<'a>(
    base: &bollard::models::ImageConfig,
    labels: impl IntoIterator<Item = (&'a str, String)>,
) -> bollard::models::ContainerConfig {
    let mut all = base.labels.clone().unwrap_or_default();
    for label in [RUN_LABEL, OWNER_LABEL, PROCESS_LABEL, INSTANCE_LABEL] {
        all.insert(label.to_string(), String::new());
    }
    all.extend(labels.into_iter().map(|(k, v)| (k.to_string(), v)));
    bollard::models::ContainerConfig {
        user: Some(base.user.clone().unwrap_or_default()),
        env: base.env.clone(),
        cmd: base.cmd.clone(),
        entrypoint: base.entrypoint.clone(),
        working_dir: Some(base.working_dir.clone().unwrap_or_default()),
        labels: Some(all),
        exposed_ports: base.exposed_ports.clone(),
        volumes: base.volumes.clone(),
        stop_signal: base.stop_signal.clone(),
        shell: base.shell.clone(),
        on_build: base.on_build.clone(),
        // Never the base image's: nothing of a repository's image runs in a sandbox but
        // what kodx runs.
        healthcheck: Some(bollard::models::HealthConfig {
            test: Some(vec!["NONE".to_string()]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Commits container `id` with `config` and names the image `name`, unless an image of
/// that name for which `same` holds appeared meanwhile (another process made it): that one
/// stays and the commit is removed (no container uses it yet). Returns the named image's id.
pub async fn commit_named(
    docker: &bollard::Docker,
    id: &str,
    config: bollard::models::ContainerConfig,
    (name, comment, pause): (&str, &str, bool),
    same: impl Fn(&bollard::models::ImageInspect) -> bool,
) -> crate::Result<String> {
    use crate::SandboxError;
    use bollard::query_parameters::{CommitContainerOptions, RemoveImageOptions, TagImageOptions};
    let committed = docker
        .commit_container(
            CommitContainerOptions {
                container: Some(id.to_string()),
                comment: Some(comment.to_string()),
                pause,
                ..Default::default()
            },
            config,
        )
        .await
        .map_err(|e| SandboxError::docker(format!("committing the image {name}"), e))?;
    if let Ok(existing) = docker.inspect_image(name).await {
        if let (true, Some(existing_id)) = (same(&existing), existing.id.clone()) {
            let _ = docker
                .remove_image(&committed.id, None::<RemoveImageOptions>, None)
                .await;
            return Ok(existing_id);
        }
    }
    let (repo, tag) = name.split_once(':').expect("image names have a tag");
    docker
        .tag_image(
            &committed.id,
            Some(TagImageOptions {
                repo: Some(repo.to_string()),
                tag: Some(tag.to_string()),
            }),
        )
        .await
        .map_err(|e| SandboxError::docker(format!("naming the image {name}"), e))?;
    Ok(committed.id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn process_identities_round_trip_and_tell_who_is_alive() {
        let me = process_identity().expect("/proc is readable");
        let text = me.to_string();
        assert_eq!(text.parse::<ProcessIdentity>(), Ok(me));
        assert_eq!(process_alive(me, &text), Some(true));
        let other_ns = ProcessIdentity {
            pid_namespace: me.pid_namespace + 1,
            ..me
        };
        assert_eq!(process_alive(me, &other_ns.to_string()), None);
        let reused = ProcessIdentity {
            start_time: me.start_time + 1,
            ..me
        };
        assert_eq!(process_alive(me, &reused.to_string()), Some(false));
        assert_eq!(process_alive(me, "myhost/1"), None, "an old host/pid label");
        assert!("1/2/3".parse::<ProcessIdentity>().is_err());
        assert!(format!("{text}/9").parse::<ProcessIdentity>().is_err());
        assert_eq!(owner_id(), owner_id());
        assert_eq!(owner_id().len(), 16);
    }
}
