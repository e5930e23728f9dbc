//! A connection to a Docker engine: connecting (with a hint when the engine cannot be
//! reached), what the engine is (architecture, storage driver), images, the sandboxes'
//! network, and the sweeps that remove containers no live run owns.

use std::collections::HashMap;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use bollard::query_parameters::{CreateImageOptions, ListContainersOptions};
use bollard::Docker;
use futures_util::StreamExt;

use super::cleanup::remove;
use crate::engines::{EngineConfig, EnvEngine};
use crate::net::{self, NETWORK_NAME};
use crate::owner::{
    owner_id, process_alive, process_identity, CHECKS_OF_LABEL, INSTANCE_LABEL, OWNER_LABEL,
    PRELOADED_LABEL, PROCESS_LABEL, RUN_LABEL, WARM_LABEL, WARM_NAME_PREFIX,
};
use crate::setup_cache;
use crate::{Result, SandboxError};

/// A connection to a Docker engine.
#[derive(Clone)]
pub struct Engine {
    pub(super) docker: Docker,
    pub(super) host: String,
    api_version: String,
    /// The installation whose containers this engine handle makes ([`INSTANCE_LABEL`]).
    pub(super) instance: Option<Arc<str>>,
    facts: Arc<tokio::sync::OnceCell<EngineFacts>>,
    /// The engine refused a storage quota once: later sandboxes use the watchdog at once.
    pub(super) quota_refused: Arc<AtomicBool>,
}

/// What kodx needs to know of an engine, read once per connection.
#[derive(Debug, Clone)]
pub struct EngineFacts {
    /// `uname -m` of the engine's host (`x86_64`, `aarch64`).
    pub arch: String,
    /// The storage driver (`overlay2`, …) and, where it says, its backing filesystem.
    pub storage_driver: String,
    pub backing_fs: String,
    /// The engine's data root on its host (`/var/lib/docker`).
    pub root_dir: String,
}

impl EngineFacts {
    /// Whether the storage driver can limit a container's writable layer (`--storage-opt
    /// size=…`). overlay2 needs xfs mounted with `pquota`, which the engine does not report:
    /// a refusal is handled where the container is made.
    pub fn may_have_quota(&self) -> bool {
        match self.storage_driver.as_str() {
            "overlay2" => self.backing_fs == "xfs",
            "btrfs" | "zfs" | "devicemapper" | "windowsfilter" => true,
            _ => false,
        }
    }
}

fn unavailable(host: &str, reason: impl ToString) -> SandboxError {
    let reason = reason.to_string();
    let hint = if reason.contains("ermission denied") {
        "Run kodx as a user that may use the Docker socket (e.g. in the `docker` group), or set DOCKER_HOST.".to_string()
    } else {
        "Start the Docker engine (`sudo systemctl start docker`, or `sudo dockerd &`), or point DOCKER_HOST \
         at a running one (tcp://HOST:2376 with DOCKER_TLS_VERIFY=1 and DOCKER_CERT_PATH for TLS). \
         `kodx doctor` checks it."
            .to_string()
    };
    SandboxError::EngineUnavailable {
        host: host.to_string(),
        reason,
        hint,
    }
}

impl Engine {
    /// Connects to the engine the environment names ([`EnvEngine::from_vars`]: the local
    /// socket, `DOCKER_HOST`, TLS with `DOCKER_TLS_VERIFY` and `DOCKER_CERT_PATH`),
    /// negotiates the API version and checks that the engine answers. A `tcp://` engine
    /// without TLS is refused before anything is sent, as in `[[engines]]`.
    pub async fn connect() -> Result<Engine> {
        let target = EnvEngine::from_vars(|name| std::env::var(name).ok())
            .map_err(SandboxError::EngineRefused)?;
        let host = target.host();
        let docker = target.client().map_err(|e| unavailable(&host, e))?;
        Self::negotiated(docker, host).await
    }

    /// Connects to one engine of the server's list (`[[engines]]`), over TLS for `tcp://`.
    pub async fn connect_to(config: &EngineConfig) -> Result<Engine> {
        let docker = config.client().map_err(|e| unavailable(&config.host, e))?;
        Self::negotiated(docker, config.host.clone()).await
    }

