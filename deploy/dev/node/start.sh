#!/usr/bin/env bash
# Start a one-node Kubernetes 1.20 cluster on this machine: the control plane
# of ../kube-apiserver (etcd and kube-controller-manager on 127.0.0.1,
# kube-apiserver on the node IP so that pods reach it through the `kubernetes`
# Service) plus kube-scheduler, and a node made of containerd + runc (CRI),
# the kubelet and kube-proxy (iptables mode). Pods get addresses on a bridge
# that this script creates; nothing listens on or routes to other interfaces.
#
# Waits until the node is Ready. The last line on stdout is the path of the
# env file (kube.env's variables plus the node's: KUBE_NODE_IP, KUBE_NODE_BRIDGE,
# KUBE_POD_CIDR, KUBE_SERVICE_CIDR, CONTAINERD_ADDRESS, ...). Idempotent: when
# everything runs and the node is Ready it only prints that path.
#
# Needs root. One node per machine. stop.sh undoes every change to the host.
#
# Environment (all optional; see README.md):
#   PROXYFLEET_KUBE_CACHE        binaries (default ~/.cache/proxyfleet/kube)
#   PROXYFLEET_NODE_STATE        state dir (default $PROXYFLEET_KUBE_CACHE/node)
#   PROXYFLEET_NODE_ETCD_PORT, PROXYFLEET_NODE_ETCD_PEER_PORT  etcd on 127.0.0.1 (26790, 26800)
#   PROXYFLEET_NODE_APISERVER_PORT  kube-apiserver on the node IP (26443)
#   PROXYFLEET_NODE_KCM_PORT     kube-controller-manager's secure port on 127.0.0.1 (26457)
#   PROXYFLEET_SCHEDULER_PORT    kube-scheduler's secure port on 127.0.0.1 (26459)
#   PROXYFLEET_KUBELET_PORT      kubelet API on the node IP (10250)
#   PROXYFLEET_KUBELET_HEALTHZ_PORT, PROXYFLEET_KUBE_PROXY_HEALTHZ_PORT,
#   PROXYFLEET_KUBE_PROXY_METRICS_PORT  on 127.0.0.1 (10248, 10256, 10249)
#   PROXYFLEET_NODE_NAME         node name (proxyfleet-node)
#   PROXYFLEET_NODE_BRIDGE       bridge to create (pfnode0)
#   PROXYFLEET_NODE_CIDR         the bridge's /24; the node IP is .1 (10.213.70.0/24)
#   PROXYFLEET_POD_CIDR          pods' /24 on the same bridge (10.213.71.0/24)
#   PROXYFLEET_SERVICE_CIDR      ClusterIPs (10.213.72.0/24)
#   PROXYFLEET_NODE_READY_TIMEOUT  seconds to wait for Ready (120)
#   PROXYFLEET_KUBE_NO_BUILD=1   fail instead of building missing binaries
set -euo pipefail
LOG_TAG=node-start
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
READY_TIMEOUT="${PROXYFLEET_NODE_READY_TIMEOUT:-120}"
on_exit() {
  local rc=$?
  ((rc == 0)) || log "start failed (exit $rc); $NODE_DIR/stop.sh undoes whatever it changed"
}
trap on_exit EXIT

[[ "$(id -u)" == 0 ]] || die "needs root (containerd, kubelet, iptables, a bridge)"

# ---- binaries and packages --------------------------------------------------------
if [[ "${PROXYFLEET_KUBE_NO_BUILD:-0}" == 1 ]]; then
  for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy pause; do
    [[ -x "$BIN/$b" ]] || die "no $BIN/$b; run $APISERVER_DIR/build.sh"
  done
else
  PROXYFLEET_KUBE_CACHE="$CACHE" "$APISERVER_DIR/build.sh"
fi
missing=()
for p in "${NODE_APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null || die "apt-get update failed"
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install failed for: ${missing[*]}"
fi
for c in containerd containerd-shim-runc-v2 runc ctr iptables iptables-save iptables-restore \
         ip6tables-save ip6tables-restore nft conntrack ip; do
  command -v "$c" >/dev/null || die "$c not found"
done
[[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local && -x /usr/lib/cni/loopback ]] \
  || die "CNI plugins missing in /usr/lib/cni (containernetworking-plugins)"
