//! The setup cache against the real Docker engine: a miss then a hit that skips the script,
//! the key following the lockfiles, the repository or program turning it off, a failed
//! setup left out, eviction by count, two runs at once, the hit's workspace being exactly
//! its own checkout, and a served run saying "hit". Plus the 20 s setup benchmark (ignored).
//!
//! Every image a test makes carries its own scope (unique per test), and is removed at the
//! end. Eviction works over all cached images on the engine: the eviction test holds an
//! exclusive lock, the others a shared one, so it never removes what another test needs.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::fake_anthropic::feed_chars as tool;
use crate::common::*;
use bollard::query_parameters::{ListImagesOptions, RemoveImageOptions};
use kodx::sandbox::setup_cache::{KEY_LABEL, SCOPE_LABEL};
use kodx::sandbox::{Engine, RepoSource, Sandbox, SandboxSpec, SetupCacheSpec, SetupCacheUse};

/// Held while a test relies on cached images staying (shared) or evicts (exclusive).
pub(crate) fn cache_lock(exclusive: bool) -> std::fs::File {
    let path = std::env::temp_dir().join("kodx-setup-cache-tests.lock");
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap();
    use std::os::fd::AsRawFd;
    let op = if exclusive {
        libc::LOCK_EX
    } else {
        libc::LOCK_SH
    };
    // SAFETY: flock on a descriptor this function owns; released when the file closes.
    assert_eq!(unsafe { libc::flock(f.as_raw_fd(), op) }, 0, "locking");
    f
}

fn scope(test: &str) -> String {
    format!("test/{test}-{:08x}", rand::random::<u32>())
}

fn cached_spec(test: &str, scope: &str, repo: &Path, script: &str) -> SandboxSpec {
    let mut spec = common::spec(test);
    spec.repo_dir = Some(repo.to_path_buf());
    spec.setup_script = Some(script.to_string());
    let mut cache = SetupCacheSpec::new(scope);
    // Unbounded here: only the eviction test evicts.
    cache.max_images = 0;
    cache.max_bytes = 0;
    spec.setup_cache = Some(cache);
    spec
}

fn put(dir: &Path, rel: &str, text: &str) {
    let path = dir.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
}

/// Cached images made for `scope`: (id, tags).
async fn images_of(engine: &Engine, scope: &str) -> Vec<(String, Vec<String>)> {
    engine
        .docker()
        .list_images(Some(ListImagesOptions {
            all: false,
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![format!("{SCOPE_LABEL}={scope}")],
            )])),
            ..Default::default()
        }))
        .await
        .unwrap()
        .into_iter()
        .map(|i| (i.id, i.repo_tags))
        .collect()
}

async fn remove_images_of(engine: &Engine, scope: &str) {
    for (id, _) in images_of(engine, scope).await {
        let _ = engine
            .docker()
            .remove_image(
                &id,
                Some(RemoveImageOptions {
                    force: true,
                    ..Default::default()
                }),
                None,
            )
            .await;
    }
}

/// The change set against the copied-in checkout, one line per path.
async fn changes(sb: &impl Sandbox) -> Vec<String> {
    common::change_lines(sb).await
}

async fn run(sb: &impl Sandbox, command: &str) -> String {
    sb.feed_chars("default", command, 20 * SEC)
        .await
        .unwrap()
        .output
}

/// Counts the setup's runs outside the workspace: /var/tmp is in the committed image too,
/// so a cached run would see the count the setup left.
const SCRIPT: &str = "set -e\necho run >> /var/tmp/setup-runs\nmkdir -p node_modules/left\n\
                      echo m > node_modules/left/m.js\necho made > made-by-setup.txt\n\
                      echo tracked-changed-by-setup > a.txt\n";

fn repo() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    put(
        dir.path(),
        "package-lock.json",
        "{\"lockfileVersion\": 3}\n",
    );
    put(dir.path(), ".gitignore", "node_modules/\n");
    put(dir.path(), "a.txt", "a one\n");
    put(dir.path(), "b.txt", "b one\n");
    put(dir.path(), "old/dir/gone.txt", "gone\n");
    dir
}

