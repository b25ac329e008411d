#!/usr/bin/env python3
"""serve_bench.py BIN_DIR WORK_DIR TABLE_MD - serving at full load on one
GPU (issues 35 and 36), run ON THE DEVICE MACHINE by
tests/gpu/run_gpu_serve.sh (never in CI).

Each mode is a fresh cluster of real processes (baton-router + workers,
--device cuda, synth:llama3-8b built by every worker, BT_SERVE_PRECISION):
  agg        one `baton-decode --role both`
  agg-nobound the same with --tpot-target-ms 0 (no prefill budget: the
             A/B of decode_budget.c's default 50 ms bound)
  disagg     1 prefill + 1 decode under CUDA MPS, KV over CUDA IPC
  prefix-on / prefix-off  the aggregated worker with --prefix-cache on /
             off, BT_SERVE_PREFIX_RUNS only (prompts = a shared prefix +
             a unique tail: issue 38's TTFT with a 4k-token shared prefix)
  rand-on / rand-off  the same on BT_SERVE_RAND_RUNS (nothing shared:
             what the cache costs)
  chat-kv / chat-rr  4 aggregated workers under MPS, router --policy
             kv-aware / round-robin, multi-turn chat (BT_SERVE_CHAT, baton
             bench's --sessions); the hit column is the workers' prefix
             hit rates weighted by requests served (`baton status --json`)
The first `baton bench` of every mode is a cold start: a burst of
BT_SERVE_COLD requests sent the moment the workers registered (no
warm-up request before it); it must lose nothing.  Then the closed-loop
runs of BT_SERVE_RUNS ("PROMPTxOUTPUT@CONCURRENCY:REQUESTS;..."), then
the open-loop sweeps of BT_SERVE_SWEEPS ("PROMPTxOUTPUT@R1,R2,...:
REQUESTS;...", default none: one `baton bench --rates` each, Poisson
arrivals, at most 256 in flight, REQUESTS a rate on fresh prompts; a
row a rate with its goodput at TTFT p99 <= 1 s and TPOT p99 <= 50 ms,
and the latency-vs-throughput plot sweep_MODE_PxO.svg beside TABLE_MD):
issue 36's goodput of each mode, and where agg and disagg cross.

Environment: BT_SERVE_MODES (agg,disagg,agg-nobound), BT_SERVE_RUNS,
BT_SERVE_COLD (256 requests at once; 0: none) of BT_SERVE_COLD_SHAPE (2048x128), BT_SERVE_DEADLINE_S (540),
BT_SERVE_KV_BLOCKS (44000: disagg's decode; its prefill 4096),
BT_SERVE_AGG_KV (auto: the aggregated worker sizes KV from memory),
BT_SERVE_TPOT_MS (50: agg's --tpot-target-ms), BT_SERVE_MAX_SEQS (256:
the decode worker's --max-seqs; the cuda default would be 512),
BT_SERVE_DECODE_ARGS (more options of d0, e.g. --kv-overcommit),
BT_SERVE_MODEL (synth:llama3-8b), BT_SERVE_DEVICE (cuda),
BT_SERVE_PRECISION (bf16; fp8), BT_SERVE_KV_DTYPE (unset: the default),
BT_SERVE_PREFIX_RUNS ("SHARED+UNIQUExOUTPUT@CONCURRENCY:REQUESTS;...",
4096+256x16@8:64), BT_SERVE_RAND_RUNS (BT_SERVE_RUNS' form,
2048x128@64:256), BT_SERVE_CHAT (baton bench arguments: 14 sessions of a
2048-token system prompt growing 256 tokens a turn, 10 turns),
BT_SERVE_CHAT_KV (4096 blocks a chat worker).
A closed-loop row's out tok/s is over the whole run (first send to last
end: the first prefill burst and the last stragglers included), then in
brackets over its middle half (baton bench's tok_per_s_mid: the steady
state a run of one or two rounds, 2048/2048 at 220 streams, hardly
reaches).  Each row's floor column is serve_floor.py's (the physical floor of that
run on one GPU: what out tok/s reads against, as a kernel row reads
against its floor).
Writes TABLE_MD as rows fill; prints it last.  Exit 1 when a request
failed anywhere.
"""
import json
import os
import re
import subprocess
import sys
import time
import urllib.request

import cluster_harness
import serve_floor

