#!/usr/bin/env bash
# Captures what real compilers, linters and test runners print about tiny broken sources,
# as test data for the annotation parser (src/checks/annotate/tests.rs, SPEC §12). The
# outputs here (*.txt) are committed as the tools printed them, colour codes and all: the
# tests read them with include_str! and pin the annotations they give.
#
# What it does:
#   1. Builds the image kodx-annotations-capture FROM the local kodx-test:bookworm
#      (tests/images/build.sh makes it) with Debian bookworm's gcc, clang, golang-go (1.19),
#      shellcheck, python3-venv, nodejs and npm; a venv /opt/py with pytest, flake8, mypy
#      and ruff from PyPI; eslint 9 and eslint-formatter-unix from npm (eslint 9 has no
#      `unix` formatter of its own). Versions are pinned below. Needs the Debian mirror,
#      PyPI and the npm registry, nothing else; pip and npm are given this machine's CA
#      bundle (/etc/ssl/certs/ca-certificates.crt) so that they trust what it trusts.
#   2. Runs a container of it, without network, with sources/repo copied to
#      /workspace/repo (the repository's directory in a kodx sandbox) and sources/outside to
#      /opt/outside (paths outside the repository, which the parser must drop), and the
#      host's Rust toolchain (`rustc --print sysroot`) mounted read-only at /opt/rust.
#   3. Runs each tool from /workspace/repo, stdout and stderr together as a check's output
#      is, and writes one file per run here. Some runs force colour (gcc, cargo build,
#      pytest, flake8, mypy, ruff's full format) so that the escapes are in the data.
#
# Rerun: tests/data/annotations/capture.sh  (then `cargo nextest run annotate` and update
# the expected annotations where a tool's new version says things differently).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
image=kodx-annotations-capture
sysroot=$(rustc --print sysroot)

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
cp /etc/ssl/certs/ca-certificates.crt "$context/host-ca.crt"
cat >"$context/Dockerfile" <<'EOF'
FROM kodx-test:bookworm
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
      gcc libc6-dev clang golang-go shellcheck python3-venv nodejs npm >/dev/null \
 && rm -rf /var/lib/apt/lists/*
COPY host-ca.crt /etc/host-ca.crt
RUN python3 -m venv /opt/py \
 && /opt/py/bin/pip install -q --cert /etc/host-ca.crt \
      pytest==9.2.0 flake8==7.5.0 mypy==2.4.1 ruff==0.17.6
RUN mkdir /opt/js && cd /opt/js \
 && npm install -q --cafile=/etc/host-ca.crt --no-audit --no-fund \
      eslint@9.39.1 eslint-formatter-unix@9.0.1 >/dev/null
EOF
docker build -q -t "$image" "$context" >/dev/null

docker run --rm --network none \
  -v "$here/sources:/sources:ro" -v "$here:/out" -v "$sysroot:/opt/rust:ro" \
  "$image" bash -c '
set -u
mkdir -p /workspace && cp -r /sources/repo /workspace/repo && cp -r /sources/outside /opt/outside
cd /workspace/repo
export PATH=/opt/rust/bin:/opt/py/bin:/opt/js/node_modules/.bin:$PATH
export CARGO_HOME=/tmp/cargo-home CARGO_TARGET_DIR=/tmp/target GOCACHE=/tmp/go-cache GOFLAGS=-mod=mod
# One run: `cap FILE COMMAND...` keeps what COMMAND printed, whatever its exit code.
cap() { local f=$1; shift; "$@" >"/out/$f" 2>&1 || true; echo "capture: $f ($(wc -l <"/out/$f") lines)"; }

cap gcc.txt sh -c "gcc -Wall -fdiagnostics-color=always -fdiagnostics-urls=always -I/opt/outside/include -c c/main.c -o /dev/null;
  gcc -Wall -c /workspace/repo/c/abs.c -o /dev/null;
  echo \"int main(void) { return nope; }\" | gcc -x c -c - -o /dev/null"
cap clang.txt sh -c "clang -Wall -fno-color-diagnostics -I/opt/outside/include -c c/main.c -o /dev/null;
  clang -Wall -fno-color-diagnostics -c /workspace/repo/c/abs.c -o /dev/null"
cap cargo-build.txt cargo build --offline --color always -p broken
cap cargo-test.txt cargo test --offline --color never -p calc
cap pytest-long.txt pytest -p no:cacheprovider --color=yes py/tests
cap pytest-short.txt pytest -p no:cacheprovider --color=no --tb=short py/tests
cap go-test.txt go test ./calc/
cap go-test-v.txt go test -v ./calc/
cap go-vet.txt go vet ./...
cap shellcheck.txt shellcheck -f gcc sh/run.sh /opt/outside/lint.sh
cap flake8.txt flake8 --color=always py/
cap mypy.txt env MYPY_FORCE_COLOR=1 mypy --cache-dir=/dev/null --show-column-numbers py/calc.py
cap ruff-concise.txt ruff check --no-cache --output-format=concise py/
cap ruff-full.txt env CLICOLOR_FORCE=1 ruff check --no-cache py/
cap eslint.txt eslint --format /opt/js/node_modules/eslint-formatter-unix/index.js js/
{ gcc --version | head -1; clang --version | head -1; /opt/rust/bin/rustc --version; go version
  pytest --version; flake8 --version; mypy --version; ruff --version; shellcheck --version | sed -n 2p
  echo "eslint $(eslint --version)"; } >/out/versions.txt 2>&1
'
