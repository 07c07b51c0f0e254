#!/usr/bin/env bash
# Sets up everything (virtualenv, Kafka jars; cached after the first run) and runs the whole
# test suite: lint, types, unit tests, and integration tests against a real Apache Kafka broker.
# Extra arguments go to pytest, e.g. `bash dev/test.sh -k passthrough`.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
setup_began=$SECONDS
# shellcheck source=dev/setup.sh
source dev/setup.sh
export SPARK_LOCAL_IP=127.0.0.1
export KTHROTTLE_REQUIRE_TOOLS=1  # a missing tool (helm, Chromium, haproxy, a container engine, root) fails, never skips
export KTHROTTLE_QUICK_TOOLS=1   # Kafka's Java tools start with C1 only (dev/harness.py java_command)
# Built by setup (a compiler is here): the suite must run on the compiled modules, not fall back.
if [ -f ".compiled/$(python -c 'import sys; print(sys.implementation.cache_tag)')/STAMP" ]; then
  export KTHROTTLE_REQUIRE_COMPILED=1
fi
# The report's browser check needs Chromium: installed here (Debian's package, when missing), so
# the download does not count against the test run's time.
bash dev/chromium.sh >/dev/null || echo "setup: no Chromium; test_report_browser.py will say why" >&2
# The load-balancer tests (replicas behind a real TCP load balancer, the PROXY protocol) need
# haproxy: Debian's package, installed the same way.
bash dev/haproxy.sh >/dev/null || echo "setup: no haproxy; the load-balancer tests will say why" >&2
# The chart's alerting rules are checked by Prometheus's own promtool (Debian's package, fetched).
bash dev/promtool.sh >/dev/null || echo "setup: no promtool; test_prometheus_rules.py will say why" >&2
echo "== setup took $((SECONDS - setup_began)) s (virtualenv, Kafka jars, helm, Chromium, haproxy; cached after the first run)" >&2

lint_began=$SECONDS
echo "== ruff" >&2
ruff check protocol quota proxy analytics dev tests bench fuzz
echo "== mypy" >&2
mypy
echo "== ruff + mypy took $((SECONDS - lint_began)) s" >&2
status=0
if [ $# -gt 0 ]; then  # a developer's selection: that alone, in one pytest, and no later step
  python -m pytest -p no:cacheprovider -q -ra --durations=25 --ignore=tests/image --ignore=tests/runtime "$@"
  exit
fi

# Two pytest runs side by side. The broker tests spend much of their time waiting (on throttled
# clients, quota windows, JVMs starting) and leave CPU idle. The tests that only compute run on
# those idle cycles: no broker or proxy, no event loop on the real clock, no deadline (the analytics
# job on local Spark and on a standalone master and worker, the chart rendered and linted, the codec
# and simulation unit tests, the fuzz targets' bounded runs). They run at the lowest priority, so
# they take almost nothing from the tests that measure time: in a session of their own whose
# autogroup is set to nice 19 (dev/idle_priority.sh). Where the kernel shares CPU between sessions
# first (autogroup), a plain `nice` would rank them below the main pytest process only, not below
# the brokers and proxies it starts, each a session of its own.
compute_only=(
  tests/analytics tests/deploy
  tests/unit/test_codec_roundtrip.py tests/unit/test_cluster_quotas.py tests/unit/test_report_plain.py
  tests/unit/test_decode_memory.py tests/unit/test_volume_message.py tests/unit/test_frame_decoder.py
  tests/unit/test_proxy_header.py tests/unit/test_metadata_topics.py tests/unit/test_capture_writer.py
  tests/unit/test_capture_kafka.py tests/unit/test_fuzz.py tests/unit/test_pipeline_liveness.py
  tests/unit/test_request_time_login.py
)
pytest_began=$SECONDS
temp=$(mktemp -d "${TMPDIR:-/tmp}/kthrottle-test.XXXXXX")
# The two runs hand out loopback ports from one record (dev/harness.py free_port): a port one keeps
# unbound on purpose must not become the other's proxy.
export KTHROTTLE_PORT_REGISTRY="$temp/ports"
echo "== pytest: the compute-only tests at idle priority beside the rest (each run lists its slowest)" >&2
setsid --wait bash dev/idle_priority.sh python -m pytest -p no:cacheprovider -q -ra --durations=15 \
  --basetemp="$temp/compute" "${compute_only[@]}" >"$temp/compute.log" 2>&1 &
compute_pid=$!
ignored=()
for path in "${compute_only[@]}"; do ignored+=("--ignore=$path"); done
python -m pytest -p no:cacheprovider -q -ra --durations=50 --basetemp="$temp/main" \
  --ignore=tests/image --ignore=tests/runtime "${ignored[@]}" tests || status=$?
compute_status=0
wait "$compute_pid" || compute_status=$?
echo "== the compute-only tests (run at idle priority beside the rest):" >&2
cat "$temp/compute.log"
echo "== pytest took $((SECONDS - pytest_began)) s (both runs)" >&2
if [ "$status" != 0 ] || [ "$compute_status" != 0 ]; then
  echo "== the failed tests' files (logs, configs) are kept in $temp" >&2
  exit 1
fi
rm -rf "$temp"

# The codec, quota and pipeline unit tests once more on the pure-Python source (the suite above
# ran them compiled): both must stay right, as a machine with no compiler runs pure Python.
pure_began=$SECONDS
echo "== unit tests on pure Python (KTHROTTLE_PURE_PYTHON=1)" >&2
KTHROTTLE_PURE_PYTHON=1 python -m pytest -p no:cacheprovider -q \
  tests/unit/test_compiled.py tests/unit/test_frame_decoder.py tests/unit/test_frame_deadline.py \
  tests/unit/test_codec_roundtrip.py tests/unit/test_messages.py tests/unit/test_produce_scan.py \
  tests/unit/test_metadata_brokers.py tests/unit/test_metadata_topics.py tests/unit/test_fuzz_regressions.py \
  tests/unit/test_pipeline_*.py tests/unit/test_quota_rate.py tests/unit/test_quota_entities.py \
  tests/unit/test_fetch_allowance.py tests/unit/test_produce_shaping.py \
  tests/unit/test_bounded_throttles.py tests/unit/test_cluster_quotas.py tests/unit/test_stage_chain.py \
  tests/unit/test_node_endpoints.py tests/unit/test_splice.py tests/unit/test_plain_reads.py
echo "== pure-Python unit tests took $((SECONDS - pure_began)) s" >&2

# The container image: built by dev/image.sh (base images made with debootstrap where no registry
# answers; cached under the project cache) and run for real. Its own step, outside the pytest
# budget above.
image_began=$SECONDS
echo "== container image (dev/image.sh, tests/image)" >&2
python -m pytest -p no:cacheprovider -q -ra -s tests/image
echo "== container image step took $((SECONDS - image_began)) s" >&2

# The Helm chart's pods on a real container runtime: rendered by helm, run by podman kube play
# (catatonit installed by dev/kube.sh) on the image built above. Its own step too.
runtime_began=$SECONDS
echo "== the chart on podman (dev/kube.sh, tests/runtime)" >&2
python -m pytest -p no:cacheprovider -q -ra -s tests/runtime
echo "== runtime step took $((SECONDS - runtime_began)) s" >&2
