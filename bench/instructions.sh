#!/usr/bin/env bash
# User-space instructions per request, counted by valgrind's callgrind.
#
# Wall-clock profiles on a small shared VM move by ±20 % between runs and the
# VM exposes no hardware counters; callgrind counts the instructions the
# gateway executes in user space exactly, so a change to the request path
# shows as a stable number. (It does not see the kernel, and it undercounts
# what large memory copies cost in time; bench/load.sh measures time.)
#
# For each target it runs tollgate (`workers = 1`, the same never-denying /
# always-denying token bucket as bench/load.sh, in front of nginx `return
# 200`) under callgrind with instrumentation off, warms it up with wrk, turns
# instrumentation on, drives `wrk -t1 -c16 -d5s`, dumps the counts, and
# prints instructions / completed requests. The peer, nginx `limit_req` as
# bench/load.sh configures it (one process), is counted the same way first,
# and each binary's counts are also printed as a ratio to nginx's.
#
# TLS=1 counts HTTPS keep-alive instead: both servers terminate TLS 1.3
# with the same certificate, as bench/tls.sh sets them up (nginx `listen
# ssl http2`, tollgate `[server.tls]`), and wrk speaks HTTPS/1.1. A wrk run
# opens its 16 connections with full handshakes, so two measured runs are
# made, 2 s and 6 s, each dumped on its own, and a request costs the
# difference of their counts over the difference of their requests: the
# handshakes cancel out.
#
# Run:    bench/instructions.sh [BINARY ...]     (default: target/dist/tollgate,
#                                                built unless SKIP_BUILD=1)
# Knobs:  BASE_PORT=18180 (uses BASE_PORT .. BASE_PORT+6)  TLS=1
#         OVERRIDES=N installs N per-key overrides of the limit (other keys
#         than the client's, 10 distinct sets of numbers) through a
#         `state_file`: the cost of a key without one on a limit with many.
#         TRACING=RATIO adds `[tracing]` with `sample = RATIO`, exporting to
#         the nginx upstream (which answers the OTLP POSTs 200): the
#         exporter's thread is counted with the request path.
#         KEEP_DUMPS=DIR keeps each run's callgrind dump there, named
#         BINARY-allow / BINARY-deny, for `callgrind_annotate` per function.
# Needs valgrind, nginx and wrk (installed with apt-get when absent), and
# openssl with TLS=1.
set -euo pipefail

BASE_PORT=${BASE_PORT:-18180}
cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh
need_tools valgrind nginx wrk openssl

if [ $# -eq 0 ]; then
  build_release
  set -- "$PWD/target/dist/tollgate"
fi

start_scratch

PORT_UP=$BASE_PORT
upstream_conf "$PORT_UP" "$TMP" >"$TMP/upstream.conf"
"$NGINX" -p "$TMP/" -c "$TMP/upstream.conf" >/dev/null 2>&1 &
PIDS+=($!)
wait_port "$PORT_UP"

TLS=${TLS:-0}
if [ "$TLS" = 1 ]; then
  make_tls_cert "$TMP"
  SCHEME=https
  # The cleartext listeners tollgate needs beside, which nothing is sent to.
  tollgate_tls_conf $((BASE_PORT + 1)) $((BASE_PORT + 5)) 1000000 "1000000/s" "$PORT_UP" "$TMP" >"$TMP/allow.toml"
  tollgate_tls_conf $((BASE_PORT + 2)) $((BASE_PORT + 6)) 1 "1/m" "$PORT_UP" "$TMP" >"$TMP/deny.toml"
else
  SCHEME=http
  tollgate_conf 1 $((BASE_PORT + 1)) 1000000 "1000000/s" "$PORT_UP" >"$TMP/allow.toml"
  tollgate_conf 1 $((BASE_PORT + 2)) 1 "1/m" "$PORT_UP" >"$TMP/deny.toml"
fi

OVERRIDES=${OVERRIDES:-0}
if [ "$OVERRIDES" -gt 0 ]; then
  awk -v n="$OVERRIDES" 'BEGIN {
    printf "{\"version\": 1, \"overrides\": ["
    for (i = 1; i <= n; i++) {
      printf "%s{\"limit\": \"per_ip\", \"digest\": \"%016x%016x\", \"params\": {\"capacity\": %d}}", (i > 1 ? "," : ""), i, i * 7919, 1000 + i % 10
    }
    print "]}"
  }' >"$TMP/state.json"
  for conf in "$TMP"/allow.toml "$TMP"/deny.toml; do
    sed -i "/^workers = /a state_file = \"$TMP/state.json\"" "$conf"
  done
fi

TRACING=${TRACING:-}
if [ -n "$TRACING" ]; then
  for conf in "$TMP"/allow.toml "$TMP"/deny.toml; do
    printf '\n[tracing]\notlp = "http://127.0.0.1:%s"\nsample = %s\n' "$PORT_UP" "$TRACING" >>"$conf"
  done
fi

