#!/usr/bin/env bash
# Prepared in the forty-fifth session (not run: the device was paused): logits-l2-prefetch.patch (the
# sample kernel prefetches the first bytes of every stream segment into L2 while it selects T;
# research/patches/README.md) against main. From the repository root, $OUT set:
#   bash research/patches/call_l2_prefetch.sh     (~8-9 minutes on a fresh H200; give the run tool 600 s)
# 1. bench_ddtree --quick (random drafter, L2 read flush) on main and on the patch with
#    DRIVERLEVEL_TK_L2_PREFETCH = 0.4 (its default), 0.2, 0.7 and 0 (= main's work plus the plan's
#    field), interleaved twice, fp32; then main and 0.4 in bf16; the A/B of each against main
#    (tools/bench_ddtree_ab.py: the build and the top-K columns);
# 2. the top-K chain's stamps at batch 8 / 256 on main and the patch (tools/ddtree_stamps.py --chain:
#    when the stream's CTAs start reading and when the last one exits);
# 3. the DDTree GPU tests on the patch (-n 8);
# 4. the kernel cache's new entries into $OUT/kc (tools/kernel_cache.py; for the next machine).
# Everything in $OUT/l2pf.tgz (packed after each step: a call cut short still returns what it has).
set -u
R=$PWD; O=${OUT:?set OUT}; D=/tmp/l2pf; rm -rf $D; mkdir -p $D
touch /tmp/l2pf-mark
. research/patches/patched_tree.sh
patched_tree logits-l2-prefetch /tmp/t-l2pf
nvidia-smi -L
pack() { tar -C /tmp -czf $O/l2pf.tgz l2pf; }
B="--quick --no-reference --drafter random"
run() {  # run NAME DTYPE FRACTION RUN
  local t=$1 dt=$2 f=$3 i=$4 dd=$R; [ $t != main ] && dd=/tmp/t-l2pf
  (cd $dd && PYTHONPATH=$dd DRIVERLEVEL_TK_L2_PREFETCH=$f timeout 60 python benchmarks/bench_ddtree.py $B --logits-dtype $dt \
     --json $D/$t-$f-$dt-$i.json > $D/$t-$f-$dt-$i.log 2>&1) || echo "bench $t $f $dt $i failed: $(tail -n 2 $D/$t-$f-$dt-$i.log)"
}
t0=$(date +%s)
for i in 1 2; do
  run main float32 "" $i
  for f in 0.4 0.2 0.7 0; do run l2pf float32 $f $i; done
  run main bfloat16 "" $i; run l2pf bfloat16 0.4 $i
done
echo "benches: $(( $(date +%s) - t0 )) s"; pack
for f in 0.4 0.2 0.7 0; do
  echo "=== main vs l2pf (fraction $f), float32"
  python tools/bench_ddtree_ab.py $D/main--float32-1.json $D/main--float32-2.json --vs $D/l2pf-$f-float32-1.json $D/l2pf-$f-float32-2.json 2>&1 | grep -E 'build|top'
done
echo "=== main vs l2pf (0.4), bfloat16"
python tools/bench_ddtree_ab.py $D/main--bfloat16-1.json $D/main--bfloat16-2.json --vs $D/l2pf-0.4-bfloat16-1.json $D/l2pf-0.4-bfloat16-2.json 2>&1 | grep -E 'build|top'
python - $D <<'PY'
import glob, json, statistics as st, sys
D = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{D}/*.json")):
    name = f.split("/")[-1].rsplit("-", 1)[0]
    for r in json.load(open(f))["results"] if isinstance(json.load(open(f)), dict) else json.load(open(f)):
        if r.get("topk") == "threshold":
            rows.setdefault((name, r["batch"], r["budget"]), []).append((r["gpu_us"]["build"], r.get("topk_read_tb_s")))
print("build µs and top-K TB/s, medians of the runs")
for k in sorted(rows):
    b = st.median(x[0] for x in rows[k]); tb = st.median(x[1] for x in rows[k] if x[1] is not None) if any(x[1] for x in rows[k]) else 0
    print(f"  {k[0]:24s} batch {k[1]} budget {k[2]:>3}: build {b:6.1f} µs  top-K {tb:4.2f} TB/s")
PY
pack
for t in main l2pf; do dd=$R; [ $t != main ] && dd=/tmp/t-l2pf
  (cd $dd && PYTHONPATH=$dd timeout 90 python tools/ddtree_stamps.py --batch 8 --budget 256 --drafter random --chain --flush read \
     --repeat 3 > $D/chain-$t.txt 2>&1)
  echo "--- chain of $t, batch 8 / 256 (µs first / median / last)"
  grep -E '^(stream|sample|chunks exit|build merge|build sorted|build nodes|late launch)' $D/chain-$t.txt | head -n 14
  pack
done
echo "--- DDTree GPU tests on the patch"
(cd /tmp/t-l2pf && PYTHONPATH=/tmp/t-l2pf timeout 240 python -m pytest -q -m gpu -p no:cacheprovider $(xdist_opt) \
   tests/test_ddtree_gpu.py tests/test_ddtree_robust_gpu.py tests/test_topk_l2_prefetch.py > $D/tests.log 2>&1; tail -n 3 $D/tests.log)
pack
python tools/kernel_cache.py export $O/kc --since /tmp/l2pf-mark
