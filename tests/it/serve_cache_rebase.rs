//! A pull request branch that moves while a run works, with the run's clone made from the
//! repository cache without files (as `kodx serve` makes it): `git::push_rebasing` rebases
//! the commit onto the new head and pushes it, and only the index follows: no file is
//! written on the host. Against real git http-backend.

use crate::common::git_server;

use std::path::Path;

use git_server::{accept_tokens, GitServer};
use kodx::git::{self, Checkout, CommitRequest, Identity};
use kodx::repo_cache::{RepoCache, RepoKey};
use kodx::sandbox::archive::{self, ArchiveLimits};

const TOKEN: &str = "ghs_TestInstallationToken0123456789abcd";
const REPO: &str = "acme/widgets";

fn names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .collect();
    v.sort();
    v
}

#[test]
fn a_moved_branch_is_rebased_onto_without_writing_the_files() {
    assert!(git_server::git_available(), "these tests need the git CLI");
    let srv = GitServer::start(accept_tokens(&[TOKEN]));
    let url = srv.create_repo(REPO, "main", &[("README.md", b"# Widgets\n", 0o644)]);
    let head = srv.commit_on_branch(REPO, "feature", &[("feature.txt", b"v1\n", 0o644)], "v1");
    let tmp = tempfile::tempdir().unwrap();
    let cache = RepoCache::new(tmp.path().join("mirrors"), 1 << 30);
    let key = RepoKey::parse(REPO).unwrap();
    let clone = tmp.path().join("run");
    let checked = cache
        .checkout(
            &key,
            &url,
            TOKEN,
            &Checkout::Branch("feature".into()),
            &clone,
            false,
        )
        .unwrap();
    assert_eq!(checked.commit, head);
    assert_eq!(names(&clone), [".git"]);

    // The container's change: a new file.
    let limits = ArchiveLimits::default();
    let mut tar = Vec::new();
    let baseline = archive::pack_checkout_to(&clone, "repo", &limits, &mut tar).unwrap();
    let work = tmp.path().join("container");
    archive::extract(&tar, "repo", &work, &limits).unwrap();
    std::fs::write(work.join("kodx.txt"), b"from kodx\n").unwrap();
    let (after, _) = archive::pack_dir(&work, "repo").unwrap();
    let changes = archive::change_set(&after, "repo", &baseline, &limits).unwrap();
    let request = CommitRequest {
        author: Identity {
            name: "kodx[bot]".into(),
            email: "1+kodx[bot]@users.noreply.github.com".into(),
        },
        subject: "Add kodx.txt",
        body: "",
        trailers: &[],
        max_file_bytes: 1 << 20,
    };
    git::commit_change_set(&clone, &changes, &request)
        .unwrap()
        .unwrap();

    // Meanwhile the author pushes to the branch.
    let moved = srv.commit(
        REPO,
        "refs/heads/feature",
        Some(&head),
        &[("feature.txt", b"v2\n", 0o644)],
        "v2",
    );
    let pushed = git::push_rebasing(&clone, &url, TOKEN, "feature", 3).unwrap();
    assert!(pushed.rebased, "{pushed:?}");
    assert_eq!(srv.branch_sha(REPO, "feature"), Some(pushed.sha.clone()));
    assert_eq!(srv.ref_sha(REPO, "feature~1"), Some(moved));
    assert_eq!(
        srv.file_at(REPO, "feature", "feature.txt").unwrap(),
        b"v2\n"
    );
    assert_eq!(
        srv.file_at(REPO, "feature", "kodx.txt").unwrap(),
        b"from kodx\n"
    );
    assert_eq!(
        names(&clone),
        [".git"],
        "the rebase wrote no file on the host"
    );
    // The index is the pushed tree: the clone is clean as far as git can tell.
    let repo = git2::Repository::open(&clone).unwrap();
    let tree = repo.head().unwrap().peel_to_tree().unwrap();
    let diff = repo.diff_tree_to_index(Some(&tree), None, None).unwrap();
    assert_eq!(diff.deltas().len(), 0);
}
