#!/usr/bin/env bash
# CPU time per request, user and kernel apart: tollgate against nginx
# `limit_req`, running side by side, with the load alternating between them.
#
# bench/load.sh measures each server in turn, seconds apart, so a neighbour's
# burst on a shared VM lands on one side only; its CPU figures move by ±10 %
# between runs. Here both servers are up for the whole run and `wrk` drives
# them in strict alternation (tollgate, nginx, tollgate, ...), so slow
# minutes hit both. It reads each server's `utime` and `stime` from
# /proc/PID/stat (nginx's: its workers') around every round and prints
# every round, then the means: user µs/request (the server's own code), sys
# µs/request (the kernel on its behalf), their sum, requests/s, and context
# switches per request (how often the server's threads went to sleep or
# were preempted: each costs a wake-up, which is where a second worker's
# CPU goes when the load leaves it idle between requests), and of them the
# preemptions (involuntary: the thread had work, and a task it woke, the
# upstream or wrk, took its CPU).
#
# Both run WORKERS workers (one by default), configured as in bench/load.sh
# (bench/common.sh), in front of the same nginx `return 200` upstream.
#
# SYSCALLS=1 also counts, over each round, every system call the server
# makes (perf's `raw_syscalls` tracepoint) and the usual ones by name
# (`syscalls:sys_enter_*`), the `recvfrom`s that found nothing (EAGAIN) and
# the `epoll_wait`s with a zero timeout, and prints them per request: what
# one request costs in kernel entries, which the CPU figures cannot tell
# apart. Each traced call costs CPU, so the server making more calls pays
# more: take the CPU figures from a run without SYSCALLS=1.
# Needs perf and root (or perf_event_paranoid <= 1).
#
# Run:    bench/cpu_split.sh [BINARY]   (default: target/dist/tollgate,
#                                        built unless SKIP_BUILD=1)
# Knobs:  MODE=allow|deny  ROUNDS=8  DURATION=4s  CONNS=64  WORKERS=1
#         BASE_PORT=18280  SYSCALLS=1
#         (uses BASE_PORT .. BASE_PORT+2)
# Needs nginx and wrk (installed with apt-get when absent).
set -euo pipefail

MODE=${MODE:-allow}
ROUNDS=${ROUNDS:-8}
DURATION=${DURATION:-4s}
CONNS=${CONNS:-64}
WORKERS=${WORKERS:-1}
BASE_PORT=${BASE_PORT:-18280}
SYSCALLS=${SYSCALLS:-0}
cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh
need_tools nginx wrk
[ "$SYSCALLS" != 1 ] || need_tools perf

# The system calls SYSCALLS=1 counts by name, in its table's order.
NAMED_CALLS="epoll_wait recvfrom sendto writev readv read write getsockopt setsockopt epoll_ctl futex accept4 close"

