//! kodx::git commit_all and push_rebasing against a real smart-HTTP server (`git http-backend`
//! behind basic auth), checked with the git CLI on the server's bare repository.

use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};

use crate::common::contains;
use crate::common::git_server::{self, basic_auth, GitServer};
use kodx::git::{self, Checkout, CommitRequest, Committed, GitError, Identity, PushOutcome};

const TOKEN: &str = "ghs_CommitTestToken7f3a9c0123456789";
const REPO: &str = "acme/widgets";
const BOT: &str = "kodx[bot]";
const BOT_EMAIL: &str = "123+kodx[bot]@users.noreply.github.com";
const COAUTHOR: &str = "alice <1005+alice@users.noreply.github.com>";

const BIG: [u8; 4096] = [b'x'; 4096];

fn widgets(srv: &GitServer) -> String {
    let url = srv.create_repo(
        REPO,
        "main",
        &[
            ("README.md", b"# Widgets\n", 0o644),
            ("src/lib.rs", b"pub fn old() {}\n", 0o644),
            ("obsolete.txt", b"remove me\n", 0o644),
            ("scripts/tool.sh", b"#!/bin/sh\necho tool\n", 0o644),
            ("notes.txt", b"notes\n", 0o644),
            ("link", b"README.md", 0o120000),
            ("tracked.log", b"tracked although ignored\n", 0o644),
            ("assets/big.bin", &BIG, 0o644),
        ],
    );
    // Ignore rules that match a file already tracked.
    srv.commit_on_branch(
        REPO,
        "main",
        &[(".gitignore", b"target/\n*.log\n", 0o644)],
        "Ignore build output",
    );
    url
}

fn clone(srv: &GitServer) -> (tempfile::TempDir, PathBuf, String) {
    let url = widgets(srv);
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("checkout");
    git::clone(&url, TOKEN, &dest, &Checkout::DefaultBranch, None).unwrap();
    (tmp, dest, url)
}

fn kodx() -> Identity {
    Identity {
        name: BOT.into(),
        email: BOT_EMAIL.into(),
    }
}

fn trailers(run: &str) -> Vec<(String, String)> {
    vec![
        ("Co-authored-by".into(), COAUTHOR.into()),
        ("Kodx-Run".into(), run.into()),
    ]
}

fn request<'a>(subject: &'a str, trailers: &'a [(String, String)]) -> CommitRequest<'a> {
    CommitRequest {
        author: kodx(),
        subject,
        body: "",
        trailers,
        max_file_bytes: 1 << 20,
    }
}

fn write(dir: &Path, path: &str, contents: &[u8], mode: u32) {
    let full = dir.join(path);
    std::fs::create_dir_all(full.parent().unwrap()).unwrap();
    std::fs::write(&full, contents).unwrap();
    std::fs::set_permissions(&full, std::fs::Permissions::from_mode(mode)).unwrap();
}

fn local_git(srv: &GitServer, dir: &Path, args: &[&str]) -> String {
    let out = srv.git(dir, args);
    String::from_utf8(out.stdout)
        .unwrap()
        .trim_end()
        .to_string()
}

fn bare_git(srv: &GitServer, args: &[&str]) -> String {
    local_git(srv, &srv.bare_path(REPO), args)
}

/// Whether `ancestor` is an ancestor of (or equal to) `rev` in the server's repository.
fn is_ancestor(srv: &GitServer, ancestor: &str, rev: &str) -> bool {
    srv.git_cmd(&srv.bare_path(REPO))
        .args(["merge-base", "--is-ancestor", ancestor, rev])
        .status()
        .unwrap()
        .success()
}

