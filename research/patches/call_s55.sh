#!/usr/bin/env bash
# gemm-m144.patch (fifty-fourth session, CPU only) in one device call from the repository root ($OUT
# set; ~5-7 minutes on an H100 or H200 once warm; give the run tool 600 s):
#   bash research/patches/call_s55.sh
# 1. the patch's GPU tests: test_runner_gpu.py (the GEMM at 136 and 144 rows: the new tile, split-K
#    1 and 3, the noise epilogue; the model, the drafter, both runners) and test_demo_gpu.py;
# 2. research/probes/gemm_noise_probe.py --shapes on main and on the patch (every GEMM of the target's
#    forward at 136, 128 and 8 rows, in graphs): at 136 rows the patch runs one 144-row tile;
# 3. step_ab.sh gemm-m144 (the decode step, main and the patch interleaved twice; ~3 minutes).
# Everything lands in $OUT/s55.tgz (packed after each step, so a cut call returns what was done).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
. research/patches/patched_tree.sh
D=/tmp/s55; rm -rf $D; mkdir -p $D  # outside $OUT: only the archive comes back
pack() { tar czf $OUT/s55.tgz -C /tmp s55; }
[ -f .kcache/kernel-cache.json ] && python tools/kernel_cache.py import .kcache > /dev/null
nvidia-smi -L | tee $D/gpu.txt
T=/tmp/t-gemm-m144
patched_tree gemm-m144 $T
echo "--- 1. gemm-m144's GPU tests"
(cd $T && PYTHONPATH=$T timeout 220 python -m pytest -q -m gpu -p no:cacheprovider $(xdist_opt) \
   tests/test_runner_gpu.py tests/test_demo_gpu.py > $D/tests-m144.log 2>&1; tail -n 3 $D/tests-m144.log)
pack
echo "--- 2. gemm_noise_probe --shapes, main then gemm-m144"
for t in main m144; do
  dd=$PWD; [ $t = m144 ] && dd=$T
  (cd $dd && PYTHONPATH=$dd timeout 70 python research/probes/gemm_noise_probe.py --repeat 50 --shapes \
     > $D/gemm-probe-$t.txt 2>&1; echo "== $t"; grep -E "graph|lm head|^shape" $D/gemm-probe-$t.txt)
done
pack
echo "--- 3. step_ab gemm-m144"
timeout 220 bash research/patches/step_ab.sh gemm-m144 --steps 200 --max-new-tokens 128 > $D/step-ab-m144.log 2>&1
mv $OUT/step-*.json $D/ 2>/dev/null
grep -E "===|DDTree|autoregressive|speed-up|round" $D/step-ab-m144.log
pack
