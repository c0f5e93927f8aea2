#!/usr/bin/env bash
# Forty-fourth session, device call 1: which row-merge sort sizes give ddtree_build racecheck hazards.
# bitonic_desc syncs the P sorting threads on named barrier 1 (P = next power of two >= K); the warps
# past P skip it. K <= 32: no named barrier; K > 256: P = 512, every warp passes it. If the hazards
# appear only for 32 < K <= 256, the named barrier's partial participation is what racecheck trips on.
# Then: one hazard-mode report with thread ids, memcheck with --report-api-errors no, and the
# verify-attention benchmark with both tiles.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 DRIVERLEVEL_LINEINFO=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/race"
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer | head -n 1)
echo "sanitizer: $SAN"; "$SAN" --version | tail -n 1
T=tests/test_ddtree_gpu.py::test_build_matches_reference
IDS="float32-300-3-1-2-False-threshold bfloat16-500-3-2-2-True-threshold float32-1000-4-3-3-False-threshold
bfloat16-3000-3-16-4-False-threshold float32-3001-3-40-2-False-threshold float32-20000-6-64-5-True-threshold
bfloat16-8000-5-100-3-True-threshold float32-5000-4-481-2-False-threshold float32-300-4-512-2-False-threshold
float32-5000-4-481-2-False-chunked float32-3001-3-40-2-False-chunked"
t0=$(date +%s)
# warm the kernel cache (plain run, in parallel)
for id in $IDS; do timeout 200 python -m pytest -q -p no:cacheprovider "$T[$id]" > "$OUT/race/plain-$id.log" 2>&1 & done
wait
echo "plain runs: $(( $(date +%s) - t0 )) s"; for id in $IDS; do echo "  $id: $(tail -n 1 "$OUT/race/plain-$id.log")"; done
t0=$(date +%s)
for id in $IDS; do
  timeout 150 "$SAN" --tool racecheck --print-limit 6 python -m pytest -q -p no:cacheprovider "$T[$id]" > "$OUT/race/rc-$id.log" 2>&1 &
done
wait
echo "racecheck runs: $(( $(date +%s) - t0 )) s"
for id in $IDS; do printf '  %-42s %s\n' "$id" "$(grep -h 'RACECHECK SUMMARY' "$OUT/race/rc-$id.log" | tail -n 1)"; done
t0=$(date +%s)
timeout 150 "$SAN" --tool racecheck --racecheck-report hazard --print-limit 60 python -m pytest -q -p no:cacheprovider \
  "$T[bfloat16-3000-3-16-4-False-threshold]" > "$OUT/race/hazard-k16.log" 2>&1
echo "hazard report: $(( $(date +%s) - t0 )) s; $(grep -c 'hazard detected' "$OUT/race/hazard-k16.log") lines"
grep -h "hazard detected\|Thread (" "$OUT/race/hazard-k16.log" | head -n 24
# the probe: every warp passes the sort's named barriers (research/probes/sort_all_warps.patch)
rm -rf /tmp/probe && mkdir -p /tmp/probe && cp -r . /tmp/probe/ 2>/dev/null
( cd /tmp/probe && patch -s -p1 < research/probes/sort_all_warps.patch ) || echo "probe patch failed"
t0=$(date +%s)
for id in float32-3001-3-40-2-False-threshold float32-20000-6-64-5-True-threshold bfloat16-8000-5-100-3-True-threshold; do
  ( cd /tmp/probe && DDT_EXTRA_DEFINES="DDT_SORT_ALL_WARPS=1" PYTHONPATH=/tmp/probe:/tmp/probe/research/probes timeout 200 \
    "$SAN" --tool racecheck --print-limit 6 python -m pytest -q -p no:cacheprovider -p ddt_defines "$T[$id]" \
    > "$OUT/race/probe-$id.log" 2>&1 ) &
done
wait
echo "probe runs (sort over all warps): $(( $(date +%s) - t0 )) s"
for f in "$OUT"/race/probe-*.log; do printf '  %-52s %s | %s\n' "$(basename "$f")" "$(grep -h 'RACECHECK SUMMARY' "$f" | tail -n 1)" "$(tail -n 1 "$f")"; done
tar czf "$OUT/race.tgz" -C "$OUT" race && rm -rf "$OUT/race"
t0=$(date +%s)
OUT=$OUT/san bash tools/sanitize.sh --timeout 90 memcheck:ddtree 2>&1 | tail -n 6
echo "memcheck: $(( $(date +%s) - t0 )) s"
t0=$(date +%s)
unset DRIVERLEVEL_LINEINFO
timeout 170 python benchmarks/bench_attention.py --quick --tile both --json "$OUT/bench_attention.json" > "$OUT/bench_attention.txt" 2>&1
echo "bench_attention rc=$? $(( $(date +%s) - t0 )) s"; tail -n 40 "$OUT/bench_attention.txt"
