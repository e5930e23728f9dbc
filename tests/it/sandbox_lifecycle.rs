//! Containers are removed on every path, and orphans are swept.

use std::collections::HashMap;

use crate::common;
use crate::common::*;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::CreateContainerOptions;
use kodx::sandbox::Sandbox;

#[tokio::test]
async fn dropping_a_sandbox_without_destroy_removes_it() {
    let engine = common::require_engine!();
    let spec = spec("drop");
    let sb = start(&engine, &spec).await;
    assert_eq!(containers_of(&engine, &spec.run_id).await.len(), 1);
    drop(sb);
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn a_panic_while_working_removes_the_container() {
    let engine = common::require_engine!();
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
    let engine = common::require_engine!();
    let spec = spec("cancel");
    let e2 = engine.clone();
    let s2 = spec.clone();
    let task = tokio::spawn(async move {
        let sb = e2.start(&s2).await.unwrap();
        sb.feed_chars("default", "sleep 100", 60 * SEC)
            .await
            .unwrap();
    });
    // Wait until the command runs in the container, then cancel the run.
    wait_for_process(&engine, &spec.run_id, "sleep 100", 60 * SEC).await;
    task.abort();
    assert!(task.await.unwrap_err().is_cancelled());
    assert_gone(&engine, &spec.run_id).await;
}

/// Creates a stopped container with these labels (and the run label), named after the run.
async fn labelled(engine: &kodx::sandbox::Engine, run: &str, labels: &[(&str, String)]) {
    let mut all = HashMap::from([("kodx.run".to_string(), run.to_string())]);
    all.extend(labels.iter().map(|(k, v)| (k.to_string(), v.clone())));
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
                labels: Some(all),
                ..Default::default()
            },
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn sweep_removes_containers_of_dead_owners_only() {
    use kodx::sandbox::docker::{process_identity, OWNER_LABEL, PROCESS_LABEL};
    let engine = common::require_engine!();
    let me = process_identity()
        .expect("this process can be identified")
        .to_string();
    let parts: Vec<&str> = me.split('/').collect();
    assert_eq!(parts.len(), 4, "{me}");
    let with = |i: usize, v: &str| {
        let mut p = parts.clone();
        p[i] = v;
        p.join("/")
    };
    let start_plus_one = (parts[3].parse::<u64>().unwrap() + 1).to_string();
    let gone = run_id("orphan");
    let reused = run_id("reused-pid");
    let alive = run_id("owned");
    let elsewhere = run_id("other-pidns");
    let legacy = run_id("legacy");
    for (run, process) in [
        // A pid no process has here.
        (&gone, Some(with(2, "999999999"))),
        // This pid, but another process's start time: the owner died, its pid was reused.
        (&reused, Some(with(3, &start_plus_one))),
        (&alive, Some(me.clone())),
        // Another PID namespace (another container, or a PID 1 before a restart): a pid
        // proves nothing there.
        (&elsewhere, Some(with(1, "1"))),
        // A kodx version before the label: kept.
        (&legacy, None),
    ] {
        let mut labels = vec![(OWNER_LABEL, "0123456789abcdef".to_string())];
        if let Some(p) = process {
            labels.push((PROCESS_LABEL, p));
        }
        labelled(&engine, run, &labels).await;
    }
    let removed = engine.sweep_dead_owners().await.unwrap();
    assert!(removed >= 2);
    assert_gone(&engine, &gone).await;
    assert_gone(&engine, &reused).await;
    for kept in [&alive, &elsewhere, &legacy] {
        assert_eq!(containers_of(&engine, kept).await.len(), 1, "{kept} stays");
    }
    // The explicit sweep: keep only run ids a live run owns.
    engine
        .sweep(|labels| ![&alive, &elsewhere, &legacy].contains(&labels.get("kodx.run").unwrap()))
        .await
        .unwrap();
    for run in [&alive, &elsewhere, &legacy] {
        assert_gone(&engine, run).await;
    }
}

/// `kodx serve` at start: every container of its installation that another process made is
/// an orphan, whatever that process's pid was; other installations' containers stay.
#[tokio::test]
async fn instance_sweep_removes_this_installations_orphans_only() {
    use kodx::sandbox::docker::{owner_id, INSTANCE_LABEL, OWNER_LABEL};
    let engine = common::require_engine!();
    let mine = format!("{:016x}", rand::random::<u64>());
    let theirs = format!("{:016x}", rand::random::<u64>());
    let engine = engine.with_instance(mine.clone());
    let orphan = run_id("inst-orphan");
    let own = run_id("inst-own");
    let other = run_id("inst-other");
    labelled(
        &engine,
        &orphan,
        &[(INSTANCE_LABEL, mine.clone()), (OWNER_LABEL, "1/1".into())],
    )
    .await;
    labelled(
        &engine,
        &own,
        &[
            (INSTANCE_LABEL, mine.clone()),
            (OWNER_LABEL, owner_id().into()),
        ],
    )
    .await;
    labelled(
        &engine,
        &other,
        &[(INSTANCE_LABEL, theirs), (OWNER_LABEL, "1/1".into())],
    )
    .await;
    assert_eq!(engine.sweep_instance_orphans().await.unwrap(), 1);
    assert_gone(&engine, &orphan).await;
    assert_eq!(containers_of(&engine, &own).await.len(), 1);
    assert_eq!(containers_of(&engine, &other).await.len(), 1);
    // Before a run starts again, whatever holds its name goes.
    assert_eq!(engine.remove_run_containers(&other).await.unwrap(), 1);
    assert_gone(&engine, &other).await;
    assert_eq!(containers_of(&engine, &own).await.len(), 1);
    engine.remove_run_containers(&own).await.unwrap();
    assert_gone(&engine, &own).await;
}

/// A sandbox carries this process's owner id, its identity and the engine's instance.
#[tokio::test]
async fn sandboxes_are_labelled_with_owner_process_and_instance() {
    use kodx::sandbox::docker::{owner_id, process_identity};
    let engine = common::require_engine!();
    let instance = format!("{:016x}", rand::random::<u64>());
    let engine = engine.with_instance(instance.clone());
    let spec = spec("labels");
    let sb = start(&engine, &spec).await;
    let info = engine
        .docker()
        .inspect_container(sb.container_id(), None)
        .await
        .unwrap();
    let labels = info.config.unwrap().labels.unwrap();
    assert_eq!(labels["kodx.run"], spec.run_id);
    assert_eq!(labels["kodx.owner"], owner_id());
    assert_eq!(labels["kodx.instance"], instance);
    assert_eq!(
        labels["kodx.process"],
        process_identity().unwrap().to_string()
    );
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}
