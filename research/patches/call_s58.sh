#!/usr/bin/env bash
# The fifty-eighth session's A/B of the demo GEMM's epilogue, one device call from the repository
# root, $OUT set, .kcache carried (~8 minutes): main against gemm-stage.patch (the tile through
# shared memory), gemm-stage-lean.patch (the same, with the 128-row tile's B loads as one pointer
# and a stride and its load flags as bits: 128 registers pinned, spill-free under NVRTC 13.0 and
# 13.5) and gemm-store.patch (the store loop's checks hoisted): gemm_noise_probe.py --shapes on each
# tree (each GEMM shape in a graph, interleaved ROUNDS times), the GEMM GPU tests on the
# gemm-stage-lean tree, then step_ab.sh gemm-stage-lean (the decode step, interleaved twice).
set -u
export OUT="${OUT:?set OUT}" PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi -L
python tools/kernel_cache.py import .kcache 2>&1 | tail -n 1
. research/patches/patched_tree.sh
declare -A P=([gt]=gemm-stage [gl]=gemm-stage-lean [gs]=gemm-store)
TREES=${TREES:-main gl gt gs}
for t in $TREES; do [ $t != main ] && patched_tree ${P[$t]} /tmp/$t; done
for i in $(seq 1 ${ROUNDS:-2}); do for t in $TREES; do
  d=$R; [ $t != main ] && d=/tmp/$t
  echo "== gemm_noise_probe --shapes: $t ($i)"
  (cd $d && PYTHONPATH=$d timeout 90 python research/probes/gemm_noise_probe.py --repeat 5 --shapes 2>&1 | grep -E '^(gemm|lm head|shape)')
done; done
echo "== GEMM GPU tests, gemm-stage-lean tree"
(cd /tmp/gl && PYTHONPATH=/tmp/gl timeout 200 python -m pytest -q -x -m gpu tests/test_runner_gpu.py -k gemm \
   -p no:cacheprovider 2>&1 | tail -n 3)
echo "== step A/B"
timeout 240 bash research/patches/step_ab.sh gemm-stage-lean ${STEP_ARGS:-} 2>&1 | tail -n 30
