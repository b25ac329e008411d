#!/usr/bin/env python3
"""bench_gpu_cluster.py BIN_DIR WORK_DIR TABLE_MD - the issue-7 cluster
benchmarks on one GPU, run ON THE DEVICE MACHINE by
tests/gpu/bench_gpu_cluster.sh (never in CI).

Clusters of real processes (baton-router + workers, --device cuda, the
synthetic Llama-3-8B in bf16 built by every worker), all of them CUDA MPS
clients when the MPS daemon starts:
  disagg     1 prefill + 1 decode, KV over CUDA IPC, no SM cap
  agg        one `baton-decode --role both` (no prefill worker)
  disagg-60  1 prefill + 1 decode with CUDA_MPS_ACTIVE_THREAD_PERCENTAGE
             60 / 40 (only when time is left)

Parts:
  H  KV hand-off: one request at a time (1 prefill + 1 decode step) per
     prompt length; the router's timings (`baton generate --stats`) and
     the prefill worker's `kv_handoff` DEBUG line (KV bytes, host time
     issuing the per-layer copies, commit after the last layer).  The
     same requests against the aggregated worker give the TTFT without
     any hand-off.
  B  `baton bench` closed loop, the prompt/output lengths and concurrency
     levels of BT_BENCH_RUNS: TTFT / TPOT p50 / p90 / p99,
     output tokens/s, goodput under TTFT <= 250 ms and TPOT <= 25 ms.

Both workers and the aggregated worker prefill a prompt in one forward
(--max-batch-tokens 8192 --chunk-tokens 8192), so the per-prompt compute
is the same in both modes.  Environment (defaults are the device run;
the CPU dry run on the dev machine overrides them):
  BT_BENCH_DEVICE   cuda            BT_BENCH_MODEL  synth:llama3-8b
  BT_BENCH_PLENS    512,2048,8176   (8192 does not fit the 8192 context
                                     with a generated token)
  BT_BENCH_RUNS     2048x128@1:6,8:16,32:32;512x512@8:8,32:32
                    (prompt x output @ concurrency:requests, ...)
  BT_BENCH_DEADLINE_S  seconds for everything (200); later parts are
                       skipped when too little is left
  BT_BENCH_LOAD_S   longest wait for the workers to serve (60)
  BT_BENCH_PRECISION (bf16), BT_BENCH_VOCAB (32000), BT_BENCH_BATCH_TOKENS (8192), BT_BENCH_DEC_BLOCKS
  (6144), BT_BENCH_PRE_BLOCKS (2048)
Writes the markdown tables to TABLE_MD as they fill, logs to WORK_DIR,
prints the tables last.  Exit status 0 when every part that ran had no
errors.
"""
import json
import os
import random
import re
import statistics
import subprocess
import sys
import time

import cluster_harness

BIN, WORK, TABLE = sys.argv[1], sys.argv[2], sys.argv[3]
DEVICE = os.environ.get("BT_BENCH_DEVICE", "cuda")
MODEL = os.environ.get("BT_BENCH_MODEL", "synth:llama3-8b")
PLENS = [int(x) for x in os.environ.get("BT_BENCH_PLENS",
                                        "512,2048,8176").split(",")]
# "PROMPTxOUTPUT@CONC:REQUESTS,...;..." - closed-loop `baton bench` runs
RUNS = [(tuple(int(v) for v in shape.split("x")),
         [tuple(int(v) for v in c.split(":")) for c in conc.split(",")])
        for shape, conc in (r.split("@") for r in os.environ.get(
            "BT_BENCH_RUNS", "2048x128@1:6,8:16,32:32;512x512@8:8,32:32")
            .split(";"))]
T0 = time.time()
DEADLINE = T0 + float(os.environ.get("BT_BENCH_DEADLINE_S", "200"))
LOAD_S = float(os.environ.get("BT_BENCH_LOAD_S", "60"))
REPS = 3                  # timed single requests per prompt length
COPY_CEIL = 4.3e12        # H200 device-to-device copy, read + write counted
SLO_TTFT, SLO_TPOT = 250, 25
# Block counts (16 tokens, 2 MiB each for Llama-3-8B bf16 over all layers):
# the decode pool holds 32 requests of 2048 + 64 tokens plus slack; the
# prefill pool a full 8192-token batch twice.
DEC_BLOCKS = os.environ.get("BT_BENCH_DEC_BLOCKS", "6144")
PRE_BLOCKS = os.environ.get("BT_BENCH_PRE_BLOCKS", "2048")
BATCH = os.environ.get("BT_BENCH_BATCH_TOKENS", "8192")
PRECISION = os.environ.get("BT_BENCH_PRECISION", "bf16")
VOCAB = int(os.environ.get("BT_BENCH_VOCAB", "32000"))  # prompt ids < this

