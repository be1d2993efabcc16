#!/usr/bin/env bash
# Build kube-apiserver, kube-controller-manager, kube-scheduler, kubelet and
# kube-proxy from Debian's `kubernetes` source package (bookworm:
# 1.20.5+really1.20.2, i.e. Kubernetes v1.20.2) with Debian's Go 1.19, plus the
# pod sandbox ("pause") binary from the same tree with gcc, and install them
# into a cache directory outside the repo:
#
#   ${PROXYFLEET_KUBE_CACHE:-$HOME/.cache/proxyfleet/kube}/bin/
#
# The control plane (../kube-apiserver/start.sh) needs only the first two; the
# rest are for ../node/start.sh.
#
# Idempotent: when all binaries and a matching stamp file are already there it
# does nothing (well under a second). A cold build takes ~10-20 minutes on 2
# cores. Needs root (apt-get) only when something must be installed or built.
#
# Environment:
#   PROXYFLEET_KUBE_CACHE        cache dir (default ~/.cache/proxyfleet/kube)
#   PROXYFLEET_KUBE_DEB_VERSION  Debian source version to build
#                                (default 1.20.5+really1.20.2-1.1+deb12u1;
#                                falls back to apt's candidate when gone)
#   PROXYFLEET_KUBE_KEEP_BUILD=1 keep the extracted source and Go build cache
#                                (several GB) under $CACHE/build after success
#   PROXYFLEET_KUBE_FORCE=1      rebuild even if the stamp matches
set -euo pipefail

# Bump when the way the binaries are built changes: forces a rebuild.
RECIPE_REV=2
DEB_VERSION="${PROXYFLEET_KUBE_DEB_VERSION:-1.20.5+really1.20.2-1.1+deb12u1}"
CACHE="${PROXYFLEET_KUBE_CACHE:-$HOME/.cache/proxyfleet/kube}"
BIN="$CACHE/bin"
STAMP="$BIN/.build-stamp"
GO_PKG_VERSION=1.19
GOROOT_DEB="/usr/lib/go-$GO_PKG_VERSION"
# What start.sh runs, and what only the node (../node) runs.
CONTROL_PLANE_BINARIES=(kube-apiserver kube-controller-manager)
NODE_BINARIES=(kube-scheduler kubelet kube-proxy)
# Everything installed into $BIN (pause: the pod sandbox's init, built with gcc).
ALL_BINARIES=("${CONTROL_PLANE_BINARIES[@]}" "${NODE_BINARIES[@]}" pause)
# Packages needed to build (and, for start.sh, to run) the control plane.
APT_PACKAGES=(
  "golang-$GO_PKG_VERSION-go" "golang-$GO_PKG_VERSION-src"
  golang-github-modern-go-reflect2-dev
  dpkg-dev xz-utils ca-certificates
  etcd-server openssl curl util-linux
  gcc libc6-dev
)

T0=$SECONDS
log() { printf '[kube-build %4ds] %s\n' "$((SECONDS - T0))" "$*" >&2; }
die() { printf '[kube-build %4ds] ERROR: %s\n' "$((SECONDS - T0))" "$*" >&2; exit 1; }

want_stamp() {
  printf 'requested=%s\nrecipe=%s\n' "$DEB_VERSION" "$RECIPE_REV"
}

is_up_to_date() {
  [[ "${PROXYFLEET_KUBE_FORCE:-0}" != 1 ]] || return 1
  [[ -f "$STAMP" ]] || return 1
  local b
  for b in "${ALL_BINARIES[@]}"; do [[ -x "$BIN/$b" ]] || return 1; done
  # The stamp's first two lines must be exactly what this recipe would write.
  [[ "$(head -n 2 "$STAMP")" == "$(want_stamp)" ]] || return 1
  # start.sh also needs these at run time.
  command -v etcd >/dev/null && command -v openssl >/dev/null && command -v curl >/dev/null
}

# ---- fast path ------------------------------------------------------------
if is_up_to_date; then
  log "up to date: $BIN ($(sed -n 's/^source=//p' "$STAMP"))"
  exit 0
fi

mkdir -p "$CACHE"
# Serialise concurrent builds (e.g. two test runs starting at once).
exec 9>"$CACHE/.build.lock"
if ! flock -n 9; then
  log "another build holds $CACHE/.build.lock; waiting"
  flock 9
fi
if is_up_to_date; then
  log "up to date after waiting for the other build"
  exit 0
fi

[[ "$(id -u)" == 0 ]] || die "needs root for apt-get (run as root, or build once as root with PROXYFLEET_KUBE_CACHE pointing to a shared dir)"
export DEBIAN_FRONTEND=noninteractive

