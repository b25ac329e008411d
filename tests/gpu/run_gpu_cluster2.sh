#!/bin/bash
# run_gpu_cluster2.sh [CARRY_DIR] - issues 7 + 8 on TWO H200s (device kind
# nvidia-h200-x2), ON THE DEVICE MACHINE (never in CI), in one call of at
# most 6 minutes: KV hand-off micro benchmarks (CUDA IPC GPU0->GPU1 and
# same GPU vs cudaMemcpyPeer / D2D, the staged UCX path with device
# pools), `baton bench` rate sweeps 1P+1D vs aggregated on one GPU each
# (2048x128, 512x512, under CUDA MPS), the TensorRT-LLM comparison, and
# prefill GPU0 -> decode GPU1 (cuda-ipc(p2p)) vs two aggregated workers.
# See tests/gpu/gpu_cluster2.py for the parts.
#
# Prepare here (the device has no ZeroMQ/protobuf-c/UCX), from the repo
# root:
#   cmake -S . -B build-gpucl -DCMAKE_CUDA_ARCHITECTURES=90a -DBT_WERROR=ON
#   cmake --build build-gpucl -j2 --target baton baton-router \
#         baton-prefill baton-decode kv_transport_test_stage \
#         kv_transport_test_cuda_ipc
#   C=build-gpucl-carry; rm -rf $C; mkdir -p $C/bin $C/tests
#   for b in baton baton-router baton-prefill baton-decode; do
#     strip -o $C/bin/$b build-gpucl/bin/$b; done
#   for t in kv_transport_test_stage kv_transport_test_cuda_ipc; do
#     strip -o $C/tests/$t build-gpucl/tests/$t; done
#   ../shared/tools/devlibs $C/devlibs $C/bin/* $C/tests/*
#   tar czf $C/bin.tgz -C $C bin && rm -rf $C/bin   # 50 MiB -> ~14
#   du -sh $C        # about 25 MiB (limit 64)
# then `run` (kind nvidia-h200-x2) with carry ["build-gpucl-carry"],
# timeout_s 380 and the command
#   bash tests/gpu/run_gpu_cluster2.sh
# $OUT (default /tmp/baton-gpu-cluster2) gets three files: cluster2.md
# (the tables, also printed last), cluster2.svg (latency vs throughput)
# and cluster2_logs.tgz (the full log, every process's log, the bench
# JSON files, rows.json).  BT_C2_DEADLINE_S (330) bounds the driver; the
# parts shrink or skip what no longer fits.  Dry run without a GPU:
#   BT_C2_DEVICE=cpu BT_C2_MODEL=synth:tiny BT_C2_DEADLINE_S=150 \
#   bash tests/gpu/run_gpu_cluster2.sh build-gpucl-cpu
# (a CPU build dir works as the carry: it has bin/ and tests/).
set -u
carry=${1:-build-gpucl-carry}
out=${OUT:-/tmp/baton-gpu-cluster2}
work=${BT_C2_WORK:-/tmp/baton-gpu-cluster2-work}
t0=$(date +%s)
rm -rf "$work"
mkdir -p "$out" "$work"
cdir=$PWD/$carry
if [ -d "$cdir/devlibs" ]; then
  export LD_LIBRARY_PATH=$cdir/devlibs:${LD_LIBRARY_PATH:-}
  export UCX_MODULE_DIR=$cdir/devlibs/ucx
fi
if [ -f "$cdir/bin.tgz" ]; then  # binaries travel compressed
  x=${BT_C2_UNPACK:-/tmp/baton-gpu-cluster2-carry}
  rm -rf "$x"
  mkdir -p "$x"
  tar xzf "$cdir/bin.tgz" -C "$x" || exit 1
  ln -s "$cdir/tests" "$x/tests"
  cdir=$x
fi
export NCCL_NVLS_ENABLE=0
deadline=${BT_C2_DEADLINE_S:-330}
export BT_C2_DEADLINE_S=$deadline
PYTHONUNBUFFERED=1 timeout -k 10 $((deadline + 20)) \
  python3 tests/gpu/gpu_cluster2.py "$cdir" "$work" "$out"
rc=$?
tar czf "$out/cluster2_logs.tgz" -C "$work" --exclude mps-pipe . \
  2>/dev/null
echo
echo "== run_gpu_cluster2.sh: rc $rc, $(($(date +%s) - t0)) s"
cat "$out/cluster2.md" 2>/dev/null
exit "$rc"
