-- wrk script for bench/webhook-load.sh: signed GitHub `issue_comment` deliveries.
--
--   wrk -t2 -c64 -d10s -s webhook.lua URL -- BODY_FILE SIGNATURE RUN_PREFIX
--
-- Every request carries the same body and X-Hub-Signature-256 (the signature covers the
-- body only) and a unique X-GitHub-Delivery, shaped like GitHub's UUIDs:
--   <RUN_PREFIX 8 hex>-<thread 4 hex>-<random 4 hex>-<random 4 hex>-<counter 12 hex>
-- RUN_PREFIX is fresh random per wrk invocation and the thread id is set in setup(), so
-- no two requests of one bench run (warmups included) share a delivery id, and a server
-- that dedupes deliveries never takes its duplicate shortcut.
--
-- done() prints one machine-readable line:
--   RESULT requests=N duration_us=N rps=F p50_us=N p99_us=N non2xx=N
--          connect_err=N read_err=N write_err=N timeout_err=N statuses=200:N,202:N
-- `statuses` counts every HTTP status seen, so a caller can insist on 200 vs 202.

local threads = {}
local next_id = 0

function setup(thread)
  thread:set("tid", next_id)
  next_id = next_id + 1
  table.insert(threads, thread)
end

local body, signature, prefix, path
local counter = 0
-- Global, not local: done() reads it from each thread's state with thread:get.
statuses = {}

function init(args)
  if #args ~= 3 then
    error("usage: wrk ... -s webhook.lua URL -- BODY_FILE SIGNATURE RUN_PREFIX")
  end
  local f = assert(io.open(args[1], "rb"))
  body = f:read("*a")
  f:close()
  signature = args[2]
  prefix = args[3]
  path = wrk.path
  -- Each thread has its own Lua state; mix the thread id into the seed.
  math.randomseed(os.time() + 7919 * tid)
  mid = string.format("%04x-%04x-%04x", tid, math.random(0, 0xffff), math.random(0, 0xffff))
  headers = {
    ["Content-Type"] = "application/json",
    ["User-Agent"] = "GitHub-Hookshot/abc",
    ["X-GitHub-Event"] = "issue_comment",
    ["X-GitHub-Hook-ID"] = "512345678",
    ["X-GitHub-Hook-Installation-Target-Type"] = "integration",
    ["X-GitHub-Hook-Installation-Target-ID"] = "1",
    ["X-Hub-Signature-256"] = signature,
  }
end

function request()
  counter = counter + 1
  headers["X-GitHub-Delivery"] = string.format("%s-%s-%012x", prefix, mid, counter)
  return wrk.format("POST", path, headers, body)
end

function response(status, hdrs, resp_body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  local merged = {}
  for _, t in ipairs(threads) do
    for code, n in pairs(t:get("statuses") or {}) do
      merged[code] = (merged[code] or 0) + n
    end
  end
  local parts = {}
  for code, n in pairs(merged) do
    table.insert(parts, string.format("%d:%d", code, n))
  end
  table.sort(parts)
  local e = summary.errors
  io.write(string.format(
    "RESULT requests=%d duration_us=%d rps=%.1f p50_us=%d p99_us=%d non2xx=%d "
      .. "connect_err=%d read_err=%d write_err=%d timeout_err=%d statuses=%s\n",
    summary.requests, summary.duration, summary.requests / (summary.duration / 1e6),
    latency:percentile(50), latency:percentile(99), e.status,
    e.connect, e.read, e.write, e.timeout, table.concat(parts, ",")))
end
