#!/usr/bin/env bash
# chain-pdl.patch's A/B (fifty-ninth session), one device call from the repository root, $OUT set,
# .kcache carried (~8 minutes): the decode step on main and on the patch (step_ab.sh, interleaved
# twice, short) after the patch's per-launch marks (which compile its kernels), then its GPU tests (runner, demo, DDTree, decode-step
# fuzz) until the time runs out.
set -u
export OUT="${OUT:?set OUT}" PYTHONPATH=$PWD PYTHONUNBUFFERED=1
R=$PWD
nvidia-smi -L
python tools/kernel_cache.py import .kcache 2>&1 | tail -n 1
. research/patches/patched_tree.sh
patched_tree chain-pdl /tmp/step-chain-pdl
echo "== per-launch marks: chain-pdl (compiles the patched kernels first)"
(cd /tmp/step-chain-pdl && PYTHONPATH=/tmp/step-chain-pdl timeout 200 python research/probes/step_marks.py --per-launch 2>&1 | tail -n 20)
echo "== step A/B: chain-pdl"
timeout 240 bash research/patches/step_ab.sh chain-pdl ${STEP_ARGS:---steps 200 --max-new-tokens 128} 2>&1 | tee $OUT/step_ab-chain-pdl.txt | tail -n 30
echo "== GPU tests, chain-pdl tree"
(cd /tmp/step-chain-pdl && PYTHONPATH=/tmp/step-chain-pdl timeout ${TEST_S:-200} python -m pytest -q -x -m gpu \
   tests/test_runner_gpu.py tests/test_demo_gpu.py tests/test_decode_step_fuzz_gpu.py tests/test_ddtree_gpu.py \
   -p no:cacheprovider 2>&1 | tail -n 5)
