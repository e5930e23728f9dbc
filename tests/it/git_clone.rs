//! kodx::git against a real smart-HTTP server (`git http-backend` behind basic auth).

use crate::common::{contains, git_server};

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use git_server::{basic_auth, GitServer};
use kodx::git::{self, Checkout, GitError};

const TOKEN: &str = "ghs_TestInstallationToken0123456789abcd";

const README: &[u8] = b"# Widgets\n";
const RUN_SH: &[u8] = b"#!/bin/sh\necho hi\n";

fn widgets(srv: &GitServer) -> String {
    srv.create_repo(
        "acme/widgets",
        "main",
        &[
            ("README.md", README, 0o644),
            ("scripts/run.sh", RUN_SH, 0o755),
            ("docs/link", b"../README.md", 0o120000),
        ],
    )
}

fn new_dest() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let dest = dir.path().join("checkout");
    (dir, dest)
}

/// Every file under `dir`, recursively (symlinks not followed).
fn files_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for entry in std::fs::read_dir(&d).unwrap() {
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

/// Fails if the token, or the basic-auth header made of it, is in any file under `dir`.
fn assert_no_token_in_files(dir: &Path) {
    let header = basic_auth("x-access-token", TOKEN);
    let encoded = header.trim_start_matches("Basic ");
    let files = files_under(dir);
    assert!(files.len() > 5, "expected a git directory under {dir:?}");
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        assert!(!contains(&bytes, TOKEN.as_bytes()), "token in {f:?}");
        assert!(
            !contains(&bytes, encoded.as_bytes()),
            "encoded token in {f:?}"
        );
    }
}

