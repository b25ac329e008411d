#!/usr/bin/env python3
"""gpu_cluster.py BIN_DIR OUT_DIR - the cluster on one GPU (issue 7), run
ON THE DEVICE MACHINE by tests/gpu/run_gpu_cluster.sh (never in CI).

Phases, each with real processes and --device cuda:
  A  aggregated: `baton up --prefill 0 --decode 1` (decode --role both),
     float32: greedy ids of the golden prompts == golden.jsonl (the CPU
     cluster's / `baton run`'s ids).
  B  1 prefill + 1 decode via `baton up`, float32: the pair's transport is
     cuda-ipc (printed by baton up), ids == golden and == phase A.
  C  bf16 (the CUDA default): aggregated vs 1P+1D over CUDA IPC give the
     same ids.
  D  kill -9 of the prefill worker mid-prompt (slowed with
     --step-delay-ms) while requests wait; a new prefill worker takes them
     over; ids == golden.  With CUDA MPS when the daemon starts (prefill
     and decode get CUDA_MPS_ACTIVE_THREAD_PERCENTAGE 60 / 40), else
     time-sliced.
  F  prefix hits across a CUDA IPC hand-off (issue 38), float32: per
     golden line, the prompt plus half its greedy ids, then the prompt
     plus all but 8 of them (the first's blocks cached in both workers):
     the second hand-off moves only the blocks the decode worker lacks
     (`kv_link_route_t.first_block` > 0: the decode log's "blocks held"
     lines count them); both continue exactly as golden.jsonl.
  E  speculation with the draft head on the GPU: `baton up --prefill 1
     --decode 1 --spec-head H --spec fixed` in float32 with
     BT_DRAFT_DEVICE=device (auto would draft a head this small on the
     host): the prefill worker ships each prompt's last hidden row, the
     decode worker imports it into the device stash, so every request's
     first decode step drafts; ids == golden.  H is
     $BT_SHARED_DIR/heads/aidreams260K.bin.head.safetensors when present,
     else phase E is skipped (reported).
BT_GPU_CLUSTER_PHASES (default ABCDEF) picks the phases.
Prints a summary table last; exits nonzero on any failure.
"""
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time

import cluster_harness

BIN = sys.argv[1]
OUT = sys.argv[2]
SHARED = os.environ["BT_SHARED_DIR"]
MODEL = SHARED + "/models/aidreams260K.bin"
DEVICE = os.environ.get("BT_GPU_CLUSTER_DEVICE", "cuda")  # cpu: dry run
rows = []
fails = 0


def log(msg):
    print(msg, flush=True)


GOLD = cluster_harness.golden(SHARED + "/models")


def generate(port, prompt, max_tokens, timeout=60):
    cmd = cluster_harness.generate_cmd(BIN, port, prompt, max_tokens)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    if r.returncode != 0:
        return None, r.stderr.strip()[-300:]
    return [int(x) for x in r.stdout.split()], ""


def run_golden(port, label):
    ids_all = []
    bad = 0
    for i, (p, want, mt) in enumerate(GOLD):
        got, err = None, ""
        for _ in range(50):  # workers may still be registering
            got, err = generate(port, p, mt)
            if got is not None:
                break
            time.sleep(0.2)
        ids_all.append(got)
        if got != want:
            bad += 1
            log("FAIL %s prompt %d: got %s want %s %s" % (label, i, got,
                                                          want, err))
    return ids_all, bad


def check(name, ok, detail=""):
    global fails
    rows.append((name, "PASS" if ok else "FAIL", detail))
    if not ok:
        fails += 1
    log("%s %s %s" % ("PASS" if ok else "FAIL", name, detail))


def up(label, args, env=None):
    port = 21000 + random.randint(0, 20000)
    logdir = os.path.join(OUT, label)
    os.makedirs(logdir, exist_ok=True)
    f = open(os.path.join(logdir, "up.out"), "w")
    p = subprocess.Popen([BIN + "/baton", "up", "--no-curve", "--model", MODEL, "--port",
                          str(port), "--log-dir", logdir, "--device",
                          DEVICE] + args, stdout=f, stderr=subprocess.STDOUT,
                         env=env)
    text = ""
    for _ in range(300):
        text = open(os.path.join(logdir, "up.out")).read()
        if "kv transports" in text and re.search(r" -> .*: ", text):
            break
        time.sleep(0.1)
    return p, port, text


