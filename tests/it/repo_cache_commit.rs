//! The one-write path end to end on the host side: a clone from the mirror without files,
//! the container's change set committed from the objects (`git::commit_change_set`) and
//! pushed — the same commit tree as applying the change set to a checkout and
//! `git::commit_all`, today's path. Against real git http-backend.

use crate::common::git_server;

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::Path;

use git_server::{accept_tokens, GitServer};
use kodx::git::{self, Checkout, CommitRequest, GitError, Identity};
use kodx::repo_cache::{RepoCache, RepoKey};
use kodx::sandbox::archive::{self, ArchiveLimits};

const TOKEN: &str = "ghs_TestInstallationToken0123456789abcd";
const REPO: &str = "acme/widgets";

fn put(root: &Path, rel: &str, data: &[u8], mode: u32) {
    let path = root.join(rel);
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, data).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn request(max_file_bytes: u64) -> CommitRequest<'static> {
    CommitRequest {
        author: Identity {
            name: "kodx[bot]".into(),
            email: "1+kodx[bot]@users.noreply.github.com".into(),
        },
        subject: "Apply the change",
        body: "Body.",
        trailers: &[],
        max_file_bytes,
    }
}

fn tree_of(dir: &Path, sha: &str) -> String {
    let repo = git2::Repository::open(dir).unwrap();
    let commit = repo.find_commit(git2::Oid::from_str(sha).unwrap()).unwrap();
    let id = commit.tree().unwrap().id().to_string();
    id
}

