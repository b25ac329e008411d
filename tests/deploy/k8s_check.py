#!/usr/bin/env python3
"""Structural checks of baton's rendered Kubernetes manifests.

usage: k8s_check.py RENDERED.yaml OVERLAY [--bin DIR] [--pods OUT.json]

RENDERED.yaml is `kubectl kustomize deploy/k8s/<overlay>` output (or the
base's files concatenated, with OVERLAY "base-raw", when kubectl is
missing).  Checks what a running cluster depends on: every object is well
formed; the four Deployments exist, their selectors match their pod
labels, each Service selects a Deployment and targets named container
ports; BATON_ROUTER of workers is the router Service's control port and
of baton-http its client port; referenced ConfigMaps and PVCs exist;
probes use declared ports, baton-http's readiness is /health and its
liveness /livez; workers drain (grace period >= 30 s); GPU
requests per overlay; an OVERLAY named node-local-ipc* (the component
components/node-local-ipc) gives workers BATON_HOST_ID = spec.nodeName,
hostIPC and the node's /dev/shm; every --flag in a container command is one the
binary's --help lists (with --bin); workers serve metrics on the port
their container port "metrics" and prometheus.io annotations name, their
startup and readiness probes are httpGet /health on that port (startup
allows at least 5 min), their liveness is not /health's status (503 for a
router that is away) but an exec that reads /health's reason on that
port and fails only on "stuck"; their grace period covers their drain
(the deadline read from prefill/prefill.c and decode/decode.c) plus 30 s;
a PodDisruptionBudget per worker Deployment (maxUnavailable, selecting
exactly its pods); a NetworkPolicy on the router pods that admits only
workers to the control port and only baton-http to the client port; the
router serves metrics on the port its prometheus.io annotations name; the
h200 overlay sizes the KV pool.  An OVERLAY whose name contains
"autoscaling" (components/autoscaling) must have an autoscaling/v2
HorizontalPodAutoscaler per worker Deployment, targeting it, on a worker
gauge that docs/OPERATIONS.md lists for its role (prefill: outstanding
prompt tokens, decode: KV usage ratio), with scale-down one pod per
period of at least the grace period, the Deployments without
spec.replicas, and prometheus-adapter rules (ConfigMap
baton-prometheus-adapter) that serve each metric per pod; any other
OVERLAY must have no HPA.
--pods writes, per Deployment, the command and environment its container
would run with (ConfigMap values and downward API resolved), its probes
(named ports resolved), its metrics port and its annotations, for a local
launch.
"""
import json
import os
import re
import subprocess
import sys

import yaml

ROLES = ("router", "prefill", "decode", "http")
NODE_NAME = "node-0"    # spec.nodeName for --pods (one node)
SRC = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DOC = os.path.join(SRC, "docs", "OPERATIONS.md")
# the worker's drain deadline on SIGTERM, in its source
DRAIN_SRC = {"prefill": "prefill/prefill.c", "decode": "decode/decode.c"}
EXIT_MARGIN_S = 30      # grace beyond the drain, to exit
STARTUP_MIN_S = 300     # a model load may take minutes
# what each worker Deployment's HPA scales on (docs/OPERATIONS.md)
HPA_METRIC = {"baton-prefill": "baton_worker_outstanding_tokens",
              "baton-decode": "baton_worker_kv_usage_ratio"}
ADAPTER_CM = "baton-prometheus-adapter"
errors = []


def err(msg):
    errors.append(msg)


