#!/usr/bin/env bash
# The decision service (`[decision] listen`) under load: what a gRPC
# decision costs tollgate beside a proxied request, and what nginx
# `auth_request` to tollgate's `/auth` gives beside nginx `limit_req`.
#
# One tollgate (`workers = 1`: the proxy and the decision listener share
# the one runtime thread; memory store) serves both sides:
#   [server] listen   route `all` (limit per_ip, the never-denying token
#                     bucket of bench/load.sh: capacity = 1,000,000, refill
#                     1,000,000/s) and route `deny` (/deny/, per_ip_deny,
#                     capacity 1 refilled 1/h: all but one are 429), both
#                     in front of nginx `return 200` (bench/common.sh)
#   [decision] listen gRPC: domain `edge`, descriptor `remote_address` ->
#                     per_ip_rls (the same bucket as per_ip, keyed by the
#                     descriptor); domain `edge_deny` -> per_ip_rls_deny
#                     (capacity 1, 1/h); `/auth` with `deny_status = 403`,
#                     deciding by the routes above
# The targets, each in turn, interleaved A B C ... A B C ... ROUNDS times so
# noise hits all alike:
#   grpc_allow   h2load POSTs one fixed ShouldRateLimit call (domain edge,
#                one descriptor remote_address=10.0.0.1, gRPC-framed) over
#                h2c: every answer OK
#   proxy_allow  wrk through tollgate's proxy listener to the upstream: 200
#   grpc_deny    the same call for domain edge_deny: every answer OVER_LIMIT
#   proxy_deny   wrk to /deny/ through the proxy listener: 429
#   ng_auth      nginx (1 worker) `auth_request` to tollgate's /auth
#                (X-Original-Method, X-Original-URI, X-Real-IP; keep-alive
#                to tollgate and to the upstream), then proxy_pass as
#                bench/load.sh's nginx does, without limit_req: 200
#   ng_auth_null the same nginx `auth_request`, to an nginx `return 204`
#                (1 worker, on the servers' core as tollgate is) in place of
#                tollgate: what the subrequest costs with an auth server
#                that does nothing, the ceiling of any forward-auth service
#   ng_limit     nginx (1 worker) with `limit_req` alone, as bench/load.sh
#                configures it (rate = burst = 1,000,000/s, nodelay): 200
# The same number of requests in flight everywhere: wrk -t1 -cCONNS, and
# h2load -cH2_CLIENTS -mH2_STREAMS (4 x 16 = 64 by default: Envoy calls its
# rate-limit service over few HTTP/2 connections, many streams on each).
#
# Pinning (2 cores): the servers compared — tollgate and the nginx in front
# — run on SERVER_CPUS (taskset; nginx's worker and tollgate's threads
# inherit it), the load generator and the upstream on CLIENT_CPUS. So
# ng_auth's nginx and tollgate share one core, as a gateway box's proxy and
# its rate-limit sidecar would (ng_auth_null's nginx and its stand-in the
# same), and ng_limit's nginx has the same core to itself: the req/s ratio
# is what the sidecar costs the box. Each run prints how busy every CPU was
# (from /proc/stat): a server core near 1.00 means the servers, not the
# client, set the pace. (Other processes on the machine count there too.)
#
# Each run fails the bench (exit 1, with what was wrong) when an answer is
# not what its target measures (bench/common.sh's check_statuses: any
# non-2xx where all are admitted, anything but 429 where all are refused,
# probed; for h2load, a stream error, a timeout or a non-2xx answer) or
# when the client saw a socket error: ng_limit, whose req/s the headline
# ratio divides by, included.
#
# Per run: req/s (the client's), the decider's CPU time per request
# (tollgate's; in ng_auth_null the stand-in nginx's; none in ng_limit,
# whose nginx decides itself) and the front nginx's (utime+stime from
# /proc/PID/stat, nginx master + worker, before and after the run, over the
# requests completed), the upstream's, the share of non-2xx answers, and
# each CPU's busy share. Each run is checked against tollgate's own
# counters (admin /metrics): the decisions it counted, allowed or denied as
# the target expects, match the requests the client completed (within the
# requests in flight), so a malformed call or a wrong route cannot pass for
# a fast one. Then the medians over rounds and the ratios of the issue's
# targets (a gRPC decision's CPU <= a proxied request's; auth_request's
# req/s >= 0.7 x limit_req's), each round's after the median, and the
# auth_request ratio again from CPU time on the servers' core.
#
# Run (as root, or with nginx, wrk and h2load installed):  bench/decision.sh
# Knobs (environment): DURATION=5s ROUNDS=4 CONNS=64 H2_CLIENTS=4 H2_STREAMS=16
#                      SERVER_CPUS=0 CLIENT_CPUS=1 (taskset -c lists)
#                      TARGETS="grpc_allow proxy_allow" (a subset, run in that order)
#                      BASE_PORT=20380 (uses BASE_PORT .. BASE_PORT+7)
#                      SKIP_BUILD=1 (use the existing target/dist/tollgate)
#                      TOLLGATE=path (another tollgate binary; implies no build)
# Everything it writes lives in a `mktemp -d` directory, removed at exit, and
# every process it starts is stopped at exit.
set -euo pipefail

DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-4}
CONNS=${CONNS:-64}
H2_CLIENTS=${H2_CLIENTS:-4}
H2_STREAMS=${H2_STREAMS:-16}
SERVER_CPUS=${SERVER_CPUS:-0}
CLIENT_CPUS=${CLIENT_CPUS:-1}
BASE_PORT=${BASE_PORT:-20380}

cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh
if ! command -v h2load >/dev/null 2>&1; then
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq nghttp2-client >/dev/null
fi
need_tools nginx wrk curl
if [ -z "${TOLLGATE:-}" ]; then
  build_release
  TOLLGATE=$PWD/target/dist/tollgate
fi
start_scratch

PORT_UP=$BASE_PORT
PORT_TG=$((BASE_PORT + 1))
PORT_DECISION=$((BASE_PORT + 2))
PORT_ADMIN=$((BASE_PORT + 3))
PORT_NG_AUTH=$((BASE_PORT + 4))
PORT_NG_LIMIT=$((BASE_PORT + 5))
PORT_NULL_AUTH=$((BASE_PORT + 6))
PORT_NG_AUTH_NULL=$((BASE_PORT + 7))
GRPC_PATH=/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit

# ---- the gRPC calls: RateLimitRequest by hand, framed -------------------------
# protobuf: a length-delimited field is (number << 3 | 2), the length as a
# varint, the bytes; every length here is under 128, one byte. The message:
#   RateLimitRequest { 1: domain, 2: RateLimitDescriptor {
#     1: Entry { 1: key "remote_address", 2: value "10.0.0.1" } } }
# gRPC frames it: a 0 byte (not compressed), the length as 4 bytes big
# endian, the message. The runs' counter checks prove tollgate decoded it.
hex_of() { printf %s "$1" | od -An -tx1 -v | tr -d ' \n'; }
pb_field() { # field number $1, payload $2 (hex): the field, in hex
  local length=$((${#2} / 2))
  [ "$length" -lt 128 ] || { echo "pb_field: $length bytes need a longer varint" >&2; exit 1; }
  printf '%02x%02x%s' $((($1 << 3) | 2)) "$length" "$2"
}
grpc_call() { # domain $1 to the file $2
  local entry request
  entry=$(pb_field 1 "$(hex_of remote_address)")$(pb_field 2 "$(hex_of 10.0.0.1)")
  request=$(pb_field 1 "$(hex_of "$1")")$(pb_field 2 "$(pb_field 1 "$entry")")
  # shellcheck disable=SC2059 # the format is the bytes, as \xHH escapes
  printf "$(printf '00%08x%s' $((${#request} / 2)) "$request" | sed 's/../\\x&/g')" >"$2"
}
grpc_call edge "$TMP/allow.grpc"
grpc_call edge_deny "$TMP/deny.grpc"

# ---- the configurations -------------------------------------------------------
# tollgate: bench/load.sh's gateway (bench/common.sh), with the admin
# listener for the counters, the deny route (before the route `all`, which
# matches /deny/ too: the first route that matches is the one), and the
# decision listener.
cat >"$TMP/deny-route.toml" <<CONF
[[routes]]
name = "deny"
match = { path_prefix = "/deny/" }
upstream = "up"
limits = ["per_ip_deny"]

CONF
tollgate_conf 1 "$PORT_TG" 1000000 "1000000/s" "$PORT_UP" |
  awk -v admin="admin = \"127.0.0.1:$PORT_ADMIN\"" -v routes="$TMP/deny-route.toml" '
    /^\[\[routes\]\]/ && !done { while ((getline line < routes) > 0) print line; done = 1 }
    { print }
    /^workers = / { print admin }' >"$TMP/tollgate.toml"
cat >>"$TMP/tollgate.toml" <<CONF

[limits.per_ip_deny]
key = "ip"
algorithm = "token_bucket"
capacity = 1
refill = "1/h"

# nginx asks for /auth from 127.0.0.1 with the client in X-Real-IP.
[client_ip]
trusted_cidrs = ["127.0.0.0/8"]

[decision]
listen = "127.0.0.1:$PORT_DECISION"
# nginx auth_request takes 2xx, 401 and 403 only.
deny_status = 403

[limits.per_ip_rls]
algorithm = "token_bucket"
capacity = 1000000
refill = "1000000/s"

[limits.per_ip_rls_deny]
algorithm = "token_bucket"
capacity = 1
refill = "1/h"

[[decision.descriptors]]
domain = "edge"
match = [{ key = "remote_address" }]
limits = ["per_ip_rls"]

[[decision.descriptors]]
domain = "edge_deny"
match = [{ key = "remote_address" }]
limits = ["per_ip_rls_deny"]
CONF

# nginx `auth_request` to /auth on port $2 (tollgate's decision listener),
# then bench/load.sh's proxy_pass (without limit_req): $1 = port, $3 = the
# upstream's port, $4 = the directory for its pid and error files.
nginx_auth_conf() {
  cat <<CONF
daemon off;
worker_processes 1;
pid $4/ng-$1.pid;
error_log $4/ng-$1.err crit;
events { worker_connections 4096; }
http {
  access_log off;
  keepalive_requests 10000000;
  upstream up {
    server 127.0.0.1:$3;
    keepalive 64;
    keepalive_requests 10000000;
  }
  # Keep-alive to the auth server too: a connection per subrequest would
  # cost more than the decision.
  upstream auth {
    server 127.0.0.1:$2;
    keepalive 64;
    keepalive_requests 10000000;
  }
  server {
    listen 127.0.0.1:$1;
    location / {
      auth_request /.tollgate;
      proxy_pass http://up;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header X-Forwarded-For \$proxy_add_x_forwarded_for;
      proxy_set_header X-Forwarded-Proto \$scheme;
    }
    location = /.tollgate {
      internal;
      proxy_pass http://auth/auth;
      proxy_pass_request_body off;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Content-Length "";
      proxy_set_header X-Original-Method \$request_method;
      proxy_set_header X-Original-URI \$request_uri;
      proxy_set_header X-Real-IP \$remote_addr;
    }
  }
}
CONF
}
nginx_auth_conf "$PORT_NG_AUTH" "$PORT_DECISION" "$PORT_UP" "$TMP" >"$TMP/ng-auth.conf"
nginx_auth_conf "$PORT_NG_AUTH_NULL" "$PORT_NULL_AUTH" "$PORT_UP" "$TMP" >"$TMP/ng-auth-null.conf"
# The stand-in auth server: the upstream's configuration answering `204`.
# No body, as tollgate's 200: auth_request reads only the head of the
# answer, so nginx closes an upstream connection whose answer has a body,
# and the subrequests would pay a connection each.
upstream_conf "$PORT_NULL_AUTH" "$TMP" |
  sed -e "s|$TMP/upstream\.|$TMP/null-auth.|" -e 's|return 200 "ok\\n";|return 204;|' >"$TMP/null-auth.conf"
grep -q 'return 204;' "$TMP/null-auth.conf" || { echo "the stand-in auth server's configuration is not as expected" >&2; exit 1; }
nginx_proxy_conf 1 "$PORT_NG_LIMIT" "burst=1000000 nodelay" "1000000r/s" "$PORT_UP" "$TMP" >"$TMP/ng-limit.conf"

# ---- start everything, pinned ---------------------------------------------------
upstream_conf "$PORT_UP" "$TMP" >"$TMP/upstream.conf"
SERVER_CPUSET=$CLIENT_CPUS start_upstream "$TMP/upstream.conf"
UPSTREAM=$STARTED
SERVER_CPUSET=$SERVER_CPUS start_tollgate "$TMP/tollgate.toml"
TG=$STARTED
SERVER_CPUSET=$SERVER_CPUS start_nginx "$TMP/ng-auth.conf"
NG_AUTH=$STARTED
SERVER_CPUSET=$SERVER_CPUS start_nginx "$TMP/ng-limit.conf"
NG_LIMIT=$STARTED
SERVER_CPUSET=$SERVER_CPUS start_upstream "$TMP/null-auth.conf"
NULL_AUTH=$STARTED
SERVER_CPUSET=$SERVER_CPUS start_nginx "$TMP/ng-auth-null.conf"
NG_AUTH_NULL=$STARTED
for port in "$PORT_UP" "$PORT_TG" "$PORT_DECISION" "$PORT_ADMIN" "$PORT_NG_AUTH" "$PORT_NG_LIMIT" \
  "$PORT_NULL_AUTH" "$PORT_NG_AUTH_NULL"; do
  (wait_port "$port") || { tail -n 5 "$TMP"/*.err >&2; exit 1; }
done

# Every target answers as expected before anything is measured.
expect_status() { # URL $1 answers $2
  local code
  code=$(curl -s -o /dev/null -w '%{http_code}' "$1")
  [ "$code" = "$2" ] || { echo "$1 answers $code, not $2" >&2; exit 1; }
}
expect_status "http://127.0.0.1:$PORT_TG/" 200
expect_status "http://127.0.0.1:$PORT_TG/deny/" 200 # the bucket's one token
expect_status "http://127.0.0.1:$PORT_TG/deny/" 429
expect_status "http://127.0.0.1:$PORT_NG_AUTH/" 200
expect_status "http://127.0.0.1:$PORT_NG_LIMIT/" 200
expect_status "http://127.0.0.1:$PORT_NG_AUTH_NULL/" 200
grpc_status() { # the grpc-status of the call in file $1
  curl -s --http2-prior-knowledge -H 'content-type: application/grpc' -H 'te: trailers' \
    --data-binary "@$1" -o /dev/null -D - "http://127.0.0.1:$PORT_DECISION$GRPC_PATH" |
    tr -d '\r' | awk -F': ' 'tolower($1) == "grpc-status" {print $2}'
}
[ "$(grpc_status "$TMP/allow.grpc")" = 0 ] || { echo "the gRPC call is not answered OK" >&2; exit 1; }

# ---- one run --------------------------------------------------------------------
CLK_TCK=$(getconf CLK_TCK)
RESULTS=$TMP/results.tsv
: >"$RESULTS"

# tollgate's count of the decisions labelled $1 (a label set, as in /metrics).
counted() {
  curl -s "http://127.0.0.1:$PORT_ADMIN/metrics" |
    awk -v labels="$1" 'index($0, labels) && $1 ~ /^tollgate_ratelimit_decisions_total/ {n += $NF} END {print n + 0}'
}
# Each target's decisions: which limit, which outcome, which front.
decisions_of() {
  case $1 in
    grpc_allow) echo 'route="edge",limit="per_ip_rls",outcome="allowed",front="rls"' ;;
    grpc_deny) echo 'route="edge_deny",limit="per_ip_rls_deny",outcome="denied",front="rls"' ;;
    proxy_allow) echo 'route="all",limit="per_ip",outcome="allowed",front="proxy"' ;;
    proxy_deny) echo 'route="deny",limit="per_ip_deny",outcome="denied",front="proxy"' ;;
    ng_auth) echo 'route="all",limit="per_ip",outcome="allowed",front="auth"' ;;
    ng_auth_null | ng_limit) echo none ;;
  esac
}

# Busy jiffies and all jiffies of every CPU, "cpu0 busy total ...".
cpu_jiffies() {
  awk '/^cpu[0-9]/ { t = 0; for (i = 2; i <= NF; i++) t += $i; printf "%s %d %d ", $1, t - $5 - $6, t }' /proc/stat
}
busy_share() { # before $1, after $2: "0.98/0.55" (cpu0/cpu1/...)
  awk -v a="$1" -v b="$2" 'BEGIN {
    n = split(a, x, " "); split(b, y, " "); s = ""
    for (i = 1; i <= n; i += 3) s = s (s == "" ? "" : "/") sprintf("%.2f", (y[i + 2] - x[i + 2]) ? (y[i + 1] - x[i + 1]) / (y[i + 2] - x[i + 2]) : 0)
    print s
  }'
}

# Drives target $1 for $2 (a duration) and writes the client's output to
# $TMP/run.out.
drive() {
  local target=$1 duration=$2
  local client=(taskset -c "$CLIENT_CPUS")
  case $target in
    grpc_allow | grpc_deny)
      "${client[@]}" h2load -c"$H2_CLIENTS" -m"$H2_STREAMS" -D"${duration%s}" \
        -d "$TMP/${target#grpc_}.grpc" -H 'content-type: application/grpc' -H 'te: trailers' \
        "http://127.0.0.1:$PORT_DECISION$GRPC_PATH" >"$TMP/run.out"
      ;;
    proxy_allow) "${client[@]}" wrk -t1 -c"$CONNS" -d"$duration" "http://127.0.0.1:$PORT_TG/" >"$TMP/run.out" ;;
    proxy_deny) "${client[@]}" wrk -t1 -c"$CONNS" -d"$duration" "http://127.0.0.1:$PORT_TG/deny/" >"$TMP/run.out" ;;
    ng_auth) "${client[@]}" wrk -t1 -c"$CONNS" -d"$duration" "http://127.0.0.1:$PORT_NG_AUTH/" >"$TMP/run.out" ;;
    ng_auth_null) "${client[@]}" wrk -t1 -c"$CONNS" -d"$duration" "http://127.0.0.1:$PORT_NG_AUTH_NULL/" >"$TMP/run.out" ;;
    ng_limit) "${client[@]}" wrk -t1 -c"$CONNS" -d"$duration" "http://127.0.0.1:$PORT_NG_LIMIT/" >"$TMP/run.out" ;;
  esac
}

# Fails the bench unless the client's output $2 of target $1 shows the
# answers the target measures, and no error without one: every HTTP answer
# 200 (gRPC answers OVER_LIMIT with a 200 too; tollgate's counters tell OK
# from OVER_LIMIT) and no stream or socket error; proxy_deny's 429s
# (probed: wrk's summary lumps them with 5xx). ng_limit, the denominator of
# the auth_request ratio, is held to the same as the others.
check_answers() {
  local target=$1 out=$2
  case $target in
    grpc_*)
      local slack=$((H2_CLIENTS * H2_STREAMS))
      awk -v t="$target" -v slack="$slack" '
        /^requests:/ { seen = 1; succeeded = $8; failed = $10; errored = $12; timeout = $14 }
        /^status codes:/ { other = $5 + $7 + $9 }
        END {
          if (!seen) { print t ": no h2load summary" > "/dev/stderr"; exit 1 }
          # With -D, the streams still open at the end count as failed.
          if (errored + timeout > 0 || failed - errored > slack || other > 0 || succeeded == 0) {
            printf "%s: %d succeeded, %d failed (%d errored, %d timed out), %d answers not 2xx\n", \
              t, succeeded, failed, errored, timeout, other > "/dev/stderr"
            exit 1
          }
        }' "$out" || exit 1
      ;;
    proxy_deny) check_statuses deny "$out" "http://127.0.0.1:$PORT_TG/deny/" ;;
    *) check_statuses allow "$out" ;;
  esac
}

# One measured run of target $1 in round $2.
measure() {
  local target=$1 round=$2 out=$TMP/run.out front=0 decider=$TG dec_before=0 dec_after=0
  local ng_before=0 ng_after=0 up_before up_after cpus_before cpus_after
  local idle_before idle_after
  local decided_before decided_after labels rps requests non2xx
  labels=$(decisions_of "$target")
  decided_before=$(counted "$labels")
  case $target in
    ng_auth) front=$NG_AUTH ;;
    ng_auth_null) front=$NG_AUTH_NULL decider=$NULL_AUTH ;;
    ng_limit) front=$NG_LIMIT decider=0 ;;
  esac
  [ "$front" = 0 ] || ng_before=$(cpu_ticks "$front")
  [ "$decider" = 0 ] || dec_before=$(cpu_ticks "$decider")
  idle_before=$(cpu_ticks "$TG")
  up_before=$(cpu_ticks "$UPSTREAM")
  cpus_before=$(cpu_jiffies)
  drive "$target" "$DURATION"
  cpus_after=$(cpu_jiffies)
  up_after=$(cpu_ticks "$UPSTREAM")
  idle_after=$(cpu_ticks "$TG")
  [ "$decider" = 0 ] || dec_after=$(cpu_ticks "$decider")
  [ "$front" = 0 ] || ng_after=$(cpu_ticks "$front")
  decided_after=$(counted "$labels")
  case $target in
    grpc_*)
      rps=$(awk '/^finished in/ {print $4}' "$out")
      requests=$(awk '/^requests:/ {print $8}' "$out")
      non2xx=$(awk '/^status codes:/ {print $5 + $7 + $9}' "$out")
      ;;
    *)
      rps=$(awk '/^Requests\/sec:/ {print $2}' "$out")
      requests=$(awk '/requests in/ {print $1}' "$out")
      non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' "$out")
      ;;
  esac
  requests=${requests:-0}
  check_answers "$target" "$out"
  # tollgate decided every completed request as expected (ng_limit never
  # reaches it); the difference is the requests still in flight at the end.
  if [ "$labels" != none ]; then
    local decided=$((decided_after - decided_before)) slack=$((CONNS > H2_CLIENTS * H2_STREAMS ? CONNS : H2_CLIENTS * H2_STREAMS))
    if [ "$requests" -eq 0 ] || [ "$decided" -lt "$requests" ] || [ "$decided" -gt $((requests + slack)) ]; then
      echo "$target: the client completed $requests requests, tollgate counted $decided decisions {$labels}" >&2
      exit 1
    fi
  elif [ "$((idle_after - idle_before))" -gt 2 ]; then
    echo "$target: tollgate spent CPU during a run without it" >&2
    exit 1
  fi
  awk -v t="$target" -v r="$round" -v rps="$rps" -v n="$requests" -v bad="${non2xx:-0}" -v hz="$CLK_TCK" \
    -v dec=$((dec_after - dec_before)) -v ng=$((ng_after - ng_before)) -v up=$((up_after - up_before)) \
    -v busy="$(busy_share "$cpus_before" "$cpus_after")" 'BEGIN {
      us = 1e6 / hz / n
      printf "%s\t%s\t%.0f\t%.2f\t%.2f\t%.2f\t%.3f\t%s\n", t, r, rps, dec * us, ng * us, up * us, bad / n, busy
    }' | tee -a "$RESULTS"
}

ALL_TARGETS="grpc_allow proxy_allow grpc_deny proxy_deny ng_auth ng_auth_null ng_limit"
TARGETS=${TARGETS:-$ALL_TARGETS}
for target in $TARGETS; do
  case " $ALL_TARGETS " in *" $target "*) ;; *) echo "unknown target $target (targets: $ALL_TARGETS)" >&2; exit 2 ;; esac
done
echo "# machine: nproc=$(nproc), CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $("$NGINX" -v 2>&1), $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2), $(h2load --version | head -1)"
echo "# wrk -t1 -c$CONNS -d$DURATION; h2load -c$H2_CLIENTS -m$H2_STREAMS -D${DURATION%s}; rounds=$ROUNDS"
echo "# servers (tollgate, the front nginx, the stand-in) on CPU $SERVER_CPUS; client and upstream on CPU $CLIENT_CPUS"
echo "# gRPC call: $(wc -c <"$TMP/allow.grpc") bytes framed"
# Warm-up: every target once, unmeasured (connections, buckets, caches).
for target in $TARGETS; do drive "$target" 1s; done
printf 'target\tround\treq/s\tdecider_us/req\tnginx_us/req\tup_us/req\tnon2xx\tcpu_busy\n'
for round in $(seq 1 "$ROUNDS"); do
  for target in $TARGETS; do measure "$target" "$round"; done
done

# ---- summary: medians over rounds, the targets' ratios --------------------------
# Each ratio is of the medians, with each round's own ratio after it; a
# ratio whose targets were not run is left out.
echo
echo "# median over $ROUNDS rounds"
awk -F'\t' -v rounds="$ROUNDS" -v order="$ALL_TARGETS" "$AWK_STATS"'
  {
    rps[$1] = rps[$1] " " $3; dec[$1] = dec[$1] " " $4; ng[$1] = ng[$1] " " $5
    up[$1] = up[$1] " " $6; bad[$1] = bad[$1] " " $7
    R[$1, $2] = $3; D[$1, $2] = $4; F[$1, $2] = $4 + $5; ran[$1] = 1
  }
  # The ratio of X[a] over X[b] in each round (X: R req/s, D decider CPU, F the
  # servers core CPU = decider + front nginx).
  function rounds_of(X, a, b,   r, s) {
    s = ""
    for (r = 1; r <= rounds; r++) s = s sprintf(" %.2f", X[a, r] / X[b, r])
    return s
  }
  END {
    n = split(order, targets, " ")
    printf "%-12s %9s %14s %12s %10s %7s\n", "target", "req/s", "decider_us/req", "nginx_us/req", "up_us/req", "non2xx"
    for (i = 1; i <= n; i++) {
      t = targets[i]
      if (!(t in ran)) continue
      M[t] = median(rps[t]); C[t] = median(dec[t]); N[t] = median(ng[t])
      printf "%-12s %9.0f %14.2f %12.2f %10.2f %7.3f\n", t, M[t], C[t], N[t], median(up[t]), median(bad[t])
    }
    print ""
    if (("grpc_allow" in ran) && ("proxy_allow" in ran))
      printf "gRPC decision CPU / proxied request CPU, allowed (target <= 1.00): %.2f (%.2f / %.2f us; rounds%s)\n", \
        C["grpc_allow"] / C["proxy_allow"], C["grpc_allow"], C["proxy_allow"], rounds_of(D, "grpc_allow", "proxy_allow")
    if (("grpc_deny" in ran) && ("proxy_deny" in ran))
      printf "gRPC decision CPU / proxied request CPU, denied: %.2f (%.2f / %.2f us; rounds%s)\n", \
        C["grpc_deny"] / C["proxy_deny"], C["grpc_deny"], C["proxy_deny"], rounds_of(D, "grpc_deny", "proxy_deny")
    if (("ng_auth" in ran) && ("ng_limit" in ran)) {
      printf "nginx auth_request to tollgate req/s / nginx limit_req req/s (target >= 0.70): %.2f (%.0f / %.0f; rounds%s)\n", \
        M["ng_auth"] / M["ng_limit"], M["ng_auth"], M["ng_limit"], rounds_of(R, "ng_auth", "ng_limit")
      # With the servers core the bottleneck, req/s is its CPU over the CPU
      # per request: the same ratio from CPU time, which noise moves less.
      # When the client core (or a neighbour) sets the pace instead, the
      # req/s ratio drifts towards 1 and only this one holds.
      printf "the same from CPU per request on the servers core (req/s when that core is the bottleneck): limit_req nginx %.2f / (auth_request nginx %.2f + tollgate /auth %.2f) = %.2f (rounds%s)\n", \
        N["ng_limit"], N["ng_auth"], C["ng_auth"], N["ng_limit"] / (N["ng_auth"] + C["ng_auth"]), rounds_of(F, "ng_limit", "ng_auth")
    }
    if (("ng_auth_null" in ran) && ("ng_limit" in ran))
      printf "the ceiling, auth_request to nginx return 204: req/s %.2f (rounds%s); from CPU %.2f / (%.2f + %.2f) = %.2f (rounds%s)\n", \
        M["ng_auth_null"] / M["ng_limit"], rounds_of(R, "ng_auth_null", "ng_limit"), \
        N["ng_limit"], N["ng_auth_null"], C["ng_auth_null"], N["ng_limit"] / (N["ng_auth_null"] + C["ng_auth_null"]), \
        rounds_of(F, "ng_limit", "ng_auth_null")
  }' "$RESULTS"
