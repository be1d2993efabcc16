#!/usr/bin/env bash
# Build a current CRD-only API server, `apiextensions-apiserver` (Kubernetes
# 1.36 or later), from Debian sid's Go library packages, with sid's Go, and
# take sid's etcd 3.5 beside it; install both into a cache directory outside
# the repo:
#
#   ${PROXYFLEET_KUBE_CURRENT_CACHE:-$HOME/.cache/proxyfleet/kube-current}/bin/
#
# Everything comes from Debian's archive: the packages are downloaded with a
# private apt configuration (its own sources list, lists, status and cache
# under $CACHE/apt), unpacked with dpkg-deb, never installed, so the machine's
# bookworm stays as it is. Kubernetes' own sources (k8s.io/kubernetes) are not
# packaged as Go libraries, so only this server can be built at a current
# version; ../kube-apiserver runs a whole 1.20 control plane.
#
# Idempotent: when both binaries and a matching stamp are there it does
# nothing. Cold: about 3 minutes on an idle 2-core machine (the download
# ~25 s, the `go build` the rest).
#
# Environment:
#   PROXYFLEET_KUBE_CURRENT_CACHE  cache dir (default ~/.cache/proxyfleet/kube-current)
#   PROXYFLEET_KUBE_CURRENT_FORCE=1  rebuild even if the stamp matches
#   PROXYFLEET_KUBE_CURRENT_MIRROR   Debian mirror (default http://deb.debian.org/debian)
set -euo pipefail

# Bump when the way the binaries are built changes: forces a rebuild.
RECIPE_REV=1
CACHE="${PROXYFLEET_KUBE_CURRENT_CACHE:-$HOME/.cache/proxyfleet/kube-current}"
MIRROR="${PROXYFLEET_KUBE_CURRENT_MIRROR:-http://deb.debian.org/debian}"
BIN="$CACHE/bin"
STAMP="$BIN/.build-stamp"
SERVER_PKG=golang-k8s-apiextensions-apiserver-dev
# The oldest server this tier stands for: CEL rules are enforced from 1.25 on,
# and this tier exists to be current.
MIN_MINOR=36

