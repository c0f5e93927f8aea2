#!/usr/bin/env bash
# One device call that measures a prepared patch in the decode step and runs its GPU tests, from the
# repository root, $OUT set, .kcache carried (~8 minutes):
#   OUT=$OUT bash research/patches/patch_step_call.sh NAME [pytest files ...]
# The patched tree's per-launch marks first (research/probes/step_marks.py --per-launch; it compiles
# the patched kernels, so the A/B after it finds them in the kernel cache), then step_ab.sh NAME
# (main and the patch interleaved twice; STEP_ARGS, default the short "--steps 200
# --max-new-tokens 128"), then the patch's GPU tests (the files given, default the runner, demo,
# decode-step fuzz and DDTree ones) until TEST_S seconds (default 200) have passed.
# (The fifty-ninth session's call_s59.sh, for chain-pdl, generalized.)
set -u
export OUT="${OUT:?set OUT}" PYTHONPATH=$PWD PYTHONUNBUFFERED=1
v=${1:?patch name}; shift
files=("$@")
[ ${#files[@]} -eq 0 ] && files=(tests/test_runner_gpu.py tests/test_demo_gpu.py tests/test_decode_step_fuzz_gpu.py tests/test_ddtree_gpu.py)
T=/tmp/step-$v
nvidia-smi -L
python tools/kernel_cache.py import .kcache 2>&1 | tail -n 1
. research/patches/patched_tree.sh
patched_tree $v $T
echo "== per-launch marks: $v (compiles the patched kernels first)"
(cd $T && PYTHONPATH=$T timeout 200 python research/probes/step_marks.py --per-launch 2>&1 | tail -n 20)
echo "== step A/B: $v"
timeout 240 bash research/patches/step_ab.sh $v ${STEP_ARGS:---steps 200 --max-new-tokens 128} 2>&1 | tee $OUT/step_ab-$v.txt | tail -n 30
echo "== GPU tests, $v tree: ${files[*]}"
(cd $T && PYTHONPATH=$T timeout ${TEST_S:-200} python -m pytest -q -x -m gpu "${files[@]}" -p no:cacheprovider 2>&1 | tail -n 5)
