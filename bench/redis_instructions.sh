#!/usr/bin/env bash
# Redis's user-space instructions per decision (callgrind on redis-server):
# tollgate's src/store/stack.lua in batches of token-bucket decisions, and
# the peer's bench/lua/peer_gcra.lua one EVALSHA per decision, over KEYS
# keys cycling (bench/redis_drive.py sends the calls). Instructions, unlike
# CPU time, do not move with the neighbours' load: this is the figure to
# compare scripts by (BENCHMARKS.md, "The Redis store").
#
# Run:   bench/redis_instructions.sh
# Knobs: KEYS=10000 BATCH=20 CALLS=300 (batches; the peer makes
#        CALLS * BATCH calls) BASE_PORT=18380
#        SCRIPT=src/store/stack.lua LAYOUT=stack (or LAYOUT=stack-f735849
#        with that commit's script, `git show f735849:src/store/stack.lua`;
#        LAYOUT=stack-fcb6666 likewise)
#        REDIS_SERVER=redis-server (e.g. one built from source with symbols)
#        KEEP_DUMPS=DIR keeps the callgrind dumps there (tollgate.out,
#        peer.out), for callgrind_annotate per function
# Needs redis-server, redis-cli, valgrind and python3. redis-server runs
# with `hz 1`, so that its timers, which fire by wall clock and valgrind
# slows 50x, add little; the keys' expiry is counted as it falls.
set -euo pipefail

KEYS=${KEYS:-10000}
BATCH=${BATCH:-20}
CALLS=${CALLS:-300}
BASE_PORT=${BASE_PORT:-18380}
SCRIPT=${SCRIPT:-src/store/stack.lua}
LAYOUT=${LAYOUT:-stack}
REDIS_SERVER=${REDIS_SERVER:-redis-server}
KEEP_DUMPS=${KEEP_DUMPS:-}

cd "$(dirname "$0")/.."
# shellcheck source=bench/common.sh
. bench/common.sh
need_tools redis-server redis-cli valgrind python3
start_scratch

valgrind --tool=callgrind --callgrind-out-file="$TMP/callgrind.%p" \
  "$REDIS_SERVER" --port "$BASE_PORT" --bind 127.0.0.1 --save "" --appendonly no \
  --hz 1 --dir "$TMP" >"$TMP/redis.log" 2>&1 &
REDIS=$!
PIDS+=("$REDIS")
for _ in $(seq 1 100); do
  redis-cli -p "$BASE_PORT" PING >/dev/null 2>&1 && break
  sleep 0.2
done

# Instructions per decision of `redis_drive.py $1 $2 $3 $4` ($5 decisions);
# $6: the number of this callgrind dump (1, 2, ...), $7 its name in KEEP_DUMPS.
per_decision() {
  python3 bench/redis_drive.py "$BASE_PORT" "$1" "$2" "$3" "$KEYS" 20 # warm up
  callgrind_control -z "$REDIS" >/dev/null 2>&1
  python3 bench/redis_drive.py "$BASE_PORT" "$1" "$2" "$3" "$KEYS" "$4"
  callgrind_control -d "$REDIS" >/dev/null 2>&1
  [ -z "$KEEP_DUMPS" ] || cp "$TMP/callgrind.$REDIS.$6" "$KEEP_DUMPS/$7.out"
  awk -v n="$5" '/^(summary|totals):/ {printf "%.0f\n", $2 / n; exit}' "$TMP/callgrind.$REDIS.$6"
}

echo "# $(redis-server --version | cut -d' ' -f1-3), callgrind; keys=$KEYS"
echo "tollgate ($SCRIPT, $LAYOUT), batches of $BATCH: $(per_decision "$SCRIPT" "$LAYOUT" "$BATCH" "$CALLS" $((CALLS * BATCH)) 1 tollgate) instructions per decision"
echo "peer (bench/lua/peer_gcra.lua), one call per decision: $(per_decision bench/lua/peer_gcra.lua peer 1 $((CALLS * BATCH)) $((CALLS * BATCH)) 2 peer) instructions per decision"
