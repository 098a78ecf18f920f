#!/usr/bin/env bash
# Two tollgate binaries side by side, on the same path, with the load
# alternating between them: which one spends less CPU per request.
#
# bench/cpu_split.sh compares a binary with nginx; comparing two of our own
# builds with it means two runs, minutes apart, and a shared VM's slow
# minutes land on one of them. Here both binaries are up for the whole run
# (one worker each unless WORKERS says otherwise, configured as
# bench/load.sh configures tollgate, in
# front of the same nginx `return 200` upstream), and `wrk -t1 -cCONNS
# -dDURATION` drives A, then B, then A again, ROUNDS times. Per run it
# prints requests/s and the server's CPU time per request (utime + stime
# from /proc/PID/stat, over completed requests).
#
# Run:    bench/ab.sh BINARY_A BINARY_B
# Knobs:  MODE=allow|deny  ROUNDS=6  DURATION=5s  CONNS=64  BASE_PORT=18380
#         WORKERS=1 (each build's `workers`; 2 shares both cores with wrk)
#         SERVER_CPU=0.5 (cap each build alike, bench/common.sh)
#         (uses BASE_PORT .. BASE_PORT+2)
# Needs nginx and wrk (installed with apt-get when absent).
set -euo pipefail

MODE=${MODE:-allow}
ROUNDS=${ROUNDS:-6}
DURATION=${DURATION:-5s}
CONNS=${CONNS:-64}
WORKERS=${WORKERS:-1}
BASE_PORT=${BASE_PORT:-18380}
[ $# -eq 2 ] || { echo "usage: bench/ab.sh BINARY_A BINARY_B" >&2; exit 2; }
A=$(realpath "$1")
B=$(realpath "$2")
cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh
need_tools nginx wrk
start_scratch
CLK_TCK=$(getconf CLK_TCK)

PORT_UP=$BASE_PORT
upstream_conf "$PORT_UP" "$TMP" >"$TMP/upstream.conf"
start_upstream "$TMP/upstream.conf"
wait_port "$PORT_UP"

case $MODE in
  allow) CAPACITY=1000000 RATE="1000000/s" ;;
  deny) CAPACITY=1 RATE="1/m" ;;
  *) echo "MODE is allow or deny" >&2; exit 2 ;;
esac
tollgate_conf "$WORKERS" $((BASE_PORT + 1)) "$CAPACITY" "$RATE" "$PORT_UP" >"$TMP/a.toml"
tollgate_conf "$WORKERS" $((BASE_PORT + 2)) "$CAPACITY" "$RATE" "$PORT_UP" >"$TMP/b.toml"
TOLLGATE=$A start_tollgate "$TMP/a.toml"
PID_A=$STARTED
TOLLGATE=$B start_tollgate "$TMP/b.toml"
PID_B=$STARTED
wait_port $((BASE_PORT + 1))
wait_port $((BASE_PORT + 2))

# One run against the server $1 on port $2: "req/s cpu_us/req".
run() {
  local before after
  before=$(cpu_ticks "$1")
  wrk -t1 -c"$CONNS" -d"$DURATION" "http://127.0.0.1:$2/" >"$TMP/wrk.out"
  after=$(cpu_ticks "$1")
  check_statuses "$MODE" "$TMP/wrk.out" "http://127.0.0.1:$2/"
  awk -v d=$((after - before)) -v hz="$CLK_TCK" '
    /^Requests\/sec:/ {rps = $2} /requests in/ {n = $1}
    END {printf "%.0f\t%.2f", rps, (n > 0 ? d * 1e6 / hz / n : 0)}' "$TMP/wrk.out"
}

# Warm-up: pools, allocator caches.
wrk -t1 -c"$CONNS" -d2s "http://127.0.0.1:$((BASE_PORT + 1))/" >/dev/null
wrk -t1 -c"$CONNS" -d2s "http://127.0.0.1:$((BASE_PORT + 2))/" >/dev/null

echo "# A: $A"
echo "# B: $B"
echo "# MODE=$MODE, workers=$WORKERS, wrk -t1 -c$CONNS -d$DURATION, alternating, $ROUNDS rounds"
printf 'round\tA_req/s\tA_cpu_us/req\tB_req/s\tB_cpu_us/req\n'
: >"$TMP/rounds"
for round in $(seq 1 "$ROUNDS"); do
  # One substitution per assignment: the status of an assignment is its
  # last substitution's, so A's failed check would pass unseen beside B's.
  a=$(run "$PID_A" $((BASE_PORT + 1)))
  b=$(run "$PID_B" $((BASE_PORT + 2)))
  echo "$round	$a	$b" | tee -a "$TMP/rounds"
done
awk -F'\t' "$AWK_STATS"'
  {ra = ra " " $2; ca = ca " " $3; rb = rb " " $4; cb = cb " " $5}
  END {
    printf "median\t%.0f\t%.2f\t%.0f\t%.2f\n", median(ra), median(ca), median(rb), median(cb)
    printf "B/A: req/s %.3f, cpu/req %.3f\n", median(rb) / median(ra), median(cb) / median(ca)
  }' "$TMP/rounds"
