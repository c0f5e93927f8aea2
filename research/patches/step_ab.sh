#!/usr/bin/env bash
# The decode-step bench (benchmarks/bench_step.py) on main and on one prepared patch, interleaved
# twice, in one device call, from the repository root:
#   OUT=... bash research/patches/step_ab.sh NAME [bench_step options]
# Copies the tracked tree into /tmp/step-NAME, applies NAME.patch (`patch -p1`), and prints each
# run's graph GPU µs and tokens/s lines; the JSON of each run lands in $OUT/step-{main,NAME}-{1,2}.json.
# ~35 s per run on the H200 with the defaults (pass e.g. --steps 200 --max-new-tokens 128 for less).
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
