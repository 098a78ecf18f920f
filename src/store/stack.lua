-- Decisions of one or more requests, each all or nothing, in order
-- (src/store/mod.rs). A batch is the requests that reached one worker's
-- connection while its previous call was in flight.
--
-- KEYS: the batch's distinct keys, those whose state is a string (windows
-- and buckets) first, all read with one MGET.
--
-- ARGV[1]: msgpack values one after the other (one array when there are
-- more than 4,000): the number of parameter sets p, then 6
-- values per set: algorithm, p1, p2, p3, p4, shadow (0/1). A batch's
-- entries of one limit share a set. Then the number of string keys, then
-- the decisions: a decision of one entry is that entry, one of n others is
-- -n and its n entries; an entry is two integers, (key - 1) * p + set (its
-- key's and its set's numbers, from 1), and its cost. Numbers travel as
-- msgpack numbers (an emission interval as a float64), a lease member as
-- a string: Redis parses no text into a number.
--
--   1 fixed window    p1 limit, p2 window (us), p3 jitter offset (us), p4 alignment:
--                     0 the epoch, 1 first_request, 2 calendar months (UTC)
--   2 sliding window  p1 limit, p2 window (us)
--   3 sliding log     p1 limit, p2 window (us)
--   4 GCRA bucket     p1 units (token capacity; leaky capacity + 1), p2 emission
--                     interval T (us, may be fractional), p3 the hold: 0 none,
--                     1 leaky delay mode, -W a token bucket's `wait` of W us
--                     (admitted up to W past the full bucket, held until its
--                     tokens are there), p4 lease: take up to this many units
--                     when admitted (0: cost)
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
-- Returns per entry, decisions in order, 2 or 4 integers: h = remaining * 4
-- + 2 * more + allowed (0/1), reset_after (us), and when `more` is set,
-- retry_after (us, -1 = never; when denied) or delay (us; when admitted),
-- then the units taken. Without `more`, retry_after and delay are 0 and
-- the units taken are the cost when admitted, else 0.
--
-- Cost: in Redis each script argument, each integer answered and each
-- redis.call costs about what a whole GET does (argument objects, Lua
-- strings, reply conversion), and Lua's tonumber is strtod. So the batch
-- sends each key and each parameter set once and the decisions as msgpack
-- numbers, reads all string keys with one MGET, answers 2 integers for a
-- plain admission, and keeps a bucket's state a plain number. And every
-- call runs this whole file again: each closure it makes and each upvalue
-- it captures is an allocation, each table one more, and the garbage is
-- collected on Redis's time. So the common case (buckets admitting, one
-- entry per decision) makes no closure and few tables; the rest of the
-- machinery is made only by a call that needs it (the general loop's
-- block below), and the parameters travel as msgpack numbers, which no
-- tonumber parses (BENCHMARKS.md, "The Redis store").

local call, tonumber, format = redis.call, tonumber, string.format
local mfloor, mceil = math.floor, math.ceil
local KEYS = KEYS
local t = call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local now_ms = mfloor(now / 1000)

-- The parameter sets, the number of string keys and the decisions. Set
-- p's values are M[6p - 4] (algorithm) to M[6p + 1] (shadow).
local M = { cmsgpack.unpack(ARGV[1]) }
if type(M[1]) == 'table' then M = M[1] end -- a batch past 4,000 values
local np = M[1]
local ns = M[2 + np * 6]

