#!/usr/bin/env bash
# Load test of the Redis store: tollgate on memory, tollgate on Redis (with
# and without token leasing), and nginx + Lua + Redis (`access_by_lua` with
# one EVALSHA per request through lua-resty-redis, keep-alive pool) — the
# setup people build today. One machine, over loopback, interleaved
# A B C D A B C D ... so noise hits all alike.
#
# Targets (each in front of the same nginx `return 200` upstream, limited by
# a per-IP token bucket that never denies):
#   tg_memory   tollgate, store.backend = "memory"
#   tg_redis    tollgate, store.backend = "redis" (at most one EVALSHA per
#               request; a worker's concurrent requests share one)
#   tg_lease    tollgate on Redis with `lease = 100`
#   ng_lua      nginx, access_by_lua_block: EVALSHA of tollgate's own
#               src/store/stack.lua for the same token bucket, key = md5 of
#               the client address, connection kept in a pool of 64
#
# Per run: requests/s, p50, p99 (wrk --latency), the gateway's CPU time per
# request and Redis's (utime+stime from /proc/PID/stat, over completed
# requests), and Redis calls per request: the commands clients sent, from
# `INFO commandstats` (EVALSHA, EVAL, SCRIPT, PING; the commands a script
# runs inside Redis are counted there too and are left out), over completed
# requests. Then the median over rounds per target.
#
# Run (as root, or with the tools installed):   bench/redis.sh
# Knobs: THREADS=1 CONNS=64 DURATION=5s ROUNDS=3 WORKERS=1 BASE_PORT=18280
#        SKIP_BUILD=1 (use the existing target/dist/tollgate)
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
TOLLGATE=$PWD/target/dist/tollgate
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
SHA=$(redis-cli -p "$PORT_REDIS" SCRIPT LOAD "$(cat src/store/stack.lua)")

# ---- the targets ---------------------------------------------------------------
# tollgate: the load harness's never-denying token bucket, on memory or Redis.
tollgate_conf "$WORKERS" "$PORT_TG_MEMORY" 1000000 "1000000/s" "$PORT_UP" >"$TMP/tg-memory.toml"
redis_conf() { # $1 = port, $2 = extra limit line
  tollgate_conf "$WORKERS" "$1" 1000000 "1000000/s" "$PORT_UP" | sed "s|^refill = .*|&\n$2|"
  cat <<CONF

[store]
backend = "redis"
url = "redis://127.0.0.1:$PORT_REDIS"
timeout = "200ms"
CONF
}
redis_conf "$PORT_TG_REDIS" "" >"$TMP/tg-redis.toml"
redis_conf "$PORT_TG_LEASE" "lease = 100" >"$TMP/tg-lease.toml"

# nginx + lua-resty-redis: the same script and parameters (a token bucket of
# capacity 1e6 refilled 1e6/s: T = 1 us), one EVALSHA per request: one
# decision (the first ARGV) of one entry.
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
        local key = "tollgate:per_ip:{" .. ngx.md5(ngx.var.remote_addr) .. "}:tb"
        local res, err = red:evalsha("$SHA", 1, key, 1, 1, 4, 1000000, "1.000000", 0, 0, 0, 1)
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
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port/")
  [ "$code" = 200 ] || { echo "port $port answers $code" >&2; exit 1; }
done

# The calls clients have made so far (INFO commandstats; see the header).
redis_calls() {
  redis-cli -p "$PORT_REDIS" INFO commandstats |
    awk -F'[=,]' '/^cmdstat_(evalsha|eval|script|ping):/ {n += $2} END {print n + 0}'
}

CLK_TCK=$(getconf CLK_TCK)
RESULTS=$TMP/results.tsv
: >"$RESULTS"

measure() { # $1 = target, $2 = port, $3 = gateway pid, $4 = round
  local out=$TMP/wrk.out before after rbefore rafter cbefore cafter
  before=$(cpu_ticks "$3"); rbefore=$(cpu_ticks "$REDIS_PID"); cbefore=$(redis_calls)
  wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "http://127.0.0.1:$2/" >"$out"
  after=$(cpu_ticks "$3"); rafter=$(cpu_ticks "$REDIS_PID"); cafter=$(redis_calls)
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
    -v bad="${non2xx:-0}" -v hz="$CLK_TCK" 'BEGIN {
      printf "%s\t%s\t%s\t%s\t%s\t%.2f\t%.2f\t%.3f\t%.3f\n", t, r, rps, p50, p99,
        g * 1e6 / hz / n, rd * 1e6 / hz / n, c / n, bad / n
    }' | tee -a "$RESULTS"
}

echo "# machine: nproc=$(nproc), CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "# $("$NGINX" -v 2>&1), $(redis-server --version | cut -d' ' -f1-3), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)"
echo "# wrk -t$THREADS -c$CONNS -d$DURATION --latency; rounds=$ROUNDS; workers=$WORKERS"
printf 'target\tround\treq/s\tp50_us\tp99_us\tgw_cpu_us/req\tredis_cpu_us/req\tredis_calls/req\tnon2xx\n'
for round in $(seq 1 "$ROUNDS"); do
  measure tg_memory "$PORT_TG_MEMORY" "$TG_MEMORY" "$round"
  measure tg_redis "$PORT_TG_REDIS" "$TG_REDIS" "$round"
  measure tg_lease "$PORT_TG_LEASE" "$TG_LEASE" "$round"
  measure ng_lua "$PORT_NG_LUA" "$NG_LUA" "$round"
done

echo
echo "# median over $ROUNDS rounds"
awk -F'\t' '
  function median(list,   n, a, i, j, t) {
    n = split(list, a, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] + 0 < a[i] + 0) { t = a[i]; a[i] = a[j]; a[j] = t }
    return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2
  }
  {
    rps[$1] = rps[$1] " " $3; p50[$1] = p50[$1] " " $4; p99[$1] = p99[$1] " " $5
    g[$1] = g[$1] " " $6; r[$1] = r[$1] " " $7; c[$1] = c[$1] " " $8; bad[$1] = bad[$1] " " $9
  }
  END {
    printf "%-10s %9s %8s %8s %13s %16s %15s %7s\n", "target", "req/s", "p50_us", "p99_us", "gw_cpu_us/req", "redis_cpu_us/req", "redis_calls/req", "non2xx"
    split("tg_memory tg_redis tg_lease ng_lua", ts, " ")
    for (i = 1; i <= 4; i++) {
      t = ts[i]; R[t] = median(rps[t])
      printf "%-10s %9.0f %8.0f %8.0f %13.2f %16.2f %15.3f %7.3f\n", t, R[t], median(p50[t]), median(p99[t]), median(g[t]), median(r[t]), median(c[t]), median(bad[t])
    }
    printf "ratios: tg_redis/ng_lua req/s %.2f; tg_redis/tg_memory req/s %.2f; tg_lease/ng_lua req/s %.2f\n", R["tg_redis"] / R["ng_lua"], R["tg_redis"] / R["tg_memory"], R["tg_lease"] / R["ng_lua"]
  }' "$RESULTS"
