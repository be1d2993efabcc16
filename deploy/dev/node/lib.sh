# Settings and helpers shared by start.sh, stop.sh and smoke.sh (sourced, not run).
# shellcheck shell=bash disable=SC2034  # the variables are for the scripts that source this

NODE_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
APISERVER_DIR="$(cd "$NODE_DIR/../kube-apiserver" && pwd)"
CACHE="${PROXYFLEET_KUBE_CACHE:-$HOME/.cache/proxyfleet/kube}"
BIN="$CACHE/bin"
STATE="${PROXYFLEET_NODE_STATE:-$CACHE/node}"
# The node's control plane is its own, never the one the test suite starts
# with ../kube-apiserver/start.sh in $CACHE/state: it needs a service range
# and kubelet credentials that one does not have.
CP_STATE="$STATE/control-plane"
# kubectl's discovery cache for these scripts' own calls, not in ~/.kube.
export KUBECACHEDIR="$STATE/kubectl-cache"
# Host-wide: bridge, cgroup and iptables chain names are global, so there is
# one node per machine, and this directory says which state dir owns it.
# It also holds what the host looked like before (restored by stop.sh) and
# containerd's runtime state, all of which a reboot clears.
RUN=/run/proxyfleet-node

NODE_NAME="${PROXYFLEET_NODE_NAME:-proxyfleet-node}"
BRIDGE="${PROXYFLEET_NODE_BRIDGE:-pfnode0}"
NODE_CIDR="${PROXYFLEET_NODE_CIDR:-10.213.70.0/24}"
POD_CIDR="${PROXYFLEET_POD_CIDR:-10.213.71.0/24}"
SERVICE_CIDR="${PROXYFLEET_SERVICE_CIDR:-10.213.72.0/24}"
# The node's control plane has ports of its own, so that it runs next to the
# test suite's (../kube-apiserver/start.sh on 23790, 23800, 16443, 16457). The
# test suite's variables (PROXYFLEET_ETCD_PORT, ...) do not apply here: set
# in a shell for the test suite, they would make the two collide. Every
# default is below the kernel's ephemeral range (32768 and up), where a
# client connection of any process may hold the port at the moment a
# server here binds it.
NODE_ETCD_PORT="${PROXYFLEET_NODE_ETCD_PORT:-26790}"
NODE_ETCD_PEER_PORT="${PROXYFLEET_NODE_ETCD_PEER_PORT:-26800}"
NODE_APISERVER_PORT="${PROXYFLEET_NODE_APISERVER_PORT:-26443}"
NODE_KCM_PORT="${PROXYFLEET_NODE_KCM_PORT:-26457}"
SCHEDULER_PORT="${PROXYFLEET_SCHEDULER_PORT:-26459}"
KUBELET_PORT="${PROXYFLEET_KUBELET_PORT:-10250}"
KUBELET_HEALTHZ_PORT="${PROXYFLEET_KUBELET_HEALTHZ_PORT:-10248}"
KUBE_PROXY_HEALTHZ_PORT="${PROXYFLEET_KUBE_PROXY_HEALTHZ_PORT:-10256}"
KUBE_PROXY_METRICS_PORT="${PROXYFLEET_KUBE_PROXY_METRICS_PORT:-10249}"

CONTAINERD_STATE="$RUN/containerd"
CONTAINERD_SOCK="$CONTAINERD_STATE/containerd.sock"
CONTAINERD_ROOT="$STATE/containerd"
KUBELET_ROOT="$STATE/kubelet"
# Chains this node's own scripts add (kube-proxy's and the kubelet's are KUBE-*).
ISOLATE_CHAIN=PFNODE-ISOLATE

# Runtime packages of the node (the control plane's come with build.sh).
NODE_APT_PACKAGES=(containerd runc containernetworking-plugins iptables nftables conntrack)

