"""cluster_harness.py - the process pieces the device cluster harnesses
share (gpu_cluster.py, gpu_cluster2.py, gpu_tp_cluster.py,
bench_gpu_cluster.py): golden prompts, `baton generate` and `baton bench`
command lines, CUDA MPS start/stop, stopping processes, and a Cluster of
a baton-router and its workers logging to one folder.  Imported from the
scripts' own folder; never run by itself.
"""
import json
import os
import random
import re
import shutil
import signal
import subprocess
import time


def golden(models_dir, model="aidreams260K.bin"):
    """golden.jsonl's lines for `model`: (prompt ids, greedy ids, tokens
    to generate)."""
    out = []
    for line in open(os.path.join(models_dir, "golden.jsonl")):
        j = json.loads(line)
        if j.get("model") == model:
            out.append((j["prompt_ids"], j["greedy_ids"],
                        j["steps"] - len(j["prompt_ids"]) + 1))
    return out


def generate_cmd(bin_dir, port, prompt, max_tokens):
    """`baton generate` of a golden prompt: greedy ids to stdout, stopping
    only at `max_tokens` (or id 1)."""
    return [bin_dir + "/baton", "generate", "--router",
            "tcp://127.0.0.1:%d" % port, "--prompt-ids",
            " ".join(map(str, prompt)), "--max-tokens", str(max_tokens),
            "--ignore-eos", "--stop-id", "1", "--ids"]


