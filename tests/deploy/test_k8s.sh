#!/usr/bin/env bash
# deploy/k8s: render the base and every overlay with `kubectl kustomize`
# (when kubectl is installed; otherwise the base's files as they are) and
# check them structurally (k8s_check.py: selectors, Services and ports,
# BATON_ROUTER, ConfigMap/PVC references, probes, grace periods, GPUs per
# overlay, every flag known to its binary; each overlay again with the
# node-local-ipc component, with the autoscaling component (HPAs and
# prometheus-adapter rules against docs/OPERATIONS.md), and h200 with
# both); the checker must reject broken variants; then the cpu-tiny pods
# run as local processes with their exact commands and environments
# (k8s_local.py): /health, metrics, the worker probes over HTTP (and a
# router crash that must restart no worker), golden equality with `baton
# run`, an HTTP completion, SIGTERM stop in grace.
set -u
fail() { echo "FAIL: $*"; exit 1; }
SRC=${BT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
K8S=$SRC/deploy/k8s
# Debian's python3 with python3-yaml (make deps installs both); a
# python3 earlier on PATH (pyenv) may lack yaml.
PY=python3
[ -x /usr/bin/python3 ] && PY=/usr/bin/python3
CHECK="$PY $SRC/tests/deploy/k8s_check.py"
$PY -c 'import yaml' 2>/dev/null || fail "python3 without yaml: run make deps"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

if kubectl kustomize "$K8S/base" >"$tmp/base.yaml" 2>"$tmp/err"; then
  overlays=$(cd "$K8S/overlays" && ls)
  for o in base $overlays; do
    dir=$K8S/overlays/$o; [ $o = base ] && dir=$K8S/base
    kubectl kustomize "$dir" >"$tmp/$o.yaml" 2>"$tmp/err" ||
      fail "kubectl kustomize $o: $(cat "$tmp/err")"
    $CHECK "$tmp/$o.yaml" "$o" --bin "$BATON_BIN" --pods "$tmp/$o.json" ||
      fail "$o manifests"
  done
  pods=$tmp/cpu-tiny.json
  # the components on top of each overlay (a copy of the tree with one
  # more overlay per case: kustomize wants relative paths); the checker
  # reads the case from its name (node-local-ipc*, *autoscaling*, *h200)
  cp -r "$K8S" "$tmp/k8s"
  with() {  # NAME OVERLAY COMPONENT... : render, then check as NAME
    local name=$1 o=$2 c; shift 2
    mkdir -p "$tmp/k8s/overlays/$name"
    { printf 'resources:\n  - ../%s\ncomponents:\n' "$o"
      for c; do printf '  - ../../components/%s\n' "$c"; done
    } >"$tmp/k8s/overlays/$name/kustomization.yaml"
    kubectl kustomize "$tmp/k8s/overlays/$name" >"$tmp/$name.yaml" \
      2>"$tmp/err" || fail "kubectl kustomize $o + $*: $(cat "$tmp/err")"
    $CHECK "$tmp/$name.yaml" "$name" --bin "$BATON_BIN" ||
      fail "$o + $* manifests"
  }
  for o in $overlays; do
    with "node-local-ipc-$o" "$o" node-local-ipc
    with "autoscaling-$o" "$o" autoscaling
  done
  with node-local-ipc-autoscaling-h200 h200 node-local-ipc autoscaling
  # the checker is not vacuous.  Edits of a rendering: sed, or Python
  # statements on d ((kind, name) -> object) and c(deployment) (its
  # container).
  mutate() {  # IN OUT PYTHON
    $PY - "$@" <<'EOF'
import sys, yaml
docs = [x for x in yaml.safe_load_all(open(sys.argv[1])) if x]
d = {(x["kind"], x["metadata"]["name"]): x for x in docs}
def c(name):
    return d[("Deployment", name)]["spec"]["template"]["spec"]["containers"][0]
exec(sys.argv[3])
yaml.safe_dump_all(docs, open(sys.argv[2], "w"))
EOF
  }
  ct=$tmp/cpu-tiny.yaml
  at=$tmp/autoscaling-cpu-tiny.yaml
  # a worker pointed at the client port, a flag no binary has
  sed 's|tcp://baton-router:5556|tcp://baton-router:5555|' "$ct" >"$tmp/bad1.yaml"
  sed 's|exec baton-decode |exec baton-decode --no-such-flag |' "$ct" \
    >"$tmp/bad2.yaml"
  # a liveness probe on /health (restarts baton-http with no workers)
  sed 's|path: /livez|path: /health|' "$ct" >"$tmp/bad3.yaml"
  # the NetworkPolicy admitting everyone's control traffic as client's,
  # metrics annotated on a port the router does not serve
  sed 's/port: control$/port: client/' "$ct" >"$tmp/bad4.yaml"
  sed 's|prometheus.io/port: "9090"|prometheus.io/port: "9091"|' "$ct" \
    >"$tmp/bad6.yaml"
  # worker liveness on /health's status (a router restart would restart
  # every worker), readiness on another port, worker metrics annotated
  # on a port it does not serve, a liveness that fails on every 503, a
  # grace period shorter than the decode drain + 30 s
  mutate "$ct" "$tmp/bad5.yaml" 'c("baton-decode")["livenessProbe"] = {
      "httpGet": {"path": "/health", "port": "metrics"}}'
  mutate "$ct" "$tmp/bad7.yaml" \
    'c("baton-prefill")["readinessProbe"]["httpGet"]["port"] = 9090'
  mutate "$ct" "$tmp/bad8.yaml" 'd[("Deployment", "baton-prefill")]["spec"][
      "template"]["metadata"]["annotations"]["prometheus.io/port"] = "9101"'
  mutate "$ct" "$tmp/bad9.yaml" 'p = c("baton-decode")["livenessProbe"]["exec"]
