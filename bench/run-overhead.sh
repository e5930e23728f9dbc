#!/usr/bin/env bash
# Fixed overhead of one `kodx run`: process start, engine connection, container, fence,
# first shell, model calls answered at once by a stand-in model API on loopback, teardown.
# Prints the median / p95 in ms, the same for a bare `docker run --rm IMAGE true` measured
# in the same loop, and their ratio against the issue 27 target (at most 1.2x).
#
# With COMMANDS > 0 the stand-in asks for that many shell commands (`true`), one per
# model call, and prints the gap per call: from its answer leaving to kodx's next request
# arriving (kodx's turnaround: the shell round trip and building the request). WRITES
# picks how the stand-in answers: `once` (headers and body in one write, TCP_NODELAY: as
# a real API server) or `split` (Python http.server's default: headers and body in two
# writes with Nagle on, which stalls on the client's delayed ACK).
#   bash bench/run-overhead.sh [RUNS] [IMAGE]
#   COMMANDS=10 WRITES=split bash bench/run-overhead.sh 10
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
image=${2:-kodx-test:bookworm}
commands=${COMMANDS:-0}
writes=${WRITES:-once}
[ -n "${KODX_BENCH_NO_BUILD:-}" ] || cargo build --release -q
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
gaps=$(mktemp)
python3 - "$port" "$commands" "$writes" "$gaps" <<'PY' &
import http.server, json, sys, time
port, commands, writes, gaps = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
last = [None]
class H(http.server.BaseHTTPRequestHandler):
    # `split` is the stand-in as it was: HTTP/1.0 (a connection per call), two writes.
    protocol_version = "HTTP/1.1" if writes == "once" else "HTTP/1.0"
    disable_nagle_algorithm = writes == "once"
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["content-length"])))
        arrived = time.monotonic()
        done = sum(1 for m in req["messages"] if isinstance(m.get("content"), list)
                   for b in m["content"] if b.get("type") == "tool_result")
        if done and last[0] is not None:
            with open(gaps, "a") as f:
                f.write(f"{done} {(arrived - last[0]) * 1000:.2f}\n")
        if done < commands:
            content = [{"type": "tool_use", "id": f"t{done}", "name": "feed_chars",
                        "input": {"chars": "true\n"}}]
            stop = "tool_use"
        else:
            content = [{"type": "text", "text": "hi"}]
            stop = "end_turn"
        body = json.dumps({"id": "m", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                           "content": content, "stop_reason": stop,
                           "usage": {"input_tokens": 10, "output_tokens": 2}}).encode()
        head = (f"{self.protocol_version} 200 OK\r\ncontent-type: application/json\r\n"
                f"content-length: {len(body)}\r\n\r\n").encode()
        if writes == "once":
            self.wfile.write(head + body)
        else:
            self.wfile.write(head)
            self.wfile.write(body)
        self.wfile.flush()
        last[0] = time.monotonic()
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", port), H).serve_forever()
PY
server=$!
trap 'kill $server 2>/dev/null; rm -f "$gaps"' EXIT
sleep 0.5
export ANTHROPIC_BASE_URL="http://127.0.0.1:$port" ANTHROPIC_API_KEY=sk-ant-bench KODX_IMAGE="$image"
times=()
bare=()
for _ in $(seq 1 "$runs"); do
  s=$(date +%s%N)
  ${KODX_BIN:-./target/release/kodx} run -q --repo-dir "" -p hi >/dev/null
  e=$(date +%s%N)
  times+=($(( (e - s) / 1000000 )))
  # A bare `docker run` of the same image, in the same loop: the yardstick.
  s=$(date +%s%N)
  docker run --rm "$image" true
  e=$(date +%s%N)
  bare+=($(( (e - s) / 1000000 )))
done
# "median p95 min max" of the numbers on stdin.
stats() {
  sort -n | awk '{ v[NR] = $1 } END {
    n = NR; med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    printf "%d %d %d %d\n", med, v[int((95 * n + 99) / 100)], v[1], v[n] }'
}
read -r k_med k_p95 k_min k_max < <(printf '%s\n' "${times[@]}" | stats)
read -r b_med b_p95 b_min b_max < <(printf '%s\n' "${bare[@]}" | stats)
echo "kodx run fixed overhead ($runs runs): median $k_med ms, p95 $k_p95 ms, min $k_min ms, max $k_max ms"
echo "bare docker run --rm $image true ($runs runs, interleaved): median $b_med ms, p95 $b_p95 ms, min $b_min ms, max $b_max ms"
awk -v k="$k_med" -v b="$b_med" 'BEGIN {
  r = k / b
  printf "kodx run / docker run: %.2fx (target <= 1.2x): %s\n", r, (r <= 1.2 ? "ok" : "MISSED") }'
if [ "$commands" -gt 0 ]; then
  echo "gap per model call (stand-in answer sent → kodx's next request), median over runs, writes=$writes:"
  sort -k1,1n -k2,2n "$gaps" | awk '
    { k = $1; c[k]++; g[k, c[k]] = $2 }
    END { for (k = 1; k in c; k++) printf "  call %2d: %7.2f ms\n", k + 1, g[k, int((c[k] + 1) / 2)] }'
fi
