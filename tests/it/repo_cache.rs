//! kodx::repo_cache against a real smart-HTTP server (`git http-backend` behind basic
//! auth): mirrors, incremental refreshes, clones from the mirror, eviction, concurrent runs,
//! and a fetch killed (SIGKILL, in a child process) midway.

use crate::common::{contains, git_server};

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use git_server::{accept_tokens, basic_auth, GitServer};
use kodx::git::{Checkout, GitError};
use kodx::repo_cache::{CacheError, Recovery, RepoCache, RepoKey};
use kodx::sandbox::archive::{self, ArchiveLimits};

const TOKEN: &str = "ghs_TestInstallationToken0123456789abcd";
const REPO: &str = "acme/widgets";

fn server() -> GitServer {
    assert!(
        git_server::git_available(),
        "these tests need the git CLI (with http-backend); install git"
    );
    GitServer::start(accept_tokens(&[TOKEN]))
}

fn widgets(srv: &GitServer) -> String {
    srv.create_repo(
        REPO,
        "main",
        &[
            ("README.md", b"# Widgets\n", 0o644),
            ("scripts/run.sh", b"#!/bin/sh\necho hi\n", 0o755),
            ("docs/link", b"../README.md", 0o120000),
        ],
    )
}

fn key(name: &str) -> RepoKey {
    RepoKey::parse(name).unwrap()
}

/// Upload-pack POSTs so far: the requests that download objects.
fn downloads(srv: &GitServer) -> usize {
    srv.requests()
        .iter()
        .filter(|r| r.method == "POST" && r.path_and_query.ends_with("/git-upload-pack"))
        .count()
}

fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries {
            let entry = entry.unwrap();
            let ft = entry.file_type().unwrap();
            if ft.is_dir() {
                stack.push(entry.path());
            } else if ft.is_file() {
                out.push(entry.path());
            }
        }
    }
    out
}

/// Fails if the token (plain or as a basic-auth header) is in any file under `dir`, or
/// was ever in a request's URL.
fn assert_no_token(srv: &GitServer, dir: &Path) {
    let header = basic_auth("x-access-token", TOKEN);
    let encoded = header.trim_start_matches("Basic ");
    let files = files_under(dir);
    assert!(files.len() > 5, "expected git files under {dir:?}");
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        assert!(!contains(&bytes, TOKEN.as_bytes()), "token in {f:?}");
        assert!(!contains(&bytes, encoded.as_bytes()), "token in {f:?}");
    }
    for r in srv.requests() {
        assert!(!r.path_and_query.contains(TOKEN), "token in URL: {r:?}");
    }
}

/// `git <args>` in `dir`, isolated from the host's configuration; its trimmed stdout.
fn git(srv: &GitServer, dir: &Path, args: &[&str]) -> String {
    String::from_utf8(srv.git(dir, args).stdout)
        .unwrap()
        .trim()
        .to_string()
}

