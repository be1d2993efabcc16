#!/usr/bin/env bash
# Start a loopback-only Kubernetes control plane for integration tests:
# etcd + kube-apiserver + kube-controller-manager (no kubelet, no scheduler:
# pods are accepted and stay Pending). Everything binds to 127.0.0.1 (only the
# API server can be given another local address: PROXYFLEET_APISERVER_ADDRESS).
#
# Idempotent: if all three are running and the API server is ready it only
# prints the env file's path. Runs build.sh first (a no-op when the binaries
# are cached).
#
# Output: $STATE/kube.env (KUBE_API_URL, KUBE_ADMIN_TOKEN, KUBE_USER_TOKEN,
# KUBE_CA_FILE, KUBECONFIG, ...) and $STATE/kubeconfig; the env file's path is
# the last line printed on stdout.
#
# Environment (all optional):
#   PROXYFLEET_KUBE_CACHE    binaries' cache (default ~/.cache/proxyfleet/kube)
#   PROXYFLEET_KUBE_STATE    state dir (default $PROXYFLEET_KUBE_CACHE/state)
#   PROXYFLEET_ETCD_PORT     etcd client port    (default 23790)
#   PROXYFLEET_ETCD_PEER_PORT etcd peer port     (default 23800)
#   PROXYFLEET_APISERVER_PORT kube-apiserver     (default 16443)
#   PROXYFLEET_KCM_PORT      controller-manager's secure port (default 16457)
#   PROXYFLEET_SERVICE_CIDR  ClusterIP range (default 10.0.0.0/24)
#   PROXYFLEET_APISERVER_KUBELET_CLIENT=1  give the apiserver a client certificate
#                            for kubelets (logs, exec, port-forward) and make it
#                            call them on their InternalIP; ../node/start.sh sets it
#   PROXYFLEET_APISERVER_ADDRESS  one local IPv4 address for kube-apiserver to bind
#                            and advertise instead of 127.0.0.1 (never 0.0.0.0); the
#                            `kubernetes` Service then gets it as its endpoint, so
#                            pods reach the API server. ../node/start.sh sets the node IP
#   PROXYFLEET_APISERVER_EXTRA_SANS  comma-separated IP addresses added to the
#                            serving certificate (besides 127.0.0.1, the kubernetes
#                            DNS names and PROXYFLEET_APISERVER_ADDRESS)
#   PROXYFLEET_KUBE_NO_BUILD=1  fail instead of building missing binaries
#   PROXYFLEET_KUBE_READY_TIMEOUT  seconds to wait for readiness (default 120)
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${PROXYFLEET_KUBE_CACHE:-$HOME/.cache/proxyfleet/kube}"
BIN="$CACHE/bin"
STATE="${PROXYFLEET_KUBE_STATE:-$CACHE/state}"
ETCD_PORT="${PROXYFLEET_ETCD_PORT:-23790}"
ETCD_PEER_PORT="${PROXYFLEET_ETCD_PEER_PORT:-23800}"
API_PORT="${PROXYFLEET_APISERVER_PORT:-16443}"
KCM_PORT="${PROXYFLEET_KCM_PORT:-16457}"
READY_TIMEOUT="${PROXYFLEET_KUBE_READY_TIMEOUT:-120}"
SERVICE_CIDR="${PROXYFLEET_SERVICE_CIDR:-10.0.0.0/24}"
KUBELET_CLIENT="${PROXYFLEET_APISERVER_KUBELET_CLIENT:-0}"
HOST=127.0.0.1
# etcd and the controller-manager always stay on $HOST; only the API server
# may move to another local address.
API_HOST="${PROXYFLEET_APISERVER_ADDRESS:-$HOST}"
API_URL="https://$API_HOST:$API_PORT"

