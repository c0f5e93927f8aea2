#!/usr/bin/env bash
# The GPU check: the one command to run on a GPU machine (install, GPU tests, benchmarks; logs under $OUT).
#
#   tools/gpu_check.sh [TEST_FILE ...]      GPU tests of these files (default: all of tests/)
#   tools/gpu_check.sh -h | --help          this text (nothing installed or run)
#
# Environment:
#   OUT            directory for the logs and JSON results (default: a new temporary directory)
#   BENCH          benchmarks to run after the tests, space-separated, e.g. "replay attention ddtree demo"
#                  (default: none). NAME runs benchmarks/bench_NAME.py --json $OUT/bench_NAME.json;
#                  "replay" runs `python -m driverlevel bench replay` (the same code);
#                  "demo" runs `python -m driverlevel capture-demo` unless benchmarks/bench_demo.py exists.
#   BENCH_ARGS_<NAME>   extra arguments for one benchmark, e.g. BENCH_ARGS_attention="--quick"
#   TEST_TIMEOUT   per-test timeout in seconds when pytest-timeout is installed (default 300)
#   SKIP_TESTS=1   run only the benchmarks (SKIP_TESTS, SKIP_INSTALL, TWICE, REVERSED and PACK take 1, on,
#                  true or yes, and 0, off, false, no or nothing; anything else is refused before anything
#                  runs)
#   SKIP_INSTALL=1 leave the Python environment as it is: no pip install (nor NVRTC_WHEEL's), the
#                  checkout on PYTHONPATH instead (this repository's own tests of the script run it so, since an editable install
#                  would replace whatever driverlevel the caller's environment holds)
#   TWICE=1        run the GPU tests a second time in reverse order (pytest --reverse-order)
#   REVERSED=1     run the GPU tests in reverse order only (the second half of a "twice" split over two
#                  runs of this script, e.g. under a time limit: the whole suite takes ~220 s forward, ~250 s
#                  reversed on an H200)
#   WORKERS=N      run the forward GPU tests in N processes on the one GPU (pytest-xdist's -n N, or auto /
#                  logical; needs pytest-xdist): on a fresh machine the suite is bound by NVRTC, whose
#                  compiles of the DDTree tests' own kernel variants (~15 s each) then run side by side.
#                  The reversed run stays in one process: it is the order-dependence check. Without
#                  pytest-xdist the forward run is serial and the summary says so.
#                  Only for a cold cache: the processes share the GPU by time slices, and every
#                  synchronizing test then waits for the others' slices. With every kernel in the cache
#                  (KERNEL_CACHE_IN from a whole earlier run) one process is faster. Reversed runs with
#                  every kernel cached on an H100: 120 s in one process (586 tests, fifty-third session),
#                  333 s with WORKERS_REVERSED=8 (630 tests, fifty-sixth); the metadata fuzz test alone
#                  2.6-3.6 s in one process, 145-240 s beside 7 other workers, near TEST_TIMEOUT.
#   WORKERS_REVERSED=N   the reversed run in N processes too (each runs its share last to first: a
#                  weaker order check, for a time limit the serial one does not fit)
#   PYTHON         the interpreter (default: python)
#   NVRTC_WHEEL    a local nvidia-cuda-nvrtc wheel to install first (pip install --no-deps), for a GPU
#                  machine without internet whose NVRTC is older than 13.4 (its kernels spill); the wheel
#                  is ~56 MiB, e.g. NVRTC_WHEEL=.wt/nvrtc/*.whl copied there with the checkout
#   KERNEL_CACHE_IN=DIR   import the kernel cache exported by an earlier machine (tools/kernel_cache.py
#                  import; DIR a folder copied with the checkout, holding an export: kernel-cache.json and
#                  its kernel-cache.tgz.N parts; without kernel-cache.json the step is skipped) before the
#                  tests: a fresh machine then compiles only what changed since
#   KERNEL_CACHE_OUT=DIR  after everything, export the cache entries this run compiled or loaded into
#                  DIR (e.g. $OUT/kc; parts of at most 15 MiB, small enough for a remote runner's
#                  file limits, and a manifest); after a partial run (-x stopped it, some files, REVERSED=1) that is only
#                  what the run touched
#   PACK=1         at the end, pack every file written directly under OUT into OUT/gpu_check-logs.tgz and
#                  remove the loose ones (folders under OUT, e.g. KERNEL_CACHE_OUT's, stay): for a remote
#                  runner that returns only a few files
#
# It installs the checkout with `pip install --no-deps --no-build-isolation -e .` into the current
# Python environment (an installed driverlevel there becomes this checkout, editable; falling back
# to PYTHONPATH=$PWD when that is impossible offline), prints `nvidia-smi -L` and
# `driverlevel info`, runs `pytest -m gpu -x` and the benchmarks, and prints a summary table
# last. The exit status is non-zero if any step failed; a test step in which no test passed (every
# test skipped, e.g. no GPU visible, or none selected) is a failure too. Relative paths (OUT, the
# test files, KERNEL_CACHE_IN / _OUT, NVRTC_WHEEL) are taken from the directory it is called from;
# it runs in the checkout's root.
set -uo pipefail
for arg in "$@"; do  # -h / --help anywhere: the header above, without its comment marks; nothing installed or run
  case "$arg" in -h|--help) sed -n '2,/^set -uo/p' "$0" | sed -n 's/^# \{0,1\}//p'; exit 0 ;; esac