#[test]
fn mirror_is_made_once_then_refreshed_incrementally() {
    let srv = server();
    let url = widgets(&srv);
    let tmp = tempfile::tempdir().unwrap();
    let cache = RepoCache::new(tmp.path().join("mirrors"), 1 << 30);
    let k = key("Acme/Widgets");

    // Cold: the mirror is made, and the run's clone comes from it.
    let first = tmp.path().join("run1");
    let c1 = cache
        .checkout(&k, &url, TOKEN, &Checkout::DefaultBranch, &first, true)
        .unwrap();
    let main1 = srv.branch_sha(REPO, "main").unwrap();
    assert_eq!(
        (c1.commit.as_str(), c1.branch.as_str()),
        (main1.as_str(), "main")
    );
    assert!(c1.fetched && c1.recovery.is_none());
    assert!(tmp.path().join("mirrors/acme/widgets.git/HEAD").exists());
    assert_eq!(
        std::fs::read(first.join("scripts/run.sh")).unwrap(),
        b"#!/bin/sh\necho hi\n"
    );
    assert_eq!(
        std::fs::read_link(first.join("docs/link")).unwrap(),
        Path::new("../README.md")
    );
    // The clone is what git::clone makes: branch, upstream, origin, a clean status.
    assert_eq!(
        git(&srv, &first, &["symbolic-ref", "HEAD"]),
        "refs/heads/main"
    );
    assert_eq!(git(&srv, &first, &["config", "remote.origin.url"]), url);
    assert_eq!(
        git(
            &srv,
            &first,
            &["rev-parse", "--abbrev-ref", "main@{upstream}"]
        ),
        "origin/main"
    );
    assert_eq!(git(&srv, &first, &["status", "--porcelain"]), "");
    assert_eq!(git(&srv, &first, &["fsck", "--no-dangling"]), "");

    // One new commit on the server: only it comes over.
    let main2 = srv.commit_on_branch(REPO, "main", &[("NEW.md", b"new\n", 0o644)], "new");
    let second = tmp.path().join("run2");
    let c2 = cache
        .checkout(&k, &url, TOKEN, &Checkout::DefaultBranch, &second, true)
        .unwrap();
    assert_eq!(c2.commit, main2);
    assert!(c2.fetched);
    assert!(
        (1..=4).contains(&c2.received_objects),
        "an incremental fetch gets the commit, its trees and the blob: {c2:?}"
    );
    assert_eq!(std::fs::read(second.join("NEW.md")).unwrap(), b"new\n");
    // The first run's clone is its own: still at the old commit, and sound.
    assert_eq!(git(&srv, &first, &["rev-parse", "HEAD"]), main1);
    assert!(!first.join("NEW.md").exists());
    assert_eq!(
        git(&srv, &second, &["log", "--format=%H"]).lines().count(),
        2
    );

    // Nothing new: only the ref list is read, nothing is downloaded.
    let before = downloads(&srv);
    let third = tmp.path().join("run3");
    let c3 = cache
        .checkout(&k, &url, TOKEN, &Checkout::DefaultBranch, &third, true)
        .unwrap();
    assert_eq!(c3.commit, main2);
    assert!(!c3.fetched && c3.received_objects == 0, "{c3:?}");
    assert_eq!(downloads(&srv), before);

    // Runs hard-link the mirror's packs: they cost no bytes on the same filesystem.
    use std::os::unix::fs::MetadataExt;
    let pack = files_under(&third.join(".git/objects/pack"))
        .into_iter()
        .find(|p| p.extension().is_some_and(|e| e == "pack"))
        .unwrap();
    assert!(std::fs::metadata(&pack).unwrap().nlink() >= 2);

    assert_no_token(&srv, tmp.path());
    let mirrors = cache.mirrors().unwrap();
    assert_eq!(mirrors.len(), 1);
    assert_eq!(mirrors[0].key, k);
    assert!(mirrors[0].bytes > 0);
}

