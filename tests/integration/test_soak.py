"""The soak's short version: bench/soak.py run as a user would run it, judged on what it
prints (8 s of warm-up, then 10 s over which memory and descriptors must hold still; the
30-minute run is `python bench/soak.py`). Mixed produce, fetch and admin traffic from three
client libraries through the proxy with quotas on; nothing acknowledged may be lost or doubled,
no client may see an error, and the proxy's memory and descriptors must not creep."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dev.proxy_process import REPO

pytestmark = pytest.mark.integration

MINUTES = 0.3
WARMUP_SECONDS = 8


def _tail(path: Path, lines: int, keep: tuple[str, ...] = ("",)) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"({path.name}: {exc})"
    return "\n".join([line for line in text if any(k in line for k in keep)][-lines:])


def _short_groups_evidence(figures: dict[str, Any], logs: Path) -> str:
    """What to read when a group missed messages: the figures, each short group's silence
    evidence and client log, and the proxy's warnings."""
    short = [g for g, n in figures["missing_by_group"].items() if n]
    parts = [f"missing by group: {figures['missing_by_group']}, consumed: {figures['messages_consumed']}"]
    for group in short:
        evidence = [e for e in figures["silence_evidence"] if e["group"] == group]
        parts.append(f"--- {group}: silence evidence {evidence[-3:]}")
        parts.append(f"--- {group}: connections at the end {figures['group_connections_at_end'].get(group)}")
        # How it started (bootstrap, coordinator, join) and how it ended.
        head, tail = _tail(logs / f"{group}.log", 10**6).splitlines(), _tail(logs / f"{group}.log", 20)
        # The first 60 lines above DEBUG; the last 20 of any level show where kafka-python's
        # group coordinator (logged at DEBUG) stood at the end.
        first = [line for line in head if " DEBUG " not in line][:60]
        parts.append(f"--- {group}.log (first 60 lines above DEBUG, then the last 20)\n" + "\n".join(first))
        parts.append(f"...\n{tail}")
    warnings = _tail(logs / "kthrottle.log", 40, (" WARNING ", " ERROR "))
    parts.append(f"--- kthrottle.log warnings and errors (last 40)\n{warnings}")
    return "\n".join(parts)


@pytest.mark.timeout(MINUTES * 60 + 600)
def test_soak_loses_nothing_and_does_not_creep(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "bench" / "soak.py"),
            "--minutes",
            str(MINUTES),
            "--warmup-seconds",
            str(WARMUP_SECONDS),
            "--no-faults",  # the broker restart and the rebalances are the 30-minute run's
            "--logs",
            str(tmp_path / "logs"),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=MINUTES * 60 + 540,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    print(proc.stdout[-4000:])
    assert proc.returncode == 0, proc.stderr[-4000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])

    # Every acknowledged message consumed by every group reading its topic, exactly once. A
    # group that fell short brings its client's log and the proxy's warnings into the failure
    # (CI keeps only what the run prints).
    assert figures["messages_produced"] > 0
    assert figures["missing"] == 0, _short_groups_evidence(figures, tmp_path / "logs")
    assert figures["duplicates"] == 0
    assert figures["produced_equals_consumed"], _short_groups_evidence(figures, tmp_path / "logs")
    # Every group's client is seen by the proxy asking and answered: what a silent group's
    # evidence (recorded past 30 s of silence, so only in the 30-minute run) would show stop.
    for group, rows in figures["group_connections_at_end"].items():
        assert any(row.get("requests", 0) > 0 and row.get("bytes_out", 0) > 0 for row in rows), (group, rows)
    # No client saw an error, and the proxy refused nothing (the admin's throttling is the quota's).
    assert figures["errors_by_kind"] == {}, figures["errors_by_kind"]
    # Quotas were on and applied to all three kinds of traffic.
    throttled = figures["throttled_requests_by_api"]
    assert throttled.get("Produce", 0) > 0 and throttled.get("Fetch", 0) > 0, throttled
    assert (
        throttled.get("CreateTopics", 0)
        + figures["throttled_by_kind"].get("librdkafka-admin:create:THROTTLING_QUOTA_EXCEEDED", 0)
        > 0
    )
    assert figures["admin_topics_created"] == figures["admin_topics_deleted"] > 0
    # No request waited in the proxy longer than a throttle and a fetch's wait (a group's
    # JoinGroup and SyncGroup wait for its members, and are left out).
    waits = {api: s for api, s in figures["longest_pending_request_s"].items() if "Group" not in api}
    assert all(s < 30 for s in waits.values()), waits
    # The proxy does not creep: memory within 10% of where it stood after the warm-up, and
    # every connection's descriptors given back once the clients have gone.
    assert figures["rss_growth_pct"] < 10, figures["rss_mib_every_minute"]
    assert figures["fds_end"] <= figures["fds_start"] + 4
    assert figures["fds_after_drain"] <= figures["fds_launch"] + 4
