#!/usr/bin/env bash
# What a flood costs the clients who behave (issue 29): a legitimate client
# sends RATE requests/s on its own key, open loop (examples/open_loop.rs:
# each request starts on schedule and its latency counts from then, so a
# stall cannot hide behind a waiting client), first alone, then while an
# abusive client floods another key as fast as it can (wrk -t1 -cCONNS,
# every request denied). Reported per server: the legitimate p50 / p99 /
# p99.9 / max without and with the flood, and the flood's rate.
#
# Servers, each in front of the same nginx `return 200` upstream, both
# routes limited per `x-api-key`:
#   nginx1, nginx2   nginx `limit_req`, 1 or 2 workers (the peer)
#   tg1, tg2         tollgate, `workers` = 1 or 2, memory store
#   tg1_redis        tollgate, 1 worker, counters on a local redis-server
#   tg1_remember     tg1_redis with `remember_denials = "1s"`: the flood's
#                    repeated denials answered from the node's memory
#   tg1_base         tollgate, 1 worker, memory store, the binary BASELINE
#                    (a build to compare against, in the same run)
# The legitimate route's limit never binds (1,000,000/s); the flood's
# admits one request a minute. A server of one worker runs on CPU
# SERVER_CPUSET and the clients, the upstream and Redis on CLIENT_CPUSET,
# so the flood's client does not take the server's core; a server of two
# workers shares both cores with them, as it would on a 2-core host.
# Rounds alternate the servers; the figures are medians, with the range.
#
# Run:    bench/flood.sh            (builds the dist binary; SKIP_BUILD=1 not to)
#         bench/flood.sh BINARY
# Knobs:  SERVERS="nginx1 tg1 nginx2 tg2 tg1_redis tg1_remember"  ROUNDS=3  DURATION=10
#         RATE=1000  CONNS=64  SERVER_CPUSET=0  CLIENT_CPUSET=1
#         CLIENT_PRIO=rt (the legitimate client, the upstream and Redis run
#         SCHED_FIFO, ahead of wrk at once; `nice` puts them at nice -10,
#         which CFS only weighs: they then wait up to a few ms for wrk's
#         time slice on their shared core, the same for every server)
#         FLOOD_PRIO=normal (wrk as any process; `idle`: SCHED_IDLE, so it
#         runs only on what the servers leave, as a flood from another
#         machine would: the servers of two workers then have both cores)
#         BASELINE=BINARY (for tg1_base)  STALL_MAX=2000 (us; see below)
#         OPEN_LOOP=BINARY (a built examples/open_loop; unset: built here
#         with `cargo build --release --example open_loop`)
#         BASE_PORT=18480 (uses BASE_PORT .. BASE_PORT+7)
# The machine's own stalls: during every phase a probe per CPU
# (bench/stall_probe.py, SCHED_FIFO above everything else) records how late
# its 1 ms wake-ups are. Its worst lateness is in the round's line (`stall`
# columns); a round where it reached STALL_MAX in either phase measured the
# machine, not the server, and is left out of the medians (the summary
# says how many rounds each median has; with none left, all are used).
#
# Then a pipelined flood, PIPELINED requests (20000; 0: none) sent on one
# connection without waiting (bench/pipelined_flood.py), while the
# legitimate client sends one request on its own connection: reported per
# server, its latency and how many flood responses the server sent before
# answering it (`between`). A count of requests, not a time: the machine's
# stalls delay both connections alike and leave it as it is. It says how
# long one connection may hold a worker while another waits.
# Needs nginx, wrk and redis-server (installed with apt-get when absent).
set -euo pipefail

