-- Decisions of one or more requests, each all or nothing, in order
-- (src/store/mod.rs). A batch is the requests that reached one worker's
-- connection while its previous call was in flight.
--
-- ARGV[1]: the number of decisions m. Then per decision: its number of
-- entries n and 7 values per entry: algorithm, p1, p2, p3, p4, shadow (0/1),
-- cost. KEYS: every decision's keys, in order (entry j of a decision is the
-- next key).
--
--   1 fixed window    p1 limit, p2 window (us), p3 jitter offset (us), p4 first_request (0/1)
--   2 sliding window  p1 limit, p2 window (us)
--   3 sliding log     p1 limit, p2 window (us)
--   4 GCRA bucket     p1 units (token capacity; leaky capacity + 1), p2 emission
--                     interval T (us, may be fractional), p3 delay mode (0/1),
--                     p4 lease: take up to this many units when admitted (0: cost)
--   5 concurrency     p1 max, p2 lease (ms), p3 lease member (unique per request)
--
-- The clock is Redis TIME, read once: one batch is one instant. Each
-- decision is decided against the state the decisions before it left (an
-- entry listed twice sees its own first charge); if one of its non-shadow
-- entries denies, it charges nothing and its admitting entries are reported
-- uncharged. Each key is read at most once and, when charged, written once
-- at the end in its final state with its expiry: a batch of decisions on one
-- hot key costs one read and one write.
--
-- Returns 6 integers per entry, decisions in order: allowed (0/1),
-- remaining, reset_after (us), retry_after (us, -1 = never), delay (us),
-- units taken (the cost, or with a lease up to the lease).

local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local m = tonumber(ARGV[1])

local function ceil(x) return math.ceil(x - 1e-6) end
local function floor(x) return math.floor(x + 1e-6) end

-- By key: the state after the admitted decisions so far (read from Redis
-- on first use).
local committed = {}

