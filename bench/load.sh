#!/usr/bin/env bash
# Load test: tollgate against nginx `limit_req`, on one machine, over loopback.
#
# What it measures, with wrk (`-t1 -c64 -d5s --latency` by default) and a fixed
# connection count, interleaved A B C D E A B C D E ... so noise hits all alike:
#   direct      the upstream alone: nginx `return 200`, 1 worker, own port
#   tg_allow    tollgate -> upstream, token bucket that never denies
#   ng_allow    nginx proxy -> upstream, `limit_req` configured the same way
#               (rate = burst = 1,000,000/s, nodelay), HTTP/1.1 upstream keepalive
#   tg_deny     tollgate, token bucket of 1 refilled 1/min: all but one are 429
#   ng_deny     nginx, `limit_req` 1r/m, `limit_req_status 429`: the same
#   hp_tcp      haproxy `mode tcp` -> upstream (`nbthread` = workers): an L4
#               relay that parses no HTTP and limits nothing, one upstream
#               connection per client connection; what a proxy costs with
#               no HTTP work at all (the allowed path's req/s target is
#               set against it where it is the lower). Left out
#               when haproxy is not installed.
# The whole matrix runs once per worker count in $WORKERS (tollgate
# `[server] workers = N`, nginx `worker_processes N`), $ROUNDS times each.
#
# Per run it records requests/s, p50, p99, the share of non-2xx answers, and
# the server's own CPU time per request: utime+stime from /proc/PID/stat
# (nginx: master + workers) before and after the run, over requests completed.
# It then prints the median over rounds per target and the ratios
# tollgate/nginx (throughput, p99, CPU/request) and tollgate deny/allow.
#
# Both proxies do the same work per request: forward with HTTP/1.1 keep-alive,
# add X-Forwarded-For/-Proto; neither writes an access log or logs denials.
# tollgate also writes its default RateLimit headers (draft + legacy).
#
# Run (as root, or with nginx and wrk installed):   bench/load.sh
# Knobs (environment): THREADS=1 CONNS=64 DURATION=5s ROUNDS=3 WORKERS="1 2"
#                      BASE_PORT=18080 (uses BASE_PORT .. BASE_PORT+5)
#                      SKIP_BUILD=1 (use the existing target/dist/tollgate)
#                      TOLLGATE=BINARY (another build; implies no build)
#                      TARGETS="direct tg_allow ng_allow hp_tcp" (a subset,
#                      in this order; default all six)
#                      SERVER_CPU=0.5 (cap each compared server, bench/common.sh)
# Everything it writes lives in a `mktemp -d` directory, removed at exit, and
# every process it starts is stopped at exit.
set -euo pipefail

THREADS=${THREADS:-1}
CONNS=${CONNS:-64}
DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-3}
WORKERS=${WORKERS:-"1 2"}
BASE_PORT=${BASE_PORT:-18080}

cd "$(dirname "$0")/.."

# ---- tools -------------------------------------------------------------------
# shellcheck source=bench/common.sh
. bench/common.sh
need_tools nginx wrk
if [ -z "${TOLLGATE:-}" ]; then
  build_release
  TOLLGATE=$PWD/target/dist/tollgate
fi
HAPROXY=$(command -v haproxy || { [ -x /usr/sbin/haproxy ] && echo /usr/sbin/haproxy; } || true)
TARGETS=${TARGETS:-"direct tg_allow ng_allow tg_deny ng_deny hp_tcp"}
if [ -z "$HAPROXY" ]; then
  echo "# haproxy is not installed: hp_tcp left out (apt-get install haproxy)"
  TARGETS=$(echo "$TARGETS" | sed 's/hp_tcp//')
fi

# ---- scratch directory and the children to stop at exit ----------------------
start_scratch

PORT_UP=$BASE_PORT
PORT_TG_ALLOW=$((BASE_PORT + 1))
PORT_TG_DENY=$((BASE_PORT + 2))
PORT_NG_ALLOW=$((BASE_PORT + 3))
PORT_NG_DENY=$((BASE_PORT + 4))
PORT_HP=$((BASE_PORT + 5))

