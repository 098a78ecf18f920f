#!/usr/bin/env bash
# How the decision service (`[decision] listen`) scales with the workers:
# gRPC `ShouldRateLimit` decisions per second and `/auth` decisions per
# second at `workers = 2` against `workers = 1` (the issue's target: ≥ 1.7×).
#
# Two tollgates run side by side, the same configuration but for `workers`
# (bench/decision.sh's decision listener: domain `edge`, descriptor
# `remote_address` -> the never-denying bucket per_ip_rls; `/auth` deciding
# by route `all`, limit per_ip, the same bucket; memory store). Targets,
# interleaved w1 w2 w1 w2 ... ROUNDS times so noise hits both alike:
#   grpc   h2load POSTs bench/decision.sh's call (one descriptor
#          remote_address=10.0.0.1, so one key) over h2c: every answer OK
#   auth   wrk GETs /auth with nginx's headers (X-Original-Method GET,
#          X-Original-URI /, X-Real-IP 10.0.0.1: one key): every answer 200
# Both clients keep H2_CLIENTS x H2_STREAMS (gRPC) or CONNS (wrk)
# requests in flight, many connections, so the kernel spreads them over the
# workers' SO_REUSEPORT sockets.
#
# Pinning: `workers = 1` runs on W1_CPUS (default 0), `workers = 2` on
# W2_CPUS (default 0,1), the client on CLIENT_CPUS (default 1). On a
# machine with more cores set them apart (W2_CPUS=0,1 CLIENT_CPUS=2); with
# two cores the client of the `workers = 2` runs necessarily shares a core
# with one worker, and the ratio is capped below 2× by the client's own
# share. So each run also gives the server's CPU time per decision (utime +
# stime of the whole process over the decisions), which does not depend on
# how many cores it had: if it stays the same at two workers, nothing in the
# server serialises; what is missing from 2× is the cores.
#
# Each run fails the bench (exit 1) unless every answer is what it should
# be (h2load: no stream error, no timeout, every status 2xx; wrk: no
# socket error, every status 2xx) and tollgate's own counters (admin
# /metrics) show as many allowed decisions of the target's front as the
# client completed (within the requests in flight).
#
# Run:    bench/decision_workers.sh          (builds target/dist/tollgate)
# Knobs:  DURATION=5s ROUNDS=3 CONNS=64 H2_CLIENTS=4 H2_STREAMS=16
#         W1_CPUS=0 W2_CPUS=0,1 CLIENT_CPUS=1 TARGETS="grpc auth"
#         BASE_PORT=20480 (uses BASE_PORT .. BASE_PORT+5)
#         SKIP_BUILD=1 (use target/dist/tollgate), TOLLGATE=path (another binary)
set -euo pipefail

DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-64}
H2_CLIENTS=${H2_CLIENTS:-4}
H2_STREAMS=${H2_STREAMS:-16}
W1_CPUS=${W1_CPUS:-0}
W2_CPUS=${W2_CPUS:-0,1}
CLIENT_CPUS=${CLIENT_CPUS:-1}
BASE_PORT=${BASE_PORT:-20480}
TARGETS=${TARGETS:-grpc auth}

cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh
need_tools wrk curl h2load
if [ -z "${TOLLGATE:-}" ]; then
  build_release
  TOLLGATE=$PWD/target/dist/tollgate
fi
start_scratch
for port in $(seq "$BASE_PORT" $((BASE_PORT + 5))); do port_free "$port"; done
GRPC_PATH=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit

