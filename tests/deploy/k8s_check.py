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
binary's --help lists (with --bin); workers have startup, readiness and
liveness exec probes that ask the router's client port for the pod's
worker name; a PodDisruptionBudget per worker Deployment (maxUnavailable,
selecting exactly its pods); a NetworkPolicy on the router pods that
admits only workers to the control port and only workers and baton-http
to the client port; the router serves metrics on the port its
prometheus.io annotations name; the h200 overlay sizes the KV pool.
--pods writes, per Deployment, the command and environment its container
would run with (ConfigMap values and downward API resolved), its exec
probes and its annotations, for a local launch.
"""
import json
import re
import subprocess
import sys

import yaml

ROLES = ("router", "prefill", "decode", "http")
NODE_NAME = "node-0"    # spec.nodeName for --pods (one node)
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
                      "probes": {p: c[p]["exec"]["command"]
                                 for p in ("startupProbe", "readinessProbe",
                                           "livenessProbe")
                                 if "exec" in c.get(p, {})}}

        if role in ("prefill", "decode"):
            if pods[name]["grace"] < 30:
                err(f"{name}: terminationGracePeriodSeconds < 30: no drain")
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
            # probes: `baton status` on the client port finds the pod's
            # worker name (the name the worker registers with)
            client = "tcp://baton-router:%d" % svc_port("baton-router",
                                                        "client", svcs)
            if env.get("BATON_ROUTER_CLIENT") != client:
                err(f"{name}: BATON_ROUTER_CLIENT "
                    f"{env.get('BATON_ROUTER_CLIENT')} != {client}")
            if '--name "$POD_NAME"' not in cmd[2]:
                err(f"{name}: the worker is not named after its pod")
            for p in ("startupProbe", "readinessProbe", "livenessProbe"):
                pc = " ".join(c.get(p, {}).get("exec", {}).get("command",
                                                                 []))
                if "baton status" not in pc or "$POD_NAME" not in pc or \
                        "$BATON_ROUTER_CLIENT" not in pc:
                    err(f"{name}: {p} does not ask the router for $POD_NAME")
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
            ann = tmpl["metadata"].get("annotations", {})
            m = re.search(r"--metrics-port (\d+)", cmd[2])
            if ann.get("prometheus.io/scrape") != "true" or not m:
                err("baton-router: metrics off or no prometheus.io/scrape")
            elif ann.get("prometheus.io/port") != m.group(1) or \
                    ports[name].get("metrics") != int(m.group(1)):
                err(f"baton-router: prometheus.io/port "
                    f"{ann.get('prometheus.io/port')} / container port "
                    f"{ports[name].get('metrics')} != --metrics-port "
                    f"{m.group(1)}")
            elif ann.get("prometheus.io/path") != "/metrics":
                err("baton-router: prometheus.io/path is not /metrics")
            if "--metrics-host 0.0.0.0" not in cmd[2]:
                err("baton-router: metrics bound to loopback only")
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
            "client": {"baton-prefill", "baton-decode", "baton-http"},
            "metrics": "any"}
    if "all" in admitted:
        err("NetworkPolicy: a rule admits every port")
    for pn, w in want.items():
        if admitted.get(pn) != w:
            err(f"NetworkPolicy: port {pn} admits {admitted.get(pn)}, "
                f"want {w}")


def svc_port(svc, pname, svcs):
    for p in svcs.get(svc, {}).get("spec", {}).get("ports", []):
        if p.get("name") == pname:
            return p["port"]
    err(f"Service {svc} has no port {pname}")
    return -1


if __name__ == "__main__":
    sys.exit(main())