# haproxy as an L4 relay to the upstream: $1 = threads, $2 = port, $3 = the
# upstream's port. No logs, as the others.
haproxy_conf() {
  cat <<CONF
global
  nbthread $1
  maxconn 4096
defaults
  mode tcp
  timeout connect 5s
  timeout client 60s
  timeout server 60s
frontend relay
  bind 127.0.0.1:$2
  default_backend up
backend up
  server up 127.0.0.1:$3
CONF
}


# ---- the upstream: nginx `return 200`, 1 worker --------------------------------
upstream_conf "$PORT_UP" "$TMP" >"$TMP/upstream.conf"
start_upstream "$TMP/upstream.conf"
UP_PID=$STARTED
wait_port "$PORT_UP"

CLK_TCK=$(getconf CLK_TCK)
RESULTS=$TMP/results.tsv
: >"$RESULTS"

# One bounded wrk run against target $2 (port $3, server pid $4), workers $1.
measure() {
  local workers=$1 target=$2 port=$3 pid=$4 round=$5 out before after
  out=$TMP/wrk.out
  before=$(cpu_ticks "$pid")
  wrk -t"$THREADS" -c"$CONNS" -d"$DURATION" --latency "http://127.0.0.1:$port/" >"$out"
  after=$(cpu_ticks "$pid")
  case $target in
    *_deny) check_statuses deny "$out" "http://127.0.0.1:$port/" ;;
    *) check_statuses allow "$out" ;;
  esac
  local rps p50 p99 requests non2xx cpu_us
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
  p50=$(to_us "$(awk '$1 == "50%" {print $2}' "$out")")
  p99=$(to_us "$(awk '$1 == "99%" {print $2}' "$out")")
  requests=$(awk '/requests in/ {print $1}' "$out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' "$out")
  non2xx=${non2xx:-0}
  cpu_us=$(awk -v d=$((after - before)) -v n="$requests" -v hz="$CLK_TCK" \
    'BEGIN { printf "%.2f", (n > 0 ? d * 1e6 / hz / n : 0) }')
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$workers" "$round" "$target" "$rps" \
    "$p50" "$p99" "$cpu_us" "$(awk -v a="$non2xx" -v n="$requests" 'BEGIN { printf "%.3f", n ? a / n : 0 }')" \
    | tee -a "$RESULTS"
}

echo "# machine: nproc=$(nproc), CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "# $("$NGINX" -v 2>&1), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2)"
echo "# wrk -t$THREADS -c$CONNS -d$DURATION --latency; rounds=$ROUNDS; workers: $WORKERS"
printf 'workers\tround\ttarget\treq/s\tp50_us\tp99_us\tcpu_us/req\tnon2xx\n'

for workers in $WORKERS; do
  tollgate_conf "$workers" "$PORT_TG_ALLOW" 1000000 "1000000/s" "$PORT_UP" >"$TMP/tg-allow.toml"
  tollgate_conf "$workers" "$PORT_TG_DENY" 1 "1/m" "$PORT_UP" >"$TMP/tg-deny.toml"
  nginx_proxy_conf "$workers" "$PORT_NG_ALLOW" "burst=1000000 nodelay" "1000000r/s" "$PORT_UP" "$TMP" >"$TMP/ng-allow.conf"
  nginx_proxy_conf "$workers" "$PORT_NG_DENY" "" "1r/m" "$PORT_UP" "$TMP" >"$TMP/ng-deny.conf"
  start_tollgate "$TMP/tg-allow.toml"
  TG_ALLOW=$STARTED
  start_tollgate "$TMP/tg-deny.toml"
  TG_DENY=$STARTED
  start_nginx "$TMP/ng-allow.conf"
  NG_ALLOW=$STARTED
  start_nginx "$TMP/ng-deny.conf"
  NG_DENY=$STARTED
  HP=
  if [ -n "$HAPROXY" ]; then
    haproxy_conf "$workers" "$PORT_HP" "$PORT_UP" >"$TMP/haproxy.cfg"
    cpu_cap_dir
    capped "$HAPROXY" -db -f "$TMP/haproxy.cfg" >/dev/null 2>&1 &
    HP=$!
    PIDS+=("$HP")
  fi
  for port in "$PORT_TG_ALLOW" "$PORT_TG_DENY" "$PORT_NG_ALLOW" "$PORT_NG_DENY" ${HP:+"$PORT_HP"}; do
    wait_port "$port"
  done
  for round in $(seq 1 "$ROUNDS"); do
    for target in $TARGETS; do
      case $target in
        direct) measure "$workers" direct "$PORT_UP" "$UP_PID" "$round" ;;
        tg_allow) measure "$workers" tg_allow "$PORT_TG_ALLOW" "$TG_ALLOW" "$round" ;;
        ng_allow) measure "$workers" ng_allow "$PORT_NG_ALLOW" "$NG_ALLOW" "$round" ;;
        tg_deny) measure "$workers" tg_deny "$PORT_TG_DENY" "$TG_DENY" "$round" ;;
        ng_deny) measure "$workers" ng_deny "$PORT_NG_DENY" "$NG_DENY" "$round" ;;
        hp_tcp) measure "$workers" hp_tcp "$PORT_HP" "$HP" "$round" ;;
        *) echo "unknown target $target" >&2; exit 2 ;;
      esac
    done
  done
  stop "$TG_ALLOW" "$TG_DENY" "$NG_ALLOW" "$NG_DENY" $HP
