#!/usr/bin/env bash
# The self-service quota route's cost (the quota control plane's measure): CPU per request
# of `respond = { quota = [...] }`, against a denied request of the same
# limit (the target: the quota route costs no more than a denial), on one
# gateway (`workers = 1`) in the same run, ROUNDS interleaved rounds.
#
#   bench/quota_route.sh            # builds `dist` (SKIP_BUILD=1: don't)
#
# Each run is wrk -t1 -c16 for RUN_SECONDS (5) against one path with one API key:
# /quota (200, the caller's JSON) and /api with a key whose 1/h budget is
# spent (429). CPU per request = the gateway's CPU ticks (utime + stime)
# over the run / the requests wrk counted. Every response's status is
# checked (quota: 2xx only; deny: 429 only); a socket error fails the bench.
#
# CALLGRIND=1 counts user-space instructions per request instead (as
# bench/instructions.sh does, robust to a busy machine): the gateway runs
# under valgrind's callgrind with instrumentation off, and each path's run
# is counted on its own (instrumentation on, wrk, a dump, off), one round.
# KEEP_DUMPS=DIR keeps the two dumps there (quota, deny) for
# `callgrind_annotate`.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
source bench/common.sh
need_tools wrk curl
build_release
TOLLGATE=$(realpath "${TOLLGATE:-target/dist/tollgate}")
SECONDS_PER_RUN=${RUN_SECONDS:-5}
ROUNDS=${ROUNDS:-3}
PORT=${BASE_PORT:-18720}
start_scratch

cat >"$TMP/gateway.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
workers = 1

[limits.per_key]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 1
refill = "1/h"

[[routes]]
name = "quota"
match = { path = "/quota" }
respond = { quota = ["per_key"] }

[[routes]]
name = "api"
match = { path = "/api" }
respond = { status = 200, body = "ok" }
limits = ["per_key"]
TOML
CALLGRIND=${CALLGRIND:-0}
if [ "$CALLGRIND" = 1 ]; then
  need_tools valgrind
  TOLLGATE_LOG=warn valgrind --tool=callgrind --instr-atstart=no \
    --callgrind-out-file="$TMP/cg.%p" "$TOLLGATE" run -c "$TMP/gateway.toml" >"$TMP/cg.log" 2>&1 &
  GW=$!
  PIDS+=("$GW")
else
  start_tollgate "$TMP/gateway.toml"
  GW=$STARTED
fi
wait_port "$PORT"
# The key's one token spent: /api refuses it from now on.
curl -s -o /dev/null -H 'x-api-key: k' "http://127.0.0.1:$PORT/api"

if [ "$CALLGRIND" = 1 ]; then
  # Both paths warmed up uncounted; then counted from here on, each run
  # dumped on its own (a dump zeroes the counts; callgrind numbers its
  # dumps from 1, in order).
  for path in /quota /api; do
    wrk -t1 -c16 -d2s -H 'x-api-key: k' "http://127.0.0.1:$PORT$path" >/dev/null
  done
  callgrind_control -i on "$GW" >/dev/null 2>&1
  counted() { # $1 = name, $2 = path, $3 = allow|deny, $4 = dump number
    local out="$TMP/$1.wrk" dump total
    wrk -t1 -c16 -d"${SECONDS_PER_RUN}s" -H 'x-api-key: k' "http://127.0.0.1:$PORT$2" >"$out"
    callgrind_control -d "$GW" >/dev/null 2>&1
    sleep 0.5
    dump=$(ls "$TMP"/cg.*."$4")
    if [ -n "${KEEP_DUMPS:-}" ]; then
      mkdir -p "$KEEP_DUMPS"
      cp "$dump" "$KEEP_DUMPS/$1"
    fi
    total=$(grep -m1 '^summary:' "$dump" | awk '{print $2}')
    awk -v t="$total" -v name="$1" '/requests in/ { printf "%s\t%d\n", name, t / $1 }' "$out"
  }
  quota=$(counted quota /quota allow 1 | cut -f2)
  check_statuses allow "$TMP/quota.wrk" "http://127.0.0.1:$PORT/quota" -H 'x-api-key: k'
  deny=$(counted deny /api deny 2 | cut -f2)
  check_statuses deny "$TMP/deny.wrk" "http://127.0.0.1:$PORT/api" -H 'x-api-key: k'
  printf 'Instructions per request (callgrind, one run each):\n'
  printf '  quota route   %s\n' "$quota"
  printf '  denied        %s\n' "$deny"
  awk -v q="$quota" -v d="$deny" 'BEGIN { printf "  quota / deny  %.2f\n", q / d }'
  exit 0
fi

HZ=$(getconf CLK_TCK)
run() { # $1 = name, $2 = path, $3 = allow|deny
  local before after out="$TMP/$1.wrk"
  before=$(cpu_ticks "$GW")
  wrk -t1 -c16 -d"${SECONDS_PER_RUN}s" -H 'x-api-key: k' "http://127.0.0.1:$PORT$2" >"$out"
  after=$(cpu_ticks "$GW")
  check_statuses "$3" "$out" "http://127.0.0.1:$PORT$2" -H 'x-api-key: k'
  awk -v t=$((after - before)) -v hz="$HZ" -v name="$1" '/requests in/ {
    printf "%s\t%.2f\n", name, t / hz * 1e6 / $1 }' "$out"
}
for _ in $(seq "$ROUNDS"); do
  run quota /quota allow
  run deny /api deny
done >"$TMP/runs"
awk -F'\t' "$AWK_STATS"'
  { us[$1] = us[$1] " " $2 }
  END {
    printf "CPU per request (µs, median [range] of %d rounds):\n", NR / 2
    printf "  quota route   %s\n", median_range(us["quota"], "%.2f")
    printf "  denied        %s\n", median_range(us["deny"], "%.2f")
    printf "  quota / deny  %.2f\n", median(us["quota"]) / median(us["deny"])
  }' "$TMP/runs"
