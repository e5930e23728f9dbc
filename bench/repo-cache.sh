#!/usr/bin/env bash
# The repository cache (issue 11) on a synthetic repository shaped like rust-lang/cargo
# (3,000 files, 20,000 commits, made with git fast-import) served by the real
# git http-backend: cold clone as today, cold mirror, warm refresh with 1 new commit, a
# run's clone from the mirror, and the tree into the container's tar from disk vs from the
# git objects. Prints each median against its target. Needs the git CLI.
#   KODX_BENCH_RUNS=5 bash bench/repo-cache.sh
#   KODX_BENCH_FILES=500 KODX_BENCH_COMMITS=2000 bash bench/repo-cache.sh   # a quick look
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release --test bench -- --ignored --nocapture --test-threads 1 stress_repo_cache::
