-- A gateway node's heartbeat (src/store/mod.rs, `local_fraction = "auto"`).
--
-- KEYS[1]: the sorted set of live nodes; ARGV[1]: this node's id; ARGV[2]:
-- how long a heartbeat counts (ms). Each member's score is its expiry by
-- Redis TIME; expired members are dropped, the set itself expires with its
-- newest member. Returns the number of live nodes, this one included.

local t = redis.call('TIME')
local ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local ttl = tonumber(ARGV[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms)
redis.call('ZADD', KEYS[1], ms + ttl, ARGV[1])
redis.call('PEXPIRE', KEYS[1], ttl + 1)
return redis.call('ZCARD', KEYS[1])
