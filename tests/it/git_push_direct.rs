//! The one-request push of a run's new branch (`git::push_new_branch`) against the real
//! `git http-backend`: one `POST git-receive-pack` carrying only the objects the parent
//! lacks; a branch that already exists is not replaced (the push is declined, and the
//! caller's usual push decides); a lease lost before sending sends nothing; a refused
//! token is declined without the token in what is said.

use crate::common::git_server;

use std::path::Path;

use git_server::{accept_tokens, GitServer};
use kodx::git::{self, Checkout, Direct, GitError, History};
use kodx::repo_cache::{RepoCache, RepoKey};

const TOKEN: &str = "ghs_TestInstallationToken0123456789abcd";
const REPO: &str = "acme/widgets";

/// A repository with files at the root and two directories deep, and a tip-only clone of
/// it from the repository cache (as a code run on an issue gets).
fn served() -> (GitServer, String, tempfile::TempDir, std::path::PathBuf) {
    assert!(git_server::git_available(), "these tests need the git CLI");
    let srv = GitServer::start(accept_tokens(&[TOKEN]));
    let url = srv.create_repo(
        REPO,
        "main",
        &[
            ("README.md", b"# Widgets\n", 0o644),
            ("src/lib.rs", b"pub fn a() {}\n", 0o644),
            ("src/deep/mod.rs", b"// deep\n", 0o644),
            ("docs/guide.md", b"guide\n", 0o644),
        ],
    );
    srv.commit_on_branch(REPO, "main", &[("CHANGES", b"one\n", 0o644)], "Second");
    let tmp = tempfile::tempdir().unwrap();
    let cache = RepoCache::new(tmp.path().join("mirrors"), 1 << 30);
    let key = RepoKey::parse(REPO).unwrap();
    let dest = tmp.path().join("clone");
    cache
        .checkout_for(
            &key,
            &url,
            TOKEN,
            &Checkout::DefaultBranch,
            History::Tip,
            &dest,
            false,
        )
        .unwrap();
    (srv, url, tmp, dest)
}

/// Commits, on the clone's `HEAD`, `src/deep/mod.rs` changed and a new root file.
fn commit_change(dir: &Path) -> String {
    let repo = git2::Repository::open(dir).unwrap();
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    let root = head.tree().unwrap();
    let src = repo.find_tree(root.get_name("src").unwrap().id()).unwrap();
    let deep = repo.find_tree(src.get_name("deep").unwrap().id()).unwrap();
    let mut b = repo.treebuilder(Some(&deep)).unwrap();
    b.insert("mod.rs", repo.blob(b"// deeper\n").unwrap(), 0o100644)
        .unwrap();
    let deep = b.write().unwrap();
    let mut b = repo.treebuilder(Some(&src)).unwrap();
    b.insert("deep", deep, 0o040000).unwrap();
    let src = b.write().unwrap();
    let mut b = repo.treebuilder(Some(&root)).unwrap();
    b.insert("src", src, 0o040000).unwrap();
    b.insert("NEW.md", repo.blob(b"new\n").unwrap(), 0o100644)
        .unwrap();
    let tree = repo.find_tree(b.write().unwrap()).unwrap();
    let who = git2::Signature::now("kodx[bot]", "1+kodx[bot]@users.noreply.github.com").unwrap();
    repo.commit(Some("HEAD"), &who, &who, "Change", &tree, &[&head])
        .unwrap()
        .to_string()
}

/// A runtime of its own threads, as the server's: the push blocks on its handle.
fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn a_new_branch_is_created_in_one_request_with_only_the_new_objects() {
    let (srv, url, _tmp, dest) = served();
    let made = commit_change(&dest);
    let before = srv.requests().len();
    let rt = runtime();
    let pushed = git::push_new_branch(
        &dest,
        &url,
        TOKEN,
        "kodx/issue-7-ab12",
        rt.handle(),
        &|| true,
    )
    .unwrap();
    // The commit, the root tree, `src`, `src/deep`, the changed file and the new file:
    // nothing of `docs/`, `README.md`, `src/lib.rs` or the history.
    assert_eq!(
        pushed,
        Direct::Pushed {
            sha: made.clone(),
            objects: 6
        }
    );
    let requests = &srv.requests()[before..];
    assert_eq!(requests.len(), 1, "{requests:?}");
    assert_eq!(requests[0].method, "POST");
    assert!(requests[0].path_and_query.ends_with("/git-receive-pack"));
    assert!(requests[0].auth_ok && requests[0].status == 200);
    git_server::assert_requests_clean(&srv, TOKEN);
    assert_eq!(srv.branch_sha(REPO, "kodx/issue-7-ab12").unwrap(), made);
    assert_eq!(
        srv.file_at(REPO, "kodx/issue-7-ab12", "src/deep/mod.rs")
            .unwrap(),
        b"// deeper\n"
    );
    assert_eq!(
        srv.file_at(REPO, "kodx/issue-7-ab12", "docs/guide.md")
            .unwrap(),
        b"guide\n"
    );
    // The server's repository is whole: the commit's parent and every object are there.
    let fsck = srv.git(&srv.bare_path(REPO), &["fsck", "--strict", "--no-dangling"]);
    assert!(fsck.status.success(), "{fsck:?}");
}

#[test]
fn an_existing_branch_is_never_replaced_by_it() {
    let (srv, url, _tmp, dest) = served();
    // The branch exists on the server (an earlier attempt of the run, or anyone's).
    let theirs = srv.commit_on_branch(REPO, "kodx/taken", &[("X", b"x\n", 0o644)], "Theirs");
    let made = commit_change(&dest);
    let rt = runtime();
    let outcome =
        git::push_new_branch(&dest, &url, TOKEN, "kodx/taken", rt.handle(), &|| true).unwrap();
    let Direct::Declined(why) = outcome else {
        panic!("pushed over an existing branch: {outcome:?}");
    };
    assert!(why.contains("kodx/taken"), "{why}");
    assert_eq!(srv.branch_sha(REPO, "kodx/taken").unwrap(), theirs);
    // A branch made meanwhile with the same name as the run's is refused the same way: the
    // server, not kodx's view of it, decides.
    assert_ne!(made, theirs);
}

#[test]
fn nothing_is_sent_once_the_lease_is_lost() {
    let (srv, url, _tmp, dest) = served();
    commit_change(&dest);
    let before = srv.requests().len();
    let rt = runtime();
    let outcome = git::push_new_branch(&dest, &url, TOKEN, "kodx/lost", rt.handle(), &|| false);
    assert_eq!(outcome, Err(GitError::Withheld));
    assert_eq!(srv.requests().len(), before, "a request was sent");
    assert_eq!(srv.branch_sha(REPO, "kodx/lost"), None);
}

#[test]
fn a_refused_token_is_declined_and_never_said() {
    let (srv, url, _tmp, dest) = served();
    commit_change(&dest);
    let rt = runtime();
    let wrong = "ghs_WrongToken000000000000000000000000000";
    let outcome =
        git::push_new_branch(&dest, &url, wrong, "kodx/wrong", rt.handle(), &|| true).unwrap();
    let Direct::Declined(why) = outcome else {
        panic!("pushed with a wrong token: {outcome:?}");
    };
    assert!(why.contains("401"), "{why}");
    assert!(!why.contains(wrong), "{why}");
    assert_eq!(srv.branch_sha(REPO, "kodx/wrong"), None);
    for r in srv.requests() {
        assert!(!r.path_and_query.contains(wrong), "token in URL: {r:?}");
    }
}