SERVERS=${SERVERS:-nginx1 tg1 nginx2 tg2 tg1_redis tg1_remember}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}
RATE=${RATE:-1000}
CONNS=${CONNS:-64}
CLIENT_PRIO=${CLIENT_PRIO:-rt}
FLOOD_PRIO=${FLOOD_PRIO:-normal}
STALL_MAX=${STALL_MAX:-2000}
PIPELINED=${PIPELINED:-20000}
SERVER_CPUSET_ONE=${SERVER_CPUSET:-0}
CLIENT_CPUSET=${CLIENT_CPUSET:-1}
BASE_PORT=${BASE_PORT:-18480}
unset SERVER_CPUSET # set per server below (bench/common.sh reads it)
cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh
need_tools nginx wrk redis-server taskset chrt python3
if [ $# -ge 1 ]; then
  TOLLGATE=$(realpath "$1")
else
  build_release
  TOLLGATE=target/dist/tollgate
fi
case " $SERVERS " in
  *" tg1_base "*)
    [ -x "${BASELINE:-}" ] || { echo "tg1_base needs BASELINE=BINARY" >&2; exit 2; }
    BASELINE=$(realpath "$BASELINE")
    ;;
esac
if [ -n "${OPEN_LOOP:-}" ]; then
  OPEN_LOOP=$(realpath "$OPEN_LOOP")
else
  cargo build --release --example open_loop
  OPEN_LOOP=target/release/examples/open_loop
fi
start_scratch

client() { taskset -c "$CLIENT_CPUSET" "$@"; }
# The legitimate client runs ahead of the flood's on their shared core:
# what it measures is the server's delay, not its own wait for a CPU that
# wrk keeps busy. With CLIENT_PRIO=rt it preempts wrk as soon as it wakes
# (SCHED_FIFO; it sleeps between requests, so it cannot starve wrk).
case $CLIENT_PRIO in
  rt) ahead() { chrt -f 10 "$@"; } ;;
  nice) ahead() { nice -n -10 "$@"; } ;;
  *) echo "CLIENT_PRIO is rt or nice, not $CLIENT_PRIO" >&2; exit 2 ;;
esac
legit_client() { ahead taskset -c "$CLIENT_CPUSET" "$@"; }
# Started in the background only: `exec`, so that `$!` is wrk itself (a
# function run with `&` is a subshell whose command is its child, which a
# kill of `$!` would leave running).
case $FLOOD_PRIO in
  normal) flooder() { exec taskset -c "$CLIENT_CPUSET" "$@"; } ;;
  idle) flooder() { exec chrt -i 0 taskset -c "$CLIENT_CPUSET" "$@"; } ;;
  *) echo "FLOOD_PRIO is normal or idle, not $FLOOD_PRIO" >&2; exit 2 ;;
esac
# Moves running processes ahead of wrk in the same way.
put_ahead() {
  if [ "$CLIENT_PRIO" = rt ]; then
    local pid
    for pid in "$@"; do chrt -a -f -p 10 "$pid" >/dev/null 2>&1 || true; done
  else
    renice -n -10 -p "$@" >/dev/null 2>&1 || true
  fi
}

PORT_UP=$BASE_PORT
PORT_REDIS=$((BASE_PORT + 1))
upstream_conf "$PORT_UP" "$TMP" >"$TMP/upstream.conf"
SERVER_CPUSET=$CLIENT_CPUSET start_upstream "$TMP/upstream.conf"
UPSTREAM_PID=$STARTED
wait_port "$PORT_UP"
# taskset execs redis-server, so `$!` is Redis's pid: the one put ahead of
# wrk below and stopped at the end.
taskset -c "$CLIENT_CPUSET" redis-server --port "$PORT_REDIS" --bind 127.0.0.1 --save "" \
  --appendonly no --dir "$TMP" >"$TMP/redis.log" 2>&1 &
REDIS_PID=$!
PIDS+=("$REDIS_PID")
wait_port "$PORT_REDIS"
# The upstream and Redis serve the server under test, and share the
# clients' core with wrk: ahead of it (nice -10) as well, or the
# legitimate requests would wait for wrk's time slices at the upstream.
# shellcheck disable=SC2046 # the pids, one word each
put_ahead "$UPSTREAM_PID" $(pgrep -P "$UPSTREAM_PID") "$REDIS_PID"

