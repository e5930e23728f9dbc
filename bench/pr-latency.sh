#!/usr/bin/env bash
# Webhook → pull request opened, end to end through the real `kodx serve` (release build),
# the real Docker engine, a real git server (git http-backend) and a scripted model that
# answers at once, on a small repository, a cargo-sized one (3,000 files, 20,000 commits,
# synthetic history via git fast-import), a 20,000-file one, and the 20,000 files with a
# setup script (later runs from the setup cache, main moving one commit between runs).
# Each repository starts with a cold repository cache: the first run makes the mirror, the
# later ones fetch. Prints each phase (first run, median of later runs), queue and
# acknowledgement time, `/kodx ask` latency from the model's last answer to the posted
# answer, and each figure against the issue 11 target (ok/MISSED). Needs the Docker engine
# and the test images (bash .ci/run, or tests/images/build.sh with dockerd running).
#   KODX_BENCH_RUNS=5 bash bench/pr-latency.sh
#   KODX_BENCH_FILES=300 KODX_BENCH_COMMITS=500 bash bench/pr-latency.sh   # a quick look
#   KODX_BENCH_ENGINE=journaled bash bench/pr-latency.sh
#       the sandboxes on an engine whose data root is journaled ext4 (bench/journaled-engine.sh),
#       for machines whose own disk is ext4 without a journal
#   KODX_BENCH_LOG=1: each run's copy-in line (kodx's time, the engine's, entries skipped)
#   KODX_BENCH_ONLY=cargo: only the cargo-sized code runs (their phases, no targets),
#       then pairs of runs whose second command comes right after the first one's PR,
#       and 10 s after it (issue 43's rhythm: do they find a warm sandbox?)
#   KODX_BENCH_TIMELINE=1: each code run's requests to the fake GitHub and the git server,
#       in ms since the webhook, and what each took there (where prepare and push wait)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${KODX_BENCH_ENGINE:-}" = journaled ]; then
  socket=$(bash bench/journaled-engine.sh | sed -n 's/^socket=//p')
  export DOCKER_HOST="unix://$socket"
  echo "sandboxes on the journaled-ext4 engine: $DOCKER_HOST"
fi
exec cargo test --release --test bench -- --ignored --nocapture --test-threads 1 pr::