#[tokio::test]
async fn a_miss_then_a_hit_skips_the_script_and_shows_exactly_the_new_checkout() {
    let engine = common::require_engine!();
    let _lock = cache_lock(false);
    let scope = scope("hit");
    let repo = repo();
    let spec = cached_spec("cache-miss", &scope, repo.path(), SCRIPT);
    let sb = start(&engine, &spec).await;
    assert_eq!(sb.setup_report().cache, SetupCacheUse::Miss);
    assert!(sb.setup_report().took.is_some());
    let fresh_changes = changes(&sb).await;
    let first_host = engine
        .docker()
        .inspect_container(sb.container_id(), None)
        .await
        .unwrap()
        .host_config
        .unwrap();
    sb.destroy().await.unwrap();
    let images = images_of(&engine, &scope).await;
    assert_eq!(images.len(), 1, "{images:?}");
    assert!(images[0].1[0].starts_with("kodx-setup:"), "{images:?}");

    // The image carries the base image's user, entrypoint and environment, no kodx run
    // label, nothing of the container.
    let base = engine.docker().inspect_image(&image()).await.unwrap();
    let cached = engine.docker().inspect_image(&images[0].0).await.unwrap();
    let (bc, cc) = (base.config.unwrap(), cached.config.unwrap());
    assert_eq!(bc.env, cc.env);
    assert_eq!(bc.user.unwrap_or_default(), cc.user.unwrap_or_default());
    // No entrypoint either way (the engine writes the container's empty one).
    assert_eq!(
        bc.entrypoint.unwrap_or_default(),
        cc.entrypoint.unwrap_or_default()
    );
    assert_eq!(bc.cmd, cc.cmd);
    let labels = cc.labels.unwrap();
    for label in ["kodx.run", "kodx.owner", "kodx.process", "kodx.instance"] {
        assert_eq!(labels.get(label).map(String::as_str), Some(""), "{label}");
    }
    assert_eq!(labels[KEY_LABEL].len(), 64);

    // The next checkout: a.txt changed, b.txt and old/ gone, c.txt new; same lockfile.
    std::fs::remove_file(repo.path().join("b.txt")).unwrap();
    std::fs::remove_dir_all(repo.path().join("old")).unwrap();
    put(repo.path(), "a.txt", "a two\n");
    put(repo.path(), "c.txt", "c\n");
    let mut spec = cached_spec("cache-hit", &scope, repo.path(), SCRIPT);
    spec.disable_network_after_setup = true;
    let sb = start(&engine, &spec).await;
    assert_eq!(sb.setup_report().cache, SetupCacheUse::Hit);
    assert_eq!(run(&sb, "cat /var/tmp/setup-runs").await, "run\n");
    let listing = run(
        &sb,
        "find . -path ./node_modules -prune -o -print | sort; cat a.txt; ls node_modules/left",
    )
    .await;
    assert_eq!(
        listing,
        ".\n./.gitignore\n./a.txt\n./c.txt\n./made-by-setup.txt\n./package-lock.json\n\
         a two\nm.js\n"
    );
    // What the setup made shows as it does after a fresh setup: the ignored tree not at
    // all, the rest as added. The setup's edit of a tracked file the new checkout changed
    // gives way to the new version.
    let changes = changes(&sb).await;
    assert_eq!(fresh_changes, ["added made-by-setup.txt", "modified a.txt"]);
    assert_eq!(changes, ["added made-by-setup.txt"]);
    // Hardened as a fresh container, and the network cut applies.
    let hit_host = engine
        .docker()
        .inspect_container(sb.container_id(), None)
        .await
        .unwrap()
        .host_config
        .unwrap();
    assert_eq!(first_host.cap_drop, hit_host.cap_drop);
    assert_eq!(first_host.cap_add, hit_host.cap_add);
    assert_eq!(first_host.security_opt, hit_host.security_opt);
    assert_eq!(first_host.privileged, hit_host.privileged);
    assert_eq!(first_host.pids_limit, hit_host.pids_limit);
    assert_eq!(first_host.memory, hit_host.memory);
    assert_eq!(run(&sb, "ls /sys/class/net").await, "lo\n");
    sb.destroy().await.unwrap();
    assert_gone(&engine, &spec.run_id).await;
    remove_images_of(&engine, &scope).await;
}

