#!/usr/bin/env bash
# The forty-fourth session's second device call, from the repository root, $OUT set (~6 minutes):
# 1. ab_next.sh on sort-idle-barriers and sort-cta-barriers (the row merge's sort: the warps that do
#    not sort pass the same barriers, among themselves / every warp on barrier 1), random and peaked;
# 2. racecheck on each variant (the ddtree group, and the build test at K = 40, 64, 100, 481);
# 3. bench_attention --quick --tile both (the verify side by side; its 2026-11-30 baseline mended).
# Runs at 466697e: the two patches were removed when sort-idle-barriers landed (84bca62).
set -u
export PYTHONPATH=$PWD
DRAFTERS="random peaked" TESTS=0 STAMP_REPEAT=2 timeout 300 bash research/patches/ab_next.sh sort-idle-barriers sort-cta-barriers \
  > $OUT/ab.log 2>&1
grep -E "===|build |^(selected|sorted|last) " $OUT/ab.log
T=tests/test_ddtree_gpu.py::test_build_matches_reference
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -n 1)
for t in main sort-idle-barriers sort-cta-barriers; do dd=$PWD; [ $t != main ] && dd=/tmp/ab-$t
  echo "--- racecheck, $t"
  (cd $dd && PYTHONPATH=$dd OUT=$OUT/san-$t bash tools/sanitize.sh --timeout 120 racecheck:ddtree 2>&1 | tail -n 1)
  for id in float32-3001-3-40-2-False-threshold float32-20000-6-64-5-True-threshold bfloat16-8000-5-100-3-True-threshold \
            float32-5000-4-481-2-False-threshold; do
    (cd $dd && PYTHONPATH=$dd timeout 100 $SAN --tool racecheck --print-limit 4 python -m pytest -q -p no:cacheprovider \
      "$T[$id]" > $OUT/rc-$t-$id.log 2>&1; printf '  %-40s %s | %s\n' $id "$(grep -h 'RACECHECK SUMMARY' $OUT/rc-$t-$id.log | tail -n 1)" "$(tail -n 1 $OUT/rc-$t-$id.log)") &
  done; wait
done
tar czf $OUT/san.tgz -C $OUT $(cd $OUT && ls -d san-* rc-*) && (cd $OUT && rm -rf san-* rc-*)
t0=$(date +%s)
timeout 200 python benchmarks/bench_attention.py --quick --tile both --json $OUT/bench_attention.json > $OUT/bench_attention.txt 2>&1
echo "bench_attention rc=$? $(( $(date +%s) - t0 )) s"; grep -v Warning $OUT/bench_attention.txt | grep -v "plan = " | tail -n 40
