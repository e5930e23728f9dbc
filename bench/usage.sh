#!/usr/bin/env bash
# `kodx usage`'s queries (issue 41, item 3) with 100,000 finished runs over 30 days, on
# SQLite and PostgreSQL, by repository, person and kind: median and p95 over 20 reads, and
# the process's peak memory.
#
#   bash bench/usage.sh
#
# Environment: KODX_BENCH_RUNS (100000), KODX_BENCH_QUERIES (20); KODX_TEST_POSTGRES_URL to
# use a server already running (default: tests/postgres/start.sh starts a throwaway one).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${KODX_TEST_POSTGRES_URL:-}" ]; then
  KODX_TEST_POSTGRES_URL=$(bash tests/postgres/start.sh)
  export KODX_TEST_POSTGRES_URL
fi
exec cargo test --release --test bench -- --ignored --nocapture --test-threads 1 usage::
