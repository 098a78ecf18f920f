#!/usr/bin/env bash
# Loads per request that cannot be forwarded from a store still in flight,
# tollgate against nginx `limit_req`, allowed and denied.
#
# callgrind counts instructions, and a load that must wait for the stores
# it reads to reach the cache counts as one, though it costs about a dozen
# cycles. Rust moves a value by storing its fields one at a time and then
# copying it on in wider pieces (a `memcpy`, 16-byte loads): when the copy
# reads the value right after it was built, the loads span several stores
# still in the store buffer and cannot take their bytes from it. This found
# why the limiter's decision was slower than `5bdeb93`'s with fewer
# instructions (BENCHMARKS.md, "Limiter decisions").
#
# For each server it runs it under `valgrind --tool=lackey --trace-mem=yes`
# (every instruction, load and store, with its address and size), piped
# into bench/store_forwarding.py, twice: once for $FEW and once for $MANY
# requests sent one after another on one keep-alive connection, every
# status checked (200 allowed, 429 denied). The difference of the two runs
# over the difference of the requests is per request: start-up and
# shutdown cancel out. A store counts as in flight for $WINDOW instructions.
#
# The configurations are bench/instructions.sh's: tollgate (`workers = 1`)
# with a never-denying or always-denying token bucket in front of nginx
# `return 200`; the peer nginx `limit_req`, one process.
#
# Run:    bench/store_forwarding.sh [BINARY ...]  (default: target/dist/tollgate,
#                                                 built unless SKIP_BUILD=1)
# Knobs:  BASE_PORT=18720 (uses BASE_PORT .. BASE_PORT+4)  FEW=200  MANY=600
#         WINDOW=32  TOP=25 (sites listed per server and path, with
#         KEEP_DUMPS=DIR: the report of each goes to DIR/NAME-allow.sf, -deny.sf)
# Needs valgrind, nginx, python3, readelf and addr2line (binutils). A run takes a
# few minutes: lackey runs the server about a hundred times slower.
# Output: a line per server: instructions and unforwardable loads per
# request, allowed then denied.
set -euo pipefail

BASE_PORT=${BASE_PORT:-18720}
FEW=${FEW:-200}
MANY=${MANY:-600}
WINDOW=${WINDOW:-32}
TOP=${TOP:-25}
cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh
need_tools valgrind nginx python3 addr2line readelf

if [ $# -eq 0 ]; then
  build_release
  set -- "$PWD/target/dist/tollgate"
fi

start_scratch
SF="$PWD/bench/store_forwarding.py"

PORT_UP=$BASE_PORT
upstream_conf "$PORT_UP" "$TMP" >"$TMP/upstream.conf"
"$NGINX" -p "$TMP/" -c "$TMP/upstream.conf" >/dev/null 2>&1 &
PIDS+=($!)
wait_port "$PORT_UP"

tollgate_conf 1 $((BASE_PORT + 1)) 1000000 "1000000/s" "$PORT_UP" >"$TMP/allow.toml"
tollgate_conf 1 $((BASE_PORT + 2)) 1 "1/m" "$PORT_UP" >"$TMP/deny.toml"
{ echo "master_process off;"; nginx_proxy_conf 1 $((BASE_PORT + 3)) "burst=1000000 nodelay" "1000000r/s" "$PORT_UP" "$TMP"; } >"$TMP/ng-allow.conf"
{ echo "master_process off;"; nginx_proxy_conf 1 $((BASE_PORT + 4)) "" "1r/m" "$PORT_UP" "$TMP"; } >"$TMP/ng-deny.conf"

# The server's own code as valgrind maps it: "LO HI" (hex) of the
# executable segment of $1, at valgrind's load address for a
# position-independent executable, $BASE (checked against the map after).
own_code() {
  local vaddr memsz
  BASE=0
  case $(readelf -hW "$1") in *"Type:"*"DYN "*) BASE=$((0x108000)) ;; esac
  read -r vaddr memsz <<<"$(readelf -lW "$1" | awk '$1 == "LOAD" && / R?W?E / { print $3, $6; exit }')"
  printf '%x %x\n' $((BASE + vaddr)) $((BASE + vaddr + memsz))
}

