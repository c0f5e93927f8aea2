#!/usr/bin/env bash
# Where the demo GEMM's warps stall, per SASS instruction (fifty-fourth session, prepared; the LM head
# shape, 128 and 136 rows x 32,768 x 512, the last two of gemm_noise_probe.py --profile's five
# launches): from the repository root, $OUT set (~2-4 minutes):
#   bash research/patches/ncu_gemm_stalls.sh
# ncu_gemm_s54.sh found the LM head at DRAM 40% / L2 66% of peak with 16 warps an SM: neither memory
# nor the SMs busy. This says which instructions the warps wait at (tools/ncu_stalls.py: totals by
# reason, per block of instructions, the top instructions): the cp.async wait and barrier (the
# pipeline), the ldmatrix results (short_sb) or the mma chain (wait / math pipe).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=/tmp/ncu-stalls; rm -rf $D; mkdir -p $D
# launch 4 of the probe's --profile launches: the LM head at 128 rows (mla_gemm); 5: at 136 rows, the
# DDTree step's (mla_gemm_m144, since the fifty-fifth session)
for pick in "3 lmhead128" "4 lmhead136"; do
  set -- $pick
  timeout 200 ncu --clock-control none --profile-from-start off -k regex:mla_gemm --launch-skip $1 --launch-count 1 \
    --section SourceCounters --section WarpStateStats --warp-sampling-interval 0 -o $D/$2 \
    python research/probes/gemm_noise_probe.py --repeat 1 --profile > $D/ncu-$2.log 2>&1
  echo "== $2"; tail -n 3 $D/ncu-$2.log
  ncu -i $D/$2.ncu-rep --page source --print-source sass --csv > $D/$2-sass.csv 2> $D/csv-$2.err
  python tools/ncu_stalls.py $D/$2-sass.csv --top 25 | tee $D/stalls-$2.txt | head -50
  ncu -i $D/$2.ncu-rep --section WarpStateStats --page details 2>/dev/null | grep -iE 'stall|cycles per' | head -20
done
tar czf $OUT/ncu-stalls.tgz -C /tmp ncu-stalls
