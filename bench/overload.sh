#!/usr/bin/env bash
# Overload protection (adaptive and concurrency limits, queues), one command: a real upstream with a known
# capacity, open-loop load at 0.5×, 1× and 3× that capacity and a run where
# the capacity halves halfway, through each of these in the same run:
#
#   none       tollgate, no limit
#   conc       tollgate, static `concurrency` max = SLOTS (set right)
#   conc2x     tollgate, static `concurrency` max = 2 × SLOTS (set too high)
#   nginx      nginx `limit_conn` SLOTS on a constant key (set right)
#   adaptive   tollgate `algorithm = "adaptive"`
#   conc_prio  `conc` with the consumers' priorities (critical / sheddable)
#   adapt_prio `adaptive` with them
#   conc_queue `conc` with a waiting line (`queue`, QUEUE_WAIT, no priorities):
#              what waiting for a slot buys over refusing at once
#   prio_queue `conc_prio` with the waiting line, which serves critical
#              first, and the reserve at PRIO_RESERVE (see below)
#   prio_adapt `adapt_prio` with the same waiting line and reserve: the
#              adaptive pair of prio_queue
#
# A gateway row whose configuration `tollgate check` refuses (a feature not
# built on this branch) is skipped, saying so.
#
# The upstream is examples/capacity_upstream.rs on a core of its own
# (UPSTREAM_CPU): SLOTS requests at once, each SERVICE_MS (exponential of
# that mean unless FIXED_SERVICE=1), 503 once QUEUE wait. The load is
# examples/open_loop.rs, two streams at once: `critical` (API key k-crit,
# CRITICAL_SHARE of the rate) and `sheddable` (k-shed, the rest), so that
# a configuration with priorities can be told from one without.
#
# Per run: goodput (2xx within the 500 ms SLO, per second and as a share of
# the upstream's capacity, SLOTS × 1000 / SERVICE_MS per second), the share
# refused (by the gateway, and 503 by the upstream itself), the latency of
# the 2xx (p50, p99, from their scheduled start: open loop), the critical
# stream's success ratio (2xx within the SLO / sent), and the most requests
# the upstream served at once. For the halving run also the time the
# requests at the upstream (in service + waiting, sampled every 200 ms)
# take after the drop to settle (averaged over 1 s) within 20 % (at least
# 2) of their final
# level (the mean of the run's last quarter; `never` if only that quarter
# is within it), and that level. With an adaptive limit its gauge is
# sampled too, and settles the same way: within 20 % (at least 1) of its
# final level, averaged over 1 s; its samples (one a second) are printed
# after the tables, a trace of the limit through the halving.
#
# The bench fails (exit 1) on anything it does not measure: a status other
# than 2xx, 429 and 503, a request without an answer (a socket error or a
# timeout of 10 s), or an upstream that served more than its slots.
#
#   bench/overload.sh                 # builds `dist` (SKIP_BUILD=1: don't)
#   TOLLGATE=target/debug/tollgate OPEN_LOOP=target/debug/examples/open_loop \
#   CAPACITY_UPSTREAM=target/debug/examples/capacity_upstream SKIP_BUILD=1 bench/overload.sh
#
# Settings (environment): SLOTS (10), SERVICE_MS (100), QUEUE (50),
# RUN_SECONDS (12, per load), DROP_SECONDS (30), DROP_LOAD (0.8 of the
# capacity before the drop), CRITICAL_SHARE (0.2), LOADS ("0.5 1 3"),
# PRIORITY_LOADS ("3", the loads of the *_prio and prio_* rows: priorities only
# matter once the limit is reached; a full run stays under 10 minutes),
# QUEUE_WAIT (the queued variants' max_wait, 100ms), PRIO_RESERVE
# (prio_queue's `reserve`, 0: a reserve holds slots idle whenever the
# critical stream does not use them — conc_prio's default 20 % cost it
# about 13 % of the goodput — while a line that serves critical first
# gives critical requests the next slot released anyway), VARIANTS (all
# of the above), UPSTREAM_CPU (1), SERVER_CPUSET (unset:
# the gateway unpinned), BASE_PORT (18680).
set -euo pipefail
cd "$(dirname "$0")/.."