failures = 0
handoff = {}   # plen -> dict of medians, mode "disagg"
agg_ttft = {}  # plen -> median TTFT ms, aggregated
bench_rows = []
notes = []


def log(msg):
    print("[%6.1fs] %s" % (time.time() - T0, msg), flush=True)


def left():
    return DEADLINE - time.time()


# ---------------------------------------------------------------------------
# CUDA MPS

def mps_start():
    return cluster_harness.mps_start(WORK)


def mps_stop(mps):
    cluster_harness.mps_stop(mps, log)


# ---------------------------------------------------------------------------
# Clusters

class Cluster(cluster_harness.Cluster):
    """A router and its workers, each logging to WORK/<label>/<name>.log."""

    def __init__(self, label, mps, workers):
        super().__init__(BIN, WORK, label,
                         os.environ if mps is None else mps[1],
                         "KV,PREFILL,DECODE,CUDA,ENGINE", log)
        self.start_router(lambda: log(
            "%s: router exited (%s); another port" %
            (label, self.logtext("router").strip()[-120:])))
        common = ["--router", self.ctl, "--model", MODEL, "--device",
                  DEVICE, "--precision", PRECISION]
        for name, role, pct in workers:
            self.spawn(name, cluster_harness.worker_args(
                name, role, common, PRE_BLOCKS, DEC_BLOCKS, BATCH),
                "DEBUG" if role == "prefill" else "INFO",
                pct if mps else None)
        self.names = [w[0] for w in workers]

    def wait_serving(self):
        """All workers logged 'serving' (model loaded), then one short
        request went through (registration, CUDA IPC mapping, graphs)."""
        t0 = time.time()
        while time.time() - t0 < LOAD_S:
            dead = self.dead()
            if dead:
                log("%s: %s exited early" % (self.label, dead))
                return False
            if self.serving(self.names):
                break
            time.sleep(0.2)
        else:
            log("%s: workers not serving after %.0fs" % (self.label, LOAD_S))
            return False
        log("%s: workers serving after %.1fs" % (self.label,
                                                 time.time() - t0))
        st = generate(self.ep, 16, 2)
        if st is None:
            return False
        log("%s: first request ok (ttft %.1f ms) after %.1fs" %
            (self.label, st["ttft_ms"], time.time() - t0))
        return True


def prompt_ids(n, seed):
    rng = random.Random(seed)
    return [1] + [rng.randrange(3, VOCAB) for _ in range(n - 1)]


STAT_RE = re.compile(r"(\w+):([0-9.]+|\w+)")


def generate(ep, plen, max_tokens, seed=0):
    """One request; returns the --stats fields or None."""
    cmd = [BIN + "/baton", "generate", "--router", ep, "--prompt-ids",
           " ".join(map(str, prompt_ids(plen, seed))), "--max-tokens",
           str(max_tokens), "--ignore-eos", "--ids", "--stats",
           "--timeout-ms", "60000"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=70)
    except subprocess.TimeoutExpired:
        log("generate %d tokens: timeout" % plen)
        return None
    line = [x for x in r.stderr.splitlines() if x.startswith("prompt_tokens")]
    if r.returncode != 0 or not line:
        log("generate %d tokens failed rc %d: %s" % (plen, r.returncode,
                                                    r.stderr.strip()[-300:]))
        return None
    st = {}
    for k, v in STAT_RE.findall(line[-1]):
        try:
            st[k] = float(v)
        except ValueError:
            st[k] = v
    return st


HANDOFF_RE = re.compile(r"kv_handoff request:(\d+) tokens:(\d+) "
                        r"bytes:(\d+) put_us:([0-9.]+) commit_us:([0-9.]+)")


