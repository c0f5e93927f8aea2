#!/usr/bin/env bash
# Fiftieth session: stream-scan-bf16set.patch (the threshold stream's candidate test and staging;
# research/patches/README.md) against main, in one device call. From the repository root, $OUT set:
#   bash research/patches/call_stream_scan.sh     (at most LIMIT s, default 570; give the run tool LIMIT + 40)
# 1. bench_ddtree --quick (threshold, random drafter) on main and on the patch, fp32 then bf16,
#    interleaved main, patch;
# 2. the whole GPU suite on the patch (-n 8, forward);
# 3. while time is left: the DDTree GPU tests on the patch, reversed (one process), and a second
#    bench round;
# 4. the kernel cache's entries this call compiled, into $OUT/kc (tools/kernel_cache.py).
# Everything in $OUT/ss.tgz (packed after each step: a call cut short still returns what it has).
set -u
R=$PWD; O=${OUT:?set OUT}; D=/tmp/ss; rm -rf $D; mkdir -p $D
export PYTHONUNBUFFERED=1
T_START=$(date +%s)
LIMIT=${LIMIT:-570}
[[ "$LIMIT" =~ ^[1-9][0-9]*$ ]] || { echo "call_stream_scan.sh: LIMIT='$LIMIT' must be a positive number of seconds" >&2; exit 2; }
left() { echo $(( LIMIT - ($(date +%s) - T_START) )); }
pack() { tar -C /tmp -czf $O/ss.tgz ss; }
touch /tmp/ss-mark
[ -f .kcache/kernel-cache.json ] && PYTHONPATH=$R python tools/kernel_cache.py import .kcache
. research/patches/patched_tree.sh
P=/tmp/t-ss
patched_tree stream-scan-bf16set $P
nvidia-smi -L
B="--quick --no-reference --drafter random --topk threshold"
bench_round() {  # bench_round I: fp32 then bf16, main then patch
  local i=$1 dt t src
  for dt in float32 bfloat16; do
    for t in main patch; do
      [ "$(left)" -gt 60 ] || { echo "bench $t $dt $i skipped: $(left) s left"; continue; }
      src=$R; [ $t = patch ] && src=$P
      (cd $src && PYTHONPATH=$src timeout 70 python benchmarks/bench_ddtree.py $B --logits-dtype $dt \
         --json $D/$t-$dt-$i.json > $D/$t-$dt-$i.log 2>&1) || echo "bench $t $dt $i failed: $(tail -n 2 $D/$t-$dt-$i.log)"
    done
  done
  echo "bench round $i done: $(left) s left"
}
bench_round 1
pack
pack
(cd $P && PYTHONPATH=$P timeout $(( $(left) > 60 ? $(left) - 20 : 10 )) python -m pytest -q -m gpu -p no:cacheprovider \
   $(xdist_opt) tests > $D/suite.txt 2>&1)
echo "patch, whole GPU suite forward: $(tail -n 1 $D/suite.txt)"; grep -E '^FAILED|^ERROR' $D/suite.txt | head -n 10
pack
if [ "$(left)" -gt 80 ]; then
  (cd $P && PYTHONPATH=$P timeout $(( $(left) - 30 )) python -m pytest -q -m gpu -p no:cacheprovider --reverse-order \
     tests/test_ddtree_robust_gpu.py tests/test_ddtree_gpu.py > $D/ddtree-reversed.txt 2>&1)
  echo "patch, DDTree GPU tests reversed: $(tail -n 1 $D/ddtree-reversed.txt)"; grep -E '^FAILED' $D/ddtree-reversed.txt | head -n 5
else
  echo "DDTree reversed skipped: $(left) s left"
fi
pack
[ "$(left)" -gt 150 ] && bench_round 2
python - $D <<'PY'
import glob, json, statistics as st, sys
D = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{D}/*-[12].json")):
    tree, dt, _ = f.split("/")[-1][:-5].split("-")
    for r in json.load(open(f))["results"]:
        g = r["gpu_us"]
        rows.setdefault((dt, r["batch"], r["budget"]), {}).setdefault(tree, []).append((g["build"], g.get("topk", float("nan"))))
print("median GPU µs of the runs: build (top-K)")
for k in sorted(rows):
    cells = []
    for tree in ("main", "patch"):
        v = rows[k].get(tree, [])
        cells.append(f"{tree} {st.median(x[0] for x in v):6.1f} ({st.median(x[1] for x in v):5.1f}) n={len(v)}" if v else f"{tree} -")
    print(f"  {k[0]:>8} batch {k[1]} budget {k[2]:>3}: " + "   ".join(cells))
PY
pack
(cd $R && PYTHONPATH=$R python tools/kernel_cache.py export $O/kc --since /tmp/ss-mark)
pack
