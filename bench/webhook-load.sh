#!/usr/bin/env bash
# Webhook acknowledgement under load: `kodx serve` against a minimal Probot app.
#
#   bash bench/webhook-load.sh [KODX_BINARY] [--only kodx|probot] [--rounds N]
#        [--duration SECS] [--warmup SECS] [--connections N] [--threads N] [--strict] [--keep]
#
# wrk on loopback sends signed `issue_comment.created` deliveries of ~14 KB, each with a
# unique X-GitHub-Delivery, on two paths:
#   ignored  the comment has no command: kodx answers 200, Probot 200
#   queued   the comment has `/kodx ask why is the sky blue?`: kodx stores the delivery and
#            the run durably (SQLite, synchronous=FULL) and answers 202; Probot answers 200.
#            Every request is a new comment (its own comment id, body and signature, signed
#            in webhook.lua from payload.py's queued.tpl), since kodx starts one run per
#            comment and answers a replayed one 200.
# Runs are interleaved (each round: ignored then queued, both servers, the first server
# alternating between rounds); each is a warmup and a measured run. The server's CPU time
# per request comes from /proc/PID/stat (utime+stime) before and after the measured run.
# Prints a table, the medians over rounds, and the ratios against the targets:
#   ignored: kodx CPU/request <= 1/4 of Probot's, requests/s >= 2x Probot's, p99 <= 10 ms
#   queued:  kodx p99 <= 20 ms
# Exit status: 1 when a check of correctness fails (a wrong status, an error, a signature
# not verified, a 202 that left no row, a 202 without an fsync); with --strict also 2 when a
# target is missed. --keep leaves the temp dir (server logs, database, results.tsv).
#
# Without KODX_BINARY it runs `cargo build --release` and uses target/release/kodx.
# Environment: KODX_SERVE_ARGS (default --no-workers); PROBOT_LOG_LEVEL (default warn: no
# per-request log lines, Probot's fastest setting; `info`, its production default, costs it
# ~20 µs more CPU per request); RUST_LOG passes through to kodx; TMPDIR holds the database.
set -euo pipefail
self=$(realpath "$0")
cd "$(dirname "$self")/.."
root=$PWD
bench=$root/bench/webhook

# How kodx serve is kept from starting queued runs during the bench: without Docker and
# GitHub every queued run would fail in the workers, and that work would count as the
# webhook path's CPU. `--no-workers` only receives and queues.
KODX_SERVE_ARGS=${KODX_SERVE_ARGS---no-workers}

kodx_bin=""
only=""
rounds=2
duration=10
warmup=2
connections=64
threads=2
strict=0
keep=0
while [ $# -gt 0 ]; do
  case $1 in
    --only) only=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --duration) duration=$2; shift 2 ;;
    --warmup) warmup=$2; shift 2 ;;
    --connections) connections=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --strict) strict=1; shift ;;
    --keep) keep=1; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$self" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "unknown option $1 (see --help)" >&2; exit 64 ;;
    *) kodx_bin=$1; shift ;;
  esac
done
case $only in
  "") servers=(kodx probot) ;;
  kodx|probot) servers=("$only") ;;
  *) echo "--only takes kodx or probot, not '$only'" >&2; exit 64 ;;
esac
want() { [[ " ${servers[*]} " == *" $1 "* ]]; }

say() { printf '%s\n' "$*" >&2; }
die() { say "webhook-load: $*"; exit 1; }

for tool in curl node npm python3 openssl; do
  command -v "$tool" >/dev/null || die "$tool is not installed"
done
if ! command -v wrk >/dev/null; then
  say "installing wrk (Debian package)…"
  apt-get install -y -qq wrk >/dev/null || die "wrk is missing and apt-get install wrk failed"
fi

tmp=$(mktemp -d -t kodx-webhook-bench.XXXXXX)
pids=()
cleanup() {
  local pid i
  for pid in "${pids[@]}"; do
    kill "$pid" 2>/dev/null || true
  done
  for pid in "${pids[@]}"; do
    for i in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if [ "$keep" = 1 ]; then say "kept $tmp"; else rm -rf "$tmp"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# --- inputs: secret, throwaway App key, payloads --------------------------------------
secret=$(openssl rand -hex 24)
openssl genrsa -out "$tmp/app-key.pem" 2048 2>/dev/null
python3 "$bench/payload.py" "$tmp/payloads" "$secret"
for path in ignored queued; do
  # The signature must verify with an independent HMAC, or the bench measures rejections.
  want_sig=$(openssl dgst -sha256 -hmac "$secret" -r "$tmp/payloads/$path.json" | cut -d' ' -f1)
  [ "sha256=$want_sig" = "$(cat "$tmp/payloads/$path.sig")" ] || die "payload.py signed $path.json wrongly"
done

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}

