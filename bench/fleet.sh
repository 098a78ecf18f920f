#!/usr/bin/env bash
# A fleet on one Redis (issue 29): N = 1, 2 and 4 gateway processes (one
# worker each) sharing one redis-server, the load spread across them, each
# API key limited so that the shared limit binds. Two key sets:
#   hot    every request carries the same key ("hot")
#   zipf   10,000 keys, Zipf-distributed (s = 1.0: the first key draws about
#          10 % of the requests, the 100th 0.1 %): the head binds, the tail
#          does not
# and five variants, N processes of each, in front of one nginx `return
# 200` upstream:
#   tg_memory   tollgate, memory store, each node limited to 1/N of the
#               limit (the latency reference: no store call)
#   tg_redis    tollgate, store.backend = "redis" (a worker's concurrent
#               decisions share one EVALSHA)
#   tg_lease    the same with `lease = LEASE` on both limits
#   tg_remember tg_redis with `remember_denials = REMEMBER`: a node answers
#               a key's repeated denials from Redis's last one, no call
#   tg_cluster  tollgate on a one-shard Redis Cluster (a second
#               redis-server, cluster-enabled, holding all 16,384 slots;
#               `cluster = true`): what one shard costs per decision, where
#               decisions are not batched (one call per slot group)
#   ng_lua      nginx (1 worker each), access_by_lua_block + lua-resty-redis:
#               one EVALSHA per request of bench/lua/peer_gcra.lua (GCRA on
#               one key, the key an md5 of the API key), 429 when denied
# Limits (token buckets keyed on `header:x-api-key`): route /hot: capacity
# HOT_CAPACITY, refill HOT_RATE/s; route /zipf: capacity ZIPF_CAPACITY,
# refill ZIPF_RATE/s per key.
#
# Load: one wrk per gateway (-t1, CONNS/N connections each), all started
# together for DURATION, keys drawn by bench/lua/fleet_wrk.lua. Then a
# light phase (one connection per gateway, LIGHT_DURATION, the zipf keys)
# for the latency without queueing. Rounds interleave: for each round, for
# each N, for each key set, every variant in turn.
#
# Per run: decisions/s (allowed + denied responses per second, all
# gateways), the denied share, gateway CPU µs per decision (all N
# processes), Redis CPU µs per decision (utime + stime of redis-server over
# responses), Redis calls per decision (`INFO commandstats`: the client
# commands EVALSHA, EVAL, FCALL, SCRIPT, PING, and on the cluster its
# topology queries, CLUSTER …), p50/p99 latency (the N wrk
# distributions merged, weighted by their requests). The latency the store
# adds is the difference from tg_memory at the same N and key set (tollgate
# exposes no store-call histogram), under load and in the light phase.
#
# Checks (the run fails, exit 1, when one does not hold):
#   - statuses: only 200 and 429. tollgate's `tollgate_requests_total` by
#     status (admin /metrics, before and after) shows no other status and
#     `tollgate_store_errors_total` does not move (on_failure = "deny": a
#     store failure would be a 503); nginx logs only the responses whose
#     status is neither 200 nor 429 (nor 499, its mark for a request whose
#     client left first: wrk's requests in flight when it stops), and that
#     log stays empty; wrk saw no socket error.
#   - admissions: the upstream logs each request's key (buffered access
#     log); the requests it served are at least the 2xx wrk counted and at
#     most CONNS more (requests cut off at the end). Per key, the admitted
#     count must stay within capacity + refill × elapsed (+ N × LEASE with
#     a lease: tokens leased before and spent inside the interval) + 1
#     (rounding), elapsed being the wall clock from just before the first
#     wrk started to just after the last one ended — an interval that holds
#     every admission of the run, so no skew tolerance is needed.
#
# 2 cores: N gateways, Redis, N wrk processes and the upstream share them,
# so decisions/s is bounded by the machine, not by Redis; the Redis CPU and
# calls per decision are the figures that carry over to a real fleet.
#
# Run (as root, or with the tools installed):   bench/fleet.sh
# (about 12 minutes with the defaults)
# Knobs: NODES="1 2 4" KEYSETS="hot zipf" VARIANTS="tg_memory tg_redis
#        tg_lease tg_remember tg_cluster ng_lua" DURATION=5 LIGHT_DURATION=3 (0: no
#        light phase)
#        ROUNDS=3 CONNS=64 LEASE=100 REMEMBER=1s ZIPF_KEYS=10000 ZIPF_S=1.0
#        HOT_CAPACITY=500 HOT_RATE=5000 ZIPF_CAPACITY=100 ZIPF_RATE=100
#        BASE_PORT=18680 (uses BASE_PORT .. BASE_PORT+191: a server whose
#        port is taken starts again 60 ports up)
#        SKIP_BUILD=1 (use target/dist/tollgate), TOLLGATE=/path/to/binary
# Needs nginx, libnginx-mod-http-lua, lua-nginx-redis, redis-server, wrk,
# curl (installed with apt-get when absent). Everything it starts is stopped
# at exit; its files live in a `mktemp -d` directory, removed at exit.
set -euo pipefail

