#!/usr/bin/env bash
# The fifty-seventh session's A/B of the demo GEMM's epilogue, one device call from the repository
# root, $OUT set, .kcache carried (~6 minutes): gemm-stage.patch (the tile through shared memory,
# whole rows stored) and gemm-store.patch (the store loop's checks hoisted): gemm_noise_probe.py
# --shapes on main and both patches (each GEMM shape in a graph, interleaved twice), the GEMM GPU
# tests on the gemm-stage tree, then step_ab.sh gemm-stage (the decode step, interleaved twice).
set -u
export OUT="${OUT:?set OUT}" PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi -L
python tools/kernel_cache.py import .kcache 2>&1 | tail -n 1
. research/patches/patched_tree.sh
patched_tree gemm-stage /tmp/gt
[[ " ${TREES:-main gt gs} " == *" gs "* ]] && patched_tree gemm-store /tmp/gs
# ROUNDS (default 2) and TREES (default "main gt gs") shorten it for a short device budget
for i in $(seq 1 ${ROUNDS:-2}); do for t in ${TREES:-main gt gs}; do
  d=$R; [ $t != main ] && d=/tmp/$t
  echo "== gemm_noise_probe --shapes: $t ($i)"
  (cd $d && PYTHONPATH=$d timeout 90 python research/probes/gemm_noise_probe.py --repeat 5 --shapes 2>&1 | grep -E '^(gemm|lm head|shape)')
done; done
echo "== GEMM GPU tests, gemm-stage tree"
(cd /tmp/gt && PYTHONPATH=/tmp/gt timeout 200 python -m pytest -q -x -m gpu tests/test_runner_gpu.py -k gemm \
   -p no:cacheprovider 2>&1 | tail -n 3)
echo "== step A/B"
timeout 240 bash research/patches/step_ab.sh gemm-stage ${STEP_ARGS:-} 2>&1 | tail -n 30
