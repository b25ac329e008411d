#!/usr/bin/env python3
"""Runs the pods of a rendered overlay as local processes (a stand-in
kubelet): the exact container commands and environments k8s_check.py
--pods wrote, with the Service names mapped to 127.0.0.1 and the ports to
free ones.  Checks that the router, workers and baton-http come up, that
/health turns 200 (and /livez, and `baton status --wait-workers 1,1`
agrees), that a greedy request through the router gives the
ids `baton run` gives and that baton-http serves a completion; that the
router serves Prometheus metrics where its prometheus.io annotations
say, and each worker its own metrics on its annotated port; that the
workers' probes, run as the kubelet runs them (httpGet: a GET on the
probe's port and path, 200-399 passes; exec: the command in the pod's
environment), pass for each registered worker; that the liveness exec
fails on a /health that answers "...: stuck" and on one that never
answers, and passes on other 503s; that after a router crash (SIGKILL)
readiness fails and liveness passes on every worker (a router restart
must restart no worker), and that the workers and baton-http are ready
again once the router is back; then stops the pods as Kubernetes would
(SIGTERM, workers first) and checks each exits 0 within its
terminationGracePeriodSeconds.

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
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                ".."))
from free_ports import free_ports  # noqa: E402  (tests/free_ports.py)


def free_port():
    return free_ports(1)


def http_get(url, timeout=2.0):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return None, ""


def fake_health(status, body):
    """A listener on a free port answering every request with this
    status and body (status None: accepts, never answers); its port."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(8)
    if status is not None:
        def serve():
            while True:
                c, _ = srv.accept()
                with c:
                    c.recv(4096)
                    c.sendall((f"HTTP/1.1 {status} X\r\nContent-Length: "
                               f"{len(body)}\r\nConnection: close\r\n"
                               f"\r\n{body}").encode())
        threading.Thread(target=serve, daemon=True).start()
    return srv, srv.getsockname()[1]


