"""The Redis binding's Lua scripts (see :mod:`.redis` for the key layout they work on).

Kept apart so the binding module stays readable; every script is atomic on the server and reads the
server's clock (``TIME``), never a worker's.
"""

from __future__ import annotations

__all__ = ["ACK_HEAD", "CLAIM", "HOLD", "RESERVE", "RESERVE_MANY", "SETTLE", "SETTLE_HELD", "SETTLE_MANY",
           "SWEEP_BATCH"]

#: Most delayed items / expired reservations one maintenance pass moves (bounds the script's run time).
SWEEP_BATCH = 1000
#: Token of the deadline member given to an orphaned processing element (see the module docstring).
_ADOPTED = "0" * 32

# Shared prelude: server time, score formatting, and the raw value of a '<32-hex token>:<raw>' member.
_LUA_HEAD = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local function score(x) return string.format('%.6f', x) end
local function raw_of(m)
  if #m >= 33 and string.byte(m, 33) == 58 and string.find(string.sub(m, 1, 32), '^%x+$') then
    return string.sub(m, 34)
  end
end
"""

# Shared maintenance (KEYS: ready, processing, deadlines[, delayed]; ARGV[1] visibility timeout, ARGV[3] batch):
# promotes due delayed items, requeues expired reservations, adopts orphans.
_MAINTAIN = (
    """
local vt, batch = tonumber(ARGV[1]), tonumber(ARGV[3])
if KEYS[4] then
  for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[4], '-inf', score(now), 'LIMIT', 0, batch)) do
    redis.call('RPUSH', KEYS[1], raw_of(m) or m)
    redis.call('ZREM', KEYS[4], m)
  end