fn local_git(srv: &GitServer, dir: &Path, args: &[&str]) -> String {
    let out = srv.git(dir, args);
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn clones_the_default_branch_with_modes_and_a_clean_config() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let url = widgets(&srv);
    let (_tmp, dest) = new_dest();

    let cloned = git::clone(&url, TOKEN, &dest, &Checkout::DefaultBranch, None).unwrap();

    assert_eq!(cloned.branch, "main");
    assert_eq!(
        Some(cloned.head_sha.clone()),
        srv.branch_sha("acme/widgets", "main")
    );
    assert_eq!(std::fs::read(dest.join("README.md")).unwrap(), README);
    assert_eq!(std::fs::read(dest.join("scripts/run.sh")).unwrap(), RUN_SH);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(dest.join("scripts/run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o111,
        0o111,
        "run.sh lost its executable bit: {mode:o}"
    );
    let readme_mode = std::fs::metadata(dest.join("README.md"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(readme_mode & 0o111, 0);
    assert_eq!(
        std::fs::read_link(dest.join("docs/link")).unwrap(),
        Path::new("../README.md")
    );

    // The git CLI agrees: HEAD, a clean work tree, the upstream and origin's HEAD.
    assert_eq!(
        local_git(&srv, &dest, &["rev-parse", "HEAD"]),
        cloned.head_sha
    );
    assert_eq!(
        local_git(&srv, &dest, &["symbolic-ref", "HEAD"]),
        "refs/heads/main"
    );
    assert_eq!(local_git(&srv, &dest, &["status", "--porcelain"]), "");
    assert_eq!(
        local_git(&srv, &dest, &["rev-parse", "--abbrev-ref", "@{upstream}"]),
        "origin/main"
    );
    assert_eq!(
        local_git(&srv, &dest, &["symbolic-ref", "refs/remotes/origin/HEAD"]),
        "refs/remotes/origin/main"
    );
    assert_eq!(
        local_git(&srv, &dest, &["config", "remote.origin.url"]),
        url,
        "the remote URL is stored exactly as given"
    );
    let config = std::fs::read_to_string(dest.join(".git/config")).unwrap();
    let url_line = format!("\turl = {url}");
    assert!(config.lines().any(|l| l == url_line), "{config}");
    assert!(!config.contains('@'), "credentials in config: {config}");

    assert_no_token_in_files(&dest);
    git_server::assert_requests_clean(&srv, TOKEN);
    // The credentials went with the clone's requests, not just a probe.
    let authed = srv.requests().iter().filter(|r| r.auth_ok).count();
    assert!(authed >= 2, "{:?}", srv.requests());
}

#[test]
fn a_refused_token_is_an_auth_error_at_once() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let url = widgets(&srv);
    let (_tmp, dest) = new_dest();
    let wrong = "ghs_WrongToken";

    let started = Instant::now();
    let err = git::clone(&url, wrong, &dest, &Checkout::DefaultBranch, None).unwrap_err();

    assert_eq!(err, GitError::Auth);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let message = err.to_string();
    assert!(!message.contains(wrong), "{message}");
    insta::assert_snapshot!(message, @"the git server refused the installation token: check that the app is installed on the repository and has the contents permission (write, to push)");
    // One anonymous probe, one try with the token, then libgit2 is told to stop.
    let requests = srv.requests();
    let with_creds = requests.iter().filter(|r| r.username.is_some()).count();
    assert_eq!(with_creds, 1, "{requests:?}");
    assert!(requests.len() <= 2, "{requests:?}");
    assert!(requests.iter().all(|r| !r.auth_ok && r.status == 401));
    assert!(requests.iter().all(|r| !r.path_and_query.contains(wrong)));
}

#[test]
fn a_refused_token_on_push_is_an_auth_error() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let url = widgets(&srv);
    let (_tmp, dest) = new_dest();
    git::clone(&url, TOKEN, &dest, &Checkout::DefaultBranch, None).unwrap();

    let started = Instant::now();
    let err = git::push(&dest, &url, "ghs_Wrong", "HEAD", "other", false).unwrap_err();
    assert_eq!(err, GitError::Auth);
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(srv.branch_sha("acme/widgets", "other"), None);
}

#[test]
fn the_token_is_never_written_or_put_in_a_url() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let url = widgets(&srv);
    srv.create_pull_ref("acme/widgets", 4, &[("pr.txt", b"pr", 0o644)]);
    let (_tmp, dest) = new_dest();

    // Every operation: clone, fetch, push.
    git::clone(&url, TOKEN, &dest, &Checkout::DefaultBranch, Some(5)).unwrap();
    git::fetch(&dest, &url, TOKEN, &["+refs/pull/4/head:refs/pull/4/head"]).unwrap();
    std::fs::write(dest.join("new.txt"), "new\n").unwrap();
    srv.git(&dest, &["add", "new.txt"]);
    srv.git(&dest, &["commit", "-q", "-m", "Add new.txt"]);
    git::push(&dest, &url, TOKEN, "HEAD", "kodx/leak-check", false).unwrap();

    assert_no_token_in_files(&dest);
    git_server::assert_requests_clean(&srv, TOKEN);
    let pushes = srv
        .requests()
        .iter()
        .filter(|r| r.path_and_query.ends_with("/git-receive-pack"))
        .count();
    assert_eq!(pushes, 1, "{:?}", srv.requests());
}

#[test]
fn urls_with_credentials_or_other_schemes_are_refused_before_any_request() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    widgets(&srv);
    let addr = srv.url().trim_start_matches("http://").to_string();
    let (_tmp, dest) = new_dest();
    for url in [
        format!("http://x-access-token:{TOKEN}@{addr}/acme/widgets.git"),
        format!("http://someone@{addr}/acme/widgets.git"),
        format!("ssh://git@{addr}/acme/widgets.git"),
        format!("git@{addr}:acme/widgets.git"),
        "file:///etc".to_string(),
    ] {
        let err = git::clone(&url, TOKEN, &dest, &Checkout::DefaultBranch, None).unwrap_err();
        assert!(matches!(err, GitError::InvalidUrl(_)), "{url}: {err:?}");
        assert!(!err.to_string().contains(TOKEN));
        assert!(!dest.exists(), "{url} made {dest:?}");
        let err = git::push(&dest, &url, TOKEN, "HEAD", "x", false).unwrap_err();
        assert!(matches!(err, GitError::InvalidUrl(_)), "{url}: {err:?}");
        let err = git::fetch(&dest, &url, TOKEN, &["refs/heads/main"]).unwrap_err();
        assert!(matches!(err, GitError::InvalidUrl(_)), "{url}: {err:?}");
    }
    assert!(srv.requests().is_empty(), "{:?}", srv.requests());
}