/// A pre-receive hook on the server's repository (installed after the setup commits, which
/// the git CLI pushes through hooks too).
fn install_pre_receive(srv: &GitServer, script: &str) {
    let hook = srv.bare_path(REPO).join("hooks/pre-receive");
    std::fs::create_dir_all(hook.parent().unwrap()).unwrap();
    std::fs::write(&hook, script).unwrap();
    std::fs::set_permissions(&hook, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Every regular file under `dir`, recursively (symlinks not followed).
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

/// Fails if the token, or the basic-auth header made of it, is in any file under `.git`.
fn assert_no_token_under_git(dest: &Path) {
    let header = basic_auth("x-access-token", TOKEN);
    let encoded = header.trim_start_matches("Basic ");
    let files = files_under(&dest.join(".git"));
    assert!(files.len() > 5, "expected a git directory under {dest:?}");
    for f in files {
        let bytes = std::fs::read(&f).unwrap();
        assert!(!contains(&bytes, TOKEN.as_bytes()), "token in {f:?}");
        assert!(
            !contains(&bytes, encoded.as_bytes()),
            "encoded token in {f:?}"
        );
    }
}

#[test]
fn commits_exactly_the_work_tree_changes_and_pushes_them() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let (_tmp, dest, url) = clone(&srv);
    let main = srv.branch_sha(REPO, "main").unwrap();

    // Modify, add an executable, delete, add a symlink, make a tracked file executable,
    // retarget a symlink, turn a file into a symlink, touch a tracked-but-ignored file.
    write(&dest, "src/lib.rs", b"pub fn new() {}\n", 0o644);
    write(&dest, "run.sh", b"#!/bin/sh\nexit 0\n", 0o755);
    std::fs::remove_file(dest.join("obsolete.txt")).unwrap();
    std::fs::create_dir_all(dest.join("docs")).unwrap();
    symlink("../README.md", dest.join("docs/readme")).unwrap();
    std::fs::set_permissions(
        dest.join("scripts/tool.sh"),
        std::fs::Permissions::from_mode(0o755),
    )
    .unwrap();
    std::fs::remove_file(dest.join("link")).unwrap();
    symlink("src/lib.rs", dest.join("link")).unwrap();
    std::fs::remove_file(dest.join("notes.txt")).unwrap();
    symlink("README.md", dest.join("notes.txt")).unwrap();
    write(&dest, "tracked.log", b"updated\n", 0o644);
    // Ignored: by .gitignore (a directory and a pattern) and by .git/info/exclude.
    write(&dest, "target/debug/out.o", b"object", 0o644);
    write(&dest, "build.log", b"log", 0o644);
    std::fs::create_dir_all(dest.join(".git/info")).unwrap();
    std::fs::write(dest.join(".git/info/exclude"), "secret.env\n").unwrap();
    write(&dest, "secret.env", b"KEY=1", 0o600);

    let subject = "Fix the widget parser so that it accepts\nnested widgets \u{7} and reports errors with line numbers ünd more";
    let trailers = trailers("run-0f3a");
    let req = CommitRequest {
        body: "kodx run run-0f3a\r\nasked for by @alice\n",
        ..request(subject, &trailers)
    };
    let committed = git::commit_all(&dest, &req).unwrap().expect("a commit");

    let expected_paths = [
        "docs/readme",
        "link",
        "notes.txt",
        "obsolete.txt",
        "run.sh",
        "scripts/tool.sh",
        "src/lib.rs",
        "tracked.log",
    ];
    assert_eq!(
        committed,
        Committed {
            sha: committed.sha.clone(),
            files_changed: expected_paths.len(),
            paths: expected_paths.iter().map(|p| p.to_string()).collect(),
        }
    );
    assert_eq!(
        local_git(&srv, &dest, &["rev-parse", "HEAD"]),
        committed.sha
    );
    assert_eq!(
        local_git(&srv, &dest, &["symbolic-ref", "HEAD"]),
        "refs/heads/main"
    );
    // Nothing left over but the ignored files.
    assert_eq!(local_git(&srv, &dest, &["status", "--porcelain"]), "");

    git::push(&dest, &url, TOKEN, "HEAD", "kodx/commit-test", false).unwrap();
    let branch = "kodx/commit-test";
    assert_eq!(srv.branch_sha(REPO, branch), Some(committed.sha.clone()));

    // The exact tree: modes, symlinks, the deletion, no ignored files.
    let mut tree = srv.ls_tree(REPO, branch);
    tree.sort_by(|a, b| a.1.cmp(&b.1));
    let expected: Vec<(u32, String)> = [
        (0o100644, ".gitignore"),
        (0o100644, "README.md"),
        (0o100644, "assets/big.bin"),
        (0o120000, "docs/readme"),
        (0o120000, "link"),
        (0o120000, "notes.txt"),
        (0o100755, "run.sh"),
        (0o100755, "scripts/tool.sh"),
        (0o100644, "src/lib.rs"),
        (0o100644, "tracked.log"),
    ]
    .iter()
    .map(|(m, p)| (*m, p.to_string()))
    .collect();
    assert_eq!(tree, expected);
    let file = |p: &str| srv.file_at(REPO, branch, p);
    assert_eq!(file("src/lib.rs").unwrap(), b"pub fn new() {}\n");
    assert_eq!(file("run.sh").unwrap(), b"#!/bin/sh\nexit 0\n");
    assert_eq!(file("docs/readme").unwrap(), b"../README.md");
    assert_eq!(file("link").unwrap(), b"src/lib.rs");
    assert_eq!(file("notes.txt").unwrap(), b"README.md");
    assert_eq!(file("tracked.log").unwrap(), b"updated\n");
    assert_eq!(file("obsolete.txt"), None);
    assert_eq!(file("target/debug/out.o"), None);
    assert_eq!(file("build.log"), None);
    assert_eq!(file("secret.env"), None);

    // Author, committer, parent.
    let meta = bare_git(&srv, &["log", "-1", "--format=%an|%ae|%cn|%ce|%P", branch]);
    assert_eq!(meta, format!("{BOT}|{BOT_EMAIL}|{BOT}|{BOT_EMAIL}|{main}"));

    // The message: a one-line subject cut at 72 characters with "…", the body, trailers.
    let message = bare_git(&srv, &["log", "-1", "--format=%B", branch]);
    let subject_line = message.lines().next().unwrap();
    assert_eq!(subject_line.chars().count(), 72, "{subject_line:?}");
    assert!(subject_line.ends_with('…'), "{subject_line:?}");
    assert!(
        subject_line.starts_with("Fix the widget parser so that it accepts nested widgets and"),
        "{subject_line:?}"
    );
    assert!(!subject_line.contains('\u{7}'));
    assert_eq!(
        message,
        format!(
            "{subject_line}\n\nkodx run run-0f3a\nasked for by @alice\n\n\
             Co-authored-by: {COAUTHOR}\nKodx-Run: run-0f3a"
        )
    );
    // git itself reads the trailers.
    let parsed = bare_git(
        &srv,
        &["log", "-1", "--format=%(trailers:only,unfold)", branch],
    );
    assert_eq!(
        parsed,
        format!("Co-authored-by: {COAUTHOR}\nKodx-Run: run-0f3a")
    );
    srv.git(&srv.bare_path(REPO), &["fsck", "--strict"]);
    assert_no_token_under_git(&dest);
    git_server::assert_requests_clean(&srv, TOKEN);
}

#[test]
fn nothing_to_commit_is_none() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let (_tmp, dest, _url) = clone(&srv);
    let head = local_git(&srv, &dest, &["rev-parse", "HEAD"]);
    let trailers = trailers("run-1");

    assert_eq!(
        git::commit_all(&dest, &request("Nothing", &trailers)).unwrap(),
        None
    );

    // Ignored files only, and a file rewritten with the same content.
    write(&dest, "target/x", b"x", 0o644);
    write(&dest, "debug.log", b"x", 0o644);
    write(&dest, "README.md", b"# Widgets\n", 0o644);
    assert_eq!(
        git::commit_all(&dest, &request("Nothing", &trailers)).unwrap(),
        None
    );
    assert_eq!(local_git(&srv, &dest, &["rev-parse", "HEAD"]), head);
    assert_eq!(
        local_git(&srv, &dest, &["rev-list", "--count", "HEAD"]),
        "2"
    );

    // A change and its undoing cancel out too.
    write(&dest, "README.md", b"changed\n", 0o644);
    std::fs::write(dest.join("README.md"), b"# Widgets\n").unwrap();
    write(&dest, "tmp.txt", b"t", 0o644);
    std::fs::remove_file(dest.join("tmp.txt")).unwrap();
    assert_eq!(
        git::commit_all(&dest, &request("Nothing", &trailers)).unwrap(),
        None
    );
    assert_eq!(local_git(&srv, &dest, &["rev-parse", "HEAD"]), head);
}

