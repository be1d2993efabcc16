#!/usr/bin/env bash
# Print the host state that start.sh changes and stop.sh must put back, in a
# form that diffs cleanly: links, addresses, routes, iptables/ip6tables/nft
# rules, mounts, sysctls, cgroup directories and the host directories the
# node's components create. Counters and values that change by themselves are
# left out.
#
#   host-snapshot.sh >before.txt; start.sh; ...; stop.sh; host-snapshot.sh >after.txt
#   diff before.txt after.txt
set -uo pipefail

section() { printf '\n==== %s\n' "$1"; }
section "ip link"; ip -d link show | sed -E 's/ (promiscuity|allmulti) [0-9]+//g'
section "ip addr"; ip addr show | grep -vE 'valid_lft'
section "ip route"; ip route show table all
section "ip netns"; ls /run/netns 2>/dev/null
section "iptables-save"; iptables-save 2>/dev/null | grep -vE '^#' | sed -E 's/\[[0-9]+:[0-9]+\]/[-]/'
section "ip6tables-save"; ip6tables-save 2>/dev/null | grep -vE '^#' | sed -E 's/\[[0-9]+:[0-9]+\]/[-]/'
section "nft list ruleset"; nft list ruleset 2>/dev/null
section "mounts"; awk '{ print $2, $3 }' /proc/self/mounts
section "sysctl"
sysctl -a 2>/dev/null | grep -vE '^(fs\.(dentry-state|file-nr|inode-nr|inode-state)|kernel\.(random\.|ns_last_pid|pty\.nr)|net\.netfilter\.nf_conntrack_count|fs\.quota\.)'
section "cgroup dirs"
for m in $(awk '$3 == "cgroup" || $3 == "cgroup2" { print $2 }' /proc/mounts); do
  find "$m" -mindepth 1 -maxdepth 1 -type d | grep -v '/process_api' | sort
done
section "directories"
for d in /var/log/pods /var/log/containers /run/netns /run/containerd /run/proxyfleet-node \
         /var/lib/cni /var/lib/kubelet /var/lib/containerd /etc/cni /opt/cni \
         /usr/libexec/kubernetes /etc/kubernetes; do
  [[ -e "$d" ]] && echo "exists: $d"
done
true
