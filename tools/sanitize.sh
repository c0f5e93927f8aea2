#!/usr/bin/env bash
# compute-sanitizer over groups of GPU tests: memcheck (out-of-bounds and misaligned device accesses,
# the kernels fed corrupted metadata on purpose included), racecheck (shared-memory hazards), synccheck
# (barriers a warp or CTA cannot all reach) and initcheck (reads of device memory never written).
#
#   tools/sanitize.sh [OPTIONS] [TOOL:GROUP ...]     these runs (default: $PLAN)
#   tools/sanitize.sh -h | --help                    this text (nothing run)
#
# Options (anywhere before a `--`; the run names follow them or mix with them):
#   -k EXPR         a pytest -k expression that replaces the groups' own (once), to narrow a run to one test, e.g.
#                   -k 'test_build_matches_reference and 3001' racecheck:ddtree-all (-k '': the files whole)
#   -t, --timeout S seconds per run (default 180: the default plan's six runs take at most 9 minutes with
#                   --jobs 2; on an H100 with --jobs 2, memcheck:verify needed more than 100 s beside the
#                   ddtree runs and 62 s alone, 2026-12-05); a run cut short still reports the errors found so far
#   -j, --jobs N    runs at once (default 1): each run is its own process on the one GPU, time-sliced, so the
#                   seconds of a run grow while others run; the summary keeps the runs' order. On the H200
#                   seven runs side by side (five ddtree, verify and step runs, racecheck and synccheck of seven
#                   verify tests; most kernels compiled by a warm-up run) all ended within ~90 s (2026-12-05).
#                   Needs bash 4.3 or newer when N > 1; a run may be named once
#   -k, -t and -j take their value attached too (-kEXPR, -t300, -j2), --timeout=S and --jobs=N likewise.
#   The environment variables K, TIMEOUT and JOBS (these options' old form) are not read; a note says so
#   when one is set.
#
# Ctrl-C (SIGINT) or SIGTERM stops every run in progress, starts no other, and prints the summary so far
# (the runs stopped: "interrupted"); the exit status is then 130.
#
# GROUP is one of (the first ones sized for the default timeout under memcheck; the -all groups are wider)
#   ddtree      tests/test_ddtree_robust_gpu.py (corrupted metadata, non-finite rows, a poisoned counter) and of
#               tests/test_ddtree_gpu.py the chain and star extremes, the threshold fallback, compile, accept
#               and the dense commit (22 tests)
#   ddtree-all  both files whole (141 tests)
#   verify      of tests/test_verify_schedule_gpu.py and tests/test_verify_attention_gpu.py: corrupted and
#               over-long metadata, padded and ragged batches, int32 indices, the device schedule, 1,000
#               random graph steps on a poisoned workspace, more splits than tiles (23 tests)
#   verify-all  both files whole but the 200k prefix (270 tests)
#   verify-race of the same files the seven tests racecheck reported 59 false hazards on before the warp roles'
#               barriers were paired (2026-12-05): padded and ragged batches, int32 indices, more splits than
#               tiles (racecheck ~30 s on an H100; the whole verify group takes longer than 300 s)
#   step        tests/test_decode_step_fuzz_gpu.py (1,000 replays of a decode step on corrupted metadata)
#   runner      tests/test_runner_gpu.py (the demo model, both runners, lossless checks)
#
# Environment:
#   OUT        directory for the logs (default: a new temporary directory; a relative path is taken from
#              the directory sanitize.sh is called from); one log per run, TOOL-GROUP.log
#   PLAN       default runs (default "memcheck:ddtree memcheck:verify memcheck:step racecheck:ddtree
#              synccheck:ddtree racecheck:verify-race")
#   SANITIZER  the compute-sanitizer executable (default: on PATH, else under /usr/local/cuda*/bin)
#   PYTHON     the interpreter (default: python)
#   PRINT_LIMIT  reports printed per run (default 30)
#   SANITIZER_ARGS  more compute-sanitizer options for every run, e.g. "--racecheck-report hazard" (the
#              hazards with their threads) or "--racecheck-detect-level info"
#   LINEINFO=1 compile with -lineinfo (DRIVERLEVEL_LINEINFO=1; on/true/yes too) so that reports name
#              source lines; off by default because it is a cache key of its own: every kernel is
#              compiled again
# Arguments and settings are checked before anything is looked for or run (exit 2).
#
# Runs from the checkout with PYTHONPATH set to it (nothing installed). Each run is
#   compute-sanitizer --tool TOOL --error-exitcode 97 --print-limit 30 PYTHON -m pytest -q -m gpu GROUP...
# and the summary table last gives per run: the status (clean, ERRORS, test failures, timeout, no-pass:
# no test passed, e.g. all skipped because no GPU was visible, or none selected), the seconds, and the
# sanitizer's own summary line. The exit status is non-zero if any run was not clean.
set -uo pipefail
skip=0
for arg in "$@"; do  # -h / --help anywhere before a `--` (not as an option's value): the header above, without
  # its comment marks; nothing run
  if [ "$skip" = 1 ]; then skip=0; continue; fi
  case "$arg" in
    --) break ;;
    -k|-t|--timeout|-j|--jobs) skip=1 ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed -n 's/^# \{0,1\}//p'; exit 0 ;;
  esac
