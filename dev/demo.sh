#!/usr/bin/env bash
# Sets up everything (virtualenv, Kafka jars; cached after the first run) and runs the demo:
# a real Kafka broker, kthrottle in front of it, and a client producing and consuming through it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
# shellcheck source=dev/setup.sh
source dev/setup.sh
exec python -m dev.demo "$@"
