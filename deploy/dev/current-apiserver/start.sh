#!/usr/bin/env bash
# Start a current CRD-only API server for integration tests: sid's etcd and
# apiextensions-apiserver (Kubernetes 1.36 or later, built by build.sh), on
# 127.0.0.1 only. It serves CustomResourceDefinitions and custom resources
# with everything a current server does to them (structural schemas,
# defaulting, CEL rules, server-side apply, status and scale subresources,
# watches) and nothing else: no Namespaces, Secrets, ConfigMaps, Leases or
# Events (../kube-apiserver runs a whole 1.20 control plane for those).
#
# Idempotent: if both run and the server is ready it only prints the env
# file's path. Runs build.sh first (a no-op when the binaries are cached).
#
# Output: $STATE/kube.env (KUBE_API_URL, KUBE_CA_FILE, KUBECONFIG,
# KUBE_VERSION, ...) and $STATE/kubeconfig (an admin in system:masters, by
# client certificate); the env file's path is the last line on stdout.
#
# Environment (all optional):
#   PROXYFLEET_KUBE_CURRENT_CACHE  binaries' cache (default ~/.cache/proxyfleet/kube-current)
#   PROXYFLEET_KUBE_CURRENT_STATE  state dir (default $CACHE/state)
#   PROXYFLEET_KUBE_CURRENT_ETCD_PORT       etcd client port (default 23791)
#   PROXYFLEET_KUBE_CURRENT_ETCD_PEER_PORT  etcd peer port   (default 23801)
#   PROXYFLEET_KUBE_CURRENT_PORT            the API server   (default 16444)
#   PROXYFLEET_KUBE_READY_TIMEOUT  seconds to wait for readiness (default 120)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${PROXYFLEET_KUBE_CURRENT_CACHE:-$HOME/.cache/proxyfleet/kube-current}"
BIN="$CACHE/bin"
STATE="${PROXYFLEET_KUBE_CURRENT_STATE:-$CACHE/state}"
ETCD_PORT="${PROXYFLEET_KUBE_CURRENT_ETCD_PORT:-23791}"
ETCD_PEER_PORT="${PROXYFLEET_KUBE_CURRENT_ETCD_PEER_PORT:-23801}"
API_PORT="${PROXYFLEET_KUBE_CURRENT_PORT:-16444}"
READY_TIMEOUT="${PROXYFLEET_KUBE_READY_TIMEOUT:-120}"
HOST=127.0.0.1
API_URL="https://$HOST:$API_PORT"
SERVER="$BIN/apiextensions-apiserver"
ETCD="$BIN/etcd"

