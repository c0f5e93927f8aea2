#!/usr/bin/env bash
# The fifty-seventh session's second device call (after the suite twice): from the repository root,
# $OUT set, the checkout installed (~5 minutes): the benchmarks, the verify attention at the demo
# step's shape (verify_stamps), and the LM head's stalls per SASS instruction (ncu_gemm_stalls.sh).
set -u
export OUT="${OUT:?set OUT}" PYTHONPATH=$PWD PYTHONUNBUFFERED=1
nvidia-smi -L
echo "== verify stamps at the demo step's shape (136 rows: 8 requests x 17 tokens, 9 heads, tree)"
for p in 256 400 512; do
  timeout 60 python tools/verify_stamps.py --heads 9 --batch 8 --prefix $p --tokens 17 --tree --ctas 8 2>&1 | tee $OUT/verify_stamps_$p.txt | tail -n 30
done
echo "== benchmarks"
SKIP_TESTS=1 BENCH="step ddtree attention" BENCH_ARGS_ddtree="--quick" BENCH_ARGS_attention="--quick --tile both" \
  timeout 240 bash tools/gpu_check.sh 2>&1 | tail -n 60
echo "== ncu stalls"
timeout 300 bash research/patches/ncu_gemm_stalls.sh 2>&1 | tail -n 140
# (the runner returns a few files only: the stamps' text goes into one archive; in the
# fifty-seventh session's run it did not, and the three text files were left behind)
tar czf $OUT/verify-stamps.tgz -C $OUT verify_stamps_256.txt verify_stamps_400.txt verify_stamps_512.txt && rm -f $OUT/verify_stamps_*.txt
