#!/usr/bin/env bash
# Pack a directory into a single-layer OCI image archive that
# `ctr -n k8s.io images import` accepts, without Docker or a registry:
#
#   oci-image.sh ROOTFS_DIR REFERENCE OUT.tar ENTRYPOINT_JSON [CMD_JSON]
#
#   oci-image.sh /tmp/rootfs localhost/proxyfleet/pause:3.4 pause.tar '["/pause"]'
#
# The archive is reproducible: the same ROOTFS_DIR (contents and modes) gives
# the same bytes, hence the same image digest (entries sorted, mtime 0, owner
# 0:0 numerically, uncompressed layer, fixed JSON). REFERENCE should be under
# localhost/ so that nothing ever tries to pull it from elsewhere.
set -euo pipefail

[[ $# -ge 4 && $# -le 5 ]] || { sed -n '2,12p' "$0" >&2; exit 2; }
ROOTFS="$1" REF="$2" OUT="$3" ENTRYPOINT="$4" CMD="${5:-null}"
[[ -d "$ROOTFS" ]] || { echo "oci-image.sh: $ROOTFS is not a directory" >&2; exit 1; }
[[ "$REF" == *:* ]] || { echo "oci-image.sh: $REF has no tag" >&2; exit 1; }
case "$(uname -m)" in
  x86_64) ARCH=amd64 ;;
  aarch64) ARCH=arm64 ;;
  *) ARCH="$(uname -m)" ;;
esac

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT
mkdir -p "$WORK/oci/blobs/sha256"

# tar DIR OUT: every entry under DIR, sorted, no ./ prefix, normalised metadata
det_tar() {
  (cd "$1" && find . -mindepth 1 | sed 's|^\./||' | LC_ALL=C sort) >"$WORK/list"
  tar -C "$1" --no-recursion -T "$WORK/list" --format=gnu --numeric-owner \
    --owner=0 --group=0 --mtime=@0 -cf "$2"
}
sha() { sha256sum "$1" | cut -d' ' -f1; }
size() { stat -c %s "$1"; }
# blob FILE: move FILE into blobs/sha256/<digest>, print the digest
blob() {
  local d; d="$(sha "$1")"
  mv -f "$1" "$WORK/oci/blobs/sha256/$d"
  echo "$d"
}

det_tar "$ROOTFS" "$WORK/layer.tar"
layer_size="$(size "$WORK/layer.tar")"
layer="$(blob "$WORK/layer.tar")"

printf '{"architecture":"%s","config":{"Cmd":%s,"Entrypoint":%s,"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"WorkingDir":"/"},"created":"1970-01-01T00:00:00Z","os":"linux","rootfs":{"diff_ids":["sha256:%s"],"type":"layers"}}' \
  "$ARCH" "$CMD" "$ENTRYPOINT" "$layer" >"$WORK/config.json"
config_size="$(size "$WORK/config.json")"
config="$(blob "$WORK/config.json")"

printf '{"config":{"digest":"sha256:%s","mediaType":"application/vnd.oci.image.config.v1+json","size":%s},"layers":[{"digest":"sha256:%s","mediaType":"application/vnd.oci.image.layer.v1.tar","size":%s}],"mediaType":"application/vnd.oci.image.manifest.v1+json","schemaVersion":2}' \
  "$config" "$config_size" "$layer" "$layer_size" >"$WORK/manifest.json"
manifest_size="$(size "$WORK/manifest.json")"
manifest="$(blob "$WORK/manifest.json")"

# io.containerd.image.name carries the full reference for `ctr images import`;
# the OCI ref.name annotation is the tag, as other OCI tools expect.
printf '{"manifests":[{"annotations":{"io.containerd.image.name":"%s","org.opencontainers.image.ref.name":"%s"},"digest":"sha256:%s","mediaType":"application/vnd.oci.image.manifest.v1+json","platform":{"architecture":"%s","os":"linux"},"size":%s}],"schemaVersion":2}' \
  "$REF" "${REF##*:}" "$manifest" "$ARCH" "$manifest_size" >"$WORK/oci/index.json"
printf '{"imageLayoutVersion":"1.0.0"}' >"$WORK/oci/oci-layout"

chmod 0755 "$WORK/oci" "$WORK/oci/blobs" "$WORK/oci/blobs/sha256"
chmod 0644 "$WORK/oci/index.json" "$WORK/oci/oci-layout" "$WORK/oci/blobs/sha256"/*
mkdir -p "$(dirname "$OUT")"
det_tar "$WORK/oci" "$WORK/out.tar"
mv -f "$WORK/out.tar" "$OUT"
echo "sha256:$manifest"
