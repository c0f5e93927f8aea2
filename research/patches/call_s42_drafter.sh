#!/usr/bin/env bash
# The demo drafter's call, prepared in the forty-second session (no device then): where its ~77 µs
# of the decode step go, and drafter-pairs.patch (research/patches/README.md) against main.
# From the repository root, $OUT set:
#   bash research/patches/call_s42_drafter.sh      (~4-5 minutes on the H200; give the run tool 600 s)
# 1. research/probes/drafter_parts.py on main and on drafter-pairs, without and with the L2 flush
#    (drafter-*.txt; the median lines printed);
# 2. the GPU tests that run the drafter's GEMM, on drafter-pairs (tests-drafter-pairs.log; its last lines);
# 3. step_ab.sh drafter-pairs (bench_step, batch 8 / budget 16, main and the patch interleaved twice).
set -u
export PYTHONPATH=$PWD
. research/patches/patched_tree.sh
T=/tmp/t-drafter-pairs
patched_tree drafter-pairs $T
for t in main drafter-pairs; do dd=$PWD; [ $t != main ] && dd=$T
  for fl in "" --flush; do
    echo "--- drafter_parts $t $fl"
    (cd $dd && PYTHONPATH=$dd timeout 120 python research/probes/drafter_parts.py $fl > $OUT/drafter-$t${fl:+-flush}.txt 2>&1;
     grep -E '^(#|round)' $OUT/drafter-$t${fl:+-flush}.txt)
  done
done
echo "--- the drafter's GPU tests on drafter-pairs"
(cd $T && PYTHONPATH=$T timeout 200 python -m pytest -q -x -m gpu -p no:cacheprovider tests/test_runner_gpu.py \
   tests/test_demo_gpu.py "tests/test_ddtree_gpu.py::test_build_on_the_demo_drafters_rows" \
   > $OUT/tests-drafter-pairs.log 2>&1; tail -4 $OUT/tests-drafter-pairs.log)
timeout 240 bash research/patches/step_ab.sh drafter-pairs --steps 200 --max-new-tokens 128 > $OUT/step-ab.log 2>&1
grep -E "===|DDTree|autoregressive|speed-up|round" $OUT/step-ab.log
