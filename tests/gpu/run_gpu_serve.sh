#!/bin/bash
# run_gpu_serve.sh [CARRY_DIR] - serving at full load on one H200 (issues
# 35/36), ON THE DEVICE MACHINE (never in CI): tests/gpu/serve_bench.py
# (cold-start burst, then closed-loop `baton bench` runs, per mode).
# Prepare here:
#   cmake --build build-cuda -j2 --target baton baton-router baton-prefill \
#         baton-decode
#   bash tests/gpu/pack_carry.sh serve tests/gpu/run_gpu_serve.sh \
#        bin/baton bin/baton-router bin/baton-prefill bin/baton-decode
# then run(carry=[".carry"], command="bash .carry/call.sh", timeout_s=600).
# $OUT gets serve.log, serve.md (the table) and serve_logs.tgz.
set -u
carry=${1:-build-serve}
out=${OUT:-/tmp/baton-gpu-serve}
work=${BT_SERVE_WORK:-/tmp/baton-gpu-serve-work}
rm -rf "$work"; mkdir -p "$out" "$work"
export LD_LIBRARY_PATH=$PWD/$carry/lib:${LD_LIBRARY_PATH:-}
export UCX_MODULE_DIR=$PWD/$carry/lib/ucx
PYTHONUNBUFFERED=1 timeout -k 10 "${BT_SERVE_TIMEOUT:-570}" \
  python3 tests/gpu/serve_bench.py "$PWD/$carry/bin" "$work" "$out/serve.md" \
  2>&1 | tee "$out/serve.log"
rc=${PIPESTATUS[0]}
tar czf "$out/serve_logs.tgz" -C "$work" --exclude mps-pipe . 2>>"$out/serve.log"
exit "$rc"
