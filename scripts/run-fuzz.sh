#!/usr/bin/env bash
# Run one libFuzzer target for a bounded time over its committed corpus (regression
# inputs included) plus a scratch corpus that is not committed.
set -euo pipefail
target=$1 corpus=$2 work=$3 seconds=$4
mkdir -p "$work" "$corpus"
exec "$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 "$work" "$corpus"
