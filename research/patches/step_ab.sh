#!/usr/bin/env bash
# The decode-step bench (benchmarks/bench_step.py) on main and on one prepared patch, interleaved
# twice, in one device call, from the repository root:
#   OUT=... bash research/patches/step_ab.sh NAME [bench_step options]
# Copies the tracked tree into /tmp/step-NAME, applies NAME.patch (`patch -p1`), and prints each
# run's graph GPU µs and tokens/s lines; the JSON of each run lands in $OUT/step-{main,NAME}-{1,2}.json.
# ~35 s per run on the H200 with the defaults (pass e.g. --steps 200 --max-new-tokens 128 for less).
# Then research/probes/step_sync.py on each tree, alone and --with-ar (~10 s each; below).
set -u
R=$PWD; O=${OUT:?set OUT}; v=${1:?patch name}; shift
T=/tmp/step-$v
. $R/research/patches/patched_tree.sh
patched_tree $v $T
for i in 1 2; do for t in main $v; do
  dd=$R; [ $t != main ] && dd=$T
  echo "=== $t run $i"
  (cd $dd && PYTHONPATH=$dd timeout 120 python benchmarks/bench_step.py "$@" --json $O/step-$t-$i.json 2>&1 \
     | grep -E '^\| (DDTree|autoregressive) |^speed-up') || echo "bench_step $t $i failed"
done; done
# The same step replayed outside bench_step (research/probes/step_sync.py), alone and after an
# AutoregressiveRunner's allocations and graph: the thirty-ninth session found the step's time moves
# by ~6 µs with what else the process holds, so a variant's gain that shows in one state only is
# that state's, not the variant's. (No bench_step options pass through but --batch and --budget.)
sync_args=()
while [ $# -gt 0 ]; do case $1 in --batch|--budget) sync_args+=("$1" "$2"); shift 2;; *) shift;; esac; done
for t in main $v; do for ar in "" --with-ar; do
  dd=$R; [ $t != main ] && dd=$T
  echo "=== $t step_sync $ar"
  (cd $dd && PYTHONPATH=$dd timeout 90 python research/probes/step_sync.py --rounds 1 "${sync_args[@]}" $ar 2>&1 \
     | grep -E '^round') || echo "step_sync $t $ar failed"
done; done