# ---- apt: deb-src line, packages --------------------------------------------
have_deb_src() {
  grep -rqsE '^[[:space:]]*(deb-src[[:space:]]|Types:.*deb-src)' \
    /etc/apt/sources.list /etc/apt/sources.list.d/ 2>/dev/null
}
if ! have_deb_src; then
  src_file=/etc/apt/sources.list.d/proxyfleet-debian-src.sources
  log "no deb-src entries configured; writing $src_file (mirrors the deb entries)"
  tmp="$(mktemp)"
  # deb822 files: copy each enabled Debian stanza with Types: deb -> deb-src.
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f "$f" ]] || continue
    grep -qiE '^URIs:.*debian' "$f" || continue
    # Every stanza there is a deb one for Debian (checked above): turn its
    # Types line into deb-src, keep URIs/Suites/Components/Signed-By.
    grep -qE '^Types:.*\bdeb\b' "$f" || continue
    sed -E 's/^Types:.*/Types: deb-src/' "$f" >>"$tmp"
    printf '\n' >>"$tmp"
  done
  # one-line format
  if [[ -f /etc/apt/sources.list ]]; then
    lines="$(grep -E '^[[:space:]]*deb[[:space:]].*debian' /etc/apt/sources.list | sed -E 's/^[[:space:]]*deb[[:space:]]/deb-src /' || true)"
    if [[ -n "$lines" ]]; then
      echo "$lines" >"${src_file%.sources}.list"
    fi
  fi
  if [[ -s "$tmp" ]]; then
    install -m 0644 "$tmp" "$src_file"
  fi
  rm -f "$tmp"
  have_deb_src || die "could not derive a deb-src entry from /etc/apt sources; add one for bookworm by hand"
fi