/// A setup that leaves a file inside a directory of the checkout, and edits a tracked file
/// the next checkout does not change.
const DELTA_SCRIPT: &str = "set -e\necho run >> /var/tmp/setup-runs\nmkdir -p node_modules\n\
                            echo m > node_modules/m.js\necho built > lib/built.o\n\
                            echo edited-by-setup > same.txt\n";

/// The checkouts of the delta test: `first`, then what the second changes.
fn delta_tree(dir: &Path, second: bool) {
    use std::os::unix::fs::PermissionsExt as _;
    let _ = std::fs::remove_dir_all(dir.join("lib"));
    let _ = std::fs::remove_dir_all(dir.join("flip"));
    let _ = std::fs::remove_dir_all(dir.join("flop"));
    for rel in [
        "changed.txt",
        "gone.txt",
        "added.txt",
        "link",
        "run.sh",
        "flip",
        "flop",
    ] {
        let _ = std::fs::remove_file(dir.join(rel));
    }
    put(dir, "package-lock.json", "{\"lockfileVersion\": 3}\n");
    put(dir, ".gitignore", "node_modules/\n*.o\n");
    put(dir, "same.txt", "same\n");
    for n in 0..300 {
        put(dir, &format!("many/f{n}.txt"), &format!("file {n}\n"));
    }
    put(dir, "run.sh", "echo hi\n");
    if !second {
        put(dir, "changed.txt", "one\n");
        put(dir, "gone.txt", "gone\n");
        put(dir, "lib/src.c", "int x;\n");
        put(dir, "flip/inside.txt", "a directory first\n");
        put(dir, "flop", "a file first\n");
        std::os::unix::fs::symlink("same.txt", dir.join("link")).unwrap();
    } else {
        put(dir, "changed.txt", "two\n");
        put(dir, "added.txt", "new\n");
        put(dir, "flip", "a file now\n");
        put(dir, "flop/inside.txt", "a directory now\n");
        std::os::unix::fs::symlink("added.txt", dir.join("link")).unwrap();
        std::fs::set_permissions(dir.join("run.sh"), std::fs::Permissions::from_mode(0o755))
            .unwrap();
    }
}

fn commit_all(dir: &Path, message: &str) {
    let repo = git2::Repository::open(dir).unwrap_or_else(|_| git2::Repository::init(dir).unwrap());
    let mut index = repo.index().unwrap();
    index
        .add_all(["*"], git2::IndexAddOption::FORCE, None)
        .unwrap();
    index.update_all(["*"], None).unwrap();
    index.write().unwrap();
    let tree = repo.find_tree(index.write_tree().unwrap()).unwrap();
    let sig = git2::Signature::now("t", "t@example.com").unwrap();
    let parent = repo.head().ok().and_then(|h| h.peel_to_commit().ok());
    let parents: Vec<&git2::Commit> = parent.iter().collect();
    repo.commit(Some("HEAD"), &sig, &sig, message, &tree, &parents)
        .unwrap();
}