BIN, WORK, TABLE = sys.argv[1], sys.argv[2], sys.argv[3]
MODES = os.environ.get("BT_SERVE_MODES", "agg,disagg,agg-nobound").split(",")


def parse_runs(text):
    return [(tuple(int(v) for v in shape.split("x")),
             tuple(int(v) for v in load.split(":")))
            for shape, load in (r.split("@") for r in text.split(";") if r)]


RUNS = parse_runs(os.environ.get(
    "BT_SERVE_RUNS", "2048x128@256:512;512x512@256:512;2048x2048@160:160"))
# open-loop sweeps: ((P, O), ([rates], requests a rate))
SWEEPS = [(tuple(int(v) for v in shape.split("x")),
           ([float(r) for r in load.split(":")[0].split(",")],
            int(load.split(":")[1])))
          for shape, load in (r.split("@") for r in os.environ.get(
              "BT_SERVE_SWEEPS", "").split(";") if r)]
sweep_rows = []
# agg-nobound is an A/B of the prefill budget: the prefill-heavy shape only
TPOT_RUNS = parse_runs(os.environ.get("BT_SERVE_TPOT_RUNS",
                                      "2048x128@256:512"))
PREFIX_RUNS = [(tuple(int(v) for v in shape.replace("+", "x").split("x")),
                tuple(int(v) for v in load.split(":")))
               for shape, load in (r.split("@") for r in os.environ.get(
                   "BT_SERVE_PREFIX_RUNS", "4096+256x16@8:64").split(";"))]
RAND_RUNS = parse_runs(os.environ.get("BT_SERVE_RAND_RUNS",
                                      "2048x128@64:256"))
CHAT = os.environ.get(
    "BT_SERVE_CHAT", "--requests 140 --concurrency 8 --sessions 14 "
    "--shared-prefix-len 2048 --prompt-len 256 --output-len 32").split()
CHAT_KV = os.environ.get("BT_SERVE_CHAT_KV", "4096")
CHAT_WORKERS = 4
COLD = int(os.environ.get("BT_SERVE_COLD", "256"))
COLD_SHAPE = tuple(int(v) for v in os.environ.get(
    "BT_SERVE_COLD_SHAPE", "2048x128").split("x"))
DEADLINE = time.time() + float(os.environ.get("BT_SERVE_DEADLINE_S", "540"))
KV = os.environ.get("BT_SERVE_KV_BLOCKS", "44000")  # disagg's decode pool
AGG_KV = os.environ.get("BT_SERVE_AGG_KV", "auto")  # auto: from memory
TPOT_MS = os.environ.get("BT_SERVE_TPOT_MS", "50")
MAX_SEQS = os.environ.get("BT_SERVE_MAX_SEQS", "256")
# more baton-decode options, e.g. "--kv-overcommit"
DECODE_ARGS = os.environ.get("BT_SERVE_DECODE_ARGS", "").split()
SWEEP_CONC = int(MAX_SEQS)  # in flight at most during a sweep
MODEL = os.environ.get("BT_SERVE_MODEL", "synth:llama3-8b")
DEVICE = os.environ.get("BT_SERVE_DEVICE", "cuda")
PRECISION = os.environ.get("BT_SERVE_PRECISION", "bf16")
KV_DTYPE = (["--kv-dtype", os.environ["BT_SERVE_KV_DTYPE"]]
            if os.environ.get("BT_SERVE_KV_DTYPE") else [])
VOCAB = int(os.environ.get("BT_SERVE_VOCAB", "32000"))
PEER = {(2048, 128): "3,538", (2048, 2048): "12,194"}  # TRT-LLM FP8, H200
FLOOR = []  # serve_floor.Floor of this model and precision, made once
METRICS_PORT = 19180  # d0's --metrics-port (the device machine is ours)
T0 = time.time()
rows = []
phase_notes = []  # per run: where d0's decode steps spent their time
failed = 0


def log(msg):
    print("[%6.1fs] %s" % (time.time() - T0, msg), flush=True)


