#!/bin/bash
# run_gpu_round5c.sh [CARRY] - third device call of 2026-12-01, ON THE
# DEVICE MACHINE from a carried build: test_spec_cuda (float4 draft
# top-k), test_sample_dist (opt-in device whole-row sampler), bench_cuda
# with the new small-step PDL rule (A/B: BT_PDL_SMALL=1), EAGLE on the 8B
# shape and aidreams260K, and Nsight Compute on the batch-1 decode
# attention kernels (where 0.74 ms of a 4.6 ms step goes).  Writes
# $OUT/r5c.log, $OUT/r5c_table.md.  ~4 minutes.
set -u
c=${1:-build-c4}
out=${OUT:-/tmp/baton-r5c}
mkdir -p "$out"
log=$out/r5c.log
table=$out/r5c_table.md
: > "$log"
export LD_LIBRARY_PATH=$PWD/$c/lib:${LD_LIBRARY_PATH:-}
export BT_LOG=${BT_LOG:-WARN} BT_SHARED_DIR=$PWD/$c/shared BT_SPEC_HEADS=$PWD/$c/shared/heads
t0=$(date +%s)
tmp=$(mktemp -d)
run() { # name timeout cmd...
  local name=$1 tmo=$2; shift 2
  echo "=== $name: $*  (t=$(( $(date +%s) - t0 )) s)" >> "$log"
  timeout -k 5 "$tmo" "$@" > "$tmp/$name" 2>&1
  local rc=$?
  cat "$tmp/$name" >> "$log"
  echo "=== $name rc=$rc" >> "$log"
  echo "$name rc=$rc" >> "$tmp/rcs"
}
run test_spec_cuda 150 "$c/gpu/test_spec_cuda"
run test_sample_dist 90 "$c/gpu/test_sample_dist"
bc() { # name env... -- args
  local name=$1; shift
  local envs=()
  while [ "$1" != "--" ]; do envs+=("$1"); shift; done
  shift
  run "bc_$name" 90 env "${envs[@]}" "$c/gpu/bench_cuda" --model synth:llama3-8b \
    --steps 20 --table "$tmp/t_$name" "$@"
}
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
  for t in test_spec_cuda test_sample_dist; do
    echo "$t: $(grep -c '^PASS' "$tmp/$t") PASS, $(grep -c 'FAIL' "$tmp/$t") FAIL lines"
  done
  for f in default pdlsmall1; do echo "### $f"; grep -E "^\| (decode|prefill) " "$tmp/t_$f" 2>/dev/null | cut -d'|' -f2-6,9-10; done
  echo '```'; grep -E "^ *[0-9]+ +(plain|[0-9]+) " "$tmp/spec8b"
  echo "aidreams b1 fixed: $(grep '^batch:' "$tmp/eagle_aid_b1_fixed")"
  echo '```'
  echo '```'
  grep -E "attn_decode_tc|attn_combine|Duration|DRAM Throughput|Memory Throughput|Achieved Occupancy|Registers Per|Grid Size|Block Size|Warp Cycles Per Issued|Stall" "$tmp/ncu_attn" | head -60
  echo '```'
} > "$table"
cat "$table"