SLOTS=${SLOTS:-10}
SERVICE_MS=${SERVICE_MS:-100}
QUEUE=${QUEUE:-50}
RUN_SECONDS=${RUN_SECONDS:-12}
DROP_SECONDS=${DROP_SECONDS:-30}
DROP_LOAD=${DROP_LOAD:-0.8}
CRITICAL_SHARE=${CRITICAL_SHARE:-0.2}
LOADS=${LOADS:-0.5 1 3}
PRIORITY_LOADS=${PRIORITY_LOADS:-3}
QUEUE_WAIT=${QUEUE_WAIT:-100ms}
PRIO_RESERVE=${PRIO_RESERVE:-0}
VARIANTS=${VARIANTS:-none conc conc2x nginx adaptive conc_prio adapt_prio conc_queue prio_queue prio_adapt}
UPSTREAM_CPU=${UPSTREAM_CPU:-1}
BASE_PORT=${BASE_PORT:-18680}
SLO_MS=500

# shellcheck source=bench/common.sh
. bench/common.sh
need_tools nginx curl taskset awk

if [ "${SKIP_BUILD:-0}" != 1 ]; then
  cargo build --profile dist --bin tollgate --example open_loop --example capacity_upstream
fi
TOLLGATE=$(realpath "${TOLLGATE:-target/dist/tollgate}")
OPEN_LOOP=$(realpath "${OPEN_LOOP:-target/dist/examples/open_loop}")
CAPACITY_UPSTREAM=$(realpath "${CAPACITY_UPSTREAM:-target/dist/examples/capacity_upstream}")
start_scratch

PORT_UP=$BASE_PORT
PORT_GW=$((BASE_PORT + 1))
PORT_ADMIN=$((BASE_PORT + 2))
CAPACITY=$(awk -v s="$SLOTS" -v ms="$SERVICE_MS" 'BEGIN {printf "%g", s * 1000 / ms}')
UP="http://127.0.0.1:$PORT_UP/_upstream"

# The upstream, pinned; it lives for the whole run (counters reset per run).
exponential=--exponential
[ "${FIXED_SERVICE:-0}" = 1 ] && exponential=
for port in $(seq "$BASE_PORT" $((BASE_PORT + 2))); do port_free "$port"; done
taskset -c "$UPSTREAM_CPU" "$CAPACITY_UPSTREAM" "$PORT_UP" "$SLOTS" "$SERVICE_MS" "$QUEUE" $exponential \
  >"$TMP/upstream.out" 2>&1 &
PIDS+=("$!")
wait_port "$PORT_UP"

# One field of a `key=value ...` line: $1 = key, $2 = line.
field() { tr ' ' '\n' <<<"$2" | awk -F= -v k="$1" '$1 == k {print $2}'; }

# The gateway's configuration for variant $1 (tollgate's), on stdout.
tollgate_overload_conf() {
  local limit=""
  cat <<CONF
[server]
listen = "127.0.0.1:$PORT_GW"
admin = "127.0.0.1:$PORT_ADMIN"
workers = 1

[upstreams.up]
url = "http://127.0.0.1:$PORT_UP"

CONF
  case $1 in
    conc | conc_prio) limit="concurrency"; printf '[limits.backend]\nkey = "route"\nalgorithm = "concurrency"\nmax = %d\n\n' "$SLOTS" ;;
    conc_queue | prio_queue)
      limit="concurrency"
      # The line holds about what the upstream serves in max_wait, twice.
      printf '[limits.backend]\nkey = "route"\nalgorithm = "concurrency"\nmax = %d\n' "$SLOTS"
      printf 'queue = { max_wait = "%s", size = %d }\n' "$QUEUE_WAIT" $((4 * SLOTS))
      [ "$1" = prio_queue ] && printf 'reserve = %s\n' "$PRIO_RESERVE"
      echo
      ;;
    conc2x) limit="concurrency"; printf '[limits.backend]\nkey = "route"\nalgorithm = "concurrency"\nmax = %d\n\n' $((2 * SLOTS)) ;;
    adaptive | adapt_prio) limit="adaptive"; printf '[limits.backend]\nkey = "route"\nalgorithm = "adaptive"\nmin = 2\nmax = %d\n\n' $((20 * SLOTS)) ;;
    prio_adapt)
      limit="adaptive"
      printf '[limits.backend]\nkey = "route"\nalgorithm = "adaptive"\nmin = 2\nmax = %d\n' $((20 * SLOTS))
      printf 'queue = { max_wait = "%s", size = %d }\nreserve = %s\n\n' "$QUEUE_WAIT" $((4 * SLOTS)) "$PRIO_RESERVE"
      ;;
  esac
  local priority_crit="" priority_shed=""
  case $1 in
    *_prio | prio_*) priority_crit='priority = "critical"'; priority_shed='priority = "sheddable"' ;;
  esac
  cat <<CONF
