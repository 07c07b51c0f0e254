#!/usr/bin/env bash
# Builds the Apache Kafka broker image the runtime step runs beside the kthrottle sidecar
# (tests/runtime): dev/broker_image/Containerfile on a Debian base with Java 17 made by
# debootstrap (dev/debootstrap_base.sh, cached), with the harness's Kafka jars ($KTHROTTLE_KAFKA_LIBS,
# from `source dev/setup.sh`). Uses podman (as dev/image.sh finds or installs it).
#
#   bash dev/broker_image.sh [--tag kthrottle-kafka:test]   -> prints `image: <tag> <MB>` last
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tag=kthrottle-kafka:test
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag=$2; shift 2 ;;
    *) echo "broker image: unknown argument $1" >&2; exit 2 ;;
  esac
done
say() { echo "broker image: $*" >&2; }
libs=${KTHROTTLE_KAFKA_LIBS:?run source dev/setup.sh first: it resolves the Kafka jars}
bash "$repo/dev/image.sh" --print-run-args >/dev/null || { say "no container engine"; exit 1; }
command -v podman >/dev/null || { say "podman is needed"; exit 1; }

release=$(sed -n 's/^ARG DEBIAN_RELEASE=\(.*\)$/\1/p' "$repo/Dockerfile" | head -1)
base="localhost/kthrottle-broker-base:$release"
podman image inspect "$base" >/dev/null 2>&1 \
  || bash "$repo/dev/debootstrap_base.sh" podman "$base" "$release" openjdk-17-jre-headless

context=$(mktemp -d)
trap 'rm -rf "$context"' EXIT
mkdir -p "$context/libs" "$context/bin"
cp "$libs"/*.jar "$context/libs/"
cp "$repo"/dev/broker_image/*.sh "$context/bin/"
cp "$repo/dev/broker_image/log4j2.properties" "$context/"
say "building $tag"
bash "$repo/dev/engine_build.sh" podman build --isolation chroot --pull=never --format docker \
  --build-arg "BASE=$base" -f "$repo/dev/broker_image/Containerfile" -t "$tag" "$context"
size=$(podman image inspect --format '{{.Size}}' "$tag")
echo "image: $tag $((size / 1000000))"
