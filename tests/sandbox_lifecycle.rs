//! Containers are removed on every path, and orphans are swept.

mod common;

use std::collections::HashMap;

use bollard::models::ContainerCreateBody;
use bollard::query_parameters::CreateContainerOptions;
use common::*;
use kodx::sandbox::Sandbox;

#[tokio::test]
async fn dropping_a_sandbox_without_destroy_removes_it() {
    let Some(engine) = engine().await else { return };
    let spec = spec("drop");
    let sb = start(&engine, &spec).await;
    assert_eq!(containers_of(&engine, &spec.run_id).await.len(), 1);
    drop(sb);
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn a_panic_while_working_removes_the_container() {
    let Some(engine) = engine().await else { return };
    let spec = spec("panic");
    let e2 = engine.clone();
    let s2 = spec.clone();
    let res = tokio::spawn(async move {
        let sb = e2.start(&s2).await.unwrap();
        sb.feed_chars("default", "echo working", 5 * SEC)
            .await
            .unwrap();
        panic!("the agent crashed mid-run");
    })
    .await;
    assert!(res.unwrap_err().is_panic());
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn a_cancelled_run_removes_the_container() {
    let Some(engine) = engine().await else { return };
    let spec = spec("cancel");
    let e2 = engine.clone();
    let s2 = spec.clone();
    let task = tokio::spawn(async move {
        let sb = e2.start(&s2).await.unwrap();
        sb.feed_chars("default", "sleep 100", 60 * SEC)
            .await
            .unwrap();
    });
    // Wait until the container exists, then cancel the run.
    for _ in 0..100 {
        if !containers_of(&engine, &spec.run_id).await.is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn sweep_removes_containers_of_dead_owners_only() {
    let Some(engine) = engine().await else { return };
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap()
        .trim()
        .to_string();
    let dead = run_id("orphan");
    let alive = run_id("owned");
    for (run, owner) in [
        (&dead, format!("{host}/4000000000")),
        (&alive, format!("{host}/{}", std::process::id())),
    ] {
        engine
            .docker()
            .create_container(
                Some(CreateContainerOptions {
                    name: Some(format!("kodx-{run}")),
                    ..Default::default()
                }),
                ContainerCreateBody {
                    image: Some(image()),
                    cmd: Some(vec!["true".into()]),
                    labels: Some(HashMap::from([
                        ("kodx.run".to_string(), run.clone()),
                        ("kodx.owner".to_string(), owner),
                    ])),
                    ..Default::default()
                },
            )
            .await
            .unwrap();
    }
    let removed = engine.sweep_dead_owners().await.unwrap();
    assert!(removed >= 1);
    assert_gone(&engine, &dead).await;
    assert_eq!(
        containers_of(&engine, &alive).await.len(),
        1,
        "a live owner's container stays"
    );
    // The explicit sweep: keep only run ids a live run owns.
    engine
        .sweep(|labels| labels.get("kodx.run") != Some(&alive))
        .await
        .unwrap();
    assert_gone(&engine, &alive).await;
}