#[test]
fn a_change_set_commits_the_same_tree_without_the_files_on_disk() {
    assert!(git_server::git_available(), "these tests need the git CLI");
    let srv = GitServer::start(accept_tokens(&[TOKEN]));
    let url = srv.create_repo(
        REPO,
        "main",
        &[
            ("README.md", b"# Widgets\n", 0o644),
            ("scripts/run.sh", b"#!/bin/sh\necho hi\n", 0o755),
            ("docs/link", b"../README.md", 0o120000),
            ("sub/s.txt", b"s", 0o644),
            ("a", b"sub", 0o120000),
            ("f", b"file", 0o644),
            ("d/x", b"x", 0o644),
            ("keep/k.txt", b"k", 0o644),
            ("big.bin", &[1; 10], 0o644),
        ],
    );
    let tmp = tempfile::tempdir().unwrap();
    let cache = RepoCache::new(tmp.path().join("mirrors"), 1 << 30);
    let key = RepoKey::parse(REPO).unwrap();
    let today = tmp.path().join("today");
    let one_write = tmp.path().join("one-write");
    cache
        .checkout(&key, &url, TOKEN, &Checkout::DefaultBranch, &today, true)
        .unwrap();
    cache
        .checkout(
            &key,
            &url,
            TOKEN,
            &Checkout::DefaultBranch,
            &one_write,
            false,
        )
        .unwrap();

    // The container's side: the tree as it went in, then what the agent did to it.
    let limits = ArchiveLimits::default();
    let mut tar = Vec::new();
    let baseline = archive::pack_checkout_to(&one_write, "repo", &limits, &mut tar).unwrap();
    let work = tmp.path().join("container");
    archive::extract(&tar, "repo", &work, &limits).unwrap();
    put(&work, "README.md", b"# Widgets, better\n", 0o644);
    put(&work, "new/deep/file.rs", b"fn main() {}\n", 0o644);
    std::fs::set_permissions(
        work.join("scripts/run.sh"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    std::fs::remove_file(work.join("docs/link")).unwrap();
    symlink("../scripts/run.sh", work.join("docs/link")).unwrap();
    std::fs::remove_dir_all(work.join("keep")).unwrap();
    std::fs::remove_file(work.join("a")).unwrap(); // a symlink becomes a directory
    put(&work, "a/x", b"through", 0o644);
    std::fs::remove_file(work.join("f")).unwrap(); // a file becomes a directory
    put(&work, "f/inner.txt", b"inner", 0o755);
    std::fs::remove_dir_all(work.join("d")).unwrap(); // a directory becomes a file
    put(&work, "d", b"now a file", 0o644);
    put(&work, "big.bin", &vec![7; 400 << 10], 0o644); // spooled, not in memory
                                                       // A repository the agent cloned inside: both paths treat it alike.
    put(
        &work,
        "vendor/lib/.git/HEAD",
        b"ref: refs/heads/main\n",
        0o644,
    );
    put(&work, "vendor/lib/code.rs", b"// vendored\n", 0o644);
    let (after, _) = archive::pack_dir(&work, "repo").unwrap();
    let changes = archive::change_set(&after, "repo", &baseline, &limits).unwrap();
    insta::assert_snapshot!(changes.summary(), @"5 added, 4 modified, 4 deleted");

    // Today: applied to the checkout, then commit_all.
    changes.apply(&today).unwrap();
    let a = git::commit_all(&today, &request(1 << 20)).unwrap().unwrap();
    // One write: committed from the objects, no files on disk.
    let b = git::commit_change_set(&one_write, &changes, &request(1 << 20))
        .unwrap()
        .unwrap();
    assert_eq!(tree_of(&today, &a.sha), tree_of(&one_write, &b.sha));
    assert_eq!(a.paths, b.paths);
    insta::assert_snapshot!(b.paths.join("\n"), @"
    README.md
    a
    a/x
    big.bin
    d
    d/x
    docs/link
    f
    f/inner.txt
    keep/k.txt
    new/deep/file.rs
    scripts/run.sh
    vendor/lib/code.rs
    ");
    let names: Vec<_> = std::fs::read_dir(&one_write)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, [".git"], "still no files on disk");

    // It pushes like any commit, and the server has that tree.
    git::push(&one_write, &url, TOKEN, "HEAD", "kodx/one-write", true).unwrap();
    assert_eq!(srv.branch_sha(REPO, "kodx/one-write"), Some(b.sha.clone()));
    assert_eq!(
        srv.file_at(REPO, "kodx/one-write", "f/inner.txt")
            .as_deref(),
        Some(&b"inner"[..])
    );
    let tree: Vec<String> = srv
        .ls_tree(REPO, "kodx/one-write")
        .into_iter()
        .map(|(mode, path)| format!("{mode:o} {path}"))
        .collect();
    insta::assert_snapshot!(tree.join("\n"), @"
    100644 README.md
    100644 a/x
    100644 big.bin
    100644 d
    120000 docs/link
    100755 f/inner.txt
    100644 new/deep/file.rs
    100644 scripts/run.sh
    100644 sub/s.txt
    100644 vendor/lib/code.rs
    ");

    // Nothing to commit, and a file over the limit, as commit_all says them.
    let fresh = tmp.path().join("fresh");
    cache
        .checkout(&key, &url, TOKEN, &Checkout::DefaultBranch, &fresh, false)
        .unwrap();
    let none = archive::change_set(&tar, "repo", &baseline, &limits).unwrap();
    assert!(none.is_empty());
    assert_eq!(
        git::commit_change_set(&fresh, &none, &request(1 << 20)).unwrap(),
        None
    );
    let err = git::commit_change_set(&fresh, &changes, &request(100 << 10)).unwrap_err();
    assert!(
        matches!(&err, GitError::TooLarge { path, .. } if path == "big.bin"),
        "{err}"
    );
    let repo = git2::Repository::open(&fresh).unwrap();
    assert_eq!(
        repo.head()
            .unwrap()
            .peel_to_commit()
            .unwrap()
            .parent_count(),
        0,
        "nothing was committed"
    );
}

/// `git rev-list --count HEAD` in the clone at `dir` (the git CLI, which honours `shallow`).
fn count_commits(srv: &GitServer, dir: &Path) -> usize {
    let out = srv.git(dir, &["rev-list", "--count", "HEAD"]);
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A run that needs only the tip makes the mirror shallow (one commit's objects, not the
/// history); later tips come at depth 1 and the mirror stays consistent; a change is
/// committed on the tip and pushed with the right parent; a run that needs the history
/// deepens the mirror to all of it, and then the mirror stays whole.
#[test]
fn a_shallow_mirror_serves_tip_runs_and_deepens_for_history() {
    use kodx::git::History;
    assert!(git_server::git_available(), "these tests need the git CLI");
    let srv = GitServer::start(accept_tokens(&[TOKEN]));
    let url = srv.create_repo(REPO, "main", &[("README.md", b"one\n", 0o644)]);
    for i in 2..=5 {
        let text = format!("version {i}\n");
        srv.commit_on_branch(
            REPO,
            "main",
            &[("README.md", text.as_bytes(), 0o644)],
            &format!("Commit {i}"),
        );
    }
    let tmp = tempfile::tempdir().unwrap();
    let cache = RepoCache::new(tmp.path().join("mirrors"), 1 << 30);
    let key = RepoKey::parse(REPO).unwrap();
    let mirror = cache.mirror_path(&key);
    let checkout = |name: &str, want: &Checkout, history: History| {
        let dest = tmp.path().join(name);
        let c = cache
            .checkout_for(&key, &url, TOKEN, want, history, &dest, false)
            .unwrap();
        (dest, c)
    };

    // First run, tip only: a shallow mirror with one commit.
    let (first, c) = checkout("first", &Checkout::DefaultBranch, History::Tip);
    let main5 = srv.branch_sha(REPO, "main").unwrap();
    assert_eq!(c.commit, main5);
    assert!(c.fetched && c.shallow);
    assert_eq!(
        std::fs::read_to_string(mirror.join("shallow")).unwrap(),
        format!("{main5}\n")
    );
    assert_eq!(
        std::fs::read_to_string(first.join(".git/shallow")).unwrap(),
        format!("{main5}\n"),
        "the clone is as shallow as the mirror"
    );
    assert_eq!(count_commits(&srv, &first), 1);

    // A new commit upstream: fetched at depth 1 too, only what changed.
    let main6 = srv.commit_on_branch(REPO, "main", &[("NEW.md", b"new\n", 0o644)], "Commit 6");
    let (second, c) = checkout("second", &Checkout::DefaultBranch, History::Tip);
    assert_eq!(c.commit, main6);
    assert!(c.fetched && c.shallow);
    assert!(c.received_objects <= 3, "{} objects", c.received_objects);
    let shallow = std::fs::read_to_string(mirror.join("shallow")).unwrap();
    crate::common::serve::redactions(&[], &[(&main5, "[main5]"), (&main6, "[main6]")]).bind(|| {
        insta::assert_snapshot!(shallow, @"
        [main5]
        [main6]
        ")
    });
    assert_eq!(count_commits(&srv, &second), 1);
    // Nothing new: no download at all.
    let (_, c) = checkout("again", &Checkout::DefaultBranch, History::Tip);
    assert!(!c.fetched && c.shallow);

    // A change committed on the shallow tip and pushed: its parent is the tip, and the
    // server has a sound history.
    let limits = ArchiveLimits::default();
    let mut tar = Vec::new();
    let baseline = archive::pack_tip_to(&second, "repo", &limits, &mut tar).unwrap();
    let work = tmp.path().join("container");
    archive::extract(&tar, "repo", &work, &limits).unwrap();
    put(&work, "README.md", b"changed in the container\n", 0o644);
    let (after, _) = archive::pack_dir(&work, "repo").unwrap();
    let changes = archive::change_set(&after, "repo", &baseline, &limits).unwrap();
    let made = git::commit_change_set(&second, &changes, &request(1 << 20))
        .unwrap()
        .unwrap();
    git::push(&second, &url, TOKEN, "HEAD", "kodx/shallow", true).unwrap();
    assert_eq!(srv.branch_sha(REPO, "kodx/shallow").unwrap(), made.sha);
    assert_eq!(
        srv.ref_sha(REPO, "kodx/shallow^").unwrap(),
        main6,
        "the commit's parent is the tip"
    );
    assert_eq!(srv.commit_count(REPO, "kodx/shallow"), 7);
    srv.git(&srv.bare_path(REPO), &["fsck", "--strict"]);
    assert_eq!(
        srv.file_at(REPO, "kodx/shallow", "README.md").unwrap(),
        b"changed in the container\n"
    );

    // A run that needs the history (a pull request's): the mirror is deepened.
    let pr = srv.create_pull_ref(REPO, 7, &[("pr.txt", b"pr\n", 0o644)]);
    let (whole, c) = checkout("whole", &Checkout::PullHead(7), History::Whole);
    assert_eq!(c.commit, pr);
    assert!(c.fetched && !c.shallow);
    assert!(!mirror.join("shallow").exists());
    assert!(!whole.join(".git/shallow").exists());
    assert_eq!(count_commits(&srv, &whole), 7);
    // And then stays whole, for tip runs too.
    let (tip, c) = checkout("tip", &Checkout::DefaultBranch, History::Tip);
    assert!(!c.shallow);
    assert_eq!(count_commits(&srv, &tip), 6);
}