def main():
    pods = json.load(open(sys.argv[1]))
    bindir = sys.argv[2]
    client, control, http = free_port(), free_port(), free_port()
    # each pod's metrics port (all pods may use one number: one network
    # namespace each in Kubernetes, one host here)
    local_metrics = {n: free_port() for n in pods if pods[n].get(
        "metrics_port")}
    remap = {":5555": f":{client}", ":5556": f":{control}",
             ":8000": f":{http}", "//baton-router:": "//127.0.0.1:",
             "0.0.0.0:": "127.0.0.1:",
             "--metrics-host 0.0.0.0": "--metrics-host 127.0.0.1"}

    def fix(s, pod=None, port=None):
        for a, b in remap.items():
            s = s.replace(a, b)
        mp = pods.get(pod, {}).get("metrics_port")
        if mp:
            port = port or local_metrics[pod]
            s = s.replace(f"--metrics-port {mp}", f"--metrics-port {port}")
            s = s.replace(f"/dev/tcp/127.0.0.1/{mp}",
                          f"/dev/tcp/127.0.0.1/{port}")
        return s

    def start(name):
        pod = pods[name]
        env = {k: fix(v, name) for k, v in pod["env"].items()}
        env["PATH"] = bindir + ":/usr/bin:/bin"
        cmd = [fix(c, name) for c in pod["command"]]
        log = open(os.path.join(logdir, name + ".log"), "a")
        procs[name] = (subprocess.Popen(cmd, env=env, stdout=log,
                                        stderr=subprocess.STDOUT,
                                        start_new_session=True),
                       pod["grace"], log)

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
        # the client key only: the worker probes no longer run `baton
        # status` (curve-secret.sh)
        f.write(open(os.path.join(keydir, "client.pub")).read())
    remap["/etc/baton/curve/"] = keydir + "/"
    client_env = dict(os.environ,
                      BATON_CURVE_SECRET_KEY=os.path.join(keydir, "client.key"),
                      BATON_ROUTER_PUBLIC_KEY=os.path.join(keydir, "router.pub"))
    procs = {}
    ok = False
    try:
        for name in ("baton-router", "baton-http", "baton-prefill",
                     "baton-decode"):
            start(name)
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

        # each pod's metrics, where its annotations point a scraper
        for pod, prefix in (("baton-router", "baton_router_"),
                            ("baton-prefill", "baton_worker_"),
                            ("baton-decode", "baton_worker_")):
            ann = pods[pod].get("annotations", {})
            if ann.get("prometheus.io/scrape") != "true" or \
                    ann.get("prometheus.io/port") != \
                    str(pods[pod]["metrics_port"]):
                raise SystemExit(f"FAIL: {pod} annotations {ann}")
            status, body = http_get(f"http://127.0.0.1:{local_metrics[pod]}"
                                    f"{ann.get('prometheus.io/path', '/')}")
            if status != 200 or "\n" + prefix not in "\n" + body:
                raise SystemExit(f"FAIL: {pod} metrics: {status} "
                                 f"{body[:200]}")
            if prefix == "baton_worker_" and \
                    "\nbaton_worker_registered 1" not in body:
                raise SystemExit(f"FAIL: {pod} metrics: not registered")
            print(f"ok {pod} metrics at prometheus.io/port "
                  f"{ann['prometheus.io/port']} {ann.get('prometheus.io/path')}"
                  f": {sum(1 for l in body.splitlines() if l.startswith(prefix))}"
                  f" samples")

        # the workers' probes, as the kubelet runs them: httpGet on the
        # pod's port, exec in the pod's environment, bounded by
        # timeoutSeconds
        def probe(pod, kind, port=None):
            pr = pods[pod]["probes"][kind]
            tmo = pr.get("timeoutSeconds", 1)
            if "httpGet" in pr:
                h = pr["httpGet"]
                if h["port"] != pods[pod]["metrics_port"]:
                    raise SystemExit(f"FAIL: {pod} {kind} on port "
                                     f"{h['port']}, not the metrics port")
                st, body = http_get(f"http://127.0.0.1:"
                                    f"{port or local_metrics[pod]}"
                                    f"{h['path']}", timeout=tmo)
                return st is not None and 200 <= st < 400, f"{st} {body}"
            env = {k: fix(v, pod) for k, v in pods[pod]["env"].items()}
            env["PATH"] = bindir + ":/usr/bin:/bin"
            cmd = [fix(c, pod, port) for c in pr["exec"]["command"]]
            try:
                r = subprocess.run(cmd, env=env, capture_output=True,
                                   text=True, timeout=tmo + 1)
            except subprocess.TimeoutExpired:
                return False, "timed out"
            return r.returncode == 0, (r.stdout + r.stderr).strip()[-200:]

        workers = ("baton-prefill", "baton-decode")
        kinds = ("startupProbe", "readinessProbe", "livenessProbe")
        for pod in workers:
            for kind in kinds:
                ok_, why = probe(pod, kind)
                if not ok_:
                    raise SystemExit(f"FAIL: {pod} {kind} fails on a "
                                     f"registered worker: {why}")
        print("ok worker probes (startup, readiness, liveness) pass on "
              "registered workers")
        # liveness reads /health's reason: "stuck" and silence fail it,
        # any other 503 passes
        fakes = {"stuck": fake_health(503, "unavailable: engine turn running"
                                      " for 12000 ms (limit 10000 ms): "
                                      "stuck\n"),
                 "not registered": fake_health(
                     503, "unavailable: not registered: waiting for the "
                     "router at tcp://baton-router:5556\n"),
                 "starting": fake_health(503, "unavailable: starting: "
                                         "loading the model\n"),
                 "silent": fake_health(None, "")}
        try:
            for pod in workers:
                for what, (_, port) in fakes.items():
                    ok_, why = probe(pod, "livenessProbe", port=port)
                    if ok_ != (what in ("not registered", "starting")):
                        raise SystemExit(f"FAIL: {pod} liveness "
                                         f"{'passes' if ok_ else 'fails'} on "
                                         f"a {what} /health: {why}")
                    if what == "stuck" and \
                            probe(pod, "readinessProbe", port=port)[0]:
                        raise SystemExit(f"FAIL: {pod} ready while stuck")
        finally:
            for srv, _ in fakes.values():
                srv.close()
        print("ok worker liveness fails on a stuck engine and on a /health "
              "that never answers, passes on 503 not registered/starting")

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

        # a router crash and restart: every worker unready, none to be
        # restarted (liveness passes), all ready again once it is back
        p, _, _ = procs["baton-router"]
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        deadline = time.time() + 15
        while time.time() < deadline:
            hs = [http_get(f"http://127.0.0.1:{local_metrics[w]}/health")
                  for w in workers]
            if all(st == 503 and "not registered" in b for st, b in hs):
                break
            time.sleep(0.2)
        else:
            raise SystemExit(f"FAIL: workers' /health with the router gone: "
                             f"{hs}")
        for pod in workers:
            if probe(pod, "readinessProbe")[0]:
                raise SystemExit(f"FAIL: {pod} ready without a router")
            ok_, why = probe(pod, "livenessProbe")
            if not ok_:
                raise SystemExit(f"FAIL: {pod} liveness fails while the "
                                 f"router is away (a router restart would "
                                 f"restart every worker): {why}")
        print(f"ok router killed: workers 503 '{hs[0][1].strip()}'; "
              f"readiness fails, liveness passes")
        start("baton-router")
        deadline = time.time() + 20
        while time.time() < deadline:
            if all(probe(w, "readinessProbe")[0] for w in workers) and \
                    http_get(f"http://127.0.0.1:{http}/health")[0] == 200:
                break
            if procs["baton-router"][0].poll() is not None:
                raise SystemExit("FAIL: the restarted router exited")
            time.sleep(0.2)
        else:
            raise SystemExit("FAIL: workers not ready again after the "
                             "router restart")
        gone = [w for w in workers if procs[w][0].poll() is not None]
        if gone:
            raise SystemExit(f"FAIL: {gone} exited while the router was away")
        print("ok router restarted: workers ready again, baton-http "
              "/health 200, no worker restarted")

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
