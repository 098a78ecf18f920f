#!/usr/bin/env bash
# The usage exporter's throughput (the spend budgets' export measure): how many events
# per second it sends to a local collector, and how many bytes of spool
# each event costs on disk.
#
#   bench/usage_export.sh            # builds `dist` (SKIP_BUILD=1: don't;
#                                    # TOLLGATE=PATH: another binary)
#
# The gateway (`workers = 1`) answers `GET /e` itself (`respond`) with
# `usage_events = true`, so every request makes one event; the collector
# is nginx answering `204` to every POST (it reads and discards the body:
# the collector costs little, the exporter sets the pace).
#
# 1. Fill: the collector is down; wrk -t1 -c16 for FILL_SECONDS (5) sends
#    requests, whose events go to the spool. Spool bytes per event = the
#    segments' bytes / the events spooled (none acknowledged yet); the
#    writer's rate = events spooled / FILL_SECONDS (what the request rate
#    allowed: a floor of what it sustains); `dropped` shows any it lost.
# 2. Drain: the collector starts; the time until the spool is empty (the
#    gauge `tollgate_usage_spool_events` at 0, polled every 50 ms) gives
#    the sender's rate = events / seconds, `batch` events a POST.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
source bench/common.sh
need_tools wrk curl nginx
build_release
TOLLGATE=$(realpath "${TOLLGATE:-target/dist/tollgate}")
FILL_SECONDS=${FILL_SECONDS:-5}
BATCH=${BATCH:-100}
PORT=${BASE_PORT:-18760}
ADMIN=$((PORT + 1))
COLLECTOR=$((PORT + 2))
start_scratch

cat >"$TMP/collector.conf" <<CONF
daemon off;
worker_processes 1;
pid $TMP/collector.pid;
error_log $TMP/collector.err warn;
events { worker_connections 1024; }
http {
  access_log off;
  client_body_buffer_size 1m;
  client_max_body_size 64m;
  server {
    listen 127.0.0.1:$COLLECTOR;
    location /api/v1/events { return 204; }
  }
}
CONF

cat >"$TMP/gateway.toml" <<TOML
[server]
listen = "127.0.0.1:$PORT"
admin = "127.0.0.1:$ADMIN"
workers = 1

[usage]
url = "http://127.0.0.1:$COLLECTOR/api/v1/events"
spool = "$TMP/spool"
batch = $BATCH
interval = "100ms"

[[routes]]
name = "e"
match = { path = "/e" }
respond = { status = 200, body = "ok" }
usage_events = true
TOML
start_tollgate "$TMP/gateway.toml"
wait_port "$PORT"

metric() { # $1 = a sample's name and labels, as exposed
  curl -s "http://127.0.0.1:$ADMIN/metrics" | awk -v name="$1" '$1 == name {print $2}'
}

# 1. Fill, the collector down.
wrk -t1 -c16 -d"${FILL_SECONDS}s" "http://127.0.0.1:$PORT/e" >"$TMP/fill.wrk"
check_statuses allow "$TMP/fill.wrk" "http://127.0.0.1:$PORT/e"
requests=$(awk '/requests in/ {print $1}' "$TMP/fill.wrk")
# The writer has caught up once every request's event is spooled or dropped.
for _ in $(seq 1 600); do
  spooled=$(metric tollgate_usage_spool_events)
  dropped=$(metric 'tollgate_usage_events_total{result="dropped"}')
  [ $((${spooled%.*} + ${dropped%.*})) -ge "$requests" ] && break
  sleep 0.05
done
bytes=$(find "$TMP/spool" -name '*.jsonl' -printf '%s\n' | awk '{s += $1} END {print s}')

# 2. Drain, the collector up.
start_nginx "$TMP/collector.conf"
started=$(date +%s.%N)
for _ in $(seq 1 6000); do
  [ "$(metric tollgate_usage_spool_events)" = 0 ] && break
  sleep 0.05
done
ended=$(date +%s.%N)
sent=$(metric 'tollgate_usage_events_total{result="sent"}')

awk -v requests="$requests" -v spooled="$spooled" -v dropped="$dropped" \
  -v bytes="$bytes" -v fill="$FILL_SECONDS" -v sent="$sent" \
  -v started="$started" -v ended="$ended" -v batch="$BATCH" 'BEGIN {
  printf "fill (collector down): %d requests in %d s, %d events spooled, %d dropped\n",
    requests, fill, spooled, dropped
  printf "  spool bytes per event  %.0f (%d bytes for %d events)\n", bytes / spooled, bytes, spooled
  printf "  events written per s   %.0f (the request rate: a floor)\n", spooled / fill
  printf "drain (collector up, batch %d): %d events sent in %.2f s\n", batch, sent, ended - started
  printf "  events sent per s      %.0f\n", sent / (ended - started)
}'