log "apt-get update"
apt-get -o DPkg::Lock::Timeout=600 update -qq >/dev/null || die "apt-get update failed"

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if ((${#missing[@]})); then
  log "apt-get install ${missing[*]}"
  apt-get -o DPkg::Lock::Timeout=600 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null \
    || die "apt-get install failed for: ${missing[*]}"
fi
[[ -x "$GOROOT_DEB/bin/go" ]] || die "$GOROOT_DEB/bin/go missing after installing golang-$GO_PKG_VERSION-go"
REFLECT2_DEB=/usr/share/gocode/src/github.com/modern-go/reflect2
[[ -f "$REFLECT2_DEB/reflect2.go" ]] || die "$REFLECT2_DEB missing (golang-github-modern-go-reflect2-dev)"
command -v gcc >/dev/null || die "gcc missing after installing gcc"

# ---- source -------------------------------------------------------------------
BUILD="$CACHE/build"
GOPATH_DIR="$BUILD/gopath"
SRC="$GOPATH_DIR/src/k8s.io/kubernetes"
DL="$BUILD/dl"
rm -rf "$DL" "$SRC" "$BUILD/out" "$CACHE"/.trash.*
mkdir -p "$DL" "$(dirname "$SRC")" "$BUILD/out" "$BUILD/tools"

log "apt-get source kubernetes=$DEB_VERSION"
if ! (cd "$DL" && apt-get source -qq "kubernetes=$DEB_VERSION" >"$DL/apt-source.log" 2>&1); then
  log "kubernetes=$DEB_VERSION not available from apt; trying the current candidate"
  cat "$DL/apt-source.log" >&2 || true
  rm -rf "${DL:?}"/*
  (cd "$DL" && apt-get source -qq kubernetes >"$DL/apt-source.log" 2>&1) || {
    cat "$DL/apt-source.log" >&2
    die "apt-get source kubernetes failed (is there a deb-src line for bookworm? see 'apt-cache showsrc kubernetes')"
  }
fi
dsc="$(ls "$DL"/kubernetes_*.dsc 2>/dev/null | head -n 1)"
[[ -n "$dsc" ]] || die "no kubernetes_*.dsc downloaded"
SOURCE_VERSION="$(sed -n 's/^Version: //p' "$dsc" | head -n 1)"
srcdir="$(find "$DL" -mindepth 1 -maxdepth 1 -type d -name 'kubernetes-*' | head -n 1)"
[[ -d "$srcdir/cmd/kube-apiserver" ]] || die "unpacked source has no cmd/kube-apiserver ($srcdir)"
mv "$srcdir" "$SRC"
log "source: kubernetes $SOURCE_VERSION (Debian patches applied by dpkg-source)"

# Upstream version baked into the tree by `git archive` (export-subst).
GIT_COMMIT="$(sed -n 's/^[[:space:]]*gitCommit[[:space:]]*=[[:space:]]*"\([0-9a-f]\{40\}\)".*/\1/p' \
  "$SRC/staging/src/k8s.io/component-base/version/base.go" | head -n 1)"
UPSTREAM="${SOURCE_VERSION#*really}"; UPSTREAM="${UPSTREAM%%-*}"   # 1.20.2
[[ "$UPSTREAM" =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || UPSTREAM="${SOURCE_VERSION%%[+-]*}"
KUBE_VERSION="v$UPSTREAM"
KUBE_MAJOR="${UPSTREAM%%.*}"; KUBE_MINOR="${UPSTREAM#*.}"; KUBE_MINOR="${KUBE_MINOR%%.*}"

# ---- patch: reflect2 1.0.1 -> Debian's 1.0.2 (1.0.1 segfaults with Go >= 1.18)
log "patch: vendor/github.com/modern-go/reflect2 -> Debian's $(dpkg-query -W -f='${Version}' golang-github-modern-go-reflect2-dev)"
rm -rf "$SRC/vendor/github.com/modern-go/reflect2"
cp -r "$REFLECT2_DEB" "$SRC/vendor/github.com/modern-go/reflect2"
rm -f "$SRC/vendor/github.com/modern-go/reflect2/go.mod"

# ---- patch: no ECR credential provider in the kubelet ------------------------------
# Its Enabled() asks the EC2 metadata service (169.254.169.254) for credentials
# at every kubelet start, on any machine. Images for ../node are imported and
# never pulled, so the provider has no use there, and the kubelet must not
# send traffic off this machine.
sed -i '\#"k8s.io/kubernetes/pkg/credentialprovider/aws"#d' "$SRC/cmd/kubelet/app/plugins.go"
! grep -q 'credentialprovider/aws' "$SRC/cmd/kubelet/app/plugins.go" \
  || die "could not remove the ECR credential provider from cmd/kubelet/app/plugins.go"

# ---- Go environment (GOPATH mode, as upstream's 1.20 build does) ----------------
export GOROOT="$GOROOT_DEB"
export PATH="$GOROOT/bin:$PATH"
export GOPATH="$GOPATH_DIR"
export GO111MODULE=off
export CGO_ENABLED=0
export GOFLAGS=
export GOCACHE="$BUILD/gocache"
export GOTMPDIR="$BUILD/tmp"
export GOTOOLCHAIN=local
mkdir -p "$GOCACHE" "$GOTMPDIR"
NICE=(nice -n 19)
command -v ionice >/dev/null && NICE=(ionice -c 3 nice -n 19)
cd "$SRC"
log "go: $(go version)"

# ---- generate pkg/generated/openapi/zz_generated.openapi.go ---------------------
log "build openapi-gen"
"${NICE[@]}" go build -o "$BUILD/tools/openapi-gen" ./vendor/k8s.io/kube-openapi/cmd/openapi-gen

log "generate pkg/generated/openapi (openapi-gen)"
# Same input set as Makefile.generated_files' KUBE_OPENAPI target: every dir
# (staging named as vendor/) holding a file with a '// +k8s:' tag that mentions
# '+k8s:openapi-gen=', except code-generator and sample-apiserver.
openapi_dirs="$(
  find -H . \( -path ./_\* -o -path ./.\* -o -path ./vendor \) -prune -o -type f -name '*.go' -print0 \
    | { xargs -0 grep -l --null '^// *+k8s:' || true; } \
    | { xargs -0 grep -l '+k8s:openapi-gen=' || true; } \
    | sed 's|^\./staging/src/|./vendor/|; s|/[^/]*$||; s|^\./||' | LC_ALL=C sort -u \
    | { grep -vE '^vendor/k8s\.io/(code-generator|sample-apiserver)/' || true; } \
    | sed 's|^|k8s.io/kubernetes/|' | paste -sd, -
)"
[[ -n "$openapi_dirs" ]] || die "found no +k8s:openapi-gen packages"
log "  $(tr ',' '\n' <<<"$openapi_dirs" | wc -l) input packages"
"${NICE[@]}" "$BUILD/tools/openapi-gen" --logtostderr -v 0 \
  -i "$openapi_dirs" \
  -p k8s.io/kubernetes/pkg/generated/openapi \
  -O zz_generated.openapi \
  -h vendor/k8s.io/code-generator/hack/boilerplate.go.txt \
  -r "$BUILD/out/openapi_violations.report" >"$BUILD/out/openapi-gen.log" 2>&1 \
  || { tail -n 40 "$BUILD/out/openapi-gen.log" >&2; die "openapi-gen failed (log: $BUILD/out/openapi-gen.log)"; }
[[ -s pkg/generated/openapi/zz_generated.openapi.go ]] || die "openapi-gen produced no zz_generated.openapi.go"
if ! diff -q "$BUILD/out/openapi_violations.report" api/api-rules/violation_exceptions.list >/dev/null; then
  log "  note: API rule violations differ from api/api-rules/violation_exceptions.list (harmless for running)"
fi

# ---- build the Go binaries ---------------------------------------------------------
LDFLAGS="-s -w"
for pkg in k8s.io/kubernetes/vendor/k8s.io/client-go/pkg/version k8s.io/kubernetes/vendor/k8s.io/component-base/version; do
  LDFLAGS+=" -X $pkg.gitVersion=$KUBE_VERSION -X $pkg.gitMajor=$KUBE_MAJOR -X $pkg.gitMinor=$KUBE_MINOR"
  LDFLAGS+=" -X $pkg.gitTreeState=archive -X $pkg.buildDate=$(date -u +%Y-%m-%dT%H:%M:%SZ)"
  [[ -n "$GIT_COMMIT" ]] && LDFLAGS+=" -X $pkg.gitCommit=$GIT_COMMIT"
done
# Two steps so that the log shows what the node's binaries add; the second
# reuses the packages the first compiled (same GOCACHE), so nothing is built twice.
go_build() {
  local t=$SECONDS
  log "go build $* ($KUBE_VERSION; nice 19; slow part)"
  "${NICE[@]}" go build -trimpath -tags selinux,notest -ldflags "$LDFLAGS" -o "$BUILD/out/" \
    "${@/#/./cmd/}" || die "go build $* failed"
  log "  go build $* took $((SECONDS - t))s"
}
go_build "${CONTROL_PLANE_BINARIES[@]}"
go_build "${NODE_BINARIES[@]}"

for b in "${CONTROL_PLANE_BINARIES[@]}" "${NODE_BINARIES[@]}"; do
  v="$("$BUILD/out/$b" --version 2>&1)" || die "$b --version failed: $v"
  log "  $b: $v"
done

# ---- pause: the sandbox container's process ---------------------------------------------
# Nothing can be pulled, so ../node builds its sandbox image from this binary.
# Static, so the image needs no libc; the version string is the tree's TAG.
PAUSE_SRC="$SRC/build/pause/linux/pause.c"
[[ -f "$PAUSE_SRC" ]] || die "$PAUSE_SRC missing from the source tree"
PAUSE_TAG="$(sed -n 's/^TAG[[:space:]]*?*=[[:space:]]*//p' "$SRC/build/pause/Makefile" | head -n 1)"
[[ "$PAUSE_TAG" =~ ^[0-9][0-9.]*$ ]] || die "no TAG in build/pause/Makefile (got '$PAUSE_TAG')"
log "gcc -static pause.c (pause $PAUSE_TAG)"
"${NICE[@]}" gcc -Os -Wall -Werror -static -DVERSION="v$PAUSE_TAG-proxyfleet" \
  -o "$BUILD/out/pause" "$PAUSE_SRC" || die "compiling pause.c failed"
strip "$BUILD/out/pause"
cp "$PAUSE_SRC" "$BUILD/out/pause.c"

# ---- install -----------------------------------------------------------------------------
mkdir -p "$BIN" "$CACHE/src"
rm -f "$STAMP"
for b in "${ALL_BINARIES[@]}"; do
  install -m 0755 "$BUILD/out/$b" "$BIN/$b.tmp"
  mv -f "$BIN/$b.tmp" "$BIN/$b"
done
# The source next to the binary it was built from (the build tree is deleted below).
install -m 0644 "$BUILD/out/pause.c" "$CACHE/src/pause.c"
{
  want_stamp
  printf 'source=kubernetes %s\nkube_version=%s\ngit_commit=%s\ngo=%s\npause_tag=%s\nbuilt=%s\n' \
    "$SOURCE_VERSION" "$KUBE_VERSION" "$GIT_COMMIT" "$(go version | awk '{print $3}')" \
    "$PAUSE_TAG" "$(date -u +%FT%TZ)"
} >"$STAMP.tmp"
mv -f "$STAMP.tmp" "$STAMP"

cd /
if [[ "${PROXYFLEET_KUBE_KEEP_BUILD:-0}" != 1 ]]; then
  # Deleting the Go build cache (tens of thousands of files) takes minutes on a
  # busy disk: rename it away now and delete it in the background.
  trash="$CACHE/.trash.$$"
  mv "$BUILD" "$trash"
  log "removing build tree in the background (set PROXYFLEET_KUBE_KEEP_BUILD=1 to keep it)"
  (exec 9>&-; chmod -R u+w "$trash" 2>/dev/null; nice -n 19 rm -rf "$trash") </dev/null >/dev/null 2>&1 &
  disown || true
fi
log "done: ${ALL_BINARIES[*]} in $BIN ($KUBE_VERSION from Debian kubernetes $SOURCE_VERSION)"
