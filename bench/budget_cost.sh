#!/usr/bin/env bash
# What a spend budget and usage export cost per request (the spend
# budgets' CPU target: <= 1.10x the token route alone): a token route with a `unit = "usd"` limit, `[prices]` and
# `[usage]` exporting to a local collector, against the same route with its
# token limit only.
#
# The upstream: nginx answering every `POST /v1/chat/completions` with one
# OpenAI chat completion (JSON, ~400 bytes, its `usage` with cached prompt
# tokens), or with STREAM=1 the same as a server-sent-event stream (a few
# content chunks, the usage chunk, `data: [DONE]`).
# The targets, each a tollgate of its own (`workers = 1`), interleaved
# A B A B ... ROUNDS times so noise hits both alike, each driven by
# `wrk -t1 -cCONNS -dSECONDS` with a chat request (`max_tokens` 50, tenant
# `acme`):
#   tokens   the route with a per-tenant `unit = "tokens"` token bucket
#            (never denying), `tokens = { usage = "auto" }`
#   usd      the same, plus a per-tenant `unit = "usd"` monthly budget
#            (never exhausted, `warn_at` set), `[prices]` for the model,
#            and `[usage]` POSTing every settled request's CloudEvent to
#            the collector (`batch` 100, `interval` 1s: the defaults), its
#            spool on disk
# The collector: a small Python server counting the events it receives by
# their `id`, answering 204 (on CLIENT_CPUS, with wrk and nginx).
# Per run: requests/s, tollgate's CPU (utime + stime from /proc: all its
# threads, the exporter's too) per request in µs. Each run is checked:
# every response 2xx, no socket error (check_statuses), and every request
# settled from its usage (`tollgate_tokens_usage_ratio_count` grew by at
# least wrk's count); at the end, the collector holds exactly one event
# with usage per settled request of the usd gateway (by distinct id; none
# twice, dropped or failed), and the budget was charged.
# The summary: medians with their range, and usd / tokens of CPU per
# request (the issue's target: <= 1.10) with each round's.
#
# INSTR=1 also counts user-space instructions per request (callgrind, as
# bench/instructions.sh: the exporter's thread is counted too) of each
# gateway, one 5 s run each after a warm-up. Each thread is counted apart
# (`--separate-threads=yes`), the request's total their sum.
# KEEP_DUMPS=DIR keeps the callgrind dumps there, one per thread, named
# tokens.PID.1-NN and usd.PID.1-NN (NN: the thread; 01 the worker, then
# the exporter's sender and its writer), with each run's request count in
# tokens.requests and usd.requests: `callgrind_annotate DIR/usd.*.1-03`.
#
# Run:    bench/budget_cost.sh
# Knobs:  ROUNDS=5 SECONDS_PER_RUN=5 CONNS=8 STREAM=0 INSTR=0 KEEP_DUMPS=DIR
#         SERVER_CPUS=0 CLIENT_CPUS=1 (taskset: tollgate on the first; wrk,
#         nginx and the collector on the second)
#         BASE_PORT=19400 (uses BASE_PORT .. BASE_PORT+7)
#         SKIP_BUILD=1 (use the existing target/dist/tollgate)
#         TOLLGATE=path (another tollgate binary; implies no build)
# Needs nginx, wrk, curl and python3; everything it writes lives in a
# `mktemp -d` directory, removed at exit, and every process it starts is
# stopped at exit.
set -euo pipefail

ROUNDS=${ROUNDS:-5}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-5}
CONNS=${CONNS:-8}
STREAM=${STREAM:-0}
INSTR=${INSTR:-0}
SERVER_CPUS=${SERVER_CPUS:-0}
CLIENT_CPUS=${CLIENT_CPUS:-1}
BASE_PORT=${BASE_PORT:-19400}

cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh
need_tools nginx wrk curl python3
[ "$INSTR" = 1 ] && need_tools valgrind
if [ -z "${TOLLGATE:-}" ]; then
  build_release
  TOLLGATE=$PWD/target/dist/tollgate
fi
start_scratch