# The gRPC call, as bench/decision.sh makes it: RateLimitRequest { 1:
# domain "edge", 2: RateLimitDescriptor { 1: Entry { 1: "remote_address",
# 2: "10.0.0.1" } } }, gRPC-framed (0, the length as 4 bytes big endian).
hex_of() { printf %s "$1" | od -An -tx1 -v | tr -d ' \n'; }
pb_field() { # field number $1, payload $2 (hex, under 128 bytes)
  printf '%02x%02x%s' $((($1 << 3) | 2)) $((${#2} / 2)) "$2"
}
entry=$(pb_field 1 "$(hex_of remote_address)")$(pb_field 2 "$(hex_of 10.0.0.1)")
request=$(pb_field 1 "$(hex_of edge)")$(pb_field 2 "$(pb_field 1 "$entry")")
# shellcheck disable=SC2059 # the format is the bytes, as \xHH escapes
printf "$(printf '00%08x%s' $((${#request} / 2)) "$request" | sed 's/../\\x&/g')" >"$TMP/call.grpc"

# tollgate with `workers = $1`: proxy listener on $2 (unused), decision
# listener on $3, admin on $4. The upstream is never asked (/auth decides
# only).
gateway_conf() {
  tollgate_conf "$1" "$2" 1000000 "1000000/s" "$BASE_PORT" |
    awk -v admin="admin = \"127.0.0.1:$4\"" '{ print } /^workers = / { print admin }'
  cat <<CONF

# /auth is asked from 127.0.0.1 with the client in X-Real-IP.
[client_ip]
trusted_cidrs = ["127.0.0.0/8"]

[decision]
listen = "127.0.0.1:$3"

[limits.per_ip_rls]
algorithm = "token_bucket"
capacity = 1000000
refill = "1000000/s"

[[decision.descriptors]]
domain = "edge"
match = [{ key = "remote_address" }]
limits = ["per_ip_rls"]
CONF
}

declare -A DECISION_PORT ADMIN_PORT PID CPUS
for workers in 1 2; do
  base=$((BASE_PORT + 1 + (workers - 1) * 3))
  DECISION_PORT[$workers]=$((base + 1))
  ADMIN_PORT[$workers]=$((base + 2))
  gateway_conf "$workers" "$base" $((base + 1)) $((base + 2)) >"$TMP/w$workers.toml"
  [ "$workers" = 1 ] && CPUS[$workers]=$W1_CPUS || CPUS[$workers]=$W2_CPUS
  SERVER_CPUSET=${CPUS[$workers]} start_tollgate "$TMP/w$workers.toml"
  PID[$workers]=$STARTED
  for port in "$base" $((base + 1)) $((base + 2)); do
    (wait_port "$port") || { cat "$TMP/w$workers.toml.err" >&2; exit 1; }
  done
done

# Every target answers as it should before anything is measured.
for workers in 1 2; do
  code=$(curl -s -o /dev/null -w '%{http_code}' -H 'X-Original-Method: GET' -H 'X-Original-URI: /' \
    -H 'X-Real-IP: 10.0.0.1' "http://127.0.0.1:${DECISION_PORT[$workers]}/auth")
  [ "$code" = 200 ] || { echo "workers = $workers: /auth answers $code, not 200" >&2; exit 1; }
  status=$(curl -s --http2-prior-knowledge -H 'content-type: application/grpc' -H 'te: trailers' \
    --data-binary "@$TMP/call.grpc" -o /dev/null -D - "http://127.0.0.1:${DECISION_PORT[$workers]}$GRPC_PATH" |
    tr -d '\r' | awk -F': ' 'tolower($1) == "grpc-status" {print $2}')
  [ "$status" = 0 ] || { echo "workers = $workers: the gRPC call is answered grpc-status '$status', not 0" >&2; exit 1; }
done

# tollgate $1's count of allowed decisions of front $2.
counted() {
  curl -s "http://127.0.0.1:${ADMIN_PORT[$1]}/metrics" |
    awk -v front="front=\"$2\"" 'index($0, front) && index($0, "outcome=\"allowed\"") &&
      $1 ~ /^tollgate_ratelimit_decisions_total/ {n += $NF} END {print n + 0}'
}

# Drives target $1 against tollgate $2 for $3, the client's output in $TMP/run.out.
drive() {
  local url="http://127.0.0.1:${DECISION_PORT[$2]}"
  case $1 in
    grpc)
      taskset -c "$CLIENT_CPUS" h2load -c"$H2_CLIENTS" -m"$H2_STREAMS" -D"${3%s}" -d "$TMP/call.grpc" \
        -H 'content-type: application/grpc' -H 'te: trailers' "$url$GRPC_PATH" >"$TMP/run.out"
      ;;
    auth)
      taskset -c "$CLIENT_CPUS" wrk -t1 -c"$CONNS" -d"$3" -H 'X-Original-Method: GET' \
        -H 'X-Original-URI: /' -H 'X-Real-IP: 10.0.0.1' "$url/auth" >"$TMP/run.out"
      ;;
  esac
}

# Busy jiffies and all jiffies of every CPU (bench/decision.sh's).
cpu_jiffies() {
  awk '/^cpu[0-9]/ { t = 0; for (i = 2; i <= NF; i++) t += $i; printf "%s %d %d ", $1, t - $5 - $6, t }' /proc/stat
}
busy_share() {
  awk -v a="$1" -v b="$2" 'BEGIN {
    n = split(a, x, " "); split(b, y, " "); s = ""
    for (i = 1; i <= n; i += 3) s = s (s == "" ? "" : "/") sprintf("%.2f", (y[i + 2] - x[i + 2]) ? (y[i + 1] - x[i + 1]) / (y[i + 2] - x[i + 2]) : 0)
    print s
  }'
}

CLK_TCK=$(getconf CLK_TCK)
RESULTS=$TMP/results.tsv
: >"$RESULTS"