end
for _, m in ipairs(redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', score(now), 'LIMIT', 0, batch)) do
  local raw = raw_of(m)
  if raw and redis.call('LREM', KEYS[2], 1, raw) == 1 then redis.call('RPUSH', KEYS[1], raw) end
  redis.call('ZREM', KEYS[3], m)
end
if redis.call('LLEN', KEYS[2]) > redis.call('ZCARD', KEYS[3]) then
  local have = {}
  for _, m in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
    local raw = raw_of(m); if raw then have[raw] = (have[raw] or 0) + 1 end
  end
  for _, raw in ipairs(redis.call('LRANGE', KEYS[2], 0, -1)) do
    if (have[raw] or 0) > 0 then have[raw] = have[raw] - 1
    else redis.call('ZADD', KEYS[3], 'NX', score(now + vt), '"""
    + _ADOPTED
    + """:' .. raw) end
  end
end
"""
)

# KEYS: ready, processing, deadlines[, delayed[, spill]]. ARGV: visibility timeout, token ('' = maintain only and
# return LLEN ready), batch[, spill size]. Maintenance, then moves the head to processing with its deadline member
# and returns the raw value (false if empty). With a spill key, a value longer than the spill size is copied
# there instead, expiring with the reservation, and only its length is returned ({length}): the client reads it
# in slices (GETRANGE), never as one reply its parser would hold whole beside the bytes it returns.
RESERVE = (
    _LUA_HEAD
    + _MAINTAIN
    + """
if ARGV[2] == '' then return redis.call('LLEN', KEYS[1]) end
local raw = redis.call('LMOVE', KEYS[1], KEYS[2], 'LEFT', 'RIGHT')
if not raw then return false end
redis.call('ZADD', KEYS[3], score(now + vt), ARGV[2] .. ':' .. raw)
if KEYS[5] and #raw > tonumber(ARGV[4]) then
  redis.call('SET', KEYS[5], raw, 'PX', math.ceil(vt * 1000))
  return {#raw}
end
return raw
"""
)

# KEYS: ready, processing, deadlines[, delayed]. ARGV: visibility timeout, token stem (24 hex), batch, limit[,
# value cap, reply budget]. Maintenance, then up to ``limit`` single reservations at once: what N LMOVEs would move
# (LRANGE + LTRIM + RPUSH to processing), each with its own deadline member '<stem><8-hex index>:<raw>' (the single
# path's format, a distinct token each, so equal bodies stay separate reservations). Bulk commands of 500 elements
# instead of two calls per element. With a cap, the batch stops before a value longer than the cap and once the
# values passed the reply budget (the first value always goes), and -1 means the head itself is over the cap (the
# caller reserves it alone, where a large value is read in slices). Returns the raw values in order (empty: none).
RESERVE_MANY = (
    _LUA_HEAD
    + _MAINTAIN
    + """
local raws = redis.call('LRANGE', KEYS[1], 0, tonumber(ARGV[4]) - 1)
if ARGV[5] then
  local cap, budget, total = tonumber(ARGV[5]), tonumber(ARGV[6]), 0
  for i = 1, #raws do
    local len = #raws[i]
    if len > cap and i == 1 then return -1 end
    total = total + len
    if len > cap or (total > budget and i > 1) then raws = {unpack(raws, 1, i - 1)} break end
  end
end
local n = #raws
if n == 0 then return raws end
redis.call('LTRIM', KEYS[1], n, -1)
local deadline, stem = score(now + vt), ARGV[2]
for s = 1, n, 500 do
  local e, zargs = math.min(s + 499, n), {}
  redis.call('RPUSH', KEYS[2], unpack(raws, s, e))
  for i = s, e do
    zargs[#zargs + 1] = deadline
    zargs[#zargs + 1] = stem .. string.format('%08x', i) .. ':' .. raws[i]
  end
  redis.call('ZADD', KEYS[3], unpack(zargs))
end
return raws
"""
)

# KEYS: processing, deadlines. ARGV: token, raw, visibility timeout. Registers a BLMOVE'd element in place
# of any adopted member; 0 when it is no longer in processing (reclaimed meanwhile: back on the ready list).
CLAIM = (
    _LUA_HEAD
    + """
if not redis.call('LPOS', KEYS[1], ARGV[2]) then return 0 end
redis.call('ZREM', KEYS[2], '"""
    + _ADOPTED
    + """:' .. ARGV[2])
redis.call('ZADD', KEYS[2], score(now + tonumber(ARGV[3])), ARGV[1] .. ':' .. ARGV[2])
return 1
"""
)

# KEYS: processing, deadlines[, target]. ARGV: token, raw, body, delay, new token. Acts only while this
# reservation's own member exists; then RPUSHes body to the target list, or ZADDs it to the delayed set.
# An empty token skips the reservation part (a delayed publish).
SETTLE = (
    _LUA_HEAD
    + """
if ARGV[1] ~= '' then
  if redis.call('ZREM', KEYS[2], ARGV[1] .. ':' .. ARGV[2]) == 0 then return 0 end
  redis.call('LREM', KEYS[1], 1, ARGV[2])
end
if KEYS[3] then
  local delay = tonumber(ARGV[4])
  if delay > 0 then redis.call('ZADD', KEYS[3], score(now + delay), ARGV[5] .. ':' .. ARGV[3])
  else redis.call('RPUSH', KEYS[3], ARGV[3]) end
end
return 1
"""
)

# KEYS: processing, deadlines[, target]. ARGV: delay, the 32-char tokens concatenated, the raw values' lengths
# ('n,n,...'), the raw values concatenated, then the bodies' lengths and bodies the same way ('' without target).
# SETTLE for many reservations of one processing list: a reservation acts only while its own member exists
# (ZMSCORE; a reclaimed one is left alone); those are ZREMed and their elements removed from processing (one
# LTRIM when they are its head, as for a drain acking in reservation order, else LREM each); then their bodies
# are RPUSHed to the target, or ZADDed to the delayed set under their (spent, unique) reservation tokens.
# Returns how many were settled.
SETTLE_MANY = (
    _LUA_HEAD
    + """
local delay, tokens = tonumber(ARGV[1]), ARGV[2]
local function split(lens, blob)
  local out, pos = {}, 1
  for len in string.gmatch(lens, '%d+') do
    len = tonumber(len)
    out[#out + 1] = string.sub(blob, pos, pos + len - 1)
    pos = pos + len
  end
  return out
end
local function token(i) return string.sub(tokens, i * 32 - 31, i * 32) end
local raws, members, held = split(ARGV[3], ARGV[4]), {}, {}
local n = #raws
for i = 1, n do members[i] = token(i) .. ':' .. raws[i] end
for s = 1, n, 500 do
  local e = math.min(s + 499, n)
  local scores = redis.call('ZMSCORE', KEYS[2], unpack(members, s, e))
  for i = s, e do if scores[i - s + 1] then held[#held + 1] = i end end
end
local h = #held
if h == 0 then return 0 end
for s = 1, h, 500 do
  local args = {}
  for k = s, math.min(s + 499, h) do args[#args + 1] = members[held[k]] end
  redis.call('ZREM', KEYS[2], unpack(args))
end
local head, prefix = redis.call('LRANGE', KEYS[1], 0, h - 1), true
if #head ~= h then prefix = false end
for k = 1, h do if not prefix or head[k] ~= raws[held[k]] then prefix = false break end end
if prefix then redis.call('LTRIM', KEYS[1], h, -1)
else for k = 1, h do redis.call('LREM', KEYS[1], 1, raws[held[k]]) end end
if KEYS[3] then
  local bodies, due = split(ARGV[5], ARGV[6]), score(now + delay)
  for s = 1, h, 500 do
    local args = {}
    for k = s, math.min(s + 499, h) do
      local i = held[k]
      if delay > 0 then args[#args + 1] = due; args[#args + 1] = token(i) .. ':' .. bodies[i]
      else args[#args + 1] = bodies[i] end
    end
    redis.call(delay > 0 and 'ZADD' or 'RPUSH', KEYS[3], unpack(args))
  end
end
return h
"""
)

# KEYS: processing, deadlines. ARGV: the 32-char tokens of n reservations, concatenated, in reservation order.
# The fast ack of a drain: when for every i the member '<token i>:<element i of processing>' exists, element i
# is exactly reservation i's value (a token belongs to one reservation), so the n reservations are all held
# and are the head of processing: ZREM their members and LTRIM the head. Anything else changes nothing and
# returns -1 (the caller then uses SETTLE_MANY, which checks each reservation on its own).
ACK_HEAD = """
local tokens = ARGV[1]
local n = #tokens / 32
local head = redis.call('LRANGE', KEYS[1], 0, n - 1)
if #head < n then return -1 end
local members = {}
for i = 1, n do members[i] = string.sub(tokens, i * 32 - 31, i * 32) .. ':' .. head[i] end
if not redis.call('ZSCORE', KEYS[2], members[1]) then return -1 end
for s = 1, n, 500 do
  local e = math.min(s + 499, n)
  local scores = redis.call('ZMSCORE', KEYS[2], unpack(members, s, e))
  for i = s, e do if not scores[i - s + 1] then return -1 end end
end
for s = 1, n, 500 do redis.call('ZREM', KEYS[2], unpack(members, s, math.min(s + 499, n))) end
redis.call('LTRIM', KEYS[1], n, -1)
return n
"""

# KEYS: deadlines, held (a hash: token -> raw value). ARGV: seconds, then token, raw per reservation. A reservation
# still held (its '<token>:<raw>' member exists) gets its deadline moved ``seconds`` ahead and its raw value
# recorded under its token, so a process that knows only the token can settle it (SETTLE_HELD). Returns how many.
HOLD = (
    _LUA_HEAD
    + """
local held = 0
for i = 2, #ARGV, 2 do
  local m = ARGV[i] .. ':' .. ARGV[i + 1]
  if redis.call('ZSCORE', KEYS[1], m) then
    redis.call('ZADD', KEYS[1], 'XX', score(now + tonumber(ARGV[1])), m)
    redis.call('HSET', KEYS[2], ARGV[i], ARGV[i + 1])
    held = held + 1
  end
end
return held
"""
)

# KEYS: processing, deadlines, held, ready. ARGV: token, '1' (acked) or '0' (back to the end of ready, unchanged).
# Settles a reservation HOLD recorded, only while its member exists (one that expired was requeued by maintenance
# and is left alone); the token's record goes either way. Returns 1 when it settled, else 0.
SETTLE_HELD = """
local raw = redis.call('HGET', KEYS[3], ARGV[1])
if not raw then return 0 end
redis.call('HDEL', KEYS[3], ARGV[1])
if redis.call('ZREM', KEYS[2], ARGV[1] .. ':' .. raw) == 0 then return 0 end
redis.call('LREM', KEYS[1], 1, raw)
if ARGV[2] ~= '1' then redis.call('RPUSH', KEYS[4], raw) end
return 1
"""
