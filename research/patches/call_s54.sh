#!/usr/bin/env bash
# gemm-bk64.patch (fifty-fourth session, CPU only) in one device call from the repository root ($OUT
# set; ~6-8 minutes on an H100 or H200 once warm; give the run tool 600 s), after call_s53.sh (whose
# last step is the other pipeline variant, gemm-stages):
#   bash research/patches/call_s54.sh
# The steps in order of what they decide (the worst-case timeouts add up past 600 s; a cut call
# loses the last):
# 1. the patch's GPU tests: test_runner_gpu.py (every mla_gemm test: k = 32, 96 and 160 run the
#    zero-filled k % 64 == 32 tail, split-K 1 and 3; the model, the drafter, both runners) and
#    test_demo_gpu.py (the patched copy lives at another path, so its kernels compile afresh);
# 2. research/probes/gemm_noise_probe.py --shapes on main and on the patch (every GEMM of the target's
#    forward at 128 and 8 rows, in graphs; the drafter's GEMM; the LM head);
# 3. tools/ddtree_stamps.py --chain at the demo step's shape (vocab 32768, batch 8, budget 16): the build
#    launch takes ~34 µs of the step (H100 marks), against ~46 at bench_ddtree's vocabulary 163,840;
# 4. step_ab.sh gemm-bk64 (the decode step, main and the patch interleaved twice; ~3 minutes);
# 5. a short Nsight Compute section set on the probe's GEMMs with the patch (call_s53.sh profiles main's
#    with --set full).
# Everything lands in $OUT/s54.tgz (packed after each step, so a cut call returns what was done).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
. research/patches/patched_tree.sh
D=/tmp/s54; rm -rf $D; mkdir -p $D  # outside $OUT: only the archive comes back
pack() { tar czf $OUT/s54.tgz -C /tmp s54; }
[ -f .kcache/kernel-cache.json ] && python tools/kernel_cache.py import .kcache > /dev/null
nvidia-smi -L | tee $D/gpu.txt
T=/tmp/t-gemm-bk64
patched_tree gemm-bk64 $T
echo "--- 1. gemm-bk64's GPU tests"
(cd $T && PYTHONPATH=$T timeout 200 python -m pytest -q -m gpu -p no:cacheprovider $(xdist_opt) \
   tests/test_runner_gpu.py tests/test_demo_gpu.py > $D/tests-bk64.log 2>&1; tail -n 3 $D/tests-bk64.log)
pack
echo "--- 2. gemm_noise_probe --shapes, main then gemm-bk64"
for t in main bk64; do
  dd=$PWD; [ $t = bk64 ] && dd=$T
  (cd $dd && PYTHONPATH=$dd timeout 60 python research/probes/gemm_noise_probe.py --repeat 50 --shapes \
     > $D/gemm-probe-$t.txt 2>&1; echo "== $t"; grep -E "graph|lm head|^shape" $D/gemm-probe-$t.txt)
done
pack
echo "--- 3. the demo step's tree build (vocab 32768, batch 8, budget 16, fp32): where its ~34 µs go"
timeout 90 python tools/ddtree_stamps.py --vocab 32768 --batch 8 --budget 16 --chain --flush read --repeat 3 \
  > $D/stamps-demo-shape.txt 2>&1
grep -E "^# ddtree_build|^sample|^stream waited|^stream looped|^build merge|^build sorted|^build last|^build nodes" \
  $D/stamps-demo-shape.txt
pack
echo "--- 4. step_ab gemm-bk64"
timeout 200 bash research/patches/step_ab.sh gemm-bk64 --steps 200 --max-new-tokens 128 > $D/step-ab-bk64.log 2>&1
mv $OUT/step-*.json $D/ 2>/dev/null
grep -E "===|DDTree|autoregressive|speed-up|round" $D/step-ab-bk64.log
pack
echo "--- 5. Nsight Compute on the probe's GEMMs (the drafter's three, the LM head shape) with gemm-bk64"
(cd $T && PYTHONPATH=$T timeout 90 ncu --clock-control none --profile-from-start off -k regex:mla_gemm \
   --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
   python research/probes/gemm_noise_probe.py --repeat 1 --profile > $D/gemm-ncu-bk64.txt 2>&1)
grep -E "mla_gemm|Duration|DRAM Throughput|L2 Cache Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Warp Cycles Per Issued|stalled" \
  $D/gemm-ncu-bk64.txt | tail -n 16
pack