#[test]
fn pull_heads_and_branches_come_from_the_mirror() {
    let srv = server();
    let url = widgets(&srv);
    let tmp = tempfile::tempdir().unwrap();
    let cache = RepoCache::new(tmp.path().join("mirrors"), 1 << 30);
    let k = key(REPO);
    cache
        .checkout(
            &k,
            &url,
            TOKEN,
            &Checkout::DefaultBranch,
            &tmp.path().join("a"),
            true,
        )
        .unwrap();

    let head = srv.create_pull_ref(REPO, 7, &[("pr.txt", b"pr\n", 0o644)]);
    let dest = tmp.path().join("pr");
    let c = cache
        .checkout(&k, &url, TOKEN, &Checkout::PullHead(7), &dest, true)
        .unwrap();
    assert_eq!(
        (c.commit.as_str(), c.branch.as_str()),
        (head.as_str(), "pr-7")
    );
    assert!(
        c.received_objects <= 4,
        "only the PR's commit is new: {c:?}"
    );
    assert_eq!(std::fs::read(dest.join("pr.txt")).unwrap(), b"pr\n");

    // The PR's head moves: a second run fetches the new commit and no more.
    let moved = srv.commit(
        REPO,
        "refs/pull/7/head",
        Some("refs/pull/7/head"),
        &[("pr.txt", b"pr v2\n", 0o644)],
        "v2",
    );
    let dest = tmp.path().join("pr2");
    let c = cache
        .checkout(&k, &url, TOKEN, &Checkout::PullHead(7), &dest, true)
        .unwrap();
    assert_eq!(c.commit, moved);
    assert!(c.fetched && (1..=3).contains(&c.received_objects), "{c:?}");

    let tip = srv.commit_on_branch(REPO, "feature/x", &[("f.txt", b"f\n", 0o644)], "f");
    let dest = tmp.path().join("branch");
    let c = cache
        .checkout(
            &k,
            &url,
            TOKEN,
            &Checkout::Branch("feature/x".into()),
            &dest,
            true,
        )
        .unwrap();
    assert_eq!(
        (c.commit.as_str(), c.branch.as_str()),
        (tip.as_str(), "feature/x")
    );
    assert_eq!(
        git(
            &srv,
            &dest,
            &["rev-parse", "--abbrev-ref", "feature/x@{upstream}"]
        ),
        "origin/feature/x"
    );

    let err = cache
        .checkout(
            &k,
            &url,
            TOKEN,
            &Checkout::PullHead(99),
            &tmp.path().join("x"),
            true,
        )
        .unwrap_err();
    assert!(
        matches!(err, CacheError::Git(GitError::RefNotFound(_))),
        "{err}"
    );
    let err = cache
        .checkout(
            &k,
            &url,
            "ghs_wrong",
            &Checkout::DefaultBranch,
            &tmp.path().join("y"),
            true,
        )
        .unwrap_err();
    assert!(matches!(err, CacheError::Git(GitError::Auth)), "{err}");
    // A failed refresh leaves the mirror usable.
    let c = cache
        .checkout(
            &k,
            &url,
            TOKEN,
            &Checkout::DefaultBranch,
            &tmp.path().join("z"),
            true,
        )
        .unwrap();
    assert!(!c.fetched && c.recovery.is_none());
    assert_no_token(&srv, tmp.path());
}

#[test]
fn index_only_clone_goes_into_the_container_from_the_objects() {
    let srv = server();
    let url = widgets(&srv);
    let tmp = tempfile::tempdir().unwrap();
    let cache = RepoCache::new(tmp.path().join("mirrors"), 1 << 30);
    let k = key(REPO);
    let bare = tmp.path().join("bare");
    cache
        .checkout(&k, &url, TOKEN, &Checkout::DefaultBranch, &bare, false)
        .unwrap();
    let names: Vec<_> = std::fs::read_dir(&bare)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [".git"], "no files written on the host");
    let full = tmp.path().join("full");
    cache
        .checkout(&k, &url, TOKEN, &Checkout::DefaultBranch, &full, true)
        .unwrap();

    let limits = ArchiveLimits::default();
    let mut tar = Vec::new();
    let manifest = archive::pack_checkout_to(&bare, "repo", &limits, &mut tar).unwrap();
    let (_, disk) = archive::pack_dir(&full, "repo").unwrap();
    for path in [
        "README.md",
        "scripts",
        "scripts/run.sh",
        "docs/link",
        ".git/config",
    ] {
        assert_eq!(manifest.get(path), disk.get(path), "{path}");
    }
    // What the container gets is a clean clone: git sees no change in it.
    let out = tmp.path().join("container");
    archive::extract(&tar, "repo", &out, &limits).unwrap();
    assert_eq!(git(&srv, &out, &["status", "--porcelain"]), "");
    assert_eq!(git(&srv, &out, &["remote", "get-url", "origin"]), url);
    assert_eq!(
        std::fs::read(out.join("scripts/run.sh")).unwrap(),
        b"#!/bin/sh\necho hi\n"
    );
}

