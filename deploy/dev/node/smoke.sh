#!/usr/bin/env bash
# Check a running node end to end: build a small image locally (busybox-static's
# httpd, no Docker, no registry), import it, run it as a Pod behind a ClusterIP
# Service, and reach it from the host by pod IP and by ClusterIP (kube-proxy),
# from inside the pod through its own Service (hairpin), and through the
# apiserver (kubectl exec and logs go apiserver -> kubelet). Then the API from
# inside the cluster, as an in-cluster controller uses it: a pod with a
# ServiceAccount that may only list pods runs `kubectl get pods` with no
# kubeconfig (the env KUBERNETES_SERVICE_HOST/PORT, the mounted token and
# ca.crt), through the `kubernetes` Service; and the host reaches that Service
# too. Deletes what it made.
#
#   smoke.sh [ENV_FILE]     (default: the env file of a running start.sh)
#
# Prints the time from `kubectl apply` to the pod being Ready, and from
# applying the kubectl pod to its exit.
set -euo pipefail
LOG_TAG=node-smoke
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
ENV_FILE="${1:-$STATE/node.env}"
[[ -f "$ENV_FILE" ]] || die "no $ENV_FILE: start the node first ($NODE_DIR/start.sh)"
set -a
# shellcheck disable=SC1090  # the env file start.sh wrote
. "$ENV_FILE"
set +a
k() { kubectl --request-timeout 20s "$@"; }
NS=default
NAME="pf-smoke-$$"
IC_NS="pf-smoke-in-cluster-$$"
PASSED=0 FAILED=0
check() { # DESCRIPTION CMD...
  local what="$1"; shift
  if "$@"; then log "ok: $what"; PASSED=$((PASSED + 1)); else log "FAILED: $what"; FAILED=$((FAILED + 1)); fi
}
cleanup() {
  k -n "$NS" delete pod,service "$NAME" --ignore-not-found --wait=false >/dev/null 2>&1 || true
  k delete namespace "$IC_NS" --ignore-not-found --wait=false >/dev/null 2>&1 || true
}
trap cleanup EXIT

# ---- image ------------------------------------------------------------------------
# busybox-static's /bin/busybox needs no libc in the image.
if ! dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'install ok installed'; then
  log "apt-get install busybox-static"
  DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends busybox-static >/dev/null \
    || die "apt-get install busybox-static failed"
fi
BB_VERSION="$(dpkg-query -W -f='${Version}' busybox-static | sed 's/^[0-9]*://; s/[^A-Za-z0-9_.-]/_/g')"
IMAGE="localhost/proxyfleet/busybox:$BB_VERSION"
TAR="$CACHE/images/busybox-$BB_VERSION.tar"
if [[ ! -s "$TAR" ]]; then
  log "building $IMAGE"
  rootfs="$(mktemp -d)"
  mkdir -p "$rootfs/bin" "$rootfs/www" "$rootfs/tmp"
  install -m 0755 /bin/busybox "$rootfs/bin/busybox"
  ln -s busybox "$rootfs/bin/sh"
  printf 'proxyfleet node smoke test\n' >"$rootfs/www/index.html"
  chmod 0755 "$rootfs" "$rootfs/bin" "$rootfs/www"; chmod 1777 "$rootfs/tmp"; chmod 0644 "$rootfs/www/index.html"
  "$NODE_DIR/oci-image.sh" "$rootfs" "$IMAGE" "$TAR.tmp" '["/bin/busybox"]' '["sh"]' >/dev/null
  rm -rf "$rootfs"
  mv -f "$TAR.tmp" "$TAR"
fi
if ! ctr images ls -q "name==$IMAGE" | grep -qx "$IMAGE"; then
  log "importing $IMAGE"
  ctr images import "$TAR" >/dev/null
fi

# ---- pod + service --------------------------------------------------------------------
t0="$(date +%s.%N)"
k -n "$NS" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $NAME
  labels: {app: $NAME}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - name: httpd
    image: $IMAGE
    imagePullPolicy: Never
    command: ["/bin/busybox", "httpd", "-f", "-v", "-p", "8080", "-h", "/www"]
    ports: [{containerPort: 8080}]
    readinessProbe:
      httpGet: {path: /, port: 8080}
      periodSeconds: 1
---
apiVersion: v1
kind: Service
metadata:
  name: $NAME
spec:
  selector: {app: $NAME}
  ports: [{port: 80, targetPort: 8080}]