def of_floor(plen, olen, conc, tok_s):
    """'floor tok/s (out / floor)' of a run (serve_floor.py), or ''."""
    if not isinstance(plen, int) or olen < 1 or conc < 1:
        return ""  # chat / shared-prefix rows: the floor assumes no reuse
    try:
        if not FLOOR:
            FLOOR.append(serve_floor.Floor(serve_floor.model_config(
                BIN + "/baton", MODEL), PRECISION,
                os.environ.get("BT_SERVE_KV_DTYPE") or "bf16"))
        fl = FLOOR[0].tok_per_s(plen, olen, conc)
    except (OSError, ValueError, subprocess.SubprocessError) as e:
        log("no floor: %s" % e)
        return ""
    return "{:,.0f} ({:.2f})".format(fl, tok_s / fl)


def write_table():
    with open(TABLE, "w") as f:
        f.write("| mode | in/out | conc | requests | failed | out tok/s "
                "(middle half) | floor tok/s (out / floor) | TTFT p50 / p99 ms | "
                "TPOT p50 / p99 ms | TensorRT-LLM FP8 | prefix hit |\n"
                "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | "
                "---: | ---: | ---: |\n")
        for r in rows:
            f.write("| %s |\n" % " | ".join(str(x) for x in r))
        if sweep_rows:
            f.write("\nOpen-loop sweeps (Poisson arrivals, at most %d in "
                    "flight; goodput: requests meeting TTFT <= 1 s and TPOT "
                    "<= 50 ms, a second):\n\n| mode | in/out | rate req/s | "
                    "requests | failed | out tok/s | floor tok/s (out / "
                    "floor) | goodput req/s | TTFT p50 / p99 ms | TPOT p50 "
                    "/ p99 ms |\n| --- | --- | ---: | ---: | ---: | ---: | "
                    "---: | ---: | ---: | ---: |\n" % SWEEP_CONC)
            for r in sweep_rows:
                f.write("| %s |\n" % " | ".join(str(x) for x in r))
        if phase_notes:
            f.write("\nd0's decode steps by phase (ms a step; build and "
                    "post: serial host work, emit overlaps the device, "
                    "enqueue and wait: the device's):\n\n")
            for n in phase_notes:
                f.write("- %s\n" % n)


def worker_cmds(mode, ctl):
    common = ["--router", ctl, "--model", MODEL, "--device", DEVICE,
              "--precision", PRECISION] + KV_DTYPE
    dec = ["baton-decode"] + common + [
        "--name", "d0", "--metrics-port", str(METRICS_PORT), "--max-seqs",
        MAX_SEQS,
        "--max-batch-tokens", "8192", "--chunk-tokens", "2048"] + DECODE_ARGS
    if mode.startswith(("prefix", "rand")):
        return [("d0", dec + ["--role", "both", "--prefix-cache",
                              "off" if mode.endswith("-off") else "on",
                              "--tpot-target-ms", TPOT_MS])]
    if mode.startswith("chat"):
        return [("d%d" % i, ["baton-decode"] + common + [
            "--name", "d%d" % i, "--max-seqs", "64", "--max-batch-tokens",
            "8192", "--chunk-tokens", "2048", "--role", "both",
            "--kv-blocks", CHAT_KV, "--prefix-cache", "on",
            "--tpot-target-ms", TPOT_MS]) for i in range(CHAT_WORKERS)]
    if mode.startswith("agg"):
        dec += ["--role", "both"]
        if AGG_KV != "auto":
            dec += ["--kv-blocks", AGG_KV]
        dec += ["--tpot-target-ms",
                "0" if mode == "agg-nobound" else TPOT_MS]
        return [("d0", dec)]
    dec += ["--kv-blocks", KV]  # two workers share the GPU
    pre = ["baton-prefill"] + common + [
        "--name", "p0", "--kv-blocks", "4096", "--max-batch-tokens", "8192",
        "--chunk-tokens", "8192"]
    return [("p0", pre), ("d0", dec)]


