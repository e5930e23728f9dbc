# kodx serve: a small image of the GitHub App server (SPEC §10; docs/deploy.md).
#
#   docker build -t kodx .
#   docker run -p 3000:3000 -v kodx-data:/data \
#     -e APP_ID=… -e PRIVATE_KEY="$(cat app.pem)" -e WEBHOOK_SECRET=… -e ANTHROPIC_API_KEY=… \
#     -e DOCKER_HOST=tcp://ENGINE:2376 -e DOCKER_TLS_VERIFY=1 -e DOCKER_CERT_PATH=/certs \
#     -v ./certs:/certs:ro kodx
#
# The image runs `kodx serve` as an unprivileged user (uid/gid 10001) that owns /data, where
# the SQLite file lives. It has no Docker engine of its own: runs go to the engine DOCKER_HOST
# names (or a socket mounted in; see docs/deploy.md).
#
# The base images are build arguments whose defaults are the official images, so a mirror or
# a pinned digest can be used (--build-arg RUST_IMAGE=… --build-arg RUNTIME_IMAGE=…). Only
# classic Dockerfile syntax is used: the legacy builder and BuildKit both build it.

ARG RUST_IMAGE=rust:1-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim

# ---- build ------------------------------------------------------------------------------
FROM ${RUST_IMAGE} AS builder

# git2 links libgit2 with OpenSSL for HTTPS.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends pkg-config libssl-dev \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /build

# Dependencies first, against an empty crate: this layer is rebuilt only when Cargo.toml or
# Cargo.lock change, not on every source edit.
COPY Cargo.toml Cargo.lock build.rs ./
COPY crates/kodx-sandbox/Cargo.toml crates/kodx-sandbox/build.rs ./crates/kodx-sandbox/
# The sandbox crate's build.rs compiles the sandbox network helper (a static C program
# without libc).
COPY crates/kodx-sandbox/native ./crates/kodx-sandbox/native
RUN mkdir -p src migrations crates/kodx-sandbox/src \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs crates/kodx-sandbox/src/lib.rs \
 && cargo build --release --locked \
 && rm -rf src crates/kodx-sandbox/src

# The crates themselves. build.rs and `sqlx::migrate!` read migrations/; prompts/ and
# config/pricing.toml are compiled in. The touch makes the sources newer than the empty
# crates built above, so cargo rebuilds them.
COPY crates/kodx-sandbox/src ./crates/kodx-sandbox/src
COPY src ./src
COPY migrations ./migrations
COPY prompts ./prompts
COPY config ./config
RUN touch src/main.rs src/lib.rs crates/kodx-sandbox/src/lib.rs \
 && cargo build --release --locked \
 && install -m 0755 target/release/kodx /usr/local/bin/kodx \
 && kodx --version

# ---- run --------------------------------------------------------------------------------
FROM ${RUNTIME_IMAGE} AS runtime

# ca-certificates: every TLS client in kodx trusts the system store (reqwest through
# rustls-platform-verifier, octocrab and bollard through rustls-native-certs, libgit2 through
# OpenSSL); no roots are compiled in. libssl3: libgit2's HTTPS. Neither git nor curl is
# needed: git is linked in, and the health check is the binary itself.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ca-certificates libssl3 \
 && apt-get clean \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 kodx \
 && useradd --system --uid 10001 --gid kodx --home-dir /app --no-create-home \
      --shell /usr/sbin/nologin kodx \
 && mkdir -p /data \
 && chown kodx:kodx /data \
 && chmod 0750 /data

WORKDIR /app
COPY config/kodx.toml /app/config/kodx.toml
COPY --from=builder /usr/local/bin/kodx /usr/local/bin/kodx

# The container starts as root only to hand /data to kodx (a fresh Fly volume or a host
# directory mounted there is root's, whatever the image says) and to give kodx the group of a
# Docker socket mounted in; then setpriv runs kodx as uid/gid 10001. Started as any other user
# (`docker run --user`, Kubernetes runAsNonRoot), it runs kodx as that user directly.
RUN printf '%s\n' \
      '#!/bin/sh' \
      'set -e' \
      'if [ "$(id -u)" = 0 ]; then' \
      '  chown -R kodx:kodx /data' \
      '  groups=10001' \
      '  sock="${DOCKER_HOST:-unix:///var/run/docker.sock}"' \
      '  sock="${sock#unix://}"' \
      '  if [ -S "$sock" ]; then groups="$groups,$(stat -c %g "$sock")"; fi' \
      '  exec setpriv --reuid=10001 --regid=10001 --groups="$groups" -- kodx "$@"' \
      'fi' \
      'exec kodx "$@"' \
      > /usr/local/bin/kodx-entrypoint \
 && chmod 0755 /usr/local/bin/kodx-entrypoint

ENV HOME=/app \
    DATABASE_URL=sqlite:///data/kodx.db \
    KODX_CONFIG=/app/config/kodx.toml \
    HOST=0.0.0.0 \
    PORT=3000

EXPOSE 3000

# 200 when the database and the Docker engine answer (GET /healthz); the shell form reads
# PORT at check time.
HEALTHCHECK --interval=30s --timeout=10s --start-period=20s --retries=3 \
  CMD kodx doctor --healthz "http://127.0.0.1:${PORT:-3000}/healthz"

# `docker run IMAGE doctor` works too; in a running container, `kodx-entrypoint doctor` checks
# as the user the server runs as (a plain `docker exec … kodx` runs as root).
ENTRYPOINT ["kodx-entrypoint"]
CMD ["serve"]
