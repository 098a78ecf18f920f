#!/usr/bin/env bash
# Fault benchmark: one of two upstream instances is stopped under load for a
# while, then started again; what do the clients see, and how soon does the
# instance get traffic again? tollgate beside nginx, in the same run, one
# after the other, each with fresh upstream instances.
#
# The upstream: two nginx `return 200 "ok\n"` instances (1 worker each),
# instance 2 with an access log of `$msec $request_uri`. In front of them:
#   nginx       nginx proxy (1 worker): `server ... max_fails=1
#               fail_timeout=5s` for both, default `proxy_next_upstream`
#               (error timeout), HTTP/1.1 keep-alive to the upstreams
#   tollgate    tollgate (1 worker) with the same passive rule: `eject = {
#               after = 1, base = "5s", max = "5s" }`, and the route's
#               `retry = { attempts = 2, on = ["connect", "502", "503"] }`
#               (the default budget, 20 %)
#   tg_checks   tollgate with the default `eject` (3 failures, 10 s × n) and
#               active checks: `health = { path = "/healthz", interval =
#               "1s", timeout = "500ms", healthy = 1, unhealthy = 1 }`
#
# Each target gets a warm-up, then three wrk runs back to back (`-t1 -c32
# --latency`, SEGMENT long each, default 20 s; closed loop), ROUNDS times
# (default 3), the targets interleaved (nginx, tollgate, tg_checks, nginx,
# ...) so that the machine's moods hit them alike:
#   before   both instances up
#   fault    instance 2 stopped (SIGTERM, nginx's fast shutdown: its
#            connections are cut, new ones refused) 0.5 s into the run
#   after    instance 2 started again 0.5 s into the run
# Per run: requests, client-visible errors (any status but 2xx, and wrk's
# socket errors; nothing here answers 429), p50 and p99. Then how long
# instance 2 took, from being started, to serve its first proxied request
# (its access log, health checks left out). A wrk Lua script counts every
# response by status; the bench fails (exit 1) when the counts do not add up
# to wrk's, when a status other than 200/502/503/504 comes back, when the
# "before" run has any error (then the setup, not the fault, is measured),
# when instance 2 served nothing before the fault or nothing after it came
# back, or when the proxy shows no sign of the fault (nginx: no refused
# connection in its error log; tollgate: no ejection of instance 2).
#
# Targets (the upstream-health issue): no more client-visible errors than
# nginx, p99 during the fault at most 2x the p99 before it, instance 2
# serving again within its ejection time (5 s for `nginx` and `tollgate`).
# The summary gives each figure's median over the rounds with its range,
# and the verdicts compare medians (one run of each is noise: a fault's
# errors depend on where in the connections' cycle the instance stops).
#
# Run (as root, or with nginx and wrk installed):   bench/fault.sh
# Knobs: SEGMENT=20s CONNS=32 ROUNDS=3 TARGETS="nginx tollgate tg_checks"
#        BASE_PORT=18380 (uses BASE_PORT .. BASE_PORT+4)
#        SKIP_BUILD=1 (use the existing target/dist/tollgate)
#        TOLLGATE=path (another tollgate binary; implies no build)
# Everything it writes lives in a `mktemp -d` directory, removed at exit, and
# every process it starts is stopped at exit.
set -euo pipefail

SEGMENT=${SEGMENT:-20s}
CONNS=${CONNS:-32}
ROUNDS=${ROUNDS:-3}
TARGETS=${TARGETS:-"nginx tollgate tg_checks"}
BASE_PORT=${BASE_PORT:-18380}

cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh
need_tools nginx wrk curl
if [ -z "${TOLLGATE:-}" ]; then
  build_release
  TOLLGATE=$PWD/target/dist/tollgate
fi
start_scratch

PORT_UP1=$BASE_PORT
PORT_UP2=$((BASE_PORT + 1))
PORT_NG=$((BASE_PORT + 2))
PORT_TG=$((BASE_PORT + 3))
PORT_TG_ADMIN=$((BASE_PORT + 4))

