#!/usr/bin/env bash
# One H200 run of the threshold top-K (branch h-topk2, issue 12): GPU tests of both top-K paths,
# then bench_ddtree --quick for both paths side by side (fp32, then bf16), a short table last.
# Every step has a hard timeout; the whole script stays under 150 s.
#
#   PYTHONPATH=$PWD OUT=/some/dir tools/topk2_gpu_check.sh
#
# Logs and JSON results go to $OUT (default: a new temporary directory).
set -uo pipefail
export PYTHONUNBUFFERED=1
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python}"
OUT_DIR="${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/topk2.XXXXXX")}"
mkdir -p "$OUT_DIR"
SUMMARY=()
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
  tail -n 4 "$OUT_DIR/$name.log"
  SUMMARY+=("$(printf '%-16s %-9s %4ss  %s' "$name" "$status" "$(($(date +%s) - start))" \
    "$(grep -v '^[[:space:]]*$' "$OUT_DIR/$name.log" | tail -n 1 | cut -c1-100)")")
}

nvidia-smi -L 2>&1 | head -2
TESTS=(tests/test_ddtree_gpu.py tests/test_ddtree_robust_gpu.py)
SEL="model_vocabularies or build_matches or fallback_rows or nonfinite_drafter or poisoned_build or graph_replay"
# 1. the threshold path first (new code), then the chunked path of the same tests (the default)
step tests-threshold 62 "$PY" -m pytest -m gpu -q -x -rs -p no:cacheprovider "${TESTS[@]}" \
  -k "threshold and ($SEL)" --junitxml="$OUT_DIR/tests-threshold.xml"
step tests-chunked 30 "$PY" -m pytest -m gpu -q -x -rs -p no:cacheprovider "${TESTS[@]}" \
  -k "chunked and ($SEL)" --junitxml="$OUT_DIR/tests-chunked.xml"
# 2. the benchmark, both paths side by side (no torch peer: time)
step bench-fp32 24 "$PY" benchmarks/bench_ddtree.py --quick --no-reference --topk both --logits-dtype float32 \
  --json "$OUT_DIR/bench_ddtree_fp32.json"
step bench-bf16 24 "$PY" benchmarks/bench_ddtree.py --quick --no-reference --topk both --logits-dtype bfloat16 \
  --json "$OUT_DIR/bench_ddtree_bf16.json"

echo
echo "=== build / top-K, µs (TB/s of logits read); targets: build <= 40 at batch 8 / budget 256, <= 25 at batch 1; top-K >= 3 TB/s"
for f in fp32 bf16; do
  grep -E '^ *(chunked|threshold) ' "$OUT_DIR/bench-$f.log" | \
    awk -v d="$f" '{printf "%-5s %-9s budget %4s batch %2s | build %7s | top-K %7s (%s TB/s) | step %7s\n", d, $1, $2, $3, $5, $12, $13, $11}'
done
echo
echo "=== summary (logs in $OUT_DIR, $(($(date +%s) - T0)) s)"
for line in "${SUMMARY[@]}"; do echo "$line"; done