    /// Negotiates the API version and checks that the engine answers.
    async fn negotiated(docker: Docker, host: String) -> Result<Engine> {
        let docker = tokio::time::timeout(Duration::from_secs(10), docker.negotiate_version())
            .await
            .map_err(|_| unavailable(&host, "no answer within 10s"))?
            .map_err(|e| unavailable(&host, e))?;
        let api_version = docker.client_version().to_string();
        tracing::info!(host = %host, api_version = %api_version, "connected to the Docker engine");
        Ok(Engine {
            docker,
            host,
            api_version,
            instance: None,
            facts: Default::default(),
            quota_refused: Default::default(),
        })
    }

    /// Containers made through this handle carry `instance` as their [`INSTANCE_LABEL`], and
    /// [`Engine::sweep_instance_orphans`] removes the ones other processes of the same
    /// instance left behind. `kodx serve` uses the id kept in its database.
    pub fn with_instance(mut self, instance: impl Into<String>) -> Engine {
        self.instance = Some(Arc::from(instance.into()));
        self
    }

    /// The installation set by [`Engine::with_instance`].
    pub fn instance(&self) -> Option<&str> {
        self.instance.as_deref()
    }

    /// The engine's architecture and storage driver (asked once per connection).
    pub async fn facts(&self) -> Result<&EngineFacts> {
        self.facts
            .get_or_try_init(|| async {
                let info = self
                    .docker
                    .info()
                    .await
                    .map_err(|e| SandboxError::docker("reading the Docker engine's info", e))?;
                let backing_fs = info
                    .driver_status
                    .unwrap_or_default()
                    .into_iter()
                    .find(|kv| kv.first().is_some_and(|k| k == "Backing Filesystem"))
                    .and_then(|kv| kv.get(1).cloned())
                    .unwrap_or_default();
                Ok(EngineFacts {
                    arch: info.architecture.unwrap_or_default(),
                    storage_driver: info.driver.unwrap_or_default(),
                    backing_fs,
                    root_dir: info.docker_root_dir.unwrap_or_default(),
                })
            })
            .await
    }

    /// Makes sure the sandboxes' network (`kodx-sandbox`, or `name`) exists as kodx makes
    /// it — a bridge without IPv6 and without traffic between its containers — and returns
    /// its id. Created once and reused; safe when several kodx processes do it at once.
    pub async fn ensure_network(&self, name: Option<&str>) -> Result<String> {
        net::ensure_network(&self.docker, name.unwrap_or(NETWORK_NAME))
            .await
            .map(|n| n.id)
    }

    pub fn docker(&self) -> &Docker {
        &self.docker
    }

    pub fn host(&self) -> &str {
        &self.host
    }

    /// The Docker API version in use after negotiation (e.g. `1.41`).
    pub fn api_version(&self) -> &str {
        &self.api_version
    }

    /// Makes sure `image` is present, pulling it when absent. `progress` gets one line per
    /// pull status change.
    pub async fn ensure_image(&self, image: &str, mut progress: impl FnMut(&str)) -> Result<()> {
        if self.docker.inspect_image(image).await.is_ok() {
            return Ok(());
        }
        progress(&format!("pulling image {image}"));
        let (name, tag) = split_image(image);
        let mut stream = self.docker.create_image(
            Some(CreateImageOptions {
                from_image: Some(name.to_string()),
                tag: Some(tag.to_string()),
                ..Default::default()
            }),
            None,
            None,
        );
        let mut last = String::new();
        while let Some(item) = stream.next().await {
            match item {
                Ok(info) => {
                    if let Some(status) = info.status {
                        let line = match info.id {
                            Some(id) => format!("{id}: {status}"),
                            None => status,
                        };
                        if line != last {
                            progress(&line);
                            last = line;
                        }
                    }
                }
                Err(e) => {
                    return Err(SandboxError::ImageUnavailable {
                        image: image.to_string(),
                        reason: format!(
                            "it is not on this engine and pulling it failed: {e}. Pull or build it \
                             yourself (`docker pull {image}`), or choose another with --image"
                        ),
                    })
                }
            }
        }
        self.docker
            .inspect_image(image)
            .await
            .map(|_| ())
            .map_err(|e| SandboxError::ImageUnavailable {
                image: image.to_string(),
                reason: format!("the pull ended but the image is still missing: {e}"),
            })
    }

    /// Removes `kodx.run` containers that no live run owns: those whose run id `keep` says
    /// no to. Returns how many were removed.
    pub async fn sweep(&self, keep: impl Fn(&HashMap<String, String>) -> bool) -> Result<usize> {
        self.sweep_labelled(RUN_LABEL, keep).await
    }

