#!/usr/bin/env bash
# One device call (seventy-first session, prepared; ~3-4 minutes): what a fallback row costs the
# threshold build, and `sample-g8-bf16`'s A/B. From the repository root, $OUT set:
#   1. bench_ddtree --quick --topk threshold with --drafter random and --drafter clustered (512 large
#      logits per row in runs of 16 ids), fp32 and bf16, interleaved twice: each threshold row says
#      how many of the build's rows fall back (the numpy twin; at 8 / 256: fp32 1, bf16 3 on the
#      clustered rows, 0 on the random ones), so clustered against random at equal batch and budget
#      is the cost of those rows (plus the clustered rows' other candidates);
#   2. research/patches/ab_next.sh sample-g8-bf16 with DTYPE=bfloat16 DRAFTERS="random clustered"
#      STAMP_DRAFTERS="random clustered" TESTS=0 (its fp32 SASS is main's: bf16 only).
# Results: $OUT/fallback.tgz (the bench logs and JSON) and ab_next.sh's $OUT/r.tgz.
set -u
export OUT="${OUT:?set OUT}" PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
mkdir -p $OUT/fallback
for i in 1 2; do for dt in float32 bfloat16; do for d in random clustered; do
  timeout 60 python benchmarks/bench_ddtree.py --quick --no-reference --topk threshold --logits-dtype $dt \
    --drafter $d --json $OUT/fallback/$dt-$d-$i.json > $OUT/fallback/$dt-$d-$i.log 2>&1 || echo "bench $dt $d $i failed"
done; done; done
tar czf $OUT/fallback.tgz -C $OUT fallback
for dt in float32 bfloat16; do
  echo "=== $dt: clustered (B) against random (A): the fallback rows' cost"
  python tools/bench_ddtree_ab.py $OUT/fallback/$dt-random-1.json $OUT/fallback/$dt-random-2.json \
    --vs $OUT/fallback/$dt-clustered-1.json $OUT/fallback/$dt-clustered-2.json 2>&1 | grep build
  grep -h "falling back" $OUT/fallback/$dt-clustered-1.log | sed 's/.*cumulative/cumulative/'
done
rm -rf $OUT/fallback
DTYPE=bfloat16 DRAFTERS="random clustered" STAMP_DRAFTERS="random clustered" TESTS=0 \
  timeout 400 bash research/patches/ab_next.sh sample-g8-bf16 2>&1 | tail -n 80