#[test]
fn a_too_large_changed_file_refuses_the_commit() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let (_tmp, dest, _url) = clone(&srv);
    let head = local_git(&srv, &dest, &["rev-parse", "HEAD"]);
    let trailers = trailers("run-2");
    let limited = |subject| CommitRequest {
        max_file_bytes: 1024,
        ..request(subject, &trailers)
    };

    // A new file over the limit.
    write(&dest, "data/dump.bin", &[7u8; 2000], 0o644);
    write(&dest, "small.txt", b"small", 0o644);
    let err = git::commit_all(&dest, &limited("Add dump")).unwrap_err();
    assert_eq!(
        err,
        GitError::TooLarge {
            path: "data/dump.bin".into(),
            bytes: 2000,
            limit: 1024
        }
    );
    let message = err.to_string();
    crate::common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(message, @"the change to `data/dump.bin` is 2000 bytes, over the limit of 1024 bytes for a changed file; nothing was committed"));
    assert_eq!(local_git(&srv, &dest, &["rev-parse", "HEAD"]), head);
    // Nothing was staged.
    assert_eq!(
        local_git(&srv, &dest, &["diff", "--cached", "--name-only"]),
        ""
    );

    // A tracked file grown over the limit.
    std::fs::remove_file(dest.join("data/dump.bin")).unwrap();
    write(&dest, "src/lib.rs", &[b'/'; 1500], 0o644);
    let err = git::commit_all(&dest, &limited("Grow lib")).unwrap_err();
    assert!(
        matches!(&err, GitError::TooLarge { path, bytes: 1500, .. } if path == "src/lib.rs"),
        "{err:?}"
    );
    assert_eq!(local_git(&srv, &dest, &["rev-parse", "HEAD"]), head);

    // Untouched large files already in the repository and large ignored files are fine.
    write(&dest, "src/lib.rs", b"pub fn fine() {}\n", 0o644);
    write(&dest, "target/huge.o", &[0u8; 5000], 0o644);
    let committed = git::commit_all(&dest, &limited("Small change"))
        .unwrap()
        .expect("a commit");
    assert_eq!(committed.paths, ["small.txt", "src/lib.rs"]);
    assert_eq!(
        local_git(&srv, &dest, &["rev-parse", "HEAD^"]),
        head,
        "one commit on top"
    );
}