NODES=${NODES:-1 2 4}
KEYSETS=${KEYSETS:-hot zipf}
VARIANTS=${VARIANTS:-tg_memory tg_redis tg_lease tg_remember tg_cluster ng_lua}
DURATION=${DURATION:-5}
LIGHT_DURATION=${LIGHT_DURATION:-3}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-64}
LEASE=${LEASE:-100}
REMEMBER=${REMEMBER:-1s}
ZIPF_KEYS=${ZIPF_KEYS:-10000}
ZIPF_S=${ZIPF_S:-1.0}
HOT_CAPACITY=${HOT_CAPACITY:-500}
HOT_RATE=${HOT_RATE:-5000}
ZIPF_CAPACITY=${ZIPF_CAPACITY:-100}
ZIPF_RATE=${ZIPF_RATE:-100}
BASE_PORT=${BASE_PORT:-18680}

cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh
need_tools nginx wrk redis-server redis-cli curl
if [ ! -e /usr/lib/nginx/modules/ngx_http_lua_module.so ] || [ ! -e /usr/share/lua/5.1/nginx/redis.lua ]; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq libnginx-mod-http-lua lua-nginx-redis >/dev/null
fi
if [ -n "${TOLLGATE:-}" ]; then
  TOLLGATE=$(realpath "$TOLLGATE")
else
  build_release
  TOLLGATE=$PWD/target/dist/tollgate
fi
[ -x "$TOLLGATE" ] || { echo "no tollgate binary at $TOLLGATE" >&2; exit 1; }
for n in $NODES; do
  case $n in 1 | 2 | 4) ;; *) echo "NODES: 1, 2 or 4 (got $n)" >&2; exit 1 ;; esac
  [ $((CONNS % n)) = 0 ] || { echo "CONNS ($CONNS) must divide by N ($n)" >&2; exit 1; }
  for c in "$HOT_CAPACITY" "$HOT_RATE" "$ZIPF_CAPACITY" "$ZIPF_RATE"; do
    # tg_memory's nodes get 1/N each: keep the sum exact.
    [ $((c % n)) = 0 ] || { echo "capacities and rates must divide by N ($n)" >&2; exit 1; }
  done
done
start_scratch

PORT_UP=$BASE_PORT
PORT_REDIS=$((BASE_PORT + 1))
PORT_CLUSTER=$((BASE_PORT + 2)) # and its cluster bus, BASE_PORT + 5
# Variant v's node j (0..3) listens on BASE_PORT + 10 * v + j (v = 1..6),
# its admin listener on that + 4; a node started again after a port was
# taken (see start_node) moves 60 or 120 ports up.
declare -A PORT_SHIFT
variant_index() {
  case $1 in tg_memory) echo 1 ;; tg_redis) echo 2 ;; tg_lease) echo 3 ;; ng_lua) echo 4 ;;
    tg_cluster) echo 5 ;; tg_remember) echo 6 ;;
    *) echo "unknown variant $1" >&2; exit 1 ;; esac
}
node_port() { echo $((BASE_PORT + 10 * $(variant_index "$1") + $2 + ${PORT_SHIFT[$1-$2]:-0})); }
admin_port() { echo $(($(node_port "$1" "$2") + 4)); }