# --- servers --------------------------------------------------------------------------
declare -A pid_of url_of base_of
if want kodx; then
  if [ -z "$kodx_bin" ]; then
    say "building kodx (cargo build --release)…"
    cargo build --release -q
    kodx_bin=$root/target/release/kodx
  fi
  [ -x "$kodx_bin" ] || die "$kodx_bin is not an executable"
  help=$("$kodx_bin" serve --help 2>&1) || die "'$kodx_bin serve --help' failed; run with --only probot until kodx serve exists:
$help"
  for arg in $KODX_SERVE_ARGS; do
    grep -q -- "${arg%%=*}" <<<"$help" || die "'kodx serve --help' does not offer $arg (KODX_SERVE_ARGS)"
  done
  fs=$(stat -f -c %T "$tmp")
  case $fs in
    tmpfs|ramfs) say "note: the database is on $fs ($tmp); fsync costs nothing there, so the queued path is not measured durably. Set TMPDIR to a directory on a disk." ;;
    *) say "kodx database file: $tmp/kodx.db ($fs)" ;;
  esac
  port=$(free_port)
  # GitHub is unreachable (GITHUB_API_URL): the server must still acknowledge. The server
  # config is the repository's config/kodx.toml (the built-in defaults).
  # shellcheck disable=SC2086 # KODX_SERVE_ARGS is a list of words
  env APP_ID=1 PRIVATE_KEY_PATH="$tmp/app-key.pem" WEBHOOK_SECRET="$secret" \
    DATABASE_URL="sqlite://$tmp/kodx.db" GITHUB_API_URL=http://127.0.0.1:9 \
    HOST=127.0.0.1 PORT="$port" \
    "$kodx_bin" serve $KODX_SERVE_ARGS >"$tmp/kodx.log" 2>&1 &
  pids+=($!)
  pid_of[kodx]=$!
  base_of[kodx]=http://127.0.0.1:$port
  url_of[kodx]=http://127.0.0.1:$port/webhook