/// A hit copies in only what its checkout has different from the image's, and deletes
/// what it no longer has: every kind of change (edited, added, deleted, mode, symlink
/// target, file to directory and back) comes out as the new checkout, files the two
/// checkouts share are not written again, and the workspace is what a fresh setup on the
/// new checkout would give (what the setup made stays, its edit of an unchanged tracked
/// file too). From a directory (`kodx run`) and from a clone's tip (`kodx serve`).
#[tokio::test]
async fn a_hit_writes_only_what_the_new_checkout_changed() {
    let engine = common::require_engine!();
    let _lock = cache_lock(false);
    for source in [RepoSource::Files, RepoSource::GitTip] {
        let scope = scope("delta");
        let repo = tempfile::tempdir().unwrap();
        delta_tree(repo.path(), false);
        if source == RepoSource::GitTip {
            commit_all(repo.path(), "first");
        }
        let mut spec = cached_spec("cache-delta", &scope, repo.path(), DELTA_SCRIPT);
        spec.repo_source = source;
        let sb = start(&engine, &spec).await;
        assert_eq!(sb.setup_report().cache, SetupCacheUse::Miss);
        let fresh_changes = changes(&sb).await;
        sb.destroy().await.unwrap();

        delta_tree(repo.path(), true);
        if source == RepoSource::GitTip {
            commit_all(repo.path(), "second");
        }
        // Whole seconds: `stat -c %Z` below. Wait for the second after the writes above.
        let now = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        };
        let written = now();
        while now() == written {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        let before = now();
        spec.run_id = run_id("cache-delta");
        let sb = start(&engine, &spec).await;
        assert_eq!(sb.setup_report().cache, SetupCacheUse::Hit, "{source:?}");
        assert_eq!(run(&sb, "cat /var/tmp/setup-runs").await, "run\n");
        let listing = run(
            &sb,
            "find . -path ./.git -prune -o -path ./many -prune -o -print | sort; ls many | wc -l; \
             cat changed.txt added.txt flip flop/inside.txt same.txt; readlink link; \
             stat -c %a run.sh; cat lib/built.o; ls node_modules",
        )
        .await;
        assert_eq!(
            listing,
            ".\n./.gitignore\n./added.txt\n./changed.txt\n./flip\n./flop\n./flop/inside.txt\n\
             ./lib\n./lib/built.o\n./link\n./node_modules\n./node_modules/m.js\n\
             ./package-lock.json\n./run.sh\n./same.txt\n300\n\
             two\nnew\na file now\na directory now\nedited-by-setup\nadded.txt\n755\nbuilt\nm.js\n",
            "{source:?}"
        );
        // Written again: what changed. Not: the 300 files both checkouts share.
        let rewritten = run(
            &sb,
            &format!(
                "for f in .gitignore package-lock.json many/*; do \
                 [ $(stat -c %Z \"$f\") -ge {before} ] && echo \"$f\"; done; \
                 for f in changed.txt added.txt flip flop/inside.txt; do \
                 [ $(stat -c %Z \"$f\") -ge {before} ] || echo \"old $f\"; done; true"
            ),
        )
        .await;
        assert_eq!(rewritten, "", "{source:?}");
        // As after a fresh setup: the setup's edit of a file both checkouts share shows.
        assert!(
            fresh_changes.contains(&"modified same.txt".to_string()),
            "{fresh_changes:?}"
        );
        assert_eq!(changes(&sb).await, ["modified same.txt"], "{source:?}");
        if source == RepoSource::GitTip {
            // The clone's tip, not the image's: git agrees with the files.
            assert_eq!(
                run(&sb, "git log --format=%s; git status --porcelain").await,
                "second\n M same.txt\n",
                "{source:?}"
            );
        }
        sb.destroy().await.unwrap();
        remove_images_of(&engine, &scope).await;
    }
}

#[tokio::test]
async fn a_changed_lockfile_or_named_key_file_misses() {
    let engine = common::require_engine!();
    let _lock = cache_lock(false);
    let scope = scope("key");
    let repo = repo();
    put(repo.path(), "tools/versions.txt", "node 20\n");
    let mut spec = cached_spec("cache-key", &scope, repo.path(), SCRIPT);
    spec.setup_cache.as_mut().unwrap().key_files = vec!["tools/*.txt".into()];
    let uses = |sb: &kodx::sandbox::DockerSandbox| sb.setup_report().cache;
    let mut seen = Vec::new();
    for change in [
        None,
        Some(("package-lock.json", "{\"lockfileVersion\": 3, \"x\": 1}\n")),
        None,
        Some(("tools/versions.txt", "node 22\n")),
        // Not a key file: still a hit.
        Some(("a.txt", "other\n")),
    ] {
        if let Some((path, text)) = change {
            put(repo.path(), path, text);
        }
        spec.run_id = run_id("cache-key");
        let sb = start(&engine, &spec).await;
        seen.push(uses(&sb));
        sb.destroy().await.unwrap();
    }
    use SetupCacheUse::*;
    assert_eq!(seen, [Miss, Miss, Hit, Miss, Hit]);
    assert_eq!(images_of(&engine, &scope).await.len(), 3);
    remove_images_of(&engine, &scope).await;
}

#[tokio::test]
async fn without_the_cache_the_script_runs_every_time_and_nothing_is_kept() {
    let engine = common::require_engine!();
    let _lock = cache_lock(false);
    let scope = scope("off");
    let repo = repo();
    let mut spec = cached_spec("cache-off", &scope, repo.path(), SCRIPT);
    spec.setup_cache = None;
    for _ in 0..2 {
        spec.run_id = run_id("cache-off");
        let sb = start(&engine, &spec).await;
        assert_eq!(sb.setup_report().cache, SetupCacheUse::Off);
        assert_eq!(run(&sb, "cat /var/tmp/setup-runs").await, "run\n");
        sb.destroy().await.unwrap();
    }
    assert!(images_of(&engine, &scope).await.is_empty());
}

