-- The wrk script of bench/fleet.sh: every request carries an `x-api-key`
-- drawn from KEYS keys ("k1" .. "kKEYS"; one key is "hot"), Zipf-distributed
-- with exponent S (key i weighs 1 / i^S). The cumulative distribution and
-- the KEYS request texts are built once per thread in init(); a request
-- costs one random number and a binary search (about 14 steps for 10,000
-- keys), no formatting.
--
-- wrk -s bench/lua/fleet_wrk.lua URL -- KEYS S SEED
-- done() prints the latency distribution as 999 lines "LAT p us" (p =
-- 0.1 .. 99.9 by 0.1), so that bench/fleet.sh can merge the distributions
-- of several wrk processes (one per gateway) weighted by their requests.

local cdf, reqs, n

function init(args)
  n = tonumber(args[1]) or 1
  local s = tonumber(args[2]) or 1.0
  math.randomseed(tonumber(args[3]) or os.time())
  cdf, reqs = {}, {}
  local sum = 0
  for i = 1, n do
    sum = sum + 1 / i ^ s
    cdf[i] = sum
  end
  for i = 1, n do
    cdf[i] = cdf[i] / sum
    local key = n == 1 and "hot" or ("k" .. i)
    reqs[i] = wrk.format("GET", wrk.path, { ["x-api-key"] = key })
  end
  cdf[n] = 1.0
end

function request()
  local u = math.random()
  local lo, hi = 1, n
  while lo < hi do
    local mid = math.floor((lo + hi) / 2)
    if cdf[mid] < u then lo = mid + 1 else hi = mid end
  end
  return reqs[lo]
end

function done(summary, latency, requests)
  for i = 1, 999 do
    io.write(string.format("LAT %.1f %d\n", i / 10, latency:percentile(i / 10)))
  end
end
