#!/usr/bin/env bash
# Prepared in the forty-fifth session (not run: the device was paused): logits-l2-prefetch.patch (the
# sample kernel prefetches the first bytes of every stream segment into L2 while it selects T;
# research/patches/README.md) against main. From the repository root, $OUT set:
#   bash research/patches/call_l2_prefetch.sh     (at most ~575 s: each step checks the time left; give the run tool 600 s;
#   LIMIT=S for another budget, SHORT=1 for main against the default fraction in fp32 only)
# 1. bench_ddtree --quick --topk threshold (random drafter, L2 read flush) on main and on the patch
#    with DRIVERLEVEL_TK_L2_PREFETCH = 0.4 (its default), 0.2, 0.4 from the segment's first tile
#    (DRIVERLEVEL_TK_L2_PREFETCH_FROM=0) and 0 (= main's work plus the plan's fields), interleaved
#    twice, fp32; then main and 0.4 in bf16; the A/B of each against main (tools/bench_ddtree_ab.py:
#    the build and the top-K columns) and a table of medians;
# 2. the top-K chain's stamps at batch 8 / 256 on the patch, then main (tools/ddtree_stamps.py --chain:
#    when the sample CTAs' keys arrive and they exit, when the stream's CTAs start and the last exits);
# 3. the DDTree GPU tests on the patch (-n 8) in the time left;
# 4. the kernel cache's entries that main's checkout compiled or loaded into $OUT/kc (tools/kernel_cache.py;
#    for the next machine; the patched tree has a cache of its own, whose entries would not hit there).
# Everything in $OUT/l2pf.tgz (packed after each step: a call cut short still returns what it has).
set -u
R=$PWD; O=${OUT:?set OUT}; D=/tmp/l2pf; rm -rf $D; mkdir -p $D
export PYTHONPATH=$R PYTHONUNBUFFERED=1
T_START=$(date +%s)
LIMIT=${LIMIT:-575}  # seconds this script may take (less when the session has less device time)
left() { echo $(( LIMIT - ($(date +%s) - T_START) )); }
touch /tmp/l2pf-mark
# a carried kernel cache of an earlier call (run(carry=[".kcache"])): main's cubins compile no more
[ -f .kcache/kernel-cache.json ] && python tools/kernel_cache.py import .kcache
. research/patches/patched_tree.sh
patched_tree logits-l2-prefetch /tmp/t-l2pf
nvidia-smi -L
pack() { tar -C /tmp -czf $O/l2pf.tgz l2pf; }
B="--quick --no-reference --drafter random --topk threshold"
run() {  # run NAME DTYPE FRACTION FROM RUN (FRACTION, FROM: "" = the default)
  local t=$1 dt=$2 f=$3 fr=$4 i=$5 dd=$R tag=$1-$3-$4-$2-$5
  [ "$(left)" -gt 150 ] || { echo "bench $tag skipped: $(left) s left"; return; }
  if [ $t = main ]; then
    (cd $dd && timeout 60 python benchmarks/bench_ddtree.py $B --logits-dtype $dt --json $D/$tag.json > $D/$tag.log 2>&1)
  else
    dd=/tmp/t-l2pf
    (cd $dd && PYTHONPATH=$dd DRIVERLEVEL_CACHE_DIR=/tmp/kc-patched DRIVERLEVEL_TK_L2_PREFETCH=$f \
       DRIVERLEVEL_TK_L2_PREFETCH_FROM=$fr timeout 60 python benchmarks/bench_ddtree.py $B --logits-dtype $dt \
       --json $D/$tag.json > $D/$tag.log 2>&1)
  fi || echo "bench $tag failed: $(tail -n 2 $D/$tag.log)"
}
t0=$(date +%s)
for i in 1 2; do
  run main float32 "" "" $i
  run l2pf float32 0.4 "" $i
  if [ "${SHORT:-0}" != 1 ]; then  # SHORT=1: main against the default fraction, fp32 only
    run l2pf float32 0.2 "" $i; run l2pf float32 0.4 0 $i; run l2pf float32 0 "" $i
    run main bfloat16 "" "" $i; run l2pf bfloat16 0.4 "" $i
  fi
done
echo "benches: $(( $(date +%s) - t0 )) s"; pack
ab() {  # ab LABEL MAIN-TAG PATCH-TAG (the tags without the run number)
  echo "=== main vs $1"
  python tools/bench_ddtree_ab.py $D/$2-1.json $D/$2-2.json --vs $D/$3-1.json $D/$3-2.json 2>&1 | grep -E 'build|top'
}
ab "fraction 0.4" main---float32 l2pf-0.4--float32
ab "fraction 0.2" main---float32 l2pf-0.2--float32
ab "fraction 0.4 from tile 0" main---float32 l2pf-0.4-0-float32
ab "fraction 0 (off)" main---float32 l2pf-0--float32
ab "fraction 0.4, bf16" main---bfloat16 l2pf-0.4--bfloat16
python - $D <<'PY'
import glob, json, statistics as st, sys
D = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{D}/*.json")):
    name = f.split("/")[-1][:-len(".json")].rsplit("-", 1)[0]
    for r in json.load(open(f))["results"] if isinstance(json.load(open(f)), dict) else json.load(open(f)):
        if r.get("topk") == "threshold":
            rows.setdefault((name, r["batch"], r["budget"]), []).append((r["gpu_us"]["build"], r.get("topk_read_tb_s")))
print("build µs and top-K TB/s, medians of the runs")
for k in sorted(rows):
    b = st.median(x[0] for x in rows[k]); tb = st.median(x[1] for x in rows[k] if x[1] is not None) if any(x[1] for x in rows[k]) else 0
    print(f"  {k[0]:24s} batch {k[1]} budget {k[2]:>3}: build {b:6.1f} µs  top-K {tb:4.2f} TB/s")
PY
pack
for t in l2pf main; do dd=$R; c=""; [ $t != main ] && dd=/tmp/t-l2pf && c=/tmp/kc-patched
  [ "$(left)" -gt 100 ] || { echo "stamps of $t skipped: $(left) s left"; continue; }
  (cd $dd && export PYTHONPATH=$dd && { [ -z "$c" ] || export DRIVERLEVEL_CACHE_DIR=$c; } && timeout 90 python tools/ddtree_stamps.py --batch 8 --budget 256 --drafter random --chain --flush read \
     --repeat 3 > $D/chain-$t.txt 2>&1)
  echo "--- chain of $t, batch 8 / 256 (µs first / median / last)"
  grep -E '^(stream|sample|build merge|build sorted|build nodes|late launch)' $D/chain-$t.txt | head -n 14
  pack
done
echo "--- DDTree GPU tests on the patch"
lt=$(( $(left) - 20 )); [ $lt -gt 240 ] && lt=240
if [ $lt -gt 30 ]; then
(cd /tmp/t-l2pf && PYTHONPATH=/tmp/t-l2pf DRIVERLEVEL_CACHE_DIR=/tmp/kc-patched timeout $lt python -m pytest -q -m gpu -p no:cacheprovider $(xdist_opt) \
   tests/test_ddtree_gpu.py tests/test_ddtree_robust_gpu.py > $D/tests.log 2>&1; tail -n 3 $D/tests.log)
else
  echo "tests skipped: $(left) s left"
fi
pack
python tools/kernel_cache.py export $O/kc --since /tmp/l2pf-mark