now() { date +%s.%N; }

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

# An upstream instance on port $1 (files in $TMP, named $2); with $3 = log,
# an access log of `$msec $request_uri`.
instance_conf() {
  local log="access_log off;"
  if [ "${3:-}" = log ]; then
    log="log_format t '\$msec \$request_uri'; access_log $TMP/$2.access t buffer=64k flush=1s;"
  fi
  cat <<CONF
daemon off;
worker_processes 1;
pid $TMP/$2.pid;
error_log $TMP/$2.err error;
events { worker_connections 4096; }
http {
  $log
  keepalive_requests 10000000;
  server {
    listen 127.0.0.1:$1;
    location / { return 200 "ok\n"; }
  }
}
CONF
}

nginx_fault_conf() {
  cat <<CONF
daemon off;
worker_processes 1;
pid $TMP/ng.pid;
# error: each refused connection is a line (the sign the fault was seen).
error_log $TMP/ng.err error;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 10000000;
  upstream up {
    server 127.0.0.1:$PORT_UP1 max_fails=1 fail_timeout=5s;
    server 127.0.0.1:$PORT_UP2 max_fails=1 fail_timeout=5s;
    keepalive 64;
    keepalive_requests 10000000;
  }
  server {
    listen 127.0.0.1:$PORT_NG;
    location / {
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
    }
  }
}
CONF
}

# tollgate in front of both instances; $1 = the upstream's health lines.
tollgate_fault_conf() {
  cat <<CONF
[server]
listen = "127.0.0.1:$PORT_TG"
admin = "127.0.0.1:$PORT_TG_ADMIN"
workers = 1

[upstreams.up]
url = ["http://127.0.0.1:$PORT_UP1", "http://127.0.0.1:$PORT_UP2"]
$1

[[routes]]
name = "all"
match = { path_prefix = "/" }
upstream = "up"
retry = { attempts = 2, on = ["connect", "502", "503"] }
CONF
}

RESULTS=$TMP/results.tsv
: >"$RESULTS"

# One wrk run of SEGMENT against port $1, output in $2; checks the counts.
run_wrk() {
  wrk -t1 -c"$CONNS" -d"$SEGMENT" --latency -s bench/lua/statuses.lua "http://127.0.0.1:$1/" >"$2"
}

# Reads run $2 of target $1 in round $4 from file $3 into $RESULTS; checks
# its statuses, and that the "before" run had no error at all.
record() {
  local target=$1 phase=$2 out=$3 round=$4 requests counted bad socket errors p50 p99
  requests=$(awk '$1 == "requests" {print $2}' "$out")
  counted=$(awk '$1 == "status" {n += $3} END {print n + 0}' "$out")
  socket=$(awk '$1 == "socket_errors" {print $2}' "$out")
  [ -n "$requests" ] && [ "$requests" -gt 0 ] || fail "$target $phase: no requests ($(cat "$out"))"
  # wrk counts a request whose socket failed without a response; the
  # statuses must account for every other one.
  [ "$counted" -le "$requests" ] && [ $((requests - counted)) -le "$socket" ] ||
    fail "$target $phase: $counted statuses counted for $requests requests ($socket socket errors)"
  bad=$(awk '$1 == "status" && $2 != 200 && $2 != 502 && $2 != 503 && $2 != 504 {print $2}' "$out" | tr '\n' ' ')
  [ -z "$bad" ] || fail "$target $phase: unexpected statuses $bad"
  errors=$(awk -v s="$socket" '$1 == "status" && ($2 < 200 || $2 > 299) {n += $3} END {print n + s}' "$out")
  # Both instances up: an error here is the setup's, not the fault's.
  [ "$phase" != before ] || [ "$errors" = 0 ] ||
    fail "$target round $round: $errors errors before the fault ($socket socket errors; $(awk '$1 == "status" {printf "%s:%s ", $2, $3}' "$out"))"
  p50=$(awk '$1 == "p50_us" {print $2}' "$out")
  p99=$(awk '$1 == "p99_us" {print $2}' "$out")
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$target" "$round" "$phase" "$requests" "$errors" "$p50" "$p99" \
    "$(awk '$1 == "status" {printf "%s%s:%s", sep, $2, $3; sep = ","}' "$out")" | tee -a "$RESULTS"
}

