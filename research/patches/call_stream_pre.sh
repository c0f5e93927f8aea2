#!/usr/bin/env bash
# Fifty-first session, prepared (CPU only): with the sample's carveout rule (09cc6d0) the batch-8
# stream's CTAs start beside the sample kernel and put their first ring tiles (fp32 2 x 16 KB, bf16
# 5 x 8 KB per CTA) in flight before their PDL wait, in front of the sample's scattered loads, which
# slowed the sample (H100 chain: its keys 4.0 -> 6.2 µs with three stream CTAs beside it).
# stream-pre-tiles.patch: DL_AB_TK_PRE=N (a compile define from the environment) puts only N of
# those tiles in flight before the wait and the rest right after it (the loop's group count is
# unchanged). Variants: main (the repository's tree), pre1 and pre0 (patched tree); bench_ddtree
# fp32 interleaved three times, bf16 once each; the chains of main and pre1 at 8 / 256; the DDTree
# GPU tests on pre1 in the time left. Everything in $OUT/pre.tgz (packed after each step).
#   OUT=$OUT bash research/patches/call_stream_pre.sh      (LIMIT=S: seconds it may take, default 570)
set -u
R=$PWD; O=${OUT:?set OUT}; D=/tmp/pre; rm -rf $D; mkdir -p $D
export PYTHONUNBUFFERED=1
T_START=$(date +%s); LIMIT=${LIMIT:-570}
left() { echo $(( LIMIT - ($(date +%s) - T_START) )); }
[ -f .kcache/kernel-cache.json ] && python tools/kernel_cache.py import .kcache > /dev/null
. research/patches/patched_tree.sh
patched_tree stream-pre-tiles /tmp/t-pre
nvidia-smi -L
pack() { tar -C /tmp -czf $O/pre.tgz pre; }
B="--quick --no-reference --drafter random --topk threshold"
dirof() { [ $1 = main ] && echo $R || echo /tmp/t-pre; }
envof() { case $1 in main) echo "DL_AB_NONE=1" ;; pre1) echo "DL_AB_TK_PRE=1" ;; pre0) echo "DL_AB_TK_PRE=0" ;; esac; }
run() {  # run VARIANT DTYPE RUN
  local tag=$1-$2-$3 dd; dd=$(dirof $1)
  [ "$(left)" -gt 200 ] || { echo "bench $tag skipped: $(left) s left"; return; }
  (cd $dd && env PYTHONPATH=$dd $(envof $1) timeout 120 python benchmarks/bench_ddtree.py $B \
     --logits-dtype $2 --json $D/$tag.json > $D/$tag.log 2>&1) || echo "bench $tag failed: $(tail -n 2 $D/$tag.log)"
}
t0=$(date +%s)
for i in 1 2 3; do for v in main pre1 pre0; do run $v float32 $i; done; done
for v in main pre1 pre0; do run $v bfloat16 1; done
echo "benches: $(( $(date +%s) - t0 )) s"; pack
for v in pre1 pre0; do
  echo "=== main vs $v (fp32, 3 runs each)"
  python tools/bench_ddtree_ab.py $D/main-float32-{1,2,3}.json --vs $D/$v-float32-{1,2,3}.json 2>&1 | grep -E 'build|top'
  echo "=== main vs $v (bf16, 1 run each)"
  python tools/bench_ddtree_ab.py $D/main-bfloat16-1.json --vs $D/$v-bfloat16-1.json 2>&1 | grep -E 'build|top'
done
pack
for v in pre1 main; do
  [ "$(left)" -gt 150 ] || { echo "chain of $v skipped: $(left) s left"; continue; }
  dd=$(dirof $v)
  (cd $dd && env PYTHONPATH=$dd $(envof $v) timeout 90 python tools/ddtree_stamps.py --batch 8 --budget 256 \
     --drafter random --chain --flush read --repeat 3 > $D/chain-$v.txt 2>&1)
  echo "--- chain of $v, batch 8 / 256"
  grep -E '^(sample|stream|build merge|build sorted|build nodes|CTAs / SM| +[0-9]+ +[0-9]+ +[0-9]+ )' $D/chain-$v.txt | head -n 20
  pack
done
echo "--- DDTree GPU tests on pre1"
lt=$(( $(left) - 15 )); [ $lt -gt 240 ] && lt=240
if [ $lt -gt 60 ]; then
  (cd /tmp/t-pre && env PYTHONPATH=/tmp/t-pre DL_AB_TK_PRE=1 timeout $lt python -m pytest -q -m gpu -p no:cacheprovider \
     $(xdist_opt) tests/test_ddtree_gpu.py tests/test_ddtree_robust_gpu.py > $D/tests.log 2>&1; tail -n 3 $D/tests.log)
else
  echo "tests skipped: $(left) s left"
fi
pack
