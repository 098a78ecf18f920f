#!/usr/bin/env bash
# TLS and HTTP/2 load test: tollgate `[server.tls]` against nginx
# `listen ssl http2`, on one machine, over loopback, interleaved
# A B C D A B C D ... so noise hits all alike.
#
# Both terminate TLS with the same certificate (ECDSA P-256, made here with
# `openssl req -x509` in the scratch directory), forward to the same nginx
# `return 200` upstream over HTTP/1.1 keep-alive, and limit per client IP as
# bench/load.sh does (bench/common.sh holds the configurations both scripts
# use):
#   tg_allow  tollgate, token bucket that never denies
#   ng_allow  nginx `limit_req` rate = burst = 1,000,000/s, nodelay
#   tg_deny   tollgate, token bucket of 1 refilled 1/min: all but one are 429
#   ng_deny   nginx `limit_req` 1r/m, `limit_req_status 429`
# tollgate runs `workers = 1`, nginx `worker_processes 1`: one serving
# thread each (the gateway, the upstream and the load generator share the
# machine's cores).
#
# The tests, each on every target in turn:
#   handshake  a new connection per request, with a full TLS handshake:
#              HS_CLIENTS parallel `openssl s_time -new -www /` (each
#              connection a new session, no resumption, one HTTP/1.0 GET,
#              closed by the server); connections/s over the wall clock.
#              (wrk and h2load would resume: both keep the session of a
#              closed connection for the next, and nginx's default tickets
#              and rustls's default session cache would honour it.)
#   keepalive  `wrk -tWRK_THREADS -cCONNS --latency` over HTTPS/1.1 keep-alive
#   h2         `h2load -c H2_CLIENTS -m H2_STREAMS -D DURATION` (ALPN h2)
# Both sides negotiate TLS 1.3 with what the client (OpenSSL) prefers; the
# protocol, cipher and key exchange each server chose are printed at the top.
#
# Per run: requests/s; p99 (wrk only: s_time and h2load report none, and
# the per-run lines show 0 there); the share of non-2xx answers (s_time
# sees no status, so its HTTP/1.0 answers are checked once before the
# rounds); the gateway's CPU time per request: utime+stime from
# /proc/PID/stat (nginx: master + worker) before and after the run, over
# completed requests; the load generator's CPU in cores (user+sys over the
# run's wall time: near 1.0 for one wrk thread means the client set the
# pace) and the upstream's CPU per request (the three share the machine's
# cores). The size of each target's answer is printed at the top. Then the median over rounds per test and target, and
# the ratios tollgate/nginx.
#
# Run (as root, or with the tools installed):   bench/tls.sh
# Knobs (environment): DURATION=5s ROUNDS=3 CONNS=64 WRK_THREADS=1 HS_CLIENTS=8
#                      H2_CLIENTS=16 H2_STREAMS=10 TESTS="handshake keepalive h2"
#                      BASE_PORT=20180 (uses BASE_PORT .. BASE_PORT+6)
#                      SKIP_BUILD=1 (use the existing target/dist/tollgate)
#                      SERVER_CPU=0.5 (each compared server gets that many
#                      cores of CPU time in its own cgroup, bench/common.sh;
#                      the upstream and the client are not capped, so the
#                      server sets the pace, as with a client on another
#                      machine. Needs root. Unset: nothing is capped.)
# Needs nginx, wrk, h2load (nghttp2-client), openssl and curl (installed
# with apt-get when absent). Everything it writes lives in a `mktemp -d`
# directory, removed at exit, and every process it starts is stopped at exit.
set -euo pipefail

DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-3}
CONNS=${CONNS:-64}
WRK_THREADS=${WRK_THREADS:-1}
HS_CLIENTS=${HS_CLIENTS:-8}
H2_CLIENTS=${H2_CLIENTS:-16}
H2_STREAMS=${H2_STREAMS:-10}
TESTS=${TESTS:-"handshake keepalive h2"}
BASE_PORT=${BASE_PORT:-20180}

cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh
if ! command -v h2load >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq nghttp2-client >/dev/null
fi
need_tools nginx wrk openssl curl
build_release
TOLLGATE=$PWD/target/dist/tollgate
start_scratch

PORT_UP=$BASE_PORT
PORT_TG_ALLOW=$((BASE_PORT + 1))
PORT_TG_DENY=$((BASE_PORT + 2))
PORT_NG_ALLOW=$((BASE_PORT + 3))
PORT_NG_DENY=$((BASE_PORT + 4))
# tollgate needs a cleartext listener too; nothing is sent to these.
PORT_TG_ALLOW_PLAIN=$((BASE_PORT + 5))
PORT_TG_DENY_PLAIN=$((BASE_PORT + 6))

# ---- the certificate: ECDSA P-256, for localhost and 127.0.0.1 ---------------
make_tls_cert "$TMP"

# ---- the upstream and the targets --------------------------------------------
upstream_conf "$PORT_UP" "$TMP" >"$TMP/upstream.conf"
start_upstream "$TMP/upstream.conf"
UPSTREAM=$STARTED
wait_port "$PORT_UP"

nginx_tls_conf "$PORT_NG_ALLOW" "burst=1000000 nodelay" "1000000r/s" "$PORT_UP" "$TMP" >"$TMP/ng-allow.conf"
nginx_tls_conf "$PORT_NG_DENY" "" "1r/m" "$PORT_UP" "$TMP" >"$TMP/ng-deny.conf"

tollgate_tls_conf "$PORT_TG_ALLOW" "$PORT_TG_ALLOW_PLAIN" 1000000 "1000000/s" "$PORT_UP" "$TMP" >"$TMP/tg-allow.toml"
tollgate_tls_conf "$PORT_TG_DENY" "$PORT_TG_DENY_PLAIN" 1 "1/m" "$PORT_UP" "$TMP" >"$TMP/tg-deny.toml"

