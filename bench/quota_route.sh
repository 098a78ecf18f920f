#!/usr/bin/env bash
# The self-service quota route's cost (issue 46's measure): CPU per request
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
start_tollgate "$TMP/gateway.toml"
GW=$STARTED
wait_port "$PORT"
# The key's one token spent: /api refuses it from now on.
curl -s -o /dev/null -H 'x-api-key: k' "http://127.0.0.1:$PORT/api"

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
