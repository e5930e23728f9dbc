//! The image a sandbox is made from: the run's image with kodx's files already in (the
//! shells' rc file; the helper comes from its read-only volume), made once
//! per image and kodx build and kept, so that no upload has to go into each container
//! before it can start (~50–80 ms of the engine's per start).
//!
//! A derived image is the base image plus one layer holding exactly those files, with the
//! base image's config (command, environment, user, working directory, labels); it is named
//! `kodx-base:<hash of the base image's id and the files>` and labelled [`DERIVED_LABEL`].
//! Made by committing a container that never ran: nothing of the image runs. Images of the
//! setup cache are not derived (their files go in at each start, over whatever the setup
//! script left); neither is anything when deriving fails: the files are uploaded then, as
//! they always were.

use std::collections::HashMap;
use std::sync::OnceLock;

use bollard::models::ContainerCreateBody;
use bollard::query_parameters::{CreateContainerOptions, ListImagesOptions, RemoveImageOptions};
use bollard::Docker;
use sha2::{Digest, Sha256};

use super::cleanup::{register_live, remove};
use super::engine::Engine;
use super::streams::upload;
use crate::archive;
use crate::net;
use crate::owner::{commit_named, image_config, run_labels};
use crate::setup_cache;
use crate::shell;
use crate::{Result, SandboxError};

/// Repository of the derived images.
pub const DERIVED_REPO: &str = "kodx-base";
/// Label of a derived image: the hash of kodx's files in it.
pub const DERIVED_LABEL: &str = "kodx.derived";
/// Label of a derived image: the id of the image it was made from.
pub const DERIVED_BASE_LABEL: &str = "kodx.derived.base";

/// kodx's files in every sandbox: (path without the leading `/`, contents, mode). Put at
/// `/`, so an image without /tmp gets one.
pub(super) fn kodx_files() -> Vec<(&'static str, &'static [u8], u32)> {
    vec![("tmp/.kodx/bashrc", shell::BASHRC.as_bytes(), 0o644)]
}

/// 16 hex digits of the hash of kodx's files (their paths, modes and contents).
fn files_hash() -> &'static str {
    static HASH: OnceLock<String> = OnceLock::new();
    HASH.get_or_init(|| {
        let mut h = Sha256::new();
        for (path, contents, mode) in kodx_files() {
            h.update(path.as_bytes());
            h.update([0]);
            h.update(mode.to_le_bytes());
            h.update((contents.len() as u64).to_le_bytes());
            h.update(contents);
        }
        hex::encode(h.finalize())[..16].to_string()
    })
}

/// The derived image's name for base image `base_id`.
fn derived_name(base_id: &str) -> String {
    let h = Sha256::new()
        .chain_update(base_id.as_bytes())
        .chain_update(files_hash().as_bytes())
        .finalize();
    format!("{DERIVED_REPO}:{}", &hex::encode(h)[..24])
}

/// Derived images this process found or made, per engine: base image id → name.
fn known() -> &'static parking_lot::Mutex<HashMap<(String, String), String>> {
    static KNOWN: OnceLock<parking_lot::Mutex<HashMap<(String, String), String>>> = OnceLock::new();
    KNOWN.get_or_init(Default::default)
}

/// The image a sandbox of `image` is made from, and whether kodx's files are in it.
pub(super) struct SandboxImage {
    pub(super) name: String,
    pub(super) has_files: bool,
}