done
export PYTHONUNBUFFERED=1
case "${OUT:-}" in /*|"") OUT_ARG="${OUT:-}" ;; *) OUT_ARG="$PWD/$OUT" ;; esac  # (relative: the caller's directory)
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
usage_error() { echo "sanitize.sh: $*" >&2; exit 2; }
# LINEINFO takes what DRIVERLEVEL_LINEINFO takes
case "$(echo "${LINEINFO:-}" | tr '[:upper:]' '[:lower:]' | tr -d '[:space:]')" in
  1|on|true|yes) export DRIVERLEVEL_LINEINFO=1 ;;
  ""|0|off|false|no) ;;
  *) usage_error "LINEINFO='${LINEINFO}' is not understood: use 1, on, true or yes, or 0, off, false or no" ;;
esac
TIMEOUT_S=180; JOBS_N=1; K_SET=0; K_EXPR=""; RUNS=()
set_k() {  # the one -k expression
  [ "$K_SET" = 0 ] || usage_error "-k given twice: join the expressions with 'or' / 'and' into one"
  K_SET=1; K_EXPR="$1"
}
while [ $# -gt 0 ]; do  # options and run names, in any order; everything after `--` is a run name
  case "$1" in
    -k) [ $# -ge 2 ] || usage_error "-k needs an expression (-k '' for the group files whole)"; set_k "$2"; shift 2 ;;
    -k?*) set_k "${1#-k}"; shift ;;
    -t|--timeout) [ $# -ge 2 ] || usage_error "$1 needs a number of seconds"; TIMEOUT_S="$2"; shift 2 ;;
    --timeout=*) TIMEOUT_S="${1#*=}"; shift ;;
    -t?*) TIMEOUT_S="${1#-t}"; shift ;;
    -j|--jobs) [ $# -ge 2 ] || usage_error "$1 needs a number of runs at once"; JOBS_N="$2"; shift 2 ;;
    --jobs=*) JOBS_N="${1#*=}"; shift ;;
    -j?*) JOBS_N="${1#-j}"; shift ;;
    --) shift; RUNS+=("$@"); break ;;
    -?*) usage_error "unknown option '$1' (-h for help)" ;;
    *) RUNS+=("$1"); shift ;;
  esac
done
whole() { [[ "$1" =~ ^[0-9]+$ ]] && (( 10#$1 > 0 )); }  # a whole number >= 1 (leading zeros taken)
whole "$TIMEOUT_S" || usage_error "--timeout '$TIMEOUT_S' must be a whole number of seconds, 1 or more"
whole "$JOBS_N" || usage_error "--jobs '$JOBS_N' must be a whole number of runs at once, 1 or more"
TIMEOUT_S=$((10#$TIMEOUT_S)); JOBS_N=$((10#$JOBS_N))
if [ "$JOBS_N" -gt 1 ] && ! (( BASH_VERSINFO[0] > 4 || (BASH_VERSINFO[0] == 4 && BASH_VERSINFO[1] >= 3) )); then
  usage_error "--jobs $JOBS_N needs bash 4.3 or newer (wait -n); this is $BASH_VERSION"
fi
PY="${PYTHON:-python}"

DDTREE_K="corrupted or poisoned or nonfinite or dense_commit or chain_and_star or threshold_fallback"
DDTREE_K="$DDTREE_K or compile_matches or accept_from_target or commit_dense"
VERIFY_K="corrupted or more_than_max_q or padded or one_long or int32_index or device_schedule or 1000_random"
VERIFY_K="$VERIFY_K or pool_of_pool_bytes or batches_ragged or more_splits"
VERIFY_RACE_K="(padded or int32_index or batches_ragged or more_splits) and not 200k"
group_args() {  # the pytest arguments of a group
  case "$1" in
    ddtree|ddtree-all) echo "tests/test_ddtree_robust_gpu.py tests/test_ddtree_gpu.py" ;;
    verify|verify-all|verify-race) echo "tests/test_verify_schedule_gpu.py tests/test_verify_attention_gpu.py" ;;
    step)   echo "tests/test_decode_step_fuzz_gpu.py" ;;
    runner) echo "tests/test_runner_gpu.py" ;;
    *) return 1 ;;
  esac
}
group_k() {  # the -k expression of a group that takes one
  case "$1" in
    ddtree) echo "$DDTREE_K" ;;
    verify) echo "$VERIFY_K" ;;
    verify-all) echo "not 200k" ;;
    verify-race) echo "$VERIFY_RACE_K" ;;
  esac
}

[ ${#RUNS[@]} -eq 0 ] && read -r -a RUNS <<< "${PLAN-memcheck:ddtree memcheck:verify memcheck:step racecheck:ddtree synccheck:ddtree racecheck:verify-race}"
[ ${#RUNS[@]} -eq 0 ] && usage_error "no run to do (PLAN is empty): name TOOL:GROUP pairs"
for run in "${RUNS[@]}"; do  # every run checked before anything is looked for or run
  case "$run" in *:*) ;; *)
    usage_error "'$run' is not a TOOL:GROUP pair (e.g. memcheck:ddtree)" ;; esac
  tool="${run%%:*}"; group="${run#*:}"
  case "$tool" in memcheck|racecheck|synccheck|initcheck) ;; *)
    usage_error "unknown tool '$tool' in '$run' (memcheck, racecheck, synccheck, initcheck)" ;; esac
  group_args "$group" > /dev/null || usage_error "unknown group '$group' in '$run' (ddtree, ddtree-all, verify, verify-all, verify-race, step, runner)"
done
dups="$(printf '%s\n' "${RUNS[@]}" | sort | uniq -d | tr '\n' ' ')"
[ -z "$dups" ] || usage_error "a run named twice: ${dups% } (each run writes TOOL-GROUP.log)"
for old in K TIMEOUT JOBS; do  # (read no more: say so once, so that an old habit does not go unnoticed; before
  # the sanitizer is looked for, so that a machine without one shows it too)
  [ -n "${!old+x}" ] && echo "sanitize.sh: note: the environment's $old is not read (use the option: -h)" >&2
done
if [ -n "${SANITIZER:-}" ]; then
  SAN="$SANITIZER"
  [ -f "$SAN" ] && [ -x "$SAN" ] || usage_error "SANITIZER='$SAN' is not an executable file"
else
  SAN="$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n 1)"
  [ -n "$SAN" ] && [ -x "$SAN" ] || usage_error "no compute-sanitizer found (set SANITIZER to its path)"
fi
OUT_DIR="${OUT_ARG:-$(mktemp -d "${TMPDIR:-/tmp}/sanitize.XXXXXX")}"
mkdir -p "$OUT_DIR"

echo "compute-sanitizer: $SAN ($("$SAN" --version 2>/dev/null | grep -i version | head -n 1))"
one_run() {  # one TOOL:GROUP run, its log in $OUT_DIR; its summary line into the file $2; $3: its number
  local run=$1 tool group log args kexpr start end rc status note extra more tpid
  tool="${run%%:*}"; group="${run#*:}"
  log="$OUT_DIR/$tool-$group.log"
  read -r -a args <<< "$(group_args "$group")"
  if [ "$K_SET" = 1 ]; then kexpr="$K_EXPR"; else kexpr="$(group_k "$group")"; fi
  [ -n "$kexpr" ] && args+=(-k "$kexpr")
  echo
  echo "=== $tool $group: ${args[*]}"
  start=$(date +%s)
  extra=()  # memcheck's host API checks: driverlevel probes cuFuncGetParamInfo and cuPointerGetAttribute on purpose
  [ "$tool" = memcheck ] && extra=(--report-api-errors no)
  read -r -a more <<< "${SANITIZER_ARGS:-}"
  extra+=("${more[@]}")
  # (in the background, its pid on file, so that an interrupt can stop it: timeout runs the command in a
  # process group of its own, which a terminal's Ctrl-C does not reach; a TERM to timeout stops the group)
  timeout -k 10 "$TIMEOUT_S" "$SAN" --tool "$tool" "${extra[@]}" --error-exitcode 97 --print-limit "${PRINT_LIMIT:-30}" \
    "$PY" -m pytest -q -m gpu -p no:cacheprovider "${args[@]}" > "$log" 2>&1 &
  tpid=$!
  echo "$tpid" > "$LINES_DIR/pid.$3"
  while :; do  # (a trap ends a wait early: wait again while the run lives)
    wait "$tpid"; rc=$?
    kill -0 "$tpid" 2>/dev/null || break
  done
  rm -f "$LINES_DIR/pid.$3"
  end=$(date +%s)
  [ "$JOBS_N" -gt 1 ] && echo "=== $tool $group done:"
  tail -n 5 "$log"
  case "$rc" in
    0) status="clean"  # (pytest -q's last line: "N passed", not only skipped or deselected ones)
       grep -Eq '(^|[^0-9])[1-9][0-9]* passed' "$log" || status="no-pass" ;;
    5) status="no-pass" ;;  # (pytest: no test collected or selected)
    97) status="ERRORS" ;;
    124|137) status="timeout" ;;
    *) status="FAIL($rc)" ;;
  esac
  [ -f "$LINES_DIR/interrupted" ] && status="interrupted"
  # the sanitizer's summary line: "ERROR SUMMARY: 0 errors", racecheck's "RACECHECK SUMMARY: ..."
  note="$(grep -E '(ERROR|RACECHECK) SUMMARY' "$log" | tail -n 1 | sed 's/^=* *//' | cut -c1-80)"
  [ -z "$note" ] && note="(no sanitizer summary) $(grep -E 'passed|failed|error' "$log" | tail -n 1 | cut -c1-60)"
  [ "$status" = no-pass ] && note="(no test passed) $(grep -E 'skipped|deselected|no tests ran' "$log" | tail -n 1 | cut -c1-60)"
  printf '%-10s %-11s %-10s %5ss  %s\n' "$tool" "$group" "$status" "$((end - start))" "$note" > "$2"
}
LINES_DIR=$(mktemp -d "${TMPDIR:-/tmp}/sanitize-lines.XXXXXX")
INTERRUPTED=0
on_interrupt() {  # stop every run in progress (TERM to its timeout, which stops its group); start no other
  INTERRUPTED=1
  : > "$LINES_DIR/interrupted"
  local f
  for f in "$LINES_DIR"/pid.*; do [ -f "$f" ] && kill -TERM "$(cat "$f")" 2>/dev/null; done
  return 0
}
trap on_interrupt INT TERM
i=0
for run in "${RUNS[@]}"; do
  [ "$INTERRUPTED" = 1 ] && break
  i=$((i + 1))
  if [ "$JOBS_N" -gt 1 ]; then
    while [ "$(jobs -rp | wc -l)" -ge "$JOBS_N" ] && [ "$INTERRUPTED" = 0 ]; do wait -n; done
    [ "$INTERRUPTED" = 1 ] && { i=$((i - 1)); break; }
    { trap '' INT TERM; one_run "$run" "$LINES_DIR/$i" "$i"; } &  # (the main shell's trap stops its run)
  else
    one_run "$run" "$LINES_DIR/$i" "$i"
  fi
done
while [ -n "$(jobs -rp)" ]; do  # (a trap ends a wait early; a run started just before it may need the TERM too)
  wait
  [ "$INTERRUPTED" = 1 ] && on_interrupt
done
SUMMARY=()
FAILED=0
for j in $(seq 1 "$i"); do
  line="$(cat "$LINES_DIR/$j" 2>/dev/null || echo "(run $j left no summary)")"
  SUMMARY+=("$line")
  [ "$(echo "$line" | awk '{print $3}')" = clean ] || FAILED=1
done
rm -rf "$LINES_DIR"

echo
echo "=== summary (logs in $OUT_DIR)"
printf '%-10s %-11s %-10s %6s  %s\n' tool group status time "sanitizer summary"  # (11: verify-race)
for line in "${SUMMARY[@]}"; do echo "$line"; done
if [ "$INTERRUPTED" = 1 ]; then
  [ "$i" -lt "${#RUNS[@]}" ] && echo "(interrupted: not started: ${RUNS[*]:$i})"
  exit 130
fi
exit "$FAILED"