start_tollgate "$TMP/tg-allow.toml"; TG_ALLOW=$STARTED
start_tollgate "$TMP/tg-deny.toml"; TG_DENY=$STARTED
start_nginx "$TMP/ng-allow.conf"; NG_ALLOW=$STARTED
start_nginx "$TMP/ng-deny.conf"; NG_DENY=$STARTED
# A target that does not come up shows why (e.g. a port of the range in use).
for port in "$PORT_TG_ALLOW" "$PORT_TG_DENY" "$PORT_NG_ALLOW" "$PORT_NG_DENY"; do
  (wait_port "$port") || { tail -n 5 "$TMP"/*.err >&2; exit 1; }
done

# Every target answers over HTTPS/1.1 and h2 with the status expected.
for target in "$PORT_TG_ALLOW 200" "$PORT_NG_ALLOW 200"; do
  set -- $target
  for version in --http1.1 --http2; do
    code=$(curl -sk "$version" -o /dev/null -w '%{http_code}' "https://127.0.0.1:$1/")
    [ "$code" = "$2" ] || { echo "port $1 ($version) answers $code, not $2" >&2; exit 1; }
  done
done

# s_time's request (HTTP/1.0, no Host, closed by the server) is answered
# as the others are: 200 when allowed, 429 when denied (the first request
# on a deny target spends its one token).
http10_status() {
  printf 'GET / HTTP/1.0\r\n\r\n' | timeout 5 openssl s_client -quiet -connect "127.0.0.1:$1" 2>/dev/null |
    awk 'NR == 1 {print $2}'
}
for target in "$PORT_TG_ALLOW 200" "$PORT_NG_ALLOW 200" "$PORT_TG_DENY 200" "$PORT_NG_DENY 200" \
  "$PORT_TG_DENY 429" "$PORT_NG_DENY 429"; do
  set -- $target
  code=$(http10_status "$1")
  [ "$code" = "$2" ] || { echo "port $1 answers HTTP/1.0 with $code, not $2" >&2; exit 1; }
done

# What each server negotiates with an OpenSSL client.
negotiated() {
  echo | openssl s_client -connect "127.0.0.1:$1" -alpn h2,http/1.1 2>/dev/null |
    awk -F': ' '/^(New|Protocol|Cipher is|Server Temp Key|Peer signature type|ALPN)/ {printf "%s; ", $0}'
}

CLK_TCK=$(getconf CLK_TCK)
RESULTS=$TMP/results.tsv
: >"$RESULTS"

# One bounded run of test $1 against target $2 (port $3, server pid $4).
measure() {
  local test=$1 target=$2 port=$3 pid=$4 round=$5 out=$TMP/run.out before after
  local rps p99=0 requests non2xx=0 up_before up_after
  before=$(cpu_ticks "$pid")
  up_before=$(cpu_ticks "$UPSTREAM")
  # The load generator's CPU over the run, in cores (user+sys over real):
  # near 1.0 for a one-thread client means the client, not the server, set
  # the pace.
  local TIMEFORMAT='%3R %3U %3S'
  { time {
  case $test in
    handshake)
      local clients=() i start
      start=$(date +%s%N)
      for i in $(seq 1 "$HS_CLIENTS"); do
        openssl s_time -connect "127.0.0.1:$port" -new -www / -time "${DURATION%s}" >"$out.$i" 2>&1 &
        clients+=($!)
      done
      wait "${clients[@]}"
      awk -v ns=$(($(date +%s%N) - start)) '/connections\/user sec/ {n += $1}
        END {printf "Requests/sec: %.0f\n%d requests in\n", n * 1e9 / ns, n}' "$out".* >"$out"
      rm -f "$out".*
      ;;
    keepalive)
      wrk -t"$WRK_THREADS" -c"$CONNS" -d"$DURATION" --latency "https://127.0.0.1:$port/" >"$out"
      ;;
    h2)
      h2load -c"$H2_CLIENTS" -m"$H2_STREAMS" -D"${DURATION%s}" "https://127.0.0.1:$port/" >"$out"
      ;;
  esac
  }; } 2>"$TMP/client.time"
  after=$(cpu_ticks "$pid")
  # The statuses the run measured must be the target's (s_time's
  # handshakes fetch a page but report none).
  local expect=allow
  case $target in *_deny) expect=deny ;; esac
  case $test in
    keepalive) check_statuses "$expect" "$out" "https://127.0.0.1:$port/" ;;
    h2)
      local ok bad
      ok=$(awk '/^status codes:/ {print $3}' "$out")
      bad=$(awk '/^status codes:/ {print $7 + $9}' "$out")
      if [ "$expect" = allow ] && [ "${bad:-1}" != 0 ]; then
        echo "$target: h2load saw ${bad:-no} 4xx/5xx responses on the allowed path" >&2
        exit 1
      fi
      if [ "$expect" = deny ] && [ "${ok:-3}" -gt 2 ]; then
        echo "$target: h2load saw ${ok:-no} 2xx responses on the denied path" >&2
        exit 1
      fi
      ;;
  esac
  up_after=$(cpu_ticks "$UPSTREAM")
  if [ "$test" = h2 ]; then
    rps=$(awk '/^finished in/ {print $4}' "$out")
    requests=$(awk '/^requests:/ {print $6}' "$out")
    non2xx=$(awk '/^status codes:/ {print $5 + $7 + $9}' "$out")
  else
    rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
    p99=$(to_us "$(awk '$1 == "99%" {print $2}' "$out")")
    requests=$(awk '/requests in/ {print $1}' "$out")
    non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' "$out")
  fi
  awk -v test="$test" -v t="$target" -v r="$round" -v rps="$rps" -v p99="$p99" \
    -v n="${requests:-0}" -v d=$((after - before)) -v bad="${non2xx:-0}" -v hz="$CLK_TCK" \
    -v client="$(tail -1 "$TMP/client.time")" -v up=$((up_after - up_before)) 'BEGIN {
      split(client, c, " ")
      printf "%s\t%s\t%s\t%.0f\t%s\t%.2f\t%.3f\t%.2f\t%.2f\n", test, t, r, rps, p99,
        (n > 0 ? d * 1e6 / hz / n : 0), (n > 0 ? bad / n : 0), (c[1] > 0 ? (c[2] + c[3]) / c[1] : 0),
        (n > 0 ? up * 1e6 / hz / n : 0)
    }' | tee -a "$RESULTS"
}

echo "# machine: nproc=$(nproc), CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//')"
echo "# $("$NGINX" -v 2>&1) ($("$NGINX" -V 2>&1 | grep -o 'running with OpenSSL [^ ]*' || true)), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2), $(h2load --version)"
echo "# tollgate negotiates: $(negotiated "$PORT_TG_ALLOW")"
echo "# nginx negotiates:    $(negotiated "$PORT_NG_ALLOW")"
# What the client decrypts per answer (wrk's share of the work grows with it).
for target in "tg_allow $PORT_TG_ALLOW" "ng_allow $PORT_NG_ALLOW" "tg_deny $PORT_TG_DENY" "ng_deny $PORT_NG_DENY"; do
  read -r name port <<<"$target"
  echo "# $name answer: $(curl -sk -o /dev/null -w '%{http_code}, head %{size_header} B, body %{size_download} B' "https://127.0.0.1:$port/")"
done
echo "# servers compared: $([ -n "${SERVER_CPU:-}" ] && echo "capped at $SERVER_CPU cores each" || echo "not capped")"
echo "# handshake: $HS_CLIENTS x openssl s_time -new -www /; keepalive: wrk -t1 -c$CONNS; h2: h2load -c$H2_CLIENTS -m$H2_STREAMS; each -d $DURATION; rounds=$ROUNDS"
printf 'test\ttarget\tround\treq/s\tp99_us\tcpu_us/req\tnon2xx\tclient_cores\tupstream_us/req\n'
for round in $(seq 1 "$ROUNDS"); do
  for test in $TESTS; do
    measure "$test" tg_allow "$PORT_TG_ALLOW" "$TG_ALLOW" "$round"
    measure "$test" ng_allow "$PORT_NG_ALLOW" "$NG_ALLOW" "$round"
    measure "$test" tg_deny "$PORT_TG_DENY" "$TG_DENY" "$round"
    measure "$test" ng_deny "$PORT_NG_DENY" "$NG_DENY" "$round"
  done
done

echo
echo "# median over $ROUNDS rounds"
awk -F'\t' "$AWK_STATS"'
  {
    k = $1 SUBSEP $2
    rps[k] = rps[k] " " $4; p99[k] = p99[k] " " $5; cpu[k] = cpu[k] " " $6; bad[k] = bad[k] " " $7; cli[k] = cli[k] " " $8; up[k] = up[k] " " $9
    if (!($1 in seen)) { seen[$1] = 1; order[++nt] = $1 }
  }
  END {
    split("tg_allow ng_allow tg_deny ng_deny", targets, " ")
    printf "%-10s %-9s %9s %8s %11s %7s %12s %15s\n", "test", "target", "req/s", "p99_us", "cpu_us/req", "non2xx", "client_cores", "upstream_us/req"
    for (i = 1; i <= nt; i++) {
      T = order[i]
      for (t = 1; t <= 4; t++) {
        k = T SUBSEP targets[t]
        R[targets[t]] = median(rps[k]); P[targets[t]] = median(p99[k]); C[targets[t]] = median(cpu[k])
        # p99 only where wrk measured it (s_time and h2load report none).
        p = (T == "keepalive") ? sprintf("%.0f", P[targets[t]]) : "-"
        printf "%-10s %-9s %9.0f %8s %11.2f %7.3f %12.2f %15.2f\n", T, targets[t], R[targets[t]], p, C[targets[t]], median(bad[k]), median(cli[k]), median(up[k])
      }
      printf "%-10s ratios tollgate/nginx: allow req/s %.2f, cpu/req %.2f | deny req/s %.2f, cpu/req %.2f\n", T, \
        R["tg_allow"] / R["ng_allow"], C["tg_allow"] / C["ng_allow"], R["tg_deny"] / R["ng_deny"], C["tg_deny"] / C["ng_deny"]
    }
  }' "$RESULTS"