#[tokio::test]
async fn a_failed_setup_is_not_cached() {
    let engine = common::require_engine!();
    let _lock = cache_lock(false);
    let scope = scope("fail");
    let repo = repo();
    let spec = cached_spec(
        "cache-fail",
        &scope,
        repo.path(),
        "echo run >> /var/tmp/setup-runs\nexit 4\n",
    );
    let err = engine.start(&spec).await.err().expect("setup fails");
    assert_eq!(err.stop_reason(), "setup_failed", "{err}");
    assert!(images_of(&engine, &scope).await.is_empty());
    assert_gone(&engine, &spec.run_id).await;
}

#[tokio::test]
async fn two_runs_with_one_key_at_once_both_set_up_and_one_image_stays() {
    let engine = common::require_engine!();
    let _lock = cache_lock(false);
    let scope = scope("race");
    let repo = repo();
    let a = cached_spec("cache-race-a", &scope, repo.path(), SCRIPT);
    let b = cached_spec("cache-race-b", &scope, repo.path(), SCRIPT);
    let (sa, sb) = tokio::join!(engine.start(&a), engine.start(&b));
    let (sa, sb) = (sa.unwrap(), sb.unwrap());
    assert_eq!(sa.setup_report().cache, SetupCacheUse::Miss);
    assert_eq!(sb.setup_report().cache, SetupCacheUse::Miss);
    sa.destroy().await.unwrap();
    sb.destroy().await.unwrap();
    let tagged: Vec<_> = images_of(&engine, &scope)
        .await
        .into_iter()
        .filter(|(_, tags)| tags.iter().any(|t| t.starts_with("kodx-setup:")))
        .collect();
    assert_eq!(tagged.len(), 1, "{tagged:?}");
    let c = cached_spec("cache-race-c", &scope, repo.path(), SCRIPT);
    let sc = start(&engine, &c).await;
    assert_eq!(sc.setup_report().cache, SetupCacheUse::Hit);
    sc.destroy().await.unwrap();
    remove_images_of(&engine, &scope).await;
}

#[tokio::test]
async fn eviction_keeps_the_most_recently_used_within_the_count() {
    let engine = common::require_engine!();
    let _lock = cache_lock(true);
    let scopes: Vec<String> = (0..3).map(|i| scope(&format!("evict{i}"))).collect();
    let repo = repo();
    for (i, scope) in scopes.iter().enumerate() {
        if i == 2 {
            // The first is used again: the second is now the least recently used.
            let spec = cached_spec("cache-evict", &scopes[0], repo.path(), SCRIPT);
            let sb = start(&engine, &spec).await;
            assert_eq!(sb.setup_report().cache, SetupCacheUse::Hit);
            sb.destroy().await.unwrap();
        }
        let mut spec = cached_spec("cache-evict", scope, repo.path(), SCRIPT);
        spec.setup_cache.as_mut().unwrap().max_images = 2;
        let sb = start(&engine, &spec).await;
        assert_eq!(sb.setup_report().cache, SetupCacheUse::Miss);
        sb.destroy().await.unwrap();
    }
    let mut left = vec![0; scopes.len()];
    for (i, scope) in scopes.iter().enumerate() {
        left[i] = images_of(&engine, scope).await.len();
    }
    assert_eq!(left, [1, 0, 1]);
    let all = engine
        .docker()
        .list_images(Some(ListImagesOptions {
            filters: Some(HashMap::from([(
                "label".to_string(),
                vec![KEY_LABEL.to_string()],
            )])),
            ..Default::default()
        }))
        .await
        .unwrap();
    assert!(all.len() <= 2, "{} cached images", all.len());
    for scope in &scopes {
        remove_images_of(&engine, scope).await;
    }
}

