#!/usr/bin/env bash
# What an idle keep-alive connection costs the gateway in memory.
#
# For each worker setting (`workers = 1`, then the default: one per core) it
# starts tollgate (release build) in front of nginx `return 200`, warms it up
# with a few hundred requests (so the upstream pool and the allocator's
# caches are in place), reads the gateway's RSS, then opens CONNECTIONS
# keep-alive connections that each make one request, read the whole
# response and then stay open, idle. It reads the RSS again once they are
# all open and idle, checks that every one is still open, and prints the
# difference per connection. TLS=1 measures the same over TLS (a
# self-signed certificate made with openssl), where rustls keeps buffers of
# its own per connection. The peer, nginx `limit_req` (one worker), is
# measured the same way in the same run (with TLS=1, over TLS too: the same
# certificate, OpenSSL's defaults). A run fails unless every
# connection opened and stayed open.
#
# Run:    bench/idle_rss.sh [BINARY]    (default: target/dist/tollgate,
#                                        built unless SKIP_BUILD=1)
# Knobs:  BASE_PORT=18190 (uses BASE_PORT .. BASE_PORT+6), CONNECTIONS=10000,
#         TLS=1 (also measure TLS connections)
# Needs nginx, python3 (and openssl for TLS=1); raises `ulimit -n` to the
# hard limit (it must allow CONNECTIONS + a few hundred descriptors).
set -euo pipefail

BASE_PORT=${BASE_PORT:-18190}
CONNECTIONS=${CONNECTIONS:-10000}
cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh
need_tools nginx python3

