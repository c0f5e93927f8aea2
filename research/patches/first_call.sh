#!/usr/bin/env bash
# The twenty-seventh session's first device call (research/patches/README.md), from the repository root:
#   OUT=... bash research/patches/first_call.sh
# 1. early-warm (never run on a GPU yet) and one-trip-topk against main: bench_ddtree A/B (random
#    and peaked), the stars' stamps and chains, and the DDTree GPU tests on each (ab_next.sh);
# 2. the stamped build of early-warm with --evict-code beside it (does its lead remove the batch-1
#    merge's cold cost?).
# Results: $OUT/r.tgz and $OUT/e.tgz. ~8 minutes on the H200.
set -u
R=$PWD; O=${OUT:?set OUT}; mkdir -p $O/e
DRAFTERS="random peaked" bash research/patches/ab_next.sh early-warm one-trip-topk
T=/tmp/ab-early-warm
PYTHONPATH=$T timeout 90 bash -c "cd $T && python tools/ddtree_stamps.py --batch 1 8 --budget 256 --drafter random \
  --chain --flush read --evict-code" > $O/e/chain-early-warm-evict.txt 2>&1 || echo "stamps early-warm evict failed"
grep -E '^(merge|loaded|selected|lse|lsedone|sorted|build merge|build sorted|build nodes) ' $O/e/chain-early-warm-evict.txt
tar -C $O -czf $O/e.tgz e && rm -rf $O/e
