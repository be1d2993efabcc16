# Starting and waiting for the background processes of the dev clusters,
# shared by ../kube-apiserver/start.sh, ../current-apiserver/start.sh and
# ../node/lib.sh (sourced, not run). Each caller defines STATE (where pid
# files and logs go), die, and HOST (the address port_in_use asks by default).
# shellcheck shell=bash

# pid of a component if its pid file (in DIR, default $STATE) names a live
# process running the expected binary
running_pid() { # NAME EXE [DIR]
  local name="$1" exe="$2" dir="${3:-$STATE}" pid
  [[ -f "$dir/$name.pid" ]] || return 1
  pid="$(cat "$dir/$name.pid" 2>/dev/null)"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  [[ "$(readlink "/proc/$pid/exe" 2>/dev/null)" == "$(readlink -f "$exe")" ]] || return 1
  echo "$pid"
}

port_in_use() { (exec 3<>"/dev/tcp/${2:-$HOST}/$1") 2>/dev/null; } # PORT [HOST]

# start NAME EXE ARGS...: detached (own session), log to $STATE/NAME.log
start_proc() {
  local name="$1"; shift
  rm -f "$STATE/$name.pid"
  {
    printf '\n==== %s starting at %s\n' "$name" "$(date -u +%FT%TZ)"
    printf '%q ' "$@"; printf '\n'
  } >>"$STATE/$name.log"
  setsid bash -c 'echo $$ >"$0"; exec "$@"' "$STATE/$name.pid" "$@" \
    </dev/null >>"$STATE/$name.log" 2>&1 9>&- &
  disown || true
  for _ in $(seq 50); do [[ -s "$STATE/$name.pid" ]] && break; sleep 0.1; done
}

wait_for() { # DESCRIPTION TIMEOUT NAME EXE CMD...
  local what="$1" timeout="$2" name="$3" exe="$4"; shift 4
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    if ! running_pid "$name" "$exe" >/dev/null; then
      tail -n 30 "$STATE/$name.log" >&2 || true
      die "$name exited while waiting for $what (log: $STATE/$name.log)"
    fi
    ((SECONDS < deadline)) || { tail -n 30 "$STATE/$name.log" >&2 || true; die "timed out after ${timeout}s waiting for $what (log: $STATE/$name.log)"; }
    sleep 0.3
  done
}