[consumers."k-crit"]
consumer = "crit"
$priority_crit

[consumers."k-shed"]
consumer = "shed"
$priority_shed

[[routes]]
name = "api"
match = { path_prefix = "/" }
upstream = "up"
CONF
  [ -n "$limit" ] && echo 'limits = ["backend"]'
  return 0
}

# nginx proxying to the upstream, `limit_conn` SLOTS on a constant key.
nginx_overload_conf() {
  cat <<CONF
daemon off;
worker_processes 1;
pid $TMP/ng.pid;
error_log $TMP/ng.err crit;
events { worker_connections 8192; }
http {
  access_log off;
  keepalive_requests 10000000;
  limit_conn_zone \$server_name zone=backend:1m;
  limit_conn_status 503;
  upstream up {
    server 127.0.0.1:$PORT_UP;
    keepalive 256;
    keepalive_requests 10000000;
  }
  server {
    listen 127.0.0.1:$PORT_GW;
    server_name overload;
    location / {
      limit_conn backend $SLOTS;
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
    }
  }
}
CONF
}

# Starts variant $1's gateway; returns 1 (after saying why) when tollgate
# refuses its configuration.
start_gateway() {
  if [ "$1" = nginx ]; then
    nginx_overload_conf >"$TMP/nginx.conf"
    start_nginx "$TMP/nginx.conf"
  else
    tollgate_overload_conf "$1" >"$TMP/$1.toml"
    if ! "$TOLLGATE" check -c "$TMP/$1.toml" >"$TMP/$1.check" 2>&1; then
      echo "skipped $1: tollgate check refuses its configuration on this build:" >&2
      grep -v '^warning' "$TMP/$1.check" | head -3 | sed 's/^/  /' >&2
      return 1
    fi
    start_tollgate "$TMP/$1.toml"
  fi
  GATEWAY=$STARTED
  wait_port "$PORT_GW"
}

# The upstream back to SLOTS, its counters to 0.
reset_upstream() {
  curl -sf -X POST "$UP/slots?n=$SLOTS" >/dev/null
  curl -sf -X POST "$UP/reset" >/dev/null
}

# Fails the bench unless an open_loop line ($2, of stream $1) shows only
# what is measured: 2xx, 429 and 503, and an answer to every request.
check_line() {
  local failed other
  failed=$(field failed "$2")
  other=$(field other "$2")
  if [ "${failed:-x}" != 0 ] || [ "${other:-x}" != 0 ]; then
    echo "$1: $failed requests without an answer, $other with a status other than 2xx/429/503: $2" >&2
    exit 1
  fi
}

# Both streams at $1 requests/s in all for $2 s; their lines in
# $TMP/crit.out and $TMP/shed.out.
load() {
  local crit shed
  crit=$(awk -v r="$1" -v s="$CRITICAL_SHARE" 'BEGIN {printf "%.3f", r * s}')
  shed=$(awk -v r="$1" -v s="$CRITICAL_SHARE" 'BEGIN {printf "%.3f", r * (1 - s)}')
  OPEN_LOOP_SLO_MS=$SLO_MS "$OPEN_LOOP" "http://127.0.0.1:$PORT_GW/work" "$crit" "$2" x-api-key:k-crit >"$TMP/crit.out" &
  local crit_pid=$!
  OPEN_LOOP_SLO_MS=$SLO_MS "$OPEN_LOOP" "http://127.0.0.1:$PORT_GW/work" "$shed" "$2" x-api-key:k-shed >"$TMP/shed.out"
  wait "$crit_pid"
  check_line critical "$(cat "$TMP/crit.out")"
  check_line sheddable "$(cat "$TMP/shed.out")"
}

