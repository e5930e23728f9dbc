#!/usr/bin/env bash
# The cost estimate's query (issue 41, item 1) with 100,000 finished runs in the database,
# on SQLite and PostgreSQL: median and p95 over 200 queries (target: under 5 ms), and the
# query plan each backend chose.
#
#   bash bench/estimate.sh
#
# Environment: KODX_BENCH_RUNS (100000), KODX_BENCH_QUERIES (200); KODX_TEST_POSTGRES_URL to
# use a server already running (default: tests/postgres/start.sh starts a throwaway one).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${KODX_TEST_POSTGRES_URL:-}" ]; then
  KODX_TEST_POSTGRES_URL=$(bash tests/postgres/start.sh)
  export KODX_TEST_POSTGRES_URL
fi
exec cargo test --release --test bench -- --ignored --nocapture --test-threads 1 estimate::
