#!/usr/bin/env bash
# What kodx adds around a repository's checks (SPEC §11–12):
# - against the target of ≤ 50 ms per check: per check on the real engine (three `true`
#   checks, median and p95 of 20 attempts, through the sandbox's check runner, beside one
#   engine exec per check as kodx does without it), and webhook → pull request with three
#   checks beside the same run without (medians of 5);
# - against the target of ≤ 1 s per pass: what running the checks apart from the agent adds
#   before they start (the change set read out of the agent's sandbox and written into the
#   checks' own), on a small and a cargo-sized repository, the checks' sandbox made ahead
#   (as in a run) and on demand (medians of 5 passes).
# Needs the Docker engine and the test images (bash .ci/run, or tests/images/build.sh).
#   KODX_BENCH_ATTEMPTS=50 KODX_BENCH_RUNS=9 KODX_BENCH_PASSES=9 bash bench/checks.sh
#   KODX_BENCH_ENGINE=journaled bash bench/checks.sh
#       the sandboxes on an engine whose data root is journaled ext4 (bench/journaled-engine.sh)
#   KODX_BENCH_LOG=1: each pass's parts (the change set and the sandbox, the write)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${KODX_BENCH_ENGINE:-}" = journaled ]; then
  socket=$(bash bench/journaled-engine.sh | sed -n 's/^socket=//p')
  export DOCKER_HOST="unix://$socket"
  echo "sandboxes on the journaled-ext4 engine: $DOCKER_HOST"
fi
cargo test --release --test bench -- --ignored --nocapture --test-threads 1 checks::
exec cargo test --release --test bench -- --ignored --nocapture --test-threads 1 verifier::