# Sysctls that the node's components write: start.sh (ip_forward,
# bridge-nf-call-*), kube-proxy (route_localnet), the kubelet (the rest). stop.sh writes the recorded values back. ip_forward comes first:
# writing it resets every interface's forwarding, which the per-interface keys
# recorded after it then put back.
NODE_SYSCTLS=(
  net.ipv4.ip_forward
  net.ipv6.conf.all.forwarding
  net.ipv4.conf.all.route_localnet
  net.bridge.bridge-nf-call-iptables
  net.bridge.bridge-nf-call-ip6tables
  vm.overcommit_memory
  vm.panic_on_oom
  kernel.panic
  kernel.panic_on_oops
  kernel.keys.root_maxkeys
  kernel.keys.root_maxbytes
)
# Host paths the node's components create when missing; stop.sh deletes the
# ones that did not exist before start.sh.
NODE_HOST_DIRS=(
  /var/log/pods           # kubelet: container logs (path is fixed in kubelet 1.20)
  /var/log/containers     # kubelet: symlinks to those logs (fixed too)
  /run/netns              # containerd: pod network namespaces (fixed)
  /run/containerd         # containerd shims' sockets (fixed below /run/containerd/s)
  /var/lib/cni            # libcni's result cache (fixed)
  /var/lib/kubelet        # kubelet: device-plugins socket (fixed, whatever --root-dir says)
  /usr/libexec/kubernetes # controller-manager: FlexVolume plugin dir (its default)
)

T0=${T0:-$SECONDS}
LOG_TAG="${LOG_TAG:-node}"
log() { printf '[%s %3ds] %s\n' "$LOG_TAG" "$((SECONDS - T0))" "$*" >&2; }
die() { printf '[%s %3ds] ERROR: %s\n' "$LOG_TAG" "$((SECONDS - T0))" "$*" >&2; exit 1; }

# a.b.c.0/24 -> a.b.c.N
cidr_host() {
  local cidr="$1" n="$2"
  [[ "$cidr" =~ ^([0-9]+\.[0-9]+\.[0-9]+)\.0/24$ ]] || die "$cidr: only a.b.c.0/24 ranges are supported"
  echo "${BASH_REMATCH[1]}.$n"
}
NODE_IP="$(cidr_host "$NODE_CIDR" 1)"
POD_GATEWAY="$(cidr_host "$POD_CIDR" 1)"
# The `kubernetes` Service's ClusterIP (the apiserver takes the range's first
# address); in-cluster clients dial https://$API_SERVICE_IP:443.
API_SERVICE_IP="$(cidr_host "$SERVICE_CIDR" 1)"
# The API server is on the node IP: Go and curl would send it (and pods,
# ClusterIPs) to an HTTP(S)_PROXY from the environment, which only loopback
# escapes by default. Everything these scripts start and call goes direct.
export NO_PROXY="${NO_PROXY:+$NO_PROXY,}$NODE_CIDR,$POD_CIDR,$SERVICE_CIDR"
export no_proxy="${no_proxy:+$no_proxy,}$NODE_CIDR,$POD_CIDR,$SERVICE_CIDR"

# running_pid NAME EXE [DIR] (and start_proc, wait_for, port_in_use)
# shellcheck source=../lib/procs.sh
. "$NODE_DIR/../lib/procs.sh"

# A process that exited but is not reaped yet counts as gone.
alive() { [[ -e "/proc/$1/exe" ]] && ! grep -q '^[0-9]* (.*) Z' "/proc/$1/stat" 2>/dev/null; }

# stop NAME EXE: only the process whose pid file names it AND runs EXE
stop_proc() {
  local name="$1" exe="$2" pidfile="$STATE/$1.pid" pid
  [[ -f "$pidfile" ]] || return 0
  if pid="$(running_pid "$name" "$exe")"; then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
      alive "$pid" || break
      sleep 0.1
    done
    if alive "$pid"; then
      log "$name did not exit after 10s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.2
    fi
  fi
  rm -f "$pidfile"
}

# Mount points at or below any of the given paths, deepest first.
mounts_under() {
  local mp p
  # Field 5 of mountinfo is the mount point, with space, tab, newline and
  # backslash written as octal escapes.
  while read -r _ _ _ _ mp _; do
    mp="$(printf '%b' "$mp")"
    for p in "$@"; do
      if [[ "$mp" == "$p" || "$mp" == "$p"/* ]]; then echo "$mp"; break; fi
    done
  done </proc/self/mountinfo | LC_ALL=C sort -r
}

# The node's kubeconfigs: the control plane's CA, a client certificate.
kubeconfig_for() { # API_URL FILE USER CERT KEY
  local api_url="$1"; shift
  cat >"$1.tmp" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: proxyfleet-dev
  cluster:
    server: $api_url
    certificate-authority: $CP_STATE/pki/ca.crt
users:
- name: $2
  user:
    client-certificate: $3
    client-key: $4
contexts:
- name: $2@proxyfleet-dev
  context:
    cluster: proxyfleet-dev
    user: $2
current-context: $2@proxyfleet-dev
EOF
  chmod 600 "$1.tmp"; mv -f "$1.tmp" "$1"
}
