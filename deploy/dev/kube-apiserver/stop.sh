#!/usr/bin/env bash
# Stop kube-controller-manager, kube-apiserver and etcd started by start.sh
# (by their pid files in the state dir). Idempotent.
#
#   stop.sh           stop; keep the state dir (etcd data, certs, tokens)
#   stop.sh --purge   stop and delete the state dir (next start is a fresh cluster)
#
# Environment: PROXYFLEET_KUBE_CACHE, PROXYFLEET_KUBE_STATE as for start.sh.
set -euo pipefail

CACHE="${PROXYFLEET_KUBE_CACHE:-$HOME/.cache/proxyfleet/kube}"
BIN="$CACHE/bin"
STATE="${PROXYFLEET_KUBE_STATE:-$CACHE/state}"
PURGE=0
case "${1:-}" in
  "") ;;
  --purge) PURGE=1 ;;
  *) echo "usage: $0 [--purge]" >&2; exit 2 ;;
esac

log() { printf '[kube-stop] %s\n' "$*" >&2; }

# stop NAME EXE: only the process whose pid file names it AND runs EXE
stop_one() {
  local name="$1" exe="$2" pidfile="$STATE/$1.pid" pid
  [[ -f "$pidfile" ]] || return 0
  pid="$(cat "$pidfile" 2>/dev/null || true)"
  if [[ "$pid" =~ ^[0-9]+$ && -n "$exe" ]] \
     && [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$(readlink -f "$exe")" ]]; then
    log "stopping $name (pid $pid)"
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      log "$name did not exit after 10s; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      sleep 0.2
    fi
  else
    log "$name not running (stale pid file)"
  fi
  rm -f "$pidfile"
}

if [[ -d "$STATE" ]]; then
  stop_one kube-controller-manager "$BIN/kube-controller-manager"
  stop_one kube-apiserver "$BIN/kube-apiserver"
  stop_one etcd "$(command -v etcd || true)"
  rm -f "$STATE/kube.env"
else
  log "nothing to stop ($STATE does not exist)"
fi
if ((PURGE)); then
  log "deleting $STATE"
  rm -rf "$STATE"
fi
log "stopped"
