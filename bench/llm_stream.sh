#!/usr/bin/env bash
# What watching a streamed LLM response for its usage costs: the relay of a
# server-sent-event stream through tollgate with the usage scanner on (a
# token route) against the same relay without it, and against a direct
# connection to the upstream.
#
# The stream: STREAM_MB of OpenAI chat-completion chunks (`data: {...}\n\n`,
# ~150 bytes each, a few words of content per chunk, as a model streams
# them) ending with the usage chunk and `data: [DONE]`, written once to a
# file and served by nginx as `text/event-stream` (1 worker, sendfile), so
# the upstream costs the same for every target.
# The targets, interleaved A B C A B C ... ROUNDS times so noise hits all
# alike, each fetched REQUESTS times per round by curl, one after the other
# over one connection (`--next`; the relay is what is measured, not
# connection setup):
#   direct     curl -> nginx
#   relay      curl -> tollgate -> nginx, a route with a request limit only
#              (key ip, never denying): the body is relayed as it arrives
#   scanned    the same through a token route (`unit = "tokens"` limit,
#              `tokens = { usage = "auto" }`): every byte also goes through
#              the usage scanner, and the response settles when it ends
# Per run: MB/s as curl received them, tollgate's CPU (utime + stime from
# /proc) per MB relayed, and the time to the first byte (curl's
# time_starttransfer, the median over the run's requests). Each run is
# checked: every response is 200 with the whole stream (its size), and for
# `scanned` tollgate's `tollgate_tokens_total{kind="refunded"}` grew by one
# settlement per request (the scanner found the usage at the end of every
# stream); for `relay`, that no token was counted.
# The summary: medians with their range, and the ratio scanned / relay of
# CPU per MB (the issue's target: <= 1.10) with each round's.
#
# Run (as root, or with nginx and curl installed):  bench/llm_stream.sh
# Knobs (environment): STREAM_MB=64 REQUESTS=4 ROUNDS=5
#                      SERVER_CPUS=0 CLIENT_CPUS=1 (taskset: tollgate on the
#                      first, curl and nginx on the second)
#                      BASE_PORT=20580 (uses BASE_PORT .. BASE_PORT+4)
#                      SKIP_BUILD=1 (use the existing target/dist/tollgate)
#                      TOLLGATE=path (another tollgate binary; implies no build)
# Everything it writes lives in a `mktemp -d` directory, removed at exit, and
# every process it starts is stopped at exit.
set -euo pipefail

STREAM_MB=${STREAM_MB:-64}
REQUESTS=${REQUESTS:-4}
ROUNDS=${ROUNDS:-5}
SERVER_CPUS=${SERVER_CPUS:-0}
CLIENT_CPUS=${CLIENT_CPUS:-1}
BASE_PORT=${BASE_PORT:-20580}

cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh
need_tools nginx curl
if [ -z "${TOLLGATE:-}" ]; then
  build_release
  TOLLGATE=$PWD/target/dist/tollgate
fi
start_scratch

PORT_UP=$BASE_PORT
PORT_RELAY=$((BASE_PORT + 1))
PORT_SCANNED=$((BASE_PORT + 2))
PORT_ADMIN_RELAY=$((BASE_PORT + 3))
PORT_ADMIN_SCANNED=$((BASE_PORT + 4))

# ---- the stream ---------------------------------------------------------------
# One chunk repeated (its content varied by a counter, so no two lines are
# the same), then the usage chunk and [DONE]; awk writes it in one pass.
awk -v mb="$STREAM_MB" 'BEGIN {
  target = mb * 1024 * 1024
  while (size < target) {
    line = sprintf("data: {\"id\":\"chatcmpl-9x\",\"object\":\"chat.completion.chunk\",\"created\":1733100000,\"model\":\"gpt-bench\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" token %d\"},\"finish_reason\":null}]}\n\n", n++)
    printf "%s", line
    size += length(line)
  }
  printf "data: {\"id\":\"chatcmpl-9x\",\"object\":\"chat.completion.chunk\",\"created\":1733100000,\"model\":\"gpt-bench\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", n, n + 12
  printf "data: [DONE]\n\n"
}' >"$TMP/stream.sse"
STREAM_BYTES=$(stat -c %s "$TMP/stream.sse")
chmod 644 "$TMP/stream.sse"

