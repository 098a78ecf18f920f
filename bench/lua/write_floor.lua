-- The least a batch of stack.lua can cost Redis per decision: the same
-- call (EVALSHA, the batch's keys, an answer of 2 integers per decision)
-- with no decision in it, only one MGET of all keys and one SET ... PXAT
-- per key. It admits everything and keeps no state worth the name: it is
-- a measuring stick, never a limiter (BENCHMARKS.md, "The Redis store").
--
-- Instructions: SCRIPT=bench/lua/write_floor.lua bench/redis_instructions.sh
-- Wall-clock Redis CPU: build a scratch copy of the repository with this
-- file as src/store/stack.lua and run bench/redis.sh with
-- TOLLGATE_BIN=that build (its tg_redis row; ignore tg_lease, which this
-- script does not lease).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = #KEYS
redis.call('MGET', unpack(KEYS))
local out = {}
local exp = tostring(now_ms + 1)
for i = 1, n do
  redis.call('SET', KEYS[i], '1733330000123456', 'PXAT', exp)
  out[2 * i - 1] = 1
  out[2 * i] = 0
end
return out
