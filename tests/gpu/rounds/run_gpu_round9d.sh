#!/bin/bash
# run_gpu_round9d.sh [CARRY] - round 9 (2026-12-01), ON THE DEVICE
# MACHINE: test_spec_cuda with the bf16 near-tie criterion (9c carried
# a stale binary); why the adaptive decoder with the depth-8 default
# (arms: off, chains 1/2/4/8, tree 16/8/4) read 1.96-2.23x while a chain
# of 8 alone reads 2.22-2.36x: the controller's debug log twice, and the
# same decoder topped by a tree 16/8/2 and by a chain of 8 (9a: 2.33x).
# Carry: bin/baton, gpu/test_spec_cuda, lib/, shared/.
set -u
. "$(dirname "$0")/../gpu_steps.sh"
gpu_steps_init r9d "${1:-build-r9d}"
export BT_SHARED_DIR=$PWD/$c/shared
export BT_SPEC_HEADS=$PWD/$c/shared/heads
M=$BT_SHARED_DIR/models
H=$BT_SHARED_DIR/heads
run test_spec_cuda 240 "$c/gpu/test_spec_cuda"
T="--target $M/aidreams260K.bin --head $H/aidreams260K.bin.head.safetensors --device cuda --batch 1 --rounds 20"
for i in 1 2; do
  run "dbg$i" 60 env BT_LOG=DEBUG BT_LOG_SUBSYS=SPEC "$c/bin/baton" eagle bench $T
  cp "$tmp/dbg$i" "$out/dbg$i.log"
done
run top_k2 60 "$c/bin/baton" eagle bench $T --spec-topk 2
run top_c8 60 "$c/bin/baton" eagle bench $T --spec-tokens 8 --spec-topk 1
run c8 60 "$c/bin/baton" eagle bench $T --spec-fixed --spec-tokens 8 --spec-topk 1
run c4 60 "$c/bin/baton" eagle bench $T --spec-fixed --spec-tokens 4 --spec-topk 1
{
  echo "## round 9d $(date -u +%FT%TZ), $(( $(date +%s) - t0 )) s"
  cat "$tmp/rcs" | tr '\n' ' '; echo
  pass_fail test_spec_cuda
  grep -h "near-tie" "$tmp/test_spec_cuda" | cut -c1-200
  for f in dbg1 dbg2 top_k2 top_c8 c8 c4; do
    echo "$f: $(grep -h '^batch:' "$tmp/$f" | cut -d' ' -f3-11)"
  done
  for i in 1 2; do
    echo "dbg$i tries (arm, result):"
    grep -o "arm [0-9] try.*: \(wins\|loses\)" "$tmp/dbg$i" | awk '{print $2, $NF}' | sort | uniq -c | tr '\n' ';'; echo
  done
} > "$table"
cat "$table"