# The row of one run: $1 variant, $2 load, $3 seconds, $4 extra columns.
# Goodput is per second of the load's schedule (the last answers may come
# after it ends).
report_row() {
  local c s up
  c=$(cat "$TMP/crit.out")
  s=$(cat "$TMP/shed.out")
  up=$(curl -sf "$UP/stats") || { echo "$1: the capacity upstream's /stats did not answer" >&2; exit 1; }
  local over
  over=$(field over_capacity "$up")
  local max_in
  max_in=$(field max_in_service "$up")
  if ! [[ "$max_in" =~ ^[0-9]+$ ]]; then
    echo "$1: the capacity upstream's /stats has no max_in_service: '$up'" >&2
    exit 1
  fi
  if [ "$max_in" -gt "$SLOTS" ] && [ "$over" != 0 ]; then
    echo "$1: the upstream served $max_in at once, over its $SLOTS slots" >&2
    exit 1
  fi
  awk -v variant="$1" -v load="$2" -v secs="$3" -v cap="$CAPACITY" -v extra="$4" \
    -v up_refused="$(field refused "$up")" -v max_in="$max_in" \
    -v cr="$(field requests "$c")" -v cgood="$(field good "$c")" \
    -v sr="$(field requests "$s")" -v sgood="$(field good "$s")" \
    -v refused="$(( $(field refused "$c") + $(field refused "$s") ))" \
    -v p50="$(( $(field ok_p50_us "$c") > $(field ok_p50_us "$s") ? $(field ok_p50_us "$c") : $(field ok_p50_us "$s") ))" \
    -v p99="$(( $(field ok_p99_us "$c") > $(field ok_p99_us "$s") ? $(field ok_p99_us "$c") : $(field ok_p99_us "$s") ))" \
    'BEGIN {
      total = cr + sr; good = cgood + sgood
      gw = refused - up_refused
      printf "%-10s %6s %7d %10.1f %8.1f%% %8.1f%% %8.1f%% %9.0f %9.0f %9.1f%% %6d%s\n",
        variant, load, total, good / secs, 100 * good / secs / cap,
        100 * gw / total, 100 * up_refused / total, p50 / 1000, p99 / 1000,
        cr ? 100 * cgood / cr : 0, max_in, extra
    }'
}

header() {
  printf "%-10s %6s %7s %10s %9s %9s %9s %9s %9s %10s %6s%s\n" variant load sent goodput/s "of cap" "shed gw" "503 up" "p50 ms" "p99 ms" "critical" "max up" "$1"
}

# Samples the upstream's requests (in service + waiting) and, when the
# gateway has one, the adaptive limit's gauge, every 200 ms into $1.
sample() {
  local start now up limit
  start=$(date +%s%N)
  while :; do
    now=$(date +%s%N)
    up=$(curl -sf "$UP/stats" || true)
    limit=$(curl -sf "http://127.0.0.1:$PORT_ADMIN/metrics" 2>/dev/null |
      awk '/^tollgate_adaptive_limit[{ ]/ {print $NF; exit}' || true)
    [ -n "$up" ] && echo "$(((now - start) / 1000000)) $(($(field in_service "$up") + $(field waiting "$up"))) ${limit:--}" >>"$1"
    sleep 0.2
  done
}

# Settling after the drop at $2 ms, from column $3 of samples $1 ("-"
# samples skipped), within $4 of the final level and at least $5:
# "settle_s level".
settle() {
  awk -v drop="$2" -v col="$3" -v frac="$4" -v least="$5" '
    # n and m start at 0, not as the empty string: t[n] on an unset n
    # would be t[""], leaving t[0] empty (a settle time of minus the drop).
    BEGIN { n = 0; m = 0 }
    $col == "-" { next }
    # Smoothed over 5 samples (1 s): at the upstream the count moves by
    # several requests from one 200 ms sample to the next.
    { w[m % 5] = $col; m++; if (m >= 5 && $1 >= drop) { t[n] = $1; v[n] = (w[0] + w[1] + w[2] + w[3] + w[4]) / 5; n++ } }
    END {
      if (n < 4) { print "- -"; exit }
      from = int(n * 3 / 4); sum = 0
      for (i = from; i < n; i++) sum += v[i]
      level = sum / (n - from); band = level * frac; if (band < least) band = least
      settled = n - 1
      for (i = n - 1; i >= 0; i--) { d = v[i] - level; if (d < 0) d = -d; if (d > band) break; settled = i }
      # Within the last quarter, which defines the level: it never settled.
      if (settled >= from) printf "never %.1f\n", level
      else printf "%.1f %.1f\n", (t[settled] - drop) / 1000, level
    }' "$1"
}

