#!/usr/bin/env bash
# The fifty-eighth session's A/B of the demo GEMM's epilogue and loaders, from the repository root,
# $OUT set, .kcache carried. Trees (TREES, default all six): main; gl = gemm-stage-lean (the tile
# through shared memory, loaders lean: 128 registers pinned, spill-free under NVRTC 13.0 and 13.5);
# gsl = gemm-store-lean (the store loop's checks hoisted, loaders lean); ml = gemm-loaders (the
# lean loaders alone); gt = gemm-stage; gs = gemm-store. Each tree's gemm_noise_probe.py --shapes
# (each GEMM shape in a graph), interleaved ROUNDS (2) times; then the GEMM GPU tests on TEST_TREE
# (default gl; empty: none) and step_ab.sh STEP (default gemm-stage-lean; empty: none).
# ~30-40 s per probe run once a tree's kernels are compiled; two calls for everything:
#   TEST_TREE= STEP= bash research/patches/call_s58.sh          (the probes)
#   TREES= bash research/patches/call_s58.sh                     (tests and step A/B of gl)
set -u
export OUT="${OUT:?set OUT}" PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi -L
python tools/kernel_cache.py import .kcache 2>&1 | tail -n 1
. research/patches/patched_tree.sh
declare -A P=([gl]=gemm-stage-lean [gsl]=gemm-store-lean [ml]=gemm-loaders [gt]=gemm-stage [gs]=gemm-store)
TREES=${TREES-main gl gsl ml gt gs}
TEST_TREE=${TEST_TREE-gl}
STEP=${STEP-gemm-stage-lean}
for t in $TREES $TEST_TREE; do [ $t != main ] && [ ! -d /tmp/$t ] && patched_tree ${P[$t]} /tmp/$t; done
for i in $(seq 1 ${ROUNDS:-2}); do for t in $TREES; do
  d=$R; [ $t != main ] && d=/tmp/$t
  echo "== gemm_noise_probe --shapes: $t ($i)"
  (cd $d && PYTHONPATH=$d timeout 120 python research/probes/gemm_noise_probe.py --repeat 5 --shapes 2>&1 | grep -E '^(gemm|lm head|shape)')
done; done
if [ -n "$TEST_TREE" ]; then
  echo "== GEMM GPU tests, $TEST_TREE tree"
  (cd /tmp/$TEST_TREE && PYTHONPATH=/tmp/$TEST_TREE timeout 200 python -m pytest -q -x -m gpu tests/test_runner_gpu.py \
     -k gemm -p no:cacheprovider 2>&1 | tail -n 3)
fi
if [ -n "$STEP" ]; then
  echo "== step A/B: $STEP"
  timeout 240 bash research/patches/step_ab.sh $STEP ${STEP_ARGS:-} 2>&1 | tail -n 30
fi
