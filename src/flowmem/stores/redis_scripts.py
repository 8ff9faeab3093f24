"""The Lua scripts of the Redis store, and the layout of its keys.

One conversation buffer lives under keys that share one hash tag, so they
sit on one Redis Cluster slot and one script may touch them all::

    {P:scope:scope_id:key}:v      string  a plain value (JSON text), or absent
    {P:scope:scope_id:key}:meta   hash    ver (a random token), count, next
    {P:scope:scope_id:key}:pos    zset    position -> position (the order)
    {P:scope:scope_id:key}:body   hash    position -> message (JSON text)
    {P:scope:scope_id:key}:info   hash    position -> "T<id>" result, "T" other tool,
                                          "A<id>\\0<id>..." declaring turn
    {P:scope:scope_id:key}:res    hash    id -> position of its result ("h" prefix:
                                          a healed placeholder)        (sql: the
                                          UNIQUE (buffer, result_id) index)
    {P:scope:scope_id:key}:calls  hash    id -> "turn:ord,turn:ord"  (every declaration)
    {P:scope:scope_id:key}:pend   hash    id -> "turn:ord"           (unanswered calls)
    {P:scope:scope_id:key}:lock   string  the MEM-12 lease: a token, expiring (PX)
    P:idx:scope:scope_id          zset    key names, for listing keys

Each name component is percent-escaped (``%``, ``:``, ``{``, ``}``), so the
layout is injective and a key never breaks out of its hash tag.

:data:`APPLY` (written in :mod:`.redis_apply_lua`) executes one
:class:`~flowmem.plan.AppendPlan` — the same statements :mod:`flowmem.stores.sql`
runs, as Redis commands — after checking
that the buffer's version is still the one the plan was made against. It
parses and checks all of its input, and the type of every key, before its
first write: Redis does not roll a script back, so a script that can fail
must fail before it writes anything.
"""

from __future__ import annotations

from typing import Final

from .redis_apply_lua import APPLY, IDEM, PAGE, PRELUDE

__all__ = ["APPLY", "BUFFER_PARTS", "DELETE", "EDIT", "HISTORY", "READ", "RELEASE", "RENEW",
           "WRITE"]

BUFFER_PARTS: Final = ("v", "meta", "pos", "body", "info", "res", "calls", "pend", "lock")
"""The suffixes of one buffer's keys, in the order every script takes them."""

READ: Final = r"""#!lua flags=no-writes
-- the whole key: {'v', value} | {'b', body...} | {'none'}
local value = redis.call('GET', KEYS[1])
if value then return {'v', value} end
if redis.call('EXISTS', KEYS[2]) == 0 then return {'none'} end
local out, positions = {'b'}, redis.call('ZRANGE', KEYS[3], 0, -1)
for k = 1, #positions, 1000 do
  local chunk = redis.call('HMGET', KEYS[4], unpack(positions, k, math.min(k + 999, #positions)))
  for _, body in ipairs(chunk) do out[#out + 1] = body end
end
return out
"""

HISTORY: Final = "#!lua flags=no-writes\n" + PAGE + r"""
-- ARGV: 1 last ("" = all), 2 before ("" = none). Returns page()'s reply, or
-- {'value'} when the key holds a plain value
if redis.call('EXISTS', KEYS[1]) == 1 then return {'value'} end
return page(ARGV[1], ARGV[2])
"""

WRITE: Final = "#!lua\n" + IDEM + r"""
-- a plain value replaces whatever the key held (ARGV[1]: JSON text); with an
-- idempotency record (KEYS[10]; ARGV 2 fingerprint, 3 ms, 4 clock) a repeat does nothing
if ARGV[2] then
  local first = idem_first(ARGV[2], ARGV[4])
  if first == false then return 'idem_conflict' end
  if first then return 'replay' end
end
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
redis.call('SET', KEYS[1], ARGV[1])
if ARGV[2] then idem_record(ARGV[2], ARGV[3], ARGV[4], '') end
return 1
"""

DELETE: Final = "#!lua\n" + IDEM + r"""
-- an idempotent delete: KEYS the nine BUFFER_PARTS + the idempotency record;
-- ARGV 1 fingerprint, 2 ms, 3 clock.  Returns {'ok'|'replay'|'idem_conflict', found}
local first = idem_first(ARGV[1], ARGV[3])
if first == false then return {'idem_conflict', 0} end
if first then return {'replay', tonumber(first)} end
local removed = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6],
                           KEYS[7], KEYS[8])
local found = 0
if removed > 0 then found = 1 end
idem_record(ARGV[1], ARGV[2], ARGV[3], tostring(found))
return {'ok', found}
"""

RELEASE: Final = r"""#!lua
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

RENEW: Final = r"""#!lua
-- extend the MEM-12 lease KEYS[1] by ARGV[2] ms only while ARGV[1] holds it (a
-- late renewal never re-takes a released lease); 1 when it did. Sent with EVAL
-- (it is tiny), so it never meets NOSCRIPT inside a MULTI.
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""

EDIT: Final = "#!lua\n" + PRELUDE + r"""
-- the administrative edit (MEM-15): replace a buffer's index keys whole, if its
-- version is still ARGV[1].  ARGV: 1 version, 2 new version, 3 count, then
-- n position... (pos), then five sections of n (field value)... for body, info,
-- res, calls, pend.  Returns 'ok', 'conflict' or 'value'.
if redis.call('EXISTS', KEYS[1]) == 1 then return 'value' end
if (redis.call('HGET', KEYS[2], 'ver') or '') ~= ARGV[1] then return 'conflict' end
local function num(i)
  local n = tonumber(ARGV[i])
  if n == nil then error('flowmem: bad edit argument ' .. i) end
  return n
end
num(3)
local npos, sections, i = num(4), {}, nil
for k = 1, npos do num(4 + k) end
i = 5 + npos
for k = 1, 5 do
  local n = num(i)
  sections[k] = {i + 1, n}
  i = i + 1 + 2 * n
end
if i ~= #ARGV + 1 then error('flowmem: truncated edit') end
redis.call('DEL', KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
for k = 1, npos, 500 do
  local args = {}
  for j = k, math.min(k + 499, npos) do
    args[#args + 1] = ARGV[4 + j]
    args[#args + 1] = ARGV[4 + j]
  end
  redis.call('ZADD', KEYS[3], unpack(args))
end
for k = 1, 5 do
  local first, n = sections[k][1], sections[k][2]
  for j = 0, n - 1, 500 do
    local m = math.min(500, n - j)
    redis.call('HSET', KEYS[3 + k], unpack(ARGV, first + 2 * j, first + 2 * (j + m) - 1))
  end
end
redis.call('HSET', KEYS[2], 'ver', ARGV[2], 'count', ARGV[3])
return 'ok'
"""
