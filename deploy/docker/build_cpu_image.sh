#!/usr/bin/env bash
# Build the CPU image (deploy/docker/Dockerfile, unmodified) with podman on a machine that reaches Debian's mirror and
# PyPI but no container registry (../shared/containers.md, beside the checkout, has the facts this follows):
#   1. podman, runc and debootstrap from apt-get if missing (as root);
#   2. the base image made here: debootstrap --variant=minbase bookworm -> localhost/debian:bookworm -> bookworm's
#      Python 3.11 on it, tagged as the Dockerfile's FROM (docker.io/library/python:3.11-slim). Kept once made: a second
#      run reuses it (BERTZOO_REBUILD_BASE=1 makes it again);
#   3. `podman build --pull=never --format docker` (docker format keeps HEALTHCHECK), with the host's CA bundle and a
#      pip.conf naming it mounted for the build stage only (outbound HTTPS here goes through a TLS proxy): nothing of
#      them is left in the image. Podman's layer cache makes a rebuild of unchanged sources take seconds.
# Usage: bash deploy/docker/build_cpu_image.sh [IMAGE]      (IMAGE defaults to localhost/bertzoo-serve:cpu)
# Runtime settings these VMs need (nofile/nproc limits the VM allows, runc: crun refuses hybrid cgroups) are in
# deploy/docker/podman.conf; the script uses it unless CONTAINERS_CONF names another file, and so does
# tests/test_container_image.py, which runs the image.
set -euo pipefail
cd "$(dirname "$0")/../.."
IMAGE=${1:-localhost/bertzoo-serve:cpu}
BASE=docker.io/library/python:3.11-slim     # the Dockerfile's FROM python:3.11-slim, as podman resolves it
DEBIAN=localhost/debian:bookworm
MIRROR=${BERTZOO_DEBIAN_MIRROR:-http://deb.debian.org/debian}
HOST_CA=${BERTZOO_HOST_CA:-/etc/ssl/certs/ca-certificates.crt}
export CONTAINERS_CONF=${CONTAINERS_CONF:-$PWD/deploy/docker/podman.conf}
started=$SECONDS
say() { echo "build_cpu_image: $* ($((SECONDS - started)) s)" >&2; }

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

missing=()
command -v podman >/dev/null || missing+=(podman)
command -v runc >/dev/null || missing+=(runc)
command -v debootstrap >/dev/null || missing+=(debootstrap)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "build_cpu_image: needs ${missing[*]} (not root or no apt-get to install them)" >&2
    exit 1
  fi
  say "installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # One apt at a time: .ci/run installs other packages beside this script, under the same lock file.
  { flock -w 400 9 && timeout 120 apt-get update -qq \
      && timeout 300 apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
    9>/var/lock/bertzoo-apt.lock >"$work/apt.log" 2>&1 || { tail -20 "$work/apt.log" >&2; exit 1; }
fi

if [ -n "${BERTZOO_REBUILD_BASE:-}" ] || ! podman image exists "$BASE"; then
  if [ -n "${BERTZOO_REBUILD_BASE:-}" ] || ! podman image exists "$DEBIAN"; then
    say "debootstrap minbase bookworm from $MIRROR"
    rootfs=$work/rootfs
    debootstrap --variant=minbase bookworm "$rootfs" "$MIRROR" >"$work/debootstrap.log" 2>&1 \
      || { tail -20 "$work/debootstrap.log" >&2; exit 1; }
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/*
    tar -C "$rootfs" -c . | podman import -q - "$DEBIAN" >/dev/null
    rm -rf "$rootfs"
  fi
  say "Python 3.11 base on $DEBIAN"
  # bookworm's python3 (3.11) with venv and pip; `python` and `pip` as python:3.11-slim has them.
  cat >"$work/Containerfile.python" <<EOF
FROM $DEBIAN
RUN apt-get update \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv python3-pip \\
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb \\
 && ln -s /usr/bin/python3 /usr/local/bin/python && ln -s /usr/bin/pip3 /usr/local/bin/pip
EOF
  podman build --pull=never --format docker -t localhost/debian-python:3.11 -f "$work/Containerfile.python" \
    "$work" >"$work/base.log" 2>&1 || { tail -20 "$work/base.log" >&2; exit 1; }
  podman tag localhost/debian-python:3.11 "$BASE"
fi

# pip inside the build trusts the host's bundle (it holds the TLS proxy's CA), mounted read-only for the build stage
# only: podman 4.3 leaves an empty mount point in every layer a RUN with -v makes, so the build stage (the one that
# runs pip) is built first with the mounts, then the whole file without them, its build stage from the layer cache
# (whose keys do not include the mounts). The final stage never sees the CA or pip.conf, not even as empty files.
mkdir -p "$work/ca"
cp "$HOST_CA" "$work/ca/ca-certificates.crt"
printf '[global]\ncert = /run/host-ca/ca-certificates.crt\n' >"$work/pip.conf"
build() { podman build --pull=never --format docker -f deploy/docker/Dockerfile "$@" . >>"$work/build.log" 2>&1 \
            || { tail -40 "$work/build.log" >&2; exit 1; }; }
say "building the build stage of deploy/docker/Dockerfile"
build --target build -t "$IMAGE-build" -v "$work/ca:/run/host-ca:ro" -v "$work/pip.conf:/etc/pip.conf:ro"
say "building $IMAGE"
build -t "$IMAGE"
# The image answers `bertzoo --version` as its own user (uid 10001), with nothing of the build's mounts in it.
podman run --rm --no-healthcheck --entrypoint sh "$IMAGE" \
  -c 'test "$(id -u)" = 10001 && test ! -e /etc/pip.conf && test ! -e /run/host-ca && bertzoo --version' >/dev/null \
  || { echo "build_cpu_image: $IMAGE does not run bertzoo as uid 10001, or holds the build's mounts" >&2; exit 1; }
say "built $IMAGE"
