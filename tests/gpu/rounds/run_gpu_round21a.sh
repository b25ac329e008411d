#!/bin/bash
# run_gpu_round21a.sh [CARRY] - prepared in round 20 (2026-12-03) for the
# next round, ON THE DEVICE MACHINE, issue 4: where the batch-64 decode
# attention's ~18 us a layer over 4.5 TB/s go.  Round 20 found that the
# stream-K kernel with runs of whole tokens (no second wave, the pipeline
# running across item boundaries) is no faster than the split kernel's
# two waves (139.7 vs 137.6 us a layer in the engine), so the two-wave
# explanation is in doubt.  (1) bench_kernels --dec: split / sk / sk-tok
# at every case (isolated, L2 flushed); (2) Nsight Compute on the split
# kernel and on sk-tok at 64 x 2048 (DRAM throughput, achieved
# occupancy, stall reasons, the L2 / DRAM sectors: is the kernel short
# of bytes in flight, or of issue?).  (0) first: test_attn and
# test_sample_dist at 12baf69 (the review commit, compiled only in
# round 20), and the target rows once (b1 / b64 @2k) as this machine's
# baseline.  Carry: gpu/bench_kernels gpu/test_attn gpu/test_sample_dist
# gpu/bench_cuda gpu/bench_kvread, lib/, shared.  (1b) bench_kvread: the
# attention's KV bytes read with no arithmetic, tok-major (baton's
# pages) vs head-major pages vs one flat array.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r21a "${1:-build-r21a}"
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
export BT_SHARED_DIR=$PWD/$c/shared
report() {
  {
    echo "## round 21a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
    cat "$tmp/rcs" | tr '\n' ' '; echo
    pass_fail attn sdist gemm 2>/dev/null
    bc_rows base 2>/dev/null
    for n in c1 c2; do
      [ -f "$tmp/bc_$n" ] || continue
      echo "$n: $(grep -c 'gemm tune o=.* ms$' "$tmp/bc_$n") families timed ($(grep -o 'gemm tune o=.* ms$' "$tmp/bc_$n" | awk '{s+=$(NF-1)} END {print s+0}') ms), $(grep -c 'picks from' "$tmp/bc_$n") from the cache; wall $(cat "$tmp/wall_$n" 2>/dev/null) s"
    done
    bc_rows c1 c2 2>/dev/null
    [ -f "$tmp/gc.txt" ] && { echo '```'; head -4 "$tmp/gc.txt"; echo "... $(wc -l < "$tmp/gc.txt") lines"; echo '```'; }
    grep -E "^kvread|^\|" "$tmp/kvread" 2>/dev/null
    grep -E "^attn decode" "$tmp/dec" 2>/dev/null
    for v in split sktok; do
      echo "### ncu $v"; echo '```'
      grep -E "attn_decode|Duration|DRAM Throughput|Memory Throughput|L2 Hit|Achieved Occupancy|Theoretical Occupancy|Registers Per|Grid Size|Waves|Warp Cycles Per Issued|Issue Slots|Stall|Long Scoreboard|Barrier" \
        "$tmp/ncu_$v" 2>/dev/null | head -60
      echo '```'
    done
  } > "$table"
}
run attn 200 "$c/gpu/test_attn"
run sdist 120 "$c/gpu/test_sample_dist"
run gemm 200 "$c/gpu/test_gemm"
run kvread 60 "$c/gpu/bench_kvread"
report
bc base BT_LOG=WARN -- --batch 1,64 --ctx 2048
report
report
# the 64 x 2048 case only (--dec-only; --reps 1: each pass launches its
# kernel twice), the second launch of each kernel profiled: the split
# kernel (pass 0) skips 1; sk-tok (pass 2) skips the sk pass's 2 + 1
if [ -n "$ncu" ]; then
  for v in split sktok; do
    if [ $v = split ]; then k=attn_decode_tc_kernel; skip=1
    else k=attn_decode_sk_kernel; skip=3; fi
    run ncu_$v 200 "$ncu" --clock-control none -k "regex:$k" \
      --launch-skip $skip --launch-count 1 \
      --section SpeedOfLight --section Occupancy --section LaunchStats \
      --section WarpStateStats --section MemoryWorkloadAnalysis \
      "$c/gpu/bench_kernels" --dec-only 64:2048 --reps 1
  done
else
  echo "no ncu on this machine" > "$tmp/ncu_split"
fi
report
# BT_GEMM_CACHE: the first run tunes and writes the file, the second
# installs every family from it (same picks: the same step times)
for n in c1 c2; do
  s0=$(date +%s)
  bc $n BT_LOG=INFO BT_GEMM_CACHE=$tmp/gc.txt -- --batch 1,64 --ctx 2048 --prefill 2048
  echo $(( $(date +%s) - s0 )) > "$tmp/wall_$n"
done
report
run dec 240 "$c/gpu/bench_kernels" --dec --reps 20
report
cat "$table"
