#!/usr/bin/env bash
# curve-secret.sh - the baton-curve Secret the manifests mount (CURVE on
# every ZeroMQ socket, docs/SECURITY.md): a router, a worker and a client
# key pair from `baton keygen`, plus clients.allow (the client key only:
# the workers' probes ask their own /health, not the router's client
# port, which the NetworkPolicy closes to them).  Prints the Secret
# as YAML; nothing is written to disk but a temp dir removed on exit.
#
#   deploy/k8s/curve-secret.sh | kubectl apply -n NAMESPACE -f -
#   (BATON=/path/to/baton if `baton` is not on PATH)
#
# Rotate: run it again and `kubectl rollout restart deployment -l
# app.kubernetes.io/name=baton` (every pod reads its key at start).
# Keep the printed YAML out of git: it holds the secret keys.
set -euo pipefail
BATON=${BATON:-$(command -v baton || true)}
[ -x "$BATON" ] || { echo "curve-secret.sh: no baton binary (set BATON)" >&2; exit 2; }
NAME=${1:-baton-curve}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
for k in router worker client; do
  "$BATON" keygen --out "$tmp/$k" >/dev/null
done
cat "$tmp/client.pub" >"$tmp/clients.allow"
b64() { base64 -w0 <"$1"; }
cat <<YAML
apiVersion: v1
kind: Secret
metadata:
  name: $NAME
  labels:
    app.kubernetes.io/name: baton
    app.kubernetes.io/part-of: baton
type: Opaque
data:
  router.key: $(b64 "$tmp/router.key")
  router.pub: $(b64 "$tmp/router.pub")
  worker.key: $(b64 "$tmp/worker.key")
  worker.pub: $(b64 "$tmp/worker.pub")
  client.key: $(b64 "$tmp/client.key")
  client.pub: $(b64 "$tmp/client.pub")
  clients.allow: $(b64 "$tmp/clients.allow")
YAML