    /// The containers carrying `label` (`key` or `key=value`); stopped ones too with `all`.
    async fn labelled(
        &self,
        label: &str,
        all: bool,
    ) -> Result<Vec<bollard::models::ContainerSummary>> {
        self.docker
            .list_containers(Some(ListContainersOptions {
                all,
                filters: Some(HashMap::from([(
                    "label".to_string(),
                    vec![label.to_string()],
                )])),
                ..Default::default()
            }))
            .await
            .map_err(|e| SandboxError::docker("listing kodx containers", e))
    }

    /// Removes the containers carrying `label` (`key` or `key=value`) that `keep` says no to.
    async fn sweep_labelled(
        &self,
        label: &str,
        keep: impl Fn(&HashMap<String, String>) -> bool,
    ) -> Result<usize> {
        let list = self.labelled(label, true).await?;
        let mut removed = 0;
        for c in list {
            let mut labels = c.labels.clone().unwrap_or_default();
            // A claimed warm sandbox is its run's: judged as one made for the run.
            if let Some(run) = claimed_by(&c) {
                labels.insert(RUN_LABEL.to_string(), run);
            }
            if !labels.contains_key(RUN_LABEL) || keep(&labels) {
                continue;
            }
            if let Some(id) = c.id {
                if remove(&self.docker, &id).await.is_ok() {
                    tracing::info!(container = %id, run = ?labels.get(RUN_LABEL), "removed an orphaned sandbox container");
                    removed += 1;
                }
            }
        }
        Ok(removed)
    }

    /// Removes the containers left behind by kodx processes that are certainly gone (a
    /// crash, a `kill -9`): those whose [`PROCESS_LABEL`] names this boot and this PID
    /// namespace, and a process that no longer runs there. Everything else is kept: live
    /// processes, other hosts, other PID namespaces (another container, or this process's
    /// previous life as PID 1 of one) — there a pid proves nothing — and containers of kodx
    /// versions without the label.
    pub async fn sweep_dead_owners(&self) -> Result<usize> {
        let Some(me) = process_identity() else {
            return Ok(0);
        };
        self.sweep_labelled(PROCESS_LABEL, |labels| {
            labels
                .get(PROCESS_LABEL)
                .and_then(|p| process_alive(me, p))
                .unwrap_or(true)
        })
        .await
    }

    /// Removes the containers of this engine's instance ([`Engine::with_instance`]) that
    /// another process made: at the start of `kodx serve`, before any run, those are the
    /// orphans of an earlier life of this installation, however it ended. Does nothing
    /// without an instance.
    pub async fn sweep_instance_orphans(&self) -> Result<usize> {
        let Some(instance) = self.instance.as_deref() else {
            return Ok(0);
        };
        let me = owner_id();
        self.sweep_labelled(&format!("{INSTANCE_LABEL}={instance}"), |labels| {
            labels.get(OWNER_LABEL).map(String::as_str) == Some(me)
        })
        .await
    }

    /// Removes the containers this process made (its [`OWNER_LABEL`]) whose run is not in
    /// `live`: after the engine came back from an outage, those of runs that ended while it
    /// was away. Returns how many were removed.
    pub async fn sweep_own_except(
        &self,
        live: &std::collections::HashSet<String>,
    ) -> Result<usize> {
        let me = owner_id();
        self.sweep_labelled(&format!("{OWNER_LABEL}={me}"), |labels| {
            // A live run's checks' sandbox is the run's.
            [RUN_LABEL, CHECKS_OF_LABEL]
                .iter()
                .any(|l| labels.get(*l).is_some_and(|run| live.contains(run)))
        })
        .await
    }

    /// Removes the sandboxes made for the checks of run `run_id`
    /// ([`CHECKS_OF_LABEL`]). Returns how many were removed.
    pub async fn remove_checks_of(&self, run_id: &str) -> Result<usize> {
        self.sweep_labelled(&format!("{CHECKS_OF_LABEL}={run_id}"), |labels| {
            labels.get(CHECKS_OF_LABEL).map(String::as_str) != Some(run_id)
        })
        .await
    }