#[test]
fn checks_out_a_named_branch() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let url = widgets(&srv);
    let sha = srv.commit_on_branch(
        "acme/widgets",
        "feature/x",
        &[("feature.txt", b"feature\n", 0o644)],
        "Feature",
    );
    let (_tmp, dest) = new_dest();

    let checkout = Checkout::Branch("feature/x".into());
    let cloned = git::clone(&url, TOKEN, &dest, &checkout, None).unwrap();

    assert_eq!(cloned.branch, "feature/x");
    assert_eq!(cloned.head_sha, sha);
    assert_eq!(
        std::fs::read(dest.join("feature.txt")).unwrap(),
        b"feature\n"
    );
    assert_eq!(
        local_git(&srv, &dest, &["symbolic-ref", "HEAD"]),
        "refs/heads/feature/x"
    );
    assert_eq!(local_git(&srv, &dest, &["status", "--porcelain"]), "");
    git_server::assert_requests_clean(&srv, TOKEN);
}

#[test]
fn a_missing_branch_pull_or_repository_is_named() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let url = widgets(&srv);

    let (_t1, d1) = new_dest();
    let err = git::clone(&url, TOKEN, &d1, &Checkout::Branch("nope".into()), None).unwrap_err();
    assert_eq!(err, GitError::RefNotFound("branch `nope`".into()));
    insta::assert_snapshot!(err, @"the repository has no branch `nope`");

    let (_t2, d2) = new_dest();
    let err = git::clone(&url, TOKEN, &d2, &Checkout::PullHead(99), None).unwrap_err();
    insta::assert_debug_snapshot!(err, @r#"
    RefNotFound(
        "pull request head refs/pull/99/head",
    )
    "#);

    let (_t3, d3) = new_dest();
    let missing = srv.clone_url("acme/missing");
    let err = git::clone(&missing, TOKEN, &d3, &Checkout::DefaultBranch, None).unwrap_err();
    assert_eq!(err, GitError::NotFound);
    assert_requests_clean_except_404(&srv);
}

/// Like [`git_server::assert_requests_clean`] but allowing 404s for the missing repository.
fn assert_requests_clean_except_404(srv: &GitServer) {
    for r in srv.requests() {
        assert!(!r.path_and_query.contains(TOKEN));
        if r.username.is_some() {
            assert!(r.auth_ok, "{r:?}");
            assert!(r.status < 400 || r.status == 404, "{r:?}");
        }
    }
}

#[test]
fn a_pull_head_clone_checks_out_the_pull_request_commit() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let url = widgets(&srv);
    let pr_sha = srv.create_pull_ref(
        "acme/widgets",
        7,
        &[("README.md", b"# Widgets, improved\n", 0o644)],
    );
    let (_tmp, dest) = new_dest();

    let cloned = git::clone(&url, TOKEN, &dest, &Checkout::PullHead(7), Some(10)).unwrap();

    assert_eq!(cloned.head_sha, pr_sha);
    assert_eq!(cloned.branch, Checkout::pull_branch(7));
    assert_eq!(cloned.branch, "pr-7");
    assert_eq!(
        std::fs::read(dest.join("README.md")).unwrap(),
        b"# Widgets, improved\n"
    );
    assert_eq!(local_git(&srv, &dest, &["rev-parse", "HEAD"]), pr_sha);
    assert_eq!(local_git(&srv, &dest, &["status", "--porcelain"]), "");
    // The pull request's parent, main, came along (depth 10 covers it).
    let main = srv.branch_sha("acme/widgets", "main").unwrap();
    assert_eq!(local_git(&srv, &dest, &["rev-parse", "HEAD^"]), main);
    git_server::assert_requests_clean(&srv, TOKEN);
}

