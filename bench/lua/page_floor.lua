-- The least a batch could cost Redis per decision if a bucket's state were
-- a field of a shared hash (a "page") instead of a key of its own: the
-- call of write_floor.lua with its MGET and per-key SETs replaced by one
-- HMGET on each of two pages (this generation's and the one before, as a
-- page that expires whole needs) and one HSET of all charged fields plus
-- one PEXPIREAT on the current page. It admits everything: a measuring
-- stick for a data model with fewer writes than one per key, never a
-- limiter (BENCHMARKS.md, "The Redis store").
--
-- Instructions: SCRIPT=bench/lua/page_floor.lua CALLS=3000
-- bench/redis_instructions.sh (CALLS=3000: a page's first 512 fields are a
-- listpack, searched field by field; the default 300 calls measure mostly
-- that phase).
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local n = #KEYS
redis.call('HMGET', 'page:1', unpack(KEYS))
redis.call('HMGET', 'page:0', unpack(KEYS))
local out, fields = {}, {}
for i = 1, n do
  fields[2 * i - 1] = KEYS[i]
  fields[2 * i] = '1733330000123456'
  out[2 * i - 1] = 1
  out[2 * i] = 0
end
redis.call('HSET', 'page:1', unpack(fields))
redis.call('PEXPIREAT', 'page:1', now_ms + 100000)
return out