# ---- upstream and Redis --------------------------------------------------------
# Each is started up to three times, 60 ports up each time (see start_node).
# $1 = what, $2 = port, $3 = the log; the command follows (it gets the
# port). Sets STARTED and STARTED_PORT.
start_retrying() {
  local what=$1 port=$2 log=$3 attempt
  shift 3
  for attempt in 1 2 3; do
    "$@" "$port" &
    STARTED=$!
    PIDS+=("$STARTED")
    STARTED_PORT=$port
    if (wait_port "$port") 2>/dev/null; then return 0; fi
    echo "$what did not start on port $port (attempt $attempt):" >&2
    tail -3 "$log" >&2 2>/dev/null || true
    stop "$STARTED"
    port=$((port + 60))
  done
  exit 1
}

# The upstream logs each request's route and key (buffered; flushed by the
# USR1 that rotates the log after each run).
upstream() { # $1 = port
  cat >"$TMP/upstream.conf" <<CONF
daemon off;
worker_processes 1;
pid $TMP/upstream.pid;
error_log $TMP/upstream.err error;
events { worker_connections 4096; }
http {
  log_format keys '\$uri \$http_x_api_key';
  access_log $TMP/admitted.log keys buffer=256k;
  keepalive_requests 10000000;
  server {
    listen 127.0.0.1:$1;
    location / { return 200 "ok\n"; }
  }
}
CONF
  exec "$NGINX" -p "$TMP/" -e "$TMP/upstream.err" -c "$TMP/upstream.conf" >/dev/null 2>&1
}
start_retrying upstream "$PORT_UP" "$TMP/upstream.err" upstream
UPSTREAM_PID=$STARTED
PORT_UP=$STARTED_PORT

redis() { # $1 = port
  exec redis-server --port "$1" --bind 127.0.0.1 --save "" --appendonly no \
    --dir "$TMP" >"$TMP/redis.log" 2>&1
}
start_retrying redis-server "$PORT_REDIS" "$TMP/redis.log" redis
REDIS_PID=$STARTED
PORT_REDIS=$STARTED_PORT
PEER_SHA=$(redis-cli -p "$PORT_REDIS" SCRIPT LOAD "$(cat bench/lua/peer_gcra.lua)")

# The one-shard cluster: its own redis-server, so that its CPU and calls
# are counted apart; its cluster bus on port + 3 (Redis's default, + 10000,
# would leave the bench's range).
cluster() { # $1 = port
  exec redis-server --port "$1" --bind 127.0.0.1 --save "" --appendonly no \
    --cluster-enabled yes --cluster-port "$(($1 + 3))" \
    --cluster-config-file "$TMP/cluster-nodes-$1.conf" --dir "$TMP" >"$TMP/cluster.log" 2>&1
}
start_retrying "the cluster's redis-server" "$PORT_CLUSTER" "$TMP/cluster.log" cluster
CLUSTER_PID=$STARTED
PORT_CLUSTER=$STARTED_PORT
redis-cli -p "$PORT_CLUSTER" CLUSTER ADDSLOTSRANGE 0 16383 >/dev/null
for _ in $(seq 1 100); do
  redis-cli -p "$PORT_CLUSTER" CLUSTER INFO | grep -q '^cluster_state:ok' && break
  sleep 0.1
done
redis-cli -p "$PORT_CLUSTER" CLUSTER INFO | grep -q '^cluster_state:ok' ||
  { echo "the one-shard cluster did not come up" >&2; exit 1; }
# The Redis a variant's decisions land on: its pid and port.
redis_pid() { if [ "$1" = tg_cluster ]; then echo "$CLUSTER_PID"; else echo "$REDIS_PID"; fi; }
redis_port() { if [ "$1" = tg_cluster ]; then echo "$PORT_CLUSTER"; else echo "$PORT_REDIS"; fi; }

