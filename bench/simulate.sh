#!/usr/bin/env bash
# How long `tollgate simulate` takes for a million requests.
#
# Three runs against the repository's gateway.toml, each timed (wall clock
# user CPU and peak memory, from /usr/bin/time when present):
#   1. generated: `poisson:rate=10000/s,keys=1000,duration=100s` at the `api`
#      route (about 1,000,000 requests; no file to parse);
#   2. a 1,000,000-line CSV trace, gzip-compressed (written here by awk:
#      1000 API keys and addresses, 10,000 requests a second);
#   3. the same trace with `--compare` of all five rate algorithms (five
#      variants and the reference decide every request).
#
# Run:    bench/simulate.sh [BINARY]   (default: target/dist/tollgate,
#                                       built unless SKIP_BUILD=1)
set -euo pipefail

cd "$(dirname "$0")/.."

# shellcheck source=bench/common.sh
. bench/common.sh

BINARY=${1:-target/dist/tollgate}
if [ $# -eq 0 ]; then
  build_release
fi
start_scratch

timed() {
  echo "\$ tollgate $*" | sed "s|$TMP/||g"
  if [ -x /usr/bin/time ]; then
    /usr/bin/time -f "%e s wall, %U s user, %M KiB peak" "$BINARY" "$@" >"$TMP/out.txt"
  else
    TIMEFORMAT="%R s wall"
    time "$BINARY" "$@" >"$TMP/out.txt"
  fi
  sed -n '1p' "$TMP/out.txt"
  echo
}

awk 'BEGIN {
  print "time,method,path,ip,header:x-api-key";
  for (i = 0; i < 1000000; i++) {
    k = (i * 7919) % 1000;
    printf "%.4f,GET,/api/items/%d,10.0.%d.%d,k-%d\n", 1772359200 + i / 10000, i % 500, int(k / 256), k % 256, k;
  }
}' | gzip -1 >"$TMP/trace.csv.gz"

timed simulate -c gateway.toml --route api --generate poisson:rate=10000/s,keys=1000,duration=100s
timed simulate -c gateway.toml --route api --trace "$TMP/trace.csv.gz"
timed simulate -c gateway.toml --route api --trace "$TMP/trace.csv.gz" \
  --compare fixed_window,sliding_window,sliding_log,token_bucket,leaky_bucket
