#!/usr/bin/env bash
# gemm-pair.patch (fifty-fifth session, CPU only) in one device call from the repository root ($OUT
# set; ~2-3 minutes on an H100 or H200 once warm, more with a cold kernel cache):
#   bash research/patches/call_s56.sh
# The target forward's q and kv projections read the same rows and ran as two launches one after the
# other (per-launch marks, H100, batch 8 / budget 16: 15.3 and 15.7 µs; 41 and 5 column tiles, 92
# CTAs together: one wave). gemm-pair runs them as one grouped launch (mla_gemm_pair / _m32). This
# runs, in a copy of the tree with the patch:
# 1. the GEMM, demo, fuzz and model files' GPU tests (the pair's own: test_gemm_pair_*);
# 2. step_ab.sh gemm-pair (the decode step, main and the patch interleaved twice);
# 3. research/probes/step_marks.py --per-launch on the patch (the pair's time in the step).
# If both steps gain (expected: DDTree ~-15, autoregressive ~-8 GPU µs), run the whole GPU suite
# twice on the patched tree (tools/gpu_check.sh, forward then REVERSED=1) and land it.
# Everything lands in $OUT/s56.tgz (packed after each step, so a cut call returns what was done).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
. research/patches/patched_tree.sh
D=/tmp/s56; rm -rf $D; mkdir -p $D  # outside $OUT: only the archive comes back
pack() { tar czf $OUT/s56.tgz -C /tmp s56; }
[ -f .kcache/kernel-cache.json ] && python tools/kernel_cache.py import .kcache > /dev/null
nvidia-smi -L | tee $D/gpu.txt
T=/tmp/t-gemm-pair
patched_tree gemm-pair $T
echo "--- 1. gemm-pair's GPU tests"
(cd $T && PYTHONPATH=$T timeout 300 python -m pytest -q -m gpu -p no:cacheprovider $(xdist_opt) \
   tests/test_runner_gpu.py tests/test_demo_gpu.py tests/test_decode_step_fuzz_gpu.py tests/test_mla_model_reference.py \
   > $D/tests-pair.log 2>&1; tail -n 3 $D/tests-pair.log)
pack
echo "--- 2. step_ab gemm-pair"
timeout 150 bash research/patches/step_ab.sh gemm-pair --steps 200 --max-new-tokens 128 > $D/step-ab.log 2>&1
mv $OUT/step-*.json $D/ 2>/dev/null
grep -E "===|DDTree|autoregressive|speed-up" $D/step-ab.log
pack
echo "--- 3. per-launch marks on gemm-pair"
(cd $T && PYTHONPATH=$T timeout 80 python research/probes/step_marks.py --per-launch > $D/marks-pair.txt 2>&1; tail -n 22 $D/marks-pair.txt)
pack