#[test]
fn a_shallow_clone_has_depth_commits() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let url = widgets(&srv);
    for i in 0..3 {
        let name = format!("f{i}.txt");
        srv.commit_on_branch(
            "acme/widgets",
            "main",
            &[(name.as_str(), b"x", 0o644)],
            &format!("Commit {i}"),
        );
    }
    assert_eq!(srv.commit_count("acme/widgets", "main"), 4);

    let (_t1, shallow) = new_dest();
    let cloned = git::clone(&url, TOKEN, &shallow, &Checkout::DefaultBranch, Some(1)).unwrap();
    assert_eq!(
        local_git(&srv, &shallow, &["rev-list", "--count", "HEAD"]),
        "1"
    );
    assert_eq!(
        local_git(&srv, &shallow, &["rev-parse", "--is-shallow-repository"]),
        "true"
    );
    assert_eq!(
        Some(cloned.head_sha),
        srv.branch_sha("acme/widgets", "main")
    );
    assert!(shallow.join("f2.txt").exists());

    let (_t2, full) = new_dest();
    git::clone(&url, TOKEN, &full, &Checkout::DefaultBranch, None).unwrap();
    assert_eq!(
        local_git(&srv, &full, &["rev-list", "--count", "HEAD"]),
        "4"
    );
    assert_eq!(
        local_git(&srv, &full, &["rev-parse", "--is-shallow-repository"]),
        "false"
    );
}

#[test]
fn pushes_a_new_commit_to_a_new_branch() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let url = widgets(&srv);
    let (_tmp, dest) = new_dest();
    git::clone(&url, TOKEN, &dest, &Checkout::DefaultBranch, None).unwrap();
    std::fs::write(dest.join("fix.sh"), "#!/bin/sh\nexit 0\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dest.join("fix.sh"), std::fs::Permissions::from_mode(0o755)).unwrap();
    srv.git(&dest, &["add", "fix.sh"]);
    srv.git(&dest, &["commit", "-q", "-m", "Fix it"]);
    let local = local_git(&srv, &dest, &["rev-parse", "HEAD"]);

    git::push(&dest, &url, TOKEN, "HEAD", "kodx/issue-1-ab12", false).unwrap();

    assert_eq!(
        srv.branch_sha("acme/widgets", "kodx/issue-1-ab12"),
        Some(local.clone())
    );
    assert_eq!(
        srv.file_at("acme/widgets", "kodx/issue-1-ab12", "fix.sh"),
        Some(b"#!/bin/sh\nexit 0\n".to_vec())
    );
    let tree = srv.ls_tree("acme/widgets", "kodx/issue-1-ab12");
    let tree: Vec<(u32, &str)> = tree.iter().map(|(m, p)| (*m, p.as_str())).collect();
    assert_eq!(
        tree,
        [
            (0o100644, "README.md"),
            (0o120000, "docs/link"),
            (0o100755, "fix.sh"),
            (0o100755, "scripts/run.sh"),
        ]
    );

    // main is untouched.
    assert_ne!(srv.branch_sha("acme/widgets", "main"), Some(local.clone()));
    // A second push of the same commit is a no-op, not an error.
    git::push(
        &dest,
        &url,
        TOKEN,
        "refs/heads/main",
        "kodx/issue-1-ab12",
        false,
    )
    .unwrap();
    assert_eq!(
        srv.branch_sha("acme/widgets", "kodx/issue-1-ab12"),
        Some(local)
    );
    git_server::assert_requests_clean(&srv, TOKEN);
}

#[test]
fn pushes_from_a_shallow_clone() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let url = widgets(&srv);
    srv.commit_on_branch("acme/widgets", "main", &[("a.txt", b"a", 0o644)], "A");
    srv.commit_on_branch("acme/widgets", "main", &[("b.txt", b"b", 0o644)], "B");
    let (_tmp, dest) = new_dest();
    git::clone(&url, TOKEN, &dest, &Checkout::DefaultBranch, Some(1)).unwrap();
    std::fs::write(dest.join("c.txt"), "c").unwrap();
    srv.git(&dest, &["add", "c.txt"]);
    srv.git(&dest, &["commit", "-q", "-m", "C"]);
    let local = local_git(&srv, &dest, &["rev-parse", "HEAD"]);

    git::push(&dest, &url, TOKEN, "HEAD", "kodx/shallow", false).unwrap();

    assert_eq!(srv.branch_sha("acme/widgets", "kodx/shallow"), Some(local));
    assert_eq!(srv.commit_count("acme/widgets", "kodx/shallow"), 4);
    srv.git(&srv.bare_path("acme/widgets"), &["fsck", "--strict"]);
    git_server::assert_requests_clean(&srv, TOKEN);
}