/// The issue's target: a setup script of 20 s (`sleep 20` plus an install); the second
/// run's container is ready in 1.5 s at most. Run with
/// `cargo test --release --test it sandbox_setup_cache:: -- --ignored --nocapture`.
#[tokio::test]
#[ignore = "benchmark: 20 s setup, first and second container-ready time"]
async fn bench_setup_cache_second_run_ready() {
    let engine = common::require_engine!();
    let _lock = cache_lock(false);
    let scope = scope("bench");
    let repo = tempfile::tempdir().unwrap();
    put(repo.path(), "requirements.txt", "six\n");
    for i in 0..2000 {
        put(
            repo.path(),
            &format!("src/d{}/f{i}.py", i % 50),
            &format!("X = {i}\n"),
        );
    }
    // The install: 200 packages' worth of files in a virtualenv (no index is reachable).
    let script = "set -e\nsleep 20\nmkdir -p .venv/bin\n\
                  for i in $(seq 1 200); do mkdir -p .venv/lib/pkg$i; \
                  head -c 20000 /dev/urandom > .venv/lib/pkg$i/mod.so; done\n";
    let mut times = Vec::new();
    for i in 0..3 {
        let spec = cached_spec("cache-bench", &scope, repo.path(), script);
        let started = Instant::now();
        let sb = start(&engine, &spec).await;
        let took = started.elapsed();
        let report = sb.setup_report();
        println!(
            "run {}: container ready in {:>7.0} ms  (setup cache {}, setup {:?})",
            i + 1,
            took.as_secs_f64() * 1000.0,
            report.cache.as_str(),
            report.took.unwrap_or_default()
        );
        times.push((report.cache, took));
        sb.destroy().await.unwrap();
    }
    remove_images_of(&engine, &scope).await;
    assert_eq!(times[0].0, SetupCacheUse::Miss);
    assert_eq!(times[1].0, SetupCacheUse::Hit);
    let second = times[1].1;
    let ok = second <= Duration::from_millis(1500);
    println!(
        "first run ready {:.1} s; second run ready {:.0} ms  target <= 1500 ms: {}",
        times[0].1.as_secs_f64(),
        second.as_secs_f64() * 1000.0,
        if ok { "ok" } else { "MISSED" }
    );
}

