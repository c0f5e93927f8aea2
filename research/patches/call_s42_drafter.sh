#!/usr/bin/env bash
# The demo drafter's call, prepared in the forty-second session (no device then): where its ~77 µs
# of the decode step go, and drafter-pairs / drafter-table (research/patches/README.md; drafter-both
# is the two together) against main. From the repository root, $OUT set:
#   bash research/patches/call_s42_drafter.sh      (~6-7 minutes on the H200; give the run tool 600 s)
# 1. research/probes/drafter_parts.py on main and the three patches (no flush), and with the L2
#    flush on main and drafter-both (drafter-*.txt; the median lines printed);
# 2. the GPU tests that run the drafter, on drafter-both (tests-drafter-both.log; its last lines);
# 3. step_ab.sh drafter-both (bench_step, batch 8 / budget 16, main and the patch interleaved twice);
# 4. research/probes/step_marks.py --per-launch on main and drafter-both (a mark before every ordinary
#    launch of the step: which of the target forward's 142 µs and the accept's 14 are which kernel's).
set -u
export PYTHONPATH=$PWD
. research/patches/patched_tree.sh
XD=$(python -c 'import xdist' 2>/dev/null && echo '-n 8')  # pytest-xdist: the tests' compiles side by side
for v in drafter-pairs drafter-table drafter-both; do patched_tree $v /tmp/t-$v; done
probe() {  # probe TREE-NAME [--flush]
  local t=$1 fl=${2:-} dd=$PWD; [ $1 != main ] && dd=/tmp/t-$1
  echo "--- drafter_parts $t $fl"
  (cd $dd && PYTHONPATH=$dd timeout 100 python research/probes/drafter_parts.py $fl > $OUT/drafter-$t${fl:+-flush}.txt 2>&1;
   grep -E '^(#|round)' $OUT/drafter-$t${fl:+-flush}.txt)
}
for t in main drafter-pairs drafter-table drafter-both; do probe $t; done
probe main --flush; probe drafter-both --flush
echo "--- the drafter's GPU tests on drafter-both"
(cd /tmp/t-drafter-both && PYTHONPATH=/tmp/t-drafter-both timeout 200 python -m pytest -q -x -m gpu -p no:cacheprovider $XD \
   tests/test_runner_gpu.py tests/test_demo_gpu.py "tests/test_ddtree_gpu.py::test_build_on_the_demo_drafters_rows" \
   > $OUT/tests-drafter-both.log 2>&1; tail -4 $OUT/tests-drafter-both.log)
timeout 240 bash research/patches/step_ab.sh drafter-both --steps 200 --max-new-tokens 128 > $OUT/step-ab.log 2>&1
grep -E "===|DDTree|autoregressive|speed-up|round" $OUT/step-ab.log
for t in main drafter-both; do dd=$PWD; [ $t != main ] && dd=/tmp/t-$t
  echo "--- step_marks --per-launch $t"
  (cd $dd && PYTHONPATH=$dd timeout 90 python research/probes/step_marks.py --per-launch > $OUT/marks-$t.txt 2>&1; cat $OUT/marks-$t.txt | tail -40)
done
# the run tool brings back eight files at most: one archive
(cd $OUT && tar czf drafter-call.tgz --exclude=drafter-call.tgz . && find . -type f ! -name drafter-call.tgz -delete)