CONTAINERD="$(command -v containerd)"
PAUSE_TAG="$(sed -n 's/^pause_tag=//p' "$BIN/.build-stamp" 2>/dev/null)"
PAUSE_IMAGE="localhost/proxyfleet/pause:${PAUSE_TAG:-unknown}"

# ---- one node per machine ---------------------------------------------------------------
if [[ -f "$RUN/owner" && "$(cat "$RUN/owner")" != "$STATE" ]]; then
  die "this machine's node belongs to $(cat "$RUN/owner"); stop it first: PROXYFLEET_NODE_STATE=$(cat "$RUN/owner") $NODE_DIR/stop.sh"
fi

mkdir -p "$STATE"
chmod 700 "$STATE"
exec 9>"$STATE/.lock"
flock 9

# ---- record the host as it is, once (stop.sh puts it back) ----------------------------------
mkdir -p "$RUN"
chmod 700 "$RUN"
if [[ ! -f "$RUN/owner" ]]; then
  for h in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods; do
    [[ -e "$h" ]] && die "$h exists: another kubelet uses this machine"
  done
  ip link show "$BRIDGE" >/dev/null 2>&1 && die "interface $BRIDGE already exists (set PROXYFLEET_NODE_BRIDGE)"
  if iptables-save 2>/dev/null | grep -q '^:KUBE-'; then
    die "iptables already has KUBE-* chains: another kube-proxy or kubelet uses this machine"
  fi
  log "recording host state in $RUN/host-before (sysctls, directories, nft tables)"
  mkdir -p "$RUN/host-before"
  : >"$RUN/host-before/sysctl.tmp"
  keys=("${NODE_SYSCTLS[@]}")
  while read -r k; do keys+=("$k"); done < <(sysctl -N -a 2>/dev/null \
    | grep -E '^net\.ipv(4|6)\.conf\.[^.]+\.forwarding$' || true)
  for k in "${keys[@]}"; do
    v="$(sysctl -n "$k" 2>/dev/null)" && printf '%s=%s\n' "$k" "$v" >>"$RUN/host-before/sysctl.tmp"
  done
  mv "$RUN/host-before/sysctl.tmp" "$RUN/host-before/sysctl"
  for d in "${NODE_HOST_DIRS[@]}"; do
    [[ -e "$d" ]] || echo "$d"
  done >"$RUN/host-before/absent-dirs"
  nft list tables >"$RUN/host-before/nft-tables" 2>/dev/null || true
  echo "$STATE" >"$RUN/owner"
fi

