#!/bin/bash
# run_gpu_round9a.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: the host draft head with Q/K/V and gate/up fused and the
# chains' argmax + logsumexp (bd5afd5; CPU: 38.5 -> 31.0 us a step of a
# chain of 4) on aidreams260K at batch 1 with the head trained on 256K
# tokens at temperature 0.3; chains of 4, 6, 8, the adaptive decoder
# with its default top arm (tree 16/5/4, one run with the controller's
# debug log) and with a chain of 8 as its top arm; stories260K chain 4
# and adaptive.  Prediction: chain 4 2.03x (round 8k) -> ~2.15x.
# Carry: bin/baton, gpu/test_spec_cuda, lib/, shared/{models,heads}.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9a "${1:-build-r9a}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
M=$BT_SHARED_DIR/models
H=$BT_SHARED_DIR/heads
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
for m in aidreams260K stories260K; do
  T="--target $M/$m.bin --head $H/$m.bin.head.safetensors --device cuda --batch 1 --rounds 20"
  for d in 4 6 8; do
    [ $m = stories260K ] && [ $d != 4 ] && continue
    run "${m}_c$d" 60 "$c/bin/baton" eagle bench $T --spec-fixed \
      --spec-tokens $d --spec-depth $d --spec-topk 1
  done
  run "${m}_adapt" 60 "$c/bin/baton" eagle bench $T
done
T="--target $M/aidreams260K.bin --head $H/aidreams260K.bin.head.safetensors --device cuda --batch 1 --rounds 20"
run aidreams260K_c4b 60 "$c/bin/baton" eagle bench $T --spec-fixed --spec-tokens 4 --spec-depth 4 --spec-topk 1
run aidreams260K_adaptb 60 "$c/bin/baton" eagle bench $T
run aidreams260K_adapt_c8 60 "$c/bin/baton" eagle bench $T --spec-tokens 8 --spec-depth 8 --spec-topk 1
run aidreams260K_adapt_dbg 60 env BT_LOG=DEBUG BT_LOG_SUBSYS=SPEC "$c/bin/baton" eagle bench $T
cp "$tmp/aidreams260K_adapt_dbg" "$out/adapt_dbg.log"
{
  echo "## round 9a $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda
  for f in aidreams260K_c4 aidreams260K_c6 aidreams260K_c8 aidreams260K_adapt \
      stories260K_c4 stories260K_adapt aidreams260K_c4b aidreams260K_adaptb \
      aidreams260K_adapt_c8 aidreams260K_adapt_dbg; do
    echo "$f: $(grep -h '^batch:' "$tmp/$f" | cut -d' ' -f3-11)"
  done
  echo "adaptive tries (arm: wins/loses):"
  grep -o "arm [0-9] try.*: \(wins\|loses\)" "$tmp/aidreams260K_adapt_dbg" | awk '{print $2, $NF}' | sort | uniq -c
} > "$table"
cat "$table"
