//! The image a sandbox is made from: the run's image with kodx's files in, made once per
//! image and kept, made again when removed, never from a setup cache image.

use std::collections::HashMap;

use crate::common;
use crate::common::*;
use bollard::models::{ContainerConfig, ContainerCreateBody};
use bollard::query_parameters::{
    CommitContainerOptions, CreateContainerOptions, RemoveContainerOptions, RemoveImageOptions,
};
use kodx::sandbox::docker::{
    Engine, DERIVED_BASE_LABEL, DERIVED_LABEL, DERIVED_REPO, OWNER_LABEL, RUN_LABEL,
};
use kodx::sandbox::{DockerSandbox, Sandbox};

/// A base image of this test's own (busybox with a label of its own: its own id), with a
/// command and environment of its own, for the derived image to carry.
async fn own_base(engine: &Engine) -> String {
    let name = format!("kodx-derived-test-{:08x}", rand::random::<u32>());
    let config = ContainerConfig {
        cmd: Some(vec!["echo".into(), "base command".into()]),
        env: Some(vec!["BASE_ENV=kept".into()]),
        labels: Some(HashMap::from([("test.base".into(), name.clone())])),
        ..Default::default()
    };
    image_from(engine, BUSYBOX_IMAGE, "kodx-test", &name, config).await
}

