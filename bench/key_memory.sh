#!/usr/bin/env bash
# Memory per live limiter key, black-box: RSS growth of a real `tollgate run`
# per key it holds, beside nginx `limit_req` keyed the same way, same run.
#
# tollgate (`workers = 1` by default, memory store) has one limit,
# `per_key`: a token bucket keyed on `header:x-api-key`, capacity 1 refilled
# 1/h (a key charged once is not fresh again for an hour: the sweep, every
# 10 s, cannot drop any), `max_keys` = 4,000,000. nginx (1 worker) has
# `limit_req_zone $http_x_api_key` of ZONE (256m: ~128 bytes a key, the slab
# class of its node) at 1r/m, `burst=ANCHOR_BURST nodelay` (a setting of the
# location, not of a node: a node's size is the same at any burst, and a key
# sent once is answered 200 at any burst). Both proxy to nginx `return 200`,
# which marks its answers to `/` with `x-bench-key` (bench/lua/
# distinct_keys.lua counts those); `/free` goes through both without a
# limit.
#
# For each server: WARM keys (`warm-1` ..) first, so that buffers, the
# upstream pool and the allocator's caches are in place; then its RSS
# (VmRSS of tollgate's process; of nginx's worker, which is where the zone's
# pages are touched, and the zone mapping's own Rss from /proc/PID/smaps);
# then KEYS distinct keys (`key-1` ..) in steps of STEP, each step one wrk
# run (-t1 -cCONNS, DEPTH requests a write) that stops at its STEP-th keyed
# answer, and the RSS after each step. A step fails unless every answer was
# a 200 and exactly STEP were keyed; for tollgate, unless
# `tollgate_limiter_keys{limit="per_key"}` (admin /metrics) is then WARM +
# the keys sent so far, and at the end unless the oldest key, `warm-1`, is
# still refused (429).
#
# nginx has no such count, and drops a node once it is a minute past its
# last use with its excess drained: at 1r/m (the slowest rate nginx takes)
# a key charged once may go a minute later, so a run longer than a minute
# could count freed nodes as live (on a busy 2-core machine nginx took 84 s
# for 1,000,000 keys). But nginx only ever expires its least-recently-used
# node, the tail of its queue, and stops at the first that may not go
# (ngx_http_limit_req_expire; a forced expiry, when the zone is full, takes
# the tail too). So before any other key nginx gets the key `anchor`
# ANCHOR_BURST + 1 times: its node, the tail from then on, holds
# ANCHOR_BURST requests of excess, which drain at 1r/m over ANCHOR_BURST
# minutes, and while it is held no node can go. At the end the anchor must
# still be held, shown by a 429 within ANCHOR_BURST + 1 more requests for it
# (a new node would pass them all): the run may take up to ANCHOR_BURST
# minutes.
#
# Prints, per step: keys, RSS growth in MiB and bytes per key for tollgate,
# nginx's worker and nginx's zone mapping.
#
# Run:    bench/key_memory.sh [BINARY]   (default: target/dist/tollgate,
#                                         built unless SKIP_BUILD=1)
# Knobs:  KEYS=1000000 STEP=100000 WARM=5000 CONNS=64 DEPTH=1 (requests
#         pipelined a write) WORKERS=1 ZONE=256m ANCHOR_BURST=20
#         BASE_PORT=18480 (uses BASE_PORT .. BASE_PORT+3)
set -euo pipefail

KEYS=${KEYS:-1000000}
STEP=${STEP:-100000}
WARM=${WARM:-5000}
CONNS=${CONNS:-64}
DEPTH=${DEPTH:-1}
ANCHOR_BURST=${ANCHOR_BURST:-20}
WORKERS=${WORKERS:-1}
ZONE=${ZONE:-256m}
BASE_PORT=${BASE_PORT:-18480}
cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh
need_tools nginx wrk curl

