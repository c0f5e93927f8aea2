#!/usr/bin/env bash
# One device call for the prepared patches (research/patches/README.md), from the repository root:
#   bash research/patches/ab_next.sh [NAME ...]     (default: every *.patch here; needs $OUT)
# Copies the tracked tree once per patch into /tmp/ab-NAME and applies it (`patch -p1`, no .git
# needed), runs bench_ddtree on main and each variant, interleaved, twice per drafter, prints each
# variant's A/B against main (tools/bench_ddtree_ab.py), takes the stamps (STAMP_DRAFTERS; default
# the stars: random; batch 1 and 8, budget 256, L2 flushed: the build's phases and the top-K chain's
# timeline, --chain --flush read) on main and each variant, runs the DDTree GPU tests on each variant
# (TESTS=0: not; their logs tests-NAME.log), and leaves the results in $OUT/r.tgz (one file: the
# device tool returns at most eight; packed after each step, so that a call cut short by its limit
# still returns what was done).
# ~1 minute plus ~0.8 per variant on the H200 with TESTS=0 (~0.6 with DRAFTERS="random peaked"),
# ~1.7 more per variant with the tests. DRAFTERS: the bench's drafters (default: all three).
# DTYPE=bfloat16: bf16 drafter logits in the bench and the stamps (default float32).
# STAMP_DRAFTERS: the drafters of the stamps (default random; others go to chain-NAME-DRAFTER.txt).
# STAMP_REPEAT: stamped builds per batch (default 3; ddtree_stamps.py --repeat: a line per build first).
# VARIANT_TOPK=fused: the variants' bench and stamps use DDTreePlan(topk="fused") (main: threshold);
# the A/B then pairs rows by batch and budget (bench_ddtree_ab.py --any-topk).
set -u
R=$PWD; O=${OUT:?set OUT}; mkdir -p $O/r
P=$R/research/patches
names=("$@"); [ ${#names[@]} -eq 0 ] && names=($(cd $P && ls *.patch | sed 's/\.patch$//'))
. $P/patched_tree.sh
for v in "${names[@]}"; do patched_tree $v /tmp/ab-$v; done
nvidia-smi -L
B="--quick --no-reference --logits-dtype ${DTYPE:-float32} ${BENCH_EXTRA:-}"  # BENCH_EXTRA: e.g. --vocab 32768
# the build bench_ddtree and the stamps measure: threshold on main; VARIANT_TOPK on the variants
# (default threshold; fused: the persistent build of persistent-build.patch, against main's threshold)
topk_of() { [ "$1" = main ] && echo threshold || echo "${VARIANT_TOPK:-threshold}"; }
DR=${DRAFTERS:-random peaked jittered}
for i in 1 2; do for d in $DR; do for t in main "${names[@]}"; do
  dd=$R; [ $t != main ] && dd=/tmp/ab-$t
  (cd $dd && PYTHONPATH=$dd timeout 45 python benchmarks/bench_ddtree.py $B --topk $(topk_of $t) --drafter $d --json $O/r/$t-$d-$i.json > $O/r/$t-$d-$i.log 2>&1) || echo "bench $t $d $i failed"
done; done; done
pack() { tar -C $O -czf $O/r.tgz r; }  # after each step: a call cut short still returns what it has
pack
for t in "${names[@]}"; do for d in $DR; do
  echo "=== main vs $t, $d"
  python $R/tools/bench_ddtree_ab.py $([ -n "${VARIANT_TOPK:-}" ] && echo --any-topk) $O/r/main-$d-1.json $O/r/main-$d-2.json --vs $O/r/$t-$d-1.json $O/r/$t-$d-2.json 2>&1 | grep build
done; done
for sd in ${STAMP_DRAFTERS:-random}; do for t in main "${names[@]}"; do dd=$R; [ $t != main ] && dd=/tmp/ab-$t
  # STAMP_REPEAT (default 3) stamped builds per batch, L2 flushed as in bench_ddtree: a line per build
  # (single builds can be outliers), then the last build's phase tables and chain
  f=$O/r/chain-$t.txt; [ $sd != random ] && f=$O/r/chain-$t-$sd.txt
  (cd $dd && PYTHONPATH=$dd timeout 90 python tools/ddtree_stamps.py --batch 1 8 --budget 256 --drafter $sd --logits-dtype ${DTYPE:-float32} --chain $([ $(topk_of $t) = fused ] && echo --topk fused) \
     --flush read --repeat ${STAMP_REPEAT:-3} > $f 2>&1)
  echo "--- stamps and chain of $t ($sd drafter), batch 1 then 8 (phases: cycles; chain: µs first / median / last)"
  grep -E '^ {4}[0-9] |^late launch|^(candidates per row|select per row|rows ranked|counted|loaded|selected|sorted|last|lp|generate|rdb1|rdround [0-9]|searched|nodes|stream exit|chunks exit|build merge|build sorted|build nodes|fused [a-z0-9]+) ' $f
  pack
done; done
if [ "${TESTS:-1}" != 0 ]; then
  for t in "${names[@]}"; do
    echo "--- DDTree GPU tests on $t"
    (cd /tmp/ab-$t && PYTHONPATH=/tmp/ab-$t timeout 200 python -m pytest -q -m gpu -p no:cacheprovider \
       $(xdist_opt) \
       tests/test_ddtree_gpu.py > $O/r/tests-$t.log 2>&1; tail -2 $O/r/tests-$t.log)
    pack
  done
fi
pack && rm -rf $O/r