def part_handoff(cl, mode):
    """Single requests (prompt + 1 decoded token) per prompt length."""
    global failures
    for plen in PLENS:
        if left() < 15:
            notes.append("%s hand-off from %d tokens on: skipped (time)" %
                         (mode, plen))
            return
        runs = []
        for rep in range(REPS + 1):  # the first one warms up this length
            st = generate(cl.ep, plen, 2, seed=100 * plen + rep)
            if st is None:
                failures += 1
                break
            if rep > 0:
                runs.append(st)
        if not runs:
            continue
        med = {k: statistics.median(r[k] for r in runs)
               for k in ("ttft_ms", "prefill_ms", "transfer_ms", "total_ms")}
        log("%s %d tokens: ttft %.2f prefill %.2f transfer %.3f ms "
            "(median of %d)" % (mode, plen, med["ttft_ms"],
                                med["prefill_ms"], med["transfer_ms"],
                                len(runs)))
        if mode == "agg":
            agg_ttft[plen] = med["ttft_ms"]
            continue
        hs = [m for m in HANDOFF_RE.findall(cl.logtext("p0"))
              if int(m[1]) == plen][1:]  # drop the warm-up's
        if hs:
            med["bytes"] = float(hs[-1][2])
            med["put_us"] = statistics.median(float(h[3]) for h in hs)
            med["commit_us"] = statistics.median(float(h[4]) for h in hs)
            med["n_handoff"] = len(hs)
        else:
            notes.append("no kv_handoff line for %d tokens (not CUDA IPC?)"
                         % plen)
            failures += 1
        handoff[plen] = med


def part_bench(cl, mode):
    global failures
    for (plen, olen), concs in RUNS:
        bench_shape(cl, mode, plen, olen, concs)


def bench_shape(cl, mode, plen, olen, concs):
    global failures
    for conc, nreq in concs:
        need = 10 + nreq * (0.02 * plen / 1000 + 0.01 * olen) / \
            max(1, conc / 4)
        if left() < need:
            notes.append("%s bench %dx%d c=%d: skipped (%.0fs left, ~%.0fs "
                         "needed)" % (mode, plen, olen, conc, left(), need))
            continue
        js = os.path.join(cl.dir, "bench_%dx%d_c%d.json" % (plen, olen,
                                                             conc))
        cmd = cluster_harness.bench_cmd(BIN, cl.ep, nreq, plen, olen, VOCAB,
                                        SLO_TTFT, SLO_TPOT, js, conc=conc)
        t0 = time.time()
        try:
            r = subprocess.run(cmd, capture_output=True, text=True,
                               timeout=max(5, min(120, left() - 5)))
        except subprocess.TimeoutExpired:
            log("%s bench %dx%d c=%d: timeout" % (mode, plen, olen, conc))
            failures += 1
            continue
        log("%s bench %dx%d c=%d n=%d (%.1fs):\n%s%s" % (
            mode, plen, olen, conc, nreq, time.time() - t0, r.stdout,
            r.stderr[-500:]))
        try:
            with open(js) as f:
                j = json.load(f)
        except (OSError, ValueError):
            failures += 1
            continue
        if r.returncode != 0 or j["errors"] > 0:
            failures += 1
        bench_rows.append(("%dx%d" % (plen, olen), mode, conc, j))


def run_mode(label, mode, mps, workers, parts):
    """Returns False when the cluster did not come up."""
    global failures
    if left() < 30:
        notes.append("%s: skipped (%.0fs left)" % (mode, left()))
        return True
    t0 = time.time()
    cl = Cluster(label, mps, workers)
    try:
        if not cl.wait_serving():
            failures += 1
            notes.append("%s: cluster did not come up (logs in %s)" %
                         (mode, label))
            return False
        for part in parts:
            part(cl, mode)
        return True
    finally:
        cl.stop()
        log("%s: done in %.1fs" % (mode, time.time() - t0))
        maps = len(re.findall(r"CUDA IPC pool .* mapped",
                              "".join(cl.logtext(n) for n in cl.names)))
        fallbacks = len(re.findall(r"goes inline|falling back to inline",
                                   "".join(cl.logtext(n) for n in cl.names)))
        if "p0" in cl.names:
            notes.append("%s: CUDA IPC maps %d, inline fallbacks %d" %
                         (mode, maps, fallbacks))
            if fallbacks:
                failures += 1


