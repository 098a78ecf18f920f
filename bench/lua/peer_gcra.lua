-- The peer's rate-limit script for the Redis benchmarks (bench/redis.sh,
-- bench/fleet.sh): a token bucket as GCRA on one key, the way people write
-- it for nginx + lua-resty-redis (one EVALSHA per request; cf. the public
-- redis-gcra and lua-resty-limit-traffic scripts). It is kept apart from
-- tollgate's own src/store/stack.lua so that the peer does not change when
-- tollgate's script does.
--
-- KEYS[1]: the key. ARGV[1]: emission interval T in microseconds (1 / rate),
-- ARGV[2]: capacity (burst) in tokens, ARGV[3]: cost.
-- Returns { allowed (0/1), remaining, retry_after_us }.
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local T = tonumber(ARGV[1])
local tau = tonumber(ARGV[2]) * T
local cost = tonumber(ARGV[3])
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local new_tat = tat + cost * T
if new_tat - now > tau then
  return { 0, 0, math.ceil(new_tat - now - tau) }
end
redis.call('SET', KEYS[1], string.format('%.0f', new_tat), 'PX', math.max(math.ceil((new_tat - now) / 1000), 1))
return { 1, math.floor((tau - (new_tat - now)) / T), 0 }
