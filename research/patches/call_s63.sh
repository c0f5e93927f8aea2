#!/usr/bin/env bash
# The sixty-third session's first call (after the whole suite, or alone): dev-cold.patch and
# dev-heap-cold.patch (research/patches/README.md) against main, from the repository root, $OUT
# set, .kcache carried (~5 minutes on a warm H100): ab_next.sh's threshold A/B (fp32, three
# drafters, interleaved twice; no GPU tests: the whole suite runs on the one that lands), the decode
# step A/B of dev-heap-cold (its budget-16 trees are deep: they take the deviation search, now a
# call), then the code warmer's points
# (ddtree_stamps.py on main, new on its `code warmer` line).
set -u
export OUT="${OUT:?set OUT}" PYTHONUNBUFFERED=1
PYTHONPATH=$PWD python tools/kernel_cache.py import .kcache 2>&1 | tail -n 1
echo "== fp32 A/B (the GPU tests run in the whole suite on the winner)"
OUT=$OUT TESTS=0 STAMP_REPEAT=1 timeout 300 bash research/patches/ab_next.sh dev-cold dev-heap-cold 2>&1 \
  | grep -E 'main vs|build  |passed|failed'
mv $OUT/r.tgz $OUT/r-fp32.tgz 2>/dev/null
echo "== decode step A/B (batch 8, budget 16)"
OUT=$OUT timeout 200 bash research/patches/step_ab.sh dev-heap-cold --steps 200 --max-new-tokens 128 2>&1 \
  | grep -E '^===|^\| (DDTree|autoregressive) |^speed-up|^round'
echo "== the code warmer's points (main)"
PYTHONPATH=$PWD timeout 90 python tools/ddtree_stamps.py --batch 1 8 --budget 16 256 --chain --flush read 2>&1 \
  | grep -E '^# ddtree_build|code warmer|^build (entry|merge|last|nodes)'
