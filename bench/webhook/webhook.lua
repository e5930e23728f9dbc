-- wrk script for bench/webhook-load.sh: signed GitHub `issue_comment` deliveries.
--
--   wrk -t2 -c64 -d10s -s webhook.lua URL -- BODY_FILE SIGNATURE RUN_PREFIX [TEMPLATE]
--
-- Without TEMPLATE every request carries the same body and X-Hub-Signature-256 (the
-- signature covers the body only). With TEMPLATE (payload.py's queued.tpl) every request
-- carries its own comment id, and so its own body and signature: kodx starts one run per
-- comment, so the queued path needs a new comment each time. The comment id is
--   <run 8 digits, from RUN_PREFIX><thread 2 digits><counter 9 digits>
-- and the HMAC-SHA256 is finished from the states payload.py computed over the fixed part
-- of the body: two SHA-256 blocks per request (a few microseconds of LuaJIT).
-- Every request has a unique X-GitHub-Delivery, shaped like GitHub's UUIDs:
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
-- With a template: the body before the comment id, the HMAC states, the run digits.
local tpl_prefix, tpl_inner, tpl_outer, tpl_run

-- SHA-256 compression on LuaJIT's 32-bit `bit` operations.
local bit = require("bit")
local band, bor, bxor, bnot, ror, rshift, lshift, tobit =
  bit.band, bit.bor, bit.bxor, bit.bnot, bit.ror, bit.rshift, bit.lshift, bit.tobit
local K = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
}
for i = 1, 64 do K[i] = tobit(K[i]) end
local W = {}

-- The state after compressing one 64-byte block (a string) into `st` (8 words).
local function compress(st, block)
  for i = 0, 15 do
    local b1, b2, b3, b4 = string.byte(block, 4 * i + 1, 4 * i + 4)
    W[i] = bor(lshift(b1, 24), lshift(b2, 16), lshift(b3, 8), b4)
  end
  for i = 16, 63 do
    local w15, w2 = W[i - 15], W[i - 2]
    local s0 = bxor(ror(w15, 7), ror(w15, 18), rshift(w15, 3))
    local s1 = bxor(ror(w2, 17), ror(w2, 19), rshift(w2, 10))
    W[i] = tobit(W[i - 16] + s0 + W[i - 7] + s1)
  end
  local a, b, c, d, e, f, g, h = st[1], st[2], st[3], st[4], st[5], st[6], st[7], st[8]
  for i = 0, 63 do
    local S1 = bxor(ror(e, 6), ror(e, 11), ror(e, 25))
    local ch = bxor(band(e, f), band(bnot(e), g))
    local t1 = tobit(h + S1 + ch + K[i + 1] + W[i])
    local S0 = bxor(ror(a, 2), ror(a, 13), ror(a, 22))
    local maj = bxor(band(a, b), band(a, c), band(b, c))
    local t2 = tobit(S0 + maj)
    h, g, f, e, d, c, b, a = g, f, e, tobit(d + t1), c, b, a, tobit(t1 + t2)
  end
  return {
    tobit(st[1] + a), tobit(st[2] + b), tobit(st[3] + c), tobit(st[4] + d),
    tobit(st[5] + e), tobit(st[6] + f), tobit(st[7] + g), tobit(st[8] + h),
  }
end

local function be32(w)
  return string.char(band(rshift(w, 24), 255), band(rshift(w, 16), 255),
    band(rshift(w, 8), 255), band(w, 255))
end

-- The last block of a message of `total` bytes whose unhashed tail is `tail` (< 56 bytes).
local function final_block(tail, total)
  local bits = total * 8
  return tail .. "\128" .. string.rep("\0", 55 - #tail)
    .. be32(math.floor(bits / 4294967296)) .. be32(bits % 4294967296)
end

-- "sha256=<hex>" of the template body ending in `suffix` (the id digits and "}}").
local function sign_suffix(suffix)
  local inner = compress(tpl_inner, final_block(suffix, 64 + #tpl_prefix + #suffix))
  local digest = {}
  for i = 1, 8 do digest[i] = be32(inner[i]) end
  local outer = compress(tpl_outer, final_block(table.concat(digest), 64 + 32))
  local hex = {}
  for i = 1, 8 do hex[i] = bit.tohex(outer[i], 8) end
  return "sha256=" .. table.concat(hex)
end

local function words(line)
  local t = {}
  for w in line:gmatch("%x+") do table.insert(t, tobit(tonumber(w, 16))) end
  assert(#t == 8, "a template state is 8 hex words")
  return t
end
-- Global, not local: done() reads it from each thread's state with thread:get.
statuses = {}

function init(args)
  if #args ~= 3 and #args ~= 4 then
    error("usage: wrk ... -s webhook.lua URL -- BODY_FILE SIGNATURE RUN_PREFIX [TEMPLATE]")
  end
  local f = assert(io.open(args[1], "rb"))
  body = f:read("*a")
  f:close()
  signature = args[2]
  prefix = args[3]
  if args[4] then
    local t = assert(io.open(args[4], "rb"))
    tpl_inner = words(t:read("*l"))
    tpl_outer = words(t:read("*l"))
    local sample_id, sample_sig = t:read("*l"):match("^(%d+) (%S+)$")
    tpl_prefix = t:read("*a")
    t:close()
    assert(#tpl_prefix % 64 == 0, "the template prefix is whole blocks")
    if sign_suffix(sample_id .. "}}") ~= sample_sig then
      error("webhook.lua signs the template's sample wrongly")
    end
    -- 8 digits from RUN_PREFIX (hex), in [10000000, 90000000): no leading zero, and the
    -- whole id stays below 2^63.
    tpl_run = 10000000 + tonumber(prefix, 16) % 80000000
  end
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
  if tpl_prefix then
    local suffix = string.format("%08d%02d%09d}}", tpl_run, tid, counter)
    headers["X-Hub-Signature-256"] = sign_suffix(suffix)
    return wrk.format("POST", path, headers, tpl_prefix .. suffix)
  end
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