echo "upstream: $SLOTS slots × ${SERVICE_MS} ms ($([ -n "$exponential" ] && echo exponential || echo fixed)), queue $QUEUE, capacity $CAPACITY/s; SLO ${SLO_MS} ms; critical ${CRITICAL_SHARE} of the load"
echo "tollgate: $TOLLGATE; nginx: $("$NGINX" -v 2>&1 | sed 's/.*\///')"
echo
ROWS=$TMP/rows
DROPS=$TMP/drops
TRACES=$TMP/traces
: >"$ROWS"
: >"$DROPS"
: >"$TRACES"
for variant in $VARIANTS; do
  start_gateway "$variant" || continue
  loads=$LOADS
  case $variant in *_prio | prio_*) loads=$PRIORITY_LOADS ;; esac
  for load_x in $loads; do
    rate=$(awk -v x="$load_x" -v c="$CAPACITY" 'BEGIN {printf "%.3f", x * c}')
    reset_upstream
    load "$rate" "$RUN_SECONDS"
    report_row "$variant" "${load_x}×" "$RUN_SECONDS" "" | tee -a "$ROWS"
  done
  # The halving run: DROP_LOAD of the capacity, which halves halfway.
  reset_upstream
  rate=$(awk -v x="$DROP_LOAD" -v c="$CAPACITY" 'BEGIN {printf "%.3f", x * c}')
  samples=$TMP/samples-$variant
  : >"$samples"
  sample "$samples" &
  sampler=$!
  PIDS+=("$sampler")
  (sleep "$(awk -v s="$DROP_SECONDS" 'BEGIN {print s / 2}')" && curl -sf -X POST "$UP/slots?n=$(((SLOTS + 1) / 2))" >/dev/null) &
  dropper=$!
  PIDS+=("$dropper")
  load "$rate" "$DROP_SECONDS"
  wait "$dropper" || { echo "$variant: the capacity was not halved" >&2; exit 1; }
  stop "$sampler" "$dropper"
  read -r settle_s level <<<"$(settle "$samples" $((DROP_SECONDS * 500)) 2 0.2 2)"
  read -r lim_settle lim_level <<<"$(settle "$samples" $((DROP_SECONDS * 500)) 3 0.2 1)"
  limits=$(awk '$3 != "-" {l = $3} END {print l ? l : "-"}' "$samples")
  report_row "$variant" "drop" "$DROP_SECONDS" "$(printf ' %9s %8s %10s %9s %7s' "$settle_s" "$level" "$lim_settle" "$lim_level" "$limits")" | tee -a "$DROPS"
  # The limit's trace through the halving: its first sample of each second.
  if [ "$limits" != - ]; then
    awk -v v="$variant" 'BEGIN { s = -1 } $3 != "-" && int($1 / 1000) != s { s = int($1 / 1000); l = l " " $3 } END { print v ":" l }' "$samples" >>"$TRACES"
  fi
  stop "$GATEWAY"
done

echo
echo "loads (× capacity $CAPACITY/s, $RUN_SECONDS s each); goodput = 2xx within ${SLO_MS} ms; shed gw = refused by the gateway; 503 up = by the upstream's full queue; critical = the critical stream's good share; max up = most served at once"
header ""
sort -s -k2,2n "$ROWS"
echo
echo "capacity halving: $DROP_LOAD × capacity for $DROP_SECONDS s, $SLOTS → $(((SLOTS + 1) / 2)) slots at $((DROP_SECONDS / 2)) s; settle_s = s after the drop until the upstream's requests (in service + waiting, 1 s means) stay within 20 % (at least 2) of their final level; lim_settle the same for the adaptive limit (within 20 %, at least 1); last column: the limit's last value"
header "$(printf ' %9s %8s %10s %9s %7s' settle_s level lim_settle lim_level limit)"
cat "$DROPS"
if [ -s "$TRACES" ]; then
  echo
  echo "the adaptive limit through the halving run, one sample a second (the capacity halves at $((DROP_SECONDS / 2)) s):"
  cat "$TRACES"
fi
