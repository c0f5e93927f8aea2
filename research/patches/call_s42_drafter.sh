#!/usr/bin/env bash
# The demo drafter's call, prepared in the forty-second session (no device then): where its ~77 µs
# of the decode step go, and drafter-both (drafter-pairs + drafter-table, research/patches/README.md)
# against main. From the repository root, $OUT set:
#   bash research/patches/call_s42_drafter.sh      (~7-8 minutes on the H200; give the run tool 600 s)
# In order of importance (what a cut call leaves is archived after every step, in
# $OUT/drafter-call.tgz: the run tool brings back eight files at most):
# 1. research/probes/drafter_parts.py on main and drafter-both (draft_chain and the GEMM timed apart,
#    with and without noise: drafter-pairs shows in the GEMM rows, drafter-table in the chain row);
# 2. the GPU tests that run the drafter, on drafter-both (tests-drafter-both.log; its last lines);
# 3. step_ab.sh drafter-both (bench_step, batch 8 / budget 16, main and the patch interleaved twice);
# 4. research/probes/step_marks.py --per-launch on main and drafter-both (a mark before every ordinary
#    launch of the step: which of the target forward's 142 µs and the accept's 14 are which kernel's);
# 5. the probe with the L2 flush on main and drafter-both.
set -u
export PYTHONPATH=$PWD
. research/patches/patched_tree.sh
D=/tmp/drafter-call; rm -rf $D; mkdir -p $D  # outside $OUT: only the archive comes back
pack() { tar czf $OUT/drafter-call.tgz -C /tmp drafter-call; }
patched_tree drafter-both /tmp/t-drafter-both
tree() { [ $1 = main ] && echo $PWD || echo /tmp/t-$1; }
probe() {  # probe TREE-NAME [--flush]
  local t=$1 fl=${2:-} dd; dd=$(tree $1)
  echo "--- drafter_parts $t $fl"
  (cd $dd && PYTHONPATH=$dd timeout 100 python research/probes/drafter_parts.py $fl > $D/drafter-$t${fl:+-flush}.txt 2>&1;
   grep -E '^(#|round)' $D/drafter-$t${fl:+-flush}.txt)
  pack
}
probe main; probe drafter-both
echo "--- the drafter's GPU tests on drafter-both"
(cd /tmp/t-drafter-both && PYTHONPATH=/tmp/t-drafter-both timeout 200 python -m pytest -q -x -m gpu -p no:cacheprovider $(xdist_opt) \
   tests/test_runner_gpu.py tests/test_demo_gpu.py "tests/test_ddtree_gpu.py::test_build_on_the_demo_drafters_rows" \
   > $D/tests-drafter-both.log 2>&1; tail -4 $D/tests-drafter-both.log)
pack
timeout 200 bash research/patches/step_ab.sh drafter-both --steps 200 --max-new-tokens 128 > $D/step-ab.log 2>&1
mv $OUT/step-*.json $D/ 2>/dev/null
grep -E "===|DDTree|autoregressive|speed-up|round" $D/step-ab.log
pack
for t in main drafter-both; do dd=$(tree $t)
  echo "--- step_marks --per-launch $t"
  (cd $dd && PYTHONPATH=$dd timeout 80 python research/probes/step_marks.py --per-launch > $D/marks-$t.txt 2>&1; tail -40 $D/marks-$t.txt)
  pack
done
probe main --flush; probe drafter-both --flush
