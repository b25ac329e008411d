#!/bin/bash
# run_gpu_round5b.sh [CARRY] - second device call of 2026-12-01 (issues
# 4, 6 and device sampling), ON THE DEVICE MACHINE from a carried build:
#   checks: test_attn (fa2 default, staged split combine), test_sample_dist
#   (+ --bench: the device whole-row sampler), test_cuda_sample (exact
#   paths), test_spec_cuda;
#   bench_cuda synth:llama3-8b defaults (decode 1/8/64 x 512/2048, b1 @8k,
#   prefill 2048), A/B at batch 1 @2k: BT_ATTN_COMBINE=0 (old combine),
#   BT_ATTN_SPLIT=256 / 2048, BT_PDL=0;
#   EAGLE on the 8B shape (forced acceptance 0.8) and the tiny models.
# CARRY: gpu/ test binaries, bin/baton, lib/, shared/{models,heads}.
# Writes $OUT/r5b.log and $OUT/r5b_table.md (printed last).  ~5 minutes.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r5b "${1:-build-c3}"
export BT_SHARED_DIR=$PWD/$c/shared BT_SPEC_HEADS=$PWD/$c/shared/heads
run test_attn 120 "$c/gpu/test_attn"
run test_sample_dist 90 "$c/gpu/test_sample_dist"
run sample_dist_bench 60 "$c/gpu/test_sample_dist" --bench
run test_cuda_sample 120 "$c/gpu/test_cuda_sample" 150
run test_spec_cuda 150 "$c/gpu/test_spec_cuda"
bc default BT_X=1 -- --batch 1,8,64 --ctx 512,2048 --prefill 2048
bc ctx8k BT_X=1 -- --batch 1,8 --ctx 8192 --prefill 0
bc comb0 BT_ATTN_COMBINE=0 -- --batch 1 --ctx 2048 --prefill 0
bc split256 BT_ATTN_SPLIT=256 -- --batch 1 --ctx 2048 --prefill 0
bc split2048 BT_ATTN_SPLIT=2048 -- --batch 1 --ctx 2048 --prefill 0
bc pdl0 BT_PDL=0 -- --batch 1,64 --ctx 2048 --prefill 0
run spec8b 100 "$c/bin/baton" bench-engine --model synth:llama3-8b --device cuda \
  --batch 1,8,32,64 --ctx 256 --steps 16 --spec-accept-rate 0.8 --spec-tokens 4,8,16
M=$c/shared/models H=$c/shared/heads
for m in aidreams260K stories260K; do
  run "eagle_${m}_b1" 60 "$c/bin/baton" eagle bench --device cuda --target "$M/$m.bin" \
    --head "$H/$m.bin.head.safetensors" --batch 1 --rounds 20
  run "eagle_${m}_b1_fixed" 60 "$c/bin/baton" eagle bench --device cuda --target "$M/$m.bin" \
    --head "$H/$m.bin.head.safetensors" --batch 1 --rounds 20 --spec-fixed
done
{
  echo "## round 5b $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_attn test_sample_dist test_cuda_sample test_spec_cuda
  echo '```'; grep -iE "us|ms|bench" "$tmp/sample_dist_bench" | tail -8; echo '```'
  bc_rows default ctx8k comb0 split256 split2048 pdl0
  echo '```'; grep -E "^ *[0-9]+ +(plain|[0-9]+) " "$tmp/spec8b"
  for m in aidreams260K stories260K; do for v in b1 b1_fixed; do echo "$m $v: $(grep '^batch:' "$tmp/eagle_${m}_$v")"; done; done
  echo '```'
} > "$table"
cat "$table"
