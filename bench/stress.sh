#!/usr/bin/env bash
# Issue 9's and 26's stress figures: kodx under hostile output, files, tars, webhook
# senders and webhook channels.
#
#   bash bench/stress.sh            # all of them (~11 min after the release build)
#   bash bench/stress.sh term tar   # some: term tar snapshot_flood webhook transcripts
#                                   #   sandbox_network proxy egress egress_inject
#
# Each case runs the real release binary (`kodx run` against a scripted fake model and the
# real Docker engine, or `kodx serve` on loopback, with a fake GitHub where it runs a code
# run) and prints its figures against the targets:
#   term             peak RSS (VmHWM) <= 200 MB: a cursor-escape flood, a 500 MB line
#                    without a newline, an escape-printing setup script
#   tar              peak RSS <= 200 MB: a 2.3 GB sparse file made in the workspace, a
#                    1.5 GB file in the repository, 120 MB of ignored build output
#   snapshot_flood   peak RSS of `kodx serve` <= 300 MB: a code run whose setup script put
#                    a tar flood writer where kodx's helper was, so the snapshot is a
#                    1.25 GiB PAX header, then a 1.25 GiB GNU long name (issue 36)
#   webhook          /healthz <= 2 s, a signed delivery accepted, RSS <= 300 MB during
#                    40 held 25 MiB unsigned bodies, 20,000 idle connections, and (issue
#                    26) a 300-step run of 20 KB "< outputs under 1,000 page views that
#                    read nothing and 100 live streams (KODX_STRESS_ONLY=a|b|c: one)
#   transcripts      a run's transcript <= 1.5x the distinct content sent, at 6/25/50 steps
#   sandbox_network  what the network fence and the disk watchdog add to a sandbox start
#   proxy            RSS (VmHWM) < 100 MB and /healthz <= 2 s while the WEBHOOK_PROXY_URL
#                    channel streams one endless `data:` line at full speed for 30 s
#   egress           the egress proxy (issue 39): RSS < 150 MB and an allowed CONNECT
#                    answered <= 2 s under 1,000 idle connections, 5,000 refused CONNECTs
#                    and 500 tunnels; then the same flood from inside a real sandbox against
#                    the real `kodx serve`: its RSS < 150 MB and /healthz <= 2 s throughout
#   egress_inject    secrets injected on the wire: RSS < 150 MB with 500 tunnels whose TLS
#                    the proxy terminates held open; the time to open one and of a request
# KODX_STRESS_BIN=/path/to/kodx measures another build with the same cases (not
# snapshot_flood, which drives this build's `kodx serve`). It needs the
# Docker engine and the test images (`bash tests/images/build.sh`).
set -euo pipefail
cd "$(dirname "$0")/.."

cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(term tar snapshot_flood webhook transcripts sandbox_network proxy egress egress_inject)
for c in "${cases[@]}"; do
    [ -f "tests/bench/stress_$c.rs" ] || { echo "bench/stress.sh: no stress case '$c'" >&2; exit 2; }
done

cargo build --release --quiet --bin kodx --test bench

failed=()
for c in "${cases[@]}"; do
    echo
    echo "=== $c ==="
    if ! cargo test --release --quiet --test bench -- --ignored --nocapture --test-threads 1 "stress_$c::"; then
        failed+=("$c")
    fi
done
echo
if [ ${#failed[@]} -eq 0 ]; then
    echo "stress: every target met (${cases[*]})"
else
    echo "stress: MISSED in ${failed[*]}"
    exit 1
fi
