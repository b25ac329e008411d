#!/usr/bin/env bash
# deploy/k8s: render the base and every overlay with `kubectl kustomize`
# (when kubectl is installed; otherwise the base's files as they are) and
# check them structurally (k8s_check.py: selectors, Services and ports,
# BATON_ROUTER, ConfigMap/PVC references, probes, grace periods, GPUs per
# overlay, every flag known to its binary; each overlay again with the
# node-local-ipc component); the checker must reject two broken variants;
# then the cpu-tiny pods run as local processes with
# their exact commands and environments (k8s_local.py): /health, golden
# equality with `baton run`, an HTTP completion, SIGTERM stop in grace.
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
  # the node-local-ipc component on top of each overlay (a copy of the
  # tree with one more overlay: kustomize wants relative paths)
  cp -r "$K8S" "$tmp/k8s"
  for o in $overlays; do
    mkdir -p "$tmp/k8s/overlays/nl-$o"
    printf 'resources:\n  - ../%s\ncomponents:\n  - ../../components/node-local-ipc\n' \
      "$o" >"$tmp/k8s/overlays/nl-$o/kustomization.yaml"
    kubectl kustomize "$tmp/k8s/overlays/nl-$o" >"$tmp/nl-$o.yaml" 2>"$tmp/err" ||
      fail "kubectl kustomize $o + node-local-ipc: $(cat "$tmp/err")"
    $CHECK "$tmp/nl-$o.yaml" "node-local-ipc-$o" --bin "$BATON_BIN" \
      --pods "$tmp/nl-$o.json" || fail "$o + node-local-ipc manifests"
  done
  # the checker is not vacuous: a worker pointed at the client port and
  # a flag no binary has are both caught
  sed 's|tcp://baton-router:5556|tcp://baton-router:5555|' \
    "$tmp/cpu-tiny.yaml" >"$tmp/bad1.yaml"
  sed 's|exec baton-decode |exec baton-decode --no-such-flag |' \
    "$tmp/cpu-tiny.yaml" >"$tmp/bad2.yaml"
  # and a liveness probe on /health (restarts baton-http with no workers)
  sed 's|path: /livez|path: /health|' "$tmp/cpu-tiny.yaml" >"$tmp/bad3.yaml"
  # the NetworkPolicy admitting everyone's control traffic as client's,
  # worker probes asking the control port, metrics annotated on a port
  # the router does not serve
  sed 's/port: control$/port: client/' "$tmp/cpu-tiny.yaml" >"$tmp/bad4.yaml"
  sed 's/"\$BATON_ROUTER_CLIENT"/"$BATON_ROUTER"/' "$tmp/cpu-tiny.yaml" \
    >"$tmp/bad5.yaml"
  sed 's|prometheus.io/port: "9090"|prometheus.io/port: "9091"|' \
    "$tmp/cpu-tiny.yaml" >"$tmp/bad6.yaml"
  for b in bad1 bad2 bad3 bad4 bad5 bad6; do
    cmp -s "$tmp/$b.yaml" "$tmp/cpu-tiny.yaml" && fail "$b changed nothing"
    if $CHECK "$tmp/$b.yaml" cpu-tiny --bin "$BATON_BIN" >"$tmp/$b.out"; then
      fail "the checker accepted $b"
    fi
  done
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
