#!/usr/bin/env bash
# A second (third, …) Docker engine on this machine for the engine-pool tests: Debian's
# dockerd with its own socket, data root, exec root, pid file and containerd, answering on
# a loopback TCP port with TLS client certificates made by openssl. It leaves the first
# engine's network alone: its default bridge is an interface of its own, made here
# (`--bridge=kodxbrNAME`; `--bridge=none` would make dockerd delete `docker0`, the first
# engine's bridge), it changes no iptables rules (`--iptables=false`), and its networks come
# from 10.N.0.0/16, away from the first engine's pools. The test images of the first engine
# are loaded into it.
#
#   bash tests/engines/engine.sh start NAME PORT   prints KEY=VALUE lines: host, certs dir
#   bash tests/engines/engine.sh stop NAME         stops it (its data stays)
#   bash tests/engines/engine.sh status NAME
#
# Idempotent: `start` on a running engine only prints its lines. Needs root (dockerd).
set -euo pipefail
cmd=${1:?usage: engine.sh start|stop|status NAME [PORT]}
name=${2:?usage: engine.sh start|stop|status NAME [PORT]}
port=${3:-}
base=/tmp/kodx-engine-$name
certs=$base/certs
sock=$base/docker.sock
pidfile=$base/dockerd.pid

running() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }

answers() {
  timeout 10 docker -H "tcp://127.0.0.1:$port" --tlsverify --tlscacert "$certs/ca.pem" \
    --tlscert "$certs/cert.pem" --tlskey "$certs/key.pem" version >/dev/null 2>&1
}

print() {
  echo "host=tcp://127.0.0.1:$port"
  echo "certs=$certs"
  echo "socket=$sock"
}

make_certs() {
  [ -f "$certs/key.pem" ] && return 0
  mkdir -p "$certs/server"
  (
    cd "$certs"
    openssl genrsa -out ca-key.pem 2048 2>/dev/null
    openssl req -new -x509 -days 3650 -key ca-key.pem -sha256 -subj "/CN=kodx-test-ca-$name" -out ca.pem 2>/dev/null
    openssl genrsa -out server/key.pem 2048 2>/dev/null
    openssl req -subj "/CN=localhost" -sha256 -new -key server/key.pem -out server.csr 2>/dev/null
    printf 'subjectAltName = DNS:localhost,IP:127.0.0.1\nextendedKeyUsage = serverAuth\n' > server.ext
    openssl x509 -req -days 3650 -sha256 -in server.csr -CA ca.pem -CAkey ca-key.pem \
      -CAcreateserial -out server/cert.pem -extfile server.ext 2>/dev/null
    openssl genrsa -out key.pem 2048 2>/dev/null
    openssl req -subj "/CN=kodx-client" -new -key key.pem -out client.csr 2>/dev/null
    printf 'extendedKeyUsage = clientAuth\n' > client.ext
    openssl x509 -req -days 3650 -sha256 -in client.csr -CA ca.pem -CAkey ca-key.pem \
      -CAcreateserial -out cert.pem -extfile client.ext 2>/dev/null
    cp ca.pem server/ca.pem
    rm -f ./*.csr ./*.ext
    chmod 0600 key.pem ca-key.pem server/key.pem
  )
}

case $cmd in
start)
  [ -n "$port" ] || { echo "engine.sh start needs a PORT" >&2; exit 2; }
  mkdir -p "$base"
  exec 9>"$base.lock"
  flock 9
  if running && answers; then print; exit 0; fi
  make_certs
  # A pool of its own for networks, by name (10.N.0.0/16 split in /24s), and a bridge.
  octet=$(( $(printf '%s' "$name" | cksum | cut -d' ' -f1) % 200 + 20 ))
  bridge="kodxbr$(printf '%s' "$name" | cut -c1-8)"
  if ! ip link show "$bridge" >/dev/null 2>&1; then
    ip link add "$bridge" type bridge
    ip addr add "10.$octet.255.1/24" dev "$bridge"
    ip link set "$bridge" up
  fi
  rm -f "$sock" "$pidfile"
  # The engine's network store goes at each start: dockerd restarting over its own stored
  # default bridge network deleted the first engine's `docker0` here. Containers stay.
  rm -rf "$base/data/network"
  # 9>&-: the daemon must not inherit the lock.
  setsid nohup dockerd \
    --host "unix://$sock" --host "tcp://127.0.0.1:$port" \
    --tlsverify --tlscacert "$certs/server/ca.pem" --tlscert "$certs/server/cert.pem" \
    --tlskey "$certs/server/key.pem" \
    --data-root "$base/data" --exec-root "$base/exec" --pidfile "$pidfile" \
    --bridge="$bridge" --iptables=false --ip-masq=false --ip-forward=false \
    --default-address-pool "base=10.$octet.0.0/16,size=24" \
    >"$base/dockerd.log" 2>&1 9>&- </dev/null &
  for _ in $(seq 1 60); do answers && break; sleep 0.5; done
  if ! answers; then
    echo "engine.sh: the engine $name did not come up; its log:" >&2
    tail -n 30 "$base/dockerd.log" >&2
    exit 1
  fi
  # The first engine's test images, loaded once.
  for image in kodx-test:bookworm kodx-test:busybox; do
    if ! docker -H "unix://$sock" image inspect "$image" >/dev/null 2>&1; then
      docker image inspect "$image" >/dev/null 2>&1 || { echo "engine.sh: $image is not on the first engine (bash tests/images/build.sh)" >&2; exit 1; }
      docker save "$image" | docker -H "unix://$sock" load >/dev/null
    fi
  done
  print
  ;;
stop)
  if running; then
    pid=$(cat "$pidfile")
    kill "$pid"
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -0 "$pid" 2>/dev/null && kill -9 "$pid"
  fi
  echo "stopped"
  ;;
status)
  if running; then echo "running"; else echo "stopped"; fi
  ;;
*)
  echo "engine.sh: unknown command $cmd" >&2
  exit 2
  ;;
esac