PORT_UP=$BASE_PORT
PORT_COLLECTOR=$((BASE_PORT + 1))
PORT_TOKENS=$((BASE_PORT + 2))
PORT_USD=$((BASE_PORT + 3))
PORT_ADMIN_TOKENS=$((BASE_PORT + 4))
PORT_ADMIN_USD=$((BASE_PORT + 5))
PORT_INSTR=$((BASE_PORT + 6))
PORT_ADMIN_INSTR=$((BASE_PORT + 7))
for port in $(seq "$BASE_PORT" $((BASE_PORT + 7))); do port_free "$port"; done

# ---- the upstream ---------------------------------------------------------------
# nginx's `return` answers a POST (it discards the body); its text is an
# nginx string, so the JSON's quotes are escaped and "\n" is a newline.
USAGE='\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":40,\"total_tokens\":160,\"prompt_tokens_details\":{\"cached_tokens\":100}}'
if [ "$STREAM" = 1 ]; then
  TYPE=text/event-stream
  BODY=""
  for word in Hello there, how can I help you today; do
    BODY="${BODY}data: {\\\"id\\\":\\\"chatcmpl-b\\\",\\\"object\\\":\\\"chat.completion.chunk\\\",\\\"created\\\":1733100000,\\\"model\\\":\\\"gpt-4o\\\",\\\"choices\\\":[{\\\"index\\\":0,\\\"delta\\\":{\\\"content\\\":\\\" $word\\\"},\\\"finish_reason\\\":null}]}\\n\\n"
  done
  BODY="${BODY}data: {\\\"id\\\":\\\"chatcmpl-b\\\",\\\"object\\\":\\\"chat.completion.chunk\\\",\\\"created\\\":1733100000,\\\"model\\\":\\\"gpt-4o\\\",\\\"choices\\\":[],$USAGE}\\n\\ndata: [DONE]\\n\\n"
else
  TYPE=application/json
  BODY="{\\\"id\\\":\\\"chatcmpl-b\\\",\\\"object\\\":\\\"chat.completion\\\",\\\"created\\\":1733100000,\\\"model\\\":\\\"gpt-4o\\\",\\\"choices\\\":[{\\\"index\\\":0,\\\"message\\\":{\\\"role\\\":\\\"assistant\\\",\\\"content\\\":\\\"Hello there, how can I help you today?\\\"},\\\"finish_reason\\\":\\\"stop\\\"}],$USAGE}"
fi
cat >"$TMP/upstream.conf" <<CONF
daemon off;
worker_processes 1;
pid $TMP/upstream.pid;
error_log $TMP/upstream.err error;
events { worker_connections 1024; }
http {
  access_log off;
  keepalive_requests 10000000;
  server {
    listen 127.0.0.1:$PORT_UP;
    location = /v1/chat/completions {
      default_type $TYPE;
      return 200 "$BODY";
    }
  }
}
CONF

# ---- the collector --------------------------------------------------------------
# Counts the CloudEvents it is POSTed (a JSON array each) by id; GET
# answers "EVENTS DISTINCT DISTINCT_WITH_USAGE POSTS".
cat >"$TMP/collector.py" <<'PY'
import json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ids, used, events, posts = set(), set(), [0], [0]

class Collector(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def do_POST(self):
        body = self.rfile.read(int(self.headers["content-length"]))
        batch = json.loads(body)
        for event in batch:
            ids.add(event["id"])
            if event.get("data", {}).get("total_tokens") is not None:
                used.add(event["id"])
        events[0] += len(batch)
        posts[0] += 1
        self.send_response(204)
        self.end_headers()

    def do_GET(self):
        text = f"{events[0]} {len(ids)} {len(used)} {posts[0]}\n".encode()
        self.send_response(200)
        self.send_header("content-length", str(len(text)))
        self.end_headers()
        self.wfile.write(text)

    def log_message(self, *args):
        pass

ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Collector).serve_forever()
PY