EOF
until [[ "$(k -n "$NS" get pod "$NAME" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]; do
  if (( $(date +%s) - ${t0%.*} > 60 )); then
    k -n "$NS" describe pod "$NAME" >&2 || true
    die "pod $NAME not Ready after 60s"
  fi
  sleep 0.1
done
t1="$(date +%s.%N)"
READY_S="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }')"
log "pod $NAME Ready ${READY_S}s after apply"

POD_IP="$(k -n "$NS" get pod "$NAME" -o 'jsonpath={.status.podIP}')"
CLUSTER_IP="$(k -n "$NS" get service "$NAME" -o 'jsonpath={.spec.clusterIP}')"
log "pod IP $POD_IP, ClusterIP $CLUSTER_IP"
body_ok() { [[ "$(curl --noproxy '*' -fs --max-time 5 "$1")" == "proxyfleet node smoke test" ]]; }
in_cidr24() { [[ "${1%.*}.0/24" == "$2" ]]; }
check "pod Running" [ "$(k -n "$NS" get pod "$NAME" -o 'jsonpath={.status.phase}')" == Running ]
check "pod IP $POD_IP is in $KUBE_POD_CIDR" in_cidr24 "$POD_IP" "$KUBE_POD_CIDR"
check "ClusterIP $CLUSTER_IP is in $KUBE_SERVICE_CIDR" in_cidr24 "$CLUSTER_IP" "$KUBE_SERVICE_CIDR"
check "host -> pod IP http://$POD_IP:8080/" body_ok "http://$POD_IP:8080/"
# Endpoints reach kube-proxy's rules a moment after the pod turns Ready.
svc_ok() { for _ in $(seq 50); do body_ok "http://$CLUSTER_IP/" && return 0; sleep 0.1; done; return 1; }
check "host -> ClusterIP http://$CLUSTER_IP/ (kube-proxy)" svc_ok
# (No wget -T: busybox-static 1.35 wget crashes with it.)
check "pod -> its own ClusterIP (hairpin, kubectl exec via the kubelet)" \
  bash -c "[[ \"\$(kubectl --request-timeout 20s -n $NS exec $NAME -- busybox wget -qO- http://$CLUSTER_IP/)\" == 'proxyfleet node smoke test' ]]"
check "pod has no default route" \
  bash -c "! kubectl --request-timeout 20s -n $NS exec $NAME -- busybox ip route | grep -q default"
check "kubectl logs (apiserver -> kubelet)" bash -c "kubectl --request-timeout 20s -n $NS logs $NAME | grep -q 'response:200'"

t2="$(date +%s.%N)"
k -n "$NS" delete pod,service "$NAME" --wait=true --timeout 60s >/dev/null
DELETE_S="$(awk -v a="$t2" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
check "pod deleted (${DELETE_S}s)" bash -c "! kubectl --request-timeout 20s -n $NS get pod $NAME >/dev/null 2>&1"

# ---- the API from inside the cluster -------------------------------------------------
# The host's kubectl is a static Go binary: alone in an image it needs no libc,
# no shell and no DNS. Tagged by its digest, so a new kubectl gets a new image.
KUBECTL_EXE="$(readlink -f "$(command -v kubectl)")"
KC_SUM="$(sha256sum "$KUBECTL_EXE" | cut -c1-12)"
KC_IMAGE="localhost/proxyfleet/kubectl:$KC_SUM"
KC_TAR="$CACHE/images/kubectl-$KC_SUM.tar"
if [[ ! -s "$KC_TAR" ]]; then
  log "building $KC_IMAGE from $KUBECTL_EXE"
  rootfs="$(mktemp -d)"
  mkdir -p "$rootfs/bin" "$rootfs/tmp"
  install -m 0755 "$KUBECTL_EXE" "$rootfs/bin/kubectl"
  chmod 0755 "$rootfs" "$rootfs/bin"; chmod 1777 "$rootfs/tmp"
  "$NODE_DIR/oci-image.sh" "$rootfs" "$KC_IMAGE" "$KC_TAR.tmp" '["/bin/kubectl"]' >/dev/null
  rm -rf "$rootfs"
  mv -f "$KC_TAR.tmp" "$KC_TAR"
fi
if ! ctr images ls -q "name==$KC_IMAGE" | grep -qx "$KC_IMAGE"; then
  log "importing $KC_IMAGE"
  ctr images import "$KC_TAR" >/dev/null
fi

SA=pod-lister
KC_POD=kubectl-get-pods
k apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $IC_NS
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: $SA
  namespace: $IC_NS
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata:
  name: $SA
  namespace: $IC_NS
rules:
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata:
  name: $SA
  namespace: $IC_NS
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: Role
  name: $SA
subjects:
- kind: ServiceAccount
  name: $SA
  namespace: $IC_NS
EOF
# 1.20's ServiceAccount admission rejects the pod until the token controller
# has made the account's token Secret.
for _ in $(seq 100); do
  SA_SECRET="$(k -n "$IC_NS" get serviceaccount "$SA" -o 'jsonpath={.secrets[0].name}' 2>/dev/null || true)"
  [[ -n "$SA_SECRET" ]] && break
  sleep 0.1
done
[[ -n "$SA_SECRET" ]] || die "ServiceAccount $IC_NS/$SA got no token Secret in 10s (is the controller-manager's token controller running?)"
secret_key() { k -n "$IC_NS" get secret "$SA_SECRET" -o "go-template={{index .data \"$1\"}}" | base64 -d; }
token_secret_ok() {
  [[ -n "$(secret_key token)" && "$(secret_key namespace)" == "$IC_NS" ]] \
    && cmp -s <(secret_key ca.crt) "$KUBE_CA_FILE"
}
check "token Secret $SA_SECRET has a token, the namespace and the cluster CA as ca.crt" token_secret_ok
root_ca_ok() {
  for _ in $(seq 50); do
    cmp -s <(k -n "$IC_NS" get configmap kube-root-ca.crt -o 'go-template={{index .data "ca.crt"}}' 2>/dev/null) \
      "$KUBE_CA_FILE" && return 0
    sleep 0.1
  done
  return 1
}
check "ConfigMap $IC_NS/kube-root-ca.crt holds the cluster CA" root_ca_ok
check "RBAC: $SA may list pods in $IC_NS, not secrets" bash -c \
  "[[ \"\$(kubectl --request-timeout 20s auth can-i list pods -n $IC_NS --as system:serviceaccount:$IC_NS:$SA)\" == yes \
     && \"\$(kubectl --request-timeout 20s auth can-i list secrets -n $IC_NS --as system:serviceaccount:$IC_NS:$SA || true)\" == no ]]"

# No kubeconfig, no flags: kubectl falls back to the in-cluster config, and -v=6
# logs the URL it used. HOME: kubectl's cache dir, in the image's /tmp.
t3="$(date +%s.%N)"
k -n "$IC_NS" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: Pod
metadata:
  name: $KC_POD
spec:
  serviceAccountName: $SA
  restartPolicy: Never
  terminationGracePeriodSeconds: 1
  containers:
  - name: kubectl
    image: $KC_IMAGE
    imagePullPolicy: Never
    command: ["/bin/kubectl", "get", "pods", "-v=6"]
    env: [{name: HOME, value: /tmp}]
EOF
until [[ "$(k -n "$IC_NS" get pod "$KC_POD" -o 'jsonpath={.status.phase}' 2>/dev/null)" =~ ^(Succeeded|Failed)$ ]]; do
  if (( $(date +%s) - ${t3%.*} > 60 )); then
    k -n "$IC_NS" describe pod "$KC_POD" >&2 || true
    die "pod $IC_NS/$KC_POD did not finish in 60s"
  fi
  sleep 0.1
done
KC_S="$(awk -v a="$t3" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
KC_EXIT="$(k -n "$IC_NS" get pod "$KC_POD" -o 'jsonpath={.status.containerStatuses[0].state.terminated.exitCode}')"
KC_LOG="$(k -n "$IC_NS" logs "$KC_POD" 2>&1 || true)"
# Its log without the discovery requests (GET /api, /apis/<group>/<version>).
log "kubectl pod finished ${KC_S}s after apply (exit $KC_EXIT); its log, discovery left out:"
grep -vE 'GET https://[^ ]+/apis?(/[^ ?]+)?\?timeout=[0-9]+s 200 OK' <<<"$KC_LOG" | sed 's/^/    /' >&2 || true
check "in-cluster kubectl exited 0" [ "$KC_EXIT" == 0 ]
# The list is taken while the pod starts, so its STATUS is still ContainerCreating.
check "in-cluster kubectl listed itself" grep -qE "^${KC_POD}[[:space:]]+[0-9]+/[0-9]+[[:space:]]" <<<"$KC_LOG"
check "in-cluster kubectl used https://$KUBE_API_SERVICE_IP:443 (the kubernetes Service) and its namespace" \
  grep -qF "GET https://$KUBE_API_SERVICE_IP:443/api/v1/namespaces/$IC_NS/pods?limit=500 200 OK" <<<"$KC_LOG"
check "in-cluster kubectl read no kubeconfig" bash -c '! grep -q "Config loaded from file" <<<"$1"' _ "$KC_LOG"
version_ok() {
  curl --noproxy '*' -fsS --max-time 5 --cacert "$KUBE_CA_FILE" "https://$KUBE_API_SERVICE_IP/version" \
    | grep -qF "\"gitVersion\": \"$KUBE_VERSION\""
}
check "host -> https://$KUBE_API_SERVICE_IP/version (kube-proxy, certificate verified)" version_ok

t4="$(date +%s.%N)"
k delete namespace "$IC_NS" --wait=true --timeout 60s >/dev/null
NS_DELETE_S="$(awk -v a="$t4" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')"
check "namespace $IC_NS deleted (${NS_DELETE_S}s)" bash -c "! kubectl --request-timeout 20s get namespace $IC_NS >/dev/null 2>&1"
trap - EXIT

echo "pod Ready after apply: ${READY_S}s; deleted in ${DELETE_S}s"
echo "in-cluster kubectl pod done after apply: ${KC_S}s; namespace deleted in ${NS_DELETE_S}s"
echo "$PASSED passed, $FAILED failed"
((FAILED == 0))
