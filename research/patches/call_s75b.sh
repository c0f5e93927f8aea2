#!/usr/bin/env bash
# One device call (seventy-fifth session; ~4 minutes on a warm H100 or H200, at most ~560 s by its
# timeouts): `help-late` (research/patches/README.md), a failed row's first append window read in
# slices that its own CTA claims from the start and the request's other CTAs once their own rows
# are merged and counted (the row's CTA waits for the slices, then merges as main does), checked
# and measured:
#   1. the DDTree GPU and robustness tests on the patch (the fallback test's request 1 has seven
#      rows that share their first window: one it settles, one it leaves short, two it overflows,
#      one of them past every CTA's stage), $OUT/tests.log;
#   2. compute-sanitizer racecheck and memcheck of the fallback test on the patch (the stage, the
#      claims, the cross-CTA list), $OUT/racecheck.log, $OUT/memcheck.log;
#   3. its A/B, bf16 then fp32, clustered and random rows (research/patches/ab_next.sh, no tests),
#      $OUT/{bf16,f32}/r.tgz. Land it if both pass, the clustered batch-8 builds gain and the random
#      rows stay within noise (landing: the whole suite forward and reversed).
# From the repository root, $OUT set.
set -u
export OUT="${OUT:?set OUT}" PYTHONUNBUFFERED=1
R=$PWD
. research/patches/patched_tree.sh
patched_tree help-late /tmp/ab-help-late
nvidia-smi -L
cd /tmp/ab-help-late
export PYTHONPATH=/tmp/ab-help-late
echo "=== tests on help-late"
timeout 180 python -m pytest -q -m gpu -p no:cacheprovider $(xdist_opt) tests/test_ddtree_gpu.py \
  tests/test_ddtree_robust_gpu.py > $OUT/tests.log 2>&1; tail -n 2 $OUT/tests.log
for tool in racecheck memcheck; do
  echo "=== $tool of the fallback test on help-late"
  timeout $([ $tool = racecheck ] && echo 100 || echo 80) compute-sanitizer --tool $tool --report-api-errors no python -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_ddtree_gpu.py -k fallback > $OUT/$tool.log 2>&1; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" $OUT/$tool.log | tail -n 3
done
cd "$R"
export PYTHONPATH=$R
for dt in bfloat16 float32; do
  o=$OUT/$([ $dt = bfloat16 ] && echo bf16 || echo f32); mkdir -p $o
  echo "=== $dt: help-late"
  OUT=$o DTYPE=$dt TESTS=0 DRAFTERS="clustered random" STAMP_DRAFTERS="clustered" STAMP_REPEAT=1 \
    timeout 95 bash research/patches/ab_next.sh help-late 2>&1 | grep -E "^===|^---|build|^loaded|failed"
done
