#!/bin/sh
# Runs every fuzz target for a number of executions each (default 10 million),
# one after the other, and stops at the first crash. Not run in CI: it takes
# minutes per target. Needs cargo-fuzz and a nightly toolchain.
#
#   fuzz/run.sh                 # every target, 10 M executions each
#   fuzz/run.sh 1000000         # fewer
#   fuzz/run.sh 10000000 request_head
#
# Each target prints libFuzzer's final `Done N runs in S second(s)` line;
# crashes land in fuzz/artifacts/<target>/.
set -eu
cd "$(dirname "$0")"
runs="${1:-10000000}"
shift 2>/dev/null || true
targets="${*:-$(cargo +nightly fuzz list)}"
for target in $targets; do
    echo "== $target: $runs executions"
    mkdir -p "corpus/$target"
    cargo +nightly fuzz run "$target" "corpus/$target" -- -runs="$runs" -max_len=8192
done