if [ $# -eq 0 ]; then
  build_release
  set -- "$PWD/target/dist/tollgate"
fi
BINARY=$1

start_scratch
PORT_UP=$BASE_PORT
PORT_TG=$((BASE_PORT + 1))
PORT_NG=$((BASE_PORT + 2))

upstream_conf "$PORT_UP" "$TMP" >"$TMP/upstream.conf"
"$NGINX" -p "$TMP/" -c "$TMP/upstream.conf" >/dev/null 2>&1 &
PIDS+=($!)
wait_port "$PORT_UP"

if [ "$MODE" = deny ]; then
  tollgate_conf "$WORKERS" "$PORT_TG" 1 "1/m" "$PORT_UP" >"$TMP/tollgate.toml"
  nginx_proxy_conf "$WORKERS" "$PORT_NG" "" "1r/m" "$PORT_UP" "$TMP" >"$TMP/nginx.conf"
else
  tollgate_conf "$WORKERS" "$PORT_TG" 1000000 "1000000/s" "$PORT_UP" >"$TMP/tollgate.toml"
  nginx_proxy_conf "$WORKERS" "$PORT_NG" "burst=1000000 nodelay" "1000000r/s" "$PORT_UP" "$TMP" >"$TMP/nginx.conf"
fi
TOLLGATE_LOG=error "$BINARY" run -c "$TMP/tollgate.toml" >/dev/null 2>&1 &
TG_PID=$!
PIDS+=("$TG_PID")
"$NGINX" -p "$TMP/" -c "$TMP/nginx.conf" >/dev/null 2>&1 &
PIDS+=($!)
wait_port "$PORT_TG"
wait_port "$PORT_NG"
# nginx serves in its workers, the master's children (counted with it).
NG_PID=$(cat "$TMP/ng-$PORT_NG.pid")

CLK_TCK=$(getconf CLK_TCK)

# perf stat over the system calls of process $1 and its children, into
# $2, until killed: raw_syscalls first, then NAMED_CALLS, then the empty
# recvfroms and the zero-timeout epoll_waits.
count_calls() {
  local events=raw_syscalls:sys_enter name
  for name in $NAMED_CALLS; do events=$events,syscalls:sys_enter_$name; done
  exec perf stat -x, -o "$2" -p "$(echo "$1" $(pgrep -P "$1" || true) | tr ' ' ,)" \
    -e "$events" -e syscalls:sys_exit_recvfrom --filter 'ret == -11' \
    -e syscalls:sys_enter_epoll_wait --filter 'timeout == 0'
}

# Involuntary context switches of every thread of process $1 and of its
# direct children (ctx_switches counts both kinds).
preemptions() {
  local pid
  for pid in "$1" $(pgrep -P "$1" || true); do
    cat /proc/"$pid"/task/*/status 2>/dev/null || true
  done | awk '/^nonvoluntary_ctxt_switches:/ {n += $2} END {print n + 0}'
}

# One round against 127.0.0.1:$1, served by process $2, labelled $3.
round() {
  local before after switched preempted requests seconds counter=""
  if [ "$SYSCALLS" = 1 ]; then
    count_calls "$2" "$TMP/calls" &
    counter=$!
    sleep 0.2 # perf attaches
  fi
  before=$(cpu_user_sys "$2")
  switched=$(ctx_switches "$2")
  preempted=$(preemptions "$2")
  wrk -t1 -c"$CONNS" -d"$DURATION" "http://127.0.0.1:$1/" >"$TMP/wrk.out"
  after=$(cpu_user_sys "$2")
  switched=$(($(ctx_switches "$2") - switched))
  preempted=$(($(preemptions "$2") - preempted))
  if [ -n "$counter" ]; then
    kill -INT "$counter"
    wait "$counter" || true
  fi
  check_statuses "$MODE" "$TMP/wrk.out" "http://127.0.0.1:$1/"
  requests=$(awk '/requests in/ {print $1}' "$TMP/wrk.out")
  if [ -n "$counter" ]; then
    # One line per round: label, then each count per request, in order.
    awk -F, -v t="$3" -v n="$requests" '/^[0-9]/ { line = line sprintf("\t%.3f", $1 / n) }
      END { print t line }' "$TMP/calls" >>"$TMP/calls.rounds"
  fi
  seconds=$(awk '/requests in/ {gsub("s,", "", $4); print $4}' "$TMP/wrk.out")
  echo "$before $after $requests $seconds $switched $preempted" | awk -v t="$3" -v hz="$CLK_TCK" \
    '{ printf "%s\t%.2f\t%.2f\t%.2f\t%.0f\t%.3f\t%.3f\n", t, ($3 - $1) * 1e6 / hz / $5, ($4 - $2) * 1e6 / hz / $5, ($3 - $1 + $4 - $2) * 1e6 / hz / $5, $5 / $6, $7 / $5, $8 / $5 }'
}

echo "# machine: nproc=$(nproc), CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "# mode=$MODE, wrk -t1 -c$CONNS -d$DURATION, $ROUNDS rounds each, alternating; $WORKERS worker(s) each"
printf 'server\tuser_us/req\tsys_us/req\tcpu_us/req\treq/s\tswitches/req\tpreempted/req\n'
for _ in $(seq 1 "$ROUNDS"); do
  round "$PORT_TG" "$TG_PID" tollgate
  round "$PORT_NG" "$NG_PID" nginx
done | tee "$TMP/rounds"
awk -F'\t' '{ u[$1] += $2; s[$1] += $3; c[$1] += $4; r[$1] += $5; w[$1] += $6; p[$1] += $7; n[$1]++ }
  END {
    printf "\nmean over %d rounds\n", n["tollgate"]
    printf "%-9s %12s %11s %11s %9s %13s %14s\n", "server", "user_us/req", "sys_us/req", "cpu_us/req", "req/s", "switches/req", "preempted/req"
    for (k in n) printf "%-9s %12.2f %11.2f %11.2f %9.0f %13.3f %14.3f\n", k, u[k] / n[k], s[k] / n[k], c[k] / n[k], r[k] / n[k], w[k] / n[k], p[k] / n[k]
    printf "ratios tollgate/nginx: user %.2f, sys %.2f, cpu %.2f, req/s %.2f, switches %.2f\n",
      (u["tollgate"] / n["tollgate"]) / (u["nginx"] / n["nginx"]),
      (s["tollgate"] / n["tollgate"]) / (s["nginx"] / n["nginx"]),
      (c["tollgate"] / n["tollgate"]) / (c["nginx"] / n["nginx"]),
      (r["tollgate"] / n["tollgate"]) / (r["nginx"] / n["nginx"]),
      (w["nginx"] > 0 ? w["tollgate"] / w["nginx"] : 0)
  }' "$TMP/rounds"
if [ "$SYSCALLS" = 1 ]; then
  # The calls by name: a request's minimum is four (a recv and a send each
  # way); the tracepoints ran while wrk did, the last 0.2 s of perf's
  # attaching before it included (idle).
  awk -F'\t' -v names="all $NAMED_CALLS recvfrom->EAGAIN epoll_wait(0)" '
    { n[$1]++; for (i = 2; i <= NF; i++) s[$1, i] += $i; if (NF > nf) nf = NF }
    END {
      split(names, N, " ")
      printf "\nsystem calls per request (mean over %d rounds)\n%-16s %9s %9s\n", n["tollgate"], "call", "tollgate", "nginx"
      for (i = 2; i <= nf; i++) {
        a = s["tollgate", i] / n["tollgate"]; b = s["nginx", i] / n["nginx"]
        if (a >= 0.0005 || b >= 0.0005) printf "%-16s %9.3f %9.3f\n", N[i - 1], a, b
      }
    }' "$TMP/calls.rounds"
fi
