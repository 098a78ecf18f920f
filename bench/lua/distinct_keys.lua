-- wrk script for bench/key_memory.sh: one new `x-api-key` per request.
--
-- Args: FIRST COUNT PREFIX MARKER [DEPTH]. Request n (n = 1 .. COUNT) is
-- `GET /` with `x-api-key: PREFIX(FIRST + n)`; once COUNT have been sent, the
-- connections still running send `GET /free`, a path without a limit, so no
-- key beyond the COUNT is created while the last answers come in. Each write
-- of a connection carries DEPTH requests (1 by default: no pipelining), which
-- loads the keys several times faster than one request per round trip. The
-- upstream marks its answers to `/` with `x-bench-key`, so the script counts
-- the keyed answers exactly and stops the thread at the COUNT-th (or at the
-- first answer that is not a 200), writing the file MARKER for the caller to
-- end the run (wrk waits for its -d otherwise). `done` prints `keyed=K bad=B`
-- for the caller to check. Run with one thread (-t1): the counters are that
-- thread's.
local threads = {}

function setup(thread)
  table.insert(threads, thread)
end

function init(args)
  first = tonumber(args[1])
  count = tonumber(args[2])
  prefix = args[3]
  marker_path = args[4]
  depth = tonumber(args[5] or "1")
  sent, keyed, bad = 0, 0, 0
  -- wrk 4 calls request() once more before the run, in this state, to count
  -- the requests of a write (script_verify_request): that call is answered
  -- with DEPTH unlimited requests, so it takes no key (were it made in
  -- another state, they would be sent, and are harmless).
  verified = false
end

local function one()
  if sent < count then
    sent = sent + 1
    return wrk.format("GET", "/", { ["x-api-key"] = prefix .. (first + sent) })
  end
  return wrk.format("GET", "/free")
end

function request()
  local batch = {}
  if not verified then
    verified = true
    for i = 1, depth do
      batch[i] = wrk.format("GET", "/free")
    end
    return table.concat(batch)
  end
  for i = 1, depth do
    batch[i] = one()
  end
  return table.concat(batch)
end

function response(status, headers)
  if status ~= 200 then
    bad = bad + 1
  elseif headers["x-bench-key"] or headers["X-Bench-Key"] then
    keyed = keyed + 1
  end
  if (keyed >= count or bad > 0) and not stopping then
    stopping = true
    wrk.thread:stop()
    -- wrk's main thread sleeps for the whole -d whatever its threads do:
    -- the caller waits for this file, then ends the run with SIGINT.
    local marker = io.open(marker_path, "w")
    marker:write("stopped\n")
    marker:close()
  end
end

function done()
  local k, b = 0, 0
  for _, thread in ipairs(threads) do
    k = k + thread:get("keyed")
    b = b + thread:get("bad")
  end
  io.write(string.format("keyed=%d bad=%d\n", k, b))
end
