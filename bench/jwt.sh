#!/usr/bin/env bash
# What a JWT identity costs on the allowed path: the same per-caller limit
# keyed by an API key and by a verified token's `sub`, with the token cache
# warm and with it off.
#
# Four tollgates (`workers = 1`, memory store, each with its admin listener
# for the counters) in front of nginx `return 200` (bench/common.sh), each
# with one never-denying token bucket (bench/load.sh's: capacity and refill
# 1,000,000/s) keyed on the caller:
# (`on_missing_key = "deny"`: a request whose credential does not give the
# key is a 400, which the runs' checks catch):
#   api_key     key = "header:x-api-key"; wrk sends `X-Api-Key: <12 bytes>`
#   consumer    key = "consumer" through `[api_keys]` + `[consumers]`: the
#               key is looked up and its consumer counted
#   jwt_warm    key = "jwt:sub"; one `[[jwt.issuers]]` with a JWKS file
#               holding a 2048-bit RSA key; wrk sends `Authorization: Bearer`
#               with one RS256 token (the shape of a Keycloak access token's
#               registered claims: iss, sub, aud, exp, iat, ~560 bytes), so
#               after the first request every request is a cache hit
#   jwt_cold    the same with `[jwt] cache_size = 0`: every request verifies
#               the RS256 signature (what a cache miss costs)
# The token and the key are made at run time with openssl; nothing is
# committed.
#
# Two measures:
# - CPU per request under load: each target in turn, interleaved ROUNDS
#   times so noise hits all alike, wrk -t1 -cCONNS for DURATION; tollgate's
#   utime + stime (/proc/PID/stat) over the requests completed. tollgate on
#   SERVER_CPUS, wrk and the upstream on CLIENT_CPUS (taskset).
# - user-space instructions per request under callgrind, as
#   bench/instructions.sh counts them (wrk -t1 -c16 -d5s after a warm-up;
#   INSTRUCTIONS=0 skips this part).
# Every run is checked, so a wrong status or a skipped verification cannot
# pass for a fast request: wrk must report no non-2xx answer; tollgate's
# counters must show one allowed decision of the target's limit per
# completed request (within the connections in flight); and its
# `tollgate_jwt_verifications_total{result="valid"}` must grow by one per
# request for jwt_cold and by none for jwt_warm (every request a cache hit).
# The summary gives each target's median with the range over rounds, and
# the ratios of the issue's target (jwt_warm <= 1.1 x api_key's CPU per
# request) from medians, each round's ratio after it.
#
# Run (as root, or with nginx, wrk, curl, openssl and valgrind installed):
#   bench/jwt.sh
# Knobs (environment): DURATION=5s ROUNDS=5 CONNS=64 SERVER_CPUS=0 CLIENT_CPUS=1
#                      TARGETS="api_key jwt_warm" (a subset, in that order)
#                      INSTRUCTIONS=1 (0: skip the callgrind counts)
#                      KEEP_DUMPS=DIR keeps each target's callgrind dump there
#                      (named as the target), for `callgrind_annotate`
#                      BASE_PORT=20480 (uses BASE_PORT .. BASE_PORT+8)
#                      SKIP_BUILD=1 (use the existing target/dist/tollgate)
#                      TOLLGATE=path (another tollgate binary; implies no build)
# Everything it writes lives in a `mktemp -d` directory, removed at exit, and
# every process it starts is stopped at exit.
set -euo pipefail

DURATION=${DURATION:-5s}
ROUNDS=${ROUNDS:-5}
CONNS=${CONNS:-64}
SERVER_CPUS=${SERVER_CPUS:-0}
CLIENT_CPUS=${CLIENT_CPUS:-1}
INSTRUCTIONS=${INSTRUCTIONS:-1}
BASE_PORT=${BASE_PORT:-20480}

cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh
need_tools nginx wrk curl openssl
[ "$INSTRUCTIONS" = 0 ] || need_tools valgrind
if [ -z "${TOLLGATE:-}" ]; then
  build_release
  TOLLGATE=$PWD/target/dist/tollgate
fi
start_scratch

ALL_TARGETS="api_key consumer jwt_warm jwt_cold"
TARGETS=${TARGETS:-$ALL_TARGETS}
for target in $TARGETS; do
  case " $ALL_TARGETS " in *" $target "*) ;; *) echo "unknown target $target (targets: $ALL_TARGETS)" >&2; exit 2 ;; esac
