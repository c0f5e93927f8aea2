#!/usr/bin/env bash
# The sixty-fourth session's A/B call, from the repository root, $OUT set, .kcache carried (~5
# minutes on a warm H100; the sixty-third session's two variants took 145 s): heap-cold.patch,
# warmer-first.patch, heap-cold-first.patch (the two together) and dev-warmer.patch
# (research/patches/README.md) against main with ab_next.sh (threshold build, fp32,
# three drafters, interleaved twice; the stamps; no GPU tests: those run on the one that goes on),
# then the code warmers' points on main, warmer-first and dev-warmer (ddtree_stamps.py, its
# `code warmer` and `second warmer` lines: the warmers' entry and end against the rows').
# NAMES: the patches to A/B (default the four). STEP=NAME instead: only the decode step A/B of NAME
# (step_ab.sh; its budget-16 trees are deep: they take the deviation search) and NAME's DDTree and
# graph GPU tests (~4 minutes).
set -u
export OUT="${OUT:?set OUT}" PYTHONUNBUFFERED=1
PYTHONPATH=$PWD python tools/kernel_cache.py import .kcache 2>&1 | tail -n 1
if [ -n "${STEP:-}" ]; then
  . research/patches/patched_tree.sh  # (xdist_opt)
  echo "== decode step A/B (batch 8, budget 16): $STEP"
  OUT=$OUT timeout 200 bash research/patches/step_ab.sh $STEP --steps 200 --max-new-tokens 128 2>&1 \
    | grep -E '^===|^\| (DDTree|autoregressive) |^speed-up|^round'
  echo "== DDTree GPU tests on $STEP"
  (cd /tmp/step-$STEP && PYTHONPATH=$PWD timeout 250 python -m pytest -q -m gpu -p no:cacheprovider $(xdist_opt) \
     tests/test_ddtree_gpu.py tests/test_graph_gpu.py > $OUT/tests-$STEP.log 2>&1; tail -n 3 $OUT/tests-$STEP.log)
  exit 0
fi
echo "== fp32 A/B (the GPU tests run on the one that goes on)"
OUT=$OUT TESTS=0 STAMP_REPEAT=1 timeout 360 bash research/patches/ab_next.sh ${NAMES:-heap-cold warmer-first heap-cold-first dev-warmer} 2>&1 \
  | grep -E 'main vs|build  |passed|failed'
mv $OUT/r.tgz $OUT/r-fp32.tgz 2>/dev/null
. research/patches/patched_tree.sh
for t in warmer-first dev-warmer; do patched_tree $t /tmp/points-$t; done
for t in main warmer-first dev-warmer; do dd=$PWD; [ $t != main ] && dd=/tmp/points-$t
  echo "== the code warmer's points ($t)"
  (cd $dd && PYTHONPATH=$dd timeout 90 python tools/ddtree_stamps.py --batch 1 8 --budget 16 256 --chain --flush read 2>&1 \
     | grep -E '^# ddtree_build|warmer \(CTA|^build (entry|merge|last|nodes)')
done
for t in main dev-warmer; do dd=$PWD; [ $t != main ] && dd=/tmp/points-$t
  echo "== deep trees (peaked drafter), batch 8, budget 16: the request's search against the second warmer ($t)"
  (cd $dd && PYTHONPATH=$dd timeout 60 python tools/ddtree_stamps.py --batch 8 --budget 16 --drafter peaked --chain \
     --flush read 2>&1 | grep -E '^# ddtree_build|warmer \(CTA|^build (entry|merge|last|nodes)|^(lp|searched|nodes) ')
done