/// Through `kodx serve`: the repository's setup script runs on the first run only; each
/// run's result says `setup_cache` miss then hit with a `setup` / `setup (cached)` timing,
/// and no secret of the server is in any cached image's config.
#[tokio::test]
async fn a_served_run_says_whether_the_setup_came_from_the_cache() {
    use crate::common::serve::{usage, Served, REPO};
    let engine = common::require_engine!();
    let _lock = cache_lock(false);
    let mut s = Served::with_workers().await;
    s.github.set_file(
        REPO,
        ".github/kodx.yml",
        "setup_script: |\n  echo run >> /var/tmp/setup-runs\n",
    );
    let mut runs = Vec::new();
    let mut bodies = Vec::new();
    for issue in [7, 8] {
        s.github
            .add_issue(REPO, issue, "Setup", "Check it.", "carol");
        s.model.reply(
            vec![tool("t1", "cat /var/tmp/setup-runs")],
            "tool_use",
            usage(1000, 20),
        );
        s.model
            .answer_from_last_tool_result(|out| format!("RUNS(({out}))"));
        let run = s
            .comment(issue, "alice", "/kodx ask how often did setup run?")
            .await;
        let body = s
            .bot_comment_where(issue, "the run's end", |c| c.body.contains("RUNS(("))
            .await
            .body;
        bodies.push(body);
        runs.push(run);
    }
    let ids = [runs[0].0.as_str(), runs[1].0.as_str()];
    let settings = crate::common::serve::redactions(&ids, &[]);
    settings.bind(|| {
        insta::assert_snapshot!(bodies[0], @r#"
    <!-- kodx:{"run":"[run]","v":1} -->
    ### ✅ answered

    > /kodx ask how often did setup run?

    RUNS((run
    [exit status: 0]))

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 2,200 | 60 | 0 | 0 | $0.0075 of $1.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code> · setup ran in [duration] (not cached yet)</sub>
    "#)
    });
    settings.bind(|| {
        insta::assert_snapshot!(bodies[1], @r#"
    <!-- kodx:{"run":"[run]","v":1} -->
    ### ✅ answered

    > /kodx ask how often did setup run?

    RUNS((run
    [exit status: 0]))

    | model | API calls | input | output | cache write | cache read | cost | duration | stop |
    |---|--:|--:|--:|--:|--:|--:|--:|---|
    | claude-sonnet-4-5 | 2 | 2,200 | 60 | 0 | 0 | $0.0075 of $1.00 | [duration] (agent [duration]) | `end_turn` |

    <sub>kodx run <code>[run]</code> · setup from the cache in [duration]</sub>
    "#)
    });
    // Opened once the server has made its database.
    let db = s.db().await;
    let mut results = Vec::new();
    for run in runs {
        let row = loop {
            let row = db.get_run(&run.0).await.unwrap().unwrap();
            if row.status.is_final() {
                break row;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        let value: serde_json::Value =
            serde_json::from_str(row.result.as_deref().unwrap_or("{}")).unwrap();
        results.push(value);
    }
    assert_eq!(results[0]["setup_cache"], "miss", "{}", results[0]);
    assert!(results[0]["timings_ms"]["setup"].is_u64(), "{}", results[0]);
    assert_eq!(results[1]["setup_cache"], "hit", "{}", results[1]);
    assert!(
        results[1]["timings_ms"]["setup (cached)"].is_u64(),
        "{}",
        results[1]
    );
    assert!(
        results[1]["timings_ms"].get("setup").is_none(),
        "{}",
        results[1]
    );
    s.finish().await;
    // No secret of the server went into a cached image: its whole config, as the engine
    // keeps it.
    let images = images_of(&engine, REPO).await;
    assert!(!images.is_empty());
    for (id, _) in &images {
        let inspect = engine.docker().inspect_image(id).await.unwrap();
        let text = serde_json::to_string(&inspect).unwrap();
        for secret in [
            common::serve::SECRET,
            common::serve::MODEL_KEY,
            "PRIVATE KEY",
            "ghs_",
            "x-access-token",
        ] {
            assert!(!text.contains(secret), "{secret} in {id}: {text}");
        }
    }
}

/// `kodx run --setup-cache`: the second run on the same checkout skips the script and says
/// so; the shell sees the setup's one run.
#[tokio::test]
async fn kodx_run_with_setup_cache_skips_the_script_the_second_time() {
    use crate::common::fake_anthropic::FakeAnthropic;
    let engine = common::require_engine!();
    let _lock = cache_lock(false);
    const KEY: &str = "sk-ant-cli-test-0123456789";
    let fake = FakeAnthropic::start(KEY).await;
    let repo = repo();
    let dir = tempfile::tempdir().unwrap();
    let setup = dir.path().join("setup.sh");
    std::fs::write(&setup, "echo run >> /var/tmp/setup-runs\n").unwrap();
    let mut stderrs = Vec::new();
    for i in 0..2 {
        fake.reply(
            vec![tool(&format!("t{i}"), "cat /var/tmp/setup-runs")],
            "tool_use",
            common::serve::usage(100, 5),
        );
        fake.answer_from_last_tool_result(|out| format!("RUNS<<{out}>>"));
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_kodx"))
            .env("ANTHROPIC_BASE_URL", &fake.url)
            .env("ANTHROPIC_API_KEY", KEY)
            .env("KODX_IMAGE", image())
            .env_remove("KODX_PRICING")
            .stdin(std::process::Stdio::null())
            .args(["run", "-p", "how often did setup run?", "--setup-cache"])
            .arg("--repo-dir")
            .arg(repo.path())
            .arg("--setup-script")
            .arg(&setup)
            .output()
            .await
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr).to_string();
        assert_eq!(output.status.code(), Some(0), "{stderr}");
        assert!(
            String::from_utf8_lossy(&output.stdout).contains("RUNS<<run\n[exit status: 0]>>"),
            "{}",
            String::from_utf8_lossy(&output.stdout)
        );
        stderrs.push(stderr);
    }
    assert!(!stderrs[0].contains("setup cache"), "{}", stderrs[0]);
    assert!(
        stderrs[1].contains("the setup came from the setup cache"),
        "{}",
        stderrs[1]
    );
    let scope = std::fs::canonicalize(repo.path())
        .unwrap()
        .display()
        .to_string();
    assert_eq!(images_of(&engine, &scope).await.len(), 1);
    remove_images_of(&engine, &scope).await;
}
