"""The ``per_turn`` call-id policy's two facts on Redis, in Lua (:mod:`flowmem.call_ids`).

An append under ``per_turn`` plans against two facts beside the ids' codes
(:class:`~flowmem.plan.BufferView`'s ``newest`` and ``firsts``). The store guesses
them (:class:`~flowmem.stores.redis._view_cache.Facts`: none known, unless a
conflict in the same append read them) and ``APPLY`` checks them with the rest of
the guess, so a plan is only ever applied against the facts that hold:

- an id's newest declaration with a result: a stored id is the caller's id or an
  *alias* (the id, U+001F and 12 hex digits), and ``:res`` holds, under the
  caller's id plus a NUL (no stored id holds a NUL), the alias whose result was
  written last. Results of one id's declarations are written in the order of
  the declarations (a new one starts only once the newest was answered), so that
  alias, while its result is kept, is the newest; else the id itself, if it has a
  result.
- an id's first declaration: the earliest turn of the id's ``:calls`` entry (every
  turn declaring it under itself), checked by its position and the SHA-1 of its
  body (an edit may rewrite a body in place).
"""

from __future__ import annotations

from typing import Final

__all__ = ["PER_TURN"]

PER_TURN: Final = r"""
local HEX12 = string.rep('[0-9a-f]', 12)
-- the caller's id of a stored id (an alias loses its suffix)
local function caller_of(id)
  return string.match(id, '^(.*)\031' .. HEX12 .. '$') or id
end
-- after a result for the stored id `id` is written: note the newest alias
local function noted(id)
  local caller = caller_of(id)
  if caller ~= id then redis.call('HSET', KEYS[6], caller .. '\0', id) end
end
-- the stored id of the caller's id's newest declaration with a result ('' none)
local function newest(caller)
  local alias = redis.call('HGET', KEYS[6], caller .. '\0')
  if alias and redis.call('HEXISTS', KEYS[6], alias) == 1 then return alias end
  if redis.call('HEXISTS', KEYS[6], caller) == 1 then return caller end
  return ''
end
-- the position of the first turn declaring `caller` under itself ('' none)
local function first(caller)
  local v, low = redis.call('HGET', KEYS[7], caller), nil
  if v then
    for t in string.gmatch(v, '(%d+):%d+') do
      t = tonumber(t)
      if low == nil or t < low then low = t end
    end
  end
  if low == nil then return '' end
  return string.format('%d', low)
end
-- the facts from ARGV[i] on: '*' (none asked) or n (caller newest)... m (caller pos
-- sha1)...; returns them (nil: none asked) and the index after them
local function read_facts(i, num)
  if ARGV[i] == '*' then return nil, i + 1 end
  local facts = {newest = {}, first = {}}
  local n = num(i)
  for k = 1, n do facts.newest[k] = {ARGV[i + 2 * k - 1], ARGV[i + 2 * k]} end
  i = i + 1 + 2 * n
  n = num(i)
  for k = 1, n do
    facts.first[k] = {ARGV[i + 3 * k - 2], ARGV[i + 3 * k - 1], ARGV[i + 3 * k]}
  end
  return facts, i + 1 + 3 * n
end
local function body_sha1(p)
  if p == '' then return '' end
  return redis.sha1hex(redis.call('HGET', KEYS[4], p) or '')
end
-- whether the facts the plan was made against no longer hold
local function facts_stale(facts)
  if facts == nil then return false end
  for _, f in ipairs(facts.newest) do
    if newest(f[1]) ~= f[2] then return true end
  end
  for _, f in ipairs(facts.first) do
    local p = first(f[1])
    if p ~= f[2] or body_sha1(p) ~= f[3] then return true end
  end
  return false
end
-- the facts as they are, for a conflict reply: (newest, its code)... (pos, body)...
local function facts_now(facts, code)
  local out = {}
  for _, f in ipairs(facts.newest) do
    local id = newest(f[1])
    out[#out + 1] = id
    out[#out + 1] = id ~= '' and code(id) or '--'
  end
  for _, f in ipairs(facts.first) do
    local p = first(f[1])
    out[#out + 1] = p
    out[#out + 1] = p ~= '' and (redis.call('HGET', KEYS[4], p) or '') or ''
  end
  return out
end
"""
