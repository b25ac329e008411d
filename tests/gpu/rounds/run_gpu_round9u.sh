#!/bin/bash
# run_gpu_round9u.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: test_spec_cuda after the review clean-up (a sequence's
# buffers from the pool or freshly allocated, then one initialisation;
# the host flush maps parts back through the sequences; the draft
# log-softmax through spec_logsumexp), plus aidreams260K batch 1 and 8
# adaptive once each.  Prediction: 121 PASS, speedups as 9q / 9r.
# Measured: 121 PASS; batch 1 1.90x (10 rounds, within the host spread
# of 9q / 9r: 1.86-2.46x), batch 8 0.98x.
# Carry: bin/baton, gpu/test_spec_cuda, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9u "${1:-build-r9u}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
M=$BT_SHARED_DIR/models
H=$BT_SHARED_DIR/heads
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
for b in 1 8; do
  run "b$b" 60 "$c/bin/baton" eagle bench --target $M/aidreams260K.bin \
    --head $H/aidreams260K.bin.head.safetensors --device cuda --batch $b --rounds 10
done
{
  echo "## round 9u $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda
  for f in b1 b8; do echo "$f: $(grep -h '^batch:' "$tmp/$f" | cut -d' ' -f1-8)"; done
} > "$table"
cat "$table"
