"""The Lua script that applies an append plan on Redis (:data:`APPLY`), and the
fragments the other scripts share (the key-type prelude, the page reader; the
idempotency record and retention's fragment are in :mod:`._expiry_lua`).

The layout of the keys it touches, and what it promises, are described in
:mod:`flowmem.stores.redis._scripts`, which exports it with the other scripts.
"""

from __future__ import annotations

from typing import Final

from ._expiry_lua import EXPIRY, IDEM
from ._per_turn_lua import PER_TURN

__all__ = ["APPLY", "IDEM", "PAGE", "PRELUDE"]  # IDEM: re-exported

PRELUDE: Final = r"""
local function s(n) return string.format('%d', n) end
local TYPES = {'string', 'hash', 'zset', 'hash', 'hash', 'hash', 'hash', 'hash', 'string',
               'string', 'zset', 'string'}
for i = 1, #KEYS do
  local t = redis.call('TYPE', KEYS[i])['ok']
  if t ~= 'none' and t ~= TYPES[i] then
    return redis.error_reply('WRONGTYPE flowmem key ' .. KEYS[i] .. ' holds a ' .. t)
  end
end
"""

PAGE: Final = r"""
-- page(last, before): the newest `last` entries ("" = all) older than `before`
-- ("" = none) of the buffer in KEYS[3] (positions) and KEYS[4] (bodies), oldest first:
-- {more, total, pos, body, pos, body...}; total: the entries before `before`
local function page(last_arg, before_arg)
  local upper = '+inf'
  if before_arg ~= '' then upper = '(' .. before_arg end
  local total = redis.call('ZCOUNT', KEYS[3], '-inf', upper)
  local positions, more = nil, 0
  if last_arg == '' then
    positions = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', upper)
  else
    local last = tonumber(last_arg)
    local newest = redis.call('ZREVRANGEBYSCORE', KEYS[3], upper, '-inf', 'LIMIT', 0, last + 1)
    if #newest > last then more = 1 end
    positions = {}
    for k = math.min(last, #newest), 1, -1 do positions[#positions + 1] = newest[k] end
  end
  local out = {more, total}
  for k = 1, #positions, 1000 do
    local chunk = redis.call('HMGET', KEYS[4], unpack(positions, k, math.min(k + 999, #positions)))
    for j, body in ipairs(chunk) do
      out[#out + 1] = positions[k + j - 1]
      out[#out + 1] = body
    end
  end
  return out
end
"""

