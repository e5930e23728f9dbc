#!/usr/bin/env bash
# Builds the local sandbox test images without Docker Hub (unreachable here):
#   kodx-test:bookworm  a small Debian bookworm rootfs (bash, coreutils, git, python3, procps)
#                       made with mmdebstrap from Debian's packages, then `docker import`.
#   kodx-test:busybox   busybox-static only: a shell without bash, for the sh fallback.
# Images that already exist are kept; pass --force to rebuild.
set -euo pipefail

force=0
[ "${1:-}" = "--force" ] && force=1

have_image() { docker image inspect "$1" >/dev/null 2>&1; }

need() {
  local missing=()
  for pkg in "$@"; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
  if [ "${#missing[@]}" -gt 0 ]; then
    echo "build.sh: installing ${missing[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
  fi
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ "$force" = 1 ] || ! have_image kodx-test:bookworm; then
  need mmdebstrap
  echo "build.sh: building kodx-test:bookworm with mmdebstrap" >&2
  # Use the host's own apt sources (a mirror the machine can reach), else Debian's default.
  sources=()
  for f in /etc/apt/sources.list.d/*.sources /etc/apt/sources.list; do
    [ -s "$f" ] && sources+=("$f")
  done
  mmdebstrap --quiet --variant=apt --format=tar \
    --include=bash,coreutils,git,python3,procps,ca-certificates \
    --aptopt='Acquire::Check-Valid-Until "false"' \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/* "$1"/usr/share/doc/* "$1"/usr/share/man/*' \
    bookworm "$work/rootfs.tar" "${sources[@]}"
  docker import --change 'CMD ["bash"]' --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    "$work/rootfs.tar" kodx-test:bookworm >/dev/null
fi

if [ "$force" = 1 ] || ! have_image kodx-test:busybox; then
  need busybox-static
  echo "build.sh: building kodx-test:busybox from busybox-static" >&2
  root="$work/busybox"
  mkdir -p "$root/bin" "$root/tmp" "$root/root" "$root/etc"
  cp /bin/busybox "$root/bin/busybox"
  for app in $("$root/bin/busybox" --list); do
    [ "$app" = busybox ] || ln -sf busybox "$root/bin/$app"
  done
  chmod 1777 "$root/tmp"
  echo 'root:x:0:0:root:/root:/bin/sh' > "$root/etc/passwd"
  echo 'root:x:0:' > "$root/etc/group"
  tar -C "$root" -cf "$work/busybox.tar" .
  docker import --change 'CMD ["sh"]' --change 'ENV PATH=/bin' "$work/busybox.tar" kodx-test:busybox >/dev/null
fi

docker image ls --format '{{.Repository}}:{{.Tag}} {{.Size}}' | grep '^kodx-test:' >&2
