#!/usr/bin/env bash
# Stop what start.sh started (each pid is checked to run the expected binary
# before it is signalled). `stop.sh --purge` also deletes the state dir.
set -euo pipefail
CACHE="${PROXYFLEET_KUBE_CURRENT_CACHE:-$HOME/.cache/proxyfleet/kube-current}"
STATE="${PROXYFLEET_KUBE_CURRENT_STATE:-$CACHE/state}"
stop() { # NAME EXE
  local pid
  [[ -f "$STATE/$1.pid" ]] || return 0
  pid="$(cat "$STATE/$1.pid" 2>/dev/null)"
  if [[ "$pid" =~ ^[0-9]+$ && "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$(readlink -f "$2")" ]]; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$STATE/$1.pid"
}
stop apiextensions-apiserver "$CACHE/bin/apiextensions-apiserver"
stop etcd "$CACHE/bin/etcd"
if [[ "${1:-}" == --purge ]]; then rm -rf "$STATE"; fi