impl Engine {
    /// The image to make a sandbox of `image` from: its derived image (found, or made
    /// now), else `image` itself, for kodx's files to be uploaded into the container.
    pub(super) async fn sandbox_image(&self, image: &str) -> SandboxImage {
        let plain = SandboxImage {
            name: image.to_string(),
            has_files: false,
        };
        let Ok(info) = self.docker.inspect_image(image).await else {
            return plain;
        };
        let (Some(id), Some(config)) = (info.id, info.config) else {
            return plain;
        };
        let labels = config.labels.clone().unwrap_or_default();
        if labels.get(DERIVED_LABEL).map(String::as_str) == Some(files_hash()) {
            return SandboxImage {
                name: image.to_string(),
                has_files: true,
            };
        }
        // A setup cache image: the files go in over what its setup script left.
        if labels
            .get(setup_cache::KEY_LABEL)
            .is_some_and(|k| !k.is_empty())
        {
            return plain;
        }
        let key = (self.host.clone(), id.clone());
        if let Some(name) = known().lock().get(&key) {
            return SandboxImage {
                name: name.clone(),
                has_files: true,
            };
        }
        let name = derived_name(&id);
        let found = self.docker.inspect_image(&name).await.is_ok();
        let made = match found {
            true => Ok(()),
            false => self.derive(&id, &config, &name).await,
        };
        match made {
            Ok(()) => {
                known().lock().insert(key, name.clone());
                SandboxImage {
                    name,
                    has_files: true,
                }
            }
            Err(e) => {
                tracing::warn!("could not make the sandbox image of {image} ({e}); kodx's files are copied into each container instead");
                plain
            }
        }
    }

    /// Forgets the derived image of `image` (it was removed meanwhile): the next sandbox
    /// finds or makes it again.
    pub(super) fn forget_derived(&self, derived: &str) {
        known().lock().retain(|_, name| name != derived);
    }

    /// Makes `name` from base image `base_id`: a container that is never started, kodx's
    /// files copied in, committed with the base image's config.
    async fn derive(
        &self,
        base_id: &str,
        base: &bollard::models::ImageConfig,
        name: &str,
    ) -> Result<()> {
        let temp = format!("kodx-derive-{:016x}", rand::random::<u64>());
        let labels = run_labels(&temp, self.instance.as_deref());
        let body = ContainerCreateBody {
            image: Some(base_id.to_string()),
            cmd: Some(net::hold_command()),
            entrypoint: Some(vec![]),
            healthcheck: Some(net::no_healthcheck()),
            labels: Some(labels),
            network_disabled: Some(true),
            ..Default::default()
        };
        let created = self
            .docker
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(temp.clone()),
                    ..Default::default()
                }),
                body,
            )
            .await
            .map_err(|e| SandboxError::docker("creating the container to derive from", e))?;
        register_live(&self.docker, &created.id);
        let made = commit_files(&self.docker, &created.id, base_id, base, name).await;
        let _ = remove(&self.docker, &created.id).await;
        made
    }
}

async fn commit_files(
    docker: &Docker,
    id: &str,
    base_id: &str,
    base: &bollard::models::ImageConfig,
    name: &str,
) -> Result<()> {
    upload(docker, id, "/", archive::pack_files(&kodx_files())).await?;
    let config = image_config(
        base,
        [
            (DERIVED_LABEL, files_hash().to_string()),
            (DERIVED_BASE_LABEL, base_id.to_string()),
        ],
    );
    commit_named(
        docker,
        id,
        config,
        (name, "kodx's files over the base image", false),
        |_| true,
    )
    .await
    .map(|_| ())
}

impl Engine {
    /// Removes the derived images of other kodx builds (other files in them) that nothing
    /// uses: an upgrade leaves one per image it ran; and kodx's helper images and volumes
    /// of other builds. An image a container or another image still uses stays (the
    /// engine refuses); it goes on a later call. Returns how many went.
    pub async fn remove_old_derived(&self) -> Result<usize> {
        let list = self
            .docker
            .list_images(Some(ListImagesOptions {
                filters: Some(HashMap::from([(
                    "label".to_string(),
                    vec![DERIVED_LABEL.to_string()],
                )])),
                ..Default::default()
            }))
            .await
            .map_err(|e| SandboxError::docker("listing kodx's sandbox images", e))?;
        let mut removed = 0;
        for image in list {
            if image.labels.get(DERIVED_LABEL).map(String::as_str) == Some(files_hash()) {
                continue;
            }
            let gone = self
                .docker
                .remove_image(&image.id, None::<RemoveImageOptions>, None)
                .await;
            if gone.is_ok() {
                removed += 1;
            }
        }
        Ok(removed + net::remove_old_helpers(&self.docker).await)
    }
}