# ---- the gateways --------------------------------------------------------------
# tollgate: $1 = variant, $2 = node, $3 = N.
tollgate_fleet_conf() {
  local v=$1 div=1 lease_line=
  [ "$v" = tg_memory ] && div=$3
  [ "$v" = tg_lease ] && lease_line="lease = $LEASE"
  cat <<CONF
[server]
listen = "127.0.0.1:$(node_port "$v" "$2")"
admin = "127.0.0.1:$(admin_port "$v" "$2")"
workers = 1

[upstreams.up]
url = "http://127.0.0.1:$PORT_UP"

[limits.hot]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = $((HOT_CAPACITY / div))
refill = "$((HOT_RATE / div))/s"
$lease_line

[limits.zipf]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = $((ZIPF_CAPACITY / div))
refill = "$((ZIPF_RATE / div))/s"
$lease_line

[[routes]]
name = "hot"
match = { path_prefix = "/hot" }
upstream = "up"
limits = ["hot"]

[[routes]]
name = "zipf"
match = { path_prefix = "/zipf" }
upstream = "up"
limits = ["zipf"]
CONF
  if [ "$v" = tg_cluster ]; then
    printf '\n[store]\nbackend = "redis"\ncluster = true\nurl = ["redis://127.0.0.1:%s"]\n' "$PORT_CLUSTER"
  elif [ "$v" != tg_memory ]; then
    printf '\n[store]\nbackend = "redis"\nurl = "redis://127.0.0.1:%s"\n' "$PORT_REDIS"
  fi
  if [ "$v" != tg_memory ]; then
    # A prefix per variant: tg_redis and tg_lease never share a bucket.
    # on_failure = "deny": a failed store call is a 503, which fails the run.
    cat <<CONF
prefix = "$v:"
timeout = "500ms"
on_failure = "deny"
CONF
    if [ "$v" = tg_remember ]; then echo "remember_denials = \"$REMEMBER\""; fi
  fi
}