done
usage_error() { echo "gpu_check.sh: $*" >&2; exit 2; }
flag() {  # flag NAME: sets F_NAME to 1 or 0 from the variable NAME; anything else refused (exit 2)
  local v
  v="$(printf '%s' "${!1:-}" | tr '[:upper:]' '[:lower:]' | tr -d '[:space:]')"
  case "$v" in
    1|on|true|yes) printf -v "F_$1" 1 ;;
    ""|0|off|false|no) printf -v "F_$1" 0 ;;
    *) usage_error "$1='${!1}' is not understood: use 1, on, true or yes, or 0, off, false or no" ;;
  esac
}
for name in SKIP_TESTS SKIP_INSTALL TWICE REVERSED PACK; do flag "$name"; done
for name in WORKERS WORKERS_REVERSED; do  # (what pytest-xdist's -n takes)
  [[ -z "${!name:-}" || "${!name}" =~ ^([1-9][0-9]*|auto|logical)$ ]] ||
    usage_error "$name='${!name}' must be a positive number of processes, auto or logical (pytest-xdist's -n)"
done
for arg in "$@"; do
  case "$arg" in -*) usage_error "unknown option '$arg': give test files (or -h for help)" ;; esac
done
CALLER_PWD="$PWD"
from_caller() {  # a path given relative to the directory gpu_check.sh was called from, made absolute
  case "$1" in /*|"") printf '%s' "$1" ;; *) printf '%s/%s' "$CALLER_PWD" "$1" ;; esac
}
OUT_DIR="$(from_caller "${OUT:-}")"
[[ -n "${KERNEL_CACHE_IN:-}" ]] && KERNEL_CACHE_IN="$(from_caller "$KERNEL_CACHE_IN")"
[[ -n "${KERNEL_CACHE_OUT:-}" ]] && KERNEL_CACHE_OUT="$(from_caller "$KERNEL_CACHE_OUT")"
NVRTC_WHEELS=()
if [[ -n "${NVRTC_WHEEL:-}" ]]; then  # (a glob, expanded where it was given; no word splitting: a path may hold spaces)
  saved_ifs=$IFS; IFS=
  for w in $NVRTC_WHEEL; do NVRTC_WHEELS+=("$(from_caller "$w")"); done
  IFS=$saved_ifs
fi
FILES=()
for arg in "$@"; do  # test files or node ids (file::test): those found from the caller's directory made absolute
  if [[ -e "$CALLER_PWD/${arg%%::*}" ]]; then FILES+=("$(from_caller "$arg")"); else FILES+=("$arg"); fi
done
export PYTHONUNBUFFERED=1
cd "$(dirname "${BASH_SOURCE[0]}")/.."

PY="${PYTHON:-python}"
OUT_DIR="${OUT_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")}"
mkdir -p "$OUT_DIR"
SUMMARY=()
FAILED=0

# run_step [--tests] NAME CMD...: run CMD, tee its output to $OUT_DIR/NAME.log, record status and time.
# With --tests (a pytest run) a run in which no test passed fails: "no-pass" (all skipped: no GPU
# visible, the driver did not start) or "no-tests" (pytest's exit 5: none collected or selected).
run_step() {
  local tests=0
  [[ "$1" == --tests ]] && { tests=1; shift; }
  local name="$1"; shift
  local log="$OUT_DIR/$name.log" start end rc status note
  echo
  echo "=== $name: $*"
  start=$(date +%s)
  "$@" 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  end=$(date +%s)
  case "$rc" in
    0) status="ok"
       if [[ $tests == 1 ]] && ! grep -Eq '(^|[^0-9])[1-9][0-9]* passed' "$log"; then status="no-pass"; FAILED=1; fi ;;
    *) status="FAIL($rc)"; FAILED=1
       if [[ $tests == 1 && $rc == 5 ]]; then status="no-tests"; fi ;;
  esac
  note="$(grep -v '^[[:space:]]*$' "$log" | tail -n 1 | cut -c1-110)"
  SUMMARY+=("$(printf '%-18s %-9s %5ss  %s' "$name" "$status" "$((end - start))" "$note")")
  return 0
}

# -- install ------------------------------------------------------------------------------
if [[ ${#NVRTC_WHEELS[@]} -gt 0 && $F_SKIP_INSTALL == 0 ]]; then
  if "$PY" -m pip install -q --no-deps "${NVRTC_WHEELS[@]}" >"$OUT_DIR/install-nvrtc.log" 2>&1; then
    SUMMARY+=("$(printf '%-18s %-9s %5s   %s' install-nvrtc ok - "$(basename "${NVRTC_WHEELS[0]}")")")
  else
    SUMMARY+=("$(printf '%-18s %-9s %5s   %s' install-nvrtc FAIL - "see install-nvrtc.log")"); FAILED=1
  fi
fi
if [[ $F_SKIP_INSTALL == 1 ]]; then
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  echo "SKIP_INSTALL=1: nothing installed; PYTHONPATH=$PYTHONPATH" >"$OUT_DIR/install.log"
  SUMMARY+=("$(printf '%-18s %-9s %5s   %s' install skipped - "SKIP_INSTALL=1: PYTHONPATH=$PWD")")
elif "$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$OUT_DIR/install.log" 2>&1; then
  SUMMARY+=("$(printf '%-18s %-9s %5s   %s' install ok - "pip install -e . (editable)")")
else
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
  SUMMARY+=("$(printf '%-18s %-9s %5s   %s' install fallback - "pip install -e . failed (see install.log): PYTHONPATH=$PWD")")
fi

echo "=== environment"
{
  nvidia-smi -L 2>&1 || echo "nvidia-smi not available"
  "$PY" - <<'EOF'
import importlib, platform
print("python", platform.python_version())
for name in ("driverlevel", "cuda.bindings", "numpy", "click", "torch", "cupy", "pytest", "pytest_timeout"):
    try:
        m = importlib.import_module(name)
        print(f"{name:15s} {getattr(m, '__version__', '?')}  {getattr(m, '__file__', '')}")
    except Exception as exc:  # noqa: BLE001
        print(f"{name:15s} not importable ({type(exc).__name__})")
EOF
} 2>&1 | tee "$OUT_DIR/environment.log"

run_step info "$PY" -m driverlevel info

CACHE_MARK="$(mktemp "${TMPDIR:-/tmp}/gpu_check-cache-mark.XXXXXX")"  # what the cache's entries newer than this are: this run's
if [[ -n "${KERNEL_CACHE_IN:-}" ]]; then
  if [[ -f "$KERNEL_CACHE_IN/kernel-cache.json" ]]; then
    run_step kernel-cache-in "$PY" tools/kernel_cache.py import "$KERNEL_CACHE_IN"
  else  # (a first call has nothing to carry yet: not a failure)
    SUMMARY+=("$(printf '%-18s %-9s %5s   %s' kernel-cache-in skipped - "no export in $KERNEL_CACHE_IN (kernel-cache.json): every kernel compiles")")
  fi
fi

# -- GPU tests ------------------------------------------------------------------------------
if [[ $F_SKIP_TESTS != 1 ]]; then
  if [[ ${#FILES[@]} -gt 0 ]]; then files=("${FILES[@]}"); else files=(tests); fi
  timeout_opt=()
  if "$PY" -c "import pytest_timeout" >/dev/null 2>&1; then
    timeout_opt=(--timeout="${TEST_TIMEOUT:-300}")
  fi
  workers_opt=(); workers_rev_opt=()
  if [[ -n "${WORKERS:-}${WORKERS_REVERSED:-}" ]]; then
    if "$PY" -c "import xdist" >/dev/null 2>&1; then
      [[ -n "${WORKERS:-}" ]] && workers_opt=(-n "$WORKERS")
      [[ -n "${WORKERS_REVERSED:-}" ]] && workers_rev_opt=(-n "$WORKERS_REVERSED")
    else
      SUMMARY+=("$(printf '%-18s %-9s %5s   %s' workers serial - "WORKERS set but no pytest-xdist: one process")")
    fi
  fi
  if [[ $F_REVERSED != 1 ]]; then
    run_step --tests gpu-tests "$PY" -m pytest -m gpu -q -x -rs --durations=10 -p no:cacheprovider \
      "${workers_opt[@]}" "${timeout_opt[@]}" --junitxml="$OUT_DIR/gpu-tests.xml" "${files[@]}"
  fi
  if [[ $F_TWICE == 1 || $F_REVERSED == 1 ]]; then
    run_step --tests gpu-tests-reversed "$PY" -m pytest -m gpu -q -x -rs -p no:cacheprovider --reverse-order \
      "${workers_rev_opt[@]}" "${timeout_opt[@]}" --junitxml="$OUT_DIR/gpu-tests-reversed.xml" "${files[@]}"
  fi
fi

# -- benchmarks -----------------------------------------------------------------------------
for name in ${BENCH:-}; do
  args_var="BENCH_ARGS_${name}"
  read -r -a extra <<<"${!args_var:-}"
  if [[ -f "benchmarks/bench_${name}.py" && "$name" != "replay" ]]; then
    run_step "bench-$name" "$PY" "benchmarks/bench_${name}.py" --json "$OUT_DIR/bench_${name}.json" "${extra[@]}"
  elif [[ "$name" == "replay" ]]; then
    run_step bench-replay "$PY" -m driverlevel bench replay --json "$OUT_DIR/bench_replay.json" "${extra[@]}"
  elif [[ "$name" == "demo" ]]; then
    run_step bench-demo "$PY" -m driverlevel capture-demo "${extra[@]}"
  else
    SUMMARY+=("$(printf '%-18s %-9s %5s   %s' "bench-$name" "FAIL" - "no benchmarks/bench_${name}.py")")
    FAILED=1
  fi
done

if [[ -n "${KERNEL_CACHE_OUT:-}" ]]; then
  run_step kernel-cache-out "$PY" tools/kernel_cache.py export "$KERNEL_CACHE_OUT" --since "$CACHE_MARK"
fi
rm -f "$CACHE_MARK"

# -- summary ------------------------------------------------------------------------------------
where="$OUT_DIR"
if [[ $F_PACK == 1 ]]; then
  mapfile -t loose < <(cd "$OUT_DIR" && find . -maxdepth 1 -type f ! -name gpu_check-logs.tgz -printf '%P\n' | sort)
  if [[ ${#loose[@]} -gt 0 ]]; then
    if tar -czf "$OUT_DIR/gpu_check-logs.tgz" -C "$OUT_DIR" "${loose[@]}"; then
      (cd "$OUT_DIR" && rm -f -- "${loose[@]}")
      where="$OUT_DIR/gpu_check-logs.tgz"
    else
      SUMMARY+=("$(printf '%-18s %-9s %5s   %s' pack FAIL - "tar of the logs failed: they stay loose in $OUT_DIR")"); FAILED=1
    fi
  fi
fi
echo
echo "=== summary (logs in $where)"
printf '%-18s %-9s %6s  %s\n' step status time "last line of its log"
for line in "${SUMMARY[@]}"; do echo "$line"; done
exit "$FAILED"
