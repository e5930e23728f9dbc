#!/usr/bin/env bash
# What kodx adds around a repository's checks (SPEC §11), against the target of ≤ 50 ms per
# check: per check on the real engine (three `true` checks, median and p95 of 20 attempts,
# through the sandbox's check runner, beside one engine exec per check as kodx does without
# it), and webhook → pull request with three checks beside the same run without (medians of 5).
# Needs the Docker engine and the test images (bash .ci/run, or tests/images/build.sh).
#   KODX_BENCH_ATTEMPTS=50 KODX_BENCH_RUNS=9 bash bench/checks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release --test bench_checks -- --ignored --nocapture --test-threads 1