# nginx + lua-resty-redis, one worker: $1 = node. The same keys and limits
# (T = 1e6 / rate µs), one EVALSHA of the peer's script per request. Only
# responses that are neither 200 nor 429 are logged (the status check).
ng_lua_conf() {
  local port
  port=$(node_port ng_lua "$1")
  cat <<CONF
load_module /usr/lib/nginx/modules/ndk_http_module.so;
load_module /usr/lib/nginx/modules/ngx_http_lua_module.so;
daemon off;
worker_processes 1;
pid $TMP/ng-lua-$1.pid;
error_log $TMP/ng-lua-$1.err crit;
events { worker_connections 4096; }
http {
  map \$status \$unexpected { 200 0; 429 0; 499 0; default 1; }
  log_format st '\$status \$uri';
  access_log $TMP/ng-lua-$1.unexpected st if=\$unexpected;
  keepalive_requests 10000000;
  lua_package_path "/usr/share/lua/5.1/?.lua;;";
  init_worker_by_lua_block {
    limits = {
      hot = { T = $(awk -v r="$HOT_RATE" 'BEGIN {printf "%.6f", 1e6 / r}'), capacity = $HOT_CAPACITY },
      zipf = { T = $(awk -v r="$ZIPF_RATE" 'BEGIN {printf "%.6f", 1e6 / r}'), capacity = $ZIPF_CAPACITY },
    }
  }
  upstream up {
    server 127.0.0.1:$PORT_UP;
    keepalive 64;
    keepalive_requests 10000000;
  }
  server {
    listen 127.0.0.1:$port;
    location ~ ^/(hot|zipf) {
      set \$limit \$1;
      access_by_lua_block {
        local redis = require "nginx.redis"
        local limit = limits[ngx.var.limit]
        local red = redis:new()
        red:set_timeouts(500, 500, 500)
        local ok, err = red:connect("127.0.0.1", $PORT_REDIS)
        if not ok then return ngx.exit(503) end
        local key = "ng_lua:" .. ngx.var.limit .. ":{" .. ngx.md5(ngx.var.http_x_api_key or "") .. "}"
        local res, err = red:evalsha("$PEER_SHA", 1, key, limit.T, limit.capacity, 1)
        if not res then return ngx.exit(503) end
        red:set_keepalive(10000, 64)
        if res[1] ~= 1 then return ngx.exit(429) end
      }
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
CONF
}

# Starts node $2 of variant $1 in a fleet of $3 and waits until it
# answers; its pid in $STARTED. Up to three attempts, on other ports: the
# ports may lie in the kernel's ephemeral range, where an outgoing
# connection (of this bench or another process) can hold one.
start_node() {
  local v=$1 j=$2 attempt port code
  for attempt in 1 2 3; do
    PORT_SHIFT[$v-$j]=$((60 * (attempt - 1)))
    port=$(node_port "$v" "$j")
    if [ "$v" = ng_lua ]; then
      ng_lua_conf "$j" >"$TMP/ng-lua-$j.conf"
      : >"$TMP/ng-lua-$j.unexpected"
      start_nginx "$TMP/ng-lua-$j.conf"
    else
      tollgate_fleet_conf "$v" "$j" "$3" >"$TMP/$v-$j.toml"
      start_tollgate "$TMP/$v-$j.toml"
    fi
    if (wait_port "$port") 2>/dev/null &&
      { [ "$v" = ng_lua ] || (wait_port "$(admin_port "$v" "$j")") 2>/dev/null; }; then
      code=$(curl -s -o /dev/null -w '%{http_code}' -H 'x-api-key: probe' "http://127.0.0.1:$port/zipf")
      [ "$code" = 200 ] || { echo "$v node $j answers $code" >&2; exit 1; }
      return 0
    fi
    echo "$v node $j did not start (attempt $attempt):" >&2
    { cat "$TMP/$v-$j.toml.err" "$TMP/ng-lua-$j.conf.err" "$TMP/ng-lua-$j.err" 2>/dev/null || true; } | tail -3 >&2
    stop "$STARTED"
  done
  exit 1
}

# Starts the N nodes of every variant; their pids in NODE_PIDS[variant].
declare -A NODE_PIDS
start_fleet() { # $1 = N
  local v j
  for v in $VARIANTS; do
    NODE_PIDS[$v]=
    for j in $(seq 0 $(($1 - 1))); do
      start_node "$v" "$j" "$1"
      NODE_PIDS[$v]="${NODE_PIDS[$v]} $STARTED"
    done
  done
  rotate_admitted "$TMP/probes.log" # the probes are no run's admissions
}
stop_fleet() {
  local v
  for v in $VARIANTS; do
    # shellcheck disable=SC2086 # the list of pids
    stop ${NODE_PIDS[$v]}
  done
}

# ---- measuring -----------------------------------------------------------------
# The calls clients have made so far (INFO commandstats; see the header).
# $1 = the Redis's port. On the cluster, the client's topology queries
# (CLUSTER SLOTS and the like) count too.
redis_calls() {
  redis-cli -p "$1" INFO commandstats |
    awk -F'[=,]' '/^cmdstat_(evalsha|evalsha_ro|eval|eval_ro|fcall|fcall_ro|ping|script|script[|][a-z]+|cluster[|][a-z]+|readonly|asking):/ {n += $2} END {print n + 0}'
}

# Responses so far that are not 200/429, store errors, and the admin
# listeners that did not answer, over a variant's N nodes: "unexpected
# store_errors unanswered".
status_counts() { # $1 = variant, $2 = N
  local j
  for j in $(seq 0 $(($2 - 1))); do
    if [ "$1" = ng_lua ]; then
      echo "unexpected $(wc -l <"$TMP/ng-lua-$j.unexpected")"
    else
      if curl -sf "http://127.0.0.1:$(admin_port "$1" "$j")/metrics" >"$TMP/metrics"; then
        awk '/^tollgate_requests_total\{/ && !/status="(200|429)"/ { print "unexpected", $NF }
          /^tollgate_store_errors_total\{/ { print "store_errors", $NF }' "$TMP/metrics"
      else
        echo "unanswered 1"
      fi
    fi
  done | awk '{ s[$1] += $2 } END { printf "%d %d %d\n", s["unexpected"], s["store_errors"], s["unanswered"] }'
}

gateway_ticks() { # $1 = variant
  local pid total=0
  for pid in ${NODE_PIDS[$1]}; do total=$((total + $(cpu_ticks "$pid"))); done
  echo "$total"
}

# Moves the upstream's log of the run just ended to $1 (USR1: nginx flushes
# its buffer to the moved file and opens a new one).
rotate_admitted() {
  mv "$TMP/admitted.log" "$1"
  kill -USR1 "$UPSTREAM_PID"
  for _ in $(seq 1 100); do
    [ -e "$TMP/admitted.log" ] && break
    sleep 0.02
  done
  sleep 0.3 # the worker reopens after the master
}

CLK_TCK=$(getconf CLK_TCK)
RESULTS=$TMP/results.tsv
: >"$RESULTS"
FAILED=0

# One run: $1 = phase (load or light), $2 = variant, $3 = N, $4 = key set,
# $5 = round. Appends a line to $RESULTS; sets FAILED on a failed check.
measure() {
  local phase=$1 v=$2 n=$3 ks=$4 round=$5
  local conns keys capacity rate lease_slack=0 j pids=() out=$TMP/run
  if [ "$phase" = light ]; then conns=1; else conns=$((CONNS / n)); fi
  local dur=$DURATION
  [ "$phase" = light ] && dur=$LIGHT_DURATION
  if [ "$ks" = hot ]; then keys=1; capacity=$HOT_CAPACITY; rate=$HOT_RATE
  else keys=$ZIPF_KEYS; capacity=$ZIPF_CAPACITY; rate=$ZIPF_RATE; fi
  [ "$v" = tg_lease ] && lease_slack=$((n * LEASE))

  local st0 g0 r0 c0 t0 t1 st1 g1 r1 c1
  st0=$(status_counts "$v" "$n"); g0=$(gateway_ticks "$v")
  r0=$(cpu_ticks "$(redis_pid "$v")"); c0=$(redis_calls "$(redis_port "$v")")
  rm -f "$out".* # a run of more nodes left more files
  t0=$(date +%s.%N)
  for j in $(seq 0 $((n - 1))); do
    wrk -t1 -c"$conns" -d"${dur}s" -s bench/lua/fleet_wrk.lua \
      "http://127.0.0.1:$(node_port "$v" "$j")/$ks" -- "$keys" "$ZIPF_S" \
      "$((RANDOM * 32768 + RANDOM))" >"$out.$j" 2>&1 &
    pids+=($!)
  done
  for j in "${pids[@]}"; do wait "$j"; done
  t1=$(date +%s.%N)
  st1=$(status_counts "$v" "$n"); g1=$(gateway_ticks "$v")
  r1=$(cpu_ticks "$(redis_pid "$v")"); c1=$(redis_calls "$(redis_port "$v")")
  rotate_admitted "$TMP/admitted.run"

  # wrk: requests, non-2xx, socket errors; latency distributions merged.
  local total non2xx errors rps p50 p99
  total=$(cat "$out".* | awk '/requests in/ {n += $1} END {print n + 0}')
  non2xx=$(cat "$out".* | awk '/Non-2xx or 3xx responses:/ {n += $NF} END {print n + 0}')
  errors=$(cat "$out".* | awk '/Socket errors:/ {gsub(",", ""); n += $4 + $6 + $8 + $10} END {print n + 0}')
  rps=$(cat "$out".* | awk '/^Requests\/sec:/ {n += $2} END {printf "%.0f", n}')
  read -r p50 p99 < <(for j in $(seq 0 $((n - 1))); do
    awk -v w="$(awk '/requests in/ {print $1}' "$out.$j")" '$1 == "LAT" {print $3, w / 999}' "$out.$j"
  done | sort -n | awk '{ x[NR] = $1; c += $2; cum[NR] = c }
      END { for (i = 1; i <= NR; i++) { if (!a && cum[i] >= 0.50 * c) a = x[i]; if (!b && cum[i] >= 0.99 * c) b = x[i] }
            print a + 0, b + 0 }')

  # Checks: statuses, store errors, the upstream's count, each key's bound.
  local unexpected store_errors unanswered served allowed worst over
  unexpected=$(($(echo "$st1" | cut -d' ' -f1) - $(echo "$st0" | cut -d' ' -f1)))
  store_errors=$(($(echo "$st1" | cut -d' ' -f2) - $(echo "$st0" | cut -d' ' -f2)))
  unanswered=$(($(echo "$st0" | cut -d' ' -f3) + $(echo "$st1" | cut -d' ' -f3)))
  served=$(wc -l <"$TMP/admitted.run")
  allowed=$((total - non2xx))
  read -r worst over < <(awk -v cap="$capacity" -v rate="$rate" -v slack="$lease_slack" \
    -v t0="$t0" -v t1="$t1" '
      { n[$2]++ }
      END {
        bound = cap + rate * (t1 - t0) + slack + 1
        for (k in n) { r = n[k] / bound; if (r > worst) worst = r; if (n[k] > bound) over++ }
        printf "%.3f %d\n", worst, over
      }' "$TMP/admitted.run")
  local why=
  [ "$unexpected" = 0 ] || why="$why $unexpected responses neither 200 nor 429;"
  [ "$store_errors" = 0 ] || why="$why $store_errors store errors;"
  [ "$unanswered" = 0 ] || why="$why $unanswered scrapes of /metrics failed;"
  [ "$errors" = 0 ] || why="$why $errors socket errors;"
  [ "$total" -gt 0 ] || why="$why no responses;"
  if [ "$served" -lt "$allowed" ] || [ "$served" -gt $((allowed + CONNS)) ]; then
    why="$why the upstream served $served requests for $allowed 2xx;"
  fi
  [ "$over" = 0 ] || why="$why $over keys admitted beyond their bound (worst $worst of it);"
  if [ -n "$why" ]; then
    echo "FAILED $phase $v N=$n $ks round $round:$why" >&2
    if [ "$v" = ng_lua ]; then
      cat "$TMP"/ng-lua-*.unexpected | sort | uniq -c | sort -rn | head -5 >&2
    else
      for j in $(seq 0 $((n - 1))); do
        curl -s "http://127.0.0.1:$(admin_port "$v" "$j")/metrics" |
          grep -E '^tollgate_(requests_total|store_errors_total)' >&2 || true
      done
    fi
    FAILED=1
  fi
  awk -v ph="$phase" -v v="$v" -v n="$n" -v ks="$ks" -v r="$round" -v rps="$rps" \
    -v total="$total" -v den="$non2xx" -v g=$((g1 - g0)) -v rd=$((r1 - r0)) \
    -v c=$((c1 - c0)) -v p50="$p50" -v p99="$p99" -v worst="$worst" -v hz="$CLK_TCK" 'BEGIN {
      printf "%s\t%s\t%s\t%s\t%s\t%s\t%.3f\t%.2f\t%.2f\t%.4f\t%s\t%s\t%s\n", ph, v, n, ks, r, rps,
        den / total, g * 1e6 / hz / total, rd * 1e6 / hz / total, c / total, p50, p99, worst
    }' | tee -a "$RESULTS"
}

echo "# machine: nproc=$(nproc), CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $("$NGINX" -v 2>&1), $(redis-server --version | cut -d' ' -f1-3), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)"
echo "# tollgate: ${TOLLGATE#"$PWD"/}"
echo "# nodes: $NODES; key sets: $KEYSETS; variants: $VARIANTS; rounds=$ROUNDS"
echo "# load: one wrk -t1 -c\$((CONNS/N)) -d${DURATION}s per node, CONNS=$CONNS; light: -c1 -d${LIGHT_DURATION}s per node, zipf keys"
echo "# limits per key: /hot capacity $HOT_CAPACITY, $HOT_RATE/s; /zipf ($ZIPF_KEYS keys, s=$ZIPF_S) capacity $ZIPF_CAPACITY, $ZIPF_RATE/s; lease=$LEASE"
echo "# $(nproc) cores shared by the N gateways, Redis, N wrk and the upstream: decisions/s is the"
echo "# machine's bound, not Redis's; Redis CPU and calls per decision are the figures that carry over."
printf 'phase\tvariant\tN\tkeys\tround\tdec/s\tdenied\tgw_cpu_us/dec\tredis_cpu_us/dec\tredis_calls/dec\tp50_us\tp99_us\tworst_key/bound\n'
for round in $(seq 1 "$ROUNDS"); do
  for n in $NODES; do
    start_fleet "$n"
    for ks in $KEYSETS; do
      for v in $VARIANTS; do measure load "$v" "$n" "$ks" "$round"; done
    done
    if [ "$LIGHT_DURATION" != 0 ]; then
      for v in $VARIANTS; do measure light "$v" "$n" zipf "$round"; done
    fi
    stop_fleet
  done
done

echo
echo "# medians over $ROUNDS rounds [min-max]; +store p50/p99: the variant's latency minus tg_memory's"
echo "# (same N, key set, round), medians of those differences"
awk -F'\t' "$AWK_STATS"'
  {
    id = $1 SUBSEP $2 SUBSEP $3 SUBSEP $4
    if (!(id in seen)) { seen[id] = 1; order[++count] = id }
    rps[id] = rps[id] " " $6; den[id] = den[id] " " $7; g[id] = g[id] " " $8
    rd[id] = rd[id] " " $9; c[id] = c[id] " " $10; p50[id] = p50[id] " " $11
    p99[id] = p99[id] " " $12; w[id] = w[id] " " $13
    lat50[id, $5] = $11; lat99[id, $5] = $12; rounds[$5] = 1
    R[id, $5] = $6; CPU[id, $5] = $9
  }
  END {
    printf "%-5s %-9s %1s %-4s %-24s %6s %7s %-20s %-20s %9s %9s %11s %11s %6s\n", "phase", "variant", "N", "keys",
      "dec/s [range]", "denied", "gw_us", "redis_us/dec [range]", "calls/dec [range]", "p50_us", "p99_us",
      "+store_p50", "+store_p99", "worst"
    for (i = 1; i <= count; i++) {
      id = order[i]; split(id, f, SUBSEP)
      ref = f[1] SUBSEP "tg_memory" SUBSEP f[3] SUBSEP f[4]
      d50 = ""; d99 = ""
      if (f[2] != "tg_memory" && (ref in seen)) {
        for (r in rounds) if ((id, r) in lat50 && (ref, r) in lat50) {
          d50 = d50 " " (lat50[id, r] - lat50[ref, r]); d99 = d99 " " (lat99[id, r] - lat99[ref, r])
        }
      }
      printf "%-5s %-9s %1s %-4s %-24s %6.3f %7.2f %-20s %-20s %9.0f %9.0f %11s %11s %6.3f\n", f[1], f[2], f[3], f[4],
        median_range(rps[id], "%.0f"), median(den[id]), median(g[id]), median_range(rd[id], "%.2f"), median_range(c[id], "%.4f"),
        median(p50[id]), median(p99[id]),
        d50 == "" ? "-" : sprintf("%.0f", median(d50)), d99 == "" ? "-" : sprintf("%.0f", median(d99)),
        median(w[id])
    }
    print ""
    print "# tollgate / ng_lua, same N, key set and round (the median of the per-round ratios [min-max]):"
    for (i = 1; i <= count; i++) {
      id = order[i]; split(id, f, SUBSEP)
      if (f[2] !~ /^tg_(redis|lease|remember|cluster)$/) continue
      ref = f[1] SUBSEP "ng_lua" SUBSEP f[3] SUBSEP f[4]
      if (!(ref in seen)) continue
      qr = ""; qc = ""
      for (r in rounds) if ((id, r) in R && (ref, r) in R) {
        qr = qr " " R[id, r] / R[ref, r]
        if (CPU[ref, r] > 0) qc = qc " " CPU[id, r] / CPU[ref, r]
      }
      printf "%-5s %-10s N=%s %-4s: decisions/s %s, Redis CPU per decision %s\n", f[1], f[2], f[3], f[4],
        median_range(qr, "%.2f"), qc == "" ? "-" : median_range(qc, "%.2f")
    }
    print ""
    print "# one Redis core: decisions/s = 1e6 / Redis CPU us per decision; nodes = that / (dec/s / N)"
    for (i = 1; i <= count; i++) {
      id = order[i]; split(id, f, SUBSEP)
      if (f[1] != "load" || f[2] == "tg_memory") continue
      cpu = median(rd[id]); per_node = median(rps[id]) / f[3]
      if (cpu > 0) printf "%-9s N=%s %-4s: %9.0f decisions/s per Redis core, %5.1f nodes at %6.0f decisions/s each\n",
        f[2], f[3], f[4], 1e6 / cpu, 1e6 / cpu / per_node, per_node
    }
  }' "$RESULTS"

if [ "$FAILED" != 0 ]; then
  echo "FAILED: a check did not hold (see above)" >&2
  exit 1
fi
echo "# every check held: statuses 200/429 only, no store errors, every key within its bound"