T0=$SECONDS
log() { printf '[kube-current-start %3ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
die() { printf '[kube-current-start %3ds] ERROR: %s\n' "$((SECONDS - T0))" "$*" >&2; exit 1; }

PROXYFLEET_KUBE_CURRENT_CACHE="$CACHE" "$HERE/build.sh"
command -v openssl >/dev/null || die "openssl not found"
command -v curl >/dev/null || die "curl not found"

mkdir -p "$STATE/pki"
chmod 700 "$STATE"
exec 9>"$STATE/.start.lock"
flock 9

# shellcheck source=SCRIPTDIR/../lib/procs.sh
. "$HERE/../lib/procs.sh"

# ---- credentials (made once, kept in the state dir) --------------------------
PKI="$STATE/pki"
sign() { # NAME SUBJECT EXTENSIONS
  printf '%s\n' "$3" >"$PKI/$1.ext"
  openssl req -new -newkey rsa:2048 -nodes -sha256 -subj "$2" \
    -keyout "$PKI/$1.key" -out "$PKI/$1.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/$1.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -sha256 -extfile "$PKI/$1.ext" -out "$PKI/$1.crt" 2>/dev/null
  rm -f "$PKI/$1.csr" "$PKI/$1.ext"
}
if [[ ! -s "$PKI/ca.crt" || ! -s "$PKI/apiserver.crt" || ! -s "$PKI/admin.crt" ]]; then
  log "generating a CA, the serving certificate and the admin's client certificate"
  rm -f "$PKI"/*
  openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
    -subj "/CN=proxyfleet-current-ca" -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
  sign apiserver "/CN=apiextensions-apiserver" "$(printf '%s\n' \
    'basicConstraints=CA:FALSE' 'keyUsage=critical,digitalSignature,keyEncipherment' \
    'extendedKeyUsage=serverAuth' 'subjectAltName=IP:127.0.0.1,DNS:localhost')"
  # system:masters passes the server's authorizer without asking anyone.
  sign admin "/O=system:masters/CN=proxyfleet-admin" "$(printf '%s\n' \
    'basicConstraints=CA:FALSE' 'keyUsage=critical,digitalSignature,keyEncipherment' \
    'extendedKeyUsage=clientAuth')"
  chmod 600 "$PKI"/*.key
fi

kubeconfig() {
  cat >"$STATE/kubeconfig.tmp" <<KCEOF
apiVersion: v1
kind: Config
clusters:
- name: proxyfleet-current
  cluster:
    server: $API_URL
    certificate-authority: $PKI/ca.crt
users:
- name: proxyfleet-admin
  user:
    client-certificate: $PKI/admin.crt
    client-key: $PKI/admin.key
contexts:
- name: proxyfleet-admin@proxyfleet-current
  context:
    cluster: proxyfleet-current
    user: proxyfleet-admin
    namespace: default
current-context: proxyfleet-admin@proxyfleet-current
KCEOF
  chmod 600 "$STATE/kubeconfig.tmp"; mv -f "$STATE/kubeconfig.tmp" "$STATE/kubeconfig"
}
kubeconfig

api_get() {
  curl -fsS --max-time 5 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$API_URL$1"
}
# The informer-sync check waits for informers of core APIs this server does
# not serve; everything this tier uses is ready without it.
api_ready() { [[ "$(api_get '/readyz?exclude=informer-sync')" == ok ]]; }
etcd_healthy() { curl -fsS --max-time 3 "http://$HOST:$ETCD_PORT/health" | grep -q '"health":"true"'; }

write_env() {
  local version
  version="$(api_get /version | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p')"
  cat >"$STATE/kube.env.tmp" <<ENVEOF
KUBE_API_URL=$API_URL
KUBE_CA_FILE=$PKI/ca.crt
KUBECONFIG=$STATE/kubeconfig
KUBE_STATE_DIR=$STATE
KUBE_VERSION=$version
ENVEOF
  chmod 600 "$STATE/kube.env.tmp"; mv -f "$STATE/kube.env.tmp" "$STATE/kube.env"
}

if running_pid etcd "$ETCD" >/dev/null && running_pid apiextensions-apiserver "$SERVER" >/dev/null \
   && api_ready; then
  write_env
  log "already running and ready at $API_URL"
  echo "$STATE/kube.env"
  exit 0
fi

# ---- etcd ------------------------------------------------------------------------
if ! running_pid etcd "$ETCD" >/dev/null; then
  for p in "$ETCD_PORT" "$ETCD_PEER_PORT"; do
    port_in_use "$p" && die "port $HOST:$p is in use by another process (set PROXYFLEET_KUBE_CURRENT_ETCD_PORT / _ETCD_PEER_PORT)"
  done
  log "starting etcd $("$ETCD" --version | awk '/etcd Version/ {print $3}') on $HOST:$ETCD_PORT"
  start_proc etcd "$ETCD" \
    --name proxyfleet-current \
    --data-dir "$STATE/etcd" \
    --listen-client-urls "http://$HOST:$ETCD_PORT" \
    --advertise-client-urls "http://$HOST:$ETCD_PORT" \
    --listen-peer-urls "http://$HOST:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://$HOST:$ETCD_PEER_PORT" \
    --initial-cluster "proxyfleet-current=http://$HOST:$ETCD_PEER_PORT" \
    --initial-cluster-state new \
    --quota-backend-bytes 1073741824
fi
wait_for "etcd /health" 30 etcd "$ETCD" etcd_healthy

# ---- apiextensions-apiserver ----------------------------------------------------------
if ! running_pid apiextensions-apiserver "$SERVER" >/dev/null; then
  port_in_use "$API_PORT" && die "port $HOST:$API_PORT is in use by another process (set PROXYFLEET_KUBE_CURRENT_PORT)"
  log "starting apiextensions-apiserver on $API_URL"
  # The core API client (--kubeconfig) and delegated authentication and
  # authorization point at the server itself: there is no kube-apiserver to
  # ask. Client certificates from the CA
  # authenticate; system:masters is always authorized. The admission plugins
  # that read core APIs (namespaces, webhooks, admission policies) are off,
  # as is priority and fairness, whose configuration is a core API too.
  start_proc apiextensions-apiserver "$SERVER" \
    --etcd-servers "http://$HOST:$ETCD_PORT" \
    --bind-address "$HOST" \
    --secure-port "$API_PORT" \
    --cert-dir "$STATE/serving-certs" \
    --tls-cert-file "$PKI/apiserver.crt" \
    --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --kubeconfig "$STATE/kubeconfig" \
    --authentication-kubeconfig "$STATE/kubeconfig" \
    --authorization-kubeconfig "$STATE/kubeconfig" \
    --authentication-skip-lookup \
    --disable-admission-plugins NamespaceLifecycle,MutatingAdmissionWebhook,ValidatingAdmissionWebhook,ValidatingAdmissionPolicy,MutatingAdmissionPolicy \
    --enable-priority-and-fairness=false \
    --profiling=false \
    --v 1
fi
wait_for "apiextensions-apiserver /readyz" "$READY_TIMEOUT" apiextensions-apiserver "$SERVER" api_ready

write_env
log "ready: $API_URL ($(sed -n 's/^KUBE_VERSION=//p' "$STATE/kube.env")); env file:"
echo "$STATE/kube.env"
