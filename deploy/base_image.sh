#!/usr/bin/env bash
# Builds a Debian bookworm base image with python3 (3.11), venv and pip, without any registry: debootstrap
# fetches Debian's packages, `docker import` turns the tree into an image. Use it where no registry is reachable:
#
#   sudo deploy/base_image.sh [TAG]          # default tag: fedhop-base:bookworm
#   docker build -f deploy/Dockerfile --build-arg BASE_IMAGE=fedhop-base:bookworm -t fedhop .
#
# Skips the build when TAG already exists (FORCE=1 rebuilds). Needs root, debootstrap and a running dockerd.
# MIRROR picks the Debian mirror (default: deb.debian.org).
set -euo pipefail

TAG="${1:-fedhop-base:bookworm}"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"

if [ "${FORCE:-0}" != 1 ] && docker image inspect "$TAG" >/dev/null 2>&1; then
  echo "base image $TAG exists (FORCE=1 rebuilds)"
  exit 0
fi
if [ "$(id -u)" != 0 ]; then echo "base_image.sh: needs root (debootstrap)" >&2; exit 2; fi
command -v debootstrap >/dev/null || { echo "base_image.sh: debootstrap missing (apt-get install debootstrap)" >&2; exit 2; }

ROOT="$(mktemp -d /var/tmp/fedhop-rootfs.XXXXXX)"
trap 'rm -rf "$ROOT"' EXIT
debootstrap --variant=minbase --include=python3,python3-venv,python3-pip,ca-certificates,iproute2,nftables,iptables \
  bookworm "$ROOT" "$MIRROR"
chroot "$ROOT" apt-get clean
rm -rf "$ROOT"/var/lib/apt/lists/* "$ROOT"/var/cache/apt/*.bin
tar -C "$ROOT" --numeric-owner -c . | docker import \
  --change 'ENV LANG=C.UTF-8' --change 'CMD ["python3"]' - "$TAG"
echo "built $TAG"
