#!/usr/bin/env bash
# Load test of the Redis store: tollgate on memory, tollgate on Redis (with
# and without token leasing), and nginx + Lua + Redis (`access_by_lua` with
# one EVALSHA per request through lua-resty-redis, keep-alive pool) — the
# setup people build today. One machine, over loopback, interleaved
# A B C D A B C D ... so noise hits all alike.
#
# Targets (each in front of the same nginx `return 200` upstream, limited by
# a token bucket that never denies, per client address or, with KEYS > 1,
# per `x-api-key`):
#   tg_memory   tollgate, store.backend = "memory"
#   tg_redis    tollgate, store.backend = "redis" (at most one EVALSHA per
#               request; a worker's concurrent requests share one)
#   tg_lease    tollgate on Redis with `lease = 100`
#   ng_lua      nginx, access_by_lua_block: EVALSHA of the peer's one-key
#               GCRA, bench/lua/peer_gcra.lua (not tollgate's script, so the
#               peer stays fixed), for the same bucket, key = md5 of the
#               client address (or of the x-api-key), connection kept in a
#               pool of 64
#
# KEYS=N: with N > 1 every request carries `x-api-key: k<i>`, i cycling
# over N values (a wrk Lua script), and every target keys its bucket on it:
# N buckets in Redis instead of one hot key. KEYS=1 (default): no header,
# one bucket per client address (one hot key).
#
# Per run: requests/s, p50, p99 (wrk --latency), the gateway's CPU time per
# request and Redis's per decision (utime+stime from /proc/PID/stat, over
# completed requests: every request is one decision; with a lease most are
# decided by the node without Redis) and of that the part spent in the
# GET, MGET and SET the scripts run (kv: commandstats µs, the data
# structure's share), and Redis calls per request: the
# commands clients sent, from `INFO commandstats` (EVALSHA, EVAL, FCALL,
# SCRIPT, FUNCTION, PING; the commands a script runs inside Redis are
# counted there too and are left out), over completed requests. Then the
# median over rounds per target, with its range (min-max) for Redis CPU,
# and what one Redis core carries: 1e6 / (Redis CPU us per decision).
#
# Run (as root, or with the tools installed):   bench/redis.sh
# Knobs: THREADS=1 CONNS=64 DURATION=5s ROUNDS=3 WORKERS=1 BASE_PORT=18280
#        KEYS=1 (distinct x-api-key values cycled; 1 = per-IP, one hot key)
#        SKIP_BUILD=1 (use the existing target/dist/tollgate)
#        TOLLGATE_BIN=PATH (measure that build instead, e.g. a copy of an
#        earlier commit's dist binary, for a before/after pair)
#        SERVER_CPU=0.5 (cap each compared server, bench/common.sh)
# Needs nginx, libnginx-mod-http-lua, lua-nginx-redis, redis-server and wrk
# (installed with apt-get when absent). Everything it starts is stopped at
# exit; its files live in a `mktemp -d` directory, removed at exit.
set -euo pipefail

THREADS=${THREADS:-1}
CONNS=${CONNS:-64}
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-3}
WORKERS=${WORKERS:-1}
BASE_PORT=${BASE_PORT:-18280}
KEYS=${KEYS:-1}
case $KEYS in '' | *[!0-9]* | 0) echo "KEYS must be a positive integer" >&2; exit 1 ;; esac

cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh
need_tools nginx wrk redis-server redis-cli
if [ ! -e /usr/lib/nginx/modules/ngx_http_lua_module.so ] || [ ! -e /usr/share/lua/5.1/nginx/redis.lua ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq libnginx-mod-http-lua lua-nginx-redis >/dev/null
fi
build_release
TOLLGATE=${TOLLGATE_BIN:-$PWD/target/dist/tollgate}
start_scratch

PORT_UP=$BASE_PORT
PORT_REDIS=$((BASE_PORT + 1))
PORT_TG_MEMORY=$((BASE_PORT + 2))
PORT_TG_REDIS=$((BASE_PORT + 3))
PORT_TG_LEASE=$((BASE_PORT + 4))
PORT_NG_LUA=$((BASE_PORT + 5))

# ---- upstream and Redis --------------------------------------------------------
upstream_conf "$PORT_UP" "$TMP" >"$TMP/upstream.conf"
start_upstream "$TMP/upstream.conf"
wait_port "$PORT_UP"

redis-server --port "$PORT_REDIS" --bind 127.0.0.1 --save "" --appendonly no \
  --dir "$TMP" >"$TMP/redis.log" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
wait_port "$PORT_REDIS"
SHA=$(redis-cli -p "$PORT_REDIS" SCRIPT LOAD "$(cat bench/lua/peer_gcra.lua)")

# What the buckets are keyed on, and the requests wrk sends.
WRK_ARGS=()
if [ "$KEYS" -gt 1 ]; then
  TG_KEY='header:x-api-key'
  NG_KEY='ngx.var.http_x_api_key'
  cat >"$TMP/keys.lua" <<LUA
-- x-api-key: k1 .. k$KEYS, cycling, one per request.
local n, i = $KEYS, 0
request = function()
  i = i % n + 1
  return wrk.format(nil, nil, { ["x-api-key"] = "k" .. i })
end
LUA
  WRK_ARGS=(-s "$TMP/keys.lua")
else
  TG_KEY=ip
  NG_KEY=ngx.var.remote_addr
fi

# ---- the targets ---------------------------------------------------------------
# tollgate: the load harness's never-denying token bucket, on memory or Redis.
tg_conf() { # $1 = port: tollgate_conf's gateway, keyed on $TG_KEY
  tollgate_conf "$WORKERS" "$1" 1000000 "1000000/s" "$PORT_UP" | sed "s|^key = \"ip\"|key = \"$TG_KEY\"|"
}
tg_conf "$PORT_TG_MEMORY" >"$TMP/tg-memory.toml"
redis_conf() { # $1 = port, $2 = extra limit line
  tg_conf "$1" | sed "s|^refill = .*|&\n$2|"
  cat <<CONF

[store]
backend = "redis"
url = "redis://127.0.0.1:$PORT_REDIS"
timeout = "200ms"
CONF
}
redis_conf "$PORT_TG_REDIS" "" >"$TMP/tg-redis.toml"
redis_conf "$PORT_TG_LEASE" "lease = 100" >"$TMP/tg-lease.toml"

# nginx + lua-resty-redis: the peer's GCRA script for the same bucket (capacity
# 1e6 refilled 1e6/s: T = 1 us), one EVALSHA per request.
cat >"$TMP/ng-lua.conf" <<CONF
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
daemon off;
worker_processes $WORKERS;
pid $TMP/ng-lua.pid;
error_log $TMP/ng-lua.err crit;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 10000000;
  lua_package_path "/usr/share/lua/5.1/?.lua;;";
  upstream up {
    server 127.0.0.1:$PORT_UP;
    keepalive 64;
    keepalive_requests 10000000;
  }
  server {
    listen 127.0.0.1:$PORT_NG_LUA;
    location / {
      access_by_lua_block {
        local redis = require "nginx.redis"
        local red = redis:new()
        red:set_timeouts(200, 200, 200)
        local ok, err = red:connect("127.0.0.1", $PORT_REDIS)
        if not ok then return ngx.exit(503) end
        local key = "tollgate:per_ip:{" .. ngx.md5($NG_KEY or "") .. "}:tb"
        local res, err = red:evalsha("$SHA", 1, key, 1, 1000000, 1)
        if not res then return ngx.exit(503) end
        red:set_keepalive(10000, 64)
        if res[1] ~= 1 then return ngx.exit(429) end
      }
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
    }
  }
}
CONF

start_tollgate "$TMP/tg-memory.toml"; TG_MEMORY=$STARTED
start_tollgate "$TMP/tg-redis.toml"; TG_REDIS=$STARTED
start_tollgate "$TMP/tg-lease.toml"; TG_LEASE=$STARTED
start_nginx "$TMP/ng-lua.conf"; NG_LUA=$STARTED
for port in "$PORT_TG_MEMORY" "$PORT_TG_REDIS" "$PORT_TG_LEASE" "$PORT_NG_LUA"; do
  wait_port "$port"
done
for port in "$PORT_TG_MEMORY" "$PORT_TG_REDIS" "$PORT_TG_LEASE" "$PORT_NG_LUA"; do
  code=$(curl -s -o /dev/null -w '%{http_code}' -H 'x-api-key: k1' "http://127.0.0.1:$port/")
  [ "$code" = 200 ] || { echo "port $port answers $code" >&2; exit 1; }
done

# The calls clients have made so far (INFO commandstats; see the header).
redis_calls() {
  redis-cli -p "$PORT_REDIS" INFO commandstats |
    awk -F'[=,]' '/^cmdstat_(evalsha|eval|fcall|script|function|ping)[:|]/ {n += $2} END {print n + 0}'
}

# The µs Redis has spent so far in the key reads and writes scripts run
# (GET, MGET, SET; INFO commandstats): the part of a decision's Redis CPU
# that is the data structure's, not the script's.
redis_kv_usec() {
  redis-cli -p "$PORT_REDIS" INFO commandstats |
    awk -F'[=,]' '/^cmdstat_(get|mget|set):/ {n += $4} END {print n + 0}'
}

CLK_TCK=$(getconf CLK_TCK)
RESULTS=$TMP/results.tsv
: >"$RESULTS"