def env_of(container, configmaps, pod_name):
    """The container's environment as a dict, as the kubelet builds it."""
    env = {}
    for src in container.get("envFrom", []):
        ref = src.get("configMapRef", {}).get("name")
        if ref is not None:
            if ref not in configmaps:
                err(f"{container['name']}: envFrom ConfigMap {ref} missing")
            else:
                env.update(configmaps[ref])
    for e in container.get("env", []):
        if "value" in e:
            env[e["name"]] = str(e["value"])
        elif "valueFrom" in e:
            vf = e["valueFrom"]
            if "fieldRef" in vf:
                fp = vf["fieldRef"].get("fieldPath")
                if fp == "metadata.name":
                    env[e["name"]] = pod_name
                elif fp == "spec.nodeName":
                    env[e["name"]] = NODE_NAME
                else:
                    err(f"{e['name']}: unexpected fieldRef {fp}")
            elif "resourceFieldRef" in vf:
                rf = vf["resourceFieldRef"]
                if rf.get("containerName") != container["name"]:
                    err(f"{e['name']}: resourceFieldRef names container "
                        f"{rf.get('containerName')}, not {container['name']}")
                lim = container.get("resources", {}).get("limits", {})
                cpu = str(lim.get(rf["resource"].split(".")[1], "1"))
                env[e["name"]] = str(max(1, -(-int(float(cpu.rstrip("m")) /
                                                   (1000 if cpu.endswith("m")
                                                    else 1)) // 1)))
            else:
                err(f"{e['name']}: unsupported valueFrom")
    return env


def main():
    if len(sys.argv) < 3:
        print(__doc__)
        return 2
    path, overlay = sys.argv[1], sys.argv[2]
    bindir = pods_out = None
    args = sys.argv[3:]
    while args:
        if args[0] == "--bin":
            bindir, args = args[1], args[2:]
        elif args[0] == "--pods":
            pods_out, args = args[1], args[2:]
        else:
            print(__doc__)
            return 2
    docs = [d for d in yaml.safe_load_all(open(path)) if d]
    objs = {}
    for d in docs:
        for k in ("apiVersion", "kind", "metadata"):
            if k not in d:
                err(f"object without {k}: {str(d)[:80]}")
        name = d.get("metadata", {}).get("name")
        if not name or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?",
                                        name):
            err(f"{d.get('kind')}: bad name {name!r}")
        key = (d.get("kind"), name)
        if key in objs:
            err(f"duplicate {key}")
        objs[key] = d

    configmaps = {n: {k: str(v) for k, v in (d.get("data") or {}).items()}
                  for (k, n), d in objs.items() if k == "ConfigMap"}
    pvcs = {n for (k, n) in objs if k == "PersistentVolumeClaim"}
    deps = {n: d for (k, n), d in objs.items() if k == "Deployment"}
    svcs = {n: d for (k, n), d in objs.items() if k == "Service"}
    pdbs = {n: d for (k, n), d in objs.items() if k == "PodDisruptionBudget"}
    netpols = [d for (k, n), d in objs.items() if k == "NetworkPolicy"]

    pods = {}
    ports = {}      # deployment -> {port name: number}
    for role in ROLES:
        name = f"baton-{role}"
        if name not in deps:
            err(f"no Deployment {name}")
            continue
        d = deps[name]
        spec = d["spec"]
        tmpl = spec["template"]
        labels = tmpl["metadata"].get("labels", {})
        sel = spec["selector"]["matchLabels"]
        if any(labels.get(k) != v for k, v in sel.items()):
            err(f"{name}: selector {sel} does not match pod labels {labels}")
        pspec = tmpl["spec"]
        cs = pspec["containers"]
        if len(cs) != 1:
            err(f"{name}: {len(cs)} containers, want 1")
            continue
        c = cs[0]
        if not c.get("image"):
            err(f"{name}: no image")
        vols = {v["name"]: v for v in pspec.get("volumes", [])}
        for m in c.get("volumeMounts", []):
            if m["name"] not in vols:
                err(f"{name}: mount {m['name']} has no volume")
        for v in vols.values():
            claim = v.get("persistentVolumeClaim", {}).get("claimName")
            if claim and claim not in pvcs:
                err(f"{name}: PVC {claim} missing")
            if len([k for k in v if k != "name"]) != 1:
                err(f"{name}: volume {v['name']} has several sources")
        ports[name] = {p["name"]: p["containerPort"]
                       for p in c.get("ports", [])}
        for probe in ("readinessProbe", "livenessProbe"):
            pr = c.get(probe)
            if pr is None:
                continue
            h = pr.get("httpGet") or pr.get("tcpSocket")
            if h and isinstance(h.get("port"), str) and \
                    h["port"] not in ports[name]:
                err(f"{name}: {probe} uses undeclared port {h['port']}")
        env = env_of(c, configmaps, f"{name}-pod")
        cmd = c.get("command", []) + c.get("args", [])
        if cmd[:2] != ["/bin/sh", "-c"] or "exec baton-" not in cmd[2]:
            err(f"{name}: command should be /bin/sh -c 'exec baton-...'")
        pods[name] = {"command": cmd, "env": env,
                      "grace": pspec.get("terminationGracePeriodSeconds",
                                         30),
                      "resources": c.get("resources", {}),
                      "annotations": tmpl["metadata"].get("annotations",
                                                          {}),
                      "metrics_port": ports[name].get("metrics"),
                      "probes": {p: resolve_probe(c[p], ports[name])
                                 for p in ("startupProbe", "readinessProbe",
                                           "livenessProbe") if p in c}}

        if role in ("prefill", "decode"):
            drain = drain_seconds(role)
            if drain is not None and \
                    pods[name]["grace"] < drain + EXIT_MARGIN_S:
                err(f"{name}: terminationGracePeriodSeconds "
                    f"{pods[name]['grace']} < its drain ({drain} s, "
                    f"{DRAIN_SRC[role]}) + {EXIT_MARGIN_S} s")
            want = "tcp://baton-router:%d" % svc_port("baton-router",
                                                      "control", svcs)
            if env.get("BATON_ROUTER") != want:
                err(f"{name}: BATON_ROUTER {env.get('BATON_ROUTER')} "
                    f"!= {want}")
            gpus = c.get("resources", {}).get("limits", {}).get(
                "nvidia.com/gpu")
            if overlay.endswith("h200") and not gpus:
                err(f"{name}: no nvidia.com/gpu limit in h200")
            if overlay.endswith("cpu-tiny") and gpus:
                err(f"{name}: GPU requested in cpu-tiny")
            if '--name "$POD_NAME"' not in cmd[2]:
                err(f"{name}: the worker is not named after its pod")
            mport = check_metrics(name, cmd[2], tmpl, ports[name])
            check_worker_probes(name, c, ports[name], mport)
            pdb = pdbs.get(name)
            if pdb is None:
                err(f"{name}: no PodDisruptionBudget")
            else:
                if pdb["spec"].get("selector", {}).get("matchLabels") != sel:
                    err(f"{name}: PodDisruptionBudget selector "
                        f"{pdb['spec'].get('selector')} != {sel}")
                if "maxUnavailable" not in pdb["spec"]:
                    err(f"{name}: PodDisruptionBudget without maxUnavailable"
                        " (minAvailable blocks drains at one replica)")
            hid = [e for e in c.get("env", []) if e["name"] == "BATON_HOST_ID"]
            shm = vols.get("shm", {})
            if overlay.startswith("node-local-ipc"):
                if not hid or hid[0].get("valueFrom", {}).get(
                        "fieldRef", {}).get("fieldPath") != "spec.nodeName":
                    err(f"{name}: BATON_HOST_ID is not spec.nodeName")
                if not pspec.get("hostIPC"):
                    err(f"{name}: node-local IPC without hostIPC")
                if shm.get("hostPath", {}).get("path") != "/dev/shm":
                    err(f"{name}: /dev/shm is not the node's")
            elif hid or pspec.get("hostIPC"):
                # equal host ids without shared IPC: the router would pick
                # CUDA IPC between pods that cannot map each other's pools
                err(f"{name}: BATON_HOST_ID/hostIPC outside node-local-ipc")
        if role == "http":
            want = "tcp://baton-router:%d" % svc_port("baton-router",
                                                      "client", svcs)
            if env.get("BATON_ROUTER") != want:
                err(f"{name}: BATON_ROUTER {env.get('BATON_ROUTER')} "
                    f"!= {want}")
            rp = c.get("readinessProbe", {}).get("httpGet", {})
            if rp.get("path") != "/health":
                err(f"{name}: readiness probe is not GET /health")
            # /health needs workers: as liveness it would restart
            # baton-http whenever the cluster has none
            lp = c.get("livenessProbe", {}).get("httpGet", {})
            if lp.get("path") != "/livez":
                err(f"{name}: liveness probe is not GET /livez")
        if role == "router":
            check_metrics(name, cmd[2], tmpl, ports[name])
            if spec.get("replicas", 1) != 1:
                err("baton-router: workers register with one router: "
                    "replicas must be 1")
            for pname, var in (("client", "BATON_LISTEN"),
                               ("control", "BATON_CONTROL")):
                if not env.get(var, "").endswith(
                        ":%d" % ports[name].get(pname, -1)):
                    err(f"baton-router: {var} does not listen on the "
                        f"{pname} port")
        if overlay.endswith("cpu-tiny") and env.get("BATON_DEVICE") != "cpu":
            err(f"{name}: cpu-tiny must run on the CPU")

    check_netpol(netpols, deps, ports)
    check_autoscaling(objs, deps, pods, "autoscaling" in overlay)
    if overlay.endswith("h200"):
        kv = pods.get("baton-decode", {}).get("env", {}).get(
            "BATON_KV_BLOCKS", "")
        if not kv.isdigit() or int(kv) < 1000:
            err(f"h200: BATON_KV_BLOCKS {kv!r} not sized for the GPU")

    for sname, s in svcs.items():
        sel = s["spec"].get("selector", {})
        target = [n for n, d in deps.items()
                  if all(d["spec"]["template"]["metadata"]["labels"].get(k)
                         == v for k, v in sel.items())]
        if len(target) != 1:
            err(f"Service {sname} selects {target}, want one Deployment")
            continue
        for p in s["spec"]["ports"]:
            tp = p.get("targetPort", p["port"])
            if isinstance(tp, str) and tp not in ports.get(target[0], {}):
                err(f"Service {sname}: targetPort {tp} not a port of "
                    f"{target[0]}")

    if bindir:
        for name, pod in pods.items():
            script = pod["command"][2]
            exe = re.search(r"exec (baton-[a-z]+)", script).group(1)
            helptext = subprocess.run([f"{bindir}/{exe}", "--help"],
                                      capture_output=True, text=True)
            helptext = helptext.stdout + helptext.stderr
            flags = re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", script)
            for var in ("BATON_ROUTER_ARGS", "BATON_PREFILL_ARGS",
                        "BATON_DECODE_ARGS", "BATON_HTTP_ARGS"):
                if "$" + var in script:
                    flags += re.findall(r"(--[a-z][a-z0-9-]*)",
                                        pod["env"].get(var, ""))
            for f in flags:
                if not re.search(re.escape(f) + r"\b", helptext):
                    err(f"{name}: {exe} has no flag {f}")

    if pods_out:
        with open(pods_out, "w") as f:
            json.dump(pods, f, indent=1)
    for e in errors:
        print(f"FAIL {overlay}: {e}")
    if not errors:
        print(f"ok {overlay}: {len(docs)} objects, "
              f"{', '.join(sorted(deps))}")
    return 1 if errors else 0


def pods_of(selector, deps):
    """Deployments whose pod labels a NetworkPolicy podSelector matches."""
    out = set()
    for n, d in deps.items():
        labels = d["spec"]["template"]["metadata"].get("labels", {})
        ok = all(labels.get(k) == v
                 for k, v in selector.get("matchLabels", {}).items())
        for e in selector.get("matchExpressions", []):
            if e["operator"] == "In":
                ok = ok and labels.get(e["key"]) in e["values"]
            else:
                err(f"NetworkPolicy: unexpected operator {e['operator']}")
        if ok:
            out.add(n)
    return out


def check_netpol(netpols, deps, ports):
    """The router's control port admits only workers, its client port
    only workers and baton-http, and its metrics port stays open."""
    pols = [p for p in netpols if pods_of(p["spec"]["podSelector"], deps)
            == {"baton-router"}]
    if len(pols) != 1:
        err(f"{len(pols)} NetworkPolicies select the router pods, want 1")
        return
    spec = pols[0]["spec"]
    if spec.get("policyTypes") != ["Ingress"]:
        err("NetworkPolicy: policyTypes is not [Ingress]")
    rport = ports.get("baton-router", {})
    admitted = {}       # port name -> set of Deployments, or "any"
    for rule in spec.get("ingress", []):
        srcs = rule.get("from")
        who = "any"
        if srcs is not None:
            who = set()
            for f in srcs:
                if set(f) != {"podSelector"}:
                    err(f"NetworkPolicy: a source other than pods: {f}")
                    who = "any"
                    break
                who |= pods_of(f["podSelector"], deps)
        for p in rule.get("ports") or [{"port": "all"}]:
            pn = p["port"]
            if isinstance(pn, int):
                pn = {v: k for k, v in rport.items()}.get(pn, pn)
            if pn not in rport and pn != "all":
                err(f"NetworkPolicy: port {pn} is not a router port")
            prev = admitted.get(pn, set())
            admitted[pn] = "any" if "any" in (who, prev) else prev | who
    want = {"control": {"baton-prefill", "baton-decode"},
            "client": {"baton-http"},
            "metrics": "any"}
    if "all" in admitted:
        err("NetworkPolicy: a rule admits every port")
    for pn, w in want.items():
        if admitted.get(pn) != w:
            err(f"NetworkPolicy: port {pn} admits {admitted.get(pn)}, "
                f"want {w}")


def resolve_probe(probe, ports):
    """A probe with a named httpGet/tcpSocket port replaced by its number."""
    out = json.loads(json.dumps(probe))
    for k in ("httpGet", "tcpSocket"):
        if k in out and isinstance(out[k].get("port"), str):
            out[k]["port"] = ports.get(out[k]["port"], out[k]["port"])
    return out


def check_metrics(name, script, tmpl, ports):
    """--metrics-port on all interfaces, declared as the container port
    "metrics" and named by the prometheus.io annotations; its number."""
    ann = tmpl["metadata"].get("annotations", {})
    m = re.search(r"--metrics-port (\d+)", script)
    if ann.get("prometheus.io/scrape") != "true" or not m:
        err(f"{name}: metrics off or no prometheus.io/scrape")
        return None
    port = int(m.group(1))
    if ann.get("prometheus.io/port") != m.group(1) or \
            ports.get("metrics") != port:
        err(f"{name}: prometheus.io/port {ann.get('prometheus.io/port')} / "
            f"container port {ports.get('metrics')} != --metrics-port "
            f"{port}")
    if ann.get("prometheus.io/path") != "/metrics":
        err(f"{name}: prometheus.io/path is not /metrics")
    if "--metrics-host 0.0.0.0" not in script:
        err(f"{name}: metrics bound to loopback only (the kubelet and "
            f"Prometheus come from outside the pod)")
    return port


def check_worker_probes(name, c, ports, mport):
    """startup and readiness: GET /health on the metrics port; liveness:
    never /health's status code (503 while the router is away would
    restart every worker at once), an exec that reads /health's reason on
    the metrics port and fails on "stuck"."""
    for p in ("startupProbe", "readinessProbe"):
        pr = c.get(p)
        if pr is None:
            err(f"{name}: no {p}")
            continue
        h = resolve_probe(pr, ports).get("httpGet")
        if h is None or h.get("path") != "/health" or \
                h.get("port") != mport or mport is None:
            err(f"{name}: {p} is not httpGet /health on the metrics port "
                f"{mport}: {pr}")
    st = c.get("startupProbe", {})
    budget = st.get("periodSeconds", 10) * st.get("failureThreshold", 3)
    if budget < STARTUP_MIN_S:
        err(f"{name}: startupProbe allows {budget} s for the model load, "
            f"want >= {STARTUP_MIN_S}")
    lp = c.get("livenessProbe")
    if lp is None:
        err(f"{name}: no livenessProbe")
        return
    if "exec" not in lp:
        err(f"{name}: livenessProbe is not an exec that reads /health's "
            f"reason ({list(k for k in lp if k.endswith(('Get', 'Socket', 'exec', 'grpc')))}"
            f"; /health's 503 also means 'router away': it would restart "
            f"every worker on a router restart)")
        return
    cmd = lp["exec"].get("command", [])
    script = " ".join(cmd)
    if f"/dev/tcp/127.0.0.1/{mport}" not in script or \
            "GET /health " not in script or ": stuck" not in script:
        err(f"{name}: livenessProbe does not read /health on the metrics "
            f"port {mport} for ': stuck'")
    if len(cmd) < 2 or cmd[0] != "/usr/bin/timeout" or \
            not cmd[1].isdigit() or \
            int(cmd[1]) >= lp.get("timeoutSeconds", 1):
        err(f"{name}: livenessProbe not bounded by timeout(1) below its "
            f"timeoutSeconds")


def drain_seconds(role):
    """The worker's drain deadline on SIGTERM, from its source (None, and
    an error, when the source no longer says it the way this expects)."""
    try:
        text = open(os.path.join(SRC, DRAIN_SRC[role])).read()
    except OSError as e:
        err(f"cannot read {DRAIN_SRC[role]}: {e}")
        return None
    m = re.findall(r"drain_deadline = bt_time_ns\(\) \+ (\d+)ull \* "
                   r"1000000000ull", text)
    if len(m) != 1:
        err(f"{DRAIN_SRC[role]}: no single drain deadline found "
            f"({m}): update k8s_check.py")
        return None
    return int(m[0])


def doc_worker_metrics():
    """{name: (type, roles)} of the table under docs/OPERATIONS.md's
    "## Workers" heading."""
    out = {}
    try:
        text = open(DOC).read()
    except OSError as e:
        err(f"cannot read {DOC}: {e}")
        return out
    m = re.search(r"^## Workers.*?$(.*?)^## ", text, re.M | re.S)
    if not m:
        err("docs/OPERATIONS.md: no '## Workers' section")
        return out
    for row in re.finditer(r"^\| `(baton_worker_[a-z0-9_]+)` \| (\w+) \| "
                           r"([^|]*) \|", m.group(1), re.M):
        out[row.group(1)] = (row.group(2), row.group(3).strip())
    if not out:
        err("docs/OPERATIONS.md: no worker metrics in the Workers table")
    return out


def check_autoscaling(objs, deps, pods, want):
    hpas = {n: d for (k, n), d in objs.items()
            if k == "HorizontalPodAutoscaler"}
    if not want:
        if hpas:
            err(f"HorizontalPodAutoscalers {sorted(hpas)} outside the "
                f"autoscaling component (the base must work without a "
                f"custom metrics adapter)")
        return
    doc = doc_worker_metrics()
    cm = objs.get(("ConfigMap", ADAPTER_CM))
    rules = []
    if cm is None:
        err(f"autoscaling: no ConfigMap {ADAPTER_CM} (prometheus-adapter "
            f"rules)")
    else:
        try:
            rules = yaml.safe_load(cm.get("data", {}).get("config.yaml",
                                                          "")) or {}
            rules = rules.get("rules", [])
        except yaml.YAMLError as e:
            err(f"{ADAPTER_CM}: config.yaml is not YAML: {e}")
    by_target = {}
    for hname, h in hpas.items():
        if h.get("apiVersion") != "autoscaling/v2":
            err(f"HPA {hname}: apiVersion {h.get('apiVersion')}, want "
                f"autoscaling/v2")
        spec = h.get("spec", {})
        ref = spec.get("scaleTargetRef", {})
        if ref.get("kind") != "Deployment" or \
                ref.get("apiVersion") != "apps/v1" or \
                ref.get("name") not in deps:
            err(f"HPA {hname}: scaleTargetRef {ref} is no Deployment here")
            continue
        by_target.setdefault(ref["name"], []).append((hname, spec))
    for dname, metric in HPA_METRIC.items():
        got = by_target.get(dname, [])
        if len(got) != 1:
            err(f"autoscaling: {len(got)} HPAs target {dname}, want 1")
            continue
        hname, spec = got[0]
        role = dname.split("-", 1)[1]
        lo, hi = spec.get("minReplicas", 1), spec.get("maxReplicas", 0)
        if not 1 <= lo <= hi:
            err(f"HPA {hname}: minReplicas {lo} / maxReplicas {hi}")
        if "replicas" in deps[dname]["spec"]:
            err(f"{dname}: spec.replicas set under an HPA (kubectl apply "
                f"would reset the HPA's count)")
        ms = spec.get("metrics", [])
        names = [m.get("pods", {}).get("metric", {}).get("name")
                 for m in ms if m.get("type") == "Pods"]
        if len(ms) != 1 or names != [metric]:
            err(f"HPA {hname}: metrics {[m.get('type') for m in ms]} "
                f"{names}, want one Pods metric {metric}")
        for n in names:
            if n not in doc:
                err(f"HPA {hname}: metric {n} is not a worker metric of "
                    f"docs/OPERATIONS.md")
            elif doc[n][0] != "gauge" or not (
                    "all" in doc[n][1] or role in doc[n][1] or
                    "with a KV pool" in doc[n][1]):
                err(f"HPA {hname}: {n} is a {doc[n][0]} for roles "
                    f"'{doc[n][1]}', want a gauge {role} workers export")
            tgt = ms[0].get("pods", {}).get("target", {})
            if tgt.get("type") != "AverageValue" or \
                    "averageValue" not in tgt:
                err(f"HPA {hname}: target {tgt} is not an AverageValue")
            ok = [r for r in rules
                  if r.get("seriesQuery", "").split("{")[0].strip("'\" ")
                  == n and r.get("name", {}).get("as", n) == n and
                  r.get("resources", {}).get("overrides", {}) == {
                      "namespace": {"resource": "namespace"},
                      "pod": {"resource": "pod"}} and
                  "<<.Series>>" in r.get("metricsQuery", "") and
                  "<<.LabelMatchers>>" in r.get("metricsQuery", "")]
            if len(ok) != 1:
                err(f"{ADAPTER_CM}: {len(ok)} rules serve {n} per pod "
                    f"(namespace/pod overrides, <<.Series>>, "
                    f"<<.LabelMatchers>>), want 1")
        down = spec.get("behavior", {}).get("scaleDown", {})
        grace = pods.get(dname, {}).get("grace", 30)
        pol = down.get("policies", [])
        if down.get("stabilizationWindowSeconds", 300) < 60:
            err(f"HPA {hname}: scale-down stabilization < 60 s")
        if not pol or any(p.get("type") != "Pods" or p.get("value") != 1 or
                          p.get("periodSeconds", 0) < grace for p in pol) \
                or (len(pol) > 1 and down.get("selectPolicy") != "Min"):
            err(f"HPA {hname}: scale-down {pol} is not one pod per period "
                f">= the grace period {grace} s (workers drain on SIGTERM)")
    for t in by_target:
        if t not in HPA_METRIC:
            err(f"autoscaling: an HPA targets {t}")


def svc_port(svc, pname, svcs):
    for p in svcs.get(svc, {}).get("spec", {}).get("ports", []):
        if p.get("name") == pname:
            return p["port"]
    err(f"Service {svc} has no port {pname}")
    return -1


if __name__ == "__main__":
    sys.exit(main())
