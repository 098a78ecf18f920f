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
#         CACHE_SIM=1 runs callgrind with `--cache-sim=yes` (simulated L1
#         and last-level caches of the machine's geometry) and prints, beside
#         the instructions, the simulated L1i misses and L1d read / write
#         misses per request (I1mr, D1mr, D1mw), nginx's too: where the
#         instructions are no longer the difference, the misses may be.
#         MEMCPY=1 also runs each tollgate natively (no valgrind) with
#         bench/memcpy_count.c preloaded and prints the `memcpy` / `memmove`
#         calls and bytes per request (the measured run's, 5 s of the same
#         load): Rust moves a large value, a future above all, with a call
#         of `memcpy`, so the bytes are what the request path moves. With
#         KEEP_DUMPS the call sites (file offset, calls and bytes per
#         request, the function and line by addr2line) go to
#         BINARY-allow.memcpy / BINARY-deny.memcpy there. Needs a C compiler.
# Needs valgrind, nginx and wrk (installed with apt-get when absent), and
# openssl with TLS=1.
#
# Output: a line per server, tab-separated: instructions per request
# allowed and denied, their ratios to nginx's; with CACHE_SIM=1 then
# I1mr, D1mr and D1mw per request, allowed then denied; with MEMCPY=1
# (tollgate only) memcpy calls and bytes per request, allowed then denied.
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

CACHE_SIM=${CACHE_SIM:-0}
CACHE_ARGS=()
[ "$CACHE_SIM" = 1 ] && CACHE_ARGS=(--cache-sim=yes)
MEMCPY=${MEMCPY:-0}
if [ "$MEMCPY" = 1 ]; then
  cc -O2 -shared -fPIC -o "$TMP/memcpy_count.so" bench/memcpy_count.c -ldl
  MEMCPY_SIGNAL=$(($(kill -l SIGRTMIN) + 5))
  export MEMCPY_COUNT_SIGNAL=$MEMCPY_SIGNAL
fi

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
  TOLLGATE_LOG=warn valgrind --tool=callgrind --instr-atstart=no "${CACHE_ARGS[@]}" \
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
    requests=$((requests - $(awk '/requests in/ {print $1}' "$TMP/wrk.short")))
    per_request "$requests" "$(ls "$out".*.2)" "$(ls "$out".*.1)"
  else
    local f best="" most=0 n
    for f in "$out".*; do
      n=$(grep -m1 '^summary:' "$f" | awk '{print $2}' || true)
      if [ "${n:-0}" -gt "$most" ]; then most=$n best=$f; fi
    done
    per_request "$requests" "$best"
  fi
}

# The counts of the dump $2 (less those of the dump $3, if given) over $1
# requests: the instructions, and with CACHE_SIM=1 the simulated misses
# I1mr, D1mr and D1mw, space-separated.
per_request() {
  local requests=$1 long=$2 short=${3:-}
  awk -v requests="$requests" -v sim="$CACHE_SIM" -v second="$short" '
    # Each dump names its events in order, then sums them on `summary:`.
    /^events:/ { for (i = 2; i <= NF; i++) column[FILENAME, $i] = i }
    /^summary:/ { for (i = 2; i <= NF; i++) sum[FILENAME, i] = $i }
    END {
      split(sim == 1 ? "Ir I1mr D1mr D1mw" : "Ir", names, " ")
      line = ""
      for (k = 1; names[k] != ""; k++) {
        i = column[first, names[k]]
        v = sum[first, i] - (second == "" ? 0 : sum[second, column[second, names[k]]])
        line = line (k > 1 ? " " : "") (names[k] == "Ir" ? sprintf("%d", v / requests) : sprintf("%.0f", v / requests))
      }
      print line
    }' first="$long" "$long" ${short:+"$short"}
}

