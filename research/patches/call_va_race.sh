#!/usr/bin/env bash
# Prepared in the forty-fifth session (the device was paused before it ran): the verify kernel's
# racecheck barriers (va-race-barriers.patch, research/patches/README.md) in a patched copy of the
# tree: racecheck and synccheck on the verify groups and the verify and step GPU tests on the patch
# (side by side), then, if the time allows, an A/B of bench_tiles --quick (this GPU's tiles and
# sm_120's) against main, interleaved twice, then the same GPU tests reversed in the time left.
# From the repository root, $OUT set:
#   bash research/patches/call_va_race.sh     (at most ~575 s; give the run tool 600 s)
#   LIMIT=S for another budget; SKIP_SANITIZE=1 leaves out racecheck / synccheck (the forty-eighth
#   session ran them: 0 hazards on the seven tests), TESTS_S=S the forward tests' limit (default 250;
#   they took ~250 s beside the sanitizers, ~150 s alone is a guess), so that the A/B fits
# Logs in $OUT/va-race.tgz (packed after every phase: a call cut short still returns them); the
# kernel cache's entries that main's checkout compiled or loaded in $OUT/kc (the patched tree has
# a cache of its own: its entries would never hit in main's checkout); the summary lines last.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
. research/patches/patched_tree.sh
OUT=${OUT:-/tmp/out}; L=/tmp/va-race; rm -rf "$L"; mkdir -p "$L"
T_START=$(date +%s)
LIMIT=${LIMIT:-575}  # seconds this script may take (less when the session has less device time)
[[ "$LIMIT" =~ ^[1-9][0-9]*$ ]] || { echo "call_va_race.sh: LIMIT='$LIMIT' must be a positive number of seconds" >&2; exit 2; }
left() { echo $(( LIMIT - ($(date +%s) - T_START) )); }
pack() { tar -czf "$OUT/va-race.tgz" -C "$L" .; }
touch /tmp/va-race-mark
# a carried kernel cache of an earlier call (run(carry=[".kcache"])): main's cubins compile no more
[ -f .kcache/kernel-cache.json ] && python tools/kernel_cache.py import .kcache
MAIN=$PWD; P=/tmp/t-va-race
patched_tree va-race-barriers $P
VK="padded or int32_index or batches_ragged or more_splits"
t0=$(date +%s)
(cd $P && export PYTHONPATH=$P DRIVERLEVEL_CACHE_DIR=/tmp/kc-patched
 if [ "${SKIP_SANITIZE:-0}" != 1 ]; then
 OUT="$L/race7" LINEINFO=1 PRINT_LIMIT=200 bash tools/sanitize.sh -k "$VK" --timeout 200 racecheck:verify-all > "$L/race7.txt" 2>&1 &
 OUT="$L/race23" LINEINFO=1 PRINT_LIMIT=200 bash tools/sanitize.sh --jobs 2 --timeout 200 racecheck:verify synccheck:verify \
   > "$L/race23.txt" 2>&1 &
 fi
 timeout ${TESTS_S:-250} python -m pytest -q -m gpu -p no:cacheprovider -n 6 tests/test_verify_attention_gpu.py tests/test_verify_schedule_gpu.py \
   tests/test_decode_step_fuzz_gpu.py > "$L/tests.txt" 2>&1 &
 wait)
pack
echo "sanitizers and tests: $(( $(date +%s) - t0 )) s; tests: $(tail -n 1 "$L/tests.txt")"
grep -E 'FAILED|Error' "$L/tests.txt" | head -n 10
for f in "$L"/race7.txt "$L"/race23.txt; do [ -f "$f" ] || continue; sed -n '/=== summary/,$p' "$f" | tail -n +3; done
for f in "$L"/race*/*.log; do [ -f "$f" ] || continue; grep -E -m 6 -A 1 'Race reported|Barrier error' "$f" | head -n 12; done
if [ "$(left)" -gt 240 ]; then
  t0=$(date +%s)
  for r in 1 2; do
    for tree in main patch; do
      [ "$(left)" -gt 125 ] || { echo "bench $tree $r skipped: $(left) s left"; continue; }  # (a bench may take 110 s)
      if [ $tree = main ]; then d=$MAIN; c=""; else d=$P; c=/tmp/kc-patched; fi
      (cd "$d" && PYTHONPATH=$d DRIVERLEVEL_CACHE_DIR=${c:-${DRIVERLEVEL_CACHE_DIR:-$HOME/.cache/driverlevel}} timeout 110 \
         python benchmarks/bench_tiles.py --quick --json "$L/tiles-$tree-$r.json" > "$L/tiles-$tree-$r.txt" 2>&1) \
        || echo "bench $tree $r failed: $(tail -n 2 "$L/tiles-$tree-$r.txt")"
    done
  done
  echo "benches: $(( $(date +%s) - t0 )) s"
else
  echo "benches skipped: $(left) s left"
fi
pack
# what time is left: the verify and step GPU tests again, serially in reverse order
if [ "$(left)" -gt 40 ]; then
  lt=$(( $(left) - 15 ))
  (cd $P && PYTHONPATH=$P DRIVERLEVEL_CACHE_DIR=/tmp/kc-patched timeout $lt python -m pytest -q -m gpu -p no:cacheprovider \
     --reverse-order tests/test_verify_attention_gpu.py tests/test_verify_schedule_gpu.py tests/test_decode_step_fuzz_gpu.py \
     > "$L/tests-reversed.txt" 2>&1)
  echo "reversed ($lt s allowed): $(tail -n 1 "$L/tests-reversed.txt")"; grep -E 'FAILED' "$L/tests-reversed.txt" | head -n 5
fi
pack
(cd "$MAIN" && PYTHONPATH=$MAIN python tools/kernel_cache.py export "$OUT/kc" --since /tmp/va-race-mark)
python - "$L" <<'PY'
import json, sys, glob, statistics as st
L = sys.argv[1]
def load(tree):
    out = {}
    for f in sorted(glob.glob(f"{L}/tiles-{tree}-*.json")):
        for r in json.load(open(f))["results"]:
            out.setdefault((r["tile_name"], r["heads"], r["batch"], r["prefix"], r["draft_tokens"]), []).append(r["median_ms"])
    return out
a, b = load("main"), load("patch")
print("bench_tiles --quick, medians of the runs (tile, heads, batch, prefix, draft tokens)")
for k in sorted(set(a) & set(b), key=str):
    ma, mb = st.median(a[k]), st.median(b[k])
    print(f"{str(k):40s} main {ma:8.4f} patch {mb:8.4f} ms  patch/main {mb / ma:6.3f}  runs {a[k]} {b[k]}")
PY