# Instructions per request of the server started by the command "$@"
# (under callgrind), listening on port $PORT; $EXPECT (allow or deny) is
# what its responses must be.
count() {
  local out="$TMP/cg" pid requests total
  rm -f "$out".*
  TOLLGATE_LOG=warn valgrind --tool=callgrind --instr-atstart=no \
    --callgrind-out-file="$out.%p" "$@" >"$TMP/cg.log" 2>&1 &
  pid=$!
  wait_port "$PORT"
  wrk -t1 -c16 -d2s "$SCHEME://127.0.0.1:$PORT/" >/dev/null
  # Which statuses the refusals are (a 502 is refused too, for wrk's
  # summary), asked before the instructions are counted.
  PROBE_SECONDS=2 probe_statuses "$EXPECT" "$SCHEME://127.0.0.1:$PORT/"
  callgrind_control -i on "$pid" >/dev/null 2>&1
  if [ "$TLS" = 1 ]; then
    wrk -t1 -c16 -d2s "$SCHEME://127.0.0.1:$PORT/" >"$TMP/wrk.short"
    callgrind_control -d "$pid" >/dev/null 2>&1
    wrk -t1 -c16 -d6s "$SCHEME://127.0.0.1:$PORT/" >"$TMP/wrk.out"
  else
    wrk -t1 -c16 -d5s "$SCHEME://127.0.0.1:$PORT/" >"$TMP/wrk.out"
  fi
  callgrind_control -d "$pid" >/dev/null 2>&1
  sleep 0.5
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  STATUSES_PROBED=1 check_statuses "$EXPECT" "$TMP/wrk.out"
  requests=$(awk '/requests in/ {print $1}' "$TMP/wrk.out")
  if [ "$TLS" = 1 ]; then
    STATUSES_PROBED=1 check_statuses "$EXPECT" "$TMP/wrk.short"
    # Dumps number from 1 in order: .1 is the short run, .2 the long one.
    local short long
    short=$(grep -h -m1 '^summary:' "$out".*.1 | awk '{print $2}')
    long=$(grep -h -m1 '^summary:' "$out".*.2 | awk '{print $2}')
    requests=$((requests - $(awk '/requests in/ {print $1}' "$TMP/wrk.short")))
    echo $(((long - short) / requests))
  else
    total=$(for f in "$out".*; do grep -m1 '^summary:' "$f" | awk '{print $2}'; done | sort -n | tail -1)
    echo $((total / requests))
  fi
}

# The last run's measured dump (the one with the most instructions), copied
# to $KEEP_DUMPS/NAME when it is set.
keep_dump() {
  [ -n "${KEEP_DUMPS:-}" ] || return 0
  mkdir -p "$KEEP_DUMPS"
  local f best="" most=0 n
  for f in "$TMP"/cg.*; do
    n=$(grep -m1 '^summary:' "$f" | awk '{print $2}' || true)
    if [ "${n:-0}" -gt "$most" ]; then most=$n best=$f; fi
  done
  [ -n "$best" ] && cp "$best" "$KEEP_DUMPS/$1"
}

# The peer: nginx `limit_req` configured as in bench/load.sh, as one process
# (`master_process off`) so callgrind sees the process that serves.
nginx_count() {
  PORT=$1
  if [ "$TLS" = 1 ]; then
    { echo "master_process off;"; nginx_tls_conf "$1" "$2" "$3" "$PORT_UP" "$TMP"; } >"$TMP/ng-$1.conf"
  else
    { echo "master_process off;"; nginx_proxy_conf 1 "$1" "$2" "$3" "$PORT_UP" "$TMP"; } >"$TMP/ng-$1.conf"
  fi
  count "$NGINX" -p "$TMP/" -e "$TMP/ng-$1.err" -c "$TMP/ng-$1.conf"
}
ng_allow=$(EXPECT=allow nginx_count $((BASE_PORT + 3)) "burst=1000000 nodelay" "1000000r/s")
ng_deny=$(EXPECT=deny nginx_count $((BASE_PORT + 4)) "" "1r/m")

printf 'server\tallow_instr/req\tdeny_instr/req\tallow_vs_nginx\tdeny_vs_nginx\n'
printf 'nginx limit_req\t%s\t%s\t1.00\t1.00\n' "$ng_allow" "$ng_deny"
for binary in "$@"; do
  allow=$(EXPECT=allow PORT=$((BASE_PORT + 1)) count "$binary" run -c "$TMP/allow.toml")
  keep_dump "$(basename "$binary")-allow"
  deny=$(EXPECT=deny PORT=$((BASE_PORT + 2)) count "$binary" run -c "$TMP/deny.toml")
  keep_dump "$(basename "$binary")-deny"
  printf '%s\t%s\t%s\t%s\t%s\n' "$(basename "$binary")" "$allow" "$deny" \
    "$(awk -v a="$allow" -v b="$ng_allow" 'BEGIN {printf "%.2f", a / b}')" \
    "$(awk -v a="$deny" -v b="$ng_deny" 'BEGIN {printf "%.2f", a / b}')"
done
