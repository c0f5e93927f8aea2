#!/usr/bin/env bash
# Prepared in the forty-eighth session (not run: no device time left): commit-increasing-path.patch
# (ddtree_commit takes the accepted path's increasing prefix; research/patches/README.md) against main.
# From the repository root, $OUT set:
#   bash research/patches/call_commit_path.sh     (at most LIMIT s, default 400; give the run tool LIMIT + 40)
# 1. the DDTree GPU tests on the patch (tests/test_ddtree_robust_gpu.py, tests/test_ddtree_gpu.py; -n 8),
#    forward, then reversed (--reverse-order);
# 2. bench_ddtree --quick (threshold, random drafter, fp32) on main and on the patch, interleaved twice:
#    the commit column side by side (the patch adds one warp-0 read of accepted_nodes per CTA);
# 3. the kernel cache's entries that main's checkout compiled into $OUT/kc (tools/kernel_cache.py).
# Everything in $OUT/cp.tgz (packed after each step: a call cut short still returns what it has).
set -u
R=$PWD; O=${OUT:?set OUT}; D=/tmp/cp; rm -rf $D; mkdir -p $D
export PYTHONPATH=$R PYTHONUNBUFFERED=1
T_START=$(date +%s)
LIMIT=${LIMIT:-400}
[[ "$LIMIT" =~ ^[1-9][0-9]*$ ]] || { echo "call_commit_path.sh: LIMIT='$LIMIT' must be a positive number of seconds" >&2; exit 2; }
left() { echo $(( LIMIT - ($(date +%s) - T_START) )); }
pack() { tar -C /tmp -czf $O/cp.tgz cp; }
touch /tmp/cp-mark
[ -f .kcache/kernel-cache.json ] && python tools/kernel_cache.py import .kcache
. research/patches/patched_tree.sh
P=/tmp/t-cp
patched_tree commit-increasing-path $P
nvidia-smi -L
TESTS="tests/test_ddtree_robust_gpu.py tests/test_ddtree_gpu.py"
(cd $P && PYTHONPATH=$P DRIVERLEVEL_CACHE_DIR=/tmp/kc-patched timeout 150 python -m pytest -q -m gpu -p no:cacheprovider \
   $(xdist_opt) $TESTS > $D/tests.txt 2>&1)
echo "patch, forward: $(tail -n 1 $D/tests.txt)"; grep -E 'FAILED|Error' $D/tests.txt | head -n 10
pack
if [ "$(left)" -gt 120 ]; then
  (cd $P && PYTHONPATH=$P DRIVERLEVEL_CACHE_DIR=/tmp/kc-patched timeout 100 python -m pytest -q -m gpu -p no:cacheprovider \
     $(xdist_opt) --reverse-order $TESTS > $D/tests-reversed.txt 2>&1)
  echo "patch, reversed: $(tail -n 1 $D/tests-reversed.txt)"; grep -E 'FAILED' $D/tests-reversed.txt | head -n 5
fi
pack
B="--quick --no-reference --drafter random --topk threshold --logits-dtype float32"
for i in 1 2; do
  for t in main patch; do
    [ "$(left)" -gt 70 ] || { echo "bench $t $i skipped: $(left) s left"; continue; }
    if [ $t = main ]; then
      (cd $R && timeout 60 python benchmarks/bench_ddtree.py $B --json $D/$t-$i.json > $D/$t-$i.log 2>&1)
    else
      (cd $P && PYTHONPATH=$P DRIVERLEVEL_CACHE_DIR=/tmp/kc-patched timeout 60 python benchmarks/bench_ddtree.py $B \
         --json $D/$t-$i.json > $D/$t-$i.log 2>&1)
    fi || echo "bench $t $i failed: $(tail -n 2 $D/$t-$i.log)"
  done
done
pack
python - $D <<'PY'
import glob, json, statistics as st, sys
D = sys.argv[1]
rows = {}
for f in sorted(glob.glob(f"{D}/*-[12].json")):
    tree = f.split("/")[-1].split("-")[0]
    for r in json.load(open(f))["results"]:
        rows.setdefault((r["batch"], r["budget"]), {}).setdefault(tree, []).append((r["gpu_us"]["commit"], r["gpu_us"]["build"]))
print("median GPU µs of the runs: commit (build)")
for k in sorted(rows):
    cells = []
    for tree in ("main", "patch"):
        v = rows[k].get(tree, [])
        cells.append(f"{tree} {st.median(x[0] for x in v):5.1f} ({st.median(x[1] for x in v):5.1f})" if v else f"{tree} -")
    print(f"  batch {k[0]} budget {k[1]:>3}: " + "   ".join(cells))
PY
(cd $R && python tools/kernel_cache.py export $O/kc --since /tmp/cp-mark)
pack