def down(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        p.kill()


def transports(text):
    return re.findall(r"^  (\S+) -> (\S+): (\S+)$", text, re.M)


def phase_up(label, args, env=None):
    t0 = time.time()
    p, port, text = up(label, args, env)
    log(text)
    tr = transports(text)
    ids, bad = run_golden(port, label)
    down(p)
    return tr, ids, bad, time.time() - t0


def grep_logs(label, pattern):
    d = os.path.join(OUT, label)
    hits = 0
    for name in os.listdir(d):
        for line in open(os.path.join(d, name), errors="replace"):
            if re.search(pattern, line):
                hits += 1
    return hits


def mps_start():
    exe = shutil.which("nvidia-cuda-mps-control")
    if exe is None:
        for cand in ("/usr/bin/nvidia-cuda-mps-control",
                     "/usr/local/nvidia/bin/nvidia-cuda-mps-control"):
            if os.path.exists(cand):
                exe = cand
    if exe is None:
        return None, "nvidia-cuda-mps-control not found"
    env = dict(os.environ)
    env["CUDA_MPS_PIPE_DIRECTORY"] = os.path.join(OUT, "mps-pipe")
    env["CUDA_MPS_LOG_DIRECTORY"] = os.path.join(OUT, "mps-log")
    os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"], exist_ok=True)
    os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"], exist_ok=True)
    r = subprocess.run([exe, "-d"], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return None, "mps -d failed: " + r.stderr.strip()
    return (exe, env), ""


def mps_stop(mps):
    if mps is None:
        return
    exe, env = mps
    subprocess.run([exe], input="quit\n", env=env, text=True,
                   capture_output=True, timeout=20)


def phase_kill(mps):
    """Phase D: kill -9 of a slowed prefill mid-prompt, manual processes."""
    label = "D-kill-prefill"
    logdir = os.path.join(OUT, label)
    os.makedirs(logdir, exist_ok=True)
    port = 21000 + random.randint(0, 20000)
    ctl = "tcp://127.0.0.1:%d" % (port + 1)
    base = dict(os.environ) if mps is None else dict(mps[1])
    procs = []

    def spawn(name, args, pct=None):
        env = dict(base)
        env["BT_LOG"] = "INFO"  # "CUDA IPC pool ... mapped" is INFO
        if mps is not None and pct is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(pct)
        f = open(os.path.join(logdir, name + ".log"), "w")
        p = subprocess.Popen([BIN + "/" + args[0]] + args[1:], stdout=f,
                             stderr=subprocess.STDOUT, env=env)
        procs.append(p)
        return p

    spawn("router", ["baton-router", "--listen", "tcp://127.0.0.1:%d" % port,
                     "--control", ctl, "--heartbeat-ms", "100",
                     "--heartbeat-miss", "3"])
    common = ["--router", ctl, "--model", MODEL, "--device", DEVICE,
              "--precision", "f32"]
    p0 = spawn("p0", ["baton-prefill"] + common +
               ["--name", "p0", "--step-delay-ms", "1500"], 60)
    spawn("d0", ["baton-decode"] + common + ["--name", "d0"], 40)
    time.sleep(4)  # CUDA init + registration
    gens = []
    for i, (p, want, mt) in enumerate(GOLD):
        cmd = cluster_harness.generate_cmd(BIN, port, p, mt)
        gens.append(subprocess.Popen(cmd, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True))
    time.sleep(0.8)  # p0 holds the prompts (sleeping before its batch)
    p0.kill()
    p0.wait()
    spawn("p1", ["baton-prefill"] + common + ["--name", "p1"], 60)
    bad = 0
    for g, (p, want, mt) in zip(gens, GOLD):
        try:
            out, err = g.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            g.kill()
            out, err = "", "timeout"
        got = [int(x) for x in out.split()] if g.returncode == 0 else None
        if got != want:
            bad += 1
            log("FAIL kill prompt: got %s want %s %s" % (got, want,
                                                        err[-300:]))
    cluster_harness.stop_procs([(None, p) for p in procs], 20)
    mapped = grep_logs(label, r"CUDA IPC pool .* mapped")
    inline = grep_logs(label, r"goes inline|falling back to inline")
    return bad, mapped, inline


def phase_spec():
    """Phase E: 1P+1D, f32, the draft head on the GPU."""
    label = "E-disagg-spec-f32"
    head = SHARED + "/heads/aidreams260K.bin.head.safetensors"
    if not os.path.exists(head):
        check("E 1P+1D speculation, head on the GPU", True,
              "skipped: no trained head at " + head)
        return
    env = dict(os.environ)
    env["BT_LOG"] = "INFO"  # the decode worker's per-request SPEC lines
    env["BT_DRAFT_DEVICE"] = "device"
    tr, ids, bad, secs = phase_up(label, ["--prefill", "1", "--decode", "1",
                                          "--precision", "f32",
                                          "--spec-head", head,
                                          "--spec", "fixed"], env)
    drafted = grep_logs(label, r"first decode step: drafted [1-9]")
    plain = grep_logs(label, r"first decode step: drafted 0 ")
    dev = grep_logs(label, r"device draft head: ")
    acc = 0.0
    for name in os.listdir(os.path.join(OUT, label)):
        for line in open(os.path.join(OUT, label, name), errors="replace"):
            m = re.search(r"accept-length: ([0-9.]+) tree_steps:([0-9]+)",
                          line)
            if m and int(m.group(2)) > 0:
                acc = float(m.group(1))
    check("E 1P+1D speculation (head on the GPU) == golden, first steps "
          "draft", bad == 0 and drafted == len(GOLD) and plain == 0 and
          dev >= 1, "%d/%d prompts; first step drafted on %d, plain on %d; "
          "device head %d; accept-length %.2f; transport %s; %.1fs" %
          (len(GOLD) - bad, len(GOLD), drafted, plain, dev, acc,
           [t[2] for t in tr], secs))


def phase_prefix():
    label = "F-prefix-cuda-ipc-f32"
    env = dict(os.environ, BT_LOG="DEBUG")  # the "blocks held" lines
    p, port, text = up(label, ["--prefill", "1", "--decode", "1",
                               "--precision", "f32"], env)
    tr = transports(text)
    bad = n = 0
    for i, (prompt, want, _) in enumerate(GOLD):
        for keep in (len(want) // 2, len(want) - 8):
            got, err = None, ""
            for _ in range(50):  # workers may still be registering
                got, err = generate(port, prompt + want[:keep], 8)
                if got is not None:
                    break
                time.sleep(0.2)
            n += 1
            if got != want[keep:keep + 8]:
                bad += 1
                log("FAIL %s line %d keep %d: got %s want %s %s" %
                    (label, i, keep, got, want[keep:keep + 8], err))
    down(p)
    held = grep_logs(label, r"reserved blocks held")
    inline = grep_logs(label, r"goes inline|falling back to inline")
    check("F prefix hits over cuda-ipc f32 == golden", bad == 0 and
          held >= 1 and inline == 0 and len(tr) == 1 and
          tr[0][2] == "cuda-ipc",
          "%d/%d requests, hand-offs with held blocks %d, inline %d, "
          "transport %s" % (n - bad, n, held, inline, [t[2] for t in tr]))


def main():
    random.seed(os.getpid())
    phases = os.environ.get("BT_GPU_CLUSTER_PHASES", "ABCDEF")
    log("golden prompts: %d (aidreams260K)" % len(GOLD))
    if phases == "E":  # speculation only
        phase_spec()
        return summary()
    if phases == "F":  # prefix hits only
        phase_prefix()
        return summary()
    # A: aggregated, f32.
    tr, ids_a, bad, secs = phase_up("A-aggregated-f32",
                                    ["--prefill", "0", "--decode", "1",
                                     "--precision", "f32"])
    check("A aggregated f32 == golden (CPU)", bad == 0 and
          all(t[2] == "local" for t in tr) and len(tr) == 1,
          "%d/%d prompts, transports %s, %.1fs" %
          (len(GOLD) - bad, len(GOLD), [t[2] for t in tr], secs))
    # B: 1P+1D over CUDA IPC, f32.
    tr, ids_b, bad, secs = phase_up("B-disagg-f32",
                                    ["--prefill", "1", "--decode", "1",
                                     "--precision", "f32"])
    inline = grep_logs("B-disagg-f32", r"goes inline|falling back to inline")
    check("B 1P+1D cuda-ipc f32 == golden", bad == 0 and len(tr) == 1 and
          tr[0][2] == "cuda-ipc" and inline == 0,
          "%d/%d prompts, transport %s, inline fallbacks %d, %.1fs" %
          (len(GOLD) - bad, len(GOLD), [t[2] for t in tr], inline, secs))
    check("B ids == A ids (f32)", ids_a == ids_b)
    # C: bf16 aggregated vs disaggregated.
    _, ids_ca, _, _ = phase_up("C-aggregated-bf16",
                               ["--prefill", "0", "--decode", "1"])
    tr, ids_cd, _, _ = phase_up("C-disagg-bf16",
                                ["--prefill", "1", "--decode", "1"])
    same = ids_ca == ids_cd and None not in ids_ca
    check("C bf16 1P+1D (cuda-ipc) == aggregated bf16", same and
          len(tr) == 1 and tr[0][2] == "cuda-ipc",
          "transport %s" % [t[2] for t in tr])
    # D: kill -9 prefill mid-prompt, under MPS if it starts.
    mps, why = mps_start()
    mode = "MPS (prefill 60%% / decode 40%% of SMs)" if mps else \
        "time-sliced (%s)" % why
    try:
        bad, mapped, inline = phase_kill(mps)
    finally:
        mps_stop(mps)
    check("D kill -9 prefill mid-prompt, exact", bad == 0 and mapped >= 1
          and inline == 0, "%s; %d/%d prompts; IPC maps %d; inline %d" %
          (mode, len(GOLD) - bad, len(GOLD), mapped, inline))
    if "E" in phases:
        phase_spec()
    if "F" in phases:
        phase_prefix()
    return summary()


def summary():
    log("")
    log("| check | result | detail |")
    log("| --- | --- | --- |")
    for name, res, detail in rows:
        log("| %s | %s | %s |" % (name, res, detail))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