cat >"$TMP/upstream.conf" <<CONF
daemon off;
worker_processes 1;
pid $TMP/upstream.pid;
error_log $TMP/upstream.err error;
events { worker_connections 1024; }
http {
  access_log off;
  sendfile on;
  keepalive_requests 10000000;
  server {
    listen 127.0.0.1:$PORT_UP;
    location = /v1/stream {
      default_type text/event-stream;
      alias $TMP/stream.sse;
    }
  }
}
CONF

# tollgate: $1 = port, $2 = admin port, $3 = "scanned" for the token route.
stream_conf() {
  cat <<CONF
[server]
listen = "127.0.0.1:$1"
admin = "127.0.0.1:$2"
workers = 1

[upstreams.llm]
url = "http://127.0.0.1:$PORT_UP"

[limits.per_ip]
key = "ip"
algorithm = "token_bucket"
capacity = 1000000
refill = "1000000/s"

[limits.tpm]
key = "ip"
algorithm = "token_bucket"
capacity = 1000000000
refill = "1000000000/s"
unit = "tokens"

[[routes]]
name = "stream"
match = { path = "/v1/stream" }
upstream = "llm"
CONF
  if [ "$3" = scanned ]; then
    echo 'limits = ["per_ip", "tpm"]'
    echo 'tokens = { max_tokens_default = 100, usage = "auto" }'
  else
    echo 'limits = ["per_ip"]'
  fi
}
stream_conf "$PORT_RELAY" "$PORT_ADMIN_RELAY" relay >"$TMP/relay.toml"
stream_conf "$PORT_SCANNED" "$PORT_ADMIN_SCANNED" scanned >"$TMP/scanned.toml"

