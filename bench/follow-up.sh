#!/usr/bin/env bash
# What one follow-up run of the pull request's life (SPEC §11) costs: a CI repair run
# (webhook → repaired, pushed, reported), the re-run path (webhook → failed Actions jobs
# re-run, no model call; then their second failure → repaired), a `/kodx address-reviews` run with three
# threads (comment → pushed, replied, resolved) and the conflict path (SPEC §12: a push to
# the base → the merge commit pushed, with `pr.keep_mergeable`), through the real `kodx serve` against the
# fake GitHub and a scripted model: median and slowest wall time, and the GitHub requests
# (REST and GraphQL) and model calls of one run.
# Needs the Docker engine and the test images (bash .ci/run, or tests/images/build.sh).
#   KODX_BENCH_RUNS=9 bash bench/follow-up.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release --test bench -- --ignored --nocapture --test-threads 1 follow_up::