/// Clones, commits one change with commit_all; returns the clone and the commit.
fn clone_and_commit(
    srv: &GitServer,
    path: &str,
    contents: &[u8],
) -> (tempfile::TempDir, PathBuf, String, Committed) {
    let (tmp, dest, url) = clone(srv);
    write(&dest, path, contents, 0o644);
    let trailers = trailers("run-3");
    let committed = git::commit_all(&dest, &request("Change things", &trailers))
        .unwrap()
        .expect("a commit");
    (tmp, dest, url, committed)
}

#[test]
fn push_rebasing_without_a_race_pushes_as_is() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let (_tmp, dest, url, committed) = clone_and_commit(&srv, "new.txt", b"new\n");

    let outcome = git::push_rebasing(&dest, &url, TOKEN, "main", 3).unwrap();

    assert_eq!(
        outcome,
        PushOutcome {
            sha: committed.sha.clone(),
            rebased: false
        }
    );
    assert_eq!(srv.branch_sha(REPO, "main"), Some(committed.sha));
    // Pushing again is a no-op.
    let again = git::push_rebasing(&dest, &url, TOKEN, "main", 3).unwrap();
    assert_eq!(again, outcome);
    git_server::assert_requests_clean(&srv, TOKEN);
}

#[test]
fn push_rebasing_rebases_onto_a_branch_that_moved() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let (_tmp, dest, url, committed) = clone_and_commit(&srv, "ours.txt", b"ours\n");
    let base = local_git(&srv, &dest, &["rev-parse", "HEAD^"]);
    let theirs = srv.commit_on_branch(
        REPO,
        "main",
        &[("theirs.txt", b"theirs\n", 0o644)],
        "Theirs",
    );

    let outcome = git::push_rebasing(&dest, &url, TOKEN, "main", 3).unwrap();

    assert!(outcome.rebased);
    assert_ne!(outcome.sha, committed.sha, "the commit was rewritten");
    assert_eq!(srv.branch_sha(REPO, "main"), Some(outcome.sha.clone()));
    // Not forced: their commit (and the old base) are ancestors of the new head.
    assert!(is_ancestor(&srv, &theirs, "main"));
    assert!(is_ancestor(&srv, &base, "main"));
    assert_eq!(
        bare_git(&srv, &["rev-parse", "main^"]),
        theirs,
        "our commit sits directly on theirs"
    );
    assert_eq!(srv.file_at(REPO, "main", "ours.txt").unwrap(), b"ours\n");
    assert_eq!(
        srv.file_at(REPO, "main", "theirs.txt").unwrap(),
        b"theirs\n"
    );
    // Author and committer stay kodx; the message is kept.
    assert_eq!(
        bare_git(&srv, &["log", "-1", "--format=%an|%ae|%cn|%ce", "main"]),
        format!("{BOT}|{BOT_EMAIL}|{BOT}|{BOT_EMAIL}")
    );
    assert_eq!(
        bare_git(&srv, &["log", "-1", "--format=%B", "main"]),
        local_git(&srv, &dest, &["log", "-1", "--format=%B", &committed.sha])
    );
    // The local branch and work tree follow.
    assert_eq!(local_git(&srv, &dest, &["rev-parse", "HEAD"]), outcome.sha);
    assert_eq!(
        local_git(&srv, &dest, &["symbolic-ref", "HEAD"]),
        "refs/heads/main"
    );
    assert_eq!(std::fs::read(dest.join("theirs.txt")).unwrap(), b"theirs\n");
    assert_eq!(local_git(&srv, &dest, &["status", "--porcelain"]), "");
    srv.git(&srv.bare_path(REPO), &["fsck", "--strict"]);
    assert_no_token_under_git(&dest);
    git_server::assert_requests_clean(&srv, TOKEN);
}