# ---- the gateways ---------------------------------------------------------------
# $1 = port, $2 = admin port, $3 = tokens or usd.
gateway_conf() {
  cat <<CONF
[server]
listen = "127.0.0.1:$1"
admin = "127.0.0.1:$2"
workers = 1

[upstreams.llm]
url = "http://127.0.0.1:$PORT_UP"

[limits.tpm]
key = "header:x-tenant"
algorithm = "token_bucket"
capacity = 1000000000
refill = "1000000000/s"
unit = "tokens"

[[routes]]
name = "chat"
match = { path = "/v1/chat/completions", methods = ["POST"] }
upstream = "llm"
tokens = { max_tokens_default = 100, usage = "auto" }
CONF
  if [ "$3" = usd ]; then
    cat <<CONF
limits = ["tpm", "monthly_spend"]

[prices."gpt-4o"]
input = 2.50
output = 10.00
cached_input = 1.25

[limits.monthly_spend]
key = "header:x-tenant"
algorithm = "fixed_window"
limit = 1000000000
window = "1mo"
unit = "usd"
warn_at = "80%"

[usage]
url = "http://127.0.0.1:$PORT_COLLECTOR/api/v1/events"
spool = "$TMP/spool-$1"
batch = 100
interval = "1s"
CONF
  else
    echo 'limits = ["tpm"]'
  fi
}
gateway_conf "$PORT_TOKENS" "$PORT_ADMIN_TOKENS" tokens >"$TMP/tokens.toml"
gateway_conf "$PORT_USD" "$PORT_ADMIN_USD" usd >"$TMP/usd.toml"

cat >"$TMP/chat.lua" <<'LUA'
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
wrk.headers["x-tenant"] = "acme"
wrk.body = '{"model":"gpt-4o","max_tokens":50,"messages":[{"role":"system","content":"You are a helpful assistant."},{"role":"user","content":"Say hello to the benchmark, briefly, in one sentence."}]}'
LUA

