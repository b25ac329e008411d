#!/bin/bash
# pack_gpu_spec.sh [BUILD_DIR] [CARRY_DIR] - packs what run_gpu_spec.sh
# needs on the device machine into one folder to carry (run it HERE after
# building: cmake --build BUILD_DIR --target baton test_kv_copy
# gpu_test_spec_cuda): stripped binaries, the libraries the device lacks
# (../shared/tools/devlibs), the two tiny models + golden.jsonl, and draft
# heads trained here with `baton eagle train` (kept when already there;
# copied from HEADS_FROM=DIR when it holds them).  The benchmark heads
# are trained on 256K tokens sampled at temperature 0.3 (~70 s each
# here): on the golden prompts, which no head saw, aidreams260K's chain
# of 4 accepts 3.93 tokens a step against 2.71 with the defaults (32K
# tokens at temperature 1; docs/PERFORMANCE.md, round 8 section 7).
# Defaults: build-specgpu2, build-specgpu2-carry.  Prints the folder's size
# (the carry limit is 64 MiB).
set -eu
build=${1:-build-specgpu2}
carry=${2:-build-specgpu2-carry}
shared=${BT_SHARED_DIR:-$(cd .. && pwd)/shared}
mkdir -p "$carry/bin" "$carry/gpu" "$carry/lib" "$carry/shared/models" \
         "$carry/shared/heads"
cp "$build/bin/baton" "$carry/bin/"
cp "$build/gpu/test_kv_copy" "$build/gpu/test_spec_cuda" "$carry/gpu/"
strip "$carry/bin/"* "$carry/gpu/"*
for f in aidreams260K.bin stories260K.bin golden.jsonl; do
  cp "$shared/models/$f" "$carry/shared/models/"
done
for m in aidreams260K stories260K; do
  h=$carry/shared/heads/$m.bin.head.safetensors
  [ -s "$h" ] || [ -z "${HEADS_FROM:-}" ] ||
    cp "$HEADS_FROM/$m.bin.head.safetensors" "$h" 2>/dev/null || true
  [ -s "$h" ] || "$build/bin/baton" eagle train --target \
      "$shared/models/$m.bin" --out "$h" --threads 2 --tokens 262144 \
      --temperature 0.3
done
../shared/tools/devlibs "$carry/lib" "$carry/bin/baton" "$carry/gpu/"*
du -sh "$carry"
