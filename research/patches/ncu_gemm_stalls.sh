#!/usr/bin/env bash
# Where the demo GEMM's warps stall, per SASS instruction (fifty-fourth session, prepared; the LM head
# shape, 128 rows x 32,768 x 512, the last of gemm_noise_probe.py --profile's four launches): from the
# repository root, $OUT set (~1-2 minutes):
#   bash research/patches/ncu_gemm_stalls.sh
# ncu_gemm_s54.sh found the LM head at DRAM 40% / L2 66% of peak with 16 warps an SM: neither memory
# nor the SMs busy. This says which instructions the warps wait at (tools/ncu_stalls.py: totals by
# reason, per block of instructions, the top instructions): the cp.async wait and barrier (the
# pipeline), the ldmatrix results (short_sb) or the mma chain (wait / math pipe).
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=/tmp/ncu-stalls; rm -rf $D; mkdir -p $D
timeout 200 ncu --clock-control none --profile-from-start off -k regex:mla_gemm --launch-skip 3 --launch-count 1 \
  --section SourceCounters --section WarpStateStats --warp-sampling-interval 0 -o $D/lmhead \
  python research/probes/gemm_noise_probe.py --repeat 1 --profile > $D/ncu.log 2>&1
tail -n 3 $D/ncu.log
ncu -i $D/lmhead.ncu-rep --page source --print-source sass --csv > $D/lmhead-sass.csv 2> $D/csv.err
python tools/ncu_stalls.py $D/lmhead-sass.csv --top 25 | tee $D/stalls.txt | head -70
ncu -i $D/lmhead.ncu-rep --section WarpStateStats --page details 2>/dev/null | grep -iE 'stall|cycles per' | head -30
tar czf $OUT/ncu-stalls.tgz -C /tmp ncu-stalls
