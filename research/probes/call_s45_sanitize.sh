#!/usr/bin/env bash
# Forty-fifth session, device call 1: compute-sanitizer over the verify kernels (racecheck and synccheck,
# never run on them before) and the default plan of tools/sanitize.sh on HEAD, every run in parallel
# (one GPU, time-sliced; each run its own process), with -lineinfo so that reports name source lines.
# Logs: $OUT/sanitize.tgz; the summary lines last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; L=/tmp/s45; rm -rf "$L"; mkdir -p "$L"
VK="padded or int32_index or batches_ragged or more_splits"
t0=$(date +%s)
# warm the kernel cache (-lineinfo is a cache key of its own) with plain runs of the same tests
DRIVERLEVEL_LINEINFO=1 timeout 150 python -m pytest -q -m gpu -p no:cacheprovider -n 8 \
  tests/test_verify_schedule_gpu.py tests/test_verify_attention_gpu.py tests/test_ddtree_robust_gpu.py \
  tests/test_decode_step_fuzz_gpu.py -k "$VK or corrupted or poisoned or nonfinite or device_schedule" > "$L/warm.log" 2>&1
echo "warm: $(tail -n 1 "$L/warm.log") ($(( $(date +%s) - t0 )) s)"
run() {  # name, K (or - for the group's own), runs...
  local name=$1 k=$2; shift 2
  if [ "$k" = - ]; then
    OUT="$L/$name" LINEINFO=1 PRINT_LIMIT=40 bash tools/sanitize.sh --timeout "${T:-400}" "$@" > "$L/$name.txt" 2>&1
  else
    OUT="$L/$name" LINEINFO=1 PRINT_LIMIT=40 bash tools/sanitize.sh -k "$k" --timeout "${T:-400}" "$@" > "$L/$name.txt" 2>&1
  fi
}
run race-verify "$VK" racecheck:verify-all &
run sync-verify "$VK" synccheck:verify-all &
run mem-ddtree - memcheck:ddtree &
run mem-verify - memcheck:verify &
run mem-step - memcheck:step &
run race-ddtree - racecheck:ddtree &
run sync-ddtree - synccheck:ddtree &
wait
echo "sanitizer runs: $(( $(date +%s) - t0 )) s"
tar -czf "$OUT/sanitize.tgz" -C "$L" .
for f in "$L"/*.txt; do sed -n '/=== summary/,$p' "$f" | tail -n +3; done
# the first reports of any run that found something
for f in "$L"/*/*.log; do
  if grep -q -E 'hazard|Error|Barrier' "$f"; then echo "--- $f"; grep -E -m 12 -A 3 'hazard detected|Invalid|Barrier error|Race reported|Error' "$f" | head -n 40; fi
done
