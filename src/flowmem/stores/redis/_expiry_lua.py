"""How long things live on Redis, in Lua: retention's fragment and the idempotency record.

A conversation's keys (``:meta``, ``:pos``, ``:body`` … the first eight
:data:`~flowmem.stores.redis._scripts.BUFFER_PARTS`) or a value's ``:v`` carry
one Redis expiry instant, set with ``PEXPIREAT`` on every one of them in the
script that writes (they share one hash tag: one slot, cluster-safe, no round
trip of its own). That instant is the stored expiry: Redis deletes the keys
itself once its own clock passes it, and a script compares it
(``PEXPIRETIME``, Redis 7.0+) with the coordinator's ``now`` (milliseconds,
``''``: no retention asked) so that an injected clock decides what is
expired, as on every other backend. The MEM-12 lease (``:lock``) keeps its own
``PX``; an idempotency record its own TTL (it stops replaying once the data it
was recorded with has expired: :data:`IDEM`, below). A replay sets the record's
expiry to the instant it already has: the one write a replay makes, so that a
``WAIT`` after it (``?wait_replicas=``) confirms what it replays.
"""

from __future__ import annotations

from typing import Final

__all__ = ["EXPIRY", "IDEM"]

EXPIRY: Final = r"""
-- due(): the stored expiry instant (ms since the epoch) of the key's data, from
-- KEYS[2] (a conversation's meta) or KEYS[1] (a value); nil when kept or absent
local function due()
  local t = redis.call('PEXPIRETIME', KEYS[2])
  if t == -2 then t = redis.call('PEXPIRETIME', KEYS[1]) end
  if t < 0 then return nil end
  return t
end
-- whether the data expired by the caller's clock `now` (ms; '' = not asked)
local function expired(now)
  if now == '' then return false end
  local t = due()
  return t ~= nil and t <= tonumber(now)
end
-- drop the key's data when it expired by `now` (a write then starts afresh)
local function purge(now)
  if expired(now) then
    redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8])
  end
end
-- the instant a write leaves: `at` (ms, '' = no policy) when renewed ('1': idle) or
-- when none was stored (absolute: set once); else the one `kept` from before it
local function next_due(kept, at, renew)
  if at ~= '' and (renew == '1' or not kept) then return tonumber(at) end
  return kept
end
-- give every key of the data the one instant (a missing key is left missing)
local function expire_all(at)
  if not at then return end
  local ms = string.format('%d', at)
  for i = 1, 8 do redis.call('PEXPIREAT', KEYS[i], ms) end
end
"""

IDEM: Final = r"""
-- the idempotency record KEYS[10]: 'fingerprint\nexpires\ngen\ndue\noutcome' (expires
-- in the caller's clock, seconds; the key also has a PX ttl; gen: the generation of the
-- data it was recorded with, 'v' a value; due: their expiry instant then, ms, '' none).
-- idem_first: nil when none, expired, or its data expired by `ret_now` (ms, '' = not
-- asked) and is not the generation `gen` now there; false for another fingerprint
local function idem_first(fp, now, ret_now, gen)
  local first = redis.call('GET', KEYS[10])
  if not first then return nil end
  local f, e, g, d, o = string.match(first, '^([^\n]*)\n([^\n]*)\n([^\n]*)\n([^\n]*)\n(.*)$')
  if not f or tonumber(e) < tonumber(now) then return nil end
  if ret_now ~= '' and d ~= '' and tonumber(d) <= tonumber(ret_now) and (g == '' or g ~= gen) then
    return nil  -- recorded with data that expired since: it went with them
  end
  if f ~= fp then return false end
  -- a replay writes the record's own expiry instant again: nothing changes, but the
  -- connection's replication offset moves past the record, so a WAIT after the replay
  -- confirms the replicas have what it replays (stores/redis/_requests.py, Confirm)
  local at = redis.call('PEXPIRETIME', KEYS[10])
  if at > 0 then redis.call('PEXPIREAT', KEYS[10], at) end
  return o
end
local function idem_record(fp, ttl, now, outcome, gen, due_ms)
  local expires = string.format('%.6f', tonumber(now) + tonumber(ttl) / 1000)
  local d = ''
  if due_ms then d = string.format('%d', due_ms) end
  redis.call('SET', KEYS[10], fp .. '\n' .. expires .. '\n' .. gen .. '\n' .. d .. '\n' .. outcome,
             'PX', ttl)
end
"""
