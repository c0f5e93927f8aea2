#!/usr/bin/env bash
# Prepared in the forty-fifth session (not run: the device was paused): logits-l2-prefetch.patch (the
# sample kernel prefetches the first bytes of every stream segment into L2 while it selects T;
# research/patches/README.md) against main. From the repository root, $OUT set:
#   bash research/patches/call_l2_prefetch.sh     (at most ~575 s: each step checks the time left; give the run tool 600 s)
# 1. bench_ddtree --quick (random drafter, L2 read flush) on main and on the patch with
#    DRIVERLEVEL_TK_L2_PREFETCH = 0.4 (its default), 0.2 and 0 (= main's work plus the plan's
#    field), interleaved twice, fp32; then main and 0.4 in bf16; the A/B of each against main
#    (tools/bench_ddtree_ab.py: the build and the top-K columns);
# 2. the DDTree GPU tests on the patch (-n 8);
# 3. the top-K chain's stamps at batch 8 / 256 on main and the patch, in the time left
#    (tools/ddtree_stamps.py --chain: when the stream's CTAs start reading, when the last one exits);
# 4. the kernel cache's entries that main's checkout compiled or loaded into $OUT/kc (tools/kernel_cache.py;
#    for the next machine; the patched tree has a cache of its own, whose entries would not hit there).
# Everything in $OUT/l2pf.tgz (packed after each step: a call cut short still returns what it has).
set -u
R=$PWD; O=${OUT:?set OUT}; D=/tmp/l2pf; rm -rf $D; mkdir -p $D
export PYTHONPATH=$R PYTHONUNBUFFERED=1
T_START=$(date +%s)
left() { echo $(( 575 - ($(date +%s) - T_START) )); }
touch /tmp/l2pf-mark
# a carried kernel cache of an earlier call (run(carry=[".kcache"])): main's cubins compile no more
[ -f .kcache/kernel-cache.json ] && python tools/kernel_cache.py import .kcache
. research/patches/patched_tree.sh
patched_tree logits-l2-prefetch /tmp/t-l2pf
nvidia-smi -L
pack() { tar -C /tmp -czf $O/l2pf.tgz l2pf; }
B="--quick --no-reference --drafter random"
run() {  # run NAME DTYPE FRACTION RUN
  local t=$1 dt=$2 f=$3 i=$4 dd=$R c=${DRIVERLEVEL_CACHE_DIR:-$HOME/.cache/driverlevel}
  [ $t != main ] && dd=/tmp/t-l2pf && c=/tmp/kc-patched
  [ "$(left)" -gt 150 ] || { echo "bench $t $f $dt $i skipped: $(left) s left"; return; }
  (cd $dd && PYTHONPATH=$dd DRIVERLEVEL_CACHE_DIR=$c DRIVERLEVEL_TK_L2_PREFETCH=$f timeout 60 python benchmarks/bench_ddtree.py $B --logits-dtype $dt \
     --json $D/$t-$f-$dt-$i.json > $D/$t-$f-$dt-$i.log 2>&1) || echo "bench $t $f $dt $i failed: $(tail -n 2 $D/$t-$f-$dt-$i.log)"
}
t0=$(date +%s)
for i in 1 2; do
  run main float32 "" $i
  for f in 0.4 0.2 0; do run l2pf float32 $f $i; done
  run main bfloat16 "" $i; run l2pf bfloat16 0.4 $i
done
echo "benches: $(( $(date +%s) - t0 )) s"; pack
for f in 0.4 0.2 0; do
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
echo "--- DDTree GPU tests on the patch"
lt=$(( $(left) - 20 )); [ $lt -gt 240 ] && lt=240
(cd /tmp/t-l2pf && PYTHONPATH=/tmp/t-l2pf DRIVERLEVEL_CACHE_DIR=/tmp/kc-patched timeout $lt python -m pytest -q -m gpu -p no:cacheprovider $(xdist_opt) \
   tests/test_ddtree_gpu.py tests/test_ddtree_robust_gpu.py tests/test_topk_l2_prefetch.py > $D/tests.log 2>&1; tail -n 3 $D/tests.log)
pack
for t in main l2pf; do dd=$R; c=${DRIVERLEVEL_CACHE_DIR:-$HOME/.cache/driverlevel}; [ $t != main ] && dd=/tmp/t-l2pf && c=/tmp/kc-patched
  [ "$(left)" -gt 100 ] || { echo "stamps of $t skipped: $(left) s left"; continue; }
  (cd $dd && PYTHONPATH=$dd DRIVERLEVEL_CACHE_DIR=$c timeout 90 python tools/ddtree_stamps.py --batch 8 --budget 256 --drafter random --chain --flush read \
     --repeat 3 > $D/chain-$t.txt 2>&1)
  echo "--- chain of $t, batch 8 / 256 (µs first / median / last)"
  grep -E '^(stream|sample|chunks exit|build merge|build sorted|build nodes|late launch)' $D/chain-$t.txt | head -n 14
  pack
done
python tools/kernel_cache.py export $O/kc --since /tmp/l2pf-mark
