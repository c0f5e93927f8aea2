#!/usr/bin/env bash
# Fifty-first session: does the sample kernel's shared-memory carveout keep the stream's CTAs off its
# SMs? (The H200 chain of 2026-12-05 call 3: 480 stream CTAs on 120 SMs, 4 each, most entering at the
# sample's exit, ~5 µs; a CTA of a kernel whose carveout differs cannot join an SM until it drains.)
# sample-carveout.patch: env knobs on one patched tree, so that every variant shares its code:
#   DL_AB_SAMPLE_CARVE=0|1  (default 1) the sample kernel prefers the largest carveout, as the stream does
#   DL_AB_SAMPLE_MINB=3     the sample's __launch_bounds__ min blocks 3: <= 85 registers (80 on sm_90,
#                           no spills), so that three stream CTAs fit beside a sample CTA, not two
#   DL_AB_BUILD_CARVE=1     ddtree_build prefers the largest carveout too
# Variants: main (CARVE=0), carve, carve+minb3, carve+minb3+build; bench_ddtree fp32 interleaved three
# times, bf16 once each; the chains of main and carve+minb3; the DDTree GPU tests on carve+minb3 in the
# time left. Everything in $OUT/carve.tgz (packed after each step).
set -u
R=$PWD; O=${OUT:?set OUT}; D=/tmp/carve; rm -rf $D; mkdir -p $D
export PYTHONUNBUFFERED=1
T_START=$(date +%s); LIMIT=${LIMIT:-570}
left() { echo $(( LIMIT - ($(date +%s) - T_START) )); }
[ -f .kcache/kernel-cache.json ] && python tools/kernel_cache.py import .kcache > /dev/null
. research/patches/patched_tree.sh
patched_tree sample-carveout /tmp/t-carve
nvidia-smi -L
pack() { tar -C /tmp -czf $O/carve.tgz carve; }
B="--quick --no-reference --drafter random --topk threshold"
envof() {  # the variant's environment
  case $1 in
    main) echo "DL_AB_SAMPLE_CARVE=0" ;;
    carve) echo "DL_AB_SAMPLE_CARVE=1" ;;
    minb3) echo "DL_AB_SAMPLE_CARVE=1 DL_AB_SAMPLE_MINB=3" ;;
    build) echo "DL_AB_SAMPLE_CARVE=1 DL_AB_SAMPLE_MINB=3 DL_AB_BUILD_CARVE=1" ;;
  esac
}
run() {  # run VARIANT DTYPE RUN
  local tag=$1-$2-$3
  [ "$(left)" -gt 200 ] || { echo "bench $tag skipped: $(left) s left"; return; }
  (cd /tmp/t-carve && env PYTHONPATH=/tmp/t-carve $(envof $1) timeout 120 python benchmarks/bench_ddtree.py $B \
     --logits-dtype $2 --json $D/$tag.json > $D/$tag.log 2>&1) || echo "bench $tag failed: $(tail -n 2 $D/$tag.log)"
}
t0=$(date +%s)
for i in 1 2 3; do for v in main carve minb3 build; do run $v float32 $i; done; done
for v in main carve minb3 build; do run $v bfloat16 1; done
echo "benches: $(( $(date +%s) - t0 )) s"; pack
for v in carve minb3 build; do
  echo "=== main vs $v (fp32, 3 runs each)"
  python tools/bench_ddtree_ab.py $D/main-float32-{1,2,3}.json --vs $D/$v-float32-{1,2,3}.json 2>&1 | grep -E 'build|top'
  echo "=== main vs $v (bf16, 1 run each)"
  python tools/bench_ddtree_ab.py $D/main-bfloat16-1.json --vs $D/$v-bfloat16-1.json 2>&1 | grep -E 'build|top'
done
pack
for v in minb3 main; do
  [ "$(left)" -gt 150 ] || { echo "chain of $v skipped: $(left) s left"; continue; }
  (cd /tmp/t-carve && env PYTHONPATH=/tmp/t-carve $(envof $v) timeout 90 python tools/ddtree_stamps.py --batch 8 \
     --budget 256 --drafter random --chain --flush read --repeat 3 > $D/chain-$v.txt 2>&1)
  echo "--- chain of $v, batch 8 / 256"
  grep -E '^(sample|stream|build merge|build sorted|build nodes|CTAs / SM| +[0-9]+ +[0-9]+ +[0-9]+ )' $D/chain-$v.txt | head -n 20
  pack
done
echo "--- DDTree GPU tests on carve+minb3"
lt=$(( $(left) - 15 )); [ $lt -gt 240 ] && lt=240
if [ $lt -gt 60 ]; then
  (cd /tmp/t-carve && env PYTHONPATH=/tmp/t-carve $(envof minb3) timeout $lt python -m pytest -q -m gpu -p no:cacheprovider \
     $(xdist_opt) tests/test_ddtree_gpu.py tests/test_ddtree_robust_gpu.py > $D/tests.log 2>&1; tail -n 3 $D/tests.log)
else
  echo "tests skipped: $(left) s left"
fi
pack
