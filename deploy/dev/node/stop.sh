#!/usr/bin/env bash
# Stop the node started by start.sh and undo what it changed on the host:
# containers, containerd, kubelet, kube-proxy, kube-scheduler and the control
# plane; mounts, network namespaces, cgroups, iptables chains (and nft tables
# that only they created), the bridge and its veths, sysctls (previous values
# written back), directories the components created, containerd's runtime state.
# Idempotent; safe after a failed or partial start.
#
#   stop.sh           stop; keep the state dir (etcd data, certificates, images)
#   stop.sh --purge   stop and delete the state dir (next start: a fresh cluster)
#
# Environment: PROXYFLEET_KUBE_CACHE, PROXYFLEET_NODE_STATE and the network
# settings (PROXYFLEET_NODE_BRIDGE, ...) as given to start.sh.
set -euo pipefail
LOG_TAG=node-stop
# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
PURGE=0
case "${1:-}" in
  "") ;;
  --purge) PURGE=1 ;;
  *) echo "usage: $0 [--purge]" >&2; exit 2 ;;
esac
[[ "$(id -u)" == 0 ]] || die "needs root"

if [[ -f "$RUN/owner" && "$(cat "$RUN/owner")" != "$STATE" ]]; then
  die "this machine's node belongs to $(cat "$RUN/owner"), not $STATE; use PROXYFLEET_NODE_STATE=$(cat "$RUN/owner")"
fi
if [[ -d "$STATE" ]]; then
  exec 9>"$STATE/.lock"
  flock 9
fi
CONTAINERD="$(command -v containerd || echo /usr/bin/containerd)"

# ---- processes --------------------------------------------------------------------------------
# The kubelet first, so that it restarts nothing while the rest goes away.
stop_proc kubelet "$BIN/kubelet"
stop_proc kube-proxy "$BIN/kube-proxy"
stop_proc kube-scheduler "$BIN/kube-scheduler"

# Containers: through containerd while it runs, so that the shims unmount
# their root filesystems and exit.
ctr_k8s() { timeout 30 ctr --address "$CONTAINERD_SOCK" --namespace k8s.io "$@"; }
if running_pid containerd "$CONTAINERD" >/dev/null; then
  tasks="$(ctr_k8s tasks ls -q 2>/dev/null || true)"
  if [[ -n "$tasks" ]]; then
    log "killing $(wc -w <<<"$tasks") container(s)"
    for t in $tasks; do ctr_k8s tasks kill --all --signal SIGKILL "$t" >/dev/null 2>&1 || true; done
    for t in $tasks; do
      for _ in $(seq 50); do
        ctr_k8s tasks ls 2>/dev/null | awk -v t="$t" '$1 == t && $3 != "STOPPED" { f = 1 } END { exit !f }' || break
        sleep 0.1
      done
      ctr_k8s tasks delete --force "$t" >/dev/null 2>&1 || true
    done
  fi
fi
stop_proc containerd "$CONTAINERD"

# The control plane: its controller-manager makes a host directory too.
if [[ -d "$CP_STATE" ]]; then
  cp_args=()
  ((PURGE)) && cp_args=(--purge)
  PROXYFLEET_KUBE_CACHE="$CACHE" PROXYFLEET_KUBE_STATE="$CP_STATE" "$APISERVER_DIR/stop.sh" \
    ${cp_args[@]+"${cp_args[@]}"} 2>&1 | sed 's/^/  /' >&2
fi

if [[ ! -f "$RUN/owner" ]]; then
  # start.sh writes the owner file before its first change to the host, and
  # this script deletes it after its last undo: without it there is nothing to undo.
  log "no host changes recorded ($RUN/owner missing)"
  HOST_CLEANUP=0
else
  HOST_CLEANUP=1