done
PORT_UP=$BASE_PORT
port_of() { # the proxy port of target $1; its admin port is the next one
  case $1 in
    api_key) echo $((BASE_PORT + 1)) ;;
    consumer) echo $((BASE_PORT + 3)) ;;
    jwt_warm) echo $((BASE_PORT + 5)) ;;
    jwt_cold) echo $((BASE_PORT + 7)) ;;
  esac
}

# ---- the caller's credentials ---------------------------------------------------
b64url() { base64 -w0 | tr '+/' '-_' | tr -d '='; }
API_KEY=k-7f3a9c0d1e2b
ISSUER=https://sso.bench.example/realms/acme
openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$TMP/rsa.pem" 2>/dev/null
MODULUS=$(openssl rsa -in "$TMP/rsa.pem" -noout -modulus | cut -d= -f2 | xxd -r -p | b64url)
cat >"$TMP/jwks.json" <<JSON
{"keys":[{"kty":"RSA","kid":"bench-1","use":"sig","alg":"RS256","n":"$MODULUS","e":"AQAB"}]}
JSON
NOW=$(date +%s)
HEADER=$(printf '{"alg":"RS256","typ":"JWT","kid":"bench-1"}' | b64url)
CLAIMS=$(printf '{"iss":"%s","sub":"8d2f61c4-5a0e-4b7b-9c3e-2f1a7d9e6b05","aud":"orders-api","exp":%d,"iat":%d,"azp":"web","scope":"openid profile"}' \
  "$ISSUER" $((NOW + 86400)) "$NOW" | b64url)
SIGNATURE=$(printf '%s.%s' "$HEADER" "$CLAIMS" | openssl dgst -sha256 -sign "$TMP/rsa.pem" -binary | b64url)
TOKEN=$HEADER.$CLAIMS.$SIGNATURE

credential_of() { # the header wrk sends for target $1
  case $1 in
    api_key | consumer) echo "X-Api-Key: $API_KEY" ;;
    jwt_*) echo "Authorization: Bearer $TOKEN" ;;
  esac
}

# ---- the configurations -----------------------------------------------------------
# $1 = target: bench/load.sh's gateway with an admin listener, its limit
# keyed on the caller.
tollgate_jwt_conf() {
  local port key
  port=$(port_of "$1")
  case $1 in
    api_key) key=header:x-api-key ;;
    consumer) key=consumer ;;
    jwt_*) key=jwt:sub ;;
  esac
  tollgate_conf 1 "$port" 1000000 "1000000/s" "$PORT_UP" |
    sed -e "s|^workers = 1|&\\nadmin = \"127.0.0.1:$((port + 1))\"|" -e "s|^key = \"ip\"|key = \"$key\"\\non_missing_key = \"deny\"|" \
      -e 's|per_ip|per_caller|g'
  case $1 in
    consumer)
      printf '\n[api_keys]\nheader = "x-api-key"\n\n[consumers."%s"]\nconsumer = "acme-web"\n' "$API_KEY"
      ;;
    jwt_*)
      echo
      echo "[jwt]"
      [ "$1" = jwt_cold ] && echo "cache_size = 0"
      printf '\n[[jwt.issuers]]\nissuer = "%s"\njwks = "%s"\nalgorithms = ["RS256"]\naudiences = ["orders-api"]\n' \
        "$ISSUER" "$TMP/jwks.json"
      ;;
  esac
}

upstream_conf "$PORT_UP" "$TMP" >"$TMP/upstream.conf"
SERVER_CPUSET=$CLIENT_CPUS start_upstream "$TMP/upstream.conf"
UPSTREAM=$STARTED
declare -A PID_OF
for target in $TARGETS; do
  tollgate_jwt_conf "$target" >"$TMP/$target.toml"
  grep -q "^key = \"$(case $target in api_key) echo header:x-api-key ;; consumer) echo consumer ;; *) echo jwt:sub ;; esac)\"" \
    "$TMP/$target.toml" || { echo "$target: the configuration is not as expected" >&2; exit 1; }
  "$TOLLGATE" check -c "$TMP/$target.toml" >"$TMP/check.out" 2>&1 || { cat "$TMP/check.out" >&2; exit 1; }
  SERVER_CPUSET=$SERVER_CPUS start_tollgate "$TMP/$target.toml"
  PID_OF[$target]=$STARTED
