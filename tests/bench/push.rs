//! Benchmark (ignored by default; `cargo test --release --test bench -- --ignored
//! --nocapture push::`): a code run's push alone,
//! as `kodx serve` makes it, on a cargo-sized repository (3,000 files, 20,000 commits,
//! synthetic): a tip-only clone from the repository cache, one new file committed on the
//! tip, pushed to a new branch over smart HTTP (the real `git http-backend`), through
//! libgit2 and in one request (`git::push_new_branch`, what a run does now). Prints each
//! push's time and each request the git server answered (what it took there, and the
//! bytes sent), so the client's part and the server's part can be told apart.

use crate::common;

use std::time::Instant;

use common::git_server::{accept_tokens, GitServer};
use kodx::git::{self, Checkout, History};
use kodx::repo_cache::{RepoCache, RepoKey};

use crate::stats::{env_usize, median};

const TOKEN: &str = "ghs_BenchInstallationToken0123456789abcd";
const REPO: &str = "acme/cargo";

/// Commits one new file on `HEAD` of the clone at `dir` (its branch moves), as a run's
/// change set is committed from the objects.
fn commit_one_file(dir: &std::path::Path, name: &str) -> git2::Oid {
    let repo = git2::Repository::open(dir).unwrap();
    let head = repo.head().unwrap().peel_to_commit().unwrap();
    let blob = repo.blob(format!("{name}\n").as_bytes()).unwrap();
    let mut tree = repo.treebuilder(Some(&head.tree().unwrap())).unwrap();
    tree.insert(name, blob, 0o100644).unwrap();
    let tree = repo.find_tree(tree.write().unwrap()).unwrap();
    let who = git2::Signature::now("kodx[bot]", "1+kodx[bot]@users.noreply.github.com").unwrap();
    repo.commit(Some("HEAD"), &who, &who, "Bench", &tree, &[&head])
        .unwrap()
}

#[test]
#[ignore = "benchmark: cargo test --release --test bench -- --ignored --nocapture push::"]
fn one_commit_push() {
    let runs = env_usize("KODX_BENCH_RUNS", 5);
    let files = env_usize("KODX_BENCH_FILES", 3_000);
    let commits = env_usize("KODX_BENCH_COMMITS", 20_000);
    let srv = GitServer::start(accept_tokens(&[TOKEN]));
    let url = srv.create_repo(REPO, "main", &[("README.md", b"bench\n", 0o644)]);
    common::synthetic::fill_bare(&srv.bare_path(REPO), files, commits);
    let tmp = tempfile::tempdir().unwrap();
    let cache = RepoCache::new(tmp.path().join("mirrors"), 8 << 30);
    let key = RepoKey::parse(REPO).unwrap();
    let mut totals = std::collections::BTreeMap::new();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let runtime = rt.handle().clone();
    for i in 0..runs.max(2) {
        let dest = tmp.path().join(format!("run-{i}"));
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
        // libgit2's push, then the one-request push of the next commit (its parent is
        // on the server now, as a run's tip is).
        for (way, branch) in [
            ("libgit2", format!("kodx/issue-{i}-libgit2")),
            ("one request", format!("kodx/issue-{i}-direct")),
        ] {
            let made = commit_one_file(
                &dest,
                &format!("bench-{i}-{}.txt", &branch[branch.len() - 3..]),
            );
            let before = srv.requests().len();
            let started = Instant::now();
            if way == "libgit2" {
                git::push_checked(&dest, &url, TOKEN, "HEAD", &branch, true, &|| true).unwrap();
            } else {
                let pushed =
                    git::push_new_branch(&dest, &url, TOKEN, &branch, &runtime, &|| true).unwrap();
                assert!(matches!(pushed, git::Direct::Pushed { .. }), "{pushed:?}");
            }
            let took = started.elapsed().as_secs_f64() * 1000.0;
            assert_eq!(srv.branch_sha(REPO, &branch).unwrap(), made.to_string());
            let requests = srv.requests();
            let server: f64 = requests[before..]
                .iter()
                .map(|r| r.took.as_secs_f64() * 1000.0)
                .sum();
            println!(
                "push {i} ({way}): {took:.1} ms, of which the server {server:.1} ms over {} request(s):",
                requests.len() - before
            );
            for r in &requests[before..] {
                println!(
                    "    {} {} -> {} in {:.1} ms, {} bytes sent",
                    r.method,
                    r.path_and_query,
                    r.status,
                    r.took.as_secs_f64() * 1000.0,
                    r.body_bytes
                );
            }
            if i > 0 {
                totals.entry(way).or_insert_with(Vec::new).push(took);
            }
        }
    }
    for (way, took) in totals {
        println!(
            "one-commit push ({way}), {files} files and {commits} commits: median of the later pushes {:.1} ms",
            median(took)
        );
    }
}
