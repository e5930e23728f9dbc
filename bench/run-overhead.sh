#!/usr/bin/env bash
# Fixed overhead of one `kodx run`: process start, engine connection, container, first
# shell, one model call answered at once by a stand-in model API on loopback, teardown.
# Prints each run's wall time and the median / p95 in ms.
#   bash bench/run-overhead.sh [RUNS] [IMAGE]
set -euo pipefail
cd "$(dirname "$0")/.."
runs=${1:-20}
image=${2:-kodx-test:bookworm}
cargo build --release -q
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
python3 - "$port" <<'PY' &
import http.server, json, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers["content-length"]))
        body = json.dumps({"id": "m", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5",
                           "content": [{"type": "text", "text": "hi"}], "stop_reason": "end_turn",
                           "usage": {"input_tokens": 10, "output_tokens": 2}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
PY
server=$!
trap 'kill $server 2>/dev/null' EXIT
sleep 0.5
export ANTHROPIC_BASE_URL="http://127.0.0.1:$port" ANTHROPIC_API_KEY=sk-ant-bench KODX_IMAGE="$image"
times=()
for _ in $(seq 1 "$runs"); do
  s=$(date +%s%N)
  ./target/release/kodx run -q --repo-dir "" -p hi >/dev/null
  e=$(date +%s%N)
  times+=($(( (e - s) / 1000000 )))
done
printf '%s\n' "${times[@]}" | sort -n | awk -v n="$runs" '
  { v[NR] = $1 }
  END {
    med = (n % 2) ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
    p95 = v[int((95 * n + 99) / 100)]
    printf "kodx run fixed overhead (%d runs): median %d ms, p95 %d ms, min %d ms, max %d ms\n", n, med, p95, v[1], v[n]
  }'