T0=$SECONDS
log() { printf '[kube-current-build %4ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
die() { printf '[kube-current-build %4ds] ERROR: %s\n' "$((SECONDS - T0))" "$*" >&2; exit 1; }

if [[ "${PROXYFLEET_KUBE_CURRENT_FORCE:-0}" != 1 && -x "$BIN/apiextensions-apiserver" && -x "$BIN/etcd" \
      && "$(sed -n 's/^recipe=//p' "$STAMP" 2>/dev/null)" == "$RECIPE_REV" ]]; then
  log "up to date: $BIN, $(sed -n 's/^server=//p' "$STAMP")"
  exit 0
fi

mkdir -p "$CACHE"
exec 9>"$CACHE/.build.lock"
if ! flock -n 9; then
  log "another build holds $CACHE/.build.lock; waiting"
  flock 9
fi

for tool in apt-get apt-cache dpkg-deb flock; do
  command -v "$tool" >/dev/null || die "$tool not found (Debian's apt and dpkg)"
done
[[ -s /usr/share/keyrings/debian-archive-keyring.gpg ]] \
  || die "/usr/share/keyrings/debian-archive-keyring.gpg is missing (apt-get install debian-archive-keyring)"

# ---- a private apt for sid --------------------------------------------------
APT="$CACHE/apt"
mkdir -p "$APT/lists/partial" "$APT/archives/partial" "$APT/etc/preferences.d" "$APT/etc/apt.conf.d"
: >"$APT/status"
printf 'deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] %s sid main\n' "$MIRROR" \
  >"$APT/etc/sources.list"
cat >"$APT/apt.conf" <<CONF
Dir::State "$APT";
Dir::State::Lists "$APT/lists";
Dir::State::status "$APT/status";
Dir::Cache "$APT";
Dir::Cache::archives "$APT/archives";
Dir::Etc::SourceList "$APT/etc/sources.list";
Dir::Etc::SourceParts "$APT/etc/sources.list.d";
Dir::Etc::Preferences "$APT/etc/preferences";
Dir::Etc::PreferencesParts "$APT/etc/preferences.d";
Dir::Etc::Parts "$APT/etc/apt.conf.d";
APT::Architecture "$(dpkg --print-architecture)";
APT::Architectures "$(dpkg --print-architecture)";
APT::Sandbox::User "root";
Acquire::Languages "none";
// The archive this machine reaches may be a frozen copy whose Release file
// is past its Valid-Until; its signature is still checked.
Acquire::Check-Valid-Until "false";
CONF
export APT_CONFIG="$APT/apt.conf"
log "reading sid's package lists ($MIRROR)"
apt-get -q -o Acquire::Retries=3 update >"$APT/update.log" 2>&1 \
  || { tail -n 20 "$APT/update.log" >&2; die "apt-get update for sid failed (log: $APT/update.log)"; }

candidate() { apt-cache policy "$1" | awk '/Candidate:/ { print $2 }'; }
server_version="$(candidate "$SERVER_PKG")"
[[ -n "$server_version" && "$server_version" != "(none)" ]] || die "sid has no $SERVER_PKG"
minor="$(sed -E 's/^0\.([0-9]+)\..*/\1/' <<<"$server_version")"
[[ "$minor" =~ ^[0-9]+$ ]] && ((minor >= MIN_MINOR)) \
  || die "sid's $SERVER_PKG is $server_version; this tier wants 0.$MIN_MINOR or later"
upstream="${server_version%%-*}"
upstream="${upstream#*:}"
k8s_version="v1.${upstream#0.}"
# sid's default Go (golang-go depends on golang-1.NN-go).
go_pkg="$(apt-cache depends golang-go | awk '/Depends: golang-1\.[0-9]+-go/ { print $2; exit }')"
[[ -n "$go_pkg" ]] || die "cannot tell sid's Go compiler package from golang-go"
go_src="${go_pkg%-go}-src"
log "server $SERVER_PKG $server_version ($k8s_version), compiler $go_pkg $(candidate "$go_pkg"), etcd-server $(candidate etcd-server)"

# The Go libraries the server imports: the -dev packages it depends on,
# recursively (architecture-independent source trees, named golang-*). The
# closure is wider than the build needs (a library's own test dependencies
# come along: ~320 packages, ~320 MB), but it is what Debian declares, so
# the build does not break when sid adds an import.
mapfile -t packages < <(
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances "$SERVER_PKG" \
    | awk '/^[a-z0-9]/ { print $1 }' | grep -E '^golang-' | sort -u
)
packages+=("$go_pkg" "$go_src" etcd-server)
log "downloading ${#packages[@]} packages"
(cd "$APT/archives" && apt-get -q -o Acquire::Retries=3 download "${packages[@]}" >"$APT/download.log" 2>&1) \
  || { tail -n 20 "$APT/download.log" >&2; die "downloading from sid failed (log: $APT/download.log)"; }

# ---- unpack and build -------------------------------------------------------
BUILD="$CACHE/build"
rm -rf "$BUILD"
mkdir -p "$BUILD/root"
for p in "${packages[@]}"; do
  deb="$(ls "$APT/archives/${p}_"*.deb 2>/dev/null | tail -n 1)"
  [[ -n "$deb" ]] || die "the download of $p left no .deb in $APT/archives"
  dpkg-deb -x "$deb" "$BUILD/root"
done
ROOT="$BUILD/root"
go_minor="${go_pkg#golang-}"
GOROOT="$ROOT/usr/lib/go-${go_minor%-go}"
[[ -x "$GOROOT/bin/go" ]] || die "no go binary at $GOROOT/bin/go"
# Absolute symlinks in the packages (/usr/share/...) would leave the unpacked
# root: point them into it.
while IFS= read -r link; do
  target="$(readlink "$link")"
  if [[ "$target" == /* && -e "$ROOT$target" ]]; then ln -sfn "$ROOT$target" "$link"; fi
done < <(find "$ROOT/usr" -type l)
export GOROOT GOPATH="$ROOT/usr/share/gocode" GO111MODULE=off GOPROXY=off GOTOOLCHAIN=local \
  CGO_ENABLED=0 GOCACHE="$BUILD/go-cache" GOTELEMETRY=off
src="$GOPATH/src/k8s.io/apiextensions-apiserver"
[[ -f "$src/main.go" ]] || die "$SERVER_PKG has no main.go at $src"
ldflags="-s -w"
for kv in "gitVersion=$k8s_version" "gitMajor=1" "gitMinor=${minor}" "gitTreeState=archive" \
          "buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"; do
  ldflags+=" -X k8s.io/component-base/version.$kv -X k8s.io/client-go/pkg/version.$kv"
done
log "go build apiextensions-apiserver ($("$GOROOT/bin/go" version | awk '{print $3}'))"
mkdir -p "$BIN"
(cd "$src" && nice -n 19 "$GOROOT/bin/go" build -trimpath -ldflags "$ldflags" \
  -o "$BIN/apiextensions-apiserver.new" .) >"$CACHE/build.log" 2>&1 \
  || { tail -n 30 "$CACHE/build.log" >&2; die "go build failed (log: $CACHE/build.log)"; }
mv -f "$BIN/apiextensions-apiserver.new" "$BIN/apiextensions-apiserver"
install -m 0755 "$ROOT/usr/bin/etcd" "$BIN/etcd"
"$BIN/etcd" --version >/dev/null || die "sid's etcd does not run here"
cat >"$STAMP" <<STAMPEOF
recipe=$RECIPE_REV
server=$k8s_version ($SERVER_PKG $server_version, $go_pkg $(candidate "$go_pkg"))
etcd=$(candidate etcd-server)
STAMPEOF
# The unpacked tree and the packages are several hundred MB; the binaries are
# all that is kept.
rm -rf "$BUILD" "$APT/archives"/*.deb "$APT/lists" "$APT"/*.bin
log "built $BIN/apiextensions-apiserver ($k8s_version) and $BIN/etcd"
