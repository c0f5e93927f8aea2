#!/usr/bin/env bash
# Issue 10, step 2: the reduce-scatter S exchange, checked and timed on one GPU in <= 150 s.
#
#   PYTHONPATH=$PWD OUT=/some/dir tools/rs_gpu_check.sh
#
# 1. The verify-attention GPU tests of the main loop's variants (float64 references, every mask
#    format): the sm_120 tile with the old all-reduce exchange (sm120) and the new reduce-scatter
#    one (sm120rs), and the native tile with the reduce-scatter exchange (nativers); 36 tests.
#    Hard limit 85 s (a barrier mismatch would hang the kernel: the timeout kills it).
# 2. benchmarks/bench_tiles.py --quick: the native tile, the native tile with the reduce-scatter
#    exchange, the sm_120 tile with each exchange, same inputs, same run; a summary table with
#    the ratios last. Hard limit 60 s (the table is printed shape by shape as it goes).
# Logs and JSON under $OUT (default: a new temporary directory). Exit status non-zero if a step failed.
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
OUT_DIR="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/rs_gpu_check.XXXXXX")}"
mkdir -p "$OUT_DIR"
FAILED=0
STATUS=()

step() {  # step NAME LIMIT_S CMD...
  local name="$1" limit="$2"; shift 2
  local start rc
  echo "=== $name (limit ${limit}s): $*"
  start=$(date +%s)
  timeout -k 5 "$limit" "$@" 2>&1 | tee "$OUT_DIR/$name.log"
  rc=${PIPESTATUS[0]}
  [[ $rc -ne 0 ]] && FAILED=1
  STATUS+=("$(printf '%-10s rc=%-3s %4ss  %s' "$name" "$rc" "$(( $(date +%s) - start ))" \
    "$( [[ $rc -eq 124 || $rc -eq 137 ]] && echo TIMEOUT || grep -v '^[[:space:]]*$' "$OUT_DIR/$name.log" | tail -n 1 | cut -c1-100)")")
}

nvidia-smi -L 2>&1 | tee "$OUT_DIR/environment.log"
git log --oneline -1 2>/dev/null | tee -a "$OUT_DIR/environment.log"

step tests 85 "$PY" -m pytest -m gpu -q -rs --maxfail=10 --durations=8 -p no:cacheprovider \
  --junitxml="$OUT_DIR/tests.xml" -k "sm120 or nativers" \
  tests/test_verify_attention_gpu.py tests/test_verify_schedule_gpu.py

step bench 60 "$PY" benchmarks/bench_tiles.py --quick --json "$OUT_DIR/bench_tiles_rs.json" \
  --tile native=native --tile native_rs=native_rs --tile sm120=32x4x32x2q --tile sm120rs=32x4x32x2qr \
  --ratio sm120rs/sm120 --ratio native_rs/native --ratio sm120rs/native

echo
echo "=== rs_gpu_check summary (logs in $OUT_DIR)"
for s in "${STATUS[@]}"; do echo "$s"; done
exit "$FAILED"
