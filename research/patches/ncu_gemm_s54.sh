#!/usr/bin/env bash
# Nsight Compute on the demo GEMM's probe launches (the drafter's three, the LM head shape), main's
# tree as it is and (when the tree holds gemm-bk64) a copy with it reversed, a short section
# set each; from the repository root, $OUT set (~2-3 minutes):
#   bash research/patches/ncu_gemm_s54.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
D=/tmp/ncu54; rm -rf $D; mkdir -p $D
ncu_one() {  # ncu_one TREE LABEL
  (cd $1 && PYTHONPATH=$1 timeout 150 ncu --clock-control none --profile-from-start off -k regex:mla_gemm \
     --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
     --section LaunchStats python research/probes/gemm_noise_probe.py --repeat 1 --profile > $D/ncu-$2.txt 2>&1)
  echo "== $2"; grep -E "mla_gemm|Duration|DRAM Throughput|L2 Cache Throughput|L1/TEX Hit|Compute \(SM\) Throughput|Achieved Occupancy|Warp Cycles Per Issued|Registers Per|Waves Per SM" \
    $D/ncu-$2.txt | tail -n 40
}
ncu_one $PWD tree
# the same without gemm-bk64 (k-tiles of 32), when the tree holds it
T=/tmp/t-no-bk64; rm -rf $T; mkdir -p $T
tar --exclude=./.wt --exclude=./.git -cf - . | (cd $T && tar -xf -)
if (cd $T && patch -s -f -R -p1 < $PWD/research/patches/gemm-bk64.patch > /dev/null 2>&1); then ncu_one $T no-bk64; fi
tar czf $OUT/ncu54.tgz -C /tmp ncu54