APPLY: Final = "#!lua\n" + PRELUDE + IDEM + EXPIRY + PAGE + PER_TURN + r"""
-- KEYS: the nine BUFFER_PARTS, the idempotency record (a name never written when the
-- append has none), the scope's key index (a cluster: a name never written), the erasure
-- mark (a standalone server: the scope id's fence; a cluster: the key's tombstone).
-- ARGV: 1 the append's lease
-- token ("" = go ahead whoever holds the lease: MEM-12's unserialized fallback), 2 the
-- lease's ms, 3 the new version, 4 SLOT, 5 max_messages ("" = unbounded), 6 the
-- idempotency fingerprint ("" = none), 7 its time to live (ms), 8 the caller's clock
-- (s), 9 the tail: how many of the newest entries to reply with (0 = none), 10 the
-- listing: '' (none: a cluster lists outside), '!' (a cluster: the key may have been
-- unlisted; do not create it), '+member' (list the key in KEYS[11]) or
-- '?member' (list it only if this append creates the buffer); retention: 11 the
-- caller's clock (ms, '' = not asked), 12 the expiry instant to set (ms, '' = none),
-- 13 '1' when it renews (idle) else '' (absolute: set once); then the
-- view the plan was made against: n (id code)... with code the id's
-- result ('-' none, 'h' a healed placeholder, 'r' real) then whether it is declared
-- ('d' or '-'), then '*' (the append does not heal) or m (id 'turn:ord')... the whole
-- of the unanswered calls; then '*' or the per_turn facts (read_facts, ._per_turn_lua);
-- then the operations:
--   A role body answers healed(0/1) ndeclares id... nopens (id ord)...
--   R id body
--   H p|n turn count (id placeholder-body)...
-- Replies {'locked'} when another token holds the lease (nothing changed);
-- {'erased'} or {'unlisted'} for a new buffer refused (see below; nothing changed);
-- {'conflict', code..., [pend], [facts]} when the buffer no longer matches the view: the
-- ids' codes now, when it heals HGETALL of the unanswered calls, and when facts were
-- sent facts_now() (nothing
-- changed but the renewal of a lease the token holds); else {'ok', count, appended,
-- owned, created, tail, due, (id code pend)...}: owned is 1 when no other token held the
-- lease, created 1 when the buffer did not exist, tail page()'s reply for the newest
-- ARGV[9] entries after the append ({} for none), due the expiry instant the
-- conversation now has (ms, '' none), then the codes and unanswered-call
-- entries ('' for none) of every id the append touched, as they are now. A replay is
-- {'replay', count, appended, owned, tail}.
local V, META, POS, BODY, INFO, RES, CALLS, PEND, LOCK =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local TOKEN = ARGV[1]
local holder = redis.call('GET', LOCK)
if TOKEN ~= '' and holder and holder ~= TOKEN then return {'locked'} end
local owned = 0
if TOKEN ~= '' then owned = 1 end
local function release()
  if holder and holder == TOKEN then redis.call('DEL', LOCK) end
  return owned
end

-- parse everything first: nothing below the parser may fail
local function num(i)
  local n = tonumber(ARGV[i])
  if n == nil then error('flowmem: bad plan argument ' .. i) end
  return n
end
local slot, window, tail = num(4), nil, num(9)
if ARGV[5] ~= '' then window = num(5) end
local function tail_page()
  if tail > 0 then return page(ARGV[9], '') end
  return {}
end
local ids, expect, pending = {}, {}, nil
if ARGV[11] ~= '' then num(11) end
if ARGV[12] ~= '' then num(12) end
local i = 15
for k = 1, num(14) do ids[k], expect[k] = ARGV[i], ARGV[i + 1] i = i + 2 end
if ARGV[i] == '*' then
  i = i + 1
else
  pending = {}
  local n = num(i)
  for k = 1, n do pending[k] = {ARGV[i + 2 * k - 1], ARGV[i + 2 * k]} end
  i = i + 1 + 2 * n
end
local facts = nil; facts, i = read_facts(i, num)
local ops, sure = {}, {}
while i <= #ARGV do
  local kind = ARGV[i]
  if kind == 'A' then
    local op = {kind = 'A', role = ARGV[i + 1], body = ARGV[i + 2], answers = ARGV[i + 3],
                healed = ARGV[i + 4], declares = {}, opens = {}}
    local n = num(i + 5)
    for k = 1, n do op.declares[k] = ARGV[i + 5 + k] end
    i = i + 6 + n
    n = num(i)
    for k = 1, n do op.opens[k] = {ARGV[i + 2 * k - 1], num(i + 2 * k)} end
    i = i + 1 + 2 * n
    sure[#sure + 1] = op.answers == ''  -- an entry that is not a result is always added
    ops[#ops + 1] = op
  elseif kind == 'R' then
    ops[#ops + 1] = {kind = 'R', id = ARGV[i + 1], body = ARGV[i + 2]}
    i = i + 3
  elseif kind == 'H' then
    local op = {kind = 'H', ref = ARGV[i + 1], turn = num(i + 2), ids = {}, bodies = {}}
    if op.ref == 'n' and not sure[op.turn + 1] then error('flowmem: bad turn reference') end
    local n = num(i + 3)
    for k = 1, n do op.ids[k], op.bodies[k] = ARGV[i + 2 + 2 * k], ARGV[i + 3 + 2 * k] end
    i = i + 4 + 2 * n
    ops[#ops + 1] = op
  else
    error('flowmem: bad plan operation at argument ' .. i)
  end
end
if i ~= #ARGV + 1 then error('flowmem: truncated plan') end

purge(ARGV[11])  -- expired (by the caller's clock): the append starts afresh
local kept = due()
if ARGV[6] ~= '' then  -- a repeated idempotency key: the first outcome, nothing changes
  local first = idem_first(ARGV[6], ARGV[8], ARGV[11], redis.call('HGET', META, 'gen') or '')
  if first == false then return {'idem_conflict', 0, 0, release()} end
  if first then
    local c, a = string.match(first, '(%d+) (%d+)')
    return {'replay', tonumber(c), tonumber(a), release(), tail_page()}
  end
end
if redis.call('EXISTS', V) == 1 then release() return {'value'} end

-- the plan holds exactly when the view it was made against still holds
local function code(id)
  local held, c = redis.call('HGET', RES, id), '-'
  if held then c = string.sub(held, 1, 1) == 'h' and 'h' or 'r' end
  return c .. (redis.call('HEXISTS', CALLS, id) == 1 and 'd' or '-')
end
local stale = false
for k, id in ipairs(ids) do
  if code(id) ~= expect[k] then stale = true break end
end
if pending and not stale then
  stale = redis.call('HLEN', PEND) ~= #pending
  for _, p in ipairs(pending) do
    if stale then break end
    stale = redis.call('HGET', PEND, p[1]) ~= p[2]
  end
end
stale = stale or facts_stale(facts)
if stale then
  if holder and holder == TOKEN then redis.call('PEXPIRE', LOCK, ARGV[2]) end
  local out = {'conflict'}
  for _, id in ipairs(ids) do out[#out + 1] = code(id) end
  if pending then out[#out + 1] = redis.call('HGETALL', PEND) end
  if facts then out[#out + 1] = facts_now(facts, code) end
  return out
end
local created = 0
if redis.call('EXISTS', META) == 0 then
  created = 1
  -- a new buffer under an erasure (KEYS[12]: the scope id's fence on a standalone server,
  -- the key's tombstone on a cluster) is refused; on a cluster, one this store thinks
  -- listed ('!') is listed again first, past the fence (stores/redis/_erasure.py)
  if redis.call('EXISTS', KEYS[12]) == 1 then release() return {'erased'} end
  if ARGV[10] == '!' then release() return {'unlisted'} end
end
local touched = {}  -- every id whose result, declaration or unanswered call may change

-- the end of a turn's block: the last of the consecutive tool entries that follow
-- it (or the turn), and the position of the entry after the block (nil: none)
local function block(turn)
  local base, from = turn, '(' .. s(turn)
  while true do
    local nxt = redis.call('ZRANGEBYSCORE', POS, from, '+inf', 'LIMIT', 0, 32)
    if #nxt == 0 then return base, nil end
    for _, p in ipairs(nxt) do
      local info = redis.call('HGET', INFO, p)
      if not (info and string.sub(info, 1, 1) == 'T') then return base, tonumber(p) end
      base = tonumber(p)
    end
    from = '(' .. nxt[#nxt]
  end
end
-- placeholders take base+1, base+2...: refuse, before any write, an append whose
-- placeholders would land on a stored entry (as SQL's UNIQUE (buffer_id, pos) does)
for _, op in ipairs(ops) do
  if op.kind == 'H' and op.ref == 'p' then
    local base, after = block(op.turn)
    if after and after <= base + #op.ids then
      error('flowmem: no free position for the placeholders after the turn at ' .. s(op.turn))
    end
  end
end

local count = tonumber(redis.call('HGET', META, 'count') or '0')
local nextpos = tonumber(redis.call('HGET', META, 'next') or '0')
local appended, added = 0, {}

local function put(p, body, info)
  redis.call('ZADD', POS, p, p)
  redis.call('HSET', BODY, p, body)
  if info then redis.call('HSET', INFO, p, info) end
end

-- a result, as the SQL stores write it (MEM-1, MEM-10): write at p when the id has no result;
-- overwrite a healed placeholder in place when this one is real; else nothing
local function upsert(id, p, body, healed)
  touched[id] = true
  local held = redis.call('HGET', RES, id)
  if not held then
    put(p, body, 'T' .. id)
    redis.call('HSET', RES, id, (healed == '1' and 'h' or '') .. p)
    redis.call('HDEL', PEND, id)
    noted(id)
    return true
  end
  if string.sub(held, 1, 1) == 'h' and healed == '0' then
    local at = string.sub(held, 2)
    redis.call('HSET', BODY, at, body)
    redis.call('HSET', RES, id, at)
  end
  return false
end

local function add(op, p)
  if op.answers ~= '' then
    return upsert(op.answers, p, op.body, op.healed)
  end
  local info = nil
  if op.role == 'tool' then info = 'T' end
  if #op.declares > 0 then info = 'A' .. table.concat(op.declares, '\0') end
  put(p, op.body, info)
  for k, id in ipairs(op.declares) do
    touched[id] = true
    local old = redis.call('HGET', CALLS, id)
    local entry = p .. ':' .. s(k - 1)
    redis.call('HSET', CALLS, id, old and (old .. ',' .. entry) or entry)
  end
  for _, open in ipairs(op.opens) do
    redis.call('HSETNX', PEND, open[1], p .. ':' .. s(open[2]))
  end
  return true
end

local function heal(turn, ids, bodies)
  local base = block(turn)
  for k, id in ipairs(ids) do
    local p = s(base + k)
    touched[id] = true
    put(p, bodies[k], 'T' .. id)
    redis.call('HSET', RES, id, 'h' .. p)
    redis.call('HDEL', PEND, id)
    noted(id)
  end
  return #ids
end

local ordinal = 0
for _, op in ipairs(ops) do
  if op.kind == 'A' then
    if add(op, s(nextpos)) then
      added[ordinal] = nextpos
      nextpos, count, appended = nextpos + slot, count + 1, appended + 1
    end
    ordinal = ordinal + 1
  elseif op.kind == 'R' then
    if upsert(op.id, s(nextpos), op.body, '0') then
      nextpos, count, appended = nextpos + slot, count + 1, appended + 1
    end
  else
    local turn = op.turn
    if op.ref == 'n' then turn = added[op.turn] end
    count = count + heal(turn, op.ids, op.bodies)
  end
end

-- the window, exactly as flowmem.buffer defines it (sql._evict)
local function turns_of(id)
  local out, v = {}, redis.call('HGET', CALLS, id)
  if v then
    for t, o in string.gmatch(v, '(%d+):(%d+)') do out[#out + 1] = {tonumber(t), o} end
  end
  return out
end
local function drop(p)
  redis.call('ZREM', POS, p)
  redis.call('HDEL', BODY, p)
  redis.call('HDEL', INFO, p)
end
if window and count > window then
  local excess = count - window
  local victims = redis.call('ZRANGE', POS, 0, excess - 1)
  local cutoff = tonumber(victims[#victims])
  local affected, declared = {}, {}
  for _, p in ipairs(victims) do
    local info = redis.call('HGET', INFO, p)
    if info and string.sub(info, 1, 1) == 'T' and #info > 1 then
      local id = string.sub(info, 2)
      affected[id] = true
      local held = redis.call('HGET', RES, id)
      if held and string.gsub(held, '^h', '') == p then redis.call('HDEL', RES, id) end
    elseif info and string.sub(info, 1, 1) == 'A' then
      for id in string.gmatch(string.sub(info, 2), '[^%z]+') do declared[id] = true end
    end
    drop(p)
  end
  local removed = excess
  for id in pairs(declared) do
    local keep = {}
    for _, t in ipairs(turns_of(id)) do
      if t[1] > cutoff then keep[#keep + 1] = s(t[1]) .. ':' .. t[2] end
    end
    if #keep > 0 then
      redis.call('HSET', CALLS, id, table.concat(keep, ','))
    else
      redis.call('HDEL', CALLS, id)
      local held = redis.call('HGET', RES, id)
      if held then
        drop((string.gsub(held, '^h', '')))
        redis.call('HDEL', RES, id)
        removed = removed + 1
      end
    end
    affected[id] = true
  end
  for id in pairs(affected) do
    touched[id] = true
    redis.call('HDEL', PEND, id)
    local first = nil
    for _, t in ipairs(turns_of(id)) do
      if first == nil or t[1] < first[1] then first = t end
    end
    if first and redis.call('HEXISTS', RES, id) == 0 then
      redis.call('HSET', PEND, id, s(first[1]) .. ':' .. first[2])
    end
  end
  count = count - removed
end

redis.call('HSET', META, 'ver', ARGV[3], 'count', s(count), 'next', s(nextpos))
if created == 1 then redis.call('HSET', META, 'gen', ARGV[3]) end
local expires = next_due(kept, ARGV[12], ARGV[13])
expire_all(expires)
if ARGV[10] ~= '' and (string.sub(ARGV[10], 1, 1) == '+' or created == 1) then
  redis.call('ZADD', KEYS[11], 0, string.sub(ARGV[10], 2))
end
if ARGV[6] ~= '' then
  idem_record(ARGV[6], ARGV[7], ARGV[8], s(count) .. ' ' .. s(appended),
              redis.call('HGET', META, 'gen') or '', expires)
end
local out = {'ok', count, appended, release(), created, tail_page(), expires and s(expires) or ''}
for id in pairs(touched) do
  out[#out + 1] = id
  out[#out + 1] = code(id)
  out[#out + 1] = redis.call('HGET', PEND, id) or ''
end
return out
"""