def hit_rate(cl):
    """The workers' prefix hit rates (`baton status --json`), weighted by
    the requests each served (a worker that saw only first turns would
    otherwise count as much as one that saw whole sessions)."""
    try:
        r = subprocess.run([BIN + "/baton", "status", "--router", cl.ep,
                            "--json"], capture_output=True, text=True,
                           timeout=20)
        ws = [(w["prefix_hit_rate"], w.get("served", 0)) for w in
              json.loads(r.stdout).get("workers", [])
              if "prefix_hit_rate" in w]
    except (subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        return ""
    n = sum(s for _, s in ws)
    return "%.1f%%" % (100.0 * sum(h * s for h, s in ws) / n) if n else ""


def scrape():
    """d0's counters from its /metrics: {name or name{labels}: value}."""
    try:
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" %
                                      METRICS_PORT, timeout=5).read()
    except OSError:
        return {}
    out = {}
    for ln in text.decode().splitlines():
        m = re.match(r"^(baton_worker_(?:steps_total|prefill_tokens_total|"
                     r"generated_tokens_total|step_phase_seconds_total"
                     r"|step_host_seconds_sum|step_seconds_sum"
                     r"|step_seconds_bucket|batch_size_bucket)"
                     r"(?:\{[^}]*\})?) ([0-9.eE+-]+)$", ln)
        if m:
            out[m.group(1)] = float(m.group(2))
    return out


def hist_note(d, name):
    """A histogram's steps a bucket over a run ("<=0.05: 12, ..."), from
    the cumulative bucket counters' differences."""
    rows = []
    for k, v in d.items():
        m = re.match(r'^baton_worker_%s_bucket\{le="([^"]+)"\}$' % name, k)
        if m:
            rows.append((float("inf") if m.group(1) == "+Inf"
                         else float(m.group(1)), m.group(1), v))
    rows.sort()
    out, prev = [], 0.0
    for _, le, v in rows:
        if v - prev > 0:
            out.append("<=%s: %d" % (le, v - prev))
        prev = v
    return "[" + ", ".join(out) + "]"


def phase_note(before, after, what):
    """One line: d0's steps during a run, split by phase."""
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    steps = d.get("baton_worker_steps_total", 0)
    if steps <= 0:
        return
    ph = ", ".join("%s %.2f" % (p, 1e3 * d.get(
        'baton_worker_step_phase_seconds_total{phase="%s"}' % p, 0) / steps)
        for p in ("build", "enqueue", "emit", "wait", "post"))
    phase_notes.append(
        "%s: %d steps, %.2f ms a step (%s); %.0f prompt and %.0f generated "
        "tokens a step; steps by duration (s) %s, by sequences %s" % (
            what, steps, 1e3 * d.get("baton_worker_step_seconds_sum", 0) /
            steps, ph, d.get("baton_worker_prefill_tokens_total", 0) / steps,
            d.get("baton_worker_generated_tokens_total", 0) / steps,
            hist_note(d, "step_seconds"), hist_note(d, "batch_size")))
    log("phases " + phase_notes[-1])


# Every run's prompts are its own (baton bench --seed): a run whose
# prompts an earlier run of the same cluster sent would find them in the
# prefix cache and skip their prefill (until 2026-12-05 the seed was the
# prompt length, and each warm 2048/128 row re-sent the cold burst's 256
# prompts: 3,188 tok/s against a 2,660 prefill ceiling).
RUN_SEEDS = iter(range(1001, 10**6))


def bench(cl, mode, plen, olen, conc, n, label, shared=0, args=None):
    global failed
    before = scrape()
    path = os.path.join(cl.dir, "bench_%s_%sx%d_c%d.json" %
                        (label, plen, olen, conc))
    if args is not None:  # a whole baton bench argument list (chat)
        cmd = [BIN + "/baton", "bench", "--router", cl.ep, "--vocab",
               str(VOCAB), "--json", path, "--seed", "7"] + args
    else:
        cmd = cluster_harness.bench_cmd(BIN, cl.ep, n, plen, olen, VOCAB,
                                        1000, 50, path, conc=conc,
                                        seed=next(RUN_SEEDS))
    if shared:
        cmd += ["--shared-prefix-len", str(shared)]
        plen = "%d+%d" % (shared, plen)
    left = DEADLINE - time.time()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=max(30, left))
    except subprocess.TimeoutExpired:
        log("%s %dx%d c%d: timed out" % (mode, plen, olen, conc))
        rows.append((mode + " " + label,
                 "%s/%d" % (plen, olen) if plen != "chat" else "chat", conc, n,
                     "timeout", "", "", "", "", "", ""))
        failed += 1
        return
    try:
        j = json.load(open(path))
    except (OSError, ValueError):
        log("%s: no JSON (rc %d): %s" % (mode, r.returncode,
                                         r.stderr.strip()[-400:]))
        rows.append((mode + " " + label,
                 "%s/%d" % (plen, olen) if plen != "chat" else "chat", conc, n,
                     "no result", "", "", "", "", "", ""))
        failed += 1
        return
    errs = j.get("errors", j.get("failed", 0))
    failed += errs
    if errs:
        log_failures(cl, mode, j, errs, r.stderr.strip()[-300:])
    ttft, tpot = j.get("ttft_ms", {}), j.get("tpot_ms", {})
    tok_s = j.get("tok_per_s", j.get("output_tok_per_s", 0))
    rows.append((mode + " " + label,
                 "%s/%d" % (plen, olen) if plen != "chat" else "chat", conc,
                 j.get("requests", n), errs, "{:,.0f} ({:,.0f})".format(
                     tok_s, j.get("tok_per_s_mid", 0)),
                 "" if shared else of_floor(plen, olen, conc, tok_s),
                 "%.0f / %.0f" % (ttft.get("p50", 0), ttft.get("p99", 0)),
                 "%.1f / %.1f" % (tpot.get("p50", 0), tpot.get("p99", 0)),
                 PEER.get((plen, olen), ""),
                 hit_rate(cl) if mode.startswith(("prefix", "rand", "chat"))
                 else ""))
    log("%s %s %sx%d c%d: %s" % (mode, label, plen, olen, conc, rows[-1]))
    if before:
        phase_note(before, scrape(), "%s %s %s/%d c%s" % (
            mode, label, plen, olen, conc))
    write_table()


