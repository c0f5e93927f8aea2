#!/usr/bin/env bash
# The thirty-ninth session's first device call, as the thirty-eighth planned it (research/ddtree_build.md,
# research/patches/README.md), from the repository root: OUT=... bash research/patches/next_call.sh
# 1. Where the programmatic build's ~6 µs step cost lies: research/probes/step_marks.py --keep 0,6 (only the
#    step's start and end marks) on main and on build-nopdl, twice each, batch 8 / budget 16: the replay's event
#    time and the part outside the marks (~25 s a run).
# 2. warp-enum: ab_next.sh with the DDTree GPU tests on the variant, peaked and jittered rows (budget 16 is what
#    it changes), fp32 (~4 min).
# ~6 minutes in all; each step writes under $OUT.
set -u
R=$PWD; O=${OUT:?set OUT}; mkdir -p $O
T=/tmp/nc-build-nopdl
. $R/research/patches/patched_tree.sh
patched_tree build-nopdl $T
for i in 1 2; do for t in main build-nopdl; do
  dd=$R; [ $t != main ] && dd=$T
  echo "=== step_marks --keep 0,6: $t run $i"
  (cd $dd && PYTHONPATH=$dd timeout 120 python research/probes/step_marks.py --keep 0,6 --replays 200 2>&1 \
     | grep -v Warning | tail -5) | tee -a $O/step_marks.txt
done; done
mkdir -p $O/ab
(OUT=$O/ab TESTS=1 DRAFTERS="peaked jittered" STAMP_DRAFTERS=peaked bash research/patches/ab_next.sh warp-enum) 2>&1 \
  | grep -A6 '^=== \|^--- DDTree' | tee $O/warp-enum-ab.txt
