#!/usr/bin/env python3
"""chaos.py - baton's fault suite (issue 35; tests/chaos/README.md).

Starts real clusters on 127.0.0.1 (baton-router, baton-prefill,
baton-decode, baton-http from --bin), puts load on them with known
prompts, injects one fault per row, and judges every request against the
output of `baton run` for the same prompt, sampling and max tokens:

  identical  finished, tokens (or text, over HTTP) equal `baton run`'s
  wrong      finished without error, but different (cut short included)
  failed     a clear error (an Error message; an HTTP error status with
             an error body)
  hung       no answer within the row's deadline

Prints one markdown table and writes it to OUT/chaos-table.md.  Exits 1
when any row has wrong > 0, hung > 0 or misses its own bound (the `note`
says which), 2 on a setup error.  Every process it starts runs in its own
process group and is killed (SIGKILL to the group) when its row ends, on
SIGINT/SIGTERM, and at exit.

  python3 tests/chaos/chaos.py [--bounded] [--soak-s N] [--rows a,b]
      --bin build/bin --tools build/tests/chaos --models ../shared/models
      --out build/chaos
"""
import argparse
import atexit
import http.client
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
from free_ports import free_ports  # noqa: E402  (tests/free_ports.py)

# ---------------------------------------------------------------- processes

PROCS = []


def _child_setup():
    """In the child: its own session (process group), and SIGKILL when
    the suite dies, even by SIGKILL (a CTest timeout)."""
    os.setsid()
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the suite died before prctl
            os._exit(1)
    except (OSError, AttributeError):
        pass


def spawn(argv, log, stdout=None):
    """Starts argv in its own process group; stderr to log."""
    f = open(log, "ab")
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL,
                         stdout=stdout if stdout is not None else f,
                         stderr=f, preexec_fn=_child_setup)
    f.close()
    p.argv0 = os.path.basename(argv[0])
    PROCS.append(p)
    return p


def kill_proc(p):
    """SIGKILL to p's whole process group, then reap it."""
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        pass


def kill_all():
    for p in list(PROCS):
        kill_proc(p)
    PROCS.clear()


def on_signal(sig, frame):
    kill_all()
    sys.exit(128 + sig)


def free_port_pair():
    """A TCP port p such that p and p+1 were free a moment ago."""
    return free_ports(2)


