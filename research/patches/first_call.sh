#!/usr/bin/env bash
# The twenty-sixth session's first device call (research/patches/README.md), from the repository root:
#   OUT=... bash research/patches/first_call.sh
# 1. every prepared patch against main (ab_next.sh, TESTS=0: the whole suite runs later on what lands);
# 2. the stamped build with and without the SMs' instruction caches evicted (is the row merge's
#    cold-L2 cost at batch 1 its code, and does batch 8 pay it too?);
# 3. bench_ddtree on main with --evict-code beside the plain read flush (what a decode step may see).
# Results: $OUT/r.tgz (ab_next.sh) and $OUT/e.tgz (2 and 3). ~7 minutes on the H200.
set -u
R=$PWD; O=${OUT:?set OUT}; mkdir -p $O/e
# the kernel patches (runner-got.patch is a Python mend: nothing to measure)
KP=$(cd research/patches && ls *.patch | sed 's/\.patch$//' | grep -v '^runner-got$')
TESTS=0 DRAFTERS="random peaked" bash research/patches/ab_next.sh $KP  # (jittered: within 600 s only for fewer patches)
for ev in "" "--evict-code"; do
  t=$([ -n "$ev" ] && echo evict || echo plain)
  PYTHONPATH=$R timeout 90 python tools/ddtree_stamps.py --batch 1 8 --budget 256 --drafter random --chain \
    --flush read $ev > $O/e/chain-$t.txt 2>&1 || echo "stamps $t failed"
  echo "--- stamps, $t (batch 1 then 8)"
  grep -E '^(merge|loaded|selected|lse|lsedone|sorted|build merge|build sorted|build nodes) ' $O/e/chain-$t.txt
done
B="--quick --no-reference --topk threshold --flush read"
for i in 1 2; do for d in random peaked; do for ev in "" "--evict-code"; do
  t=$([ -n "$ev" ] && echo evict || echo plain)
  PYTHONPATH=$R timeout 60 python benchmarks/bench_ddtree.py $B --drafter $d $ev --json $O/e/$t-$d-$i.json \
    > $O/e/$t-$d-$i.log 2>&1 || echo "bench $t $d $i failed"
done; done; done
for d in random peaked; do
  echo "=== main, $d: read flush (A) against read flush + code eviction (B)"
  python tools/bench_ddtree_ab.py $O/e/plain-$d-1.json $O/e/plain-$d-2.json --vs $O/e/evict-$d-1.json \
    $O/e/evict-$d-2.json 2>&1 | grep -E 'build|topk'
done
tar -C $O -czf $O/e.tgz e && rm -rf $O/e