# nginx `limit_req` on both routes: $1 = workers, $2 = port.
flood_nginx_conf() {
  cat <<CONF
daemon off;
worker_processes $1;
pid $TMP/ng-$2.pid;
# crit: limit_req logs every denial at "error"; tollgate logs none.
error_log $TMP/ng-$2.err crit;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 10000000;
  limit_req_zone \$http_x_api_key zone=legit$2:10m rate=1000000r/s;
  limit_req_zone \$http_x_api_key zone=flood$2:10m rate=1r/m;
  limit_req_status 429;
  upstream up {
    server 127.0.0.1:$PORT_UP;
    keepalive 64;
    keepalive_requests 10000000;
  }
  server {
    listen 127.0.0.1:$2;
    proxy_http_version 1.1;
    proxy_set_header Connection "";
    location /legit {
      limit_req zone=legit$2 burst=1000 nodelay;
      proxy_pass http://up;
    }
    location /flood {
      limit_req zone=flood$2;
      proxy_pass http://up;
    }
  }
}
CONF
}

# tollgate's routes: $1 = workers, $2 = port, $3 = extra config.
flood_tollgate_conf() {
  cat <<CONF
[server]
listen = "127.0.0.1:$2"
workers = $1

[upstreams.up]
url = "http://127.0.0.1:$PORT_UP"

[limits.legit]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 1000000
refill = "1000000/s"

[limits.flood]
key = "header:x-api-key"
algorithm = "token_bucket"
capacity = 1
refill = "1/m"

[[routes]]
name = "legit"
match = { path_prefix = "/legit" }
upstream = "up"
limits = ["legit"]

[[routes]]
name = "flood"
match = { path_prefix = "/flood" }
upstream = "up"
limits = ["flood"]
$3
CONF
}

REDIS_STORE="
[store]
backend = \"redis\"
url = \"redis://127.0.0.1:$PORT_REDIS\""

# The workers of server $1.
workers_of() {
  case $1 in
    nginx1 | tg1 | tg1_redis | tg1_remember | tg1_base) echo 1 ;;
    nginx2 | tg2) echo 2 ;;
    *) echo "unknown server $1" >&2; exit 2 ;;
  esac
}

# Starts server $1 on port $2: one worker on SERVER_CPUSET, two on all CPUs.
start_server() {
  local workers cpuset=
  workers=$(workers_of "$1")
  [ "$workers" = 1 ] && cpuset=$SERVER_CPUSET_ONE
  case $1 in
    nginx*)
      flood_nginx_conf "$workers" "$2" >"$TMP/$1.conf"
      SERVER_CPUSET=$cpuset start_nginx "$TMP/$1.conf"
      ;;
    tg1_redis)
      flood_tollgate_conf 1 "$2" "$REDIS_STORE" >"$TMP/$1.toml"
      SERVER_CPUSET=$cpuset start_tollgate "$TMP/$1.toml"
      ;;
    tg1_remember)
      flood_tollgate_conf 1 "$2" "$REDIS_STORE
remember_denials = \"1s\"" >"$TMP/$1.toml"
      SERVER_CPUSET=$cpuset start_tollgate "$TMP/$1.toml"
      ;;
    tg1_base)
      flood_tollgate_conf 1 "$2" "" >"$TMP/$1.toml"
      TOLLGATE=$BASELINE SERVER_CPUSET=$cpuset start_tollgate "$TMP/$1.toml"
      ;;
    tg*)
      flood_tollgate_conf "$workers" "$2" "" >"$TMP/$1.toml"
      SERVER_CPUSET=$cpuset start_tollgate "$TMP/$1.toml"
      ;;
  esac
}

declare -A PORT
port=$((BASE_PORT + 2))
for server in $SERVERS; do
  PORT[$server]=$port
  start_server "$server" "$port"
  port=$((port + 1))
done
for server in $SERVERS; do
  wait_port "${PORT[$server]}"
  # Warm-up: connections, allocator caches, the flood key's first grant.
  client "$OPEN_LOOP" "http://127.0.0.1:${PORT[$server]}/legit" "$RATE" 1 "x-api-key: good" >/dev/null
  client wrk -t1 -c"$CONNS" -d1s -H "x-api-key: abuser" "http://127.0.0.1:${PORT[$server]}/flood" >/dev/null
done