/// Commits a container of `from` that never ran, with `config`, as `repo:tag`; its name.
async fn image_from(
    engine: &Engine,
    from: &str,
    repo: &str,
    tag: &str,
    config: ContainerConfig,
) -> String {
    let docker = engine.docker();
    let c = docker
        .create_container(
            None::<CreateContainerOptions>,
            ContainerCreateBody {
                image: Some(from.to_string()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    docker
        .commit_container(
            CommitContainerOptions {
                container: Some(c.id.clone()),
                repo: Some(repo.into()),
                tag: Some(tag.into()),
                ..Default::default()
            },
            config,
        )
        .await
        .unwrap();
    docker
        .remove_container(&c.id, None::<RemoveContainerOptions>)
        .await
        .unwrap();
    format!("{repo}:{tag}")
}

/// The image the sandbox's container was made from, by the name it was made with.
async fn made_from(engine: &Engine, sb: &DockerSandbox) -> String {
    let info = engine
        .docker()
        .inspect_container(sb.container_id(), None)
        .await
        .unwrap();
    info.config.and_then(|c| c.image).unwrap()
}

async fn remove_image(engine: &Engine, name: &str) {
    let _ = engine
        .docker()
        .remove_image(
            name,
            Some(RemoveImageOptions {
                force: true,
                ..Default::default()
            }),
            None,
        )
        .await;
}

#[tokio::test]
async fn a_sandbox_is_made_from_its_image_with_kodxs_files_in_once_and_again_when_removed() {
    let engine = common::require_engine!();
    let docker = engine.docker();
    let base = own_base(&engine).await;
    let base_id = docker.inspect_image(&base).await.unwrap().id.unwrap();
    let mut spec = spec("derived");
    spec.image = base.clone();
    let sb = start(&engine, &spec).await;
    let derived = made_from(&engine, &sb).await;
    assert!(
        derived.starts_with(&format!("{DERIVED_REPO}:")),
        "{derived}"
    );
    // The base image's config and labels, kodx's own labels empty (the container's own
    // values are its), and where it came from.
    let image = docker.inspect_image(&derived).await.unwrap();
    let config = image.config.unwrap();
    assert_eq!(
        config.cmd,
        Some(vec!["echo".to_string(), "base command".to_string()])
    );
    insta::assert_snapshot!(config.env.unwrap_or_default().join("\n"), @"
    BASE_ENV=kept
    PATH=/bin
    ");
    let labels = config.labels.unwrap();
    assert_eq!(
        labels.get("test.base").map(String::as_str),
        Some(&base[10..])
    );
    assert_eq!(labels.get(DERIVED_BASE_LABEL), Some(&base_id));
    assert_eq!(labels.get(DERIVED_LABEL).map(String::len), Some(16));
    assert_eq!(labels.get(RUN_LABEL).map(String::as_str), Some(""));
    assert_eq!(labels.get(OWNER_LABEL).map(String::as_str), Some(""));
    let container = docker
        .inspect_container(sb.container_id(), None)
        .await
        .unwrap();
    let own = container.config.unwrap().labels.unwrap();
    assert_eq!(own.get(RUN_LABEL), Some(&spec.run_id));
    assert!(!own[OWNER_LABEL].is_empty());
    // kodx's helper is the main process, its rc file is read, the shell works.
    let out = sb
        .feed_chars(
            "default",
            "cat /proc/1/cmdline /proc/2/cmdline | tr '\\0' ' '; echo; echo $BASE_ENV",
            10 * SEC,
        )
        .await
        .unwrap();
    assert!(out.output.contains("/.kodx-bin/kodx-net hold"), "{out:?}");
    assert!(out.output.ends_with("kept\n"), "{out:?}");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;

    // The next sandbox of that image uses the same one.
    let mut again = common::spec("derived-again");
    again.image = base.clone();
    let sb = start(&engine, &again).await;
    assert_eq!(made_from(&engine, &sb).await, derived);
    sb.destroy().await.unwrap();

    // Removed (as `docker image rm` would), the next sandbox still starts (kodx's files
    // copied in), and the one after finds it made again.
    remove_image(&engine, &derived).await;
    assert!(docker.inspect_image(&derived).await.is_err());
    for (i, want) in [(1, base.as_str()), (2, derived.as_str())] {
        let mut spec = common::spec(&format!("derived-removed-{i}"));
        spec.image = base.clone();
        let sb = start(&engine, &spec).await;
        assert_eq!(
            made_from(&engine, &sb).await,
            want,
            "sandbox {i} after the removal"
        );
        let out = sb
            .feed_chars("default", "echo works", 10 * SEC)
            .await
            .unwrap();
        assert_eq!(out.output, "works\n");
        sb.destroy().await.unwrap();
        assert_gone(&engine, &spec.run_id).await;
    }
    // No container made from it (to derive from, or a sandbox) is left.
    assert!(containers_from(&engine, &base_id).await.is_empty());
    remove_image(&engine, &derived).await;
    remove_image(&engine, &base).await;
}

/// Containers made from image `id` or an image made from it, running or not.
async fn containers_from(engine: &Engine, id: &str) -> Vec<String> {
    let list = engine
        .docker()
        .list_containers(Some(bollard::query_parameters::ListContainersOptions {
            all: true,
            filters: Some(HashMap::from([(
                "ancestor".to_string(),
                vec![id.to_string()],
            )])),
            ..Default::default()
        }))
        .await
        .unwrap();
    list.into_iter().filter_map(|c| c.id).collect()
}

#[tokio::test]
async fn sandbox_images_of_other_kodx_builds_go_unless_in_use() {
    let engine = common::require_engine!();
    let docker = engine.docker();
    // Two images as an older kodx would have left them (other files in them); a container
    // still uses the second.
    let mut old = Vec::new();
    for i in 0..2 {
        let base = own_base(&engine).await;
        let tag = format!("test-old-{i}-{:08x}", rand::random::<u32>());
        let config = ContainerConfig {
            labels: Some(HashMap::from([(
                DERIVED_LABEL.to_string(),
                "0000000000000000".to_string(),
            )])),
            ..Default::default()
        };
        old.push(image_from(&engine, &base, DERIVED_REPO, &tag, config).await);
        remove_image(&engine, &base).await;
    }
    let user = docker
        .create_container(
            None::<CreateContainerOptions>,
            ContainerCreateBody {
                image: Some(old[1].clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    // This build's own sandbox image.
    let spec = common::spec("derived-current");
    let sb = start(&engine, &spec).await;
    let current = made_from(&engine, &sb).await;
    sb.destroy().await.unwrap();

    engine.remove_old_derived().await.unwrap();
    assert!(
        docker.inspect_image(&old[0]).await.is_err(),
        "{} stayed",
        old[0]
    );
    assert!(
        docker.inspect_image(&old[1]).await.is_ok(),
        "in use, yet gone"
    );
    assert!(
        docker.inspect_image(&current).await.is_ok(),
        "this build's went"
    );
    docker
        .remove_container(&user.id, None::<RemoveContainerOptions>)
        .await
        .unwrap();
    engine.remove_old_derived().await.unwrap();
    assert!(
        docker.inspect_image(&old[1]).await.is_err(),
        "unused now, yet kept"
    );
}
