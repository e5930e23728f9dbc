//! The ready checkout (issue 27, item 2), against the real Docker engine and real clones
//! from the repository cache made as `kodx serve` makes them (a git server behind
//! `git http-backend`): a second start at the same tip streams the kept tar, and the
//! workspace and change set are what a fresh pack gives; a new tip never gets the old
//! tar; a pack that fails midway keeps nothing.

use std::path::{Path, PathBuf};

use crate::common;
use crate::common::git_server::{accept_tokens, GitServer};
use crate::common::*;
use kodx::git::{Checkout, History};
use kodx::repo_cache::{RepoCache, RepoKey};
use kodx::sandbox::ready::{ReadyCache, ReadyRepo};
use kodx::sandbox::{RepoSource, Sandbox, SandboxSpec};

const TOKEN: &str = "ghs_TestInstallationToken0123456789abcd";
const REPO: &str = "acme/widgets";

/// A clone of the default branch's tip at `dest`, as an issue run's.
fn clone_tip(cache: &RepoCache, url: &str, dest: &Path) {
    let key = RepoKey::parse(REPO).unwrap();
    cache
        .checkout_for(
            &key,
            url,
            TOKEN,
            &Checkout::DefaultBranch,
            History::Tip,
            dest,
            false,
        )
        .unwrap();
}

fn tip_spec(test: &str, dir: &Path, ready: &ReadyRepo) -> SandboxSpec {
    let mut spec = spec(test);
    spec.repo_dir = Some(dir.to_path_buf());
    spec.repo_source = RepoSource::GitTip;
    spec.ready = Some(ready.clone());
    spec
}

/// Removes the clone's git objects: packing it can no longer succeed.
fn remove_objects(clone: &Path) {
    let objects = clone.join(".git/objects");
    std::fs::remove_dir_all(&objects).unwrap();
    std::fs::create_dir(&objects).unwrap();
}

async fn run(sb: &impl Sandbox, command: &str) -> String {
    sb.feed_chars("default", command, 20 * SEC)
        .await
        .unwrap()
        .output
}

/// The workspace as files, modes, link targets and contents' hashes, with what git says
/// of it (the reflogs left out: they say when the clone was made).
async fn listing(sb: &impl Sandbox) -> String {
    run(
        sb,
        "find . -path ./.git/logs -prune -o -printf '%y %m %p %l\\n' | sort; \
         find . -path ./.git/logs -prune -o -type f -print0 | sort -z | xargs -0 sha256sum; \
         git log --format='%H %s'; git status --porcelain",
    )
    .await
}

/// Edits the workspace and returns the change set's paths and kinds.
async fn edit_and_changes(sb: &impl Sandbox) -> Vec<String> {
    run(
        sb,
        "echo changed > README.md; rm docs/guide.md; echo new > added.txt; chmod -x run.sh",
    )
    .await;
    crate::common::change_lines(sb).await
}

fn kept(cache: &ReadyCache) -> Vec<PathBuf> {
    cache
        .entries()
        .unwrap()
        .into_iter()
        .map(|e| e.path)
        .collect()
}