all_running() {
  running_pid containerd "$CONTAINERD" >/dev/null && running_pid kubelet "$BIN/kubelet" >/dev/null \
    && running_pid kube-proxy "$BIN/kube-proxy" >/dev/null \
    && running_pid kube-scheduler "$BIN/kube-scheduler" >/dev/null \
    && running_pid etcd "$(command -v etcd)" "$CP_STATE" >/dev/null \
    && running_pid kube-apiserver "$BIN/kube-apiserver" "$CP_STATE" >/dev/null \
    && running_pid kube-controller-manager "$BIN/kube-controller-manager" "$CP_STATE" >/dev/null
}
node_ready() {
  [[ "$(kubectl --kubeconfig "$CP_STATE/kubeconfig" --request-timeout 10s get node "$NODE_NAME" \
    -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}
if [[ -f "$STATE/node.env" && -f "$RUN/owner" ]] && all_running && node_ready; then
  log "already running; node $NODE_NAME is Ready"
  echo "$STATE/node.env"
  exit 0
fi

# ---- bridge ------------------------------------------------------------------------------------------
# It carries the node IP (the kubelet refuses a loopback one, and the API
# server binds it, so the bridge comes before the control plane) and the pods'
# gateway; the CNI bridge plugin only attaches pods (it would allow just one
# IPv4 address on the bridge, so it does not manage addresses here). The route
# for the service range keeps ClusterIP traffic on the bridge even where no
# rule matches, so it never follows the default route.
if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
  log "creating bridge $BRIDGE ($NODE_IP/24, pods $POD_CIDR, services $SERVICE_CIDR)"
  ip link add "$BRIDGE" type bridge
  # Link-local IPv6 would make the bridge send router solicitations and MLD
  # reports; nothing here needs IPv6.
  sysctl -qw "net.ipv6.conf.$BRIDGE.disable_ipv6=1" 2>/dev/null || true
fi
ip addr replace "$NODE_IP/24" dev "$BRIDGE"
ip addr replace "$POD_GATEWAY/24" dev "$BRIDGE"
ip link set "$BRIDGE" up
ip route replace "$SERVICE_CIDR" dev "$BRIDGE" src "$NODE_IP"

# ---- control plane (../kube-apiserver/start.sh, in the node's own state dir) ----------------
# Its own idempotency makes this cheap when it already runs. The API server
# binds and advertises the node IP, so the `kubernetes` Service's endpoint is
# $NODE_IP:$NODE_APISERVER_PORT and pods reach it at $API_SERVICE_IP:443; its
# certificate names both (and still 127.0.0.1 and kubernetes.default.svc...).
CP_ENV="$(PROXYFLEET_KUBE_CACHE="$CACHE" PROXYFLEET_KUBE_STATE="$CP_STATE" \
  PROXYFLEET_ETCD_PORT="$NODE_ETCD_PORT" PROXYFLEET_ETCD_PEER_PORT="$NODE_ETCD_PEER_PORT" \
  PROXYFLEET_APISERVER_PORT="$NODE_APISERVER_PORT" PROXYFLEET_KCM_PORT="$NODE_KCM_PORT" \
  PROXYFLEET_APISERVER_ADDRESS="$NODE_IP" PROXYFLEET_APISERVER_EXTRA_SANS="$API_SERVICE_IP" \
  PROXYFLEET_SERVICE_CIDR="$SERVICE_CIDR" PROXYFLEET_APISERVER_KUBELET_CLIENT=1 \
  PROXYFLEET_KUBE_NO_BUILD=1 "$APISERVER_DIR/start.sh" | tail -n 1)"
[[ -f "$CP_ENV" ]] || die "control plane start gave no env file"
API_URL="$(sed -n 's/^KUBE_API_URL=//p' "$CP_ENV")"
PKI="$CP_STATE/pki"
write_env() {
  {
    cat "$CP_ENV"
    cat <<EOF
KUBE_NODE_NAME=$NODE_NAME
KUBE_NODE_IP=$NODE_IP
KUBE_NODE_BRIDGE=$BRIDGE
KUBE_NODE_CIDR=$NODE_CIDR
KUBE_POD_CIDR=$POD_CIDR
KUBE_SERVICE_CIDR=$SERVICE_CIDR
KUBE_API_SERVICE_IP=$API_SERVICE_IP
KUBE_API_SERVICE_URL=https://$API_SERVICE_IP
KUBE_PAUSE_IMAGE=$PAUSE_IMAGE
KUBE_NODE_STATE_DIR=$STATE
CONTAINERD_ADDRESS=$CONTAINERD_SOCK
CONTAINERD_NAMESPACE=k8s.io
EOF
  } >"$STATE/node.env.tmp"
  chmod 600 "$STATE/node.env.tmp"; mv -f "$STATE/node.env.tmp" "$STATE/node.env"
}

# ---- process helpers (start_proc, wait_for: ../lib/procs.sh, through lib.sh) ---------------
port_free() { ! (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; }
http_ok() { [[ "$(curl -fsS --max-time 3 "$1" 2>/dev/null)" == ok ]]; }

# ---- node credentials (client certificates from the control plane's CA) ---------------------
NPKI="$STATE/pki"
mkdir -p "$NPKI"
client_cert() { # NAME CN [O]
  local name="$1" cn="$2" o="${3:-}" subj
  if openssl verify -CAfile "$PKI/ca.crt" "$NPKI/$name.crt" >/dev/null 2>&1 && [[ -s "$NPKI/$name.key" ]]; then
    return 0
  fi
  subj="/CN=$cn"; [[ -n "$o" ]] && subj="/O=$o$subj"
  log "client certificate $name ($subj)"
  printf 'basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n' >"$NPKI/client.ext"
  openssl req -new -newkey rsa:2048 -nodes -sha256 -subj "$subj" \
    -keyout "$NPKI/$name.key" -out "$NPKI/$name.csr" 2>/dev/null
  openssl x509 -req -in "$NPKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -sha256 -extfile "$NPKI/client.ext" -out "$NPKI/$name.crt" 2>/dev/null
  rm -f "$NPKI/$name.csr"
  chmod 600 "$NPKI/$name.key"
}
# The built-in RBAC bindings cover these names: the Node authorizer and
# system:nodes, system:node-proxier, system:kube-scheduler.
client_cert kubelet "system:node:$NODE_NAME" system:nodes
client_cert kube-proxy system:kube-proxy
client_cert kube-scheduler system:kube-scheduler
kubeconfig_for "$API_URL" "$STATE/kubelet.kubeconfig" "system:node:$NODE_NAME" "$NPKI/kubelet.crt" "$NPKI/kubelet.key"
kubeconfig_for "$API_URL" "$STATE/kube-proxy.kubeconfig" system:kube-proxy "$NPKI/kube-proxy.crt" "$NPKI/kube-proxy.key"
kubeconfig_for "$API_URL" "$STATE/kube-scheduler.kubeconfig" system:kube-scheduler "$NPKI/kube-scheduler.crt" "$NPKI/kube-scheduler.key"

# ---- kube-scheduler ------------------------------------------------------------------------------
if ! running_pid kube-scheduler "$BIN/kube-scheduler" >/dev/null; then
  port_free 127.0.0.1 "$SCHEDULER_PORT" || die "port 127.0.0.1:$SCHEDULER_PORT is in use (set PROXYFLEET_SCHEDULER_PORT)"
  log "starting kube-scheduler (secure port 127.0.0.1:$SCHEDULER_PORT)"
  start_proc kube-scheduler "$BIN/kube-scheduler" \
    --kubeconfig "$STATE/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig "$STATE/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig "$STATE/kube-scheduler.kubeconfig" \
    --bind-address 127.0.0.1 \
    --secure-port "$SCHEDULER_PORT" \
    --port 0 \
    --cert-dir "$STATE/kube-scheduler-certs" \
    --leader-elect=false \
    --profiling=false \
    --v 1
fi

# ---- sysctls and the forwarding guard -------------------------------------------------------------
# Pod -> ClusterIP -> pod: the host routes it (DNAT, then back onto the bridge),
# and the bridged replies must pass conntrack (kube-proxy warns without it).
sysctl -qw net.ipv4.ip_forward=1
sysctl -qw net.bridge.bridge-nf-call-iptables=1
# This chain confines forwarding that touches the bridge to the bridge itself,
# so pods can reach the host, each other and services, and nothing else;
# mangle runs before kube-proxy's filter rules can accept anything.
iptables -t mangle -N "$ISOLATE_CHAIN" 2>/dev/null || true
iptables -t mangle -F "$ISOLATE_CHAIN"
iptables -t mangle -A "$ISOLATE_CHAIN" -i "$BRIDGE" ! -o "$BRIDGE" -m comment --comment "proxyfleet node: pods only reach the bridge" -j DROP
iptables -t mangle -A "$ISOLATE_CHAIN" ! -i "$BRIDGE" -o "$BRIDGE" -m comment --comment "proxyfleet node: nothing forwarded onto the bridge" -j DROP
iptables -t mangle -C FORWARD -j "$ISOLATE_CHAIN" 2>/dev/null || iptables -t mangle -I FORWARD 1 -j "$ISOLATE_CHAIN"

# ---- CNI config ----------------------------------------------------------------------------------------
# Pods get routes to the node and service ranges only: no default route, so a
# pod cannot even try to reach an address outside this machine's bridge.
mkdir -p "$STATE/cni/net.d" "$STATE/cni/ipam"
cat >"$STATE/cni/net.d/10-proxyfleet.conflist.tmp" <<EOF
{
  "cniVersion": "0.4.0",
  "name": "proxyfleet",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$BRIDGE",
      "isGateway": false,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{ "subnet": "$POD_CIDR", "gateway": "$POD_GATEWAY" }]],
        "routes": [{ "dst": "$NODE_CIDR" }, { "dst": "$SERVICE_CIDR" }],
        "dataDir": "$STATE/cni/ipam"
      }
    }
  ]
}
EOF
mv -f "$STATE/cni/net.d/10-proxyfleet.conflist.tmp" "$STATE/cni/net.d/10-proxyfleet.conflist"

