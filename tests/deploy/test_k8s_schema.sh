#!/usr/bin/env bash
# deploy/k8s against the Kubernetes API schemas, offline: renders the base,
# every overlay, every overlay with components/node-local-ipc and with
# components/autoscaling (autoscaling/v2 HorizontalPodAutoscalers, the
# prometheus-adapter ConfigMap), and h200 with both, with a
# real kustomize (`kubectl kustomize`, kustomize v4 or later: components),
# and validates each object with the npm package kubernetes-models (the
# Kubernetes OpenAPI schemas compiled to ajv validators: types, required
# fields, enums, formats; a kind without a schema fails).  The validator
# must reject four broken variants, so this test can fail.
# npm packages (tests/deploy/npm: versions and hashes pinned by its
# package-lock.json) go to BT_BUILD_DIR/deploy-npm, installed with `npm
# ci` once per lock file, bounded by a timeout; an unreachable registry
# fails the test with a message.  Needs kubectl, node and npm.
set -uo pipefail
fail() { echo "FAIL: $*"; exit 1; }
SRC=${BT_SOURCE_DIR:-$(cd "$(dirname "$0")/../.." && pwd)}
K8S=$SRC/deploy/k8s
NPM_DIR=${BT_BUILD_DIR:-$SRC/build}/deploy-npm
t0=$(date +%s)

command -v kubectl >/dev/null ||
  fail "no kubectl: kustomize renders the manifests (kubectl kustomize)"
kv=$(kubectl version --client 2>/dev/null | sed -n 's/^Kustomize Version: v\([0-9]*\).*/\1/p')
[ -n "$kv" ] && [ "$kv" -ge 4 ] ||
  fail "kubectl's kustomize is '${kv:-unknown}', components need v4 or later"
command -v node >/dev/null && command -v npm >/dev/null ||
  fail "no node/npm: the schemas come from the npm package kubernetes-models"

# --- the schemas (npm ci, once per lock file) ---------------------------------
if ! cmp -s "$SRC/tests/deploy/npm/package-lock.json" \
       "$NPM_DIR/package-lock.json" ||
   [ ! -f "$NPM_DIR/node_modules/kubernetes-models/package.json" ]; then
  rm -rf "$NPM_DIR" && mkdir -p "$NPM_DIR" || fail "cannot create $NPM_DIR"
  cp "$SRC"/tests/deploy/npm/package.json "$SRC"/tests/deploy/npm/package-lock.json \
    "$NPM_DIR"/ || fail "cannot copy the npm manifests"
  if ! (cd "$NPM_DIR" && timeout 180 npm ci --no-audit --no-fund \
          --fetch-retries=1 --fetch-timeout=30000 --loglevel=error \
          >npm.log 2>&1); then
    tail -n 15 "$NPM_DIR/npm.log"
    rm -f "$NPM_DIR/package-lock.json"   # retried next time
    fail "npm ci could not install kubernetes-models (is the npm registry" \
      "reachable? see the log above)"
  fi
fi
km=$(sed -n 's/^ *"version": "\(.*\)",*$/\1/p' \
  "$NPM_DIR/node_modules/kubernetes-models/package.json" | head -n 1)
echo "schemas: kubernetes-models $km; kustomize v$kv"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# --- render ---------------------------------------------------------------------
cp -r "$K8S" "$tmp/k8s"
overlays=$(cd "$K8S/overlays" && ls)
files=()
for o in base $overlays; do
  dir=$tmp/k8s/overlays/$o; [ "$o" = base ] && dir=$tmp/k8s/base
  kubectl kustomize "$dir" >"$tmp/$o.yaml" 2>"$tmp/err" ||
    fail "kubectl kustomize $o: $(cat "$tmp/err")"
  files+=("$tmp/$o.yaml")
done
with() {  # NAME OVERLAY COMPONENT...: an overlay of OVERLAY + components
  local name=$1 o=$2 c; shift 2
  mkdir -p "$tmp/k8s/overlays/$name"
  { printf 'resources:\n  - ../%s\ncomponents:\n' "$o"
    for c; do printf '  - ../../components/%s\n' "$c"; done
  } >"$tmp/k8s/overlays/$name/kustomization.yaml"
  kubectl kustomize "$tmp/k8s/overlays/$name" >"$tmp/$name.yaml" 2>"$tmp/err" ||
    fail "kubectl kustomize $o + $*: $(cat "$tmp/err")"
  files+=("$tmp/$name.yaml")
}
for o in $overlays; do
  with "nl-$o" "$o" node-local-ipc
  with "as-$o" "$o" autoscaling
done
with nl-as-h200 h200 node-local-ipc autoscaling

# --- validate -------------------------------------------------------------------
V=(timeout 60 node "$SRC/tests/deploy/k8s_schema.mjs" "$NPM_DIR/node_modules")
"${V[@]}" "${files[@]}" | sed "s|$tmp/||" || fail "manifests against the schemas"
# every kind the manifests use was checked (a kind missing from the
# output would mean it was never rendered)
for k in ConfigMap Deployment NetworkPolicy PersistentVolumeClaim \
         PodDisruptionBudget Service; do
  grep -q "^kind: $k\$" "$tmp/h200.yaml" || fail "h200 has no $k"
done
grep -q "^kind: HorizontalPodAutoscaler\$" "$tmp/nl-as-h200.yaml" ||
  fail "h200 + autoscaling has no HorizontalPodAutoscaler"

# --- the validator is not vacuous -------------------------------------------------
# a port number as a string, a container without its required name, an
# apiVersion Kubernetes does not have, and an HPA whose maxReplicas is a
# string
sed '0,/containerPort: 5555/s//containerPort: "5555"/' "$tmp/h200.yaml" \
  >"$tmp/bad1.yaml"
sed 's/^        name: router$/        nam: router/' "$tmp/h200.yaml" \
  >"$tmp/bad2.yaml"
sed 's|apiVersion: policy/v1|apiVersion: policy/v1beta9|' "$tmp/h200.yaml" \
  >"$tmp/bad3.yaml"
sed 's/^  maxReplicas: \([0-9]*\)$/  maxReplicas: "\1"/' "$tmp/nl-as-h200.yaml" \
  >"$tmp/bad4.yaml"
for b in bad1 bad2 bad3 bad4; do
  ref=$tmp/h200.yaml; [ $b = bad4 ] && ref=$tmp/nl-as-h200.yaml
  cmp -s "$tmp/$b.yaml" "$ref" && fail "$b: the edit changed nothing"
  if "${V[@]}" "$tmp/$b.yaml" >"$tmp/$b.out" 2>&1; then
    fail "the schema check accepted $b: $(cat "$tmp/$b.out")"
  fi
  echo "ok $b rejected: $(head -n 1 "$tmp/$b.out" | sed "s|$tmp/||")"
done
echo "PASS deploy/k8s_schema ($(( $(date +%s) - t0 )) s)"
