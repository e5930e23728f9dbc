#!/usr/bin/env bash
# Starts a throwaway PostgreSQL cluster for the tests: Debian's `postgresql` binaries, run as
# the unprivileged `postgres` user, data in a temporary directory, listening on loopback
# only, password authentication. Prints the admin URL the tests read from
# KODX_TEST_POSTGRES_URL (each test creates its own database in it).
#   bash tests/postgres/start.sh [DIR] [PORT]      (stop: pg_ctl -D DIR/data stop)
set -euo pipefail
dir=${1:-/tmp/kodx-test-postgres}
port=${2:-55432}
bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
if [ -z "$bin" ]; then
  echo "tests/postgres/start.sh: PostgreSQL is not installed (apt-get install postgresql)" >&2
  exit 1
fi
user=postgres
# Test processes may call this at the same time: one starts the server, the others wait.
exec 9>"$dir.lock"
flock 9
if [ "$(id -u)" = 0 ]; then
  id "$user" >/dev/null 2>&1 || useradd --system --no-create-home "$user"
fi
as_user() { if [ "$(id -u)" = 0 ]; then runuser -u "$user" -- "$@"; else "$@"; fi; }
if [ -f "$dir/data/postmaster.pid" ] && as_user "$bin/pg_ctl" -D "$dir/data" status >/dev/null 2>&1 9>&-; then
  echo "postgres://kodx:kodx@127.0.0.1:$port/postgres"
  exit 0
fi
rm -rf "$dir"
mkdir -p "$dir"
[ "$(id -u)" = 0 ] && chown "$user" "$dir"
printf 'kodx\n' > "$dir/pw" && [ "$(id -u)" = 0 ] && chown "$user" "$dir/pw"
as_user "$bin/initdb" -D "$dir/data" -U kodx --pwfile="$dir/pw" --auth=scram-sha-256 \
  --encoding=UTF8 --locale=C.UTF-8 >"$dir/initdb.log" 2>&1 \
  || { cat "$dir/initdb.log" >&2; exit 1; }
# fsync off: a test cluster, thrown away; many connections: tests run in parallel, each
# with its own pool.
# (9>&-: the server must not inherit the lock, or every later caller waits on it forever.)
as_user "$bin/pg_ctl" -D "$dir/data" -l "$dir/log" -w start 9>&- -o \
  "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories=$dir -c max_connections=400 -c fsync=off -c synchronous_commit=off" \
  >/dev/null || { tail -n 30 "$dir/log" >&2; exit 1; }
echo "postgres://kodx:kodx@127.0.0.1:$port/postgres"
