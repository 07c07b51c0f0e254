#!/usr/bin/env bash
# Builds the kthrottle container image on whatever this machine has, and prints how to run it.
#
#   bash dev/image.sh [--tag kthrottle:dev] [--extras capture] [-- extra build arguments]
#
# - The engine: docker where an engine answers (`docker info`), else podman (Debian's podman and
#   buildah are installed with apt-get when missing, as root). podman builds with chroot isolation
#   (works where user namespaces are restricted, as in CI sandboxes).
# - The base images the Dockerfile's FROM lines name (python:<version>-<release> and its -slim):
#   pulled where a registry answers; else made here with debootstrap from Debian's packages
#   (Debian's own Python 3.11 in place of the python image's), cached as tarballs under
#   $KTHROTTLE_CACHE/images and imported under those names, so the Dockerfile is built unchanged.
# - Prints `image: <tag> <size in MB>` last. Exit 1 (with the reason) when no engine can be had.
#
# Running what it built with podman in a restricted sandbox needs `--runtime runc` and explicit
# `--ulimit nofile=... --ulimit nproc=...` below the hard limits: `dev/image.sh --print-run-args`
# prints the arguments that work on this machine.
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tag=kthrottle:dev
extras=""
print_run_args=false
build_args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --tag) tag=$2; shift 2 ;;
    --extras) extras=$2; shift 2 ;;
    --print-run-args) print_run_args=true; shift ;;
    --) shift; build_args=("$@"); break ;;
    *) echo "image: unknown argument $1" >&2; exit 2 ;;
  esac
done

say() { echo "image: $*" >&2; }

# The Dockerfile's own defaults, so the base images match its FROM lines.
arg_default() { sed -n "s/^ARG $1=\(.*\)$/\1/p" "$repo/Dockerfile" | head -1; }
python_version=$(arg_default PYTHON_VERSION)
release=$(arg_default DEBIAN_RELEASE)
builder_base="docker.io/library/python:${python_version}-${release}"
final_base="docker.io/library/python:${python_version}-slim-${release}"

engine=""
if command -v docker >/dev/null && docker info >/dev/null 2>&1; then
  engine=docker
else
  if ! command -v podman >/dev/null || ! command -v buildah >/dev/null; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
      say "installing Debian's podman and buildah (apt-get)"
      export DEBIAN_FRONTEND=noninteractive
      apt-get install -y -q --no-install-recommends podman buildah runc uidmap >&2 \
        || { apt-get update -q >&2 && apt-get install -y -q --no-install-recommends podman buildah runc uidmap >&2; }
    fi
  fi
  command -v podman >/dev/null || { say "no container engine: no docker daemon, and podman cannot be installed here"; exit 1; }
  engine=podman
fi

# Ulimits a container may be given here: below the hard limits (runc may not raise them).
run_args=()
if [ "$engine" = podman ]; then
  nofile=$(( $(ulimit -Hn) < 65536 ? $(ulimit -Hn) / 2 : 65536 ))
  nproc=$(( $(ulimit -Hu) < 8192 ? $(ulimit -Hu) / 2 : 8192 ))
  run_args=(--runtime runc --ulimit "nofile=${nofile}:${nofile}" --ulimit "nproc=${nproc}:${nproc}")
fi
if $print_run_args; then
  echo "$engine ${run_args[*]}"
  exit 0
fi

have_image() { "$engine" image inspect "$1" >/dev/null 2>&1; }

# A Debian root file system with Python 3.11, imported as image $1 (packages: the rest).
make_base() {
  local name=$1; shift
  bash "$repo/dev/debootstrap_base.sh" "$engine" "$name" "$release" "$@"
}

# The builder compiles the hot path (dev/compile.py): a C compiler and Python's headers.
can_compile() {
  "$engine" run --rm "${run_args[@]}" "$1" python -c \
    "import os, shutil, sys, sysconfig; sys.exit(not (shutil.which('gcc') and os.path.exists(os.path.join(sysconfig.get_paths()['include'], 'Python.h'))))" \
    >/dev/null 2>&1
}

for base in "$builder_base" "$final_base"; do
  if have_image "$base"; then
    if [ "$base" = "$final_base" ] || can_compile "$base"; then
      continue
    fi
    say "$base has no C compiler (made before the compiled hot path): made again"
    "$engine" rmi -f "$base" >/dev/null
  fi
  if timeout 60 "$engine" pull -q "$base" >/dev/null 2>&1; then
    continue
  fi
  case "$base" in
    *-slim-*) make_base "$base" python3 python-is-python3 ca-certificates ;;
    *) make_base "$base" python3 python3-venv python3-pip python-is-python3 ca-certificates gcc python3-dev ;;
  esac
done

build=("$engine" build)
if [ "$engine" = podman ]; then
  # docker format: OCI images drop HEALTHCHECK
  build+=(--isolation chroot --pull=never --format docker)
fi
build+=(--tag "$tag")
# This machine's pip settings reach the build as the Dockerfile's build inputs: its CA bundle (a
# TLS-inspecting proxy), its pip config (a private index) as secrets; index URLs as build args.
ca=${PIP_CERT:-${REQUESTS_CA_BUNDLE:-${SSL_CERT_FILE:-}}}
if [ -n "$ca" ] && [ -f "$ca" ]; then
  build+=(--secret "id=pip_ca,src=$ca")
fi
for conf in "${PIP_CONFIG_FILE:-}" "$HOME/.config/pip/pip.conf" "$HOME/.pip/pip.conf" /etc/pip.conf; do
  if [ -n "$conf" ] && [ -f "$conf" ]; then
    build+=(--secret "id=pip_conf,src=$conf")
    break
  fi
done
for var in PIP_INDEX_URL PIP_EXTRA_INDEX_URL; do
  if [ -n "${!var:-}" ]; then
    build+=(--build-arg "$var=${!var}")
  fi
done
if [ -n "$extras" ]; then
  build+=(--build-arg "KTHROTTLE_EXTRAS=$extras")
fi
say "building $tag with $engine"
bash "$repo/dev/engine_build.sh" "${build[@]}" "${build_args[@]}" "$repo"
size=$("$engine" image inspect --format '{{.Size}}' "$tag")
say "built $tag: $((size / 1000000)) MB; run it with: $engine run ${run_args[*]} --read-only ... $tag"
echo "image: $tag $((size / 1000000))"