measure() { # $1 = target, $2 = port, $3 = gateway pid, $4 = round
  local out=$TMP/wrk.out before after rbefore rafter cbefore cafter kbefore kafter
  before=$(cpu_ticks "$3"); rbefore=$(cpu_ticks "$REDIS_PID"); cbefore=$(redis_calls); kbefore=$(redis_kv_usec)
  wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency ${WRK_ARGS[@]+"${WRK_ARGS[@]}"} "http://127.0.0.1:$2/" >"$out"
  after=$(cpu_ticks "$3"); rafter=$(cpu_ticks "$REDIS_PID"); cafter=$(redis_calls); kafter=$(redis_kv_usec)
  # Every target's bucket never denies: a refusal (a store error, a 429)
  # is a run that measured something else.
  check_statuses allow "$out"
  local rps p50 p99 requests non2xx
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
  p50=$(to_us "$(awk '$1 == "50%" {print $2}' "$out")")
  p99=$(to_us "$(awk '$1 == "99%" {print $2}' "$out")")
  requests=$(awk '/requests in/ {print $1}' "$out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' "$out")
  awk -v t="$1" -v r="$4" -v rps="$rps" -v p50="$p50" -v p99="$p99" -v n="$requests" \
    -v g=$((after - before)) -v rd=$((rafter - rbefore)) -v c=$((cafter - cbefore)) \
    -v kv=$((kafter - kbefore)) -v bad="${non2xx:-0}" -v hz="$CLK_TCK" 'BEGIN {
      printf "%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%.2f\t%.3f\t%.3f\n", t, r, rps, p50, p99,
        g * 1e6 / hz / n, rd * 1e6 / hz / n, kv / n, c / n, bad / n
    }' | tee -a "$RESULTS"
}

echo "# machine: nproc=$(nproc), CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "# $("$NGINX" -v 2>&1), $(redis-server --version | cut -d' ' -f1-3), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)"
echo "# wrk -t$THREADS -c$CONNS -d$DURATION --latency; rounds=$ROUNDS; workers=$WORKERS; keys=$KEYS (key: $TG_KEY)"
printf 'target\tround\treq/s\tp50_us\tp99_us\tgw_cpu_us/req\tredis_cpu_us/decision\tkv_us/decision\tredis_calls/req\tnon2xx\n'
for round in $(seq 1 "$ROUNDS"); do
  measure tg_memory "$PORT_TG_MEMORY" "$TG_MEMORY" "$round"
  measure tg_redis "$PORT_TG_REDIS" "$TG_REDIS" "$round"
  measure tg_lease "$PORT_TG_LEASE" "$TG_LEASE" "$round"
  measure ng_lua "$PORT_NG_LUA" "$NG_LUA" "$round"
done

echo
echo "# median over $ROUNDS rounds (Redis CPU: median, min-max)"
awk -F'\t' "$AWK_STATS"'
  {
    rps[$1] = rps[$1] " " $3; p50[$1] = p50[$1] " " $4; p99[$1] = p99[$1] " " $5
    g[$1] = g[$1] " " $6; r[$1] = r[$1] " " $7; kv[$1] = kv[$1] " " $8; c[$1] = c[$1] " " $9; bad[$1] = bad[$1] " " $10
  }
  END {
    printf "%-10s %9s %8s %8s %13s %24s %14s %15s %7s\n", "target", "req/s", "p50_us", "p99_us", "gw_cpu_us/req", "redis_cpu_us/decision", "kv_us/decision", "redis_calls/req", "non2xx"
    split("tg_memory tg_redis tg_lease ng_lua", ts, " ")
    for (i = 1; i <= 4; i++) {
      t = ts[i]; R[t] = median(rps[t]); C[t] = median(r[t])
      printf "%-10s %9.0f %8.0f %8.0f %13.2f %11.2f (%11s) %14.2f %15.3f %7.3f\n", t, R[t], median(p50[t]), median(p99[t]), median(g[t]), C[t], range(r[t], "%.2f"), median(kv[t]), median(c[t]), median(bad[t])
    }
    printf "ratios: tg_redis/ng_lua req/s %.2f; tg_redis/tg_memory req/s %.2f; tg_lease/ng_lua req/s %.2f\n", R["tg_redis"] / R["ng_lua"], R["tg_redis"] / R["tg_memory"], R["tg_lease"] / R["ng_lua"]
    printf "Redis CPU per decision: tg_redis/ng_lua %.2f, tg_lease/ng_lua %.2f\n", C["tg_redis"] / C["ng_lua"], C["tg_lease"] / C["ng_lua"]
    for (i = 2; i <= 4; i++) {
      t = ts[i]
      if (C[t] > 0) printf "decisions/s one Redis core carries, %s: %.0f\n", t, 1e6 / C[t]
    }
  }' "$RESULTS"
