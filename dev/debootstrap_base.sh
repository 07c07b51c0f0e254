#!/usr/bin/env bash
# Makes a Debian root file system with debootstrap and imports it into a container engine as an
# image, for machines where no registry answers (dev/image.sh's python bases, the broker image
# of the runtime step). The tarball is cached under $KTHROTTLE_CACHE/images, keyed by the release
# and the packages, so a second run only imports it.
#
#   bash dev/debootstrap_base.sh ENGINE IMAGE_NAME RELEASE PACKAGE...
set -euo pipefail
engine=$1 name=$2 release=$3
shift 3
cache=${KTHROTTLE_CACHE:-$HOME/.cache/kthrottle}/images
say() { echo "base: $*" >&2; }

packages=$(IFS=,; echo "$*")
key=$(printf '%s %s %s' "$release" "$packages" "v1" | sha256sum | cut -c1-12)
tarball="$cache/base-$release-$key.tar"
mkdir -p "$cache"
exec {lock_fd}>"$cache/.debootstrap-$key.lock"
flock "$lock_fd"
if [ ! -f "$tarball" ]; then
  command -v debootstrap >/dev/null || {
    say "installing debootstrap (apt-get)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends debootstrap >&2
  }
  root=$(mktemp -d "$cache/rootfs.XXXXXX")
  say "making $name with debootstrap ($release, $packages): no registry answered"
  debootstrap --variant=minbase --include="$packages" "$release" "$root" http://deb.debian.org/debian >&2
  # As in the python images: pip installs into the system Python (PEP 668 marker removed),
  # no package lists or downloaded packages left behind.
  rm -f "$root"/usr/lib/python3*/EXTERNALLY-MANAGED
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/usr/share/doc/* \
    "$root"/usr/share/man/* "$root"/usr/share/locale/*
  tar -C "$root" -cf "$tarball.partial" .
  mv "$tarball.partial" "$tarball"
  rm -rf "$root"
fi
"$engine" import "$tarball" "$name" >/dev/null
