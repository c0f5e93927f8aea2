#!/usr/bin/env bash
# The fifty-seventh session's A/B of gemm-store.patch (the demo GEMM's store loop), one device call
# from the repository root, $OUT set, .kcache carried (~6 minutes): the GEMM GPU tests on the patched
# tree, gemm_noise_probe.py --shapes on main and on the patch (each GEMM shape in a graph), then
# step_ab.sh (the decode step, interleaved twice).
set -u
export OUT="${OUT:?set OUT}" PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi -L
python tools/kernel_cache.py import .kcache 2>&1 | tail -n 1
. research/patches/patched_tree.sh
patched_tree gemm-store /tmp/gs
echo "== GEMM GPU tests, patched tree"
(cd /tmp/gs && PYTHONPATH=/tmp/gs timeout 240 python -m pytest -q -x -m gpu tests/test_runner_gpu.py -k gemm \
   -p no:cacheprovider 2>&1 | tail -n 3)
for i in 1 2; do for t in main gs; do
  d=$R; [ $t = gs ] && d=/tmp/gs
  echo "== gemm_noise_probe --shapes: $t ($i)"
  (cd $d && PYTHONPATH=$d timeout 90 python research/probes/gemm_noise_probe.py --repeat 5 --shapes 2>&1 | grep -E '^(gemm|lm head|shape)')
done; done
echo "== step A/B"
timeout 300 bash research/patches/step_ab.sh gemm-store 2>&1 | tail -n 30