BACK=$TMP/back.tsv
: >"$BACK"

# One target's three runs, in round $2.
measure() {
  local target=$1 round=$2 proxy_port up2 t_stop t_start first served_before
  instance_conf "$PORT_UP1" up1 >"$TMP/up1.conf"
  instance_conf "$PORT_UP2" up2 log >"$TMP/up2.conf"
  rm -f "$TMP/up2.access"
  start_upstream "$TMP/up1.conf"
  local up1=$STARTED
  start_upstream "$TMP/up2.conf"
  up2=$STARTED
  wait_port "$PORT_UP1"
  wait_port "$PORT_UP2"
  case $target in
    nginx)
      nginx_fault_conf >"$TMP/ng.conf"
      : >"$TMP/ng.err"
      start_nginx "$TMP/ng.conf"
      proxy_port=$PORT_NG
      ;;
    tollgate)
      tollgate_fault_conf 'eject = { after = 1, base = "5s", max = "5s" }' >"$TMP/tg.toml"
      start_tollgate "$TMP/tg.toml"
      proxy_port=$PORT_TG
      ;;
    tg_checks)
      tollgate_fault_conf 'health = { path = "/healthz", interval = "1s", timeout = "500ms", healthy = 1, unhealthy = 1 }' >"$TMP/tg.toml"
      start_tollgate "$TMP/tg.toml"
      proxy_port=$PORT_TG
      ;;
    *) fail "unknown target $target" ;;
  esac
  local proxy=$STARTED
  wait_port "$proxy_port"
  wrk -t1 -c"$CONNS" -d2s "http://127.0.0.1:$proxy_port/" >/dev/null

  local t_before
  t_before=$(now)
  run_wrk "$proxy_port" "$TMP/before.out"
  record "$target" before "$TMP/before.out" "$round"

  run_wrk "$proxy_port" "$TMP/fault.out" &
  local load=$!
  sleep 0.5
  stop "$up2"
  t_stop=$(now)
  wait "$load"
  record "$target" fault "$TMP/fault.out" "$round"

  run_wrk "$proxy_port" "$TMP/after.out" &
  load=$!
  sleep 0.5
  t_start=$(now)
  start_upstream "$TMP/up2.conf"
  up2=$STARTED
  wait_port "$PORT_UP2"
  wait "$load"
  record "$target" after "$TMP/after.out" "$round"

  if [ "$target" != nginx ]; then
    local ejections
    ejections=$(curl -s "http://127.0.0.1:$PORT_TG_ADMIN/metrics" |
      awk -v url="http://127.0.0.1:$PORT_UP2" 'index($0, "tollgate_upstream_ejections_total{") == 1 && index($0, "url=\"" url "\"") {n += $NF} END {print n + 0}')
    [ "$ejections" -gt 0 ] || fail "$target: instance 2 was never ejected: no fault seen"
    echo "# $target: instance 2 ejected $ejections times; log lines: $(wc -l <"$TMP/tg.toml.err")" >&2
    sed 's/^/#   /' "$TMP/tg.toml.err" | cut -c1-220 >&2
  else
    grep -q "Connection refused" "$TMP/ng.err" || fail "nginx: no refused connection in its error log: no fault seen"
    echo "# nginx: error log lines: $(wc -l <"$TMP/ng.err")" >&2
  fi
  stop "$proxy" "$up1" "$up2" # flushes instance 2's buffered log

  served_before=$(awk -v a="$t_before" -v b="$t_stop" '$2 != "/healthz" && $1 >= a && $1 < b' "$TMP/up2.access" | wc -l)
  [ "$served_before" -gt 0 ] || fail "$target: instance 2 served nothing before the fault"
  first=$(awk -v t="$t_start" '$2 != "/healthz" && $1 >= t {print $1; exit}' "$TMP/up2.access")
  [ -n "$first" ] || fail "$target: instance 2 served nothing after it came back"
  printf '%s\t%s\t%s\n' "$target" "$round" "$(awk -v f="$first" -v t="$t_start" 'BEGIN {printf "%.2f", f - t}')" | tee -a "$BACK"
}

