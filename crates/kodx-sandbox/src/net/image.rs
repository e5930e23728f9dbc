//! kodx's own image, `kodx-helper:<hash>`: the helper program and nothing else, loaded by
//! kodx itself from an image archive it builds (as `FROM scratch` + `COPY` would; no
//! registry). It is the only image the engine's fencer and kodx's helper containers are
//! made from — never a run's or a repository's image, whose `HEALTHCHECK`, entrypoint or
//! files would then run with the fencer's privileges — and the source of the read-only
//! volume every sandbox runs the helper from ([`helper_volume`]), which nothing in a
//! sandbox can replace.
//!
//! The archive is deterministic (fixed times, owners and modes), so its one layer's digest
//! is known before the engine sees it: an image found under the name is used only when its
//! layers are exactly that one and its config is kodx's ([`genuine`]); anything else is
//! loaded over.

use std::collections::HashMap;
use std::sync::OnceLock;

use bollard::models::{
    ContainerCreateBody, HostConfig, ImageInspect, Mount, MountType, MountVolumeOptions,
    VolumeCreateRequest,
};
use bollard::query_parameters::{CreateContainerOptions, ImportImageOptions};
use bollard::Docker;
use bytes::Bytes;
use futures_util::StreamExt;
use sha2::{Digest, Sha256};

use crate::docker::remove;
use crate::{Result, SandboxError};

/// The helper program (`native/kodx-net.c`), built for this kodx's architecture.
pub(super) const HELPER: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/kodx-net"));
/// Label on kodx's helper containers, its image and its volume's filler.
pub const HELPER_LABEL: &str = "kodx.helper";

/// Repository of kodx's own image.
pub const HELPER_IMAGE_REPO: &str = "kodx-helper";
/// The directory holding the helper in kodx's image, and the helper in it.
const IMAGE_DIR: &str = "kodx";
pub(super) const IMAGE_HELPER_PATH: &str = "/kodx/kodx-net";
/// Where a sandbox mounts the helper's volume (read-only), and the helper there.
pub const SANDBOX_HELPER_DIR: &str = "/.kodx-bin";
pub const SANDBOX_HELPER_PATH: &str = "/.kodx-bin/kodx-net";
/// The healthcheck kodx sets on every container it makes and every image it commits:
/// none, whatever the image says.
pub fn no_healthcheck() -> bollard::models::HealthConfig {
    bollard::models::HealthConfig {
        test: Some(vec!["NONE".to_string()]),
        ..Default::default()
    }
}

/// The image archive (`docker save` layout) and what identifies what it loads.
struct Archive {
    /// `kodx-helper:<12 hex digits>`.
    tag: String,
    /// `sha256:<digest of the layer tar>`: the image's one layer.
    diff_id: String,
    tar: Vec<u8>,
}

fn archive() -> &'static Archive {
    static ARCHIVE: OnceLock<Archive> = OnceLock::new();
    ARCHIVE.get_or_init(build)
}

/// kodx's image's name on every engine.
pub fn helper_image_name() -> &'static str {
    &archive().tag
}

/// One deterministic tar entry.
fn entry(b: &mut tar::Builder<Vec<u8>>, path: &str, kind: tar::EntryType, mode: u32, data: &[u8]) {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(kind);
    h.set_mode(mode);
    h.set_uid(0);
    h.set_gid(0);
    h.set_mtime(0);
    h.set_size(data.len() as u64);
    b.append_data(&mut h, path, data)
        .unwrap_or_else(|e| panic!("packing {path} into kodx's image: {e}"));
}

