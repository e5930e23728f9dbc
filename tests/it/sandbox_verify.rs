//! The checks' own sandbox (SPEC §12) against the real engine: made as the run's was, it
//! holds the starting tree with exactly the agent's change set written over it — edits,
//! deletions, modes, symlinks, a directory become a file — and nothing else the agent did
//! to its container; a run's removal takes its checks' sandboxes too.

use std::time::Duration;

use crate::common;
use crate::common::*;
use kodx::checks::verify::{FreshSandboxes, Verifier};
use kodx::sandbox::Sandbox;

/// Waits (10 s at most) until a checks' sandbox of run `run_id` exists; its label.
async fn checks_sandbox_made(engine: &kodx::sandbox::Engine, run_id: &str) -> String {
    let label = format!("kodx.checks-of={run_id}");
    for _ in 0..200 {
        if !common::containers_labelled(engine, &label).await.is_empty() {
            return label;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("no checks' sandbox of {run_id} after 10 s");
}

/// Waits (10 s at most: a creation the engine was doing when its start was stopped is
/// swept 3 s later) until no container carries `label`.
async fn checks_sandboxes_gone(engine: &kodx::sandbox::Engine, label: &str) {
    for _ in 0..200 {
        if common::containers_labelled(engine, label).await.is_empty() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("a container labelled {label} was left behind");
}

#[tokio::test]
async fn a_checks_sandbox_holds_the_starting_tree_and_exactly_the_change_set() {
    let engine = common::require_engine!();
    let repo = tempfile::tempdir().unwrap();
    let write = |path: &str, body: &str| {
        let p = repo.path().join(path);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, body).unwrap();
    };
    write(".gitignore", "build/\n");
    write("src/main.py", "print('broken')\n");
    write("old.txt", "old\n");
    write("dir/inner.txt", "inner\n");
    write("run.sh", "echo run\n");
    write("kept.txt", "kept\n");
    let mut spec = common::spec("verify-tree");
    spec.repo_dir = Some(repo.path().to_path_buf());
    spec.change_set_ahead = true;
    let work = start(&engine, &spec).await;
    let verifier = FreshSandboxes::new(engine.clone(), &spec);
    // The change, and what the agent does to its container besides.
    let agent = [
        "echo \"print('fixed')\" > src/main.py",
        "rm old.txt dir/inner.txt && rmdir dir && echo now-a-file > dir",
        "chmod +x run.sh",
        "ln -s src/main.py link && mkdir -p new/deep && echo n > new/deep/n.txt",
        "printf '#!/bin/sh\\nexit 0\\n' > /usr/local/bin/grep && chmod +x /usr/local/bin/grep",
        "mkdir -p build && touch build/ignored /tmp/planted && echo 'exit 0' >> ~/.bashrc",
    ]
    .join(" && ");
    let out = work.feed_chars("default", &agent, 30 * SEC).await.unwrap();
    assert!(!out.output.contains("No such file"), "{out:?}");
    let checkout = verifier.checkout(&work).await.expect("the checks' sandbox");
    assert_eq!(
        checkout.edited,
        ["dir/inner.txt", "old.txt", "run.sh", "src/main.py"]
    );
    for path in [
        "src/main.py",
        "dir",
        "link",
        "new/deep/n.txt",
        "kept.txt",
        ".gitignore",
    ] {
        assert!(
            checkout.files.contains(path),
            "{path}: {:?}",
            checkout.files
        );
    }
    assert!(!checkout.files.contains("old.txt"));
    let seen = checkout
        .sandbox
        .run_to_end(
            concat!(
                "set -e; grep -q fixed src/main.py; test ! -e old.txt; test \"$(cat dir)\" = now-a-file; ",
                "test -x run.sh; test \"$(readlink link)\" = src/main.py; test -f new/deep/n.txt; ",
                "test \"$(cat kept.txt)\" = kept; test ! -e build/ignored; test ! -e /tmp/planted; ",
                "! grep -q nothing-like-this src/main.py; ! grep -q 'exit 0' ~/.bashrc 2>/dev/null; echo all-seen"
            ),
            Duration::from_secs(30),
            4096,
        )
        .await
        .unwrap();
    assert_eq!(seen.exit_code, Some(0), "{seen:?}");
    assert_eq!(seen.output.trim(), "all-seen", "{seen:?}");
    checkout.sandbox.destroy().await.unwrap();
    // What was checked is what is delivered, while the agent does nothing more.
    let verified = verifier.take_verified().expect("the checked change set");
    assert_eq!(
        described(&verified),
        described(&work.change_set().await.unwrap())
    );

    // A repair pass: the next checks' sandbox is made ahead, and the run's removal takes it.
    verifier.another();
    let checks_label = checks_sandbox_made(&engine, &spec.run_id).await;
    verifier.close().await;
    checks_sandboxes_gone(&engine, &checks_label).await;
    work.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn removing_a_run_removes_its_checks_sandboxes() {
    let engine = common::require_engine!();
    let spec = common::spec("verify-removal");
    let verifier = FreshSandboxes::new(engine.clone(), &spec);
    let checks_label = checks_sandbox_made(&engine, &spec.run_id).await;
    // Removed while it starts: the start fails, and nothing of it stays.
    let removed = engine.remove_run_containers(&spec.run_id).await.unwrap();
    assert!(removed >= 1, "{removed}");
    verifier.close().await;
    checks_sandboxes_gone(&engine, &checks_label).await;
}
