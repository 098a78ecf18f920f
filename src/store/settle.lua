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

-- Calendar months in UTC (window = "1mo", p4 = 2): the month `us` falls in,
-- counted from January 1970, and the instant (us) the next one starts; as
-- src/limit/calendar.rs (Hinnant's civil_from_days / days_from_civil).
local function month_of(us)
  local fl = math.floor
  local z = fl(us / 86400000000) + 719468
  local era = fl(z / 146097)
  local doe = z - era * 146097
  local yoe = fl((doe - fl(doe / 1460) + fl(doe / 36524) - fl(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + fl(yoe / 4) - fl(yoe / 100))
  local mp = fl((5 * doy + 2) / 153)
  local m = (mp < 10) and (mp + 3) or (mp - 9)
  local y = yoe + era * 400 + ((m <= 2) and 1 or 0)
  local ny, nm = y, m + 1
  if nm > 12 then ny, nm = y + 1, 1 end
  local yy = (nm <= 2) and (ny - 1) or ny
  local e2 = fl(yy / 400)
  local yoe2 = yy - e2 * 400
  local mp2 = (nm > 2) and (nm - 3) or (nm + 9)
  local doe2 = yoe2 * 365 + fl(yoe2 / 4) - fl(yoe2 / 100) + fl((153 * mp2 + 2) / 5)
  return (y - 1970) * 12 + (m - 1), (e2 * 146097 + doe2 - 719468) * 86400000000
end

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
