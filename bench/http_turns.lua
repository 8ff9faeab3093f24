-- wrk script for bench/http.py and bench/scale_out.py: every wrk thread is ONE client with ONE
-- keep-alive connection (run with -t N -c N) appending user turns to its own
-- session. The sessions and the token come in the environment:
--   FLOWMEM_TOKEN, FLOWMEM_SESSIONS (comma-separated ids, one per thread),
--   FLOWMEM_PREFER (optional Prefer header value, e.g. "return=minimal"),
--   FLOWMEM_PACE_MS (optional: each client waits that long after a reply, on average: a fixed
--   load; each wait is drawn from [0, 2 × pace] by a generator seeded per client, so the
--   clients do not send in step).
-- done() prints one JSON line: requests, errors, non-2xx, p50 and p99 latency (us).

local sessions = {}
for sid in string.gmatch(os.getenv("FLOWMEM_SESSIONS") or "", "[^,]+") do
  sessions[#sessions + 1] = sid
end
local token = os.getenv("FLOWMEM_TOKEN") or ""
local prefer = os.getenv("FLOWMEM_PREFER") or ""
local pace = tonumber(os.getenv("FLOWMEM_PACE_MS") or "") or 0
if pace > 0 then function delay() return math.random(0, 2 * pace) end end
local threads = {}
local counter = 0

function setup(thread)
  counter = counter + 1
  thread:set("sid", sessions[((counter - 1) % #sessions) + 1])
  thread:set("seed", counter)
  table.insert(threads, thread)
end

function init(args)
  math.randomseed(seed)
  n = 0
  non2xx = 0
  path = "/v1/sessions/" .. sid .. "/turns"
  wrk.headers["Authorization"] = "Bearer " .. token
  wrk.headers["Content-Type"] = "application/json"
  if prefer ~= "" then wrk.headers["Prefer"] = prefer end
end

function request()
  n = n + 1
  local body = '{"messages":[{"role":"user","content":"message ' .. n .. '"}]}'
  return wrk.format("POST", path, nil, body)
end

function response(status, headers, body)
  if status ~= 200 then non2xx = non2xx + 1 end
end

function done(summary, latency, requests)
  local bad = 0
  for _, thread in ipairs(threads) do bad = bad + (thread:get("non2xx") or 0) end
  local e = summary.errors
  io.write(string.format(
    '{"requests":%d,"duration_us":%d,"non2xx":%d,"errors":%d,"p50_us":%d,"p99_us":%d}\n',
    summary.requests, summary.duration, bad, e.connect + e.read + e.write + e.status + e.timeout,
    latency:percentile(50), latency:percentile(99)))
end
