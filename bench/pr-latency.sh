#!/usr/bin/env bash
# Webhook → pull request opened, end to end through the real `kodx serve` (release build),
# the real Docker engine, a real git server (git http-backend) and a scripted model that
# answers at once; small repository and 20,000-file repository. Prints the median of each
# phase and of the whole. Needs the Docker engine and the test images (bash .ci/run, or
# tests/images/build.sh with dockerd running).
#   KODX_BENCH_RUNS=7 bash bench/pr-latency.sh
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release --test bench_pr -- --ignored --nocapture --test-threads 1