def log_failures(cl, what, j, errs, stderr=""):
    """Why a run's requests failed, in the log that comes back (worker
    logs may not): the bench's error codes and first message, then each
    worker's first ERROR / WARN lines."""
    first = j.get("first_errors") or [{}]
    log("%s: %d failed %s, first: %s" % (
        what, errs, json.dumps(j.get("errors_by_code", {})),
        first[0].get("message", stderr)))
    for name, _ in cl.procs:
        bad = [ln for ln in cl.logtext(name).splitlines()
               if " ERROR " in ln or " WARN " in ln][:5]
        for ln in bad:
            log("  %s: %s" % (name, ln[:300]))


def sweep(cl, mode, plen, olen, rates, n):
    """One `baton bench --rates` (each rate its own prompts): a row a
    rate into sweep_rows, the plot beside TABLE."""
    global failed
    tag = "%s_%dx%d" % (mode, plen, olen)
    path = os.path.join(cl.dir, "sweep_%s.json" % tag)
    svg = os.path.join(os.path.dirname(os.path.abspath(TABLE)),
                       "sweep_%s.svg" % tag)
    cmd = cluster_harness.bench_cmd(BIN, cl.ep, n, plen, olen, VOCAB, 1000,
                                    50, path, conc=SWEEP_CONC,
                                    seed=next(RUN_SEEDS))
    cmd += ["--rates", ",".join("%g" % r for r in rates), "--plot", svg]
    left = DEADLINE - time.time()
    before = scrape()
    try:
        r = subprocess.run(cmd, capture_output=True, text=True,
                           timeout=max(30, left))
        if before:  # the whole sweep's steps (1P+1D: the hand-offs' cost)
            phase_note(before, scrape(), "%s sweep %d/%d at %s req/s" % (
                mode, plen, olen, ",".join("%g" % x for x in rates)))
        runs = json.load(open(path))
    except (subprocess.TimeoutExpired, OSError, ValueError) as e:
        log("%s sweep %dx%d: no result (%s)" % (mode, plen, olen, e))
        sweep_rows.append((mode, "%d/%d" % (plen, olen), "", "", "no result",
                           "", "", "", "", ""))
        failed += 1
        write_table()
        return
    for j in runs if isinstance(runs, list) else [runs]:
        errs = j.get("failed", j.get("errors", 0))
        failed += errs
        if errs:
            log_failures(cl, "%s sweep at %s req/s" % (
                mode, j.get("rate_label", j.get("rate"))), j, errs)
        tok_s = j.get("tok_per_s", 0)
        ttft, tpot = j.get("ttft_ms", {}), j.get("tpot_ms", {})
        sweep_rows.append((
            mode, "%d/%d" % (plen, olen), j.get("rate_label", j.get("rate")),
            j.get("requests", n), errs, "{:,.0f}".format(tok_s),
            of_floor(plen, olen, SWEEP_CONC, tok_s),
            "%.2f" % j.get("goodput_req_per_s", 0),
            "%.0f / %.0f" % (ttft.get("p50", 0), ttft.get("p99", 0)),
            "%.1f / %.1f" % (tpot.get("p50", 0), tpot.get("p99", 0))))
        log("%s sweep %s" % (mode, sweep_rows[-1]))
    if r.returncode != 0:
        log("%s sweep %dx%d: rc %d %s" % (mode, plen, olen, r.returncode,
                                          r.stderr.strip()[-300:]))
    write_table()


