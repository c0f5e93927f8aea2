#!/usr/bin/env bash
# One device call (seventy-third session, prepared; ~6-8 minutes on a warm H100 or H200): what sets
# the ~19-22 µs a failed threshold row's read costs ddtree_build (research/ddtree_build.md,
# seventy-third session), then the A/B of `refine-compact`, the compact form of that read.
#   1. ddtree_stamps on the clustered rows (bench_ddtree --drafter clustered: a few rows of 120 fail
#      at batch 8, budget 256), bf16, without and with --twice (the second merge, refine_row
#      included, runs from warm instruction caches): the failed row's "loaded" stamp, first / median
#      / last, in $OUT/stamps-{cold,twice}.txt. Cold ~19 µs and warm a few: cold code.
#   2. research/patches/ab_next.sh refine-compact, bf16 with the DDTree GPU tests on the patch
#      (TESTS=1), then fp32 without them; results $OUT/bf16/r.tgz and $OUT/f32/r.tgz. Land it if the
#      clustered rows' batch-8 build gains and the random rows stay within noise (landing: the whole
#      suite forward and reversed, and racecheck of tests/test_ddtree_gpu.py -k fallback).
# From the repository root, $OUT set.
set -u
export OUT="${OUT:?set OUT}" PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
for mode in cold twice; do
  f=$OUT/stamps-$mode.txt
  timeout 100 python tools/ddtree_stamps.py --batch 8 --budget 256 --drafter clustered --logits-dtype bfloat16 \
    --flush read --repeat 2 $([ $mode = twice ] && echo --twice) > "$f" 2>&1 || echo "stamps $mode failed (rc $?)"
  echo "--- stamps ($mode): the merge's phases, first / median / last µs"
  grep -E '^(merge|counted|loaded|selected|sorted|nodes) ' "$f"
done
for dt in bfloat16 float32; do
  if [ $dt = bfloat16 ]; then o=$OUT/bf16; tests=1; else o=$OUT/f32; tests=0; fi
  mkdir -p $o
  echo "=== $dt: refine-compact"
  OUT=$o DTYPE=$dt TESTS=$tests DRAFTERS="random clustered" STAMP_DRAFTERS="clustered" STAMP_REPEAT=1 \
    timeout 190 bash research/patches/ab_next.sh refine-compact 2>&1 | grep -E "^===|^---|build|^loaded|passed|failed"
done