#[test]
fn push_rebasing_from_a_shallow_clone() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let url = widgets(&srv);
    srv.commit_on_branch(REPO, "main", &[("a.txt", b"a", 0o644)], "A");
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("checkout");
    git::clone(&url, TOKEN, &dest, &Checkout::DefaultBranch, Some(1)).unwrap();
    write(&dest, "ours.txt", b"ours\n", 0o644);
    let trailers = trailers("run-5");
    git::commit_all(&dest, &request("Ours", &trailers))
        .unwrap()
        .unwrap();
    let theirs = srv.commit_on_branch(REPO, "main", &[("b.txt", b"b", 0o644)], "B");

    let outcome = git::push_rebasing(&dest, &url, TOKEN, "main", 2).unwrap();

    assert!(outcome.rebased);
    assert_eq!(srv.branch_sha(REPO, "main"), Some(outcome.sha));
    assert!(is_ancestor(&srv, &theirs, "main"));
    assert_eq!(srv.commit_count(REPO, "main"), 5);
    assert_eq!(srv.file_at(REPO, "main", "ours.txt").unwrap(), b"ours\n");
    srv.git(&srv.bare_path(REPO), &["fsck", "--strict"]);
}

#[test]
fn a_conflicting_remote_change_is_a_conflict_and_nothing_is_pushed() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let (_tmp, dest, url, committed) = clone_and_commit(&srv, "README.md", b"# Widgets, by kodx\n");
    let theirs = srv.commit_on_branch(
        REPO,
        "main",
        &[("README.md", b"# Widgets, by someone else\n", 0o644)],
        "Theirs",
    );

    let err = git::push_rebasing(&dest, &url, TOKEN, "main", 3).unwrap_err();

    assert_eq!(
        err,
        GitError::Conflict {
            paths: vec!["README.md".into()]
        }
    );
    let message = err.to_string();
    crate::common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(message, @"the branch moved on the server meanwhile and kodx's commits conflict with the new commits in `README.md`; nothing was pushed"));
    assert_eq!(srv.branch_sha(REPO, "main"), Some(theirs));
    // The local branch, work tree and repository state are as before.
    assert_eq!(
        local_git(&srv, &dest, &["rev-parse", "HEAD"]),
        committed.sha
    );
    assert_eq!(
        std::fs::read(dest.join("README.md")).unwrap(),
        b"# Widgets, by kodx\n"
    );
    assert_eq!(local_git(&srv, &dest, &["status", "--porcelain"]), "");
    assert!(!dest.join(".git/rebase-merge").exists());
    assert!(!dest.join(".git/rebase-apply").exists());
    assert_no_token_under_git(&dest);
}