done
wait_port "$PORT_UP"
for target in $TARGETS; do
  (wait_port "$(port_of "$target")") || { tail -n 5 "$TMP"/*.err >&2; exit 1; }
  (wait_port $(($(port_of "$target") + 1))) || { tail -n 5 "$TMP"/*.err >&2; exit 1; }
done

# Each target answers 200 with its credential (that the credential was
# used, not skipped, the counters of every run show).
for target in $TARGETS; do
  code=$(curl -s -o /dev/null -w '%{http_code}' -H "$(credential_of "$target")" "http://127.0.0.1:$(port_of "$target")/")
  [ "$code" = 200 ] || { echo "$target answers $code, not 200" >&2; exit 1; }
done

# ---- one run --------------------------------------------------------------------------
CLK_TCK=$(getconf CLK_TCK)
RESULTS=$TMP/results.tsv
: >"$RESULTS"

# The sum of tollgate $1's (its admin port) metric lines named $2 with the
# labels $3 (a label-set fragment, as in /metrics).
counted() {
  curl -s "http://127.0.0.1:$1/metrics" |
    awk -v name="$2" -v labels="$3" 'index($0, labels) && $1 ~ ("^" name "[{]") {n += $NF} END {print n + 0}'
}
DECIDED='limit="per_caller",outcome="allowed"'
VERIFIED='result="valid"'

drive() { # target $1 for $2
  taskset -c "$CLIENT_CPUS" wrk -t1 -c"$CONNS" -d"$2" -H "$(credential_of "$1")" \
    "http://127.0.0.1:$(port_of "$1")/" >"$TMP/run.out"
}

measure() { # target $1, round $2
  local target=$1 round=$2 admin pid before after decided_before decided_after
  local verified_before verified_after requests rps non2xx decided verified
  admin=$(($(port_of "$target") + 1))
  pid=${PID_OF[$target]}
  decided_before=$(counted "$admin" tollgate_ratelimit_decisions_total "$DECIDED")
  verified_before=$(counted "$admin" tollgate_jwt_verifications_total "$VERIFIED")
  before=$(cpu_ticks "$pid")
  drive "$target" "$DURATION"
  after=$(cpu_ticks "$pid")
  decided_after=$(counted "$admin" tollgate_ratelimit_decisions_total "$DECIDED")
  verified_after=$(counted "$admin" tollgate_jwt_verifications_total "$VERIFIED")
  rps=$(awk '/^Requests\/sec:/ {print $2}' "$TMP/run.out")
  requests=$(awk '/requests in/ {print $1}' "$TMP/run.out")
  non2xx=$(awk '/Non-2xx or 3xx responses:/ {print $5}' "$TMP/run.out")
  requests=${requests:-0}
  decided=$((decided_after - decided_before))
  verified=$((verified_after - verified_before))
  if [ "${non2xx:-0}" != 0 ] || grep -q 'Socket errors' "$TMP/run.out"; then
    echo "$target: wrk saw $non2xx non-2xx answers or socket errors" >&2
    cat "$TMP/run.out" >&2
    exit 1
  fi
  if [ "$requests" -eq 0 ] || [ "$decided" -lt "$requests" ] || [ "$decided" -gt $((requests + CONNS)) ]; then
    echo "$target: wrk completed $requests requests, tollgate counted $decided allowed decisions of per_caller" >&2
    exit 1
  fi
  case $target in
    jwt_cold) if [ "$verified" -lt "$requests" ] || [ "$verified" -gt $((requests + CONNS)) ]; then
      echo "$target: $requests requests, $verified verifications (expected one each)" >&2
      exit 1
    fi ;;
    *) if [ "$verified" -ne 0 ]; then
      echo "$target: $verified verifications during the run (expected none)" >&2
      exit 1
    fi ;;
  esac
  awk -v t="$target" -v r="$round" -v rps="$rps" -v n="$requests" -v hz="$CLK_TCK" \
    -v cpu=$((after - before)) 'BEGIN { printf "%s\t%s\t%.0f\t%.2f\n", t, r, rps, cpu * 1e6 / hz / n }' |
    tee -a "$RESULTS"
}

echo "# machine: nproc=$(nproc), CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $(wrk -v 2>&1 | head -1 | cut -d' ' -f1-2); wrk -t1 -c$CONNS -d$DURATION; rounds=$ROUNDS"
echo "# tollgate on CPU $SERVER_CPUS; wrk and the upstream on CPU $CLIENT_CPUS; token ${#TOKEN} bytes (RS256)"
for target in $TARGETS; do drive "$target" 1s; done # warm-up: connections, buckets, the cache
printf 'target\tround\treq/s\ttollgate_us/req\n'
for round in $(seq 1 "$ROUNDS"); do
  for target in $TARGETS; do measure "$target" "$round"; done
done

# ---- instructions per request (callgrind) ------------------------------------------
# The target's tollgate is stopped and started again under callgrind on
# the same port (instrumentation off), warmed up, then counted.
INSTR=$TMP/instructions.tsv
: >"$INSTR"
if [ "$INSTRUCTIONS" != 0 ]; then
  for target in $TARGETS; do
    stop "${PID_OF[$target]}"
    port=$(port_of "$target")
    rm -f "$TMP"/cg.*
    TOLLGATE_LOG=warn valgrind --tool=callgrind --instr-atstart=no \
      --callgrind-out-file="$TMP/cg.%p" "$TOLLGATE" run -c "$TMP/$target.toml" >"$TMP/callgrind.log" 2>&1 &
    cg=$!
    PIDS+=("$cg")
    wait_port "$port"
    wrk -t1 -c16 -d2s -H "$(credential_of "$target")" "http://127.0.0.1:$port/" >/dev/null
    callgrind_control -i on "$cg" >/dev/null 2>&1
    wrk -t1 -c16 -d5s -H "$(credential_of "$target")" "http://127.0.0.1:$port/" >"$TMP/wrk.out"
    callgrind_control -d "$cg" >/dev/null 2>&1
    sleep 0.5
    stop "$cg"
    if grep -q 'Non-2xx' "$TMP/wrk.out"; then
      echo "$target under callgrind: non-2xx answers" >&2
      exit 1
    fi
    requests=$(awk '/requests in/ {print $1}' "$TMP/wrk.out")
    if [ -n "${KEEP_DUMPS:-}" ]; then mkdir -p "$KEEP_DUMPS" && cp "$(ls -S "$TMP"/cg.* | head -1)" "$KEEP_DUMPS/$target"; fi
    total=$(for f in "$TMP"/cg.*; do grep -m1 '^summary:' "$f" | awk '{print $2}'; done | sort -n | tail -1)
    printf '%s\t%s\n' "$target" $((total / requests)) >>"$INSTR"
  done
fi

# ---- summary -------------------------------------------------------------------------
echo
echo "# median (min-max) over $ROUNDS rounds"
awk -F'\t' -v rounds="$ROUNDS" -v order="$ALL_TARGETS" -v instr="$INSTR" "$AWK_STATS"'
  { rps[$1] = rps[$1] " " $3; cpu[$1] = cpu[$1] " " $4; C[$1, $2] = $4; ran[$1] = 1 }
  function rounds_of(a, b,   r, s) {
    s = ""
    for (r = 1; r <= rounds; r++) s = s sprintf(" %.2f", C[a, r] / C[b, r])
    return s
  }
  END {
    while ((getline line < instr) > 0) { split(line, f, "\t"); I[f[1]] = f[2] }
    n = split(order, targets, " ")
    printf "%-10s %8s %13s %15s %17s %10s\n", "target", "req/s", "(range)", "tollgate_us/req", "(range)", "instr/req"
    for (i = 1; i <= n; i++) {
      t = targets[i]
      if (!(t in ran)) continue
      M[t] = median(cpu[t])
      printf "%-10s %8.0f %13s %15.2f %17s %10s\n", t, median(rps[t]), range(rps[t], "%.0f"), M[t], range(cpu[t], "%.2f"), \
        (t in I) ? I[t] : "-"
    }
    print ""
    for (i = 2; i <= n; i++) {
      t = targets[i]
      if (!(t in ran) || !("api_key" in ran)) continue
      printf "%s / api_key, CPU per request%s: %.2f (rounds%s)", t, t == "jwt_warm" ? " (target <= 1.10)" : "", \
        M[t] / M["api_key"], rounds_of(t, "api_key")
      if ((t in I) && ("api_key" in I)) printf "; instructions %.2f", I[t] / I["api_key"]
      print ""
    }
  }' "$RESULTS"
