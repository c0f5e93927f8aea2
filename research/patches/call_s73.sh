#!/usr/bin/env bash
# One device call (seventy-second session, prepared; ~6-8 minutes on an H100): first the GPU check
# of what landed after the seventy-second session's device time (382dbc5's bf16 padding fix and
# 2baaee6's comparison of each refined row's list with the numpy twin's T': the fallback test of
# tests/test_ddtree_gpu.py, fp32 and bf16), then the A/B of the refine_row patches on the rows whose
# threshold fails (bench_ddtree --drafter clustered) beside random rows:
#   bf16: refine-vecs8 and refine-vecs16-sm90 (ab_next.sh, DTYPE=bfloat16), results $OUT/bf16/r.tgz;
#   fp32: refine-vecs16-sm90 (refine-vecs8 leaves fp32 as main), results $OUT/f32/r.tgz.
# The failed row's cost is in each table's clustered rows at 8 / 256 and, directly, in the
# "loaded" stamp of chain-NAME-clustered.txt (the failed row's merge ends there). From the
# repository root, $OUT set.
set -u
export OUT="${OUT:?set OUT}" PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
timeout 240 python -m pytest -q -x -m gpu -p no:cacheprovider tests/test_ddtree_gpu.py -k fallback 2>&1 | tail -n 15
for dt in bfloat16 float32; do
  if [ $dt = bfloat16 ]; then o=$OUT/bf16; names="refine-vecs8 refine-vecs16-sm90"; else o=$OUT/f32; names="refine-vecs16-sm90"; fi
  mkdir -p $o
  echo "=== $dt: $names"
  OUT=$o DTYPE=$dt TESTS=0 DRAFTERS="random clustered" STAMP_DRAFTERS="clustered" STAMP_REPEAT=2 \
    timeout 280 bash research/patches/ab_next.sh $names 2>&1 | grep -E "^===|^---|build|^loaded|^counted|^nodes|failed"
done
