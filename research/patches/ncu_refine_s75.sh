#!/usr/bin/env bash
# Where ddtree_build's warps stall while a failed threshold row is refined (seventy-fourth session,
# prepared; ~2-3 minutes): from the repository root, $OUT set:
#   bash research/patches/ncu_refine_s75.sh
# The clustered drafter's batch-8 build (budget 256, bf16 and fp32 logits) has rows the threshold
# fails; ddtree_build reads each such row again in refine_row (~19-22 µs a read, research/
# ddtree_build.md, seventy-third session). Two readings: cold instruction fetch (samples at
# "no_instructions" / "branch_resolving" in refine_each's loop) or the loads (long_scoreboard).
# ncu flushes the caches before the profiled launch (--cache-control all, its default), as the
# benchmark's L2 flush does. Output: tools/ncu_stalls.py's tables per dtype, $OUT/ncu-refine.tgz.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=/tmp/ncu-refine; rm -rf $D; mkdir -p $D
for dt in bfloat16 float32; do
  # the second build's ddtree_build launch (-s 1 -c 1 of regex:ddtree_build)
  timeout 200 ncu --clock-control none -k regex:ddtree_build -s 1 -c 1 \
    --section SourceCounters --section WarpStateStats --warp-sampling-interval 0 -o $D/$dt \
    python benchmarks/profile_topk.py --batch 8 --budget 256 --drafter clustered --logits-dtype $dt \
    > $D/ncu-$dt.log 2>&1
  echo "== $dt"; tail -n 3 $D/ncu-$dt.log
  ncu -i $D/$dt.ncu-rep --page source --print-source sass --csv > $D/$dt-sass.csv 2> $D/csv-$dt.err
  python tools/ncu_stalls.py $D/$dt-sass.csv --block 250 --top 25 | tee $D/stalls-$dt.txt | head -60
  ncu -i $D/$dt.ncu-rep --section WarpStateStats --page details 2>/dev/null | grep -iE 'stall|cycles per' | head -20
done
tar czf $OUT/ncu-refine.tgz -C /tmp ncu-refine