class Cluster(cluster_harness.Cluster):
    def __init__(self, mode, env):
        super().__init__(BIN, WORK, mode, env, "DECODE", log)
        self.start_router(extra=["--policy", "kv-aware"]
                          if mode == "chat-kv" else
                          ["--policy", "round-robin"]
                          if mode == "chat-rr" else [])
        self.names = []
        for name, args in worker_cmds(mode, self.ctl):
            self.spawn(name, args, "INFO")
            self.names.append(name)

    def wait_registered(self, limit):
        """Until `baton status --wait-workers` says the cluster serves;
        False at once when a worker exited (a device call's minutes are
        not spent waiting on a process that died at start)."""
        n = len(self.names)
        want = "%d,%d" % (n, n) if self.label.startswith("chat") else "1,1"
        until = time.time() + limit
        while time.time() < until and not self.dead():
            step = int(max(1, min(5, until - time.time())))
            r = subprocess.run([BIN + "/baton", "status", "--router",
                                self.ep, "--wait-workers", want,
                                "--timeout", str(step)],
                               capture_output=True, text=True)
            if r.returncode == 0:
                return True
        return False


def run_mode(mode):
    mps = None
    env = os.environ
    if mode == "disagg" or mode.startswith("chat"):
        mps, why = cluster_harness.mps_start(WORK)
        if mps is None:
            log("%s without MPS: %s" % (mode, why))
        else:
            env = mps[1]
    cl = Cluster(mode, env)
    t0 = time.time()
    if not cl.wait_registered(180):
        log("%s: workers did not register; exited: %s" % (mode, cl.dead()))
        for name in cl.dead():
            log("%s's log ends: %s" % (name, cl.logtext(name)[-600:]))
        rows.append((mode, "", "", "", "no workers", "", "", "", "", "",
                     ""))
        cl.stop()
        cluster_harness.mps_stop(mps, log, 2)
        return
    if mode.startswith(("prefix", "rand", "chat")):
        log("%s: registered after %.1f s" % (mode, time.time() - t0))
        if mode.startswith("prefix"):
            for (shared, plen, olen), (conc, n) in PREFIX_RUNS:
                bench(cl, mode, plen, olen, conc, n, "warm", shared)
        elif mode.startswith("rand"):
            for (plen, olen), (conc, n) in RAND_RUNS:
                bench(cl, mode, plen, olen, conc, n, "warm")
        else:
            bench(cl, mode, "chat", 0, 0, 0, "warm", args=CHAT)
        cl.stop()
        cluster_harness.mps_stop(mps, log, 2)
        return
    log("%s: registered after %.1f s: cold burst of %d" %
        (mode, time.time() - t0, COLD))
    if COLD > 0:
        bench(cl, mode, COLD_SHAPE[0], COLD_SHAPE[1], COLD, COLD, "cold")
    for (plen, olen), (conc, n) in (TPOT_RUNS if mode == "agg-nobound"
                                    else RUNS):
        if DEADLINE - time.time() < 40:
            log("%s: no time left for %dx%d" % (mode, plen, olen))
            break
        bench(cl, mode, plen, olen, conc, n, "warm")
    for (plen, olen), (rates, n) in ([] if mode == "agg-nobound"
                                     else SWEEPS):
        if DEADLINE - time.time() < 60:
            log("%s: no time left for the %dx%d sweep" % (mode, plen, olen))
            break
        sweep(cl, mode, plen, olen, rates, n)
    cl.stop()
    cluster_harness.mps_stop(mps, log, 2)


def main():
    try:
        subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,"
                        "clocks.sm,power.draw", "--format=csv"])
    except OSError:
        log("no nvidia-smi (a dry run on the CPU?)")
    for mode in MODES:
        if DEADLINE - time.time() < 60:
            log("skipping %s: time" % mode)
            continue
        run_mode(mode)
    write_table()
    print(open(TABLE).read())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