local function load(key, algo)
  if committed[key] ~= nil then return committed[key] end
  local s
  if algo == 1 or algo == 2 or algo == 4 then
    local v = redis.call('GET', key)
    s = {}
    if v then
      for x in string.gmatch(v, '[^ ]+') do s[#s + 1] = tonumber(x) end
    end
  elseif algo == 3 then
    local runs = {}
    for _, m in ipairs(redis.call('ZRANGE', key, 0, -1)) do
      local units, ts = string.match(m, '^(%d+):(%d+):')
      runs[#runs + 1] = { tonumber(ts), tonumber(units), m }
    end
    s = { runs = runs, added = {}, card = #runs }
  else
    local leases = {}
    local ms = math.floor(now / 1000)
    for _, m in ipairs(redis.call('ZRANGEBYSCORE', key, '(' .. ms, '+inf')) do
      leases[#leases + 1] = tonumber(string.match(m, '^(%d+):'))
    end
    s = { used = 0, added = {} }
    for _, u in ipairs(leases) do s.used = s.used + u end
  end
  committed[key] = s
  return s
end

local function copy(s)
  local c = {}
  for k, v in pairs(s) do c[k] = v end
  return c
end

-- Each decide returns allowed, remaining, reset_after, retry_after, delay,
-- the state after the charge (nil when nothing is charged) and the units
-- taken.

local function fixed(s, cost, limit, w, jitter, first)
  local kn = now - jitter
  local win, used, reset_in
  if first == 1 then
    local start = s[1]
    if start and kn < start + w then
      win, used, reset_in = start, s[2], start + w - kn
    else
      win, used, reset_in = kn, 0, w
    end
  else
    local idx = math.floor(kn / w)
    if s[1] and s[1] > idx then
      win, used, reset_in = s[1], s[2], (s[1] + 1) * w - kn
    else
      win = idx
      used = (s[1] == idx) and s[2] or 0
      reset_in = (idx + 1) * w - kn
    end
  end
  local never = cost > limit
  local after = used + cost
  if not never and after <= limit then
    local ra = (after == 0) and 0 or reset_in
    return true, limit - after, ra, 0, 0, { win, after }, cost
  end
  local ra = (used == 0) and 0 or reset_in
  return false, math.max(limit - used, 0), ra, never and -1 or reset_in, 0, nil, 0
end

-- The smallest wait after offset e for the estimate to leave room for
-- `need` units, given counts p, c: sliding_window.rs's wait_for, so that
-- both stores give the same t and Retry-After.
local function sliding_wait(p, c, e, w, limit, need)
  -- In this window: p(w - x) + c w <= (limit - need) w, for x in [e, w).
  local room = limit - need - c
  if room >= 0 then
    local x = e
    if p > 0 then x = math.max(w - floor(room * w / p), e) end
    if x < w then return x - e end
  end
  -- In the next one, c has become the previous count: c (w - y) <= (limit - need) w.
  room = math.max(limit - need, 0)
  local y = 0
  if c > 0 then y = math.max(w - floor(room * w / c), 0) end
  return (w - e) + y
end

local function sliding(s, cost, limit, w)
  local idx = math.floor(now / w)
  local e = now % w
  local p, c = 0, 0
  if s[1] and s[1] > idx then
    idx, e, p, c = s[1], 0, s[2], s[3]
  elseif s[1] == idx then
    p, c = s[2], s[3]
  elseif s[1] == idx - 1 then
    p, c = s[3], 0
  end
  local est = p * (w - e) + c * w
  local never = cost > limit
  local allowed = not never and est + cost * w <= limit * w
  local c_after = allowed and (c + cost) or c
  local remaining = math.max(floor((limit * w - (est + (c_after - c) * w)) / w), 0)
  -- t: until the estimate leaves room for one more unit than now.
  local reset_after = 0
  if remaining < limit then
    reset_after = sliding_wait(p, c_after, e, w, limit, remaining + 1)
  end
  if allowed then
    return true, remaining, reset_after, 0, 0, { idx, p, c_after }, cost
  end
  local retry = -1
  if not never then retry = sliding_wait(p, c, e, w, limit, cost) end
  return false, remaining, reset_after, retry, 0, nil, 0
end

local function log(s, cost, limit, w)
  local live, used = {}, 0
  for _, r in ipairs(s.runs) do
    if r[1] + w > now then
      live[#live + 1] = r
      used = used + r[2]
    end
  end
  for _, r in ipairs(s.added) do
    live[#live + 1] = r
    used = used + r[2]
  end
  local never = cost > limit
  local allowed = not never and used + cost <= limit
  local after = allowed and used + cost or used
  local reset_after = 0
  if #live > 0 then reset_after = live[1][1] + w - now elseif after > 0 then reset_after = w end
  if allowed then
    local next = copy(s)
    next.added = {}
    for _, r in ipairs(s.added) do next.added[#next.added + 1] = r end
    if cost > 0 then next.added[#next.added + 1] = { now, cost } end
    return true, limit - after, reset_after, 0, 0, next, cost
  end
  local retry = -1
  if not never then
    local to_free = used + cost - limit
    for _, r in ipairs(live) do
      retry = r[1] + w - now
      if r[2] >= to_free then break end
      to_free = to_free - r[2]
    end
  end
  return false, math.max(limit - used, 0), reset_after, retry, 0, nil, 0
end

local function gcra(s, cost, units, T, delay_mode, lease)
  local tau = units * T
  local tat = math.max(s[1] or 0, now)
  local new_tat = tat + cost * T
  local never = cost > units
  local allowed = not never and new_tat - now <= tau + 1e-6
  local taken = cost
  if allowed and cost > 0 and lease > cost then
    -- A lease: the rest of it too, as far as the bucket holds it.
    local extra = math.min(lease - cost, floor((tau - (new_tat - now)) / T))
    if extra > 0 then
      new_tat = new_tat + extra * T
      taken = cost + extra
    end
  end
  local ahead = (allowed and new_tat or tat) - now
  local room = math.max(tau - ahead, 0)
  local remaining = floor(room / T)
  local reset_after = 0
  -- After paying back any debt a settlement left (ahead beyond tau).
  if remaining < units then reset_after = ceil((remaining + 1) * T - room + math.max(ahead - tau, 0)) end
  if allowed then
    local delay = 0
    if delay_mode == 1 then delay = math.max(ceil(ahead - T), 0) end
    return true, remaining, reset_after, 0, delay, { new_tat }, taken
  end
  return false, remaining, reset_after, never and -1 or ceil(new_tat - now - tau), 0, nil, 0
end

local function concurrency(s, cost, max, member)
  local never = cost > max
  local after = s.used + cost
  if not never and after <= max then
    local next = { used = after, added = {} }
    for _, a in ipairs(s.added) do next.added[#next.added + 1] = a end
    if cost > 0 then next.added[#next.added + 1] = { cost, member } end
    return true, max - after, 0, 0, 0, next, cost
  end
  return false, math.max(max - s.used, 0), 0, never and -1 or 1000000, 0, nil, 0
end

-- Entry at ARGV base b (its algorithm is ARGV[b + 1]) against `state`.
local function decide(b, key, cost, state)
  local algo = tonumber(ARGV[b + 1])
  local p1, p2 = tonumber(ARGV[b + 2]), tonumber(ARGV[b + 3])
  local s = state
  if algo == 1 then
    return algo, fixed(s, cost, p1, p2, tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]))
  elseif algo == 2 then
    return algo, sliding(s, cost, p1, p2)
  elseif algo == 3 then
    return algo, log(s, cost, p1, p2)
  elseif algo == 4 then
    return algo, gcra(s, cost, p1, p2, tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5]))
  end
  return algo, concurrency(s, cost, p1, ARGV[b + 4])
end

local out = {}
-- Keys to write, in the order first charged, with the ARGV base and
-- algorithm of that first charge (its parameters give the expiry).
local dirty = {}
local writes = {}
local a = 2 -- ARGV base of the current decision
local k = 0 -- KEYS before the current decision
for _ = 1, m do
  local n = tonumber(ARGV[a])
  local first = #out
  -- State after this decision's earlier charges, by key.
  local cur = {}
  local charged = {}
  local denied = false
  for i = 1, n do
    local b = a + (i - 1) * 7
    local shadow = ARGV[b + 6] == '1'
    local cost = tonumber(ARGV[b + 7])
    local key = KEYS[k + i]
    local s = cur[key]
    if s == nil then s = load(key, tonumber(ARGV[b + 1])) end
    local algo, allowed, remaining, reset_after, retry, delay, next, taken = decide(b, key, cost, s)
    if allowed and next ~= nil and cost > 0 then
      cur[key] = next
      charged[#charged + 1] = { b, key, algo }
    end
    if not allowed and not shadow then denied = true end
    out[#out + 1] = allowed and 1 or 0
    out[#out + 1] = remaining
    out[#out + 1] = reset_after
    out[#out + 1] = retry
    out[#out + 1] = delay
    out[#out + 1] = taken
  end
  if denied then
    -- Nothing is charged; entries that admitted report the state uncharged.
    for i = 1, n do
      local o = first + (i - 1) * 6
      if out[o + 1] == 1 then
        local key = KEYS[k + i]
        local _, _, remaining, reset_after = decide(a + (i - 1) * 7, key, 0, committed[key])
        out[o + 2] = remaining
        out[o + 3] = reset_after
        out[o + 5] = 0
        out[o + 6] = 0
      end
    end
  else
    for _, c in ipairs(charged) do
      local key = c[2]
      committed[key] = cur[key]
      if not dirty[key] then
        dirty[key] = true
        writes[#writes + 1] = c
      end
    end
  end
  a = a + 1 + n * 7
  k = k + n
end

-- Write each charged key once, in its final state, with its expiry.
for _, c in ipairs(writes) do
  local b, key, algo = c[1], c[2], c[3]
  local s = committed[key]
  local p2 = tonumber(ARGV[b + 3])
  if algo == 1 then
    local jitter, first = tonumber(ARGV[b + 4]), tonumber(ARGV[b + 5])
    local kn = now - jitter
    local ends = (first == 1) and (s[1] + p2) or ((s[1] + 1) * p2)
    local ttl = math.max(math.ceil((ends - kn) / 1000), 1)
    redis.call('SET', key, string.format('%.0f %.0f', s[1], s[2]), 'PX', ttl)
  elseif algo == 2 then
    local ttl = math.max(math.ceil(((s[1] + 2) * p2 - now) / 1000), 1)
    redis.call('SET', key, string.format('%.0f %.0f %.0f', s[1], s[2], s[3]), 'PX', ttl)
  elseif algo == 4 then
    local ttl = math.max(math.ceil((s[1] - now) / 1000), 1)
    redis.call('SET', key, string.format('%.17g', s[1]), 'PX', ttl)
  elseif algo == 3 then
    redis.call('ZREMRANGEBYSCORE', key, '-inf', now - p2)
    local seq = redis.call('ZCARD', key)
    for _, r in ipairs(s.added) do
      seq = seq + 1
      redis.call('ZADD', key, r[1], string.format('%d:%.0f:%d', r[2], r[1], seq))
    end
    redis.call('PEXPIRE', key, math.max(math.ceil(p2 / 1000), 1))
  else
    local ms = math.floor(now / 1000)
    redis.call('ZREMRANGEBYSCORE', key, '-inf', ms)
    for _, x in ipairs(s.added) do
      redis.call('ZADD', key, ms + p2, string.format('%d:%s', x[1], x[2]))
    end
    local top = redis.call('ZRANGE', key, -1, -1, 'WITHSCORES')
    redis.call('PEXPIREAT', key, tonumber(top[2]) + 1)
  end
end
return out