fn build() -> Archive {
    let mut layer = tar::Builder::new(Vec::new());
    entry(&mut layer, IMAGE_DIR, tar::EntryType::Directory, 0o755, b"");
    entry(
        &mut layer,
        &IMAGE_HELPER_PATH[1..],
        tar::EntryType::Regular,
        0o755,
        HELPER,
    );
    let layer = layer.into_inner().expect("a tar in memory");
    let layer_hex = hex::encode(Sha256::digest(&layer));
    let diff_id = format!("sha256:{layer_hex}");
    let arch = match std::env::consts::ARCH {
        "aarch64" => "arm64",
        _ => "amd64",
    };
    let config = serde_json::json!({
        "architecture": arch,
        "os": "linux",
        "created": "1970-01-01T00:00:00Z",
        "config": {
            "User": "0:0",
            "WorkingDir": "/",
            "Entrypoint": [IMAGE_HELPER_PATH],
            "Cmd": ["hold"],
            "Healthcheck": {"Test": ["NONE"]},
            "Labels": {HELPER_LABEL: "image"},
        },
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        "history": [{"created": "1970-01-01T00:00:00Z", "created_by": "kodx: the network helper"}],
    });
    let config = serde_json::to_vec(&config).expect("json");
    let config_hex = hex::encode(Sha256::digest(&config));
    let tag = format!("{HELPER_IMAGE_REPO}:{}", &layer_hex[..12]);
    let manifest = serde_json::to_vec(&serde_json::json!([{
        "Config": format!("{config_hex}.json"),
        "RepoTags": [tag],
        "Layers": [format!("{layer_hex}/layer.tar")],
    }]))
    .expect("json");
    let mut tar = tar::Builder::new(Vec::new());
    entry(
        &mut tar,
        &format!("{config_hex}.json"),
        tar::EntryType::Regular,
        0o644,
        &config,
    );
    entry(&mut tar, &layer_hex, tar::EntryType::Directory, 0o755, b"");
    entry(
        &mut tar,
        &format!("{layer_hex}/layer.tar"),
        tar::EntryType::Regular,
        0o644,
        &layer,
    );
    entry(
        &mut tar,
        "manifest.json",
        tar::EntryType::Regular,
        0o644,
        &manifest,
    );
    Archive {
        tag,
        diff_id,
        tar: tar.into_inner().expect("a tar in memory"),
    }
}

/// Whether the engine's image `info` is kodx's: exactly the one layer kodx built, its
/// entrypoint the helper, no healthcheck, nothing to run on build.
pub(super) fn genuine(info: &ImageInspect) -> bool {
    let layers = info.root_fs.as_ref().and_then(|r| r.layers.as_deref());
    let Some(config) = info.config.as_ref() else {
        return false;
    };
    layers == Some(std::slice::from_ref(&archive().diff_id))
        && config.entrypoint.as_deref() == Some(&[IMAGE_HELPER_PATH.to_string()][..])
        && config
            .healthcheck
            .as_ref()
            .and_then(|h| h.test.as_deref())
            .is_some_and(|t| t.first().map(String::as_str) == Some("NONE"))
        && config.on_build.as_ref().is_none_or(|o| o.is_empty())
}

/// The id of kodx's image on the engine, loaded when it is missing or when what carries
/// its name is not kodx's. Looked up each time (it is needed rarely: for the fencer, a
/// helper container, the helper's volume), so an image removed meanwhile is loaded again.
pub(super) async fn helper_image(docker: &Docker) -> Result<String> {
    let name = helper_image_name();
    match docker.inspect_image(name).await {
        Ok(info) if genuine(&info) => {
            if let Some(id) = info.id {
                return Ok(id);
            }
        }
        Ok(_) => {
            tracing::warn!(
                image = name,
                "an image named as kodx's is not kodx's: loading kodx's over it"
            );
        }
        Err(_) => {}
    }
    load(docker).await
}

/// Loads kodx's image and checks what the engine then has under its name.
async fn load(docker: &Docker) -> Result<String> {
    let name = helper_image_name();
    let mut answers = docker.import_image(
        ImportImageOptions {
            quiet: true,
            ..Default::default()
        },
        bollard::body_full(Bytes::from(archive().tar.clone())),
        None,
    );
    while let Some(answer) = answers.next().await {
        answer.map_err(|e| SandboxError::docker(format!("loading kodx's image {name}"), e))?;
    }
    let info = docker
        .inspect_image(name)
        .await
        .map_err(|e| SandboxError::docker(format!("inspecting kodx's image {name}"), e))?;
    match (genuine(&info), info.id) {
        (true, Some(id)) => {
            tracing::info!(image = name, "loaded kodx's helper image");
            Ok(id)
        }
        _ => Err(SandboxError::NetworkFence(format!(
            "the engine's image {name} is not the one kodx loaded (its layers are {:?})",
            info.root_fs.and_then(|r| r.layers)
        ))),
    }
}

