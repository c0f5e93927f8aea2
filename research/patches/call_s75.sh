#!/usr/bin/env bash
# One device call (seventy-fourth session, prepared; ~7-9 minutes on a warm H100 or H200, at most
# ~560 s by its timeouts): `help-rows`, a failed row's first window read by all of its request's
# row CTAs (research/patches/README.md), checked and measured:
#   1. the DDTree GPU and robustness tests on the patch (the fallback test gains four helped rows:
#      a first window that settles the row, one that leaves it short, two that overflow the list,
#      one of them past every slice's stage), $OUT/tests.log;
#   2. compute-sanitizer racecheck and memcheck of the fallback test on the patch (the helpers'
#      shared stage and words, the cross-CTA list), $OUT/racecheck.log, $OUT/memcheck.log;
#   3. its A/B, bf16 then fp32, clustered and random rows (research/patches/ab_next.sh, no tests),
#      $OUT/{bf16,f32}/r.tgz. Land it if both pass, the clustered batch-8 builds gain and the random
#      rows stay within noise (landing: the whole suite forward and reversed).
# From the repository root, $OUT set.
set -u
export OUT="${OUT:?set OUT}" PYTHONUNBUFFERED=1
R=$PWD
. research/patches/patched_tree.sh
patched_tree help-rows /tmp/ab-help-rows
nvidia-smi -L
cd /tmp/ab-help-rows
export PYTHONPATH=/tmp/ab-help-rows
echo "=== tests on help-rows"
timeout 180 python -m pytest -q -m gpu -p no:cacheprovider $(xdist_opt) tests/test_ddtree_gpu.py \
  tests/test_ddtree_robust_gpu.py > $OUT/tests.log 2>&1; tail -n 2 $OUT/tests.log
for tool in racecheck memcheck; do
  echo "=== $tool of the fallback test on help-rows"
  timeout $([ $tool = racecheck ] && echo 100 || echo 80) compute-sanitizer --tool $tool --report-api-errors no python -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_ddtree_gpu.py -k fallback > $OUT/$tool.log 2>&1; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" $OUT/$tool.log | tail -n 3
done
cd "$R"
export PYTHONPATH=$R
for dt in bfloat16 float32; do
  o=$OUT/$([ $dt = bfloat16 ] && echo bf16 || echo f32); mkdir -p $o
  echo "=== $dt: help-rows"
  OUT=$o DTYPE=$dt TESTS=0 DRAFTERS="clustered random" STAMP_DRAFTERS="clustered" STAMP_REPEAT=1 \
    timeout 95 bash research/patches/ab_next.sh help-rows 2>&1 | grep -E "^===|^---|build|^loaded|failed"
done