# `memcpy` / `memmove` calls and bytes per request of tollgate ("$@"),
# listening on $PORT, run natively with bench/memcpy_count.c preloaded:
# warmed up as under callgrind, dumped before and after a 5 s run. The
# call sites go to $KEEP_DUMPS/$NAME.memcpy when KEEP_DUMPS is set.
memcpy_count() {
  local out="$TMP/memcpy" pid requests binary=$1
  rm -f "$out"
  MEMCPY_COUNT_OUT=$out LD_PRELOAD="$TMP/memcpy_count.so" TOLLGATE_LOG=warn \
    "$@" >"$TMP/memcpy.log" 2>&1 &
  pid=$!
  wait_port "$PORT"
  wrk -t1 -c16 -d2s "$SCHEME://127.0.0.1:$PORT/" >/dev/null
  kill -s "$MEMCPY_SIGNAL" "$pid"
  wrk -t1 -c16 -d5s "$SCHEME://127.0.0.1:$PORT/" >"$TMP/wrk.out"
  kill -s "$MEMCPY_SIGNAL" "$pid"
  sleep 0.5
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  STATUSES_PROBED=1 check_statuses "$EXPECT" "$TMP/wrk.out"
  requests=$(awk '/requests in/ {print $1}' "$TMP/wrk.out")
  # Two dumps, each ended by `end`: the second less the first.
  awk -v requests="$requests" -v sites="${KEEP_DUMPS:+$TMP/sites}" '
    BEGIN { dump = 0 }
    $1 == "end" { dump++ }
    $1 == "total" { calls[dump] = $2; bytes[dump] = $3 }
    $1 == "site" { c[dump, $2] += $3; b[dump, $2] += $4; seen[$2] = 1 }
    END {
      printf "%.1f %.0f\n", (calls[1] - calls[0]) / requests, (bytes[1] - bytes[0]) / requests
      if (sites == "") exit
      for (s in seen) {
        db = b[1, s] - b[0, s]
        if (db > 0) printf "%s %.2f %.1f\n", s, (c[1, s] - c[0, s]) / requests, db / requests > sites
      }
    }' "$out"
  if [ -n "${KEEP_DUMPS:-}" ]; then
    mkdir -p "$KEEP_DUMPS"
    # The return address less one is the call, named by one run of
    # addr2line for every site (addresses outside the executable, in
    # libraries, stay unnamed). Sites of less than a byte per request left out.
    sort -k3,3 -g -r "$TMP/sites" | awk '$3 >= 1' >"$TMP/sites.sorted"
    while read -r site _; do printf '0x%x\n' $((site - 1)); done <"$TMP/sites.sorted" |
      addr2line -f -i -C -a -e "$binary" |
      awk '/^0x/ {if (n++) print line; line = ""; next} {line = line (line == "" ? "" : " ") $0} END {print line}' |
      paste -d' ' "$TMP/sites.sorted" - >"$KEEP_DUMPS/$NAME.memcpy"
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

# The columns after the ratios: the misses, then the memcpy counts.
header='server\tallow_instr/req\tdeny_instr/req\tallow_vs_nginx\tdeny_vs_nginx'
[ "$CACHE_SIM" = 1 ] && header+='\tallow_I1mr\tallow_D1mr\tallow_D1mw\tdeny_I1mr\tdeny_D1mr\tdeny_D1mw'
[ "$MEMCPY" = 1 ] && header+='\tallow_memcpy_calls\tallow_memcpy_bytes\tdeny_memcpy_calls\tdeny_memcpy_bytes'
# "Ir [I1mr D1mr D1mw]" of an allowed and a denied count, as columns.
misses() {
  [ "$CACHE_SIM" = 1 ] || return 0
  local a=($1) d=($2)
  printf '\t%s\t%s\t%s\t%s\t%s\t%s' "${a[1]}" "${a[2]}" "${a[3]}" "${d[1]}" "${d[2]}" "${d[3]}"
}
ratio() { awk -v a="${1%% *}" -v b="${2%% *}" 'BEGIN {printf "%.2f", a / b}'; }
printf '%b\n' "$header"
printf 'nginx limit_req\t%s\t%s\t1.00\t1.00%s\n' "${ng_allow%% *}" "${ng_deny%% *}" "$(misses "$ng_allow" "$ng_deny")"
for binary in "$@"; do
  name=$(basename "$binary")
  allow=$(EXPECT=allow PORT=$((BASE_PORT + 1)) count "$binary" run -c "$TMP/allow.toml")
  keep_dump "$name-allow"
  deny=$(EXPECT=deny PORT=$((BASE_PORT + 2)) count "$binary" run -c "$TMP/deny.toml")
  keep_dump "$name-deny"
  copies=
  if [ "$MEMCPY" = 1 ]; then
    a=$(NAME=$name-allow EXPECT=allow PORT=$((BASE_PORT + 1)) memcpy_count "$binary" run -c "$TMP/allow.toml")
    d=$(NAME=$name-deny EXPECT=deny PORT=$((BASE_PORT + 2)) memcpy_count "$binary" run -c "$TMP/deny.toml")
    copies=$(printf '\t%s\t%s\t%s\t%s' ${a} ${d})
  fi
  printf '%s\t%s\t%s\t%s\t%s%s%s\n' "$name" "${allow%% *}" "${deny%% *}" \
    "$(ratio "$allow" "$ng_allow")" "$(ratio "$deny" "$ng_deny")" \
    "$(misses "$allow" "$deny")" "$copies"
done
