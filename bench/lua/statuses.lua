-- The wrk script of bench/common.sh's probe_statuses and bench/fault.sh's runs: every response
-- counted by status, printed at the end as lines "status CODE N", then
-- "socket_errors N" (connect, read, write and timeout errors: a reset or a
-- refused connection is one, with no status), "requests N", and the
-- latency's "p50_us N" and "p99_us N" (bench/fault.sh reads them). The
-- `response` callback costs the client time, so the measured runs go
-- without it and a short run with it checks what they were answered.

local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  statuses = {}
end

function response(status, headers, body)
  statuses[status] = (statuses[status] or 0) + 1
end

function done(summary, latency, requests)
  local merged = {}
  for _, thread in ipairs(threads) do
    for status, n in pairs(thread:get("statuses")) do
      merged[status] = (merged[status] or 0) + n
    end
  end
  for status, n in pairs(merged) do
    io.write(string.format("status %d %d\n", status, n))
  end
  local e = summary.errors
  io.write(string.format("socket_errors %d\n", e.connect + e.read + e.write + e.timeout))
  io.write(string.format("requests %d\n", summary.requests))
  io.write(string.format("p50_us %d\np99_us %d\n", latency:percentile(50), latency:percentile(99)))
end
