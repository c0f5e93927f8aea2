#!/usr/bin/env bash
# gemm-noise-mufu.patch's A/B (fifty-eighth session), and o-m144.patch's decode step, one device call from the repository root, $OUT
# set, .kcache carried (~5 minutes; ROUNDS=1 STEP_ARGS="--steps 200 --max-new-tokens 128" for ~2): its GEMM / drafter GPU tests (the noise against the float64
# reference), the drafter GEMM with and without noise on main and on the patch
# (gemm_noise_probe.py, interleaved twice), then step_ab.sh gemm-noise-mufu.
set -u
export OUT="${OUT:?set OUT}" PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi -L
python tools/kernel_cache.py import .kcache 2>&1 | tail -n 1
. research/patches/patched_tree.sh
patched_tree gemm-noise-mufu /tmp/nm
echo "== GEMM and drafter GPU tests, gemm-noise-mufu tree"
(cd /tmp/nm && PYTHONPATH=/tmp/nm timeout 150 python -m pytest -q -x -m gpu tests/test_runner_gpu.py \
   -k "gemm or drafter or successor" -p no:cacheprovider 2>&1 | tail -n 3)
for i in $(seq 1 ${ROUNDS:-2}); do for t in main nm; do
  d=$R; [ $t != main ] && d=/tmp/$t
  echo "== gemm_noise_probe: $t ($i)"
  (cd $d && PYTHONPATH=$d timeout 60 python research/probes/gemm_noise_probe.py --repeat 5 2>&1 | grep -E '^(gemm|lm head)')
done; done
# then each patch's decode-step A/B (STEPS, default both; o-m144.patch: the output projection's
# 136 rows as one 144-row tile split 18 ways, not two 128-row tiles split 15)
for v in ${STEPS-gemm-noise-mufu o-m144}; do
  echo "== step A/B: $v"
  timeout 200 bash research/patches/step_ab.sh $v ${STEP_ARGS:-} 2>&1 | tee $OUT/step_ab-$v.txt | tail -n 30
done
