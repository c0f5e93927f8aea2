#!/usr/bin/env bash
# The sixty-second session's first call: select-cold.patch (research/patches/README.md) against main,
# from the repository root, $OUT set, .kcache carried (~5-6 minutes on a warm H100): ab_next.sh's
# threshold A/B (fp32, three drafters, interleaved twice; stamps of batch 1 and 8; the DDTree GPU
# tests on the patched tree), the bf16 A/B (two drafters), the chunked top-K's build side by side
# (the patch must not move it: its chunked variant is main's code), then compute-sanitizer
# (racecheck, synccheck, memcheck) of the ddtree tests on the patched tree.
set -u
export OUT="${OUT:?set OUT}" PYTHONUNBUFFERED=1
PYTHONPATH=$PWD python tools/kernel_cache.py import .kcache 2>&1 | tail -n 1
echo "== fp32 A/B, stamps, DDTree GPU tests"
OUT=$OUT TESTS=1 STAMP_REPEAT=2 timeout 300 bash research/patches/ab_next.sh select-cold 2>&1 \
  | grep -E 'main vs|build  |^(counted|loaded|selected|sorted|build merge|build sorted|build nodes|searched|nodes|rows ranked) |passed|failed'
mv $OUT/r.tgz $OUT/r-fp32.tgz 2>/dev/null
echo "== bf16 A/B"
OUT=$OUT TESTS=0 DTYPE=bfloat16 DRAFTERS="random peaked" STAMP_REPEAT=1 timeout 150 bash research/patches/ab_next.sh select-cold 2>&1 \
  | grep -E 'main vs|build  '
mv $OUT/r.tgz $OUT/r-bf16.tgz 2>/dev/null
echo "== chunked top-K's build, main and select-cold interleaved twice (tree, budget, batch, build µs)"
for i in 1 2; do for t in main select-cold; do
  d=$PWD; [ $t != main ] && d=/tmp/ab-$t
  (cd $d && PYTHONPATH=$d timeout 60 python benchmarks/bench_ddtree.py --quick --no-reference --topk chunked \
     --drafter random 2>&1 | grep -E '^ *chunked' | awk -v t=$t '{print t, $2, $3, $5}')
done; done
echo "== compute-sanitizer on the patched tree: racecheck, synccheck and memcheck of the ddtree group"
(cd /tmp/ab-select-cold && PYTHONPATH=/tmp/ab-select-cold timeout 300 bash tools/sanitize.sh -j 3 -t 240 \
   racecheck:ddtree synccheck:ddtree memcheck:ddtree 2>&1 | tail -n 8)