# The legitimate client on $1's port, a stall probe on every CPU beside it:
# the client's result line, with " stall_us=" the probes' worst lateness.
CPUS=$(seq 0 $(($(nproc) - 1)))
legit() {
  local cpu worst=0 max result
  # The probes run a second longer than the client, and the client starts
  # once every probe is up: a probe's start-up (tens of ms of CPU, SCHED_FIFO
  # ahead of the server and the client) is then not inside the measurement.
  for cpu in $CPUS; do
    : >"$TMP/probe.$cpu.started"
    chrt -f 20 taskset -c "$cpu" python3 bench/stall_probe.py $((DURATION + 1)) \
      >"$TMP/probe.$cpu" 2>"$TMP/probe.$cpu.started" &
  done
  for cpu in $CPUS; do
    for _ in $(seq 1 200); do
      [ -s "$TMP/probe.$cpu.started" ] && break
      sleep 0.01
    done
    [ -s "$TMP/probe.$cpu.started" ] || { echo "the stall probe on CPU $cpu did not start" >&2; exit 1; }
  done
  sleep 0.1
  result=$(legit_client "$OPEN_LOOP" "http://127.0.0.1:$1/legit" "$RATE" "$DURATION" "x-api-key: good")
  wait # the probes (this runs in a command substitution: its own jobs only)
  for cpu in $CPUS; do
    max=$(sed -n 's/.*max_us=\([0-9]*\).*/\1/p' "$TMP/probe.$cpu")
    [ -n "$max" ] || { echo "the stall probe on CPU $cpu printed nothing" >&2; exit 1; }
    [ "$max" -gt "$worst" ] && worst=$max
  done
  echo "$result stall_us=$worst"
}

# Fails the run unless every legitimate request of line $1 was answered 2xx.
check_legit() {
  local requests ok
  requests=$(sed 's/.*requests=\([0-9]*\).*/\1/' <<<"$1")
  ok=$(sed 's/.* ok=\([0-9]*\).*/\1/' <<<"$1")
  [ "$requests" = "$ok" ] || { echo "$2: $ok of $requests legitimate requests were answered 2xx: $1" >&2; exit 1; }
}

field() { sed "s/.* $1=\\([0-9]*\\).*/\\1/" <<<"$2"; }

echo "# tollgate: $TOLLGATE"
echo "# legitimate: $RATE req/s open loop for ${DURATION}s; flood: wrk -t1 -c$CONNS, all denied, priority $FLOOD_PRIO; $ROUNDS rounds; clients ahead of wrk: $CLIENT_PRIO"
printf 'round\tserver\tquiet_p50\tquiet_p99\tquiet_p999\tquiet_max\tflood_p50\tflood_p99\tflood_p999\tflood_max\tflood_req/s\tquiet_stall\tflood_stall\n'
: >"$TMP/rounds"
for round in $(seq 1 "$ROUNDS"); do
  for server in $SERVERS; do
    p=${PORT[$server]}
    quiet=$(legit "$p")
    check_legit "$quiet" "$server quiet"
    flooder wrk -t1 -c"$CONNS" -d$((DURATION + 2))s -H "x-api-key: abuser" \
      "http://127.0.0.1:$p/flood" >"$TMP/flood.out" &
    flood_pid=$!
    sleep 1
    flooded=$(legit "$p")
    wait "$flood_pid"
    check_legit "$flooded" "$server flood"
    check_statuses deny "$TMP/flood.out" "http://127.0.0.1:$p/flood" -H "x-api-key: abuser"
    rps=$(awk '/^Requests\/sec:/ {printf "%.0f", $2}' "$TMP/flood.out")
    line="$round	$server"
    for us in p50_us p99_us p999_us max_us; do line="$line	$(field "$us" "$quiet")"; done
    for us in p50_us p99_us p999_us max_us; do line="$line	$(field "$us" "$flooded")"; done
    echo "$line	$rps	$(field stall_us "$quiet")	$(field stall_us "$flooded")" | tee -a "$TMP/rounds"
  done
done

