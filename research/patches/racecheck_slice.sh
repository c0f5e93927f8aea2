#!/usr/bin/env bash
# compute-sanitizer racecheck of a slice of one GPU test file, in JOBS processes side by side on the
# one GPU: `OUT=$OUT FIRST=46 LAST=115 bash research/patches/racecheck_slice.sh [FILE]` from the
# repository root, on the device machine. FILE defaults to tests/test_ddtree_gpu.py; FIRST and LAST
# are 1-based positions in its collection order (`pytest --collect-only -q -m gpu`), both included.
# The seventy-fifth session's racecheck ran tests 1-45 and 116-130 of test_ddtree_gpu.py (its 130
# tests); 46-115 have never run under racecheck, hence the defaults.
#   JOBS=4        processes, each a round-robin share of the slice (racecheck's time is mostly the
#                 instrumented kernels and the host's checks of them; shares keep the slow tests
#                 at the file's end apart)
#   LIMIT=500     seconds each process may run (a process stopped by it lists the tests it passed)
#   KERNEL_CACHE_IN=DIR  import an exported kernel cache first (tools/kernel_cache.py), so that no
#                 test waits for NVRTC
# Each process writes $OUT/racecheck-J.log; the last lines printed are, per process, its pytest
# summary and racecheck's hazard summary. Any hazard is a failure to look into, not noise.
set -u
export OUT="${OUT:?set OUT}" PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
FILE="${1:-tests/test_ddtree_gpu.py}"
FIRST="${FIRST:-46}" LAST="${LAST:-115}" JOBS="${JOBS:-4}" LIMIT="${LIMIT:-500}"
if [[ -n "${KERNEL_CACHE_IN:-}" ]]; then
  python tools/kernel_cache.py import "$KERNEL_CACHE_IN" | tail -n 1
fi
mapfile -t ALL < <(python -m pytest --collect-only -q -m gpu -p no:cacheprovider "$FILE" | grep '::')
(( ${#ALL[@]} > 0 )) || { echo "no test collected from $FILE"; exit 1; }
(( LAST > ${#ALL[@]} )) && LAST=${#ALL[@]}
SLICE=("${ALL[@]:$((FIRST - 1)):$((LAST - FIRST + 1))}")
echo "$FILE: ${#ALL[@]} tests; racecheck of $FIRST-$LAST (${#SLICE[@]}) in $JOBS processes, $LIMIT s each"
for ((j = 0; j < JOBS; j++)); do
  share=()
  for ((i = j; i < ${#SLICE[@]}; i += JOBS)); do share+=("${SLICE[$i]}"); done
  (( ${#share[@]} > 0 )) || continue
  timeout "$LIMIT" compute-sanitizer --tool racecheck --report-api-errors no \
    python -m pytest -v -m gpu -p no:cacheprovider "${share[@]}" > "$OUT/racecheck-$j.log" 2>&1 &
done
wait
for ((j = 0; j < JOBS; j++)); do
  f="$OUT/racecheck-$j.log"; [[ -f $f ]] || continue
  echo "--- process $j: $(grep -c ' PASSED' "$f") passed, $(grep -c -E ' FAILED| ERROR' "$f") failed"
  grep -E "RACECHECK SUMMARY|ERROR SUMMARY|[0-9]+ (passed|failed|skipped)" "$f" | tail -n 3
done
