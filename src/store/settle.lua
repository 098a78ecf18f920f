-- Settle charges already made by stack.lua (src/store/mod.rs): charge
-- `delta` more units, or refund `-delta`, never below empty nor above full.
-- Used for `cost_header` and, on Redis Cluster, to refund the slots a later
-- slot's denial made void.
--
-- KEYS: the entries' keys. ARGV[1]: the number of entries n, then 7
-- values per entry: its parameter set as in stack.lua (algorithm, p1, p2,
-- p3, p4, shadow; the shadow flag is ignored) and its signed delta. For
-- concurrency the delta is the lease's units: negative removes the lease
-- member, positive renews it. (Settlements are rare: this layout stays the
-- plain one, one set per entry.)
-- Returns 0.

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])

-- month_of(us): src/store/calendar.lua, prepended to this script.

local n = tonumber(ARGV[1])

local function clamp(v, hi) return math.max(math.min(v, hi), 0) end

local function get(key)
  local v = redis.call('GET', key)
  local s = {}
  if v then
    for x in string.gmatch(v, '[^ ]+') do s[#s + 1] = tonumber(x) end
  end
  return s
end

for i = 1, n do
  local key = KEYS[i]
  local b = 1 + (i - 1) * 7
  local algo = tonumber(ARGV[b + 1])
  local p1, p2 = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local delta = tonumber(ARGV[b + 7])
  if algo == 1 then
    local jitter, first = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
    local kn = now - jitter
    local s = get(key)
    local win, used, ends
    if first == 1 then
      if s[1] and kn < s[1] + p2 then win, used = s[1], s[2] else win, used = kn, 0 end
      ends = win + p2
    elseif first == 2 then
      local idx, month_end = month_of(kn)
      if s[1] and s[1] >= idx then win, used = s[1], s[2] else win, used = idx, 0 end
      ends = month_end
    else
      local idx = math.floor(kn / p2)
      if s[1] and s[1] >= idx then win, used = s[1], s[2] else win, used = idx, 0 end
      ends = (win + 1) * p2
    end
    local count = clamp(used + delta, p1)
    redis.call('SET', key, string.format('%.0f %.0f', win, count), 'PX',
      math.max(math.ceil((ends - kn) / 1000), 1))
  elseif algo == 2 then
    local s = get(key)
    local idx = math.floor(now / p2)
    local p, c = 0, 0
    if s[1] and s[1] >= idx then idx, p, c = s[1], s[2], s[3]
    elseif s[1] == idx - 1 then p = s[3] end
    c = clamp(c + delta, p1)
    redis.call('SET', key, string.format('%.0f %.0f %.0f', idx, p, c), 'PX',
      math.max(math.ceil(((idx + 2) * p2 - now) / 1000), 1))
  elseif algo == 4 then
    local s = get(key)
    local tat = math.max(s[1] or 0, now)
    if delta > 0 then
      -- Never below where it was: a held request's debt (`wait`) stays.
      tat = math.min(tat + delta * p2, math.max(now + p1 * p2, tat))
    else
      tat = math.max(tat + delta * p2, now)
    end
    if tat > now then
      redis.call('SET', key, string.format('%.17g', tat), 'PX', math.max(math.ceil((tat - now) / 1000), 1))
    else
      redis.call('DEL', key)
    end
  elseif algo == 3 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - p2)
    if delta > 0 then
      local used = 0
      for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
        used = used + tonumber(string.match(m, '^(%d+):'))
      end
      local add = math.min(delta, p1 - used)
      if add > 0 then
        local seq = redis.call('ZCARD', key) + 1
        redis.call('ZADD', key, now, string.format('%d:%.0f:%d', add, now, seq))
      end
    else
      -- Take back the newest units first (they were charged last).
      local left = -delta
      for _, m in ipairs(redis.call('ZREVRANGE', key, 0, -1, 'WITHSCORES')) do
        if left <= 0 then break end
        if type(m) == 'string' and string.find(m, ':') then
          local units, ts, seq = string.match(m, '^(%d+):(%d+):(%d+)$')
          units = tonumber(units)
          redis.call('ZREM', key, m)
          if units > left then
            redis.call('ZADD', key, tonumber(ts), string.format('%d:%s:%s', units - left, ts, seq))
          end
          left = left - units
        end
      end
    end
    if redis.call('ZCARD', key) > 0 then
      redis.call('PEXPIRE', key, math.max(math.ceil(p2 / 1000), 1))
    end
  elseif algo == 5 and delta < 0 then
    redis.call('ZREM', key, string.format('%d:%s', -delta, ARGV[b + 4]))
  elseif algo == 5 and delta > 0 then
    -- Renewal of a held lease of `delta` units: a later expiry, if still held.
    local ms = math.floor(now / 1000)
    if redis.call('ZADD', key, 'XX', 'CH', ms + p2, string.format('%d:%s', delta, ARGV[b + 4])) > 0 then
      redis.call('PEXPIREAT', key, ms + p2 + 1)
    end
  end
end
return 0