#[test]
fn a_branch_that_keeps_moving_is_given_up_without_forcing() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let (_tmp, dest, url, _committed) = clone_and_commit(&srv, "ours.txt", b"ours\n");
    let theirs = srv.commit_on_branch(REPO, "main", &[("theirs.txt", b"t", 0o644)], "Theirs");

    let err = git::push_rebasing(&dest, &url, TOKEN, "main", 0).unwrap_err();

    assert_eq!(
        err,
        GitError::Moved {
            branch: "main".into(),
            attempts: 0
        }
    );
    insta::assert_snapshot!(err.to_string(), @"the branch `main` kept moving on the server: after 0 rebase(s) onto it the push was still refused as non-fast-forward; kodx never force-pushes");
    assert_eq!(srv.branch_sha(REPO, "main"), Some(theirs));
}

#[test]
fn a_branch_moved_during_the_push_is_fetched_rebased_and_pushed_again() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let (_tmp, dest, url, _committed) = clone_and_commit(&srv, "ours.txt", b"ours\n");
    // Between the advertisement and the update, someone else's commit lands (once): the
    // hook adds it outside the push's quarantine, so the server's ref update fails.
    let marker = srv.bare_path(REPO).join("raced");
    install_pre_receive(
        &srv,
        &format!(
            "#!/bin/sh\n\
             [ -e '{marker}' ] && exit 0\n\
             touch '{marker}'\n\
             unset GIT_QUARANTINE_PATH GIT_OBJECT_DIRECTORY GIT_ALTERNATE_OBJECT_DIRECTORIES\n\
             export GIT_AUTHOR_NAME=racer GIT_AUTHOR_EMAIL=racer@example.com\n\
             export GIT_COMMITTER_NAME=racer GIT_COMMITTER_EMAIL=racer@example.com\n\
             old=$(git rev-parse refs/heads/main)\n\
             new=$(git commit-tree -p \"$old\" -m Race \"$old^{{tree}}\")\n\
             git update-ref refs/heads/main \"$new\" \"$old\" || exit 1\n\
             exit 0\n",
            marker = marker.display()
        ),
    );

    let outcome = git::push_rebasing(&dest, &url, TOKEN, "main", 2).unwrap();

    assert!(marker.exists(), "the hook ran");
    assert!(outcome.rebased);
    assert_eq!(srv.branch_sha(REPO, "main"), Some(outcome.sha.clone()));
    assert_eq!(
        bare_git(&srv, &["log", "-1", "--format=%s", "main^"]),
        "Race"
    );
    assert_eq!(srv.file_at(REPO, "main", "ours.txt").unwrap(), b"ours\n");
}