-- By key number: the MGET's values, and the state after the admitted
-- decisions so far, made on first use. A bucket's state is its TAT, a
-- number (0: none); a window's, its numbers; a log's and a concurrency
-- set's, tables.
local raw, state = nil, {}
local first = 1
while first <= ns do
  -- In chunks of 1,000: unpack puts every key on the Lua stack.
  local last = first + 999
  if last > ns then last = ns end
  local values = redis.pcall('MGET', unpack(KEYS, first, last))
  if values.err then
    -- An ACL user without +mget (the README's before MGET): a GET each.
    values = {}
    for i = first, last do values[i - first + 1] = call('GET', KEYS[i]) end
  end
  if first == 1 and last == ns then
    raw = values
  else
    raw = raw or {}
    for i = first, last do raw[i] = values[i - first + 1] end
  end
  first = last + 1
end
-- Made only when no MGET made it (no string keys): a call of one chunk
-- takes the MGET's table.
raw = raw or {}

-- The answer; sized for a batch of one plain decision, which fills it.
local out, o = { 0, 0 }, 0
-- Keys to write (by number), with the parameter set of their first
-- charge (its parameters give the expiry). Keys are independent: the
-- order they are written in does not matter.
local wset = {}

local a = 3 + np * 6 -- index in M of the current decision
local nd = #M

-- The common case first, inline and making nothing: decisions of one
-- entry on a bucket that admits it without lease or delay. The first
-- decision that is not leaves this loop before it has changed anything,
-- and it and the rest of the batch go to the general one below. What
-- depends on the parameter set alone is worked out when the set changes
-- (consecutive entries mostly share one; a batch of one limit's decisions
-- has one set, `np == 1`): its units l1, interval l2, lease l4, and
-- tau = l1 * l2. A set that is no bucket, a leaky bucket's delay (p3 > 0)
-- or an interval of 0 leaves for the general loop: here floor and ceil
-- are `x - x % 1` (exact for a positive x, and no C call), which needs
-- l2 > 0.
local lp, l1, l2, l4, tau, tol = 0
while a <= nd do
  local e = M[a]
  if e <= 0 then break end
  local cost = M[a + 1]
  local p, i = 1, e
  if np ~= 1 then
    p = (e - 1) % np + 1
    i = (e - p) / np + 1
  end
  if p ~= lp then
    local b = 6 * p
    -- A `wait` (p3 < 0) changes nothing for a request the bucket holds.
    if M[b - 4] ~= 4 or M[b - 1] > 0 or not (M[b - 2] > 0) then break end
    lp, l1, l2, l4 = p, M[b - 3], M[b - 2], M[b]
    tau = l1 * l2
    tol = tau + 1e-6
  end
  local s = state[i]
  if s == nil then
    s = raw[i]
    s = s and tonumber(s) or 0
  end
  local tat = s
  if tat < now then tat = now end
  local new_tat = tat + cost * l2
  local ahead = new_tat - now
  if not (l4 <= cost and cost <= l1 and ahead <= tol) then break end
  -- gcra() admitting, without lease or delay.
  local room = tau - ahead
  if room < 0 then room = 0 end
  local x = room / l2 + 1e-6
  local remaining = x - x % 1
  local reset_after = 0
  if remaining < l1 then
    local debt = ahead - tau
    if debt < 0 then debt = 0 end
    x = (remaining + 1) * l2 - room + debt - 1e-6
    if x > 0 then
      local f = x % 1
      reset_after = (f > 0) and (x - f + 1) or x
    else
      reset_after = mceil(x)
    end
  end
  if cost > 0 then
    state[i] = new_tat
    if not wset[i] then
      wset[i] = p
    end
  end
  out[o + 1], out[o + 2] = remaining * 4 + 1, reset_after
  o = o + 2
  a = a + 2
end

if a <= nd then
  -- Everything else: the machinery is made here, by the calls that need
  -- it (see the top). The parameter sets, by number.
  local A, P1, P2, P3, P4, SHADOW = {}, {}, {}, {}, {}, {}
  for i = 1, np do
    local b = 1 + (i - 1) * 6
    local algo = M[b + 1]
    A[i], P1[i], P2[i], P4[i] = algo, M[b + 2], M[b + 3], M[b + 5]
    -- A concurrency set's p3 is its lease member, a string.
    P3[i] = (algo == 5) and tostring(M[b + 4]) or M[b + 4]
    SHADOW[i] = M[b + 6] == 1
  end

  local function ceil(x) return mceil(x - 1e-6) end
  local function floor(x) return mfloor(x + 1e-6) end

  local function load(i, algo)
    local s = state[i]
    if s ~= nil then return s end
    if i <= ns then
      local v = raw[i]
      if algo == 4 then
        s = tonumber(v) or 0
      else
        s = {}
        if v then
          for x in string.gmatch(v, '[^ ]+') do s[#s + 1] = tonumber(x) end
        end
      end
    elseif algo == 3 then
      local runs = {}
      for _, m in ipairs(call('ZRANGE', KEYS[i], 0, -1)) do
        local units, ts = string.match(m, '^(%d+):(%d+):')
        runs[#runs + 1] = { tonumber(ts), tonumber(units), m }
      end
      s = { runs = runs, added = {}, card = #runs }
    else
      local leases = {}
      for _, m in ipairs(call('ZRANGEBYSCORE', KEYS[i], '(' .. now_ms, '+inf')) do
        leases[#leases + 1] = tonumber(string.match(m, '^(%d+):'))
      end
      s = { used = 0, added = {} }
      for _, u in ipairs(leases) do s.used = s.used + u end
    end
    state[i] = s
    return s
  end

  local function copy(s)
    local c = {}
    for k, v in pairs(s) do c[k] = v end
    return c
  end


  -- Each decide returns allowed, remaining, reset_after, retry_after,
  -- delay, the state after the charge (nil when nothing is charged) and
  -- the units taken.

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
    elseif first == 2 then
      -- month_of(us), src/store/calendar.lua, which src/store/script.rs
      -- splices in at the next line: a closure, made only here.
      -- [calendar.lua]
      local idx, ends = month_of(kn)
      if s[1] and s[1] > idx then
        win, used, reset_in = s[1], s[2], 1
      else
        win = idx
        used = (s[1] == idx) and s[2] or 0
        reset_in = ends - kn
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
  -- `s` is the TAT (0: none); the state after is the new TAT. The hot
  -- path of the benchmarks: comparisons instead of math.max, one C call per
  -- rounding.
  local function gcra(s, cost, units, T, delay_mode, lease)
    local tau = units * T
    local tat = s
    if tat < now then tat = now end
    local new_tat = tat + cost * T
    local never = cost > units
    -- A token bucket's wait: admitted up to that far past the full bucket.
    local slack = 0
    if delay_mode < 0 then slack = -delay_mode end
    local allowed = not never and new_tat - now <= tau + slack + 1e-6
    local taken = cost
    if allowed and cost > 0 and lease > cost then
      -- A lease: the rest of it too, as far as the bucket holds it.
      local extra = mfloor((tau - (new_tat - now)) / T + 1e-6)
      if extra > lease - cost then extra = lease - cost end
      if extra > 0 then
        new_tat = new_tat + extra * T
        taken = cost + extra
      end
    end
    local ahead = (allowed and new_tat or tat) - now
    local room = tau - ahead
    if room < 0 then room = 0 end
    local remaining = mfloor(room / T + 1e-6)
    local reset_after = 0
    -- After paying back any debt a settlement left (ahead beyond tau).
    if remaining < units then
      local debt = ahead - tau
      if debt < 0 then debt = 0 end
      reset_after = mceil((remaining + 1) * T - room + debt - 1e-6)
    end
    if allowed then
      local delay = 0
      if delay_mode == 1 then
        delay = mceil(ahead - T - 1e-6)
        if delay < 0 then delay = 0 end
      elseif delay_mode < 0 then
        -- Held until its tokens would have been there.
        delay = mceil(ahead - tau - 1e-6)
        if delay < 0 then delay = 0 end
      end
      return true, remaining, reset_after, 0, delay, new_tat, taken
    end
    return false, remaining, reset_after, never and -1 or mceil(new_tat - now - tau - 1e-6), 0, nil, 0
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

  -- An entry of parameter set p against state `s`: allowed, remaining,
  -- reset_after, retry_after, delay, the state after the charge (nil when
  -- nothing is charged) and the units taken.
  local function decide(p, s, cost)
    local algo = A[p]
    if algo == 4 then
      return gcra(s, cost, P1[p], P2[p], P3[p], P4[p])
    elseif algo == 1 then
      return fixed(s, cost, P1[p], P2[p], P3[p], P4[p])
    elseif algo == 2 then
      return sliding(s, cost, P1[p], P2[p])
    elseif algo == 3 then
      return log(s, cost, P1[p], P2[p])
    end
    return concurrency(s, cost, P1[p], P3[p])
  end

  -- An entry's answer (see the top).
  local function emit(allowed, remaining, reset_after, retry, delay, taken, cost)
    local third = allowed and delay or retry
    if third == 0 and taken == (allowed and cost or 0) then
      out[o + 1], out[o + 2] = allowed and remaining * 4 + 1 or remaining * 4, reset_after
      o = o + 2
    else
      out[o + 1], out[o + 2] = allowed and remaining * 4 + 3 or remaining * 4 + 2, reset_after
      out[o + 3], out[o + 4] = third, taken
      o = o + 4
    end
  end

  local function charge(i, p, next)
    state[i] = next
    if not wset[i] then
      wset[i] = p
    end
  end

  -- Per entry of a decision of several: its set, key, cost, and answer.
  local ep, ek, ec, ea = {}, {}, {}, {}

  while a <= nd do
    local e = M[a]
    if e > 0 then
      -- One entry: all or nothing is the entry's verdict.
      local cost = M[a + 1]
      local p = (e - 1) % np + 1
      local i = (e - p) / np + 1
      local s = state[i]
      if s == nil then s = load(i, A[p]) end
      local allowed, remaining, reset_after, retry, delay, next, taken = decide(p, s, cost)
      if allowed and next ~= nil and cost > 0 then charge(i, p, next) end
      emit(allowed, remaining, reset_after, retry, delay, taken, cost)
      a = a + 2
    else
      local n = -e
      -- State after this decision's earlier charges, by key number.
      local cur = {}
      local denied = false
      for j = 1, n do
        local e, cost = M[a + j * 2 - 1], M[a + j * 2]
        local p = (e - 1) % np + 1
        local i = (e - p) / np + 1
        local s = cur[i]
        if s == nil then s = load(i, A[p]) end
        local allowed, remaining, reset_after, retry, delay, next, taken = decide(p, s, cost)
        if allowed and next ~= nil and cost > 0 then cur[i] = next else next = nil end
        if not allowed and not SHADOW[p] then denied = true end
        ep[j], ek[j], ec[j] = p, i, cost
        ea[j] = { allowed, remaining, reset_after, retry, delay, next, taken }
      end
      for j = 1, n do
        local r, p, i, cost = ea[j], ep[j], ek[j], ec[j]
        if denied and r[1] then
          -- Nothing is charged; entries that admitted report the state
          -- uncharged.
          local _, remaining, reset_after = decide(p, state[i], 0)
          emit(true, remaining, reset_after, 0, 0, 0, cost)
        else
          emit(r[1], r[2], r[3], r[4], r[5], r[7], cost)
          if not denied and r[6] ~= nil then charge(i, p, cur[i]) end
        end
      end
      a = a + 1 + n * 2
    end
  end

end

-- Write each charged key once, in its final state, with its expiry (PXAT:
-- an absolute time in ms, at least 1 ms ahead). A number's text is made
-- again only when it differs from the one before (a batch's fresh buckets
-- of one limit share their TAT and expiry): whole numbers with '%d' (the
-- text of '%.17g', cheaper), others with '%.17g' (exact).
local last_ms, last_at, last_s, last_value
for i, p in pairs(wset) do
  local key, s, b = KEYS[i], state[i], 6 * p
  local algo, p2 = M[b - 4], M[b - 2]
  -- Until when the key is needed, in us.
  local until_us
  if algo == 4 then
    -- Until the bucket is full again.
    until_us = s
  elseif algo == 1 and M[b] == 2 then
    -- A calendar month: p2 is the longest month, past its end whatever.
    until_us = now + p2 + M[b - 1]
  elseif algo == 1 then
    until_us = ((M[b] == 1) and (s[1] + p2) or ((s[1] + 1) * p2)) + M[b - 1]
  elseif algo == 2 then
    until_us = (s[1] + 2) * p2
  end
  if until_us then
    -- ceil(until_us / 1000), as above (until_us > 0).
    local ms = until_us / 1000
    local f = ms % 1
    if f > 0 then ms = ms - f + 1 end
    if ms <= now_ms then ms = now_ms + 1 end
    if ms ~= last_ms then last_ms, last_at = ms, format('%d', ms) end
    local value
    if algo == 4 then
      if s ~= last_s then
        last_s, last_value = s, (s % 1 == 0) and format('%d', s) or format('%.17g', s)
      end
      value = last_value
    elseif algo == 1 then
      value = format('%.0f %.0f', s[1], s[2])
    else
      value = format('%.0f %.0f %.0f', s[1], s[2], s[3])
    end
    call('SET', key, value, 'PXAT', last_at)
  elseif algo == 3 then
    call('ZREMRANGEBYSCORE', key, '-inf', now - p2)
    local seq = call('ZCARD', key)
    for _, r in ipairs(s.added) do
      seq = seq + 1
      call('ZADD', key, r[1], format('%d:%.0f:%d', r[2], r[1], seq))
    end
    call('PEXPIRE', key, math.max(mceil(p2 / 1000), 1))
  else
    call('ZREMRANGEBYSCORE', key, '-inf', now_ms)
    for _, x in ipairs(s.added) do
      call('ZADD', key, now_ms + p2, format('%d:%s', x[1], x[2]))
    end
    local top = call('ZRANGE', key, -1, -1, 'WITHSCORES')
    call('PEXPIREAT', key, tonumber(top[2]) + 1)
  end
end
return out
