#!/usr/bin/env bash
# One device call for the prepared patches (research/patches/README.md), from the repository root:
#   bash research/patches/ab_next.sh            (needs $OUT, as the device tool sets it)
# Builds one tree per variant in /tmp by copying the tracked tree and applying the patches with
# `patch -p1` (no .git needed), runs bench_ddtree on every variant, interleaved, twice per drafter,
# prints the A/B of each variant against main (tools/bench_ddtree_ab.py), runs main's GPU tests that
# no device has run yet, and leaves everything in $OUT/r.tgz (one file: the device tool returns at
# most eight). ~4-5 minutes on the H200.
set -u
R=$PWD; O=${OUT:?set OUT}; mkdir -p $O/r
P=$R/research/patches
apply() { if command -v patch > /dev/null; then patch -s -p1 < "$1"; else git apply "$1"; fi; }
declare -A V=( [hc]="heap-code" [hcr]="heap-code rank-ties" [hcb]="heap-code bins-flat" [hcw]="heap-code heap-warmer"
               [all]="heap-code rank-ties bins-flat heap-warmer" [sk]="count-small-kb" )
for v in "${!V[@]}"; do
  T=/tmp/ab-$v; rm -rf $T; mkdir -p $T
  (cd $R && tar --exclude=./.wt --exclude=./.git -cf - .) | (cd $T && tar -xf -)
  for p in ${V[$v]}; do (cd $T && apply $P/$p.patch) || { echo "variant $v: $p.patch does not apply"; exit 1; }; done
done
nvidia-smi -L
B="--quick --no-reference --topk threshold"
t0=$(date +%s)
for i in 1 2; do for d in random peaked jittered; do for t in main hc hcr hcb hcw all sk; do
  dd=$R; [ $t != main ] && dd=/tmp/ab-$t
  (cd $dd && PYTHONPATH=$dd timeout 45 python benchmarks/bench_ddtree.py $B --drafter $d --json $O/r/$t-$d-$i.json > $O/r/$t-$d-$i.log 2>&1) || echo "bench $t $d $i failed"
done; done; done
echo "A/B: $(( $(date +%s) - t0 )) s"
for t in hc hcr hcb hcw all sk; do for d in random peaked jittered; do
  echo "=== main vs $t (${V[$t]}), $d"
  python $R/tools/bench_ddtree_ab.py $O/r/main-$d-1.json $O/r/main-$d-2.json --vs $O/r/$t-$d-1.json $O/r/$t-$d-2.json 2>&1 | grep build
done; done
(cd $R && PYTHONPATH=$R timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_ddtree_gpu.py \
  -k "guess_off or search_switch_routes" 2>&1 | tail -3) | tee $O/r/unrun-tests.log
(cd $R && PYTHONPATH=$R timeout 60 python tools/cluster_probe.py 2>&1) | tee $O/r/cluster-probe.txt
echo "total: $(( $(date +%s) - t0 )) s"
tar -C $O -czf $O/r.tgz r && rm -rf $O/r