SERVER_CPUSET=$CLIENT_CPUS start_upstream "$TMP/upstream.conf"
taskset -c "$CLIENT_CPUS" python3 "$TMP/collector.py" "$PORT_COLLECTOR" 2>"$TMP/collector.err" &
PIDS+=($!)
SERVER_CPUSET=$SERVER_CPUS start_tollgate "$TMP/tokens.toml"
TG_TOKENS=$STARTED
SERVER_CPUSET=$SERVER_CPUS start_tollgate "$TMP/usd.toml"
TG_USD=$STARTED
for port in "$PORT_UP" "$PORT_COLLECTOR" "$PORT_TOKENS" "$PORT_USD" "$PORT_ADMIN_TOKENS" "$PORT_ADMIN_USD"; do
  (wait_port "$port") || { tail -n 5 "$TMP"/*.err >&2; exit 1; }
done

port_of() { if [ "$1" = usd ]; then echo "$PORT_USD"; else echo "$PORT_TOKENS"; fi; }
admin_of() { if [ "$1" = usd ]; then echo "$PORT_ADMIN_USD"; else echo "$PORT_ADMIN_TOKENS"; fi; }
pid_of() { if [ "$1" = usd ]; then echo "$TG_USD"; else echo "$TG_TOKENS"; fi; }
metric() { # admin port $1, the sum of the samples whose name and labels match $2
  curl -s "http://127.0.0.1:$1/metrics" | awk -v re="$2" '$1 ~ re {n += $NF} END {printf "%d\n", n}'
}
settled() { metric "$1" '^tollgate_tokens_usage_ratio_count[{]'; }
collected() { curl -s "http://127.0.0.1:$PORT_COLLECTOR/"; }

# One response of each checked by hand first: a 200 with the usage.
for target in tokens usd; do
  code=$(curl -s -o "$TMP/first.out" -w '%{http_code}' -X POST \
    -H 'content-type: application/json' -H 'x-tenant: acme' \
    --data '{"model":"gpt-4o","max_tokens":50,"messages":[{"role":"user","content":"hi"}]}' \
    "http://127.0.0.1:$(port_of "$target")/v1/chat/completions")
  grep -q '"usage"' "$TMP/first.out" && [ "$code" = 200 ] || {
    echo "$target: answered $code: $(head -c 300 "$TMP/first.out")" >&2
    exit 1
  }
done

CLK_TCK=$(getconf CLK_TCK)
RESULTS=$TMP/results.tsv
: >"$RESULTS"
run_wrk() { # target $1, seconds $2, output $3
  taskset -c "$CLIENT_CPUS" wrk -t1 -c"$CONNS" -d"$2s" -s "$TMP/chat.lua" \
    "http://127.0.0.1:$(port_of "$1")/v1/chat/completions" >"$3"
  check_statuses allow "$3"
}
# Waits (up to 10 s) until admin port $1 has settled at least $2 requests.
settled_reaches() {
  local now
  for _ in $(seq 1 200); do
    now=$(settled "$1")
    [ "$now" -ge "$2" ] && return 0
    sleep 0.05
  done
  echo "admin :$1: $now requests settled from their usage, expected at least $2" >&2
  exit 1
}
measure() { # target $1, round $2
  local target=$1 pid before after settled_before requests
  pid=$(pid_of "$target")
  settled_before=$(settled "$(admin_of "$target")")
  before=$(cpu_ticks "$pid")
  run_wrk "$target" "$SECONDS_PER_RUN" "$TMP/run.out"
  after=$(cpu_ticks "$pid")
  requests=$(awk '/requests in/ {print $1}' "$TMP/run.out")
  settled_reaches "$(admin_of "$target")" $((settled_before + requests))
  awk -v t="$target" -v r="$2" -v n="$requests" -v s="$SECONDS_PER_RUN" \
    -v cpu=$((after - before)) -v hz="$CLK_TCK" 'BEGIN {
      printf "%s\t%s\t%.0f\t%.2f\n", t, r, n / s, cpu * 1e6 / hz / n
    }' | tee -a "$RESULTS"
}

echo "# machine: nproc=$(nproc), CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ *//'), load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# $( [ "$STREAM" = 1 ] && echo 'SSE stream' || echo 'JSON') responses; wrk -t1 -c$CONNS -d${SECONDS_PER_RUN}s per run; rounds=$ROUNDS"
echo "# tollgate on CPU $SERVER_CPUS; wrk, nginx and the collector on CPU $CLIENT_CPUS"
for target in tokens usd; do run_wrk "$target" 2 "$TMP/warm.out"; done
printf 'target\tround\treq/s\ttollgate_us/req\n'
for round in $(seq 1 "$ROUNDS"); do
  for target in tokens usd; do measure "$target" "$round"; done
done

# Every request of the usd gateway settled from its usage reached the
# collector once, with its usage (the others: requests whose client left
# mid-response as wrk stopped, their events without usage).
usd_settled=$(settled "$PORT_ADMIN_USD")
for _ in $(seq 1 600); do
  read -r events distinct with_usage posts <<<"$(collected)"
  [ "$with_usage" -ge "$usd_settled" ] && [ "$(metric "$PORT_ADMIN_USD" '^tollgate_usage_spool_events$')" = 0 ] && break
  sleep 0.1
done
failed=$(metric "$PORT_ADMIN_USD" '^tollgate_usage_events_total[{]result="failed"')
dropped=$(metric "$PORT_ADMIN_USD" '^tollgate_usage_events_total[{]result="dropped"')
sent=$(metric "$PORT_ADMIN_USD" '^tollgate_usage_events_total[{]result="sent"')
echo
echo "# usd gateway: $usd_settled requests settled from their usage; the collector received $events events ($distinct distinct ids, $with_usage with usage) in $posts POSTs; the exporter counted $sent sent, $failed failed, $dropped dropped"
if [ "$with_usage" != "$usd_settled" ] || [ "$events" != "$distinct" ] || [ "$dropped" != 0 ] || [ "$failed" != 0 ]; then
  echo "usage export: $with_usage events with usage at the collector for $usd_settled settled requests, $events events for $distinct ids ($failed failed, $dropped dropped)" >&2
  exit 1
fi
remaining=$(curl -s "http://127.0.0.1:$PORT_ADMIN_USD/limits/monthly_spend?key=acme" |
  python3 -c 'import json, sys; e = json.load(sys.stdin); print(e["quota"] - e["remaining"])')
echo "# the budget of acme: $remaining µ\$ spent"
[ "$remaining" -gt 0 ] || { echo "usd: the budget was never charged" >&2; exit 1; }

echo
echo "# median (min-max) over $ROUNDS rounds"
awk -F'\t' -v rounds="$ROUNDS" "$AWK_STATS"'
  { rps[$1] = rps[$1] " " $3; cpu[$1] = cpu[$1] " " $4; C[$1, $2] = $4 }
  END {
    printf "%-7s %8s %13s %16s %15s\n", "target", "req/s", "(range)", "tollgate_us/req", "(range)"
    n = split("tokens usd", targets, " ")
    for (i = 1; i <= n; i++) {
      t = targets[i]
      M[t] = median(cpu[t])
      printf "%-7s %8.0f %13s %16.2f %15s\n", t, median(rps[t]), range(rps[t], "%.0f"), M[t], range(cpu[t], "%.2f")
    }
    s = ""
    for (r = 1; r <= rounds; r++) s = s sprintf(" %.2f", C["usd", r] / C["tokens", r])
    printf "\nusd / tokens, tollgate CPU per request (target <= 1.10): %.2f (rounds%s)\n", M["usd"] / M["tokens"], s
  }' "$RESULTS"

[ "$INSTR" = 1 ] || exit 0

# ---- instructions per request (callgrind) ---------------------------------------
stop "$TG_TOKENS" "$TG_USD"
# $1 = tokens or usd: its configuration on the instrumented ports, counted.
instructions() {
  local out="$TMP/cg" pid requests total
  rm -f "$out".*
  gateway_conf "$PORT_INSTR" "$PORT_ADMIN_INSTR" "$1" >"$TMP/cg-$1.toml"
  TOLLGATE_LOG=warn taskset -c "$SERVER_CPUS" valgrind --tool=callgrind --instr-atstart=no \
    --separate-threads=yes --callgrind-out-file="$out.%p" "$TOLLGATE" run -c "$TMP/cg-$1.toml" >"$TMP/cg.log" 2>&1 &
  pid=$!
  wait_port "$PORT_ADMIN_INSTR"
  PORT_USD=$PORT_INSTR PORT_TOKENS=$PORT_INSTR run_wrk "$1" 2 "$TMP/cg-warm.out"
  callgrind_control -i on "$pid" >/dev/null 2>&1
  PORT_USD=$PORT_INSTR PORT_TOKENS=$PORT_INSTR run_wrk "$1" 5 "$TMP/cg-run.out"
  requests=$(awk '/requests in/ {print $1}' "$TMP/cg-run.out")
  # The exporter's POSTs of those requests' events are counted too.
  [ "$1" = usd ] && sleep 1.5
  callgrind_control -d "$pid" >/dev/null 2>&1
  sleep 0.5
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  total=$(for f in "$out".*.1-*; do grep -m1 '^summary:' "$f" | awk '{print $2}'; done | awk '{n += $1} END {print n}')
  if [ -n "${KEEP_DUMPS:-}" ]; then
    mkdir -p "$KEEP_DUMPS"
    for f in "$out".*.1-*; do cp "$f" "$KEEP_DUMPS/$1.${f##*/cg.}"; done
    echo "$requests" >"$KEEP_DUMPS/$1.requests"
  fi
  echo $((total / requests))
}
wait_port_gone() { for _ in $(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null || return 0; sleep 0.05; done; }
i_tokens=$(instructions tokens)
wait_port_gone "$PORT_INSTR"
i_usd=$(instructions usd)
echo
printf 'instructions per request (callgrind, user space): tokens %s, usd %s, usd / tokens %s\n' \
  "$i_tokens" "$i_usd" "$(awk -v a="$i_usd" -v b="$i_tokens" 'BEGIN {printf "%.2f", a / b}')"