echo "# machine: nproc=$(nproc), load average: $(cut -d' ' -f1-3 /proc/loadavg), CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "# $("$NGINX" -v 2>&1), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2), tollgate $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "# wrk -t1 -c$CONNS -d$SEGMENT --latency per run; instance 2 stopped 0.5 s into 'fault', started 0.5 s into 'after'; $ROUNDS rounds"
printf 'target\tround\tphase\trequests\terrors\tp50_us\tp99_us\tstatuses\n'
for round in $(seq 1 "$ROUNDS"); do
  for target in $TARGETS; do
    measure "$target" "$round"
  done
done

echo
echo "# seconds from instance 2 started to its first proxied request (target, round)"
cat "$BACK"
echo
echo "# medians over $ROUNDS rounds [range]; the verdicts compare medians"
awk -F'\t' -v back="$BACK" "$AWK_STATS"'
  BEGIN { while ((getline line < back) > 0) { split(line, f, "\t"); B[f[1]] = B[f[1]] " " f[3] } }
  {
    t = $1; r = $2; phase = $3
    if (!(t in seen)) { seen[t] = 1; order[++n] = t }
    if (phase == "fault") { FE[t] = FE[t] " " $5; PF[t] = PF[t] " " $7; pf[t, r] = $7 }
    if (phase == "after") AE[t] = AE[t] " " $5
    if (phase == "before") { PB[t] = PB[t] " " $7; pb[t, r] = $7 }
    if (phase == "after") { rounds[t] = rounds[t] " " r }
  }
  END {
    printf "%-10s %18s %18s %22s %22s %16s %14s\n", "target", "fault_errors", "after_errors", "p99_before_us", "p99_fault_us", "fault/before", "back_s"
    for (i = 1; i <= n; i++) {
      t = order[i]
      k = split(rounds[t], rs, " "); ratios = ""
      for (j = 1; j <= k; j++) ratios = ratios " " pf[t, rs[j]] / pb[t, rs[j]]
      R[t] = median(ratios); E[t] = median(FE[t]) + median(AE[t]); Q[t] = B[t] == "" ? "" : median(B[t])
      printf "%-10s %18s %18s %22s %22s %16s %14s\n", t, median_range(FE[t], "%d"), median_range(AE[t], "%d"), \
        median_range(PB[t], "%d"), median_range(PF[t], "%d"), median_range(ratios, "%.2f"), \
        (B[t] == "" ? "-" : median_range(B[t], "%.2f"))
    }
    if ("nginx" in seen) {
      for (i = 1; i <= n; i++) {
        t = order[i]
        if (t == "nginx") continue
        printf "%s vs nginx (medians): fault+after errors %d vs %d; fault p99 / before p99 %.2f vs %.2f\n", \
          t, E[t], E["nginx"], R[t], R["nginx"]
        printf "  targets: errors <= nginx: %s; fault p99 <= 2x before: %s%s\n", \
          (E[t] <= E["nginx"] ? "yes" : "NO"), (R[t] <= 2 ? "yes" : "NO"), \
          (t == "tollgate" ? "; back within its 5 s ejection: " (Q[t] <= 5 ? "yes" : "NO") : "")
      }
    }
  }' "$RESULTS"