    /// Sandboxes running on this engine now, made by any kodx process (its running
    /// [`RUN_LABEL`] containers), not counting warm sandboxes no run has claimed, nor the
    /// sandboxes of a run's checks (part of their run).
    pub async fn running_sandboxes(&self) -> Result<usize> {
        Ok(self
            .labelled(RUN_LABEL, false)
            .await?
            .iter()
            .filter(|c| !is_unclaimed_warm(c))
            .filter(|c| {
                c.labels
                    .as_ref()
                    .is_none_or(|l| !l.contains_key(CHECKS_OF_LABEL))
            })
            .count())
    }

    /// Warm sandboxes no run has claimed on this engine now, made by any kodx process.
    pub async fn unclaimed_warm_sandboxes(&self) -> Result<usize> {
        self.unclaimed_labelled(WARM_LABEL).await
    }

    /// Those of them that hold a repository's checkout ([`super::preload`]).
    pub async fn unclaimed_preloaded_sandboxes(&self) -> Result<usize> {
        self.unclaimed_labelled(PRELOADED_LABEL).await
    }

    async fn unclaimed_labelled(&self, label: &str) -> Result<usize> {
        Ok(self
            .labelled(label, false)
            .await?
            .iter()
            .filter(|c| is_unclaimed_warm(c))
            .count())
    }

    /// Whether this engine holds a setup cache image made for `scope` (a repository).
    pub async fn has_setup_cache_for(&self, scope: &str) -> bool {
        let label = format!("{}={scope}", setup_cache::SCOPE_LABEL);
        self.docker
            .list_images(Some(bollard::query_parameters::ListImagesOptions {
                filters: Some(HashMap::from([("label".to_string(), vec![label])])),
                ..Default::default()
            }))
            .await
            .is_ok_and(|l| !l.is_empty())
    }

    /// Whether `image` is on this engine already (no pull needed).
    pub async fn has_image(&self, image: &str) -> bool {
        self.docker.inspect_image(image).await.is_ok()
    }

    /// Removes every container of run `run_id` (its [`RUN_LABEL`]), whoever made it: before
    /// a run is started again, so its container's name (`kodx-<run id>`) is free. Returns
    /// how many were removed.
    pub async fn remove_run_containers(&self, run_id: &str) -> Result<usize> {
        let by_label = self
            .sweep_labelled(&format!("{RUN_LABEL}={run_id}"), |labels| {
                labels.get(RUN_LABEL).map(String::as_str) != Some(run_id)
            })
            .await?;
        // A warm sandbox the run claimed carries its warm id, and the run's name.
        let claimed = self
            .sweep_labelled(WARM_LABEL, |labels| {
                labels.get(RUN_LABEL).map(String::as_str) != Some(run_id)
            })
            .await?;
        // The sandboxes of its checks.
        let checks = self.remove_checks_of(run_id).await?;
        Ok(by_label + claimed + checks)
    }
}

/// The run a claimed warm sandbox belongs to (it is named `kodx-<run id>`); `None` for
/// every other container.
fn claimed_by(c: &bollard::models::ContainerSummary) -> Option<String> {
    if !c.labels.as_ref()?.contains_key(WARM_LABEL) || is_unclaimed_warm(c) {
        return None;
    }
    let name = c.names.as_ref()?.first()?;
    name.trim_start_matches('/')
        .strip_prefix("kodx-")
        .map(str::to_string)
}

/// Whether `c` is a warm sandbox no run has claimed (still named `kodx-warm-…`).
fn is_unclaimed_warm(c: &bollard::models::ContainerSummary) -> bool {
    c.labels
        .as_ref()
        .is_some_and(|l| l.contains_key(WARM_LABEL))
        && c.names.as_ref().is_some_and(|n| {
            n.iter()
                .any(|n| n.trim_start_matches('/').starts_with(WARM_NAME_PREFIX))
        })
}

fn split_image(image: &str) -> (&str, &str) {
    // `registry:5000/name:tag` — the tag is after the last colon that follows the last slash.
    let slash = image.rfind('/').map_or(0, |i| i + 1);
    if image.contains('@') {
        return (image, "");
    }
    match image[slash..].rfind(':') {
        Some(i) => (&image[..slash + i], &image[slash + i + 1..]),
        None => (image, "latest"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_names_split_into_name_and_tag() {
        assert_eq!(split_image("python:3.12"), ("python", "3.12"));
        assert_eq!(split_image("python"), ("python", "latest"));
        assert_eq!(
            split_image("registry:5000/team/img:v1"),
            ("registry:5000/team/img", "v1")
        );
        assert_eq!(
            split_image("registry:5000/img"),
            ("registry:5000/img", "latest")
        );
    }
}