fi
undo_host() {
# Anything left: shims started for this containerd, and processes in the
# kubelet's cgroups (one node per machine: those are this node's).
for p in /proc/[0-9]*; do
  cmd="$(tr '\0' ' ' 2>/dev/null <"$p/cmdline" || true)"
  if [[ "$cmd" == *containerd-shim* && "$cmd" == *"-address $CONTAINERD_SOCK "* ]]; then
    log "killing leftover shim ${p#/proc/}"
    kill -KILL "${p#/proc/}" 2>/dev/null || true
  fi
done
# The kubelet's cgroup tree (cgroupfs driver) in every cgroup hierarchy.
kubepods_dirs() {
  local mnt
  for mnt in $(awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/mounts); do
    [[ -d "$mnt/kubepods" ]] && echo "$mnt/kubepods"
  done
  true
}
for _ in 1 2 3; do
  mapfile -t pids < <(for d in $(kubepods_dirs); do find "$d" -name cgroup.procs -exec cat {} + 2>/dev/null; done | sort -un)
  ((${#pids[@]})) || break
  log "killing leftover container processes: ${pids[*]}"
  kill -KILL "${pids[@]}" 2>/dev/null || true
  sleep 0.5
done

# ---- mounts and network namespaces -------------------------------------------------------------
# containerd names pod network namespaces cni-<uuid>.
netns_files() {
  local f
  for f in /run/netns/cni-*; do
    [[ "${f#/run/netns/}" =~ ^cni-[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$ ]] && echo "$f"
  done
  true
}
prefixes=("$KUBELET_ROOT" "$CONTAINERD_STATE" "$CONTAINERD_ROOT" /run/containerd)
for _ in 1 2 3 4 5; do
  mapfile -t netns < <(netns_files)
  mapfile -t mps < <(mounts_under "${prefixes[@]}" ${netns[@]+"${netns[@]}"})
  ((${#mps[@]})) || break
  log "unmounting ${#mps[@]} mount(s)"
  for mp in "${mps[@]}"; do
    umount "$mp" 2>/dev/null || umount -l "$mp" 2>/dev/null || true
  done
done
mapfile -t netns < <(netns_files)
left="$(mounts_under "${prefixes[@]}" ${netns[@]+"${netns[@]}"})"
[[ -z "$left" ]] || log "WARNING: still mounted: $left"
for f in ${netns[@]+"${netns[@]}"}; do rm -f "$f"; done

# ---- cgroups ----------------------------------------------------------------------------------------
for d in $(kubepods_dirs); do
  log "removing cgroup tree $d"
  find "$d" -depth -type d -exec rmdir {} + 2>/dev/null || true
  [[ -d "$d" ]] && log "WARNING: could not remove $d"
done

# ---- iptables ------------------------------------------------------------------------------------
if [[ -x "$BIN/kube-proxy" ]] && command -v iptables >/dev/null; then
  "$BIN/kube-proxy" --cleanup >"$STATE/kube-proxy-cleanup.log" 2>&1 \
    || log "kube-proxy --cleanup exited non-zero (its IPVS part needs ipset; log: $STATE/kube-proxy-cleanup.log)"
fi
# What is left of the chains named by the kubelet, kube-proxy, CNI and start.sh:
# delete the rules that jump to them, then flush and delete them, one
# iptables-restore transaction per table.
OURS='(KUBE-[A-Z0-9-]+|CNI-[A-Za-z0-9-]+|'"$ISOLATE_CHAIN"')'
remove_chains() { # iptables|ip6tables
  local fam="$1" table dump script
  command -v "$fam-save" >/dev/null || return 0
  dump="$("$fam-save" 2>/dev/null)" || return 0
  for table in $(sed -n 's/^\*//p' <<<"$dump"); do
    script="$(awk -v t="$table" -v ours="^$OURS\$" '
      /^\*/ { in_t = ($0 == "*" t); next }
      !in_t { next }
      /^:/ { c = substr($1, 2); if (c ~ ours) chains[++n] = c; next }
      /^-A / {
        for (i = 3; i <= NF; i++) if (($i == "-j" || $i == "-g") && $(i + 1) ~ ours && $2 !~ ours) { sub(/^-A /, "-D "); print; break }
      }
      END { for (i = 1; i <= n; i++) print "-F " chains[i]; for (i = 1; i <= n; i++) print "-X " chains[i] }
    ' <<<"$dump")"
    [[ -n "$script" ]] || continue
    log "$fam: removing $(grep -c '^-X' <<<"$script") chain(s) from table $table"
    printf '*%s\n%s\nCOMMIT\n' "$table" "$script" | "$fam-restore" --noflush \
      || log "WARNING: $fam-restore failed for table $table"
  done
}
remove_chains iptables
remove_chains ip6tables
# iptables-nft leaves the tables it created (with empty base chains) behind:
# drop those that did not exist before start.sh and hold nothing else now.
if command -v nft >/dev/null && [[ -f "$RUN/host-before/nft-tables" ]]; then
  while read -r _ fam name; do
    [[ -n "$name" ]] || continue
    grep -qxF "table $fam $name" "$RUN/host-before/nft-tables" && continue
    body="$(nft list table "$fam" "$name" 2>/dev/null)" || continue
    if ! grep -vE '^[[:space:]]*(table .*\{|chain [A-Za-z0-9_-]+ \{|type [a-z]+ hook [a-z]+ priority [^;]+; policy accept;|\}|)$' <<<"$body" | grep -q .; then
      log "nft: deleting empty table $fam $name"
      nft delete table "$fam" "$name" || true
    else
      log "WARNING: nft table $fam $name still has content; left in place"
    fi
  done < <(nft list tables 2>/dev/null)
fi

# ---- bridge, veths ---------------------------------------------------------------------------------
if ip link show "$BRIDGE" >/dev/null 2>&1; then
  for v in $(ip -o link show master "$BRIDGE" 2>/dev/null | awk -F': ' '{ print $2 }' | cut -d@ -f1); do
    ip link del "$v" 2>/dev/null || true
  done
  log "deleting bridge $BRIDGE (and its addresses and routes)"
  ip link del "$BRIDGE"
fi
# Pod IP leases: every sandbox is gone now.
rm -rf "$STATE/cni/ipam"

# ---- sysctls, directories ----------------------------------------------------------------------------
if [[ -f "$RUN/host-before/sysctl" ]]; then
  while IFS='=' read -r k v; do
    [[ -n "$k" ]] || continue
    cur="$(sysctl -n "$k" 2>/dev/null)" || continue   # an interface that is gone
    if [[ "$cur" != "$v" ]]; then
      log "sysctl $k: $cur -> $v"
      sysctl -qw "$k=$v" || log "WARNING: could not restore $k=$v"
    fi
  done <"$RUN/host-before/sysctl"
fi
if [[ -f "$RUN/host-before/absent-dirs" ]]; then
  while read -r d; do
    [[ -n "$d" && -e "$d" ]] || continue
    if [[ -n "$(mounts_under "$d")" ]]; then
      log "WARNING: $d still has mounts; left in place"
      continue
    fi
    log "removing $d (created by the node)"
    rm -rf --one-file-system "$d"
  done <"$RUN/host-before/absent-dirs"
fi

# Keep the records (and so the owner) when something could not be undone:
# running stop.sh again retries from them.
left=()
ip link show "$BRIDGE" >/dev/null 2>&1 && left+=("interface $BRIDGE")
[[ -n "$(kubepods_dirs)" ]] && left+=("cgroups $(kubepods_dirs | tr '\n' ' ')")
for fam in iptables ip6tables; do
  "$fam-save" 2>/dev/null | grep -qE "^:$OURS " && left+=("$fam chains")
done
mapfile -t netns < <(netns_files)
[[ -n "$(mounts_under "${prefixes[@]}" "$RUN" ${netns[@]+"${netns[@]}"})" ]] && left+=("mounts")
if ((${#left[@]})); then
  log "WARNING: not undone: ${left[*]}; $RUN kept (run stop.sh again)"
  return 1
fi
rm -rf --one-file-system "$RUN"
}
UNDONE=1
if ((HOST_CLEANUP)); then
  undo_host || UNDONE=0
fi
[[ -d "$STATE" ]] && rm -f "$STATE/node.env" "$STATE"/*.pid

if ((PURGE)) && [[ -d "$STATE" ]]; then
  if [[ -n "$(mounts_under "$STATE")" ]]; then
    die "not deleting $STATE: it still has mounts: $(mounts_under "$STATE" | tr '\n' ' ')"
  fi
  log "deleting $STATE"
  rm -rf --one-file-system "$STATE"
fi
((UNDONE)) || die "stopped, but some host changes remain (see above)"
log "stopped"