#[test]
fn a_non_fast_forward_push_is_rejected_unless_forced() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let url = widgets(&srv);
    let (_tmp, dest) = new_dest();
    git::clone(&url, TOKEN, &dest, &Checkout::DefaultBranch, None).unwrap();
    // Someone else pushes to main meanwhile.
    let theirs = srv.commit_on_branch("acme/widgets", "main", &[("a.txt", b"a", 0o644)], "A");
    std::fs::write(dest.join("b.txt"), "b").unwrap();
    srv.git(&dest, &["add", "b.txt"]);
    srv.git(&dest, &["commit", "-q", "-m", "B"]);
    let ours = local_git(&srv, &dest, &["rev-parse", "HEAD"]);

    let err = git::push(&dest, &url, TOKEN, "HEAD", "main", false).unwrap_err();
    let GitError::Rejected { reason } = &err else {
        panic!("expected a rejection, got {err:?}");
    };
    assert!(reason.starts_with("refs/heads/main: "), "{reason}");
    assert!(
        reason.contains("non-fast") || reason.contains("not present locally"),
        "{reason}"
    );
    assert!(err
        .to_string()
        .starts_with("the git server rejected the push: "));
    assert_eq!(srv.branch_sha("acme/widgets", "main"), Some(theirs));

    git::push(&dest, &url, TOKEN, "HEAD", "main", true).unwrap();
    assert_eq!(srv.branch_sha("acme/widgets", "main"), Some(ours));
}

#[test]
fn a_ref_the_server_refuses_is_reported_with_its_reason() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let url = widgets(&srv);
    srv.set_config("acme/widgets", "receive.denyNonFastForwards", "true");
    let (_tmp, dest) = new_dest();
    git::clone(&url, TOKEN, &dest, &Checkout::DefaultBranch, None).unwrap();
    let before = srv.branch_sha("acme/widgets", "main");
    // Rewrite history locally so that only the server can say no.
    std::fs::write(dest.join("c.txt"), "c").unwrap();
    srv.git(&dest, &["add", "c.txt"]);
    srv.git(&dest, &["commit", "-q", "--amend", "-m", "Rewritten"]);

    let err = git::push(&dest, &url, TOKEN, "HEAD", "main", true).unwrap_err();

    let GitError::Rejected { reason } = &err else {
        panic!("expected a rejection, got {err:?}");
    };
    assert!(reason.starts_with("refs/heads/main: "), "{reason}");
    insta::assert_snapshot!(reason, @"refs/heads/main: non-fast-forward; the server said: error: denying non-fast-forward refs/heads/main (you should pull first)");
    assert_eq!(srv.branch_sha("acme/widgets", "main"), before);
}

#[test]
fn fetch_brings_a_pull_ref_into_an_existing_clone_without_touching_config() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let url = widgets(&srv);
    let (_tmp, dest) = new_dest();
    git::clone(&url, TOKEN, &dest, &Checkout::DefaultBranch, None).unwrap();
    let config_before = std::fs::read_to_string(dest.join(".git/config")).unwrap();
    let pr = srv.create_pull_ref("acme/widgets", 3, &[("p.txt", b"p", 0o644)]);

    git::fetch(&dest, &url, TOKEN, &["+refs/pull/3/head:refs/pull/3/head"]).unwrap();

    assert_eq!(
        local_git(&srv, &dest, &["rev-parse", "refs/pull/3/head"]),
        pr
    );
    let config_after = std::fs::read_to_string(dest.join(".git/config")).unwrap();
    assert_eq!(config_before, config_after);
    let err = git::fetch(&dest, &url, "ghs_bad", &["+refs/pull/3/head:refs/x"]).unwrap_err();
    assert_eq!(err, GitError::Auth);
}