done

# ---- summary: medians over rounds, ratios -------------------------------------
echo
echo "# median over $ROUNDS rounds"
awk -F'\t' -v targets="$TARGETS" "$AWK_STATS"'
  function ratio(a, b) { return (a in R && b in R && R[b] > 0) ? sprintf("%.2f", R[a] / R[b]) : "-" }
  function cratio(a, b) { return (a in C && b in C && C[b] > 0) ? sprintf("%.2f", C[a] / C[b]) : "-" }
  function pratio(a, b) { return (a in P && b in P && P[b] > 0) ? sprintf("%.2f", P[a] / P[b]) : "-" }
  {
    k = $1 SUBSEP $3
    rps[k] = rps[k] " " $4; p50[k] = p50[k] " " $5; p99[k] = p99[k] " " $6
    cpu[k] = cpu[k] " " $7; bad[k] = bad[k] " " $8
    if (!($1 in seen)) { seen[$1] = 1; order[++nw] = $1 }
  }
  END {
    nt = split(targets, T, " ")
    for (w = 1; w <= nw; w++) {
      W = order[w]
      delete R; delete P; delete C
      printf "\nworkers=%s\n%-9s %10s %9s %9s %11s %7s\n", W, "target", "req/s", "p50_us", "p99_us", "cpu_us/req", "non2xx"
      for (t = 1; t <= nt; t++) {
        k = W SUBSEP T[t]
        if (!(k in rps)) continue
        R[T[t]] = median(rps[k]); P[T[t]] = median(p99[k]); C[T[t]] = median(cpu[k])
        printf "%-9s %10.0f %9.0f %9.0f %11.2f %7.3f\n", T[t], R[T[t]], median(p50[k]), P[T[t]], C[T[t]], median(bad[k])
      }
      printf "ratios tollgate/nginx: allow req/s %s, p99 %s, cpu/req %s | deny req/s %s, p99 %s, cpu/req %s\n", \
        ratio("tg_allow", "ng_allow"), pratio("tg_allow", "ng_allow"), cratio("tg_allow", "ng_allow"), \
        ratio("tg_deny", "ng_deny"), pratio("tg_deny", "ng_deny"), cratio("tg_deny", "ng_deny")
      printf "allow req/s against haproxy mode tcp: tollgate %s, nginx %s (cpu/req %s, %s)\n", \
        ratio("tg_allow", "hp_tcp"), ratio("ng_allow", "hp_tcp"), cratio("tg_allow", "hp_tcp"), cratio("ng_allow", "hp_tcp")
      printf "tollgate deny/allow req/s %s; allow/direct req/s: tollgate %s, nginx %s\n", \
        ratio("tg_deny", "tg_allow"), ratio("tg_allow", "direct"), ratio("ng_allow", "direct")
    }
  }' "$RESULTS"