# One run of the server started by "$@" on $PORT under lackey, $1 requests
# ($EXPECT's status each); the scan's counts go to $2, the process's
# memory map to $2.maps.
trace() {
  local requests=$1 out=$2 pid scan own
  shift 2
  own_code "$1" >"$TMP/own"
  own=$(cat "$TMP/own")
  rm -f "$TMP/trace"
  mkfifo "$TMP/trace"
  # Not in $PIDS: it ends when the server's end of the pipe closes.
  # shellcheck disable=SC2086 # "LO HI", two words
  python3 "$SF" scan "$WINDOW" $own <"$TMP/trace" >"$out" &
  scan=$!
  TOLLGATE_LOG=warn valgrind --tool=lackey --trace-mem=yes --log-fd=9 "$@" \
    9>"$TMP/trace" >"$TMP/server.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  for _ in $(seq 1 600); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then break; fi
    kill -0 "$pid" 2>/dev/null || { echo "the server under lackey exited: $(tail -3 "$TMP/server.log")" >&2; exit 1; }
    sleep 0.2
  done
  cp "/proc/$pid/maps" "$out.maps"
  [ "$BASE" = 0 ] || grep -q "^0*$(printf %x "$BASE")-.* $(readlink -f "$1")\$" "$out.maps" || {
    echo "$1 is not mapped at $(printf %x "$BASE"): the calls into libc cannot be placed" >&2
    exit 1
  }
  python3 "$SF" client "$PORT" "$requests" "$EXPECT"
  stop "$pid"
  wait "$scan"
  [ -s "$out" ] || { echo "no trace from the server on port $PORT" >&2; exit 1; }
}

# Sets $RESULT to "instructions unforwardable" per request of the server
# "$@" on $PORT; the report goes to $KEEP_DUMPS/$NAME-$EXPECT.sf when
# KEEP_DUMPS is set.
measure() {
  trace "$FEW" "$TMP/few" "$@"
  trace "$MANY" "$TMP/many" "$@"
  python3 "$SF" report "$TMP/few" "$TMP/many" $((MANY - FEW)) "$TMP/many.maps" "$TOP" >"$TMP/report"
  if [ -n "${KEEP_DUMPS:-}" ]; then
    mkdir -p "$KEEP_DUMPS"
    cp "$TMP/report" "$KEEP_DUMPS/$NAME-$EXPECT.sf"
  fi
  RESULT=$(sed -n '1s/instructions per request \([0-9]*\), unforwardable loads per request \([0-9.]*\)/\1\t\2/p' "$TMP/report")
}

printf 'server\tallow_instr/req\tallow_unforwardable/req\tdeny_instr/req\tdeny_unforwardable/req\n'
NAME=nginx
PORT=$((BASE_PORT + 3)) EXPECT=allow
measure "$NGINX" -p "$TMP/" -c "$TMP/ng-allow.conf"
ng_allow=$RESULT
PORT=$((BASE_PORT + 4)) EXPECT=deny
measure "$NGINX" -p "$TMP/" -c "$TMP/ng-deny.conf"
printf 'nginx limit_req\t%s\t%s\n' "$ng_allow" "$RESULT"
for binary in "$@"; do
  NAME=$(basename "$binary")
  PORT=$((BASE_PORT + 1)) EXPECT=allow
  measure "$binary" run -c "$TMP/allow.toml"
  allow=$RESULT
  PORT=$((BASE_PORT + 2)) EXPECT=deny
  measure "$binary" run -c "$TMP/deny.toml"
  printf '%s\t%s\t%s\n' "$NAME" "$allow" "$RESULT"
done
