#!/usr/bin/env bash
# One device call for a prepared kernel patch: `bash research/patches/call_patch.sh NAME` with $OUT
# set, from the repository root (~4 minutes on a warm H100 or H200, at most ~560 s by its
# timeouts). NAME.patch (research/patches/README.md) is checked and measured:
#   1. the DDTree GPU and robustness tests on the patch, $OUT/tests.log;
#   2. compute-sanitizer racecheck and memcheck of the threshold fallback test on the patch (the
#      test of the rows whose sampled threshold fails), $OUT/racecheck.log, $OUT/memcheck.log;
#   3. its A/B against main, bf16 then fp32, clustered and random rows (research/patches/ab_next.sh,
#      no tests), $OUT/{bf16,f32}/r.tgz.
# Land a patch only if both pass and its A/B gains (landing: the whole suite forward and reversed).
# SKIP_SANITIZERS=1 leaves out step 2 (~180 s less, for a call short of device time).
# Written for `help-late` (seventy-fifth session); the seventy-fourth's call_s75.sh (in the history
# at 1eb4d3e) was this script with the name written in.
set -u
NAME="${1:?usage: call_patch.sh NAME (research/patches/NAME.patch)}"
export OUT="${OUT:?set OUT}" PYTHONUNBUFFERED=1
R=$PWD
. research/patches/patched_tree.sh
patched_tree $NAME /tmp/ab-$NAME
nvidia-smi -L
cd /tmp/ab-$NAME
export PYTHONPATH=/tmp/ab-$NAME
echo "=== tests on $NAME"
timeout 180 python -m pytest -q -m gpu -p no:cacheprovider $(xdist_opt) tests/test_ddtree_gpu.py \
  tests/test_ddtree_robust_gpu.py > $OUT/tests.log 2>&1; tail -n 2 $OUT/tests.log
for tool in $([ "${SKIP_SANITIZERS:-0}" = 1 ] || echo racecheck memcheck); do
  echo "=== $tool of the fallback test on $NAME"
  timeout $([ $tool = racecheck ] && echo 100 || echo 80) compute-sanitizer --tool $tool --report-api-errors no python -m pytest -q -m gpu -p no:cacheprovider \
    tests/test_ddtree_gpu.py -k fallback > $OUT/$tool.log 2>&1; grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed|failed" $OUT/$tool.log | tail -n 3
done
cd "$R"
export PYTHONPATH=$R
for dt in bfloat16 float32; do
  o=$OUT/$([ $dt = bfloat16 ] && echo bf16 || echo f32); mkdir -p $o
  echo "=== $dt: $NAME"
  OUT=$o DTYPE=$dt TESTS=0 DRAFTERS="clustered random" STAMP_DRAFTERS="clustered" STAMP_REPEAT=1 \
    timeout 95 bash research/patches/ab_next.sh $NAME 2>&1 | grep -E "^===|^---|build|^loaded|failed"
done