#[test]
fn an_unreachable_server_is_a_network_error() {
    let Some(_srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let (_tmp, dest) = new_dest();
    let url = format!("http://127.0.0.1:{port}/acme/widgets.git");
    let started = Instant::now();
    let err = git::clone(&url, TOKEN, &dest, &Checkout::DefaultBranch, None).unwrap_err();
    assert!(matches!(err, GitError::Network(_)), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert!(err
        .to_string()
        .starts_with("could not talk to the git server: "));
}

#[test]
fn a_gzip_encoded_upload_pack_request_is_served() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let url = widgets(&srv);
    // Many branches make git's want list big enough (> 1 KiB) to be gzipped.
    for i in 0..40 {
        let name = format!("b{i}.txt");
        srv.commit_on_branch(
            "acme/widgets",
            &format!("branch-{i:02}"),
            &[(name.as_str(), b"x", 0o644)],
            "branch",
        );
    }
    let (tmp, dest) = new_dest();
    let header = format!(
        "http.extraHeader=Authorization: {}",
        basic_auth("x-access-token", TOKEN)
    );
    srv.git(
        tmp.path(),
        &["-c", &header, "clone", "-q", &url, dest.to_str().unwrap()],
    );
    assert_eq!(
        local_git(&srv, &dest, &["rev-parse", "origin/branch-39"]),
        srv.branch_sha("acme/widgets", "branch-39").unwrap()
    );
    let requests = srv.requests();
    assert!(
        requests.iter().any(|r| r.method == "POST"
            && r.path_and_query.ends_with("/git-upload-pack")
            && r.content_encoding.as_deref() == Some("gzip")
            && r.status == 200),
        "no gzip upload-pack request: {requests:?}"
    );
    assert!(
        requests.iter().all(|r| r.auth_ok && r.status == 200),
        "{requests:?}"
    );

    // libgit2 copes with the same repository.
    let (_t2, d2) = new_dest();
    git::clone(
        &url,
        TOKEN,
        &d2,
        &Checkout::Branch("branch-39".into()),
        None,
    )
    .unwrap();
}

/// Sends one raw HTTP/1.1 request and returns the status line and headers.
fn raw_request(srv: &GitServer, auth: Option<&str>) -> String {
    use std::io::{Read, Write};
    let addr = srv.url().trim_start_matches("http://").to_string();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    let mut req = format!(
        "GET /acme/widgets.git/info/refs?service=git-upload-pack HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n"
    );
    if let Some(a) = auth {
        req.push_str(&format!("Authorization: {a}\r\n"));
    }
    req.push_str("\r\n");
    s.write_all(req.as_bytes()).unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    out
}

#[test]
fn the_server_demands_the_right_basic_credentials() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    widgets(&srv);
    let wrong_user = basic_auth("someone", TOKEN);
    let wrong_token = basic_auth("x-access-token", "ghs_nope");
    let bearer = format!("Bearer {TOKEN}");
    for auth in [
        None,
        Some(wrong_user.as_str()),
        Some(wrong_token.as_str()),
        Some(bearer.as_str()),
        Some("Basic !!!"),
    ] {
        let resp = raw_request(&srv, auth);
        assert!(resp.starts_with("HTTP/1.1 401"), "{auth:?}: {resp}");
        assert!(
            resp.lines()
                .any(|l| l.eq_ignore_ascii_case("www-authenticate: basic realm=\"git\"")),
            "{resp}"
        );
    }
    let right = basic_auth("x-access-token", TOKEN);
    let resp = raw_request(&srv, Some(&right));
    assert!(resp.starts_with("HTTP/1.1 200"), "{resp}");
    assert!(
        resp.lines()
            .any(|l| l
                .eq_ignore_ascii_case("content-type: application/x-git-upload-pack-advertisement")),
        "{resp}"
    );
    let log = srv.requests();
    assert_eq!(log.len(), 6);
    assert_eq!(log.iter().filter(|r| r.auth_ok).count(), 1);
    assert_eq!(log[1].username.as_deref(), Some("someone"));
}

#[test]
fn base64_round_trips() {
    for s in [
        "",
        "a",
        "ab",
        "abc",
        "x-access-token:ghs_123",
        "\u{0}\u{ff}é",
    ] {
        let enc = git_server::base64_encode(s.as_bytes());
        assert_eq!(git_server::base64_decode(&enc).unwrap(), s.as_bytes());
    }
    assert_eq!(git_server::base64_encode(b"hello"), "aGVsbG8=");
    assert_eq!(git_server::base64_decode("aGVsbG8").as_deref(), None);
    assert_eq!(git_server::base64_decode("aG=sbG8=").as_deref(), None);
}
