#!/usr/bin/env bash
# The forty-second session's first device call, prepared in the forty-first (research/patches/
# README.md: dev-noinline, no-heap-warmer, dev-rounds, dev-off), from the repository root, $OUT set:
#   bash research/patches/call_s42.sh        (~7-8 minutes on the H200: the tests ~3, the A/B ~4; give the run tool 600 s)
# 1. the DDTree GPU tests on dev-rounds (tests-dev-rounds.log, its last lines printed);
# 2. ab_next.sh on the four patches (bench_ddtree, three drafters, two runs each; the stamps of
#    peaked and jittered rows at budget 256), its A/B lines printed; results in $OUT/r.tgz;
# 3. the budget-16 stamps of peaked rows on main and dev-noinline (s16-*.txt).
set -u
export PYTHONPATH=$PWD
. research/patches/patched_tree.sh
patched_tree dev-rounds /tmp/t-dev-rounds
echo "--- DDTree GPU tests on dev-rounds"
(cd /tmp/t-dev-rounds && PYTHONPATH=/tmp/t-dev-rounds timeout 230 python -m pytest -q -x -m gpu -p no:cacheprovider $(xdist_opt) \
   tests/test_ddtree_gpu.py > $OUT/tests-dev-rounds.log 2>&1; tail -4 $OUT/tests-dev-rounds.log)
DRAFTERS="peaked jittered random" TESTS=0 STAMP_REPEAT=1 STAMP_DRAFTERS="peaked jittered" \
  timeout 360 bash research/patches/ab_next.sh dev-noinline no-heap-warmer dev-rounds dev-off > $OUT/ab.log 2>&1
grep -E "===|build |^--- stamps|^(lp|rdb1|rdround [0-9]|generate|searched|nodes) " $OUT/ab.log
# 3. the budget-16 deep rows' search on main and dev-noinline (a call per deviation search now)
for t in main dev-noinline; do dd=$PWD; [ $t != main ] && dd=/tmp/ab-$t
  [ -d $dd ] || { echo "no $dd"; continue; }
  echo "--- stamps, budget 16, peaked: $t"
  (cd $dd && PYTHONPATH=$dd timeout 60 python tools/ddtree_stamps.py --batch 1 8 --budget 16 --drafter peaked --repeat 2 \
     > $OUT/s16-$t.txt 2>&1; grep -E '^(lp|dv[a-z]+|searched|nodes) ' $OUT/s16-$t.txt)
done
