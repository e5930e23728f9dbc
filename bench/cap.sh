#!/usr/bin/env bash
# Cap utilisation (issue 41, item 4): the agent loop against a model that always asks for
# another command, until the cap stops it, at $0.05, $0.50 and $2.00, billed plain, with a
# prompt cache and with a cache that keeps nothing; spend / cap of each run and the largest
# of all (must be <= 1).
#
#   bash bench/cap.sh
#
# KODX_BENCH_DETAIL=1 prints every call's usage and cost.
set -euo pipefail
cd "$(dirname "$0")/.."
exec cargo test --release --test bench -- --ignored --nocapture --test-threads 1 cap::