# ---- containerd --------------------------------------------------------------------------------------
# Root (images, snapshots) persists in the state dir; runtime state is in $RUN.
# restrict_oom_score_adj: root here lacks CAP_SYS_RESOURCE, and without it runc
# fails every sandbox ("can't get final child's PID from pipe: EOF") when it
# lowers oom_score_adj.
mkdir -p "$CONTAINERD_ROOT" "$CONTAINERD_STATE"
cat >"$STATE/containerd.toml" <<EOF
version = 2
root = "$CONTAINERD_ROOT/root"
state = "$CONTAINERD_STATE"
disabled_plugins = [
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = "$CONTAINERD_SOCK"

[ttrpc]
  address = "$CONTAINERD_STATE/containerd.sock.ttrpc"

[plugins]
  [plugins."io.containerd.internal.v1.opt"]
    path = "$CONTAINERD_ROOT/opt"
  [plugins."io.containerd.grpc.v1.cri"]
    sandbox_image = "$PAUSE_IMAGE"
    restrict_oom_score_adj = true
    stream_server_address = "127.0.0.1"
    stream_server_port = "0"
    enable_selinux = false
    [plugins."io.containerd.grpc.v1.cri".containerd]
      snapshotter = "overlayfs"
      default_runtime_name = "runc"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
        runtime_type = "io.containerd.runc.v2"
        [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
          SystemdCgroup = false
          Root = "$CONTAINERD_STATE/runc"
    [plugins."io.containerd.grpc.v1.cri".cni]
      bin_dir = "/usr/lib/cni"
      conf_dir = "$STATE/cni/net.d"
      max_conf_num = 1
EOF
containerd_up() { ctr --address "$CONTAINERD_SOCK" version; }
if ! running_pid containerd "$CONTAINERD" >/dev/null; then
  [[ -S "$CONTAINERD_SOCK" ]] && rm -f "$CONTAINERD_SOCK"
  log "starting containerd ($CONTAINERD_SOCK)"
  start_proc containerd "$CONTAINERD" --config "$STATE/containerd.toml" --log-level warn
fi
wait_for "containerd's socket" 30 containerd "$CONTAINERD" containerd_up

# ---- images: the sandbox image, built here since nothing can be pulled ----------------------------
ctr_k8s() { ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }
PAUSE_TAR="$CACHE/images/pause-$PAUSE_TAG.tar"
mkdir -p "$CACHE/images"
if [[ ! -s "$PAUSE_TAR" || ! -s "$PAUSE_TAR.digest" || "$PAUSE_TAR" -ot "$BIN/pause" ]]; then
  log "building $PAUSE_IMAGE from $BIN/pause"
  rootfs="$(mktemp -d)"
  install -m 0755 "$BIN/pause" "$rootfs/pause"
  "$NODE_DIR/oci-image.sh" "$rootfs" "$PAUSE_IMAGE" "$PAUSE_TAR.tmp" '["/pause"]' >"$PAUSE_TAR.digest"
  rm -rf "$rootfs"
  mv -f "$PAUSE_TAR.tmp" "$PAUSE_TAR"
fi
# Imported again whenever the archive's manifest differs from the image's.
want="$(cat "$PAUSE_TAR.digest")"
have="$(ctr_k8s images ls | awk -v r="$PAUSE_IMAGE" '$1 == r { print $3 }')"
if [[ "$have" != "$want" ]]; then
  log "importing $PAUSE_IMAGE ($want)"
  ctr_k8s images import "$PAUSE_TAR" >/dev/null
  have="$(ctr_k8s images ls | awk -v r="$PAUSE_IMAGE" '$1 == r { print $3 }')"
  [[ "$have" == "$want" ]] || die "importing $PAUSE_TAR gave $PAUSE_IMAGE digest '$have', not $want"
fi

# ---- kubelet -----------------------------------------------------------------------------------------
# Pods get no nameserver: the host's would be outside this machine.
printf '# no nameserver: pods of the proxyfleet dev node resolve nothing\n' >"$STATE/resolv.conf"
mkdir -p "$KUBELET_ROOT" "$STATE/kubelet-pki" "$STATE/volume-plugins"
cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $NODE_IP
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: true
  x509:
    clientCAFile: $PKI/ca.crt
authorization:
  mode: Webhook
cgroupDriver: cgroupfs
failSwapOn: false
resolvConf: $STATE/resolv.conf
clusterDomain: cluster.local
oomScoreAdj: 0
# Imported images cannot be pulled again: never garbage-collect them.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  nodefs.inodesFree: 1%
  imagefs.available: 1%
serializeImagePulls: false
# Status is computed this often and sent only when it changes (node leases
# carry the heartbeat): a new node turns Ready within 2 s instead of 10 s.
nodeStatusUpdateFrequency: 2s
rotateCertificates: false
serverTLSBootstrap: false
EOF
if ! running_pid kubelet "$BIN/kubelet" >/dev/null; then
  port_free "$NODE_IP" "$KUBELET_PORT" || die "port $NODE_IP:$KUBELET_PORT is in use (set PROXYFLEET_KUBELET_PORT)"
  port_free 127.0.0.1 "$KUBELET_HEALTHZ_PORT" || die "port 127.0.0.1:$KUBELET_HEALTHZ_PORT is in use (set PROXYFLEET_KUBELET_HEALTHZ_PORT)"
  log "starting kubelet (node $NODE_NAME, $NODE_IP:$KUBELET_PORT)"
  # The kubelet's AWS SDK (cAdvisor's cloud detection) must never ask the EC2
  # metadata service; build.sh already drops the ECR credential provider.
  AWS_EC2_METADATA_DISABLED=true start_proc kubelet "$BIN/kubelet" \
    --config "$STATE/kubelet.yaml" \
    --kubeconfig "$STATE/kubelet.kubeconfig" \
    --container-runtime remote \
    --container-runtime-endpoint "unix://$CONTAINERD_SOCK" \
    --root-dir "$KUBELET_ROOT" \
    --cert-dir "$STATE/kubelet-pki" \
    --volume-plugin-dir "$STATE/volume-plugins" \
    --hostname-override "$NODE_NAME" \
    --node-ip "$NODE_IP" \
    --pod-infra-container-image "$PAUSE_IMAGE" \
    --v 1
fi

# ---- kube-proxy ---------------------------------------------------------------------------------------
# conntrack 0s: leave the host's conntrack limits and timeouts alone.
# nodeport-addresses: NodePorts only on the node IP, not on every interface.
if ! running_pid kube-proxy "$BIN/kube-proxy" >/dev/null; then
  port_free 127.0.0.1 "$KUBE_PROXY_HEALTHZ_PORT" || die "port 127.0.0.1:$KUBE_PROXY_HEALTHZ_PORT is in use (set PROXYFLEET_KUBE_PROXY_HEALTHZ_PORT)"
  port_free 127.0.0.1 "$KUBE_PROXY_METRICS_PORT" || die "port 127.0.0.1:$KUBE_PROXY_METRICS_PORT is in use (set PROXYFLEET_KUBE_PROXY_METRICS_PORT)"
  log "starting kube-proxy (iptables mode)"
  start_proc kube-proxy "$BIN/kube-proxy" \
    --kubeconfig "$STATE/kube-proxy.kubeconfig" \
    --hostname-override "$NODE_NAME" \
    --bind-address "$NODE_IP" \
    --proxy-mode iptables \
    --cluster-cidr "$POD_CIDR" \
    --nodeport-addresses "$NODE_CIDR" \
    --healthz-bind-address "127.0.0.1:$KUBE_PROXY_HEALTHZ_PORT" \
    --metrics-bind-address "127.0.0.1:$KUBE_PROXY_METRICS_PORT" \
    --conntrack-max-per-core 0 \
    --conntrack-tcp-timeout-established 0 \
    --conntrack-tcp-timeout-close-wait 0 \
    --oom-score-adj 0 \
    --v 1
fi

# ---- wait ----------------------------------------------------------------------------------------------
wait_for "kube-scheduler /healthz" 60 kube-scheduler "$BIN/kube-scheduler" \
  bash -c "[[ \"\$(curl -ksS --max-time 3 https://127.0.0.1:$SCHEDULER_PORT/healthz)\" == ok ]]"
wait_for "kubelet /healthz" 60 kubelet "$BIN/kubelet" http_ok "http://127.0.0.1:$KUBELET_HEALTHZ_PORT/healthz"
wait_for "kube-proxy /healthz" 60 kube-proxy "$BIN/kube-proxy" \
  bash -c "curl -fsS --max-time 3 http://127.0.0.1:$KUBE_PROXY_HEALTHZ_PORT/healthz"
wait_for "node $NODE_NAME Ready" "$READY_TIMEOUT" kubelet "$BIN/kubelet" node_ready
write_env
log "node $NODE_NAME Ready ($NODE_IP, pods $POD_CIDR, services $SERVICE_CIDR); env file:"
echo "$STATE/node.env"
