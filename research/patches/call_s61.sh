#!/usr/bin/env bash
# The sixtieth session's prepared build patch, measured in one device call from the repository root,
# $OUT set, .kcache carried (~6-8 minutes on a warm H100 with the sanitizer runs): merge-hist.patch
# (research/patches/README.md)
# against main with ab_next.sh (bench_ddtree's threshold build, fp32, three drafters, interleaved
# twice; the stamps and chain of batch 1 and 8; the DDTree GPU tests on the patched tree), the bf16
# A/B (two drafters, no tests), then the chunked top-K's build on both trees side by side (the
# measured first form of the patch cost it +4.3 to +6.0 µs; the prepared form is meant not to).
# Then compute-sanitizer (racecheck, synccheck, memcheck) of the ddtree tests on the patched tree: the
# patch adds named barriers that a warp-role imbalance would make racecheck report.
# No whole-suite run: that comes next, with the patch applied to the working tree
# (tools/gpu_check.sh, forward and reversed), before it lands.
set -u
export OUT="${OUT:?set OUT}" PYTHONUNBUFFERED=1
python tools/kernel_cache.py import .kcache 2>&1 | tail -n 1
echo "== fp32 A/B, stamps, DDTree GPU tests"
OUT=$OUT TESTS=1 STAMP_REPEAT=2 timeout 300 bash research/patches/ab_next.sh merge-hist 2>&1 \
  | grep -E 'main vs|build  |^(counted|loaded|selected|sorted|build merge|build sorted|build nodes|rows ranked) |passed|failed'
mv $OUT/r.tgz $OUT/r-fp32.tgz 2>/dev/null
echo "== bf16 A/B"
OUT=$OUT TESTS=0 DTYPE=bfloat16 DRAFTERS="random peaked" STAMP_REPEAT=1 timeout 150 bash research/patches/ab_next.sh merge-hist 2>&1 \
  | grep -E 'main vs|build  '
mv $OUT/r.tgz $OUT/r-bf16.tgz 2>/dev/null
echo "== chunked top-K's build, main and merge-hist interleaved twice (tree, budget, batch, build µs)"
for i in 1 2; do for t in main merge-hist; do
  d=$PWD; [ $t != main ] && d=/tmp/ab-$t
  (cd $d && PYTHONPATH=$d timeout 60 python benchmarks/bench_ddtree.py --quick --no-reference --topk chunked \
     --drafter random 2>&1 | grep -E '^ *chunked' | awk -v t=$t '{print t, $2, $3, $5}')
done; done | tee $OUT/chunked-ab.txt
echo "== compute-sanitizer on the patched tree: racecheck, synccheck and memcheck of the ddtree group"
(cd /tmp/ab-merge-hist && PYTHONPATH=/tmp/ab-merge-hist timeout 400 bash tools/sanitize.sh -j 3 -t 300 \
   racecheck:ddtree synccheck:ddtree memcheck:ddtree 2>&1 | tail -n 12)