fi
if want probot; then
  if [ ! -d "$bench/probot/node_modules/probot" ]; then
    say "installing the Probot app's dependencies (npm ci)…"
    (cd "$bench/probot" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
  fi
  port=$(free_port)
  (
    cd "$bench/probot"
    export APP_ID=1 PRIVATE_KEY_PATH="$tmp/app-key.pem" WEBHOOK_SECRET="$secret" \
      HOST=127.0.0.1 PORT="$port" NODE_ENV=production LOG_LEVEL="${PROBOT_LOG_LEVEL:-warn}"
    exec node app.js
  ) >"$tmp/probot.log" 2>&1 &
  pids+=($!)
  pid_of[probot]=$!
  base_of[probot]=http://127.0.0.1:$port
  url_of[probot]=http://127.0.0.1:$port/api/github/webhooks
fi

# Any HTTP answer means the server is up (kodx's /healthz is 503 without Docker).
for s in "${servers[@]}"; do
  probe=${base_of[$s]}/healthz
  [ "$s" = probot ] && probe=${base_of[$s]}/ping
  for i in $(seq 1 300); do
    kill -0 "${pid_of[$s]}" 2>/dev/null || die "$s exited at start:
$(tail -20 "$tmp/$s.log")"
    code=$(curl -s -o /dev/null -w '%{http_code}' --max-time 2 "$probe" || true)
    [ "$code" != 000 ] && break
    [ "$i" = 300 ] && die "$s did not answer on ${base_of[$s]} within 30 s:
$(tail -20 "$tmp/$s.log")"
    sleep 0.1
  done
  say "$s is up on ${base_of[$s]} (pid ${pid_of[$s]}, $(cat "/proc/${pid_of[$s]}/comm"))"
done

# --- smoke checks: signatures, statuses -----------------------------------------------
failures=()
fail() { failures+=("$*"); say "FAIL: $*"; }

# post SERVER PAYLOAD SIGNATURE DELIVERY -> HTTP status; the body lands in $tmp/resp
post() {
  local sig_header=()
  [ -n "$3" ] && sig_header=(-H "X-Hub-Signature-256: $3")
  curl -s -o "$tmp/resp" -w '%{http_code}' --max-time 10 -X POST "${url_of[$1]}" \
    -H 'Content-Type: application/json' -H 'User-Agent: GitHub-Hookshot/abc' \
    -H 'X-GitHub-Event: issue_comment' -H "X-GitHub-Delivery: $4" "${sig_header[@]}" \
    --data-binary "@$tmp/payloads/$2.json" || true
}
expect() { # WHAT WANT GOT
  if [ "$2" = "$3" ]; then say "  ok   $1: $3"; else fail "$1: expected $2, got $3 $(head -c 300 "$tmp/resp" 2>/dev/null)"; fi
}
status_for() { # SERVER PATH -> the status a good delivery must get
  if [ "$1" = kodx ] && [ "$2" = queued ]; then echo 202; else echo 200; fi
}
probot_seen() { curl -s --max-time 5 "${base_of[probot]}/bench/seen"; }

bad_sig=sha256=$(openssl dgst -sha256 -hmac "not-$secret" -r "$tmp/payloads/queued.json" | cut -d' ' -f1)
smoke_prefix=$(openssl rand -hex 4)
for s in "${servers[@]}"; do
  say "smoke checks, $s:"
  # kodx answers 401 (SPEC §3); Probot (@octokit/webhooks) answers 400.
  reject=401
  [ "$s" = probot ] && reject=400
  [ "$s" = probot ] && seen_before=$(probot_seen)
  expect "$s bad signature" $reject "$(post "$s" queued "$bad_sig" "$smoke_prefix-0000-0000-0000-bad000000001")"
  expect "$s no signature" $reject "$(post "$s" queued "" "$smoke_prefix-0000-0000-0000-bad000000002")"
  if [ "$s" = probot ]; then
    expect "probot handler untouched by the rejected requests" "$seen_before" "$(probot_seen)"
  fi
  for path in ignored queued; do
    d="$smoke_prefix-0000-0000-0000-$(openssl rand -hex 6)"
    expect "$s $path signed" "$(status_for "$s" "$path")" "$(post "$s" "$path" "$(cat "$tmp/payloads/$path.sig")" "$d")"
    if [ "$s" = kodx ] && [ "$path" = queued ]; then
      expect "kodx queued redelivery of the same id" 200 "$(post kodx queued "$(cat "$tmp/payloads/queued.sig")" "$d")"
      expect "kodx queued replay under a new delivery id" 200 "$(post kodx queued "$(cat "$tmp/payloads/queued.sig")" "$smoke_prefix-0000-0000-0000-$(openssl rand -hex 6)")"
    fi
  done
  [ "$s" = probot ] && say "  probot handler saw: $(probot_seen)"
done
[ ${#failures[@]} -eq 0 ] || die "smoke checks failed; not measuring"

# --- load -----------------------------------------------------------------------------
clk_tck=$(getconf CLK_TCK)
cpu_ticks() { # PID -> "utime stime" in clock ticks (fields 14 and 15 of /proc/PID/stat)
  local stat rest
  stat=$(<"/proc/$1/stat")
  rest=${stat##*) }
  # shellcheck disable=SC2086 # split the fields after "(comm) "
  set -- $rest
  echo "${12} ${13}"
}
# run_wrk SERVER PATH SECONDS -> the RESULT line of webhook.lua's done(), plus
# " client_cpu_s=F": wrk's own user+system CPU seconds (bash's `time`), since on a small
# machine the load generator competes with the server for the same cores.
# The queued path signs a new comment per request (the template); the ignored one sends
# one body.
template_for() { [ "$1" = queued ] && echo "$tmp/payloads/queued.tpl"; true; }
run_wrk() {
  local out TIMEFORMAT='CLIENT_CPU %U %S'
  # shellcheck disable=SC2046 # the template is one path or nothing
  out=$({ time wrk -t"$threads" -c"$connections" -d"${3}s" --timeout 5s -s "$bench/webhook.lua" \
    "${url_of[$1]}" -- "$tmp/payloads/$2.json" "$(cat "$tmp/payloads/$2.sig")" \
    "$(openssl rand -hex 4)" $(template_for "$2") 2>&1; } 2>&1) || die "wrk failed against $1: $out"
  grep -q '^RESULT ' <<<"$out" || die "wrk printed no RESULT line: $out"
  printf '%s client_cpu_s=%s\n' "$(grep '^RESULT ' <<<"$out")" \
    "$(awk '/^CLIENT_CPU/ {print $2 + $3}' <<<"$out")"
}
field() { sed -n "s/.* $1=\([^ ]*\).*/\1/p" <<<"$2"; }

results=$tmp/results.tsv
printf 'round\tserver\tpath\trps\tp50_us\tp99_us\tcpu_us_per_req\tsys_us_per_req\twrk_cpu_us_per_req\tnon2xx\terrors\tstatuses\n' >"$results"
accepted_202=0
say ""
say "machine: $(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg) before the runs"
say "load: $rounds round(s); each run ${warmup}s warmup + ${duration}s measured, $connections connections, $threads wrk threads"
for round in $(seq 1 "$rounds"); do
  order=("${servers[@]}")
  if [ $((round % 2)) = 0 ] && [ ${#servers[@]} = 2 ]; then order=("${servers[1]}" "${servers[0]}"); fi
  for path in ignored queued; do
    for s in "${order[@]}"; do
      w=$(run_wrk "$s" "$path" "$warmup")
      before=$(cpu_ticks "${pid_of[$s]}")
      r=$(run_wrk "$s" "$path" "$duration")
      after=$(cpu_ticks "${pid_of[$s]}")
      kill -0 "${pid_of[$s]}" 2>/dev/null || die "$s died during the run: $(tail -20 "$tmp/$s.log")"
      n=$(field requests "$r")
      read -r cpu sys_cpu < <(python3 -c "
b, a, n = [int(x) for x in '$before'.split()], [int(x) for x in '$after'.split()], max($n, 1)
us = lambda ticks: ticks / $clk_tck * 1e6 / n
print(f'{us(a[0] + a[1] - b[0] - b[1]):.1f} {us(a[1] - b[1]):.1f}')")
      wrk_cpu=$(python3 -c "print(f'{$(field client_cpu_s "$r") * 1e6 / max($n, 1):.1f}')")
      errors=$(( $(field connect_err "$r") + $(field read_err "$r") + $(field write_err "$r") + $(field timeout_err "$r") ))
      statuses=$(field statuses "$r")
      printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$s" "$path" "$(field rps "$r")" \
        "$(field p50_us "$r")" "$(field p99_us "$r")" "$cpu" "$sys_cpu" "$wrk_cpu" "$(field non2xx "$r")" "$errors" "$statuses" >>"$results"
      say "  round $round $path $s: $(field rps "$r") req/s, p99 $(( $(field p99_us "$r") / 1000 )) ms, $cpu µs CPU/req, statuses $statuses, socket errors $errors"
      # Every response of a measured or warmup run must be the path's status.
      want_status=$(status_for "$s" "$path")
      for line in "$w" "$r"; do
        st=$(field statuses "$line")
        [ "$st" = "$want_status:$(field requests "$line")" ] ||
          fail "$s $path round $round: expected only $want_status, got statuses '$st' for $(field requests "$line") responses"
        if [ "$s" = kodx ] && [ "$path" = queued ]; then
          accepted_202=$(( accepted_202 + $(sed -n 's/.*202:\([0-9]*\).*/\1/p' <<<"$st" | grep . || echo 0) ))
        fi
      done
      [ "$errors" = 0 ] || fail "$s $path round $round: $errors socket errors (connect/read/write/timeout)"
    done
  done
done

# --- what kodx stored, and whether its commits reach the disk -------------------------
if want kodx; then
  accepted_202=$((accepted_202 + 1)) # the smoke check's queued delivery
  sleep 0.5
  say ""
  read -r deliveries runs < <(python3 - "$tmp/kodx.db" <<'PY'
import sqlite3, sys
db = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
q = lambda sql: db.execute(sql).fetchone()[0]
print(q("SELECT count(*) FROM deliveries"), q("SELECT count(*) FROM runs"))
PY
  ) || { fail "cannot read deliveries/runs from $tmp/kodx.db"; deliveries=0; runs=0; }
  say "kodx database: $runs runs, $deliveries deliveries; kodx answered 202 to $accepted_202 requests"
  # In-flight requests at the end of a wrk run are answered but not counted by wrk, so the
  # table may hold a few more runs than counted 202s, never fewer.
  [ "$runs" -ge "$accepted_202" ] || fail "kodx answered 202 $accepted_202 times but stored $runs runs"

  if command -v strace >/dev/null; then
    strace -f -qq -e trace=fsync,fdatasync -o "$tmp/strace.out" -p "${pid_of[kodx]}" 2>"$tmp/strace.err" &
    strace_pid=$!
    pids+=("$strace_pid")
    sleep 1
  fi
  if [ -n "${strace_pid:-}" ] && ! kill -0 "$strace_pid" 2>/dev/null; then
    say "durability check: strace could not attach ($(head -c 200 "$tmp/strace.err")); skipped"
  elif [ -n "${strace_pid:-}" ]; then
    r=$(wrk -t1 -c1 -d2s -s "$bench/webhook.lua" "${url_of[kodx]}" -- "$tmp/payloads/queued.json" \
      "$(cat "$tmp/payloads/queued.sig")" "$(openssl rand -hex 4)" "$tmp/payloads/queued.tpl" | grep '^RESULT ') || true
    sleep 0.5
    kill -INT "$strace_pid" 2>/dev/null || true
    wait "$strace_pid" 2>/dev/null || true
    n202=$(sed -n 's/.*202:\([0-9]*\).*/\1/p' <<<"$r")
    syncs=$(grep -cE 'f(data)?sync\(' "$tmp/strace.out" || true)
    if [ -z "$n202" ] || [ "$n202" = 0 ]; then
      fail "durability check: kodx answered no 202 on one connection under strace: $r"
    else
      say "durability check (one connection, under strace): $n202 runs queued, $syncs fsync/fdatasync calls"
      [ "$syncs" -ge "$n202" ] || fail "kodx queued $n202 runs with only $syncs fsync/fdatasync calls: a 202 is answered before its commit is on disk"
    fi
  else
    say "durability check: strace not installed; skipped"
  fi
fi
if want probot; then
  say "probot handler saw: $(probot_seen)"
fi
say "load average after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"
for s in "${servers[@]}"; do
  say "$s peak RSS: $(awk '/VmHWM/ {print $2, $3}' "/proc/${pid_of[$s]}/status")"
done

# --- report ---------------------------------------------------------------------------
report_status=0
python3 - "$results" "$strict" "$connections" <<'PY' || report_status=$?
import csv, statistics, sys

rows = list(csv.DictReader(open(sys.argv[1]), delimiter="\t"))
strict, conns = sys.argv[2] == "1", sys.argv[3]
print()
print(f"{'server':<7} {'path':<8} {'round':>5} {'req/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'CPU µs/req':>10} {'(sys)':>7} {'non-2xx':>7}  {'statuses':<12} {'wrk CPU µs/req':>14}")
for r in rows:
    print(f"{r['server']:<7} {r['path']:<8} {r['round']:>5} {float(r['rps']):>9.0f} {int(r['p50_us'])/1000:>7.2f} "
          f"{int(r['p99_us'])/1000:>7.2f} {float(r['cpu_us_per_req']):>10.1f} {float(r['sys_us_per_req']):>7.1f} {r['non2xx']:>7}  {r['statuses']:<12} "
          f"{float(r['wrk_cpu_us_per_req']):>14.1f}")

med = {}
for key in sorted({(r["server"], r["path"]) for r in rows}):
    sel = [r for r in rows if (r["server"], r["path"]) == key]
    m = lambda f: statistics.median(float(r[f]) for r in sel)
    med[key] = dict(rps=m("rps"), p50=m("p50_us") / 1000, p99=m("p99_us") / 1000, cpu=m("cpu_us_per_req"))
print()
print(f"median over rounds ({conns} connections)")
print(f"{'server':<7} {'path':<8} {'req/s':>9} {'p50 ms':>7} {'p99 ms':>7} {'CPU µs/req':>10}")
for (s, p), v in med.items():
    print(f"{s:<7} {p:<8} {v['rps']:>9.0f} {v['p50']:>7.2f} {v['p99']:>7.2f} {v['cpu']:>10.1f}")

missed = 0
def target(text, ok):
    global missed
    missed += not ok
    print(f"  {'PASS' if ok else 'MISS'}  {text}")

k_i, p_i, k_q = med.get(("kodx", "ignored")), med.get(("probot", "ignored")), med.get(("kodx", "queued"))
if k_i or k_q:
    print()
    print("targets")
if k_i and p_i:
    ratio = k_i["cpu"] / p_i["cpu"]
    target(f"ignored: kodx CPU/request is {ratio:.3f} of Probot's ({k_i['cpu']:.1f} vs {p_i['cpu']:.1f} µs; target <= 0.25)", ratio <= 0.25)
    ratio = k_i["rps"] / p_i["rps"]
    target(f"ignored: kodx requests/s is {ratio:.2f}x Probot's ({k_i['rps']:.0f} vs {p_i['rps']:.0f}; target >= 2x)", ratio >= 2)
if k_i:
    target(f"ignored: kodx p99 {k_i['p99']:.2f} ms at {conns} connections (target <= 10 ms)", k_i["p99"] <= 10)
if k_q:
    target(f"queued:  kodx p99 {k_q['p99']:.2f} ms at {conns} connections, write durable (target <= 20 ms)", k_q["p99"] <= 20)
sys.exit(2 if strict and missed else 0)
PY

if [ ${#failures[@]} -gt 0 ]; then
  say ""
  say "correctness checks failed:"
  printf '  %s\n' "${failures[@]}" >&2
  exit 1
fi
exit "$report_status"
