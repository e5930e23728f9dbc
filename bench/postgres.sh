#!/usr/bin/env bash
# The queue on PostgreSQL, side by side with SQLite (issue 14's figures), against the real
# `kodx serve` release binary:
#   - webhook intake on the queued path: requests/s, p50, p99 on each backend
#     (target: PostgreSQL within 2x of SQLite);
#   - queued -> claimed latency from an intake process to an idle worker process woken by
#     LISTEN/NOTIFY (target: p99 <= 50 ms);
#   - /kodx ask runs finished per minute with 1, 2 and 3 worker processes, a model that
#     answers at once, real containers (needs the Docker engine and the test images).
#
#   bash bench/postgres.sh
#
# Environment: KODX_BENCH_REQUESTS (3000), KODX_BENCH_CONCURRENCY (32), KODX_BENCH_CLAIMS
# (200), KODX_BENCH_RUNS (30); KODX_TEST_POSTGRES_URL to use a server already running
# (default: tests/postgres/start.sh starts a throwaway one on 127.0.0.1:55432).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ -z "${KODX_TEST_POSTGRES_URL:-}" ]; then
  KODX_TEST_POSTGRES_URL=$(bash tests/postgres/start.sh)
  export KODX_TEST_POSTGRES_URL
fi
exec cargo test --release --test bench -- --ignored --nocapture --test-threads 1 postgres::
