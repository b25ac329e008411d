#!/bin/bash
# run_gpu_round5c.sh [CARRY] - third device call of 2026-12-01, ON THE
# DEVICE MACHINE from a carried build: test_spec_cuda (float4 draft
# top-k), test_sample_dist (opt-in device whole-row sampler), bench_cuda
# with the new small-step PDL rule (A/B: BT_PDL_SMALL=1), EAGLE on the 8B
# shape and aidreams260K, and Nsight Compute on the batch-1 decode
# attention kernels (where 0.74 ms of a 4.6 ms step goes).  Writes
# $OUT/r5c.log, $OUT/r5c_table.md.  ~4 minutes.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r5c "${1:-build-c4}"
export BT_SHARED_DIR=$PWD/$c/shared BT_SPEC_HEADS=$PWD/$c/shared/heads
run test_spec_cuda 150 "$c/gpu/test_spec_cuda"
run test_sample_dist 90 "$c/gpu/test_sample_dist"
bc default BT_X=1 -- --batch 1,8,64 --ctx 512,2048 --prefill 2048,8192
bc pdlsmall1 BT_PDL_SMALL=1 -- --batch 1 --ctx 512,2048 --prefill 0
run spec8b 100 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --batch 1,8,64 --ctx 256 --steps 16 --spec-accept-rate 0.8 --spec-tokens 4,8,16
M=$c/shared/models H=$c/shared/heads
run eagle_aid_b1_fixed 60 "$c/bin/baton" eagle bench --device cuda --target "$M/aidreams260K.bin" \
  --head "$H/aidreams260K.bin.head.safetensors" --batch 1 --rounds 20 --spec-fixed
ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
run ncu_attn 90 "$ncu" --clock-control none -k 'regex:attn_decode_tc|attn_combine' \
  --launch-skip 96 --launch-count 4 --section SpeedOfLight --section LaunchStats \
  --section Occupancy --section WarpStateStats \
  "$c/gpu/bench_cuda" --model synth:llama3-8b --batch 1 --ctx 2048 --prefill 0 --steps 1
{
  echo "## round 5c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda test_sample_dist
  bc_rows default pdlsmall1
  echo '```'; grep -E "^ *[0-9]+ +(plain|[0-9]+) " "$tmp/spec8b"
  echo "aidreams b1 fixed: $(grep '^batch:' "$tmp/eagle_aid_b1_fixed")"
  echo '```'
  echo '```'
  grep -E "attn_decode_tc|attn_combine|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Warp Cycles Per Issued|Stall" "$tmp/ncu_attn" | head -60
  echo '```'
} > "$table"
cat "$table"