def rss_kib(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


# ----------------------------------------------------------------- cluster


class Cluster:
    """One row's processes: a router on a fresh port pair, workers,
    optionally baton-http.  stop() kills all of them."""

    def __init__(self, suite, row):
        self.s = suite
        self.dir = os.path.join(suite.out, row)
        shutil.rmtree(self.dir, ignore_errors=True)  # a previous run's
        os.makedirs(self.dir)
        port = free_port_pair()
        self.listen = "tcp://127.0.0.1:%d" % port
        self.control = "tcp://127.0.0.1:%d" % (port + 1)
        self.procs = {}
        self.router_args = []
        self.http_port = None
        self.faulted = set()  # processes the row itself signalled

    def log(self, name):
        return os.path.join(self.dir, name + ".log")

    def _spawn(self, name, argv, stdout=None):
        p = spawn(argv, self.log(name), stdout)
        self.procs[name] = p
        return p

    def router(self, *extra):
        self.router_args = list(extra)
        return self._spawn("router", [self.s.bin("baton-router"),
                                      "--listen", self.listen,
                                      "--control", self.control] +
                           self.router_args)

    def restart_router(self):
        """A new router on the same ports (the old one must be dead)."""
        return self._spawn("router", [self.s.bin("baton-router"),
                                      "--listen", self.listen,
                                      "--control", self.control] +
                           self.router_args)

    def worker(self, kind, name, *extra):
        exe = "baton-prefill" if kind == "prefill" else "baton-decode"
        return self._spawn(name, [self.s.bin(exe), "--router", self.control,
                                  "--model", self.s.model,
                                  "--tokenizer", self.s.tokenizer,
                                  "--threads", "1", "--name", name] +
                           list(extra))

    def http(self, *extra, tokenizer=True):
        self.http_port = free_port_pair()
        return self._spawn("http", [self.s.bin("baton-http"),
                                    "--router", self.listen,
                                    "--listen", "127.0.0.1:%d" %
                                    self.http_port] +
                           (["--tokenizer", self.s.tokenizer]
                            if tokenizer else []) + list(extra))

    def wait_workers(self, n_prefill, n_decode, timeout=30):
        r = subprocess.run([self.s.bin("baton"), "status", "--router",
                            self.listen, "--wait-workers",
                            "%d,%d" % (n_prefill, n_decode), "--timeout",
                            str(timeout)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=timeout + 10)
        if r.returncode != 0:
            raise RowError("workers did not register (%d,%d)" %
                           (n_prefill, n_decode))

    def status(self):
        try:
            r = subprocess.run([self.s.bin("baton"), "status", "--router",
                                self.listen, "--json"],
                               capture_output=True, timeout=10)
            return json.loads(r.stdout) if r.returncode == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            return None

    def wait_http(self, timeout=20):
        until = time.time() + timeout
        while time.time() < until:
            try:
                c = http.client.HTTPConnection("127.0.0.1", self.http_port,
                                               timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.1)
        raise RowError("baton-http not ready")

    def signal(self, name, sig):
        self.faulted.add(name)
        p = self.procs[name]
        if sig == signal.SIGKILL:
            kill_proc(p)
        else:
            os.kill(p.pid, sig)

    def crashed(self):
        """Processes that exited by themselves with a signal or error."""
        out = []
        for name, p in self.procs.items():
            rc = p.poll()
            if name not in self.faulted and rc is not None and rc != 0:
                out.append("%s rc=%d" % (name, rc))
        return out

    def stop(self):
        for p in self.procs.values():
            kill_proc(p)
            if p in PROCS:
                PROCS.remove(p)


class RowError(Exception):
    pass


# -------------------------------------------------------------------- load


class Load:
    """One chaos_load run against a router."""

    def __init__(self, c, name, refs, conc, hang_ms, duration=None,
                 requests=None, clients=4, mark=False):
        self.out = os.path.join(c.dir, name + ".requests")
        argv = [c.s.tool("chaos_load"), "--router", c.listen, "--refs",
                refs, "--out", self.out, "--concurrency", str(conc),
                "--hang-ms", str(hang_ms), "--clients", str(clients), "-v"]
        if mark:
            argv.append("--mark")
        if duration is not None:
            argv += ["--duration-s", str(duration)]
        else:
            argv += ["--requests", str(requests)]
        self.limit = (duration or 0) + hang_ms / 1000.0 + 60
        self.t0 = time.time()
        self.p = spawn(argv, c.log(name), stdout=subprocess.PIPE)

    def mark(self):
        """The fault ended now (recovery is timed from here)."""
        if self.p.poll() is None:
            os.kill(self.p.pid, signal.SIGUSR1)

    def result(self):
        try:
            out, _ = self.p.communicate(
                timeout=max(1, self.limit - (time.time() - self.t0)))
        except subprocess.TimeoutExpired:
            kill_proc(self.p)
            raise RowError("the load driver itself did not finish")
        m = dict(re.findall(r"(\w+)=(-?[\d.]+)", out.decode()))
        if "sent" not in m:
            raise RowError("the load driver failed (rc %s)" %
                           self.p.returncode)
        r = {k: int(m[k]) for k in ("sent", "identical", "wrong", "failed",
                                     "hung")}
        r["recovery"] = float(m["recovery_s"]) if float(
            m["mark_s"]) >= 0 else None
        r["errors"] = self.error_summary()
        return r

    def error_summary(self):
        """The distinct error messages (first 3) of failed requests."""
        seen = {}
        try:
            with open(self.out) as f:
                for line in f:
                    parts = line.split(None, 9)
                    if len(parts) == 10 and parts[5] in ("failed",
                                                         "wrong"):
                        key = parts[5] + ": " + re.sub(
                            r"\d{4,}", "N", parts[9].strip().strip('"'))[:70]
                        seen[key] = seen.get(key, 0) + 1
        except OSError:
            pass
        return ["%dx %s" % (n, k) for k, n in
                sorted(seen.items(), key=lambda x: -x[1])[:3]]


# -------------------------------------------------------------- HTTP load


def http_completion(port, prompt_ids, max_tokens, timeout, source):
    """POSTs one greedy completion.  Returns (outcome, text/error, secs):
    outcome 'ok' (text), 'error' (a clear HTTP error), 'unclear' (the
    connection broke without an answer) or 'hung' (no answer in time)."""
    t0 = time.time()
    body = json.dumps({"prompt": prompt_ids, "max_tokens": max_tokens,
                       "temperature": 0, "ignore_eos": True})
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout,
                                       source_address=(source, 0))
        c.request("POST", "/v1/completions", body,
                  {"Content-Type": "application/json"})
        r = c.getresponse()
        data = r.read()
        c.close()
    except socket.timeout:
        return "hung", "no answer in %.0f s" % timeout, time.time() - t0
    except (OSError, http.client.HTTPException) as e:
        if time.time() - t0 >= timeout:
            return "hung", str(e), time.time() - t0
        return "unclear", "%s: %s" % (type(e).__name__, e), time.time() - t0
    dt = time.time() - t0
    try:
        j = json.loads(data)
    except ValueError:
        return "unclear", "HTTP %d, body not JSON" % r.status, dt
    if r.status == 200:
        try:
            return "ok", j["choices"][0]["text"], dt
        except (KeyError, IndexError, TypeError):
            return "unclear", "HTTP 200 without choices", dt
    msg = (j.get("error") or {}).get("message") if isinstance(j, dict) \
        else None
    if not msg:
        return "unclear", "HTTP %d without an error message" % r.status, dt
    retry = r.getheader("Retry-After")
    return "error", "HTTP %d %s%s" % (r.status, msg,
                                      " (Retry-After)" if retry else ""), dt


class HttpLoad:
    """Closed-loop HTTP clients (threads) from source address `source`."""

    def __init__(self, c, refs, threads, duration, timeout,
                 source="127.0.0.2"):
        self.c, self.refs, self.timeout = c, refs, timeout
        self.source = source
        self.results = []  # (outcome, start, secs, detail)
        self.lock = threading.Lock()
        self.stop_at = time.time() + duration
        self.seq = 0
        self.threads = [threading.Thread(target=self._run, daemon=True)
                        for _ in range(threads)]
        for t in self.threads:
            t.start()

    def _run(self):
        while time.time() < self.stop_at:
            with self.lock:
                ref = self.refs[self.seq % len(self.refs)]
                self.seq += 1
            t0 = time.time()
            out, detail, dt = http_completion(
                self.c.http_port, ref["prompt"], ref["max_tokens"],
                self.timeout, self.source)
            if out == "ok":
                out = "identical" if detail == ref["text"] else "wrong"
            with self.lock:
                self.results.append((out, t0, dt, detail))
            if out == "error" and "Retry-After" in detail:
                time.sleep(1.0)
            elif out in ("error", "unclear"):
                time.sleep(0.05)

    def result(self, mark=None):
        """Counts; recovery from `mark` (a time.time()) to the end of the
        first identical request sent after it."""
        for t in self.threads:
            t.join(timeout=self.timeout + 30)
        res = {"sent": len(self.results), "recovery": None}
        if mark is not None:
            ends = [r[1] + r[2] for r in self.results
                    if r[0] == "identical" and r[1] >= mark]
            res["recovery"] = min(ends) - mark if ends else -1.0
        for k in ("identical", "wrong", "error", "unclear", "hung"):
            res[k] = sum(1 for r in self.results if r[0] == k)
        res["failed"] = res["error"] + res["unclear"]
        seen = {}
        for r in self.results:
            if r[0] not in ("identical",):
                key = r[0] + ": " + re.sub(r"\d{4,}", "N",
                                           str(r[3]))[:60]
                seen[key] = seen.get(key, 0) + 1
        res["errors"] = ["%dx %s" % (n, k) for k, n in
                         sorted(seen.items(), key=lambda x: -x[1])[:3]]
        return res


def slowloris_main(port, n, duration):
    """The slowloris attacker (run as its own process): n connections to
    127.0.0.1:port that start a request and never finish it, one header
    line every 2 s, reconnecting whenever the server closes one."""
    import selectors
    sel = selectors.DefaultSelector()
    socks = {}
    head = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
    end = time.time() + duration

    def open_one():
        s = socket.socket()
        s.setblocking(False)
        try:
            s.connect_ex(("127.0.0.1", port))
        except OSError:
            s.close()
            return
        socks[s] = 0.0
        sel.register(s, selectors.EVENT_READ)

    while len(socks) < n:
        open_one()
    next_tick = 0.0
    while time.time() < end:
        for key, _ in sel.select(timeout=0.2):
            s = key.fileobj
            try:
                data = s.recv(4096)
            except OSError:
                data = b""
            if not data:  # closed by the server: come back
                sel.unregister(s)
                s.close()
                del socks[s]
                open_one()
        if time.time() >= next_tick:
            next_tick = time.time() + 2.0
            for s in list(socks):
                try:
                    s.send(head if socks[s] == 0.0 else b"X-a: b\r\n")
                    socks[s] = 1.0
                except (BlockingIOError, InterruptedError):
                    pass
                except OSError:
                    sel.unregister(s)
                    s.close()
                    del socks[s]
                    open_one()
    return 0


# ------------------------------------------------------------------- suite


class Suite:
    def __init__(self, a):
        self.a = a
        self.out = os.path.abspath(a.out)
        os.makedirs(self.out, exist_ok=True)
        self.model = os.path.join(a.models, "aidreams260K.bin")
        self.tokenizer = os.path.join(a.models, "aidreams-tok512.bin")
        self.refs_cache = {}
        self.prompts = self.load_prompts()
        # Load phase length and request deadline of an ordinary row.
        self.dur = 6.0 if a.bounded else 30.0
        self.hang_ms = 15000 if a.bounded else 60000

    def bin(self, name):
        return os.path.join(self.a.bin, name)

    def tool(self, name):
        return os.path.join(self.a.tools, name)

    def load_prompts(self):
        """Prompt ids: the golden prompts for the model, and longer ones
        made by appending a few of their greedy tokens."""
        base = []
        with open(os.path.join(self.a.models, "golden.jsonl")) as f:
            for line in f:
                j = json.loads(line)
                if j.get("model") == "aidreams260K.bin":
                    base.append((j["prompt_ids"], j["greedy_ids"]))
        if not base:
            raise RuntimeError("no aidreams260K.bin prompts in golden.jsonl")
        out = [p for p, _ in base]
        out += [p + g[:5 + 3 * i] for i, (p, g) in enumerate(base)]
        return out[:8]

    def baton_run(self, prompt, max_tokens, temp, seed, ids=True):
        argv = [self.bin("baton"), "run", "--model", self.model,
                "--tokenizer", self.tokenizer, "--prompt-ids",
                " ".join(map(str, prompt)), "--max-tokens", str(max_tokens),
                "--ignore-eos", "--threads", "1"]
        if ids:
            argv.append("--ids")
        if temp > 0:
            argv += ["--temperature", str(temp), "--seed", str(seed)]
        r = subprocess.run(argv, capture_output=True, timeout=60)
        if r.returncode != 0:
            raise RuntimeError("baton run failed: %s" % r.stderr[-300:])
        return r.stdout.decode()

    def refs(self, max_tokens, sampled=True):
        """The reference file for chaos_load: every prompt greedy and
        (sampled) seeded at temperature 0.8, as `baton run` answers."""
        key = (max_tokens, sampled)
        if key in self.refs_cache:
            return self.refs_cache[key]
        path = os.path.join(self.out, "refs-%d%s.txt" %
                            (max_tokens, "s" if sampled else ""))
        lines = []
        for i, p in enumerate(self.prompts):
            for temp, seed in [(0.0, 0)] + ([(0.8, 1000 + i)]
                                             if sampled else []):
                ids = self.baton_run(p, max_tokens, temp, seed).split()
                if len(ids) != max_tokens:
                    raise RuntimeError("baton run gave %d of %d ids" %
                                       (len(ids), max_tokens))
                lines.append("%g %d %d | %s | %s\n" % (
                    temp, seed, max_tokens, " ".join(map(str, p)),
                    " ".join(ids)))
        with open(path, "w") as f:
            f.writelines(lines)
        self.refs_cache[key] = path
        return path

    def http_refs(self, max_tokens):
        out = []
        for p in self.prompts:
            text = self.baton_run(p, max_tokens, 0, 0, ids=False)
            if text.endswith("\n"):
                text = text[:-1]
            out.append({"prompt": p, "max_tokens": max_tokens,
                        "text": text})
        return out


def row_result(name, r, checks, notes=()):
    """Builds a table row: fails on wrong/hung and on each (ok, why)."""
    why = []
    if r["wrong"]:
        why.append("WRONG tokens")
    if r["hung"]:
        why.append("HUNG requests")
    for ok, text in checks:
        if not ok:
            why.append(text)
    return {"test": name, "sent": r["sent"], "identical": r["identical"],
            "wrong": r["wrong"], "failed": r["failed"], "hung": r["hung"],
            "recovery": r.get("recovery"), "ok": not why,
            "note": "; ".join(why + list(notes) + r.get("errors", []))}


def merge(a, b):
    """Counts of two loads of one row; recovery from the second."""
    r = {k: a[k] + b[k] for k in ("sent", "identical", "wrong", "failed",
                                   "hung")}
    r["recovery"] = b["recovery"]
    r["errors"] = (a["errors"] + b["errors"])[:4]
    return r


def recovered(r):
    return (r["recovery"] is not None and r["recovery"] >= 0,
            "no identical request after the fault")


# -------------------------------------------------------------------- rows
# Each row: (name, function(suite, cluster) -> row dict).  Routers use a
# 100 ms heartbeat (3 misses) unless the row is about the defaults.

HB = ["--heartbeat-ms", "100", "--heartbeat-miss", "3"]


def row_baseline(s, c):
    c.router(*HB)
    c.worker("prefill", "p0")
    c.worker("decode", "d0", "--step-delay-ms", "5")
    c.wait_workers(1, 1)
    r = Load(c, "load", s.refs(48), 16, s.hang_ms, duration=s.dur / 2).result()
    return row_result("baseline, no fault", r, [
        (r["failed"] == 0, "failures without a fault")])


def row_kill_decode(s, c):
    c.router(*HB)
    c.worker("prefill", "p0")
    c.worker("decode", "d0", "--step-delay-ms", "10")
    c.worker("decode", "d1", "--step-delay-ms", "10")
    c.wait_workers(1, 2)
    ld = Load(c, "load", s.refs(48), 32, s.hang_ms, duration=s.dur)
    time.sleep(s.dur / 3)
    c.signal("d0", signal.SIGKILL)
    ld.mark()
    r = ld.result()
    return row_result("kill -9 decode (spare up)", r, [
        (r["failed"] == 0, "failures with a spare decode worker"),
        recovered(r)])


def row_kill_prefill(s, c):
    c.router(*HB)
    c.worker("prefill", "p0", "--step-delay-ms", "30")
    c.worker("prefill", "p1", "--step-delay-ms", "30")
    c.worker("decode", "d0", "--step-delay-ms", "5")
    c.wait_workers(2, 1)
    ld = Load(c, "load", s.refs(48), 32, s.hang_ms, duration=s.dur)
    time.sleep(s.dur / 3)
    c.signal("p0", signal.SIGKILL)
    ld.mark()
    r = ld.result()
    return row_result("kill -9 prefill (spare up)", r, [
        (r["failed"] == 0, "failures with a spare prefill worker"),
        recovered(r)])


def row_drain(s, c):
    c.router(*HB)
    c.worker("prefill", "p0")
    c.worker("decode", "d0", "--step-delay-ms", "10")
    c.worker("decode", "d1", "--step-delay-ms", "10")
    c.wait_workers(1, 2)
    ld = Load(c, "load", s.refs(48), 32, s.hang_ms, duration=s.dur)
    time.sleep(s.dur / 3)
    c.signal("d0", signal.SIGTERM)
    ld.mark()
    r = ld.result()
    try:
        rc = c.procs["d0"].wait(timeout=10)
    except subprocess.TimeoutExpired:
        rc = None
    return row_result("SIGTERM drain decode", r, [
        (r["failed"] == 0, "failures during a drain"),
        (rc == 0, "drained worker did not exit 0 (rc %s)" % rc),
        recovered(r)])


def stop_cont(s, c, victim, stop_s):
    ld = Load(c, "load", s.refs(48), 32, s.hang_ms, duration=s.dur)
    time.sleep(s.dur / 3)
    c.signal(victim, signal.SIGSTOP)
    time.sleep(stop_s)
    c.signal(victim, signal.SIGCONT)
    ld.mark()
    return ld.result()


def row_stop_decode(s, c):
    c.router(*HB)
    c.worker("prefill", "p0")
    c.worker("decode", "d0", "--step-delay-ms", "10")
    c.wait_workers(1, 1)
    r = stop_cont(s, c, "d0", 1.5)
    return row_result("SIGSTOP/CONT decode 1.5 s (no spare)", r,
                      [recovered(r)])


def row_stop_prefill(s, c):
    c.router(*HB)
    c.worker("prefill", "p0", "--step-delay-ms", "10")
    c.worker("decode", "d0", "--step-delay-ms", "5")
    c.wait_workers(1, 1)
    r = stop_cont(s, c, "p0", 1.5)
    return row_result("SIGSTOP/CONT prefill 1.5 s (no spare)", r,
                      [recovered(r)])


def router_kill(s, c, down_s, name):
    # Long, slow streams: the workers' old sequences still run when the
    # new router's first requests (whose ids may repeat) arrive.
    c.router(*HB)
    c.worker("prefill", "p0")
    c.worker("decode", "d0", "--step-delay-ms", "20")
    c.wait_workers(1, 1)
    ld = Load(c, "load", s.refs(96), 32, 10000 if s.a.bounded else 15000,
              duration=s.dur + down_s)
    # Mid-way through the router's first requests (ids from 1): a new
    # router that numbers from 1 again meets the same ids still running.
    time.sleep(1.0)
    c.signal("router", signal.SIGKILL)
    time.sleep(down_s)
    c.restart_router()
    # Requests in flight at the kill may stay stuck in `ld`'s slots:
    # new requests come from a second driver, which times recovery.
    ld2 = Load(c, "load-after", s.refs(96), 32, 10000 if s.a.bounded
               else 15000, duration=s.dur / 2, mark=True)
    r = merge(ld.result(), ld2.result())
    return row_result(name, r, [recovered(r)])


def row_router_restart(s, c):
    return router_kill(s, c, 0.3, "router kill -9, restart in 0.3 s")


def row_router_down(s, c):
    return router_kill(s, c, 5.0, "router kill -9, down 5 s")


def row_router_down_http(s, c):
    # Issue item 3 at the HTTP edge: requests in flight through baton-http
    # when the router dies must get an error, not wait for its 600 s.
    c.router(*HB)
    c.worker("prefill", "p0")
    c.worker("decode", "d0", "--step-delay-ms", "20")
    c.wait_workers(1, 1)
    c.http()
    c.wait_http()
    ld = HttpLoad(c, s.http_refs(96), 16, 6.0, 15.0)
    time.sleep(1.5)
    c.signal("router", signal.SIGKILL)
    time.sleep(5.0)
    c.restart_router()
    mark = time.time()
    # The clients stuck on the old router hold their threads: new
    # requests come from new clients, which time recovery.
    ld2 = HttpLoad(c, s.http_refs(96), 8, s.dur / 2, 15.0)
    r1, r2 = ld.result(), ld2.result(mark)
    r = {k: r1[k] + r2[k] for k in ("sent", "identical", "wrong",
                                     "failed", "hung", "unclear")}
    r["recovery"] = r2["recovery"]
    r["errors"] = (r1["errors"] + r2["errors"])[:4]
    return row_result("router kill -9, down 5 s (HTTP)", r, [
        recovered(r),
        (r["unclear"] == 0, "%d answers without a clear error" %
         r["unclear"])])


def row_step_prefill(s, c):
    # Router defaults (heartbeat 250 ms x 4): the row is about them.
    c.router()
    c.worker("prefill", "p0", "--step-delay-ms", "2000")
    c.worker("decode", "d0")
    c.wait_workers(1, 1)
    r = Load(c, "load", s.refs(16), 8, 40000,
             duration=s.dur * 1.5).result()
    return row_result("2 s prefill step", r, [
        (r["failed"] == 0, "a slow step looked like death")])


def row_step_decode(s, c):
    c.router()
    c.worker("prefill", "p0")
    c.worker("decode", "d0", "--step-delay-ms", "2000")
    c.wait_workers(1, 1)
    r = Load(c, "load", s.refs(4), 8, 40000, requests=8).result()
    return row_result("2 s decode step", r, [
        (r["failed"] == 0, "a slow step looked like death")])


def row_takeover(s, c):
    c.router(*HB)
    c.worker("prefill", "p0")
    c.worker("decode", "d0", "--step-delay-ms", "10")
    c.wait_workers(1, 1)
    ld = Load(c, "load", s.refs(48), 32, s.hang_ms, duration=s.dur * 1.5)
    time.sleep(s.dur / 3)
    for victim, role in (("d0", "decode"), ("p0", "prefill")):
        a = spawn([s.tool("chaos_takeover"), "--control", c.control,
                   "--name", victim, "--role", role, "--count", "2",
                   "--interval-ms", "300"], c.log("takeover-" + victim))
        try:
            a.wait(timeout=30)
        except subprocess.TimeoutExpired:
            kill_proc(a)
    ld.mark()
    r = ld.result()
    st = c.status() or {}
    names = sorted(w["name"] for w in st.get("workers", []))
    return row_result("name takeover x2 (decode, prefill)", r, [
        recovered(r),
        (c.procs["d0"].poll() is None and c.procs["p0"].poll() is None,
         "a victim exited")], ["workers after: %s" % ",".join(names)])


def row_queue_timeout(s, c):
    # Issue item 4: a request older than --queue-timeout-ms must still
    # fail over to a free decode worker.
    c.router(*HB, "--queue-timeout-ms", "2000")
    c.worker("prefill", "p0")
    c.worker("decode", "d0", "--step-delay-ms", "100")
    c.wait_workers(1, 1)
    ld = Load(c, "load", s.refs(48), 16, 40000, requests=16)
    time.sleep(1.0)
    c.worker("decode", "d1", "--step-delay-ms", "5")
    c.wait_workers(1, 2)
    time.sleep(max(0.0, 3.0 - (time.time() - ld.t0)))
    c.signal("d0", signal.SIGKILL)
    ld.mark()
    r = ld.result()
    return row_result("failover after --queue-timeout-ms", r, [
        (r["failed"] == 0, "old requests could not fail over")])


def row_slowloris(s, c):
    c.router(*HB)
    c.worker("prefill", "p0")
    c.worker("decode", "d0")
    c.wait_workers(1, 1)
    c.http()
    c.wait_http()
    n = 1100
    dur = 12.0 if s.a.bounded else 60.0
    att = spawn([sys.executable, os.path.abspath(__file__), "--slowloris",
                 str(c.http_port), str(n), str(dur + 5)],
                c.log("slowloris"))
    time.sleep(2.0)
    r = HttpLoad(c, s.http_refs(24), 4, dur, 15.0).result()
    kill_proc(att)
    return row_result("slowloris %d conns (HTTP)" % n, r, [
        (r["identical"] >= 0.9 * r["sent"] and r["sent"] > 0,
         "under 90% of real requests served"),
        (r["unclear"] == 0, "%d answers without a clear error" %
         r["unclear"])])


def big_prompt_flood(port, stop_at, counts):
    """One attacker: 1 MB text prompts, back to back, until stop_at."""
    body = json.dumps({"prompt": "river " * (1 << 18), "max_tokens": 8})
    while time.time() < stop_at:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request("POST", "/v1/completions", body,
                      {"Content-Type": "application/json"})
            resp = c.getresponse()
            st, data = resp.status, resp.read()
            c.close()
            try:
                msg = json.loads(data)["error"]["message"][:50]
            except (ValueError, KeyError, TypeError):
                msg = "?"
        except (OSError, http.client.HTTPException) as e:
            st, msg = 0, type(e).__name__
        counts[(st, msg)] = counts.get((st, msg), 0) + 1


def row_big_prompts(s, c):
    # Issue item 7: 8 clients sending 1 MB (over-long) prompts must not
    # make everyone else wait; they are refused at the edge.
    c.router(*HB)
    c.worker("prefill", "p0")
    c.worker("decode", "d0", "--step-delay-ms", "5")
    c.wait_workers(1, 1)
    c.http(tokenizer=False)  # text goes on to the workers
    c.wait_http()
    refs = s.http_refs(24)
    dur = 5.0 if s.a.bounded else 20.0
    quiet = HttpLoad(c, refs, 4, dur, 30.0)
    quiet.result()
    counts = {}
    flood = [threading.Thread(target=big_prompt_flood, daemon=True,
                              args=(c.http_port, time.time() + dur + 1,
                                    counts)) for _ in range(8)]
    for t in flood:
        t.start()
    time.sleep(0.5)
    ld = HttpLoad(c, refs, 4, dur, 30.0)
    r = ld.result()
    for t in flood:
        t.join(timeout=40)

    def p50(load):
        x = sorted(q[2] for q in load.results if q[0] == "identical")
        return x[len(x) // 2] if x else float("inf")
    q50, f50 = p50(quiet), p50(ld)
    return row_result("8 clients of 1 MB prompts (HTTP)", r, [
        (f50 <= max(1.0, 2 * q50), "p50 latency %.2f s under the flood, "
         "%.2f s without" % (f50, q50)),
        (r["failed"] == 0, "real requests failed"),
        (all(k[0] in (400, 413) for k in counts),
         "big prompts answered %s" % counts)],
        ["big prompts answered %s; p50 %.2f s (quiet %.2f s)" %
         (counts, f50, q50)])


def row_overload(s, c):
    # Capacity: 8 sequences (KV for 8 requests of 48 tokens, --max-seqs 8).
    c.router(*HB)
    c.worker("prefill", "p0")
    c.worker("decode", "d0", "--step-delay-ms", "20", "--kv-blocks", "24",
             "--max-seqs", "8")
    c.wait_workers(1, 1)
    c.http()
    c.wait_http()
    refs = s.http_refs(36)
    dur = 6.0 if s.a.bounded else 30.0
    load1 = HttpLoad(c, refs, 8, dur, 30.0, source="127.0.0.1")
    load1.result()
    r1 = load1.results
    ok1 = sorted(r[2] for r in r1 if r[0] == "identical")
    if not ok1:
        raise RowError("no identical request at 1x")
    p90 = ok1[int(0.9 * (len(ok1) - 1))]
    slo = max(1.0, 2.0 * p90)
    load4 = HttpLoad(c, refs, 32, dur, 30.0, source="127.0.0.1")
    r = load4.result()
    good1 = sum(1 for x in ok1 if x <= slo) / dur
    good4 = sum(1 for x in load4.results
                if x[0] == "identical" and x[2] <= slo) / dur
    lat4 = sorted(x[2] for x in load4.results if x[0] == "identical")
    p50_4 = lat4[len(lat4) // 2] if lat4 else -1
    return row_result("overload 4x (HTTP)", r, [
        (good4 >= 0.9 * good1, "goodput %.1f/s at 4x < 90%% of %.1f/s" %
         (good4, good1)),
        (r["unclear"] == 0, "%d answers without a clear error" %
         r["unclear"])],
        ["SLO %.2f s (2x p90 at 1x); goodput 1x %.1f/s, 4x %.1f/s; "
         "p50 latency 4x %.2f s" % (slo, good1, good4, p50_4)])


def row_soak(s, c):
    secs = s.a.soak_s if s.a.soak_s else (30 if s.a.bounded else 1800)
    c.router(*HB)
    c.worker("prefill", "p0")
    c.worker("decode", "d0", "--step-delay-ms", "2")
    c.wait_workers(1, 1)
    pids = {n: c.procs[n].pid for n in ("router", "p0", "d0")}
    ld = Load(c, "load", s.refs(48), 16, s.hang_ms, duration=secs)
    samples = {n: [] for n in pids}
    t0 = time.time()
    step = max(1.0, secs / 120.0)
    while ld.p.poll() is None and time.time() - t0 < secs + 5:
        for n, pid in pids.items():
            v = rss_kib(pid)
            if v is not None:
                samples[n].append((time.time() - t0, v))
        time.sleep(step)
    r = ld.result()
    # KV accounted for: once idle, every block free, nothing in flight.
    kv_ok, st = False, None
    for _ in range(50):
        st = c.status()
        if st and st["in_flight"] == 0 and st["queued"] == 0 and all(
                w["free_kv_blocks"] == w["total_kv_blocks"]
                for w in st["workers"] if w["role"] == "decode"):
            kv_ok = True
            break
        time.sleep(0.2)
    growth, notes, checks = {}, [], []
    for n, pts in samples.items():
        pts = [p for p in pts if p[0] >= 0.2 * secs]  # after warm-up
        if len(pts) < 2:
            continue
        # least-squares slope, KiB/s -> MiB/h
        mt = sum(p[0] for p in pts) / len(pts)
        mv = sum(p[1] for p in pts) / len(pts)
        den = sum((p[0] - mt) ** 2 for p in pts) or 1.0
        slope = sum((p[0] - mt) * (p[1] - mv) for p in pts) / den
        growth[n] = (slope * 3600 / 1024, (pts[-1][1] - pts[0][1]) / 1024)
    notes.append("RSS MiB/h (slope after warm-up) " + ", ".join(
        "%s %+.1f" % (n, g[0]) for n, g in growth.items()))
    for n, (per_h, total) in growth.items():
        if secs >= 600:
            checks.append((per_h <= 16.0, "%s RSS grows %.1f MiB/h" %
                           (n, per_h)))
        else:  # too short to extrapolate: the absolute growth
            checks.append((total <= 8.0, "%s RSS grew %.1f MiB" %
                           (n, total)))
    checks.append((kv_ok, "KV not accounted for when idle: %s" % (
        json.dumps([(w["name"], w["free_kv_blocks"], w["total_kv_blocks"])
                    for w in (st or {}).get("workers", [])]))))
    checks.append((r["failed"] == 0, "failures without a fault"))
    return row_result("soak %d s" % secs, r, checks, notes)


ROWS = [
    ("baseline", row_baseline),
    ("kill-decode", row_kill_decode),
    ("kill-prefill", row_kill_prefill),
    ("drain", row_drain),
    ("stop-decode", row_stop_decode),
    ("stop-prefill", row_stop_prefill),
    ("router-restart", row_router_restart),
    ("router-down", row_router_down),
    ("router-down-http", row_router_down_http),
    ("step-prefill", row_step_prefill),
    ("step-decode", row_step_decode),
    ("takeover", row_takeover),
    ("queue-timeout", row_queue_timeout),
    ("slowloris", row_slowloris),
    ("big-prompts", row_big_prompts),
    ("overload", row_overload),
    ("soak", row_soak),
]


def table(rows):
    out = ["| test | sent | identical | wrong | failed (clear error) | hung "
           "| recovery s |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        rec = "-" if r["recovery"] is None else (
            "never" if r["recovery"] < 0 else "%.2f" % r["recovery"])
        out.append("| %s%s | %s | %s | %s | %s | %s | %s |" % (
            "" if r["ok"] else "**FAIL** ", r["test"], r["sent"],
            r["identical"], r["wrong"], r["failed"], r["hung"], rec))
    notes = ["- %s: %s" % (r["test"], r["note"]) for r in rows
             if r["note"]]
    return "\n".join(out) + ("\n\nNotes:\n" + "\n".join(notes)
                             if notes else "") + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default="build/bin")
    ap.add_argument("--tools", default="build/tests/chaos")
    ap.add_argument("--models", default="../shared/models")
    ap.add_argument("--out", default="build/chaos")
    ap.add_argument("--bounded", action="store_true",
                    help="CI form: every row short, the soak 30 s")
    ap.add_argument("--soak-s", type=float, default=0,
                    help="soak length in seconds (default 1800; 30 "
                    "--bounded)")
    ap.add_argument("--rows", default="",
                    help="comma-separated row keys (default: all): " +
                    ",".join(k for k, _ in ROWS))
    ap.add_argument("--slowloris", nargs=3, metavar=("PORT", "N", "SECS"),
                    help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.slowloris:
        return slowloris_main(int(a.slowloris[0]), int(a.slowloris[1]),
                              float(a.slowloris[2]))
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, on_signal)
    atexit.register(kill_all)
    want = [k for k in a.rows.split(",") if k]
    unknown = [k for k in want if k not in dict(ROWS)]
    if unknown:
        print("unknown rows: %s" % ",".join(unknown), file=sys.stderr)
        return 2
    for exe in ("baton", "baton-router", "baton-prefill", "baton-decode",
                "baton-http"):
        if not os.access(os.path.join(a.bin, exe), os.X_OK):
            print("chaos: %s/%s missing (build first)" % (a.bin, exe),
                  file=sys.stderr)
            return 2
    for exe in ("chaos_load", "chaos_takeover"):
        if not os.access(os.path.join(a.tools, exe), os.X_OK):
            print("chaos: %s/%s missing (build first)" % (a.tools, exe),
                  file=sys.stderr)
            return 2
    s = Suite(a)
    rows = []
    t_start = time.time()
    for key, fn in ROWS:
        if want and key not in want:
            continue
        c = Cluster(s, key)
        t0 = time.time()
        print("chaos: %s ..." % key, file=sys.stderr, flush=True)
        try:
            row = fn(s, c)
        except (RowError, RuntimeError, OSError,
                subprocess.SubprocessError) as e:
            row = {"test": key, "sent": 0, "identical": 0, "wrong": 0,
                   "failed": 0, "hung": 0, "recovery": None, "ok": False,
                   "note": "row could not run: %s" % e}
        crashed = c.crashed()
        if crashed:
            row["note"] += "; exited by itself: " + ", ".join(crashed)
        c.stop()
        print("chaos: %s %s in %.1f s: %s" % (
            key, "ok" if row["ok"] else "FAIL", time.time() - t0,
            row["note"]), file=sys.stderr, flush=True)
        rows.append(row)
    text = table(rows)
    text += "\n%d of %d rows failed; %.0f s%s\n" % (
        sum(1 for r in rows if not r["ok"]), len(rows),
        time.time() - t_start, " (bounded)" if a.bounded else "")
    with open(os.path.join(s.out, "chaos-table.md"), "w") as f:
        f.write(text)
    print(text)
    return 0 if all(r["ok"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