SERVER_CPUSET=$CLIENT_CPUS start_upstream "$TMP/upstream.conf"
SERVER_CPUSET=$SERVER_CPUS start_tollgate "$TMP/relay.toml"
TG_RELAY=$STARTED
SERVER_CPUSET=$SERVER_CPUS start_tollgate "$TMP/scanned.toml"
TG_SCANNED=$STARTED
for port in "$PORT_UP" "$PORT_RELAY" "$PORT_SCANNED" "$PORT_ADMIN_RELAY" "$PORT_ADMIN_SCANNED"; do
  (wait_port "$port") || { tail -n 5 "$TMP"/*.err >&2; exit 1; }
done

port_of() {
  case $1 in
    direct) echo "$PORT_UP" ;;
    relay) echo "$PORT_RELAY" ;;
    scanned) echo "$PORT_SCANNED" ;;
  esac
}
pid_of() {
  case $1 in
    direct) echo 0 ;;
    relay) echo "$TG_RELAY" ;;
    scanned) echo "$TG_SCANNED" ;;
  esac
}
settled() { # responses settled with a usage found, on admin port $1
  curl -s "http://127.0.0.1:$1/metrics" |
    awk '$1 ~ /^tollgate_tokens_usage_ratio_count[{]/ {n += $NF} END {print n + 0}'
}
tokens_counted() { # token series on admin port $1
  curl -s "http://127.0.0.1:$1/metrics" | grep -c '^tollgate_tokens_total{' || true
}

# REQUESTS fetches of target $1 over one connection: per response its
# status, size and time to first byte, one line each, to $TMP/run.out.
drive() {
  local url="http://127.0.0.1:$(port_of "$1")/v1/stream" args=() i
  for i in $(seq 1 "$REQUESTS"); do
    [ "$i" = 1 ] || args+=(--next)
    args+=(-s -o /dev/null -w '%{http_code} %{size_download} %{time_starttransfer}\n' "$url")
  done
  taskset -c "$CLIENT_CPUS" curl "${args[@]}" >"$TMP/run.out"
}

CLK_TCK=$(getconf CLK_TCK)
RESULTS=$TMP/results.tsv
: >"$RESULTS"
measure() { # target $1, round $2
  local target=$1 pid before=0 after=0 started ended settled_before settled_now
  pid=$(pid_of "$target")
  settled_before=$(settled "$PORT_ADMIN_SCANNED")
  [ "$pid" = 0 ] || before=$(cpu_ticks "$pid")
  started=$(date +%s.%N)
  drive "$target"
  ended=$(date +%s.%N)
  [ "$pid" = 0 ] || after=$(cpu_ticks "$pid")
  if [ "$(awk -v size="$STREAM_BYTES" '$1 == 200 && $2 == size' "$TMP/run.out" | wc -l)" != "$REQUESTS" ]; then
    echo "$target: not every response was 200 with the whole stream ($STREAM_BYTES bytes):" >&2
    cat "$TMP/run.out" >&2
    exit 1
  fi
  if [ "$target" = scanned ]; then
    # Each settles when its body ends, just after curl has it all.
    for _ in $(seq 1 50); do
      settled_now=$(settled "$PORT_ADMIN_SCANNED")
      [ $((settled_now - settled_before)) -ge "$REQUESTS" ] && break
      sleep 0.1
    done
    if [ $((settled_now - settled_before)) -ne "$REQUESTS" ]; then
      echo "scanned: $((settled_now - settled_before)) of $REQUESTS responses settled from their usage" >&2
      exit 1
    fi
  elif [ "$target" = relay ] && [ "$(tokens_counted "$PORT_ADMIN_RELAY")" != 0 ]; then
    echo "relay: tokens were counted on a route without token limits" >&2
    exit 1
  fi
  local ttfb
  ttfb=$(awk '{print $3}' "$TMP/run.out" | sort -n | awk '{a[NR] = $1} END {print a[int((NR + 1) / 2)]}')
  awk -v t="$target" -v r="$2" -v n="$REQUESTS" -v bytes="$STREAM_BYTES" -v start="$started" -v end="$ended" \
    -v cpu=$((after - before)) -v hz="$CLK_TCK" -v ttfb="$ttfb" 'BEGIN {
      mb = n * bytes / 1048576
      printf "%s\t%s\t%.1f\t%.1f\t%.3f\n", t, r, mb / (end - start), cpu * 1e6 / hz / mb, ttfb * 1000
    }' | tee -a "$RESULTS"
}

TARGETS="direct relay scanned"
echo "# machine: nproc=$(nproc), CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# stream: $STREAM_BYTES bytes of SSE chunks; $REQUESTS fetches per run over one connection; rounds=$ROUNDS"
echo "# tollgate on CPU $SERVER_CPUS; curl and nginx on CPU $CLIENT_CPUS"
for target in $TARGETS; do drive "$target"; done # warm-up
printf 'target\tround\tMB/s\ttollgate_us/MB\tttfb_ms\n'
for round in $(seq 1 "$ROUNDS"); do
  for target in $TARGETS; do measure "$target" "$round"; done
done

echo
echo "# median (min-max) over $ROUNDS rounds"
awk -F'\t' -v rounds="$ROUNDS" -v order="$TARGETS" "$AWK_STATS"'
  { mbs[$1] = mbs[$1] " " $3; cpu[$1] = cpu[$1] " " $4; ttfb[$1] = ttfb[$1] " " $5; C[$1, $2] = $4 }
  END {
    n = split(order, targets, " ")
    printf "%-8s %8s %15s %14s %17s %8s %15s\n", "target", "MB/s", "(range)", "tollgate_us/MB", "(range)", "ttfb_ms", "(range)"
    for (i = 1; i <= n; i++) {
      t = targets[i]
      M[t] = median(cpu[t])
      printf "%-8s %8.1f %15s %14.1f %17s %8.3f %15s\n", t, median(mbs[t]), range(mbs[t], "%.0f"), M[t], range(cpu[t], "%.0f"), \
        median(ttfb[t]), range(ttfb[t], "%.3f")
    }
    s = ""
    for (r = 1; r <= rounds; r++) s = s sprintf(" %.2f", C["scanned", r] / C["relay", r])
    printf "\nscanned / relay, tollgate CPU per MB (target <= 1.10): %.2f (rounds%s)\n", M["scanned"] / M["relay"], s
  }' "$RESULTS"
