#!/usr/bin/env python3
"""Runs the pods of a rendered overlay as local processes (a stand-in
kubelet): the exact container commands and environments k8s_check.py
--pods wrote, with the Service names mapped to 127.0.0.1 and the ports to
free ones.  Checks that the router, workers and baton-http come up, that
/health turns 200 (and /livez, and `baton status --wait-workers 1,1`
agrees), that a greedy request through the router gives the
ids `baton run` gives and that baton-http serves a completion; that the
router serves Prometheus metrics where its prometheus.io annotations
say; that the workers' exec probes (startup, readiness, liveness) pass
for each worker, that readiness fails for a pod name the router does not
list and with the router unreachable, where liveness still passes; then
stops the pods as Kubernetes would (SIGTERM, workers first) and checks
each exits 0 within its terminationGracePeriodSeconds.

usage: k8s_local.py PODS.json BIN_DIR
"""
import json
import shutil
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return None, ""


def main():
    pods = json.load(open(sys.argv[1]))
    bindir = sys.argv[2]
    client, control, http = free_port(), free_port(), free_port()
    metrics = free_port()
    ann = pods["baton-router"].get("annotations", {})
    mport = ann.get("prometheus.io/port", "9090")
    remap = {":5555": f":{client}", ":5556": f":{control}",
             ":8000": f":{http}", "//baton-router:": "//127.0.0.1:",
             "0.0.0.0:": "127.0.0.1:",
             f"--metrics-port {mport}": f"--metrics-port {metrics}",
             "--metrics-host 0.0.0.0": "--metrics-host 127.0.0.1"}

    def fix(s):
        for a, b in remap.items():
            s = s.replace(a, b)
        return s

    logdir = tempfile.mkdtemp(prefix="baton-k8s-")
    # the baton-curve Secret (deploy/k8s/curve-secret.sh) at its mount
    # path: the pods run with CURVE as in the cluster
    keydir = os.path.join(logdir, "curve")
    os.makedirs(keydir)
    for k in ("router", "worker", "client"):
        subprocess.run([f"{bindir}/baton", "keygen", "--out",
                        os.path.join(keydir, k)], check=True,
                       stdout=subprocess.DEVNULL)
    with open(os.path.join(keydir, "clients.allow"), "w") as f:
        for k in ("client", "worker"):
            f.write(open(os.path.join(keydir, k + ".pub")).read())
    remap["/etc/baton/curve/"] = keydir + "/"
    client_env = dict(os.environ,
                      BATON_CURVE_SECRET_KEY=os.path.join(keydir, "client.key"),
                      BATON_ROUTER_PUBLIC_KEY=os.path.join(keydir, "router.pub"))
    procs = {}
    ok = False
    try:
        for name in ("baton-router", "baton-http", "baton-prefill",
                     "baton-decode"):
            pod = pods[name]
            env = {k: fix(v) for k, v in pod["env"].items()}
            env["PATH"] = bindir + ":/usr/bin:/bin"
            cmd = [fix(c) for c in pod["command"]]
            log = open(os.path.join(logdir, name + ".log"), "w")
            procs[name] = (subprocess.Popen(cmd, env=env, stdout=log,
                                            stderr=subprocess.STDOUT,
                                            start_new_session=True),
                           pod["grace"], log)
        # readiness: baton-http /health is 200 with prefill + decode workers
        deadline = time.time() + 20
        status = None
        while time.time() < deadline:
            status, body = http_get(f"http://127.0.0.1:{http}/health")
            if status == 200:
                break
            dead = [n for n, (p, _, _) in procs.items()
                    if p.poll() is not None]
            if dead:
                raise SystemExit(f"FAIL: {dead} exited")
            time.sleep(0.2)
        if status != 200:
            raise SystemExit(f"FAIL: /health never 200 (last {status})")
        print(f"ok /health 200: {body.strip()}")
        # liveness: /livez, the process alone
        status, body = http_get(f"http://127.0.0.1:{http}/livez")
        if status != 200:
            raise SystemExit(f"FAIL: /livez {status}")
        # the readiness command sees the same cluster
        st = subprocess.run([f"{bindir}/baton", "status", "--router",
                             f"tcp://127.0.0.1:{client}", "--wait-workers",
                             "1,1", "--timeout", "10", "--json"],
                            capture_output=True, text=True, timeout=20,
                            env=client_env)
        if st.returncode != 0 or not json.loads(st.stdout).get("ready"):
            raise SystemExit(f"FAIL: baton status: {st.stdout} {st.stderr}")
        print("ok /livez 200; baton status --wait-workers 1,1: ready")

        # the router's metrics, where its annotations point a scraper
        status, body = http_get(f"http://127.0.0.1:{metrics}"
                                f"{ann.get('prometheus.io/path', '/')}")
        if status != 200 or "\nbaton_" not in "\n" + body:
            raise SystemExit(f"FAIL: router metrics: {status} {body[:200]}")
        print(f"ok router metrics at prometheus.io/port {mport} "
              f"{ann.get('prometheus.io/path')}: "
              f"{sum(1 for l in body.splitlines() if l.startswith('baton_'))}"
              f" samples")

        # the workers' exec probes, as the kubelet runs them: in the
        # pod's environment, bounded by timeoutSeconds
        def probe(pod, kind, **over):
            env = {k: fix(v) for k, v in pods[pod]["env"].items()}
            env["PATH"] = bindir + ":/usr/bin:/bin"
            env.update(over)
            cmd = [fix(c) for c in pods[pod]["probes"][kind]]
            return subprocess.run(cmd, env=env, capture_output=True,
                                  timeout=10).returncode
        dead = f"tcp://127.0.0.1:{free_port()}"
        for pod in ("baton-prefill", "baton-decode"):
            for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
                if probe(pod, kind) != 0:
                    raise SystemExit(f"FAIL: {pod} {kind} fails on a "
                                     f"registered worker")
            if probe(pod, "readinessProbe", POD_NAME=pod + "-other") == 0:
                raise SystemExit(f"FAIL: {pod} readiness passes for a pod "
                                 f"the router does not list")
            if probe(pod, "livenessProbe", POD_NAME=pod + "-other") == 0:
                raise SystemExit(f"FAIL: {pod} liveness passes for a pod "
                                 f"the router does not list")
            if probe(pod, "readinessProbe", BATON_ROUTER_CLIENT=dead) == 0:
                raise SystemExit(f"FAIL: {pod} ready without a router")
            if probe(pod, "livenessProbe", BATON_ROUTER_CLIENT=dead) != 0:
                raise SystemExit(f"FAIL: {pod} liveness fails when the "
                                 f"router is down (would restart workers)")
        print("ok worker probes: pass when registered; readiness fails for "
              "an unlisted pod and without a router, liveness only for an "
              "unlisted pod")

        model = pods["baton-decode"]["env"]["BATON_MODEL"]
        ids = "1 5 9 14"
        run = [f"{bindir}/baton", "--prompt-ids", ids, "--max-tokens", "12",
               "--ignore-eos", "--ids"]
        want = subprocess.run(run[:1] + ["run", "--model", model] + run[1:],
                              capture_output=True, text=True, timeout=30)
        got = subprocess.run(run[:1] + ["generate", "--router",
                                        f"tcp://127.0.0.1:{client}"] +
                             run[1:], capture_output=True, text=True,
                             timeout=30, env=client_env)
        if not want.stdout.strip() or got.stdout != want.stdout:
            raise SystemExit(f"FAIL: cluster ids {got.stdout!r} "
                             f"({got.stderr.strip()[-200:]}), "
                             f"baton run {want.stdout!r}")
        print(f"ok greedy ids through the router equal baton run: "
              f"{got.stdout.strip()}")

        req = urllib.request.Request(
            f"http://127.0.0.1:{http}/v1/completions",
            data=json.dumps({"prompt": [int(x) for x in ids.split()],
                             "max_tokens": 4, "temperature": 0}).encode(),
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=20) as r:
            body = json.loads(r.read())
        if body.get("usage", {}).get("completion_tokens") != 4:
            raise SystemExit(f"FAIL: /v1/completions answered {body}")
        print("ok baton-http /v1/completions: 4 tokens")

        # stop as Kubernetes does: SIGTERM, SIGKILL after the grace period
        for group in (("baton-prefill", "baton-decode"),
                      ("baton-http", "baton-router")):
            t0 = time.time()
            for n in group:
                procs[n][0].send_signal(signal.SIGTERM)
            for n in group:
                p, grace, _ = procs[n]
                try:
                    rc = p.wait(timeout=grace)
                except subprocess.TimeoutExpired:
                    raise SystemExit(f"FAIL: {n} still running after its "
                                     f"{grace} s grace period")
                if rc != 0:
                    raise SystemExit(f"FAIL: {n} exited {rc} on SIGTERM")
            print(f"ok {' and '.join(group)} stopped on SIGTERM in "
                  f"{time.time() - t0:.1f} s")
        ok = True
    finally:
        for n, (p, _, log) in procs.items():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            log.close()
            if not ok:
                print(f"--- {n}")
                print(open(os.path.join(logdir, n + ".log")).read()[-1500:])
        shutil.rmtree(logdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
