#!/usr/bin/env bash
# A Docker engine whose data root is on a journaled ext4 filesystem (a file mounted through
# a loop device), beside the machine's own engine: for benchmarks on a machine whose disk is
# ext4 without a journal. There, ext4 checks every free inode it might hand out against the
# inodes deleted in the last seconds (`recently_deleted`, done only without a journal), so
# creating files right after a container's files were deleted costs ~0.7 ms of kernel time
# each: 20,000 files take ~15 s instead of ~0.6 s. `mkfs.ext4` makes a journal by default,
# and xfs has no such check, so a Docker host is normally not affected.
#
#   bash bench/journaled-engine.sh      prints host=…, certs=…, socket=… (engine.sh's lines)
#
# Idempotent. Needs root (mount, dockerd). The filesystem image stays in /var/tmp.
set -euo pipefail
name=journaled
port=${KODX_BENCH_ENGINE_PORT:-23771}
base=/tmp/kodx-engine-$name
img=${KODX_BENCH_ENGINE_IMAGE:-/var/tmp/kodx-engine-$name.ext4}
size=${KODX_BENCH_ENGINE_SIZE:-16G}
if ! mountpoint -q "$base"; then
  if [ ! -f "$img" ]; then
    truncate -s "$size" "$img"
    mkfs.ext4 -q -F "$img"
  fi
  mkdir -p "$base"
  mount -o loop "$img" "$base"
fi
bash "$(dirname "$0")/../tests/engines/engine.sh" start "$name" "$port"
