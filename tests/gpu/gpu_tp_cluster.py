#!/usr/bin/env python3
"""gpu_tp_cluster.py BIN_DIR MODELS_DIR OUT_DIR - disaggregated prefill and
decode workers with DIFFERENT tensor-parallel degrees on 2 GPUs (issue 8),
run ON THE DEVICE MACHINE by tests/gpu/run_gpu_tp.sh (never in CI).

Phases (real processes: baton-router, baton-prefill, baton-decode, f32
aidreams260K, every golden prompt through `baton generate`):
  P2-D1  prefill --tp 2 (GPUs 0, 1) -> decode --tp 1 (GPU 1): each prefill
         rank's KV heads go over CUDA IPC into the matching columns of the
         one decode pool (kv_reshard);
  P1-D2  prefill --tp 1 (GPU 0) -> decode --tp 2 (GPUs 0, 1): the decode
         worker exports one pool per rank (descriptor version 2), the
         prefill splits its heads between them.
Each passes when every greedy output equals golden.jsonl, the prefill
mapped the decode pool(s) over CUDA IPC and nothing fell back to inline.
Prints PASS/FAIL lines (collected by run_gpu_tp.sh); exits nonzero on a
failure.  Process logs: OUT_DIR/<phase>-<proc>.log.  Harness dry run
without a GPU: BT_TPC_DEVICE=cpu python3 tests/gpu/gpu_tp_cluster.py
build-dir/bin ../shared/models /tmp/tpc (TP 1 everywhere, host pools).
"""
import os
import random
import re
import subprocess
import sys
import time

import cluster_harness

BIN, MODELS, OUT = sys.argv[1], sys.argv[2], sys.argv[3]
MODEL = MODELS + "/aidreams260K.bin"
DEVICE = os.environ.get("BT_TPC_DEVICE", "cuda")  # cpu: harness dry run
fails = 0


def log(msg):
    print(msg, flush=True)


GOLD = cluster_harness.golden(MODELS)


def generate(port, prompt, max_tokens, timeout=30):
    return cluster_harness.generate_ids(BIN, port, prompt, max_tokens,
                                        timeout)


def grep(path, pattern):
    try:
        return sum(1 for line in open(path, errors="replace")
                   if re.search(pattern, line))
    except OSError:
        return 0


def phase(label, p_args, d_args):
    global fails
    t0 = time.time()
    port = 22000 + random.randint(0, 20000)
    ctl = "tcp://127.0.0.1:%d" % (port + 1)
    env = dict(os.environ)
    env["BT_LOG"] = "INFO"  # "CUDA IPC pool ... mapped" is INFO
    procs = []

    def spawn(name, args):
        f = open(os.path.join(OUT, "%s-%s.log" % (label, name)), "w")
        procs.append(subprocess.Popen([BIN + "/" + args[0]] + args[1:],
                                      stdout=f, stderr=subprocess.STDOUT,
                                      env=env))

    spawn("router", ["baton-router", "--listen", "tcp://127.0.0.1:%d" % port,
                     "--control", ctl])
    common = ["--router", ctl, "--model", MODEL, "--device", DEVICE,
              "--precision", "f32"]
    if DEVICE != "cuda":  # the harness only: no TP, no GPUs
        p_args, d_args = [], []
    spawn("decode", ["baton-decode"] + common + ["--name", "d0"] + d_args)
    spawn("prefill", ["baton-prefill"] + common + ["--name", "p0"] + p_args)
    bad, first_err = 0, ""
    for i, (p, want, mt) in enumerate(GOLD):
        got, err = None, ""
        for _ in range(60):  # workers may still be starting / registering
            got, err = generate(port, p, mt)
            if got is not None:
                break
            time.sleep(0.25)
        if got != want:
            bad += 1
            first_err = first_err or "prompt %d: got %s want %s %s" % (
                i, got, want, err)
    cluster_harness.stop_procs([(None, p) for p in procs], 15)
    plog = os.path.join(OUT, "%s-prefill.log" % label)
    dlog = os.path.join(OUT, "%s-decode.log" % label)
    mapped = grep(plog, r"CUDA IPC pool .* mapped")
    inline = grep(plog, r"goes inline|falling back to inline|not usable") + \
        grep(dlog, r"arrives inline|export failed")
    ok = bad == 0 and (mapped >= 1 or DEVICE != "cuda") and inline == 0
    if not ok:
        fails += 1
    log("%s disaggregated %s (f32 aidreams260K, CUDA IPC, KV heads "
        "re-sharded): %d/%d golden, IPC maps %d, inline fallbacks %d, "
        "%.1f s %s" % ("PASS" if ok else "FAIL", label, len(GOLD) - bad,
                       len(GOLD), mapped, inline, time.time() - t0,
                       first_err[:300]))


def main():
    random.seed(os.getpid())
    os.makedirs(OUT, exist_ok=True)
    for f in os.listdir(OUT):
        os.remove(os.path.join(OUT, f))
    phase("P2-D1", ["--tp", "2", "--gpu", "0"], ["--tp", "1", "--gpu", "1"])
    phase("P1-D2", ["--tp", "1", "--gpu", "0"], ["--tp", "2", "--gpu", "0"])
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
