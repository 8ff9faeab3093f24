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
                                          UNIQUE (buffer, result_id) index);
                                          id + NUL -> its newest alias with a
                                          result (._per_turn_lua)
    {P:scope:scope_id:key}:calls  hash    id -> "turn:ord,turn:ord"  (every declaration)
    {P:scope:scope_id:key}:pend   hash    id -> "turn:ord"           (unanswered calls)
    {P:scope:scope_id:key}:lock   string  the MEM-12 lease: a token, expiring (PX)
    {P:scope:scope_id:key}:idem:K string  an idempotency record
    {P:scope:scope_id}:idx        zset    key names of one scope id, for listing keys
    {P:scope:scope_id}:fence      string  the scope id is being erased (the erasure's fence)
    {P:scope:scope_id:key}:gone   string  a cluster's tombstone of a key being erased

Under a retention policy the first eight keys of a conversation (or its
``:v``) carry one Redis expiry instant, the stored expiry
(:mod:`flowmem.stores.redis._expiry_lua`).

Every script touches the keys of ONE conversation (one slot). On a standalone
server the scripts also update the scope id's key index (``KEYS[11]``) in the
same atomic step; on a cluster the index lives in another slot, so the
programs update it in steps of their own (:mod:`flowmem.stores.redis._programs`).

Each name component is percent-escaped (``%``, ``:``, ``{``, ``}``), so the
layout is injective and a key never breaks out of its hash tag.

:data:`APPLY` (written in :mod:`.redis_apply_lua`) executes one
:class:`~flowmem.plan.AppendPlan` — the same statements :mod:`flowmem.stores.sql._conversations`
runs, as Redis commands — after checking
that the buffer's version is still the one the plan was made against. It
parses and checks all of its input, and the type of every key, before its
first write: Redis does not roll a script back, so a script that can fail
must fail before it writes anything.
"""

from __future__ import annotations

from typing import Final

from ._apply_lua import APPLY, IDEM, PAGE, PRELUDE
from ._expiry_lua import EXPIRY

__all__ = ["APPLY", "BUFFER_PARTS", "DELETE", "EDIT", "ERASE", "HISTORY", "LIST", "READ",
           "RELEASE", "RENEW", "TOUCH", "WRITE"]

BUFFER_PARTS: Final = ("v", "meta", "pos", "body", "info", "res", "calls", "pend", "lock")
"""The suffixes of one buffer's keys, in the order every script takes them."""

READ: Final = "#!lua flags=no-writes\n" + EXPIRY + r"""
-- the whole key: {'v', value} | {'b', body...} | {'none'} (also when it expired by
-- ARGV[1], the caller's clock in ms; '' = not asked)
if expired(ARGV[1]) then return {'none'} end
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

HISTORY: Final = "#!lua flags=no-writes\n" + EXPIRY + PAGE + r"""
-- ARGV: 1 last ("" = all), 2 before ("" = none), 3 the caller's clock (ms, '' = not
-- asked). Returns page()'s reply (an empty one when the key expired by ARGV[3]), or
-- {'value'} when the key holds a plain value
if expired(ARGV[3]) then return {0, 0} end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'value'} end
return page(ARGV[1], ARGV[2])
"""

WRITE: Final = "#!lua\n" + IDEM + EXPIRY + r"""
-- a plain value replaces the key's value; a conversation only when ARGV 6 is '1'.
-- KEYS: the nine BUFFER_PARTS, the idempotency record, the scope's key index, the erasure
-- mark (as APPLY's: then 'erased', nothing written).  ARGV: 1 JSON text, 2 the
-- idempotency fingerprint ('' = none: a repeat does nothing), 3 its ms, 4 the clock,
-- 5 the index member ('' = the caller lists it), 6 replace ('1') or not (''); retention
-- (as APPLY's 11-13): 7 the caller's clock, 8 the expiry instant, 9 renew.  Returns
-- 'new' (the key held nothing before), 'ok', 'replay', 'idem_conflict', 'conversation'
-- (nothing written: the key holds one) or 'erased'.
purge(ARGV[7])
local kept = due()
if ARGV[2] ~= '' then
  local gen = ''
  if redis.call('EXISTS', KEYS[1]) == 1 then gen = 'v' end
  local first = idem_first(ARGV[2], ARGV[4], ARGV[7], gen)
  if first == false then return 'idem_conflict' end
  if first then return 'replay' end
end
if ARGV[6] ~= '1' and redis.call('EXISTS', KEYS[2]) == 1 then return 'conversation' end
if redis.call('EXISTS', KEYS[12]) == 1 then return 'erased' end
local existed = redis.call('EXISTS', KEYS[1], KEYS[2])
redis.call('DEL', KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
redis.call('SET', KEYS[1], ARGV[1])
local expires = next_due(kept, ARGV[8], ARGV[9])
expire_all(expires)
if ARGV[5] ~= '' then redis.call('ZADD', KEYS[11], 0, ARGV[5]) end
if ARGV[2] ~= '' then idem_record(ARGV[2], ARGV[3], ARGV[4], '', 'v', expires) end
if existed == 0 then return 'new' end
return 'ok'
"""

DELETE: Final = "#!lua\n" + IDEM + r"""
-- KEYS as WRITE's; ARGV 1 fingerprint ('' = none), 2 ms, 3 clock, 4 the index member
-- ('' = the caller unlists it).  Returns {'ok'|'replay'|'idem_conflict', found}
if ARGV[1] ~= '' then
  local first = idem_first(ARGV[1], ARGV[3], '', '')
  if first == false then return {'idem_conflict', 0} end
  if first then return {'replay', tonumber(first)} end
end
local removed = redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6],
                           KEYS[7], KEYS[8])
if ARGV[4] ~= '' then redis.call('ZREM', KEYS[11], ARGV[4]) end
local found = 0
if removed > 0 then found = 1 end
if ARGV[1] ~= '' then idem_record(ARGV[1], ARGV[2], ARGV[3], tostring(found), '', nil) end
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

EDIT: Final = "#!lua\n" + PRELUDE + EXPIRY + r"""
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
expire_all(due())  -- the rewritten keys keep the conversation's expiry (meta kept it)
return 'ok'
"""

ERASE: Final = r"""#!lua
-- an erasure's step for one key (stores/redis/_erasure.py). KEYS: the nine BUFFER_PARTS,
-- the key's tombstone. ARGV: 1 '1' = a dry run (count only), 2 '1' = leave the tombstone
-- (a cluster). Returns {conversation 0/1, value 0/1, messages}
local conversation = redis.call('EXISTS', KEYS[2])
local value = redis.call('EXISTS', KEYS[1])
local messages = redis.call('HLEN', KEYS[4])
if ARGV[1] ~= '1' then
  redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8],
             KEYS[9])
  if ARGV[2] == '1' then redis.call('SET', KEYS[10], '1') end
end
return {conversation, value, messages}
"""

LIST: Final = r"""#!lua
-- a cluster lists a key in its scope index (KEYS[1]) unless the scope id's fence
-- (KEYS[2]) is up: 1 listed, 0 refused. ARGV: 1 the member
if redis.call('EXISTS', KEYS[2]) == 1 then return 0 end
redis.call('ZADD', KEYS[1], 0, ARGV[1])
return 1
"""

TOUCH: Final = "#!lua\n" + EXPIRY + r"""
-- refresh_on_read: move the expiry of live data to ARGV[2] (ms) unless it expired by
-- ARGV[1] (the caller's clock, ms). KEYS: the nine BUFFER_PARTS. 1 when it was there.
if expired(ARGV[1]) or redis.call('EXISTS', KEYS[1], KEYS[2]) == 0 then return 0 end
expire_all(tonumber(ARGV[2]))
return 1
"""
