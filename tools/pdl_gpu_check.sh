#!/usr/bin/env bash
# One H200 run of programmatic dependent launch in the DDTree build (branch h-pdl): the new PDL
# GPU tests (a pdl build equals pdl=False bitwise, eager and from a graph; the captured edges are
# programmatic), the rest of tests/test_ddtree_gpu.py and tests/test_ddtree_robust_gpu.py (with
# the plan's default, pdl on from sm_90), then bench_ddtree --quick for the threshold top-K with
# pdl off and on side by side, a short table last. Every step has a hard timeout.
#
#   tools/pdl_gpu_check.sh            (OUT=/some/dir for the logs; default: a new temporary directory)
#
# Exit status: non-zero if any step failed or timed out.
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=$PWD
PY="${PYTHON:-python}"
OUT_DIR="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/pdl.XXXXXX")}"
mkdir -p "$OUT_DIR"
SUMMARY=()
FAILED=0
T0=$(date +%s)

# step NAME SECONDS CMD...: run CMD under a hard timeout, log to $OUT_DIR/NAME.log
step() {
  local name="$1" secs="$2"; shift 2
  local start rc status
  echo "=== $name (timeout ${secs}s): $*"
  start=$(date +%s)
  timeout -k 5 "$secs" "$@" >"$OUT_DIR/$name.log" 2>&1
  rc=$?
  case "$rc" in 0) status=ok ;; 5) status="no tests" ;; 124|137) status="TIMEOUT" ;; *) status="FAIL($rc)" ;; esac
  [ "$rc" -ne 0 ] && FAILED=1
  tail -n 4 "$OUT_DIR/$name.log"
  SUMMARY+=("$(printf '%-12s %-9s %4ss  %s' "$name" "$status" "$(($(date +%s) - start))" \
    "$(grep -v '^[[:space:]]*$' "$OUT_DIR/$name.log" | tail -n 1 | cut -c1-100)")")
}

nvidia-smi -L 2>&1 | head -2
# 1. the new tests first (skipped below sm_90: the summary says "skipped")
step tests-pdl 300 "$PY" -m pytest -m gpu -q -x -rs -p no:cacheprovider tests/test_ddtree_gpu.py -k pdl \
  --junitxml="$OUT_DIR/tests-pdl.xml"
# 2. every other DDTree GPU test, with the plan's default (pdl on from sm_90)
step tests-ddtree 600 "$PY" -m pytest -m gpu -q -x -rs -p no:cacheprovider tests/test_ddtree_gpu.py \
  tests/test_ddtree_robust_gpu.py -k "not pdl" --junitxml="$OUT_DIR/tests-ddtree.xml"
# 3. the benchmark, pdl off and on side by side (no torch peer: time)
step bench 300 "$PY" benchmarks/bench_ddtree.py --quick --no-reference --topk threshold --pdl both \
  --json "$OUT_DIR/bench_ddtree_pdl.json"

echo
echo "=== threshold build / step / top-K, median GPU µs, pdl off vs on (bench columns: build \$5, step \$11, top-K \$12, pdl last)"
grep -E '^ *threshold ' "$OUT_DIR/bench.log" | \
  awk '{printf "budget %4s batch %2s pdl %-3s | build %7s | step %7s | top-K %7s\n", $2, $3, $NF, $5, $11, $12}'
echo "--- the build's launches, cumulative µs (pdl off, then on, per row)"
grep "build's launches" "$OUT_DIR/bench.log" | sed 's/^[ |]*//'
echo
echo "=== summary (logs in $OUT_DIR, $(($(date +%s) - T0)) s)"
for line in "${SUMMARY[@]}"; do echo "$line"; done
exit $FAILED
