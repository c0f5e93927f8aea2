#!/usr/bin/env bash
# The twenty-eighth session's first device call (research/patches/README.md), from the repository root:
#   OUT=... bash research/patches/first_call.sh
# 1. wgmma-pv.patch (P V by wgmma; never run on a GPU): the verify-attention GPU tests on it;
# 2. bench_attention --quick --no-baseline, main and wgmma-pv interleaved, twice;
# 3. Nsight Compute of verify_attn_partial (16 h x 2 x 32k x 256, benchmarks/profile_tile.py, the second
#    launch): main's tile (QK by wgmma), the mma.sync tile before it (64x1x32x4wd_20) and wgmma-pv's.
# Results: $OUT/n.tgz. ~6-8 minutes on the H200.
set -u
R=$PWD; O=${OUT:?set OUT}; mkdir -p $O/n
T=/tmp/ab-wgmma-pv; rm -rf $T; mkdir -p $T
(cd $R && tar --exclude=./.wt --exclude=./.git -cf - .) | (cd $T && tar -xf -)
(cd $T && patch -s -p1 < $R/research/patches/wgmma-pv.patch) || { echo "wgmma-pv.patch does not apply"; exit 1; }
nvidia-smi -L
echo "--- verify GPU tests on wgmma-pv"
(cd $T && PYTHONPATH=$T timeout 300 python -m pytest -x -q -m gpu -p no:cacheprovider tests/test_verify_attention_gpu.py \
   tests/test_verify_schedule_gpu.py 2>&1 | tail -6)
for i in 1 2; do for t in main pv; do dd=$R; [ $t = pv ] && dd=$T
  (cd $dd && PYTHONPATH=$dd timeout 150 python benchmarks/bench_attention.py --quick --no-baseline --json $O/n/$t-$i.json \
     > $O/n/$t-$i.txt 2>&1) || echo "bench $t $i failed"
done; done
echo "ms per shape (heads bs prefix tok ms TFLOP/s), runs 1 and 2"
for t in main pv; do echo "== $t"; paste <(grep -E '^ native' $O/n/$t-1.txt | awk '{print $2,$3,$4,$5,$6,$7}') \
  <(grep -E '^ native' $O/n/$t-2.txt | awk '{print $6,$7}'); done
M="gpu__time_duration.sum,launch__registers_per_thread,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"
M="$M,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
M="$M,smsp__issue_active.avg.pct_of_peak_sustained_active,dram__throughput.avg.pct_of_peak_sustained_elapsed,smsp__inst_executed.sum"
M="$M,smsp__average_warp_latency_per_inst_issued.ratio,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio"
M="$M,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio"
M="$M,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio"
for t in main-wgmma main-mmasync pv; do dd=$R; args="--tile native"
  [ $t = pv ] && dd=$T; [ $t = main-mmasync ] && args="--spec 64x1x32x4wd_20"
  (cd $dd && PYTHONPATH=$dd timeout 240 ncu --clock-control none -k regex:verify_attn_partial -s 1 -c 1 --metrics $M \
     python benchmarks/profile_tile.py $args > $O/n/ncu-$t-metrics.txt 2>&1) || echo "ncu metrics $t failed"
  (cd $dd && PYTHONPATH=$dd timeout 240 ncu --clock-control none -k regex:verify_attn_partial -s 1 -c 1 --section SpeedOfLight \
     --section ComputeWorkloadAnalysis --section WarpStateStats python benchmarks/profile_tile.py $args \
     > $O/n/ncu-$t-sections.txt 2>&1) || echo "ncu sections $t failed"
  (cd $dd && PYTHONPATH=$dd timeout 240 ncu --clock-control none -k regex:verify_attn_partial -s 1 -c 1 --metrics \
     sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
     python benchmarks/profile_tile.py $args > $O/n/ncu-$t-gmma.txt 2>&1) || echo "ncu gmma $t failed"
  echo "=== ncu $t"; grep -E "tensor_op_(g|h)mma_cycles" $O/n/ncu-$t-gmma.txt; grep -E "gpu__time|tensor_op|wavefronts_mem_shared.avg|issue_active|stalled_(barrier|short|wait)" $O/n/ncu-$t-metrics.txt
done
tar -C $O -czf $O/n.tgz n && rm -rf $O/n