# One measured run: target $1, workers $2, round $3.
measure() {
  local target=$1 workers=$2 round=$3 out=$TMP/run.out front rps requests decided slack
  local before after ticks_before ticks_after cpus_before cpus_after
  [ "$target" = grpc ] && front=rls || front=auth
  before=$(counted "$workers" "$front")
  ticks_before=$(cpu_ticks "${PID[$workers]}")
  cpus_before=$(cpu_jiffies)
  drive "$target" "$workers" "$DURATION"
  cpus_after=$(cpu_jiffies)
  ticks_after=$(cpu_ticks "${PID[$workers]}")
  after=$(counted "$workers" "$front")
  if [ "$target" = grpc ]; then
    slack=$((H2_CLIENTS * H2_STREAMS))
    awk -v slack="$slack" '
      /^requests:/ { seen = 1; succeeded = $8; failed = $10; errored = $12; timeout = $14 }
      /^status codes:/ { other = $5 + $7 + $9 }
      END {
        if (!seen) { print "grpc: no h2load summary" > "/dev/stderr"; exit 1 }
        # With -D, the streams still open at the end count as failed.
        if (errored + timeout > 0 || failed - errored > slack || other > 0 || succeeded == 0) {
          printf "grpc: %d succeeded, %d failed (%d errored, %d timed out), %d not 2xx\n", \
            succeeded, failed, errored, timeout, other > "/dev/stderr"
          exit 1
        }
      }' "$out" || exit 1
    rps=$(awk '/^finished in/ {print $4}' "$out")
    requests=$(awk '/^requests:/ {print $8}' "$out")
  else
    slack=$CONNS
    check_statuses allow "$out"
    rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
    requests=$(awk '/requests in/ {print $1}' "$out")
  fi
  decided=$((after - before))
  if [ "${requests:-0}" -eq 0 ] || [ "$decided" -lt "$requests" ] || [ "$decided" -gt $((requests + slack)) ]; then
    echo "$target, workers = $workers: the client completed ${requests:-0} requests, tollgate counted $decided allowed decisions (front $front)" >&2
    exit 1
  fi
  awk -v t="$target" -v w="$workers" -v r="$round" -v rps="$rps" -v n="$requests" -v hz="$CLK_TCK" \
    -v ticks=$((ticks_after - ticks_before)) -v busy="$(busy_share "$cpus_before" "$cpus_after")" 'BEGIN {
      printf "%s\t%s\t%s\t%.0f\t%.2f\t%s\n", t, w, r, rps, ticks * 1e6 / hz / n, busy
    }' | tee -a "$RESULTS"
}

echo "# machine: nproc=$(nproc), CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# tollgate: $TOLLGATE"
echo "# workers = 1 on CPU $W1_CPUS, workers = 2 on CPUs $W2_CPUS, the client on CPU $CLIENT_CPUS"
echo "# h2load -c$H2_CLIENTS -m$H2_STREAMS -D${DURATION%s}; wrk -t1 -c$CONNS -d$DURATION; rounds=$ROUNDS"
# Warm-up: every target once on each, unmeasured.
for target in $TARGETS; do for workers in 1 2; do drive "$target" "$workers" 1s; done; done
printf 'target\tworkers\tround\tdecisions/s\tserver_us/decision\tcpu_busy\n'
for round in $(seq 1 "$ROUNDS"); do
  for target in $TARGETS; do
    for workers in 1 2; do measure "$target" "$workers" "$round"; done
  done
done

# Medians with their range; the ratio of the medians with each round's own.
echo
echo "# median [range] over $ROUNDS rounds"
awk -F'\t' -v rounds="$ROUNDS" "$AWK_STATS"'
  { rps[$1, $2] = rps[$1, $2] " " $4; us[$1, $2] = us[$1, $2] " " $5; R[$1, $2, $3] = $4; U[$1, $2, $3] = $5; ran[$1] = 1 }
  END {
    split("grpc auth", order, " ")
    for (i = 1; i <= 2; i++) {
      t = order[i]
      if (!(t in ran)) continue
      for (w = 1; w <= 2; w++)
        printf "%s workers = %d: %s decisions/s, %s us of server CPU per decision\n", t, w, \
          median_range(rps[t, w], "%.0f"), median_range(us[t, w], "%.2f")
      s = ""; c = ""
      for (r = 1; r <= rounds; r++) { s = s sprintf(" %.2f", R[t, 2, r] / R[t, 1, r]); c = c sprintf(" %.2f", U[t, 2, r] / U[t, 1, r]) }
      printf "%s: workers = 2 / workers = 1, decisions/s %.2f (target >= 1.70; rounds%s); server CPU per decision %.2f (rounds%s)\n", t, \
        median(rps[t, 2]) / median(rps[t, 1]), s, median(us[t, 2]) / median(us[t, 1]), c
    }
  }' "$RESULTS"