def generate_ids(bin_dir, port, prompt, max_tokens, timeout):
    """Runs generate_cmd(); returns (ids, "") or (None, why)."""
    try:
        r = subprocess.run(generate_cmd(bin_dir, port, prompt, max_tokens),
                           capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return None, "timeout"
    if r.returncode != 0:
        return None, r.stderr.strip()[-300:]
    return [int(x) for x in r.stdout.split()], ""


def bench_cmd(bin_dir, ep, n, plen, olen, vocab, slo_ttft, slo_tpot,
              json_path, rate=None, conc=None, seed=None):
    """`baton bench` against the router `ep`: open loop at `rate` or
    closed loop at `conc`, results as JSON in `json_path`."""
    cmd = [os.path.join(bin_dir, "baton"), "bench", "--router", ep,
           "--requests", str(n), "--prompt-len", str(plen), "--output-len",
           str(olen), "--vocab", str(vocab), "--slo-ttft", str(slo_ttft),
           "--slo-tpot", str(slo_tpot), "--json", json_path]
    if seed is not None:
        cmd += ["--seed", str(seed)]
    cmd += ["--rate", "%g" % rate] if rate else ["--concurrency", str(conc)]
    return cmd


def stop_procs(procs, timeout, on_kill=None):
    """SIGTERM to every live process of `procs` ((name, Popen) pairs),
    then waits `timeout` s for each; one that does not stop is killed
    (on_kill(name) first, when given)."""
    for _, p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for name, p in procs:
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            if on_kill is not None:
                on_kill(name)
            p.kill()
            p.wait()


def mps_start(work):
    """Starts a CUDA MPS daemon with its pipe and log folders in `work`.
    Returns ((exe, env), "") - env for its clients - or (None, why)."""
    exe = shutil.which("nvidia-cuda-mps-control")
    for cand in ("/usr/bin/nvidia-cuda-mps-control",
                 "/usr/local/nvidia/bin/nvidia-cuda-mps-control"):
        if exe is None and os.path.exists(cand):
            exe = cand
    if exe is None:
        return None, "nvidia-cuda-mps-control not found"
    env = dict(os.environ)
    env["CUDA_MPS_PIPE_DIRECTORY"] = os.path.join(work, "mps-pipe")
    env["CUDA_MPS_LOG_DIRECTORY"] = os.path.join(work, "mps-log")
    os.makedirs(env["CUDA_MPS_PIPE_DIRECTORY"], exist_ok=True)
    os.makedirs(env["CUDA_MPS_LOG_DIRECTORY"], exist_ok=True)
    r = subprocess.run([exe, "-d"], env=env, capture_output=True, text=True)
    if r.returncode != 0:
        return None, "mps -d failed: " + r.stderr.strip()
    return (exe, env), ""


def mps_stop(mps, log, settle_s=0):
    """Stops what mps_start() started (nothing when `mps` is None), then
    waits `settle_s` s for the server to go."""
    if mps is not None:
        try:
            subprocess.run([mps[0]], input="quit\n", env=mps[1], text=True,
                           capture_output=True, timeout=20)
        except subprocess.TimeoutExpired:
            log("MPS quit timed out")
        if settle_s:
            time.sleep(settle_s)


def worker_args(name, role, common, pre_blocks, dec_blocks, batch):
    """The command line of one worker of a Cluster: role "prefill",
    "decode" or "both" (a decode worker that prefills too); a prompt is
    prefilled in one forward of up to `batch` tokens."""
    if role == "prefill":
        return ["baton-prefill"] + common + [
            "--name", name, "--kv-blocks", pre_blocks, "--max-batch-tokens",
            batch, "--chunk-tokens", batch]
    extra = ["--kv-blocks", dec_blocks]
    if role == "both":
        extra += ["--role", "both", "--max-batch-tokens", batch,
                  "--chunk-tokens", batch]
    return ["baton-decode"] + common + ["--name", name] + extra


class Cluster:
    """A baton-router and its workers, each logging to
    WORK/<label>/<name>.log; the subclass spawns the workers.  `log`
    takes the harness's log lines."""

    def __init__(self, bin_dir, work, label, base_env, debug_subsys, log):
        self.bin_dir = bin_dir
        self.log = log
        self.label = label
        self.dir = os.path.join(work, label)
        os.makedirs(self.dir, exist_ok=True)
        self.base = dict(base_env)
        self.debug_subsys = debug_subsys
        self.procs = []

    def start_router(self, on_retry=None, extra=()):
        """Starts the router (with the `extra` arguments) on a free port
        pair below the ephemeral range (32768-), so connections never hold
        it: a port in use makes the router exit, and another pair is tried
        (on_retry() told first).  Sets port, ep (clients) and ctl
        (workers)."""
        for _ in range(5):
            self.port = 15000 + 2 * random.randint(0, 8000)
            self.ep = "tcp://127.0.0.1:%d" % self.port
            self.ctl = "tcp://127.0.0.1:%d" % (self.port + 1)
            self.procs = []
            self.spawn("router", ["baton-router", "--listen", self.ep,
                                  "--control", self.ctl] + list(extra),
                       "INFO")
            time.sleep(0.3)
            if self.procs[0][1].poll() is None:
                break
            if on_retry is not None:
                on_retry()

    def spawn(self, name, args, level, pct=None):
        """Starts BIN/args[0] with BT_LOG=level (DEBUG only for the
        subsystems given at creation) and, with `pct`, the MPS SM share."""
        env = dict(self.base)
        env["BT_LOG"] = level
        if level == "DEBUG":  # the kv_handoff line, not every subsystem
            env["BT_LOG_SUBSYS"] = self.debug_subsys
        if pct is not None:
            env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(pct)
        f = open(os.path.join(self.dir, name + ".log"), "w")
        p = subprocess.Popen([os.path.join(self.bin_dir, args[0])] +
                             args[1:], stdout=f, stderr=subprocess.STDOUT,
                             env=env)
        self.procs.append((name, p))

    def logtext(self, name):
        try:
            with open(os.path.join(self.dir, name + ".log"),
                      errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def dead(self):
        """The names of the processes that exited."""
        return [n for n, p in self.procs if p.poll() is not None]

    def serving(self, names):
        """Whether every worker of `names` logged that it serves."""
        return all(re.search(r" serving ", self.logtext(n)) for n in names)

    def stop(self):
        stop_procs(self.procs, 15, lambda name: self.log(
            "%s: %s did not stop; kill" % (self.label, name)))