T0=$SECONDS
log() { printf '[kube-start %3ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
die() { printf '[kube-start %3ds] ERROR: %s\n' "$((SECONDS - T0))" "$*" >&2; exit 1; }

is_ipv4() {
  local IFS=. o
  [[ "$1" =~ ^[0-9]{1,3}(\.[0-9]{1,3}){3}$ ]] || return 1
  for o in $1; do ((10#$o <= 255)) || return 1; done
}
# Extra IP SANs of the serving certificate: the API server's own address when
# it is not loopback, then PROXYFLEET_APISERVER_EXTRA_SANS (e.g. the first IP of
# the service range, the `kubernetes` Service's ClusterIP that pods dial).
EXTRA_SANS=()
add_san() {
  local ip="$1" s
  is_ipv4 "$ip" || die "$ip: PROXYFLEET_APISERVER_EXTRA_SANS takes IPv4 addresses"
  [[ "$ip" == "$HOST" ]] && return 0
  for s in ${EXTRA_SANS[@]+"${EXTRA_SANS[@]}"}; do [[ "$s" == "$ip" ]] && return 0; done
  EXTRA_SANS+=("$ip")
}
if [[ "$API_HOST" != "$HOST" ]]; then
  is_ipv4 "$API_HOST" || die "PROXYFLEET_APISERVER_ADDRESS=$API_HOST: not an IPv4 address"
  case "$API_HOST" in
    0.*|127.*|255.255.255.255|22[4-9].*|23[0-9].*)
      die "PROXYFLEET_APISERVER_ADDRESS=$API_HOST: give one unicast address of this machine (127.0.0.1 is the default)" ;;
  esac
  # Bound to this one address: it must already be on an interface (for the
  # node, its bridge).
  ip -o -4 addr show 2>/dev/null | awk '{ sub(/\/.*/, "", $4); print $4 }' | grep -qxF "$API_HOST" \
    || die "PROXYFLEET_APISERVER_ADDRESS=$API_HOST is not an address of any interface here"
  add_san "$API_HOST"
  # Go never proxies loopback, but would send this address to an HTTP(S)_PROXY
  # from the environment: keep the controller-manager's and curl's calls direct.
  export NO_PROXY="${NO_PROXY:+$NO_PROXY,}$API_HOST" no_proxy="${no_proxy:+$no_proxy,}$API_HOST"
fi
IFS=', ' read -r -a extra_sans_arg <<<"${PROXYFLEET_APISERVER_EXTRA_SANS:-}"
for ip in ${extra_sans_arg[@]+"${extra_sans_arg[@]}"}; do add_san "$ip"; done

# ---- binaries -----------------------------------------------------------------
if [[ "${PROXYFLEET_KUBE_NO_BUILD:-0}" == 1 ]]; then
  [[ -x "$BIN/kube-apiserver" && -x "$BIN/kube-controller-manager" ]] \
    || die "no binaries in $BIN; run $HERE/build.sh"
else
  PROXYFLEET_KUBE_CACHE="$CACHE" "$HERE/build.sh"
fi
ETCD="$(command -v etcd || true)"
[[ -n "$ETCD" ]] || die "etcd not found (apt-get install etcd-server, or run build.sh)"
command -v openssl >/dev/null || die "openssl not found"
command -v curl >/dev/null || die "curl not found"

mkdir -p "$STATE" "$STATE/pki"
chmod 700 "$STATE"
exec 9>"$STATE/.start.lock"
flock 9

# ---- helpers: running_pid, port_in_use, start_proc and wait_for ----------------
# shellcheck source=SCRIPTDIR/../lib/procs.sh
. "$HERE/../lib/procs.sh"

# ---- credentials (made once, kept in the state dir) ----------------------------------
PKI="$STATE/pki"
serving_cert() {
  local sans="IP:127.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" ip
  for ip in ${EXTRA_SANS[@]+"${EXTRA_SANS[@]}"}; do sans+=",IP:$ip"; done
  cat >"$PKI/apiserver.ext" <<EOF
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=$sans
EOF
  openssl req -new -newkey rsa:2048 -nodes -sha256 -subj "/CN=kube-apiserver" \
    -keyout "$PKI/apiserver.key" -out "$PKI/apiserver.csr" 2>/dev/null
  openssl x509 -req -in "$PKI/apiserver.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
    -CAcreateserial -days 3650 -sha256 -extfile "$PKI/apiserver.ext" -out "$PKI/apiserver.crt" 2>/dev/null
  rm -f "$PKI/apiserver.csr"
}
# Whether the serving certificate names every extra SAN (a state dir made
# without them gets a new one from the same CA).
serving_cert_has_sans() {
  local ip
  for ip in ${EXTRA_SANS[@]+"${EXTRA_SANS[@]}"}; do
    openssl x509 -in "$PKI/apiserver.crt" -noout -checkip "$ip" 2>/dev/null | grep -q 'does match' || return 1
  done
}
if [[ ! -s "$PKI/ca.crt" || ! -s "$PKI/apiserver.crt" ]]; then
  log "generating CA and serving certificate (openssl)"
  rm -f "$PKI"/ca.* "$PKI"/apiserver.*
  openssl req -x509 -newkey rsa:2048 -nodes -sha256 -days 3650 \
    -subj "/CN=proxyfleet-dev-ca" -keyout "$PKI/ca.key" -out "$PKI/ca.crt" 2>/dev/null
  serving_cert
elif ! serving_cert_has_sans; then
  log "serving certificate lacks one of ${EXTRA_SANS[*]}: making a new one from the same CA"
  rm -f "$PKI"/apiserver.*
  serving_cert
fi
if [[ ! -s "$PKI/sa.key" || ! -s "$PKI/sa.pub" ]]; then
  log "generating service-account signing key"
  openssl genrsa -out "$PKI/sa.key" 2048 2>/dev/null
  openssl rsa -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
fi
if [[ ! -s "$PKI/tokens.csv" ]]; then
  log "generating static tokens (admin in system:masters, user without rights)"
  # token,user,uid,"groups"
  {
    printf '%s,proxyfleet-admin,proxyfleet-admin,"system:masters"\n' "$(openssl rand -hex 24)"
    printf '%s,proxyfleet-user,proxyfleet-user\n' "$(openssl rand -hex 24)"
    printf '%s,system:kube-controller-manager,system:kube-controller-manager,"system:masters"\n' "$(openssl rand -hex 24)"
  } >"$PKI/tokens.csv"
fi
# Only when a kubelet will run: the apiserver authenticates to it with this
# (user kube-apiserver-kubelet-client in system:masters, which the kubelet's
# webhook authorizer allows). Remade whenever it no longer matches the CA.
APISERVER_KUBELET_ARGS=()
if [[ "$KUBELET_CLIENT" == 1 ]]; then
  if ! openssl verify -CAfile "$PKI/ca.crt" "$PKI/kubelet-client.crt" >/dev/null 2>&1 \
     || [[ ! -s "$PKI/kubelet-client.key" ]]; then
    log "generating the apiserver's kubelet client certificate"
    printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' \
      >"$PKI/kubelet-client.ext"
    openssl req -new -newkey rsa:2048 -nodes -sha256 \
      -subj "/O=system:masters/CN=kube-apiserver-kubelet-client" \
      -keyout "$PKI/kubelet-client.key" -out "$PKI/kubelet-client.csr" 2>/dev/null
    openssl x509 -req -in "$PKI/kubelet-client.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" \
      -CAcreateserial -days 3650 -sha256 -extfile "$PKI/kubelet-client.ext" \
      -out "$PKI/kubelet-client.crt" 2>/dev/null
    rm -f "$PKI/kubelet-client.csr"
  fi
  APISERVER_KUBELET_ARGS=(
    --kubelet-client-certificate "$PKI/kubelet-client.crt"
    --kubelet-client-key "$PKI/kubelet-client.key"
    --kubelet-preferred-address-types InternalIP
  )
fi
chmod 600 "$PKI"/*.key "$PKI/tokens.csv"
token_of() { awk -F, -v u="$1" '$2 == u { print $1 }' "$PKI/tokens.csv"; }
ADMIN_TOKEN="$(token_of proxyfleet-admin)"
USER_TOKEN="$(token_of proxyfleet-user)"
KCM_TOKEN="$(token_of system:kube-controller-manager)"
[[ -n "$ADMIN_TOKEN" && -n "$USER_TOKEN" && -n "$KCM_TOKEN" ]] || die "bad $PKI/tokens.csv (delete it to regenerate)"

write_kubeconfig() { # FILE USER TOKEN
  cat >"$1.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: proxyfleet-dev
  cluster:
    server: $API_URL
    certificate-authority: $PKI/ca.crt
users:
- name: $2
  user:
    token: $3
contexts:
- name: $2@proxyfleet-dev
  context:
    cluster: proxyfleet-dev
    user: $2
    namespace: default
current-context: $2@proxyfleet-dev
EOF
  chmod 600 "$1.tmp"; mv -f "$1.tmp" "$1"
}
write_kubeconfig "$STATE/kcm.kubeconfig" system:kube-controller-manager "$KCM_TOKEN"
write_kubeconfigs() {
  write_kubeconfig "$STATE/kubeconfig" proxyfleet-admin "$ADMIN_TOKEN"
  write_kubeconfig "$STATE/kubeconfig-user" proxyfleet-user "$USER_TOKEN"
}

api_get() { # PATH -> body, fails on HTTP errors
  curl -fsS --max-time 5 --cacert "$PKI/ca.crt" -H "Authorization: Bearer $ADMIN_TOKEN" "$API_URL$1"
}
api_ready() { [[ "$(api_get /readyz)" == ok ]]; }
etcd_healthy() { curl -fsS --max-time 3 "http://$HOST:$ETCD_PORT/health" | grep -q '"health":"true"'; }
# The ServiceAccount admission plugin (1.20) rejects pods until the namespace's
# "default" ServiceAccount has its token secret, which the controller-manager makes.
default_sa_ready() { api_get /api/v1/namespaces/default/serviceaccounts/default | grep -q '"secrets"'; }

write_env() {
  cat >"$STATE/kube.env.tmp" <<EOF
KUBE_API_URL=$API_URL
KUBE_ADMIN_TOKEN=$ADMIN_TOKEN
KUBE_USER_TOKEN=$USER_TOKEN
KUBE_USER_NAME=proxyfleet-user
KUBE_CA_FILE=$PKI/ca.crt
KUBECONFIG=$STATE/kubeconfig
KUBECONFIG_USER=$STATE/kubeconfig-user
KUBE_STATE_DIR=$STATE
KUBE_VERSION=$("$BIN/kube-apiserver" --version | awk '{print $2}')
EOF
  chmod 600 "$STATE/kube.env.tmp"; mv -f "$STATE/kube.env.tmp" "$STATE/kube.env"
}

# ---- already running? ----------------------------------------------------------------
if running_pid etcd "$ETCD" >/dev/null && running_pid kube-apiserver "$BIN/kube-apiserver" >/dev/null \
   && running_pid kube-controller-manager "$BIN/kube-controller-manager" >/dev/null && api_ready; then
  write_kubeconfigs
  write_env
  log "already running and ready at $API_URL"
  echo "$STATE/kube.env"
  exit 0
fi

# ---- etcd ---------------------------------------------------------------------------------
if running_pid etcd "$ETCD" >/dev/null; then
  log "etcd already running (pid $(running_pid etcd "$ETCD"))"
else
  for p in "$ETCD_PORT" "$ETCD_PEER_PORT"; do
    port_in_use "$p" && die "port $HOST:$p is in use by another process (set PROXYFLEET_ETCD_PORT / PROXYFLEET_ETCD_PEER_PORT)"
  done
  log "starting etcd on $HOST:$ETCD_PORT (data: $STATE/etcd)"
  start_proc etcd "$ETCD" \
    --name proxyfleet-dev \
    --data-dir "$STATE/etcd" \
    --listen-client-urls "http://$HOST:$ETCD_PORT" \
    --advertise-client-urls "http://$HOST:$ETCD_PORT" \
    --listen-peer-urls "http://$HOST:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://$HOST:$ETCD_PEER_PORT" \
    --initial-cluster "proxyfleet-dev=http://$HOST:$ETCD_PEER_PORT" \
    --initial-cluster-state new \
    --quota-backend-bytes 2147483648 \
    --snapshot-count 10000
fi
wait_for "etcd /health" 30 etcd "$ETCD" etcd_healthy
log "etcd healthy"

# ---- kube-apiserver -------------------------------------------------------------------------
# The `kubernetes` Service's endpoint is the advertised address. 127.0.0.1
# cannot be an endpoint (and means nothing to a pod), so on loopback no
# reconciler runs and the Service has no endpoints; on another address the
# lease reconciler keeps the endpoint (address, secure port) current.
ENDPOINT_RECONCILER=none
[[ "$API_HOST" != "$HOST" ]] && ENDPOINT_RECONCILER=lease
if running_pid kube-apiserver "$BIN/kube-apiserver" >/dev/null; then
  log "kube-apiserver already running (pid $(running_pid kube-apiserver "$BIN/kube-apiserver"))"
else
  port_in_use "$API_PORT" "$API_HOST" && die "port $API_HOST:$API_PORT is in use by another process (set PROXYFLEET_APISERVER_PORT)"
  log "starting kube-apiserver on $API_URL"
  start_proc kube-apiserver "$BIN/kube-apiserver" \
    --etcd-servers "http://$HOST:$ETCD_PORT" \
    --bind-address "$API_HOST" \
    --advertise-address "$API_HOST" \
    --secure-port "$API_PORT" \
    --endpoint-reconciler-type "$ENDPOINT_RECONCILER" \
    --cert-dir "$STATE/apiserver-certs" \
    --tls-cert-file "$PKI/apiserver.crt" \
    --tls-private-key-file "$PKI/apiserver.key" \
    --client-ca-file "$PKI/ca.crt" \
    --token-auth-file "$PKI/tokens.csv" \
    --authorization-mode Node,RBAC \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" \
    --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --allow-privileged=true \
    --profiling=false \
    ${APISERVER_KUBELET_ARGS[@]+"${APISERVER_KUBELET_ARGS[@]}"} \
    --v 1
fi
wait_for "kube-apiserver /readyz" "$READY_TIMEOUT" kube-apiserver "$BIN/kube-apiserver" api_ready
log "kube-apiserver ready"

# ---- kube-controller-manager -------------------------------------------------------------------
if running_pid kube-controller-manager "$BIN/kube-controller-manager" >/dev/null; then
  log "kube-controller-manager already running"
else
  port_in_use "$KCM_PORT" && die "port $HOST:$KCM_PORT is in use by another process (set PROXYFLEET_KCM_PORT)"
  log "starting kube-controller-manager (secure port $HOST:$KCM_PORT)"
  start_proc kube-controller-manager "$BIN/kube-controller-manager" \
    --kubeconfig "$STATE/kcm.kubeconfig" \
    --authentication-kubeconfig "$STATE/kcm.kubeconfig" \
    --authorization-kubeconfig "$STATE/kcm.kubeconfig" \
    --bind-address "$HOST" \
    --secure-port "$KCM_PORT" \
    --address "$HOST" \
    --port 0 \
    --cert-dir "$STATE/kcm-certs" \
    --leader-elect=false \
    --controllers '*' \
    --service-account-private-key-file "$PKI/sa.key" \
    --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" \
    --cluster-signing-key-file "$PKI/ca.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" \
    --profiling=false \
    --v 1
fi
# /healthz is always allowed without credentials; its cert is self-signed (loopback only).
kcm_healthy() { [[ "$(curl -ksS --max-time 3 "https://$HOST:$KCM_PORT/healthz")" == ok ]]; }
wait_for "kube-controller-manager /healthz" 60 kube-controller-manager "$BIN/kube-controller-manager" kcm_healthy
wait_for "the default ServiceAccount's token (controller-manager)" 60 \
  kube-controller-manager "$BIN/kube-controller-manager" default_sa_ready
log "kube-controller-manager running"

write_kubeconfigs
write_env
log "ready: $API_URL ($(sed -n 's/^KUBE_VERSION=//p' "$STATE/kube.env")); env file:"
echo "$STATE/kube.env"
