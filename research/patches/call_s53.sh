#!/usr/bin/env bash
# The probes the fifty-third session prepared and could not run (its device time ran out), in one
# device call from the repository root ($OUT set; ~6-8 minutes on an H100 or H200 once warm; give
# the run tool 600 s):
#   bash research/patches/call_s53.sh
# 1. research/probes/drafter_parts.py (fixed: the plain drafter's own chain now runs first): are its
#    "no noise" rows ~36-40 µs now, as gemm_noise_probe.py measured, not ~220?
# 2. the same on a copy with gemm-bounds.patch (the GEMM's bounded gather), and that patch's two new
#    GPU tests there (landing it still needs the whole GPU suite twice on main with it applied);
# 3. research/probes/gemm_noise_probe.py, then under Nsight Compute with --profile (only the timed
#    launches: the drafter's GEMM with and without noise and the target's LM head shape, 128 rows):
#    where the LM head's 53 µs go (its bytes need ~15);
# 4. tools/ddtree_stamps.py at batch 1 with and without --twice (fp32, budget 256, read flush): is the
#    warm select much faster than the cold one at batch 1? If so, A/B sample-dry.patch (ab_next.sh);
# 5. gemm-stages.patch (a deeper cp.async pipeline for the demo GEMM on sm_90): gemm_noise_probe.py in
#    its tree, then step_ab.sh (the decode step, main and the patch interleaved twice; ~3 minutes).
# Everything lands in $OUT/s53.tgz (packed after each step, so a cut call returns what was done).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
. research/patches/patched_tree.sh
D=/tmp/s53; rm -rf $D; mkdir -p $D  # outside $OUT: only the archive comes back
pack() { tar czf $OUT/s53.tgz -C /tmp s53; }
[ -f .kcache/kernel-cache.json ] && python tools/kernel_cache.py import .kcache > /dev/null
nvidia-smi -L | tee $D/gpu.txt
echo "--- 1. drafter_parts on main"
timeout 120 python research/probes/drafter_parts.py > $D/drafter-main.txt 2>&1; grep -E '^(#|round)' $D/drafter-main.txt
pack
echo "--- 2. gemm-bounds: drafter_parts and its GPU tests"
patched_tree gemm-bounds /tmp/t-gemm-bounds
(cd /tmp/t-gemm-bounds && PYTHONPATH=/tmp/t-gemm-bounds timeout 120 python research/probes/drafter_parts.py \
   > $D/drafter-gemm-bounds.txt 2>&1; grep -E '^round 0' $D/drafter-gemm-bounds.txt)
(cd /tmp/t-gemm-bounds && PYTHONPATH=/tmp/t-gemm-bounds timeout 200 python -m pytest -q -m gpu -p no:cacheprovider \
   tests/test_runner_gpu.py -k "out_of_range or noise_matches or gather_scatter or gemm_matches" \
   > $D/tests-gemm-bounds.log 2>&1; tail -n 3 $D/tests-gemm-bounds.log)
pack
echo "--- 3. gemm_noise_probe, then ncu"
timeout 60 python research/probes/gemm_noise_probe.py --repeat 50 --shapes > $D/gemm-probe.txt 2>&1; grep -E "gemm|lm head|^shape" $D/gemm-probe.txt
timeout 240 ncu --clock-control none --profile-from-start off -k regex:mla_gemm --set full \
  python research/probes/gemm_noise_probe.py --repeat 1 --profile > $D/gemm-ncu.txt 2>&1
grep -E "mla_gemm|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\) Throughput|Achieved Occupancy|Registers Per|Issue Slots Busy|No Eligible" $D/gemm-ncu.txt | head -60
pack
echo "--- 4. the warm select at batch 1"
for t in "" "--twice"; do
  timeout 120 python tools/ddtree_stamps.py --batch 1 --budget 256 --chain --flush read --repeat 3 $t \
    > $D/stamps-b1${t:+-twice}.txt 2>&1
  echo "== stamps batch 1 $t"; grep -E "^sample|^stream waited|^build merge|^build nodes" $D/stamps-b1${t:+-twice}.txt
done
pack
echo "--- 5. gemm-stages"
patched_tree gemm-stages /tmp/t-gemm-stages
(cd /tmp/t-gemm-stages && PYTHONPATH=/tmp/t-gemm-stages timeout 60 python research/probes/gemm_noise_probe.py --repeat 50 --shapes \
   > $D/gemm-probe-stages.txt 2>&1; grep -E "gemm|lm head|^shape" $D/gemm-probe-stages.txt)
pack
timeout 240 bash research/patches/step_ab.sh gemm-stages --steps 200 --max-new-tokens 128 > $D/step-ab-stages.log 2>&1
mv $OUT/step-*.json $D/ 2>/dev/null
grep -E "===|DDTree|autoregressive|speed-up|round" $D/step-ab-stages.log
pack