#[tokio::test]
async fn a_second_start_at_the_same_tip_streams_the_ready_checkout_and_a_new_tip_does_not() {
    let engine = common::require_engine!();
    let srv = GitServer::start(accept_tokens(&[TOKEN]));
    let url = srv.create_repo(
        REPO,
        "main",
        &[
            ("README.md", b"# Widgets\n", 0o644),
            ("run.sh", b"#!/bin/sh\necho hi\n", 0o755),
            ("docs/guide.md", b"guide\n", 0o644),
            ("docs/readme", b"../README.md", 0o120000),
        ],
    );
    let tmp = tempfile::tempdir().unwrap();
    let mirrors = RepoCache::new(tmp.path().join("mirrors"), 1 << 30);
    let cache = ReadyCache::new(tmp.path().join("ready"), 1 << 30).keeping(1);
    let ready = cache.repository("acme", "widgets").unwrap();

    // First start: packed from the clone, and kept.
    let first = tmp.path().join("first");
    clone_tip(&mirrors, &url, &first);
    let sb = start(&engine, &tip_spec("ready", &first, &ready)).await;
    let fresh = listing(&sb).await;
    assert!(fresh.contains("Initial commit"), "{fresh}");
    let fresh_changes = edit_and_changes(&sb).await;
    sb.destroy().await.unwrap();
    let entries = kept(&cache);
    assert_eq!(entries.len(), 1, "{entries:?}");

    // Second start, from another clone of the same tip whose objects are gone: only the
    // ready checkout can give it a workspace, and it is the same.
    let second = tmp.path().join("second");
    clone_tip(&mirrors, &url, &second);
    remove_objects(&second);
    let sb = start(&engine, &tip_spec("ready", &second, &ready)).await;
    assert_eq!(listing(&sb).await, fresh);
    assert_eq!(edit_and_changes(&sb).await, fresh_changes);
    assert_eq!(
        fresh_changes,
        [
            "added added.txt",
            "deleted docs/guide.md",
            "modified README.md",
            "modified run.sh"
        ]
    );
    sb.destroy().await.unwrap();
    assert_eq!(kept(&cache), entries, "a hit writes nothing");

    // A new tip: packed again (its clone has its objects), never the old tar; keeping one
    // entry per repository, the old tip's goes.
    srv.commit_on_branch(
        REPO,
        "main",
        &[("README.md", b"# Widgets, second edition\n", 0o644)],
        "Second edition",
    );
    let third = tmp.path().join("third");
    clone_tip(&mirrors, &url, &third);
    let sb = start(&engine, &tip_spec("ready", &third, &ready)).await;
    assert_eq!(
        run(&sb, "cat README.md; git log --format=%s").await,
        "# Widgets, second edition\nSecond edition\n"
    );
    sb.destroy().await.unwrap();
    let now = kept(&cache);
    assert_eq!(now.len(), 1, "{now:?}");
    assert_ne!(now, entries, "the old tip's entry was evicted");

    // The old tip again, without objects: its entry is gone, so the start fails.
    let old = tmp.path().join("old");
    std::fs::rename(&second, &old).unwrap();
    let spec = tip_spec("ready", &old, &ready);
    assert!(engine.start(&spec).await.is_err());
    common::assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn a_pack_that_fails_midway_keeps_nothing() {
    let engine = common::require_engine!();
    let srv = GitServer::start(accept_tokens(&[TOKEN]));
    let big = vec![b'x'; 256 << 10];
    let url = srv.create_repo(
        REPO,
        "main",
        &[("a.txt", b"a\n", 0o644), ("z/big.bin", &big, 0o644)],
    );
    let tmp = tempfile::tempdir().unwrap();
    let mirrors = RepoCache::new(tmp.path().join("mirrors"), 1 << 30);
    let cache = ReadyCache::new(tmp.path().join("ready"), 1 << 30);
    let ready = cache.repository("acme", "widgets").unwrap();
    let clone = tmp.path().join("clone");
    clone_tip(&mirrors, &url, &clone);

    // The last blob is over the limit: the tar is cut after `.git` and a.txt went in.
    let mut spec = tip_spec("ready-cut", &clone, &ready);
    spec.archive_limits.max_file_bytes = 128 << 10;
    let failed = engine.start(&spec).await.err().expect("the pack fails");
    assert!(failed.to_string().contains("big.bin"), "{failed}");
    common::assert_gone(&engine, &spec.run_id).await;
    let dir = tmp.path().join("ready/acme/widgets");
    let left: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "no entry, no temporary file: {left:?}");

    // Within the limit: kept.
    spec.archive_limits.max_file_bytes = 1 << 20;
    spec.run_id = run_id("ready-cut");
    let sb = start(&engine, &spec).await;
    sb.destroy().await.unwrap();
    assert_eq!(kept(&cache).len(), 1);
}