# ---------------------------------------------------------------------------
# Tables

def tables():
    out = []
    out.append("### KV hand-off, %s, one request at a time "
               "(prompt + 1 decode step; median of %d)" % (MODEL, REPS))
    out.append("")
    out.append("| prompt tokens | KV MB | TTFT ms (1P+1D) | TTFT ms (agg) | "
               "router prefill ms | transfer ms | put µs (issue, 32 layers) | "
               "commit µs (after last layer) | copy floor µs | "
               "KV bytes / transfer time GB/s |")
    out.append("| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | "
               "---: | ---: |")
    for plen in PLENS:
        h = handoff.get(plen)
        a = agg_ttft.get(plen)
        if h is None and a is None:
            continue
        h = h or {}
        b = h.get("bytes")
        xfer = h.get("put_us", 0) + h.get("commit_us", 0)

        def f(v, fmt):
            return fmt % v if v is not None else "-"
        out.append("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (
            plen, f(b / 1e6 if b else None, "%.1f"),
            f(h.get("ttft_ms"), "%.2f"), f(a, "%.2f"),
            f(h.get("prefill_ms"), "%.2f"), f(h.get("transfer_ms"), "%.3f"),
            f(h.get("put_us"), "%.0f"), f(h.get("commit_us"), "%.0f"),
            f(2 * b / COPY_CEIL * 1e6 if b else None, "%.0f"),
            f(b / (xfer * 1e-6) / 1e9 if b and xfer > 0 else None, "%.0f")))
    out.append("")
    out.append("### baton bench, %s, closed loop (goodput: TTFT <= %d ms "
               "and TPOT <= %d ms)" % (MODEL, SLO_TTFT, SLO_TPOT))
    out.append("")
    out.append("| in x out | mode | conc | requests | TTFT p50 / p90 / p99 ms | "
               "TPOT p50 / p90 / p99 ms | out tok/s | req/s | goodput req/s "
               "| errors |")
    out.append("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | "
               "---: | ---: |")
    for shape, mode, conc, j in bench_rows:
        t, p = j["ttft_ms"], j["tpot_ms"]
        out.append("| %s | %s | %d | %d | %.1f / %.1f / %.1f | %.2f / %.2f / %.2f "
                   "| %.0f | %.2f | %.2f | %d |" % (
                       shape, mode, conc, j["requests"], t["p50"], t["p90"],
                       t["p99"], p["p50"], p["p90"], p["p99"],
                       j["tok_per_s"], j["req_per_s"],
                       j["goodput_req_per_s"], j["errors"]))
    out.append("")
    for n in notes:
        out.append("- " + n)
    return "\n".join(out) + "\n"


def write_tables():
    with open(TABLE, "w") as f:
        f.write(tables())


def main():
    random.seed(os.getpid())
    os.makedirs(WORK, exist_ok=True)
    time.sleep(2)  # an MPS server of the checks may still be exiting
    mps, why = mps_start()
    notes.append("CUDA MPS: %s" % ("on" if mps else "off (%s)" % why))
    log(notes[-1])
    try:
        disagg = [("d0", "decode", None), ("p0", "prefill", None)]
        if not run_mode("disagg", "1P+1D", mps, disagg,
                        [part_handoff, part_bench]) and mps is not None:
            # Not up under MPS: once more time-sliced, so numbers come back.
            mps_stop(mps)
            mps = None
            notes.append("CUDA MPS: turned off after the first cluster "
                         "failed; the rest is time-sliced")
            log(notes[-1])
            run_mode("disagg-nomps", "1P+1D", mps, disagg,
                     [part_handoff, part_bench])
        write_tables()
        run_mode("agg", "agg", mps, [("d0", "both", None)],
                 [part_handoff, part_bench])
        write_tables()
        if mps is not None:
            run_mode("disagg-60-40", "1P+1D MPS 60/40", mps,
                     [("d0", "decode", 40), ("p0", "prefill", 60)],
                     [part_bench])
    finally:
        mps_stop(mps)
        write_tables()
    log("failures: %d" % failures)
    log("tables written to %s" % TABLE)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