#[test]
fn concurrent_runs_on_one_repository_each_get_a_consistent_clone() {
    let srv = server();
    let url = widgets(&srv);
    let tmp = tempfile::tempdir().unwrap();
    let cache = RepoCache::new(tmp.path().join("mirrors"), 1 << 30);
    let k = key(REPO);
    let results = std::thread::scope(|s| {
        let pusher = s.spawn(|| {
            for i in 0..4 {
                let name = format!("f{i}.txt");
                srv.commit_on_branch(REPO, "main", &[(&name, name.as_bytes(), 0o644)], "more");
            }
        });
        let runs: Vec<_> = (0..6)
            .map(|i| {
                let (cache, k, url) = (&cache, &k, &url);
                let dest = tmp.path().join(format!("run{i}"));
                s.spawn(move || {
                    let c = cache
                        .checkout(k, url, TOKEN, &Checkout::DefaultBranch, &dest, true)
                        .unwrap();
                    (dest, c)
                })
            })
            .collect();
        pusher.join().unwrap();
        runs.into_iter()
            .map(|r| r.join().unwrap())
            .collect::<Vec<_>>()
    });
    for (dest, c) in results {
        // HEAD is the commit reported, and the files are that commit's.
        assert_eq!(git(&srv, &dest, &["rev-parse", "HEAD"]), c.commit);
        assert_eq!(git(&srv, &dest, &["status", "--porcelain"]), "");
        for (_, path) in srv.ls_tree(REPO, &c.commit) {
            let want = srv.file_at(REPO, &c.commit, &path).unwrap();
            if path != "docs/link" {
                assert_eq!(std::fs::read(dest.join(&path)).unwrap(), want, "{path}");
            }
        }
        assert_eq!(git(&srv, &dest, &["fsck", "--no-dangling"]), "");
    }
    // A run after the pushes sees the last one.
    let c = cache
        .checkout(
            &k,
            &url,
            TOKEN,
            &Checkout::DefaultBranch,
            &tmp.path().join("last"),
            true,
        )
        .unwrap();
    assert_eq!(Some(c.commit), srv.branch_sha(REPO, "main"));
}

#[test]
fn least_recently_used_mirrors_are_evicted_but_never_one_in_use() {
    let srv = server();
    for name in ["acme/one", "acme/two", "acme/three"] {
        srv.create_repo(name, "main", &[("x.txt", name.as_bytes(), 0o644)]);
    }
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("mirrors");
    // Room for about two mirrors.
    let big = RepoCache::new(&root, u64::MAX);
    let co = |cache: &RepoCache, name: &str, dest: &str| {
        cache
            .checkout(
                &key(name),
                &srv.clone_url(name),
                TOKEN,
                &Checkout::DefaultBranch,
                &tmp.path().join(dest),
                false,
            )
            .unwrap()
    };
    co(&big, "acme/one", "1");
    std::thread::sleep(Duration::from_millis(20));
    co(&big, "acme/two", "2");
    let sizes: Vec<u64> = big.mirrors().unwrap().iter().map(|m| m.bytes).collect();
    let budget = sizes.iter().sum::<u64>() + sizes[0] / 2;
    let cache = RepoCache::new(&root, budget);

    std::thread::sleep(Duration::from_millis(20));
    co(&cache, "acme/three", "3");
    let left: Vec<String> = cache
        .mirrors()
        .unwrap()
        .iter()
        .map(|m| m.key.to_string())
        .collect();
    assert_eq!(left, ["acme/two", "acme/three"], "the oldest went");
    assert!(!root.join("acme/one.git").exists());
    assert!(root.join("acme/one.lock").exists(), "lock files stay");

    // The least recently used mirror is in use (its lock held): the next one goes.
    let held = std::fs::File::options()
        .read(true)
        .write(true)
        .open(root.join("acme/two.lock"))
        .unwrap();
    // SAFETY: flock on a descriptor `held` owns.
    let locked = unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&held), libc::LOCK_EX) };
    assert_eq!(locked, 0);
    std::thread::sleep(Duration::from_millis(20));
    co(&cache, "acme/one", "1b");
    let left: Vec<String> = cache
        .mirrors()
        .unwrap()
        .iter()
        .map(|m| m.key.to_string())
        .collect();
    assert_eq!(left, ["acme/two", "acme/one"], "{left:?}");
    drop(held);

    // A budget smaller than one mirror keeps the one just used.
    let tiny = RepoCache::new(&root, 1);
    std::thread::sleep(Duration::from_millis(20));
    co(&tiny, "acme/three", "3b");
    let left: Vec<String> = tiny
        .mirrors()
        .unwrap()
        .iter()
        .map(|m| m.key.to_string())
        .collect();
    assert_eq!(left, ["acme/three"]);
    // Runs made from evicted mirrors are intact (their objects are their own).
    for d in ["1", "2", "3", "1b"] {
        let repo = git2::Repository::open(tmp.path().join(d)).unwrap();
        let head = repo.head().unwrap().peel_to_commit().unwrap();
        assert!(head.tree().unwrap().get_name("x.txt").is_some(), "{d}");
    }
    assert!(
        !root.join(".trash").exists()
            || std::fs::read_dir(root.join(".trash"))
                .unwrap()
                .next()
                .is_none()
    );
}

