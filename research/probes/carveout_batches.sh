#!/usr/bin/env bash
# Fifty-second session: the sample kernel's carveout rule (driverlevel._topk_threshold.sample_carveout)
# at the batches it asks for but nobody measured (2 and 4), side by side with the rule off (the
# function patched to return None in the bench process), and batch 8 as the measured reference.
# bench_ddtree.py runs from a copy whose BATCHES line is replaced (its tables are batch 1 and 8);
# fp32 and bf16 logits, random drafter, L2 flushed, interleaved on / off, RUNS runs each.
#   OUT=$OUT bash research/probes/carveout_batches.sh        (RUNS=N, default 2; BATCHES="2, 4, 8")
# Results: $OUT/cb.tgz (JSONs and logs), the A/B tables on stdout (tools/bench_ddtree_ab.py).
set -u
R=$PWD; O=${OUT:?set OUT}; D=/tmp/cb; rm -rf $D; mkdir -p $D
export PYTHONUNBUFFERED=1
[ -f .kcache/kernel-cache.json ] && python tools/kernel_cache.py import .kcache > /dev/null
sed "s/^BATCHES = (1, 8)/BATCHES = (${BATCHES:-2, 4, 8})/" benchmarks/bench_ddtree.py > benchmarks/_bench_ddtree_cb.py
grep -q "^BATCHES = (${BATCHES:-2, 4, 8})" benchmarks/_bench_ddtree_cb.py || { echo "BATCHES line not found"; exit 1; }
trap 'rm -f $R/benchmarks/_bench_ddtree_cb.py' EXIT
run() {  # run on|off DTYPE RUN
  local tag=$1-$2-$3 pre=""
  [ $1 = off ] && pre="import driverlevel._topk_threshold as t; t.sample_carveout = lambda *a, **k: None; "
  PYTHONPATH=$R timeout 120 python -c "${pre}import runpy, sys; sys.argv = ['bench', '--quick', '--no-reference', '--drafter', 'random', '--topk', 'threshold', '--logits-dtype', '$2', '--json', '$D/$tag.json']; runpy.run_path('benchmarks/_bench_ddtree_cb.py', run_name='__main__')" > $D/$tag.log 2>&1 || echo "bench $tag failed: $(tail -n 2 $D/$tag.log)"
}
nvidia-smi -L
for i in $(seq 1 ${RUNS:-2}); do for dt in float32 bfloat16; do for v in on off; do run $v $dt $i; done; done; done
tar -C /tmp -czf $O/cb.tgz cb
for dt in float32 bfloat16; do
  echo "=== rule on (A) vs off (B), $dt"
  python tools/bench_ddtree_ab.py $D/on-$dt-*.json --vs $D/off-$dt-*.json 2>&1 | grep -E 'B-A|build|topk'
done