# The summaries' figure: "median (min-max)", whole numbers.
FLOOD_STATS="$AWK_STATS"'
  function stat(list) { return sprintf("%d (%s)", median(list), range(list, "%d")) }
'
echo "# medians (min-max) over the rounds whose stall probes stayed below ${STALL_MAX} us (rounds: how many), microseconds"
printf 'server\trounds\tquiet_p50\tquiet_p99\tquiet_p999\tflood_p50\tflood_p99\tflood_p999\tflood_max\tflood_req/s\n'
for server in $SERVERS; do
  kept=$(awk -F'\t' -v s="$server" -v m="$STALL_MAX" '$2 == s && $12 < m && $13 < m' "$TMP/rounds")
  if [ -z "$kept" ]; then
    echo "# $server: every round saw a machine stall of ${STALL_MAX} us or more; its medians are over all rounds" >&2
    kept=$(awk -F'\t' -v s="$server" '$2 == s' "$TMP/rounds")
  fi
  awk -F'\t' -v s="$server" "$FLOOD_STATS"'
    {n++; for (c = 3; c <= 11; c++) col[c] = col[c] " " $c}
    END {printf "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", s, n, stat(col[3]), stat(col[4]), stat(col[5]),
         stat(col[7]), stat(col[8]), stat(col[9]), stat(col[10]), stat(col[11])}' <<<"$kept"
done

# Each tollgate server against the nginx of its worker count, round by
# round (the two phases of a round run minutes apart at most, so a slow
# minute of the machine lands on both): the median ratio of the flooded
# p99 and p99.9, its range, and in how many rounds tollgate's was the
# lower. The rounds spread widely on a shared VM; a count near half says
# the servers are not told apart, whatever the medians say.
echo "# per round, tollgate / nginx of the same worker count, all rounds: median ratio [min-max], rounds where tollgate's is lower"
printf 'server\tpeer\tflood_p99\tlower\tflood_p999\tlower\n'
for server in $SERVERS; do
  [ "${server#tg}" != "$server" ] || continue
  peer=nginx$(workers_of "$server")
  case " $SERVERS " in *" $peer "*) ;; *) continue ;; esac
  awk -F'\t' -v s="$server" -v p="$peer" "$AWK_STATS"'
    $2 == p {p99[$1] = $8; p999[$1] = $9}
    $2 == s {t99[$1] = $8; t999[$1] = $9}
    END {
      for (r in t99) if (r in p99 && p99[r] > 0 && p999[r] > 0) {
        n++
        r99 = r99 " " t99[r] / p99[r]; r999 = r999 " " t999[r] / p999[r]
        w99 += t99[r] < p99[r]; w999 += t999[r] < p999[r]
      }
      if (n) printf "%s\t%s\t%s\t%d of %d\t%s\t%d of %d\n", s, p,
        median_range(r99, "%.2f"), w99, n, median_range(r999, "%.2f"), w999, n
    }' "$TMP/rounds"
done

[ "$PIPELINED" -gt 0 ] || exit 0
echo
echo "# pipelined flood: $PIPELINED requests on one connection, one legitimate request on another; $ROUNDS rounds"
printf 'round\tserver\tlegit_us\tbetween\tflood_ms\n'
: >"$TMP/pipelined"
for round in $(seq 1 "$ROUNDS"); do
  for server in $SERVERS; do
    result=$(client python3 bench/pipelined_flood.py "${PORT[$server]}" "$PIPELINED") ||
      { echo "$server: $result" >&2; exit 1; }
    result=" $result" # field() reads " name=value"
    echo "$round	$server	$(field legit_us "$result")	$(field between "$result")	$(field flood_ms "$result")" |
      tee -a "$TMP/pipelined"
  done
done
echo "# medians (min-max)"
printf 'server\tlegit_us\tbetween\tflood_ms\n'
for server in $SERVERS; do
  awk -F'\t' -v s="$server" "$FLOOD_STATS"'
    $2 == s {l = l " " $3; b = b " " $4; f = f " " $5}
    END {printf "%s\t%s\t%s\t%s\n", s, stat(l), stat(b), stat(f)}' "$TMP/pipelined"
done