if [ $# -eq 0 ]; then
  build_release
  set -- "$PWD/target/dist/tollgate"
fi
BINARY=$1

ulimit -n "$(ulimit -Hn)"
if [ "$(ulimit -n)" -lt $((CONNECTIONS + 500)) ]; then
  echo "ulimit -n is $(ulimit -n): too low for $CONNECTIONS connections" >&2
  exit 1
fi

start_scratch

PORT_UP=$BASE_PORT
upstream_conf "$PORT_UP" "$TMP" >"$TMP/upstream.conf"
"$NGINX" -p "$TMP/" -c "$TMP/upstream.conf" >/dev/null 2>&1 &
PIDS+=($!)
wait_port "$PORT_UP"

if [ "${TLS:-0}" = 1 ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -subj /CN=localhost -days 1 \
    -keyout "$TMP/key.pem" -out "$TMP/cert.pem" >/dev/null 2>&1
fi

# The client: opens the connections (a hundred at a time), each one request
# and its whole response, then holds them all; prints "open" when they are
# all idle, waits for a line on stdin, checks they are all still open
# (nothing to read, no EOF) and prints how many are.
cat >"$TMP/client.py" <<'PY'
import asyncio, ssl, sys

port, count, use_tls = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
request = b"GET / HTTP/1.1\r\nHost: bench\r\n\r\n"
context = None
if use_tls:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE

async def one(held):
    reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
    writer.write(request)
    head = await reader.readuntil(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    await reader.readexactly(length)
    if not head.startswith(b"HTTP/1.1 200"):
        raise SystemExit("unexpected response: %r" % head[:40])
    held.append((reader, writer))

async def main():
    held = []
    for start in range(0, count, 100):
        await asyncio.gather(*(one(held) for _ in range(min(100, count - start))))
    print("open", len(held), flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    alive = 0
    for reader, _ in held:
        try:
            await asyncio.wait_for(reader.read(1), 0.001)
        except asyncio.TimeoutError:
            alive += 1
    print("alive", alive, flush=True)

asyncio.run(main())
PY

rss_kib() {
  awk '/^VmRSS:/ {print $2}' "/proc/$1/status"
}

# Measures one gateway configuration: $1 = label, $2 = port, $3 = the
# `workers` line (empty: the default), $4 = 1 for TLS.
measure() {
  local label=$1 port=$2 workers=$3 tls=$4 pid before after alive
  {
    echo "[server]"
    # Opening 10,000 connections (TLS handshakes in Python) may take longer
    # than the default idle timeout: the first ones must still be open.
    echo 'idle_timeout = "10m"'
    if [ "$tls" = 1 ]; then
      echo "listen = \"127.0.0.1:$((BASE_PORT + 4))\""
      echo "$workers"
      echo "[server.tls]"
      echo "listen = \"127.0.0.1:$port\""
      echo "cert = \"$TMP/cert.pem\""
      echo "key = \"$TMP/key.pem\""
    else
      echo "listen = \"127.0.0.1:$port\""
      echo "$workers"
    fi
    cat <<CONF

[upstreams.up]
url = "http://127.0.0.1:$PORT_UP"

[[routes]]
name = "all"
match = { path_prefix = "/" }
upstream = "up"
CONF
  } >"$TMP/gateway-$port.toml"
  TOLLGATE_LOG=warn "$BINARY" run -c "$TMP/gateway-$port.toml" >"$TMP/gateway-$port.log" 2>&1 &
  pid=$!
  PIDS+=("$pid")
  hold "$label" "$port" "$pid" "$tls"
}

# The peer in the same run: nginx `limit_req` in front of the same upstream
# (bench/load.sh's allowing configuration, one worker, as one process with
# `master_process off` so its RSS is the serving process's), room made for
# CONNECTIONS connections. $1 = label, $2 = port, $3 = 1 for TLS (the
# gateway's certificate).
measure_nginx() {
  local label=$1 port=$2 tls=${3:-0} pid room=$((CONNECTIONS + 1000)) listen
  listen="listen 127.0.0.1:$port;"
  if [ "$tls" = 1 ]; then
    listen="listen 127.0.0.1:$port ssl; ssl_certificate $TMP/cert.pem; ssl_certificate_key $TMP/key.pem;"
  fi
  {
    echo "master_process off;"
    echo "worker_rlimit_nofile $room;"
    nginx_proxy_conf 1 "$port" "burst=1000000 nodelay" "1000000r/s" "$PORT_UP" "$TMP" |
      sed -e "s/worker_connections 4096;/worker_connections $room;/" \
        -e "s|listen 127.0.0.1:$port;|$listen|" \
        -e "s/keepalive_requests 10000000;/&\n  keepalive_timeout 10m;/"
  } >"$TMP/ng-idle-$port.conf"
  "$NGINX" -p "$TMP/" -c "$TMP/ng-idle-$port.conf" >/dev/null 2>&1 &
  pid=$!
  PIDS+=("$pid")
  hold "$label" "$port" "$pid" "$tls"
}

# The server $3 listening on port $2: warmed up, its RSS read, CONNECTIONS
# idle keep-alive connections opened and held, its RSS read again, and one
# line printed. $1 = label, $4 = 1 for TLS.
hold() {
  local label=$1 port=$2 pid=$3 tls=$4 before after opened alive
  wait_port "$port"
  # Warm-up: 300 requests on 300 short connections.
  python3 "$TMP/client.py" "$port" 300 "$tls" <<<"" >/dev/null
  sleep 1
  before=$(rss_kib "$pid")
  coproc CLIENT { python3 "$TMP/client.py" "$port" "$CONNECTIONS" "$tls"; }
  read -r _ opened <&"${CLIENT[0]}"
  sleep 2
  after=$(rss_kib "$pid")
  echo >&"${CLIENT[1]}"
  read -r _ alive <&"${CLIENT[0]}"
  wait "$CLIENT_PID" || true
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  if [ "$alive" != "$CONNECTIONS" ] || [ "$opened" != "$CONNECTIONS" ]; then
    echo "$label: $opened opened, $alive still open, of $CONNECTIONS" >&2
    exit 1
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$label" "$opened" "$alive" "$before" "$after" \
    "$(awk -v a="$after" -v b="$before" 'BEGIN {printf "%.1f", (a - b) / 1024}')" \
    "$(awk -v a="$after" -v b="$before" -v n="$opened" 'BEGIN {printf "%.0f", (a - b) * 1024 / n}')"
}

printf 'gateway\topened\tstill_open\trss_before_KiB\trss_after_KiB\tabove_idle_MiB\tbytes_per_conn\n'
measure "http, workers = 1" $((BASE_PORT + 1)) "workers = 1" 0
measure "http, workers default" $((BASE_PORT + 2)) "" 0
measure_nginx "nginx limit_req, 1 worker" $((BASE_PORT + 5))
if [ "${TLS:-0}" = 1 ]; then
  measure "https, workers = 1" $((BASE_PORT + 3)) "workers = 1" 1
  measure_nginx "nginx limit_req https, 1 worker" $((BASE_PORT + 6)) 1
fi
