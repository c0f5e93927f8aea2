#!/usr/bin/env bash
# One device call for the prepared patches (research/patches/README.md), from the repository root:
#   bash research/patches/ab_next.sh            (needs $OUT, as the device tool sets it)
# Builds one tree per variant in /tmp by copying the tracked tree and applying the patches with
# `patch -p1` (no .git needed), runs bench_ddtree on main and every variant, interleaved, twice
# per drafter, prints each variant's A/B against main (tools/bench_ddtree_ab.py), takes the
# stamps of a warm depth on main and on all five patches, runs the DDTree GPU tests on all five,
# and leaves everything in $OUT/r.tgz (one file: the device tool returns at most eight).
# ~6 minutes on the H200.
set -u
R=$PWD; O=${OUT:?set OUT}; mkdir -p $O/r
P=$R/research/patches
apply() { if command -v patch > /dev/null; then patch -s -p1 < "$1"; else git apply "$1"; fi; }
declare -A V=( [cp]="count-probes" [cc]="count-checks" [rw]="root-warp0" [nr]="nodes-rolled" [mr]="merge-rowtot"
               [all]="count-probes count-checks root-warp0 nodes-rolled merge-rowtot" )
for v in "${!V[@]}"; do
  T=/tmp/ab-$v; rm -rf $T; mkdir -p $T
  (cd $R && tar --exclude=./.wt --exclude=./.git -cf - .) | (cd $T && tar -xf -)
  for p in ${V[$v]}; do (cd $T && apply $P/$p.patch) || { echo "variant $v: $p.patch does not apply"; exit 1; }; done
done
nvidia-smi -L
B="--quick --no-reference --topk threshold"
t0=$(date +%s)
for i in 1 2; do for d in random peaked jittered; do for t in main cp cc rw nr mr all; do
  dd=$R; [ $t != main ] && dd=/tmp/ab-$t
  (cd $dd && PYTHONPATH=$dd timeout 45 python benchmarks/bench_ddtree.py $B --drafter $d --json $O/r/$t-$d-$i.json > $O/r/$t-$d-$i.log 2>&1) || echo "bench $t $d $i failed"
done; done; done
echo "A/B: $(( $(date +%s) - t0 )) s"
for t in cp cc rw nr mr all; do for d in random peaked jittered; do
  echo "=== main vs $t (${V[$t]}), $d"
  python $R/tools/bench_ddtree_ab.py $O/r/main-$d-1.json $O/r/main-$d-2.json --vs $O/r/$t-$d-1.json $O/r/$t-$d-2.json 2>&1 | grep build
done; done
for t in main all; do
  dd=$R; [ $t != main ] && dd=/tmp/ab-$t
  for dn in jittered:5 random:2; do d=${dn%:*}; n=${dn#*:}
    (cd $dd && PYTHONPATH=$dd timeout 40 python tools/ddtree_stamps.py --batch 1 --budget 256 --drafter $d --detail-depth $n > $O/r/stamps-$t-$d-d$n.txt 2>&1)
    echo "--- stamps $t $d"; grep -E '^(selected|d1count|count|scan|offs|gen |bstar|depth  6|searched|nodes) ' $O/r/stamps-$t-$d-d$n.txt
  done
done
(cd /tmp/ab-all && PYTHONPATH=/tmp/ab-all timeout 200 python -m pytest -q -m gpu -p no:cacheprovider tests/test_ddtree_gpu.py 2>&1 | tail -3) | tee $O/r/all-ddtree-tests.log
echo "total: $(( $(date +%s) - t0 )) s"
tar -C $O -czf $O/r.tgz r && rm -rf $O/r
