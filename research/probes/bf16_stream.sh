#!/usr/bin/env bash
# One device call (thirty-fourth session): why the bf16 threshold stream at batch 8 reads half the
# bytes of fp32 in about the same time. bench_ddtree for both dtypes, the stars' phase stamps (batch 8
# / 256, L2 flushed), and Nsight Compute of the stream kernel (second build's launch) with the SASS
# stall table (tools/ncu_stalls.py). Everything lands in $OUT/bf16.tgz.
set -u
O=${OUT:?set OUT}/b; mkdir -p $O
export PYTHONPATH=$PWD
pack() { tar -C ${OUT} -czf ${OUT}/bf16.tgz b; }
for dt in float32 bfloat16; do
  timeout 60 python benchmarks/bench_ddtree.py --quick --no-reference --topk threshold --drafter random \
    --logits-dtype $dt --json $O/bench-$dt.json > $O/bench-$dt.log 2>&1 || echo "bench $dt failed"
  echo "--- bench $dt"; grep -E '^threshold|cumulative' $O/bench-$dt.log | head -8
done
pack
for dt in float32 bfloat16; do
  timeout 60 python tools/ddtree_stamps.py --batch 8 --budget 256 --drafter random --logits-dtype $dt \
    --chain --flush read > $O/stamps-$dt.txt 2>&1 || echo "stamps $dt failed"
  echo "--- stamps $dt (phase, CTAs, median cyc, max cyc, median µs)"
  grep -E '^(merge|loaded|selected|lse|lsedone|sortdone|sorted|last|lp|searched|nodes|stream (waited|tile0|looped|exit)) ' $O/stamps-$dt.txt | head -20
done
pack
for dt in bfloat16 float32; do
  timeout 120 ncu --clock-control none -k regex:ddtree_topk_stream -s 1 -c 1 --section SpeedOfLight \
    --section WarpStateStats --section SourceCounters --section Occupancy --section LaunchStats \
    --warp-sampling-interval 0 -o $O/stream-$dt python benchmarks/profile_topk.py --batch 8 --budget 256 \
    --logits-dtype $dt > $O/ncu-$dt.log 2>&1 || { echo "ncu $dt failed"; tail -5 $O/ncu-$dt.log; }
  ncu -i $O/stream-$dt.ncu-rep --page details > $O/details-$dt.txt 2>&1
  ncu -i $O/stream-$dt.ncu-rep --page source --print-source sass --csv > $O/sass-$dt.csv 2>&1
  python tools/ncu_stalls.py $O/sass-$dt.csv --top 12 > $O/stalls-$dt.txt 2>&1
  echo "--- ncu $dt"; grep -E 'Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Registers Per|Issued Warp|No Eligible|Warp Cycles Per Issued' $O/details-$dt.txt | head -12
  head -25 $O/stalls-$dt.txt
  pack
done
rm -f $O/*.ncu-rep $O/sass-*.csv; pack; rm -rf $O