p["command"] = [x.replace(": stuck", "unavailable") for x in p["command"]]'
  mutate "$ct" "$tmp/bad10.yaml" 'd[("Deployment", "baton-decode")]["spec"][
      "template"]["spec"]["terminationGracePeriodSeconds"] = 60'
  # HPAs: a metric docs/OPERATIONS.md does not list, the decode HPA on the
  # prefill Deployment, scale-down by 2 pods, no adapter rule for the KV
  # ratio, replicas left on a scaled Deployment
  hd='d[("HorizontalPodAutoscaler", "baton-decode")]["spec"]'
  mutate "$at" "$tmp/bad11.yaml" "$hd"'["metrics"][0]["pods"]["metric"][
      "name"] = "baton_worker_kv_usage"'
  mutate "$at" "$tmp/bad12.yaml" "$hd"'["scaleTargetRef"]["name"] = "baton-prefill"'
  mutate "$at" "$tmp/bad13.yaml" "$hd"'["behavior"]["scaleDown"]["policies"][0][
      "value"] = 2'
  mutate "$at" "$tmp/bad14.yaml" 'm = d[("ConfigMap", "baton-prometheus-adapter")]["data"]
r = yaml.safe_load(m["config.yaml"]); r["rules"] = r["rules"][:1]
m["config.yaml"] = yaml.safe_dump(r)'
  mutate "$at" "$tmp/bad15.yaml" \
    'd[("Deployment", "baton-decode")]["spec"]["replicas"] = 3'
  for b in bad1 bad2 bad3 bad4 bad5 bad6 bad7 bad8 bad9 bad10 \
           bad11 bad12 bad13 bad14 bad15; do
    o=cpu-tiny; ref=$ct
    case $b in bad1[1-5]) o=autoscaling-cpu-tiny; ref=$at;; esac
    [ -s "$tmp/$b.yaml" ] || fail "$b: the edit failed"
    cmp -s "$tmp/$b.yaml" "$ref" && fail "$b changed nothing"
    if $CHECK "$tmp/$b.yaml" $o --bin "$BATON_BIN" >"$tmp/$b.out"; then
      fail "the checker accepted $b"
    fi
  done
  # HPAs without the autoscaling component: the base must not need an
  # adapter
  $CHECK "$at" cpu-tiny >"$tmp/bad16.out" &&
    fail "the checker accepted HPAs in cpu-tiny"
  echo "ok broken variants rejected: $(cat "$tmp"/bad*.out | tr '\n' ' ')"
else
  echo "kubectl kustomize unavailable ($(head -c 200 "$tmp/err")):" \
    "checking the base's files as they are"
  $PY - "$K8S" "$tmp/base.yaml" <<'EOF' || fail "base files"
import os, sys, yaml
k8s, out = sys.argv[1], sys.argv[2]
docs = []
for root, _, files in os.walk(k8s):
    for f in files:
        if f.endswith(".yaml"):
            ds = list(yaml.safe_load_all(open(os.path.join(root, f))))
            if f == "kustomization.yaml":
                k = ds[0]
                for r in k.get("resources", []) + [
                        p["path"] for p in k.get("patches", []) if "path" in p]:
                    if not os.path.exists(os.path.join(root, r)):
                        sys.exit(f"{root}/{f}: {r} missing")
base = yaml.safe_load(open(os.path.join(k8s, "base/kustomization.yaml")))
for r in base["resources"]:
    docs += [d for d in yaml.safe_load_all(open(os.path.join(k8s, "base", r))) if d]
data = dict(l.split("=", 1) for l in open(os.path.join(k8s, "base/baton.env"))
            .read().splitlines() if l and not l.startswith("#"))
docs.append({"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "baton-config"}, "data": data})
for d in docs:
    for c in d.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []):
        c["image"] = "baton:latest"
yaml.safe_dump_all(docs, open(out, "w"))
EOF
  $CHECK "$tmp/base.yaml" base-raw --bin "$BATON_BIN" --pods "$tmp/base.json" ||
    fail "base manifests"
  # the base with the cpu-tiny settings, for the local run
  $PY - "$tmp/base.json" "$tmp/pods.json" <<'EOF'
import json, sys
pods = json.load(open(sys.argv[1]))
for p in pods.values():
    p["env"].update(BATON_MODEL="synth:tiny", BATON_DEVICE="cpu",
                    BATON_KV_BLOCKS="256", BATON_THREADS="1")
json.dump(pods, open(sys.argv[2], "w"))
EOF
  pods=$tmp/pods.json
fi

# Its ports were free when picked; another process on the machine may
# take one before the router binds it: one more try on fresh ports then.
out=$(timeout 80 $PY "$SRC/tests/deploy/k8s_local.py" "$pods" "$BATON_BIN" 2>&1)
rc=$?
if [ $rc -ne 0 ] && grep -q "Address already in use" <<<"$out"; then
  echo "$out" | tail -3
  echo "a port was taken meanwhile: once more on fresh ports"
  out=$(timeout 80 $PY "$SRC/tests/deploy/k8s_local.py" "$pods" "$BATON_BIN" 2>&1)
  rc=$?
fi
echo "$out"
[ $rc -eq 0 ] || fail "the cpu-tiny pods as local processes"
echo "PASS deploy/k8s"
