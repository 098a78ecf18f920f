#!/usr/bin/env bash
# Instructions per limiter decision, counted by callgrind on the criterion
# bench (`benches/limiter.rs`), for every `one_key` row.
#
# Times of one decision (30-40 ns) move by 2x on a busy machine; the
# instructions a decision executes do not. Each row runs alone under
# `valgrind --tool=callgrind --toggle-collect='criterion::bencher::Bencher*::iter*'`
# with `--profile-time 1`: only the timed loop is counted (the decision,
# and the clock read and criterion's loop around it, which are the same in
# every build). Criterion's profiling loop calls
# `Bencher::iter` with 1, 2, 4, ... iterations, so k calls ran 2^k - 1
# decisions: the figure is the collected instructions over that.
#
# Run:    bench/limiter_instructions.sh [BENCH_BINARY ...]
#         (default: the dist build of the bench, built here:
#          `cargo bench --profile dist --bench limiter --no-run`)
# Knobs:  ROWS='token_bucket governor_keyed' (default: every one_key row)
# Output: one line per binary, mode and row: instructions per decision.
set -euo pipefail

cd "$(dirname "$0")/.."

ROWS=${ROWS:-"fixed_window sliding_window sliding_log token_bucket token_bucket_given_now leaky_bucket concurrency governor_keyed"}

if [ $# -eq 0 ]; then
  bin=$(cargo bench --profile dist --bench limiter --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*limiter[^"]*\)".*/\1/p' | tail -1)
  set -- "$bin"
fi

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

# Instructions per decision in one callgrind dump.
per_decision() {
  awk '
    /^c?fn=\(/ {
      id = $1; sub(/^c?fn=/, "", id)
      if (index($0, "criterion::bencher::Bencher") && index($0, "::iter")) iter[id] = 1
      callee = ($0 ~ /^cfn=/) ? id : ""
      next
    }
    /^calls=/ { if (callee in iter) { split($0, c, /[= ]/); calls += c[2] } callee = ""; next }
    /^(summary|totals):/ { total = $2 }
    END { printf "%.1f\n", total / (2 ^ calls - 1) }
  ' "$1"
}

for bin in "$@"; do
  for mode in allow deny; do
    for row in $ROWS; do
      dump=$out/callgrind.out
      valgrind --tool=callgrind --callgrind-out-file="$dump" \
        --toggle-collect='criterion::bencher::Bencher*::iter*' \
        "$bin" --bench --profile-time 1 "^one_key/$mode/$row\$" >"$out/log" 2>&1
      printf '%s\t%s\t%s\t%s\n' "$bin" "$mode" "$row" "$(per_decision "$dump")"
    done
  done
done
