#!/usr/bin/env bash
# make fuzz: run every libFuzzer target of a sanitizer build for a bounded time each
# (default 60 s, FUZZ_SECONDS) over its committed corpus plus a scratch corpus, and
# print one line per target. Crash/leak/timeout inputs land in
# <build>/fuzz-artifacts/<target>/ (copy them to tests/fuzz/corpus/<target>/ as
# regression cases once fixed). Exit 1 when any target failed.
#   scripts/fuzz-all.sh [build-dir] [seconds] [target-name-regex]
set -uo pipefail
build=${1:-build-asan}
seconds=${2:-${FUZZ_SECONDS:-60}}
only=${3:-${FUZZ_ONLY:-.}}
repo=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "$build" && pwd) || { echo "fuzz-all: no build directory $1" >&2; exit 2; }
failed=()
printf '%-24s %8s %12s %10s %s\n' target seconds execs new_units result
for src in "$repo"/tests/fuzz/fuzz_*.c; do
    name=$(basename "$src" .c)
    [[ $name =~ $only ]] || continue
    bin=$build/$name
    if [[ ! -x $bin ]]; then
        printf '%-24s %8s %12s %10s %s\n' "$name" - - - "NOT BUILT (configure with -DMOTOR_FUZZ=ON)"
        failed+=("$name")
        continue
    fi
    art=$build/fuzz-artifacts/$name
    log=$build/fuzz-artifacts/$name.log
    mkdir -p "$art"
    # run-fuzz.sh execs the target with the committed corpus; artifacts go to the cwd.
    (cd "$art" && ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
        "$repo/scripts/run-fuzz.sh" "$bin" "$repo/tests/fuzz/corpus/$name" \
        "$build/fuzz-work/$name" "$seconds") >"$log" 2>&1
    rc=$?
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
    units=$(sed -n 's/^stat::new_units_added: *//p' "$log" | tail -1)
    if [[ $rc -eq 0 ]]; then
        result=ok
    else
        result="FAILED (exit $rc; log $log; inputs in $art)"
        failed+=("$name")
    fi
    printf '%-24s %8s %12s %10s %s\n' "$name" "$seconds" "${execs:--}" "${units:--}" "$result"
done
if ((${#failed[@]})); then
    echo "fuzz: ${#failed[@]} target(s) failed: ${failed[*]}" >&2
    exit 1
fi
echo "fuzz: all targets ran ${seconds}s without a finding"