#[test]
fn a_mirror_left_unsound_is_repaired_or_rebuilt() {
    let srv = server();
    let url = widgets(&srv);
    let tmp = tempfile::tempdir().unwrap();
    let cache = RepoCache::new(tmp.path().join("mirrors"), 1 << 30);
    let k = key(REPO);
    let mirror = cache.mirror_path(&k);
    let main = srv.branch_sha(REPO, "main").unwrap();
    let mut n = 0;
    let mut run = |want: &Checkout| {
        n += 1;
        cache
            .checkout(
                &k,
                &url,
                TOKEN,
                want,
                &tmp.path().join(format!("r{n}")),
                true,
            )
            .unwrap()
    };
    run(&Checkout::DefaultBranch);

    // Killed while updating a ref: the marker and a stale ref lock are left.
    std::fs::write(mirror.join("kodx-fetch-in-progress"), b"").unwrap();
    std::fs::write(mirror.join("refs/heads/main.lock"), b"junk").unwrap();
    std::fs::write(mirror.join("objects/pack/pack_git2_abc"), b"half a pack").unwrap();
    let new = srv.commit_on_branch(REPO, "main", &[("n", b"n", 0o644)], "n");
    let c = run(&Checkout::DefaultBranch);
    assert_eq!(c.recovery, Some(Recovery::Repaired));
    assert_eq!(c.commit, new);
    assert!(c.received_objects <= 4, "repaired, not refetched: {c:?}");
    assert!(!mirror.join("refs/heads/main.lock").exists());
    assert!(!mirror.join("objects/pack/pack_git2_abc").exists());
    assert!(!mirror.join("kodx-fetch-in-progress").exists());

    // A ref to a commit the mirror lacks: rebuilt from scratch.
    std::fs::write(mirror.join("kodx-fetch-in-progress"), b"").unwrap();
    std::fs::write(
        mirror.join("refs/heads/main"),
        format!("{}\n", "1".repeat(40)),
    )
    .unwrap();
    let c = run(&Checkout::DefaultBranch);
    assert_eq!(c.recovery, Some(Recovery::Rebuilt));
    assert_eq!(c.commit, new);

    // Objects gone without a marker (a disk problem): the fetch fails locally, the mirror
    // is rebuilt and the run goes on.
    for f in files_under(&mirror.join("objects")) {
        std::fs::remove_file(f).unwrap();
    }
    let c = run(&Checkout::DefaultBranch);
    assert_eq!(c.recovery, Some(Recovery::Rebuilt));
    assert_eq!(c.commit, new);
    assert_ne!(c.commit, main);

    // Not a repository at all.
    std::fs::remove_dir_all(&mirror).unwrap();
    std::fs::create_dir_all(mirror.join("junk")).unwrap();
    let c = run(&Checkout::DefaultBranch);
    assert_eq!(c.recovery, Some(Recovery::Rebuilt));
    assert_eq!(c.commit, new);
}

// ---- A fetch killed midway, for real: SIGKILL to a child process mid-download. ----

const CHILD_ENV: &str = "KODX_TEST_FETCH_CHILD";

