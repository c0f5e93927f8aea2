#!/usr/bin/env bash
# gemm-m144-lm.patch (fifty-fifth session) in one device call from the repository root ($OUT set;
# ~8 minutes on an H100 or H200 once warm; give the run tool 600 s):
#   bash research/patches/call_s55b.sh
# call_s55.sh measured gemm-m144 (the 144-row tile for every GEMM of 129 .. 144 rows, lean loaders in
# every tile): LM head at 136 rows 43.7 -> 34.0 µs, but q / kv +3.3 / +3.1, o +1.0 and the 128- and
# 32-row tiles 0.5-0.8 slower: the decode step unchanged, the autoregressive one +0.8. gemm-m144-lm
# keeps main's loaders (the 128- and 32-row tiles' SASS equals main's) and takes the 144-row tile
# only where it saves a wave (the LM head). This runs, in a copy of the tree with the patch:
# 1. the whole GPU suite forward (8 workers; tools/gpu_check.sh, no benchmark);
# 2. research/probes/gemm_noise_probe.py --shapes on main and on the patch;
# 3. step_ab.sh gemm-m144-lm (the decode step, main and the patch interleaved twice).
# Everything lands in $OUT/s55b.tgz (packed after each step, so a cut call returns what was done).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
. research/patches/patched_tree.sh
D=/tmp/s55b; rm -rf $D; mkdir -p $D  # outside $OUT: only the archive comes back
pack() { tar czf $OUT/s55b.tgz -C /tmp s55b; }
nvidia-smi -L | tee $D/gpu.txt
T=/tmp/t-gemm-m144-lm
patched_tree gemm-m144-lm $T
echo "--- 1. the whole GPU suite on gemm-m144-lm (forward, 8 workers)"
(cd $T && OUT=$D WORKERS=8 BENCH="" KERNEL_CACHE_IN=.kcache PYTHONPATH=$T timeout 470 bash tools/gpu_check.sh 2>&1 \
   | tail -n 12)
pack
echo "--- 2. gemm_noise_probe --shapes, main then gemm-m144-lm"
for t in main lm; do
  dd=$PWD; [ $t = lm ] && dd=$T
  (cd $dd && PYTHONPATH=$dd timeout 60 python research/probes/gemm_noise_probe.py --repeat 50 --shapes \
     > $D/gemm-probe-$t.txt 2>&1; echo "== $t"; grep -E "^shape|lm head" $D/gemm-probe-$t.txt)
done
pack
echo "--- 3. step_ab gemm-m144-lm"
timeout 120 bash research/patches/step_ab.sh gemm-m144-lm --steps 200 --max-new-tokens 128 > $D/step-ab.log 2>&1
mv $OUT/step-*.json $D/ 2>/dev/null
grep -E "===|DDTree|autoregressive|speed-up" $D/step-ab.log
pack