#[test]
fn a_push_the_server_refuses_carries_its_reason() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let (_tmp, dest, url) = clone(&srv);
    let before = srv.branch_sha(REPO, "main");
    write(&dest, ".github/workflows/ci.yml", b"on: push\n", 0o644);
    let trailers = trailers("run-4");
    git::commit_all(&dest, &request("Add CI", &trailers))
        .unwrap()
        .unwrap();
    let workflow = "refusing to allow a GitHub App to create or update workflow \
                    `.github/workflows/ci.yml` without `workflows` permission";
    install_pre_receive(&srv, &format!("#!/bin/sh\necho '{workflow}' >&2\nexit 1\n"));

    let err = git::push_rebasing(&dest, &url, TOKEN, "main", 3).unwrap_err();

    let GitError::Rejected { reason } = &err else {
        panic!("expected a rejection, got {err:?}");
    };
    assert!(reason.starts_with("refs/heads/main: "), "{reason}");
    crate::common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(reason, @"refs/heads/main: pre-receive hook declined; the server said: refusing to allow a GitHub App to create or update workflow `.github/workflows/ci.yml` without `workflows` permission"));
    let explained = git::explain_rejection(reason);
    assert!(
        explained.starts_with("the App is not allowed to change files under .github/workflows/"),
        "{explained}"
    );
    crate::common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(explained, @"the App is not allowed to change files under .github/workflows/, such as `.github/workflows/ci.yml` (it lacks the workflows permission); grant the App the workflows permission, or ask for a change that leaves .github/workflows/ alone (GitHub said: refs/heads/main: pre-receive hook declined; the server said: refusing to allow a GitHub App to create or update workflow `.github/workflows/ci.yml` without `workflows` permission)"));
    assert_eq!(srv.branch_sha(REPO, "main"), before);

    // The plain push reports the same; so does a protected-branch refusal.
    let err = git::push(&dest, &url, TOKEN, "HEAD", "main", false).unwrap_err();
    assert!(
        matches!(&err, GitError::Rejected { reason: plain } if plain == reason),
        "{err:?}"
    );
    install_pre_receive(
        &srv,
        "#!/bin/sh\n\
         echo 'error: GH006: Protected branch update failed for refs/heads/main.' >&2\n\
         echo 'error: Changes must be made through a pull request.' >&2\n\
         exit 1\n",
    );
    let err = git::push_rebasing(&dest, &url, TOKEN, "main", 3).unwrap_err();
    let GitError::Rejected { reason } = &err else {
        panic!("expected a rejection, got {err:?}");
    };
    crate::common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(reason, @"refs/heads/main: pre-receive hook declined; the server said: error: GH006: Protected branch update failed for refs/heads/main. error: Changes must be made through a pull request."));
    let explained = git::explain_rejection(reason);
    crate::common::serve::redactions(&[], &[]).bind(|| insta::assert_snapshot!(explained, @"the push was refused because the branch is protected (it may require pull requests, reviews or status checks, or forbid pushes by apps); allow the App to push to it, or ask kodx to work on another branch (GitHub said: refs/heads/main: pre-receive hook declined; the server said: error: GH006: Protected branch update failed for refs/heads/main. error: Changes must be made through a pull request.)"));
    assert_eq!(srv.branch_sha(REPO, "main"), before);
    assert_no_token_under_git(&dest);
    git_server::assert_requests_clean(&srv, TOKEN);
}

#[test]
fn a_refused_token_on_push_rebasing_is_an_auth_error() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let (_tmp, dest, url, _committed) = clone_and_commit(&srv, "x.txt", b"x");
    let before = srv.branch_sha(REPO, "main");
    let err = git::push_rebasing(&dest, &url, "ghs_wrong", "main", 3).unwrap_err();
    assert_eq!(err, GitError::Auth);
    assert!(!err.to_string().contains("ghs_wrong"));
    assert_eq!(srv.branch_sha(REPO, "main"), before);
}

#[test]
fn embedded_repositories_stay_out() {
    let Some(srv) = git_server::start_or_skip(TOKEN) else {
        return;
    };
    let (_tmp, dest, _url) = clone(&srv);
    // A dependency the agent cloned, and a directory that merely looks like one.
    std::fs::create_dir_all(dest.join("vendor/lib")).unwrap();
    srv.git(&dest.join("vendor/lib"), &["init", "-q"]);
    write(&dest, "vendor/lib/a.txt", b"a", 0o644);
    srv.git(&dest.join("vendor/lib"), &["add", "a.txt"]);
    srv.git(&dest.join("vendor/lib"), &["commit", "-qm", "x"]);
    write(
        &dest,
        "vendor/other/.git/HEAD",
        b"ref: refs/heads/main\n",
        0o644,
    );
    write(&dest, "vendor/other/b.txt", b"b", 0o644);
    write(&dest, "c.txt", b"c", 0o644);
    let trailers = trailers("run-6");
    let req = CommitRequest {
        max_file_bytes: 16,
        ..request("Add c", &trailers)
    };

    let committed = git::commit_all(&dest, &req).unwrap().expect("a commit");

    assert_eq!(committed.paths, ["c.txt"]);
    let tree = local_git(&srv, &dest, &["ls-tree", "-r", "--name-only", "HEAD"]);
    assert!(!tree.contains("vendor"), "{tree}");
}