/// Run only by [`a_fetch_killed_midway_leaves_a_mirror_that_recovers`], in a child
/// process: refreshes the mirror and, once part of the pack has arrived, says so (a file)
/// and stalls until it is killed.
#[test]
#[ignore = "a helper the kill test runs in a child process"]
fn fetch_child() {
    let spec = std::env::var(CHILD_ENV).expect("run by the kill test");
    let mut parts = spec.split('\n');
    let (root, url, ready) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let cache = RepoCache::new(root, 1 << 30);
    let mut said = false;
    let mut progress = |_objects: usize, _total: usize, bytes: usize| {
        if bytes > (2 << 20) && !said {
            std::fs::write(ready, b"midway").unwrap();
            said = true;
            std::thread::sleep(Duration::from_secs(120));
        }
        true
    };
    let _ = cache.refresh(
        &key(REPO),
        url,
        TOKEN,
        &Checkout::DefaultBranch,
        Some(&mut progress),
    );
    panic!("the fetch was not killed");
}

#[test]
fn a_fetch_killed_midway_leaves_a_mirror_that_recovers() {
    let srv = server();
    // About 12 MiB that does not compress: the pack takes a while to arrive.
    let mut seed: u64 = 0x9E37_79B9_7F4A_7C15;
    let blobs: Vec<(String, Vec<u8>)> = (0..6)
        .map(|i| {
            let data = (0..2 << 20)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    seed as u8
                })
                .collect();
            (format!("data/blob{i}.bin"), data)
        })
        .collect();
    let files: Vec<(&str, &[u8], u32)> = blobs
        .iter()
        .map(|(p, d)| (p.as_str(), d.as_slice(), 0o644))
        .chain([("README.md", &b"# big\n"[..], 0o644)])
        .collect();
    let url = srv.create_repo(REPO, "main", &files);
    let tmp = tempfile::tempdir().unwrap();
    let root = tmp.path().join("mirrors");
    let ready = tmp.path().join("ready");
    let cache = RepoCache::new(&root, 1 << 30);
    let mirror = cache.mirror_path(&key(REPO));

    let fetch_child = crate::common::test_name(module_path!(), "fetch_child");
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([fetch_child.as_str(), "--exact", "--ignored", "--nocapture"])
        .env(
            CHILD_ENV,
            format!("{}\n{url}\n{}", root.display(), ready.display()),
        )
        .spawn()
        .unwrap();
    let started = Instant::now();
    while !ready.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("the fetch child ended before the kill: {status}");
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the child never got midway"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    // Midway for sure: the marker is there and part of a pack, not yet the ref.
    assert!(mirror.join("kodx-fetch-in-progress").exists());
    let partial: Vec<_> = files_under(&mirror.join("objects/pack"));
    assert!(!partial.is_empty(), "a pack was being written");
    assert!(git2::Repository::open_bare(&mirror)
        .unwrap()
        .find_reference("refs/heads/main")
        .is_err());
    child.kill().unwrap(); // SIGKILL
    let status = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(status.signal(), Some(9), "{status:?}");

    // The next run repairs the mirror, fetches, and gets the right tree.
    let dest = tmp.path().join("run");
    let c = cache
        .checkout(
            &key(REPO),
            &url,
            TOKEN,
            &Checkout::DefaultBranch,
            &dest,
            true,
        )
        .unwrap();
    assert_eq!(c.recovery, Some(Recovery::Repaired), "{c:?}");
    assert_eq!(Some(c.commit.clone()), srv.branch_sha(REPO, "main"));
    for (path, data) in &blobs {
        assert!(std::fs::read(dest.join(path)).unwrap() == *data, "{path}");
    }
    assert_eq!(git(&srv, &dest, &["fsck", "--no-dangling"]), "");
    assert_eq!(git(&srv, &mirror, &["fsck", "--no-dangling"]), "");
    // Nothing of the killed fetch is left.
    for f in files_under(&mirror.join("objects/pack")) {
        let name = f.file_name().unwrap().to_str().unwrap().to_string();
        assert!(name.starts_with("pack-"), "left over: {name}");
    }
    assert!(!mirror.join("kodx-fetch-in-progress").exists());
}