/// The read-only mount of the helper's volume every sandbox gets, at
/// [`SANDBOX_HELPER_DIR`]: the helper there is the sandbox's main process and the program
/// of kodx's execs in it (shells started ahead, the snapshot), and nothing in the sandbox
/// can change it. `no_copy`: a volume the engine would make because it is missing stays
/// empty (the sandbox then fails to start) instead of taking the sandbox image's files.
pub fn helper_mount(volume: &str) -> Mount {
    Mount {
        target: Some(SANDBOX_HELPER_DIR.to_string()),
        source: Some(volume.to_string()),
        typ: Some(MountType::VOLUME),
        read_only: Some(true),
        volume_options: Some(MountVolumeOptions {
            no_copy: Some(true),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Label on the helper's volume: the layer digest of the image that filled it.
const VOLUME_LABEL: &str = "kodx.helper.volume";

/// The helper's volume on the engine, `kodx-helper-<hash>`: made and filled from kodx's
/// image when missing (the engine copies the image's files into an empty volume mounted
/// over them), and made again when one of that name was not filled by kodx (the engine
/// makes an empty one when a sandbox names a volume that was removed). Looked up for each
/// sandbox (one engine call).
pub async fn helper_volume(docker: &Docker) -> Result<String> {
    let name = helper_image_name().replace(':', "-");
    let diff = &archive().diff_id;
    match docker.inspect_volume(&name).await {
        Ok(v) if v.labels.get(VOLUME_LABEL) == Some(diff) => {}
        found => {
            if found.is_ok() {
                tracing::warn!(volume = %name, "a volume named as kodx's helper volume was not made by kodx: making it again");
                docker
                    .remove_volume(&name, None::<bollard::query_parameters::RemoveVolumeOptions>)
                    .await
                    .map_err(|e| SandboxError::docker(format!("removing the volume {name} kodx did not make (`docker volume rm {name}`)"), e))?;
            }
            fill_volume(docker, &name).await?;
        }
    }
    Ok(name)
}

/// Makes the volume `name` and fills it: a container of kodx's image, never started, with
/// the empty volume mounted over the helper's directory.
async fn fill_volume(docker: &Docker, name: &str) -> Result<()> {
    let image = helper_image(docker).await?;
    docker
        .create_volume(VolumeCreateRequest {
            name: Some(name.to_string()),
            labels: Some(HashMap::from([(
                VOLUME_LABEL.to_string(),
                archive().diff_id.clone(),
            )])),
            ..Default::default()
        })
        .await
        .map_err(|e| SandboxError::docker(format!("creating the helper volume {name}"), e))?;
    let body = ContainerCreateBody {
        image: Some(image),
        labels: Some(HashMap::from([(
            HELPER_LABEL.to_string(),
            "volume".to_string(),
        )])),
        healthcheck: Some(no_healthcheck()),
        network_disabled: Some(true),
        host_config: Some(HostConfig {
            network_mode: Some("none".to_string()),
            mounts: Some(vec![Mount {
                target: Some(format!("/{IMAGE_DIR}")),
                source: Some(name.to_string()),
                typ: Some(MountType::VOLUME),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = docker
        .create_container(None::<CreateContainerOptions>, body)
        .await
        .map_err(|e| SandboxError::docker(format!("filling the helper volume {name}"), e))?;
    let _ = remove(docker, &created.id).await;
    Ok(())
}

/// Removes kodx's images and helper volumes of other kodx builds (another helper) that
/// nothing uses; one still in use stays (the engine refuses) and goes on a later call.
/// Returns how many went.
pub async fn remove_old_helpers(docker: &Docker) -> usize {
    use bollard::query_parameters::{ListImagesOptions, ListVolumesOptions, RemoveImageOptions};
    let label = |l: String| Some(HashMap::from([("label".to_string(), vec![l])]));
    let mut removed = 0;
    let images = docker
        .list_images(Some(ListImagesOptions {
            filters: label(format!("{HELPER_LABEL}=image")),
            ..Default::default()
        }))
        .await
        .unwrap_or_default();
    for image in images {
        if image.repo_tags.iter().any(|t| t == helper_image_name()) {
            continue;
        }
        let gone = docker
            .remove_image(&image.id, None::<RemoveImageOptions>, None)
            .await;
        removed += usize::from(gone.is_ok());
    }
    let volumes = docker
        .list_volumes(Some(ListVolumesOptions {
            filters: label(VOLUME_LABEL.to_string()),
        }))
        .await
        .ok()
        .and_then(|v| v.volumes)
        .unwrap_or_default();
    for volume in volumes {
        if volume.labels.get(VOLUME_LABEL) == Some(&archive().diff_id) {
            continue;
        }
        let gone = docker
            .remove_volume(
                &volume.name,
                None::<bollard::query_parameters::RemoveVolumeOptions>,
            )
            .await;
        removed += usize::from(gone.is_ok());
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_image_archive_is_the_same_every_time_and_names_its_layer() {
        let a = build();
        let b = build();
        assert_eq!(a.tar, b.tar, "deterministic");
        assert!(a.tag.starts_with("kodx-helper:"));
        let mut names = Vec::new();
        let mut t = tar::Archive::new(&a.tar[..]);
        for e in t.entries().unwrap() {
            let e = e.unwrap();
            names.push(e.path().unwrap().to_string_lossy().into_owned());
        }
        assert!(names.contains(&"manifest.json".to_string()), "{names:?}");
        let layer = &a.diff_id["sha256:".len()..];
        assert!(names.contains(&format!("{layer}/layer.tar")), "{names:?}");
    }
}
