"""Lua scripts of the coordinator's Redis store (``store.py``): each runs atomically
on the server. Every script's header gives its KEYS, ARGV and return values."""

# KEYS[1] = lease key, KEYS[2] = fence counter
# ARGV = ttl_ms, then field/value pairs of the lease hash (without epoch)
# Returns the new epoch: every grant is a membership change and gets a fresh fence.
ACQUIRE_LUA = """
local epoch = redis.call('INCR', KEYS[2])
redis.call('DEL', KEYS[1])
redis.call('HSET', KEYS[1], 'epoch', epoch, unpack(ARGV, 2))
redis.call('PEXPIRE', KEYS[1], ARGV[1])
return epoch
"""

# KEYS[1] = workers set, KEYS[2..] = lease keys; ARGV[1] = TTL ms per worker (0: none),
# ARGV[2] = the most a floor may be, ARGV[3] = workers registering besides the set (the
# floor counts them), ARGV[4..] = the epoch held of each lease, in KEYS' order
# (RenewLease is a batch of one). Returns one reply per lease, in order: {ttl_ms,
# hash} when renewed, {-1} when the lease is gone, {-2} when the epoch moved on. A batch
# is one round trip and one SCARD: the renewal is the busiest call at 1,000 holders. The
# TTL is raised to ARGV[1] x (the workers set's size + ARGV[3])
# (``store_protocol.lease_ttl_floor_ms``),
# never lowered. Epochs compare as strings, as the hash holds them.
RENEW_LUA = """
local per = tonumber(ARGV[1])
local floor = 0
if per > 0 then
  floor = math.min(tonumber(ARGV[2]), per * (redis.call('SCARD', KEYS[1]) + tonumber(ARGV[3])))
end
local out = {}
for i = 2, #KEYS do
  local epoch = redis.call('HGET', KEYS[i], 'epoch')
  if not epoch then
    out[i - 1] = {-1}
  elseif epoch ~= ARGV[i + 2] then
    out[i - 1] = {-2}
  else
    local ttl = tonumber(redis.call('HGET', KEYS[i], 'ttl_ms'))
    if floor > ttl then
      ttl = floor
      redis.call('HSET', KEYS[i], 'ttl_ms', ttl)
    end
    redis.call('PEXPIRE', KEYS[i], ttl)
    out[i - 1] = {ttl, redis.call('HGETALL', KEYS[i])}
  end
end
return out
"""

# KEYS[1] = lease key, KEYS[2] = fence counter
# ARGV[1] = expected epoch, ARGV[2] = new role, ARGV[3] = change token (one per call, the
#   same on every retry of it), ARGV[4..] = roles the lease may hold now (none = any)
# Returns {1, pttl, hash} when applied; {0, pttl, hash} when this very change (same token)
# was applied by an earlier try whose reply was lost: a retry never applies twice;
# {-1} when the lease is gone; {-2, epoch} when the epoch moved on; {-3, role} when the
# current role may not change to the new one. HSET keeps the key's TTL.
CHANGE_ROLE_LUA = """
local epoch = redis.call('HGET', KEYS[1], 'epoch')
if not epoch then return {-1} end
if epoch ~= ARGV[1] then
  if redis.call('HGET', KEYS[1], 'change_token') == ARGV[3] then
    return {0, redis.call('PTTL', KEYS[1]), redis.call('HGETALL', KEYS[1])}
  end
  return {-2, tonumber(epoch)}
end
if #ARGV > 3 then
  local role = redis.call('HGET', KEYS[1], 'role')
  local ok = false
  for i = 4, #ARGV do if ARGV[i] == role then ok = true end end
  if not ok then return {-3, role} end
end
local fence = redis.call('INCR', KEYS[2])
redis.call('HSET', KEYS[1], 'epoch', fence, 'role', ARGV[2], 'change_token', ARGV[3])
return {1, redis.call('PTTL', KEYS[1]), redis.call('HGETALL', KEYS[1])}
"""

# KEYS[1] = history stream, KEYS[2] = step index hash
# ARGV[1] = step, ARGV[2] = idempotency key, ARGV[3] = record JSON, ARGV[4] = history maxlen
# Returns 0 stored, 1 repeat (the step is held under this very key: nothing written),
# 2 replaced (held under another key: that entry is deleted and the new one appended).
# The index value is "<entry id> <key>"; entry ids hold no space, keys may.
APPEND_STEP_LUA = """
local held = redis.call('HGET', KEYS[2], ARGV[1])
local outcome = 0
if held then
  local sep = string.find(held, ' ', 1, true)
  if string.sub(held, sep + 1) == ARGV[2] then return 1 end
  redis.call('XDEL', KEYS[1], string.sub(held, 1, sep - 1))
  outcome = 2
end
local id = redis.call('XADD', KEYS[1], 'MAXLEN', '~', ARGV[4], '*', 'record', ARGV[3])
redis.call('HSET', KEYS[2], ARGV[1], id .. ' ' .. ARGV[2])
return outcome
"""

# KEYS[1] = lease key; ARGV[1] = epoch. Deletes only the caller's own lease.
RELEASE_LUA = """
if redis.call('HGET', KEYS[1], 'epoch') == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS[1] = lease key, KEYS[2] = workers set; ARGV[1] = worker id
# Drops the id from the set when its lease has expired; atomic with the check, so an
# acquire in between (hash first, then SADD) can never lose its membership.
# Returns 1 when the id was dropped, 0 when its lease is live again.
PRUNE_WORKER_LUA = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
return redis.call('SREM', KEYS[2], ARGV[1])
"""

# KEYS[1] = counters hash, KEYS[2] = trajectory stream, KEYS[3] = assignments,
# KEYS[4] = pending admission; ARGV[1] = the trainer's consumer group
# The job's counters and its measured backlog in one snapshot. Read apart, a publish
# (stream entry + ``produced``, one script) or a trainer ack (+ ``trained``/``dropped_*``)
# landing between the reads put one trajectory on both sides of the accounting identity,
# or on neither: a finished job whose instances still publish showed ``unaccounted`` -4.
# Unconsumed = never delivered to the group (``lag``, or the entries after its last
# delivered id on servers without it) + delivered and not acked (``pending``).
# Returns {flat counters, unconsumed, running, pending admission}.
ACCOUNTING_LUA = """
local length = redis.call('XLEN', KEYS[2])
local unconsumed = length
if length > 0 then
  for _, group in ipairs(redis.call('XINFO', 'GROUPS', KEYS[2])) do
    local info = {}
    for i = 1, #group, 2 do info[group[i]] = group[i + 1] end
    if info['name'] == ARGV[1] then
      local lag = info['lag']
      if not lag then
        lag = #redis.call('XRANGE', KEYS[2], '(' .. info['last-delivered-id'], '+')
      end
      unconsumed = lag + info['pending']
    end
  end
end
return {redis.call('HGETALL', KEYS[1]), unconsumed, redis.call('HLEN', KEYS[3]),
        redis.call('HLEN', KEYS[4])}
"""