if [ $# -eq 0 ]; then
  build_release
  set -- "$PWD/target/dist/tollgate"
fi
TOLLGATE=$1
LUA=$PWD/bench/lua/distinct_keys.lua

start_scratch

PORT_UP=$BASE_PORT
PORT_TG=$((BASE_PORT + 1))
PORT_ADMIN=$((BASE_PORT + 2))
PORT_NG=$((BASE_PORT + 3))

# The upstream: bench/common.sh's, its answers to `/` marked.
upstream_conf "$PORT_UP" "$TMP" |
  sed 's|    location / { return 200 "ok\\n"; }|    location / { add_header x-bench-key 1; return 200 "ok\\n"; }\n    location /free { return 200 "ok\\n"; }|' \
    >"$TMP/upstream.conf"
grep -q x-bench-key "$TMP/upstream.conf" || { echo "upstream config not marked" >&2; exit 1; }
start_upstream "$TMP/upstream.conf"
wait_port "$PORT_UP"

cat >"$TMP/tollgate.toml" <<CONF
[server]
listen = "127.0.0.1:$PORT_TG"
admin = "127.0.0.1:$PORT_ADMIN"
workers = $WORKERS

[upstreams.up]
url = "http://127.0.0.1:$PORT_UP"

[limits.per_key]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 1
refill = "1/h"
max_keys = 4000000

[[routes]]
name = "free"
match = { path_prefix = "/free" }
upstream = "up"

[[routes]]
name = "all"
match = { path_prefix = "/" }
upstream = "up"
limits = ["per_key"]
CONF

cat >"$TMP/nginx.conf" <<CONF
daemon off;
worker_processes 1;
pid $TMP/ng.pid;
error_log $TMP/ng.err crit;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 10000000;
  limit_req_zone \$http_x_api_key zone=keys:$ZONE rate=1r/m;
  limit_req_status 429;
  upstream up {
    server 127.0.0.1:$PORT_UP;
    keepalive 64;
    keepalive_requests 10000000;
  }
  server {
    listen 127.0.0.1:$PORT_NG;
    location / {
      limit_req zone=keys burst=$ANCHOR_BURST nodelay;
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
    location /free {
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
CONF

# VmRSS of pid $1, in bytes.
rss() { awk '/^VmRSS:/ {print $2 * 1024}' "/proc/$1/status"; }

# Rss of nginx's zone (the shared anonymous mapping of pid $1 at least as
# large as the zone), in bytes.
zone_rss() {
  awk -v min="$ZONE_BYTES" '
    /^[0-9a-f]+-[0-9a-f]+ / { shared = ($0 ~ /zero|SYSV|shm/); inzone = 0 }
    shared && /^Size:/ { inzone = ($2 * 1024 >= min) }
    inzone && /^Rss:/ { total += $2 * 1024 }
    END { print total + 0 }' "/proc/$1/smaps"
}

# Sends COUNT ($3) new keys PREFIX ($4) FIRST+1 .. ($2) to port $1; fails
# unless every answer was a 200 and COUNT were keyed.
send_keys() {
  local out=$TMP/wrk.out marker=$TMP/stopped pid
  rm -f "$marker"
  wrk -t1 -c"$CONNS" -d600s --timeout 10s -s "$LUA" "http://127.0.0.1:$1" -- "$2" "$3" "$4" "$marker" "$DEPTH" >"$out" &
  pid=$!
  # The script stops its thread at the last keyed answer, but wrk's main
  # thread sleeps for the whole -d: SIGINT ends it once the thread is done.
  while [ ! -e "$marker" ] && kill -0 "$pid" 2>/dev/null; do sleep 0.1; done
  sleep 0.2
  kill -INT "$pid" 2>/dev/null || true
  wait "$pid"
  check_statuses allow "$out"
  grep -q "^keyed=$3 bad=0\$" "$out" || {
    echo "port $1, keys $4$(($2 + 1)) .. $4$(($2 + $3)): $(grep '^keyed=' "$out" || echo 'no counts')" >&2
    exit 1
  }
}

# tollgate_limiter_keys{limit="per_key"} from the admin listener.
live_keys() {
  curl -s "http://127.0.0.1:$PORT_ADMIN/metrics" |
    awk '/^tollgate_limiter_keys\{limit="per_key"\}/ {print $2}'
}

# The status of one more request for `warm-1` on port $1.
oldest_status() {
  curl -s -o /dev/null -w '%{http_code}' -H 'x-api-key: warm-1' "http://127.0.0.1:$1/"
}

# Sends `anchor` to nginx (port $1) ANCHOR_BURST + 1 times; fails unless
# each was a 200.
set_anchor() {
  local i status
  for i in $(seq $((ANCHOR_BURST + 1))); do
    status=$(curl -s -o /dev/null -w '%{http_code}' -H 'x-api-key: anchor' "http://127.0.0.1:$1/")
    [ "$status" = 200 ] || { echo "anchor request $i: $status, not 200" >&2; exit 1; }
  done
}

# Whether nginx (port $1) still holds the anchor's node: a 429 within
# ANCHOR_BURST + 1 requests for it (a new node would pass them all).
anchor_held() {
  local i
  for i in $(seq $((ANCHOR_BURST + 1))); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' -H 'x-api-key: anchor' "http://127.0.0.1:$1/")" = 429 ] && return 0
  done
  return 1
}

ZONE_BYTES=$(awk -v z="$ZONE" 'BEGIN { n = z + 0; u = substr(z, length(z)); if (u == "m") n *= 1048576; else if (u == "k") n *= 1024; else if (u == "g") n *= 1073741824; print n }')
RESULTS=$TMP/results.tsv
: >"$RESULTS"

echo "# machine: nproc=$(nproc); $("$NGINX" -v 2>&1); $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)"
echo "# $KEYS keys in steps of $STEP after $WARM warm-up keys; wrk -t1 -c$CONNS, $DEPTH requests a write; tollgate workers = $WORKERS; nginx zone $ZONE"

# ---- tollgate ------------------------------------------------------------------
start_tollgate "$TMP/tollgate.toml"
TG=$STARTED
wait_port "$PORT_TG"
wait_port "$PORT_ADMIN"
tg_started_at=$(date +%s)
send_keys "$PORT_TG" 0 "$WARM" warm-
base=$(rss "$TG")
sent=0
while [ "$sent" -lt "$KEYS" ]; do
  send_keys "$PORT_TG" "$sent" "$STEP" key-
  sent=$((sent + STEP))
  live=$(live_keys)
  [ "$live" = $((WARM + sent)) ] || {
    echo "tollgate holds $live keys, expected $((WARM + sent))" >&2
    exit 1
  }
  printf 'tollgate\t%s\t%s\n' "$sent" $(($(rss "$TG") - base)) >>"$RESULTS"
done
[ "$(oldest_status "$PORT_TG")" = 429 ] || { echo "tollgate no longer holds warm-1" >&2; exit 1; }
tg_elapsed=$(($(date +%s) - tg_started_at))
stop "$TG"

# ---- nginx limit_req -------------------------------------------------------------
start_nginx "$TMP/nginx.conf"
NG=$STARTED
wait_port "$PORT_NG"
WORKER=$(pgrep -P "$NG" | head -1)
started_at=$(date +%s)
set_anchor "$PORT_NG"
send_keys "$PORT_NG" 0 "$WARM" warm-
base=$(rss "$WORKER")
zone_base=$(zone_rss "$WORKER")
sent=0
while [ "$sent" -lt "$KEYS" ]; do
  send_keys "$PORT_NG" "$sent" "$STEP" key-
  sent=$((sent + STEP))
  printf 'nginx\t%s\t%s\n' "$sent" $(($(rss "$WORKER") - base)) >>"$RESULTS"
  printf 'zone\t%s\t%s\n' "$sent" $(($(zone_rss "$WORKER") - zone_base)) >>"$RESULTS"
done
elapsed=$(($(date +%s) - started_at))
anchor_held "$PORT_NG" || {
  echo "nginx's run took ${elapsed}s and its anchor is gone: its oldest nodes may have expired; lower KEYS or raise ANCHOR_BURST" >&2
  exit 1
}
stop "$NG"

# ---- summary ---------------------------------------------------------------------
echo "tollgate's run: ${tg_elapsed}s; nginx's run: ${elapsed}s; every answer checked (200, keyed), tollgate's live keys matched each step, nginx's anchor held (no node expired)"
awk -F'\t' '
  { grown[$1, $2] = $3; if (!($2 in seen)) { seen[$2] = 1; order[++n] = $2 } }
  END {
    printf "%9s  %22s  %22s  %22s\n", "keys", "tollgate MiB  B/key", "nginx worker MiB  B/key", "nginx zone MiB  B/key"
    for (i = 1; i <= n; i++) {
      k = order[i]
      printf "%9d  %12.1f %9.1f  %12.1f %9.1f  %12.1f %9.1f\n", k,
        grown["tollgate", k] / 1048576, grown["tollgate", k] / k,
        grown["nginx", k] / 1048576, grown["nginx", k] / k,
        grown["zone", k] / 1048576, grown["zone", k] / k
    }
  }' "$RESULTS"
