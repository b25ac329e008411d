#!/bin/bash
# run_gpu_round9c.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: test_spec_cuda with the bf16 near-tie criterion (9b: the old
# count-against-plain's-own-baseline criterion failed once on
# stories260K, the baseline itself reading 1/5 and 2/5 in two calls);
# the speculative loop with speculation off (--spec-plain: its own
# overhead) and the adaptive decoder twice, both tiny models, batch 1.
# Carry: bin/baton, gpu/test_spec_cuda, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9c "${1:-build-r9c}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
M=$BT_SHARED_DIR/models
H=$BT_SHARED_DIR/heads
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
for m in aidreams260K stories260K; do
  T="--target $M/$m.bin --head $H/$m.bin.head.safetensors --device cuda --batch 1 --rounds 20"
  run "${m}_off" 60 "$c/bin/baton" eagle bench $T --spec-plain
  run "${m}_adapt" 60 "$c/bin/baton" eagle bench $T
  run "${m}_adapt2" 60 "$c/bin/baton" eagle bench $T
done
{
  echo "## round 9c $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda
  grep -h "near-tie" "$tmp/test_spec_cuda" | cut -c1-200
  for m in aidreams260K stories260K; do
    for f in off adapt adapt2; do
      echo "${m}_$f: $(grep -h '^batch:' "$tmp/${m}_$f" | cut -d' ' -f3-11)"
    done
  done
} > "$table"
cat "$table"
