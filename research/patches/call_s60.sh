#!/usr/bin/env bash
# The fifty-ninth session's prepared step patches, A/B'd in one device call from the repository
# root, $OUT set, .kcache carried (~3-4 minutes a patch, its kernels compiled afresh: two a call
# stay inside the 600-s limit, so PATCHES="gemm-prefetch gemm-prefetch-early", then
# PATCHES="sample-pdl schedule-pdl"; the default runs the first two):
# for each, the patched tree's per-launch marks (they compile its kernels, so the A/B after them
# finds them in the kernel cache), then step_ab.sh (main and the patch interleaved twice, short
# runs); first main's per-kernel marks (step_marks.py --every-launch, new). No GPU tests: the winner's come after, with patch_step_call.sh or the whole suite.
set -u
export OUT="${OUT:?set OUT}" PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
python tools/kernel_cache.py import .kcache 2>&1 | tail -n 1
. research/patches/patched_tree.sh
echo "== main: every launch marked (step_marks.py --every-launch: one line a kernel, PDL kept)"
timeout 200 python research/probes/step_marks.py --every-launch 2>&1 | tail -n 40
for v in ${PATCHES:-gemm-prefetch gemm-prefetch-early}; do
  patched_tree $v /tmp/step-$v
  echo "== per-launch marks: $v"
  (cd /tmp/step-$v && PYTHONPATH=/tmp/step-$v timeout 200 python research/probes/step_marks.py --per-launch 2>&1 | tail -n 6)
  echo "== step A/B: $v"
  timeout 200 bash research/patches/step_ab.sh $v ${STEP_ARGS:---steps 200 --max-new-tokens 128} 2>&1 \
    | tee $OUT/step_ab-$v.txt | grep -E '^=== |^\| (DDTree|autoregressive) \| [0-9.]+ \||^round'
done
