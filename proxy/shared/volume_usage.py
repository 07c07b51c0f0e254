"""Where volume usage comes from: the brokers' DescribeLogDirs (KIP-827) or statvfs of log dirs.

Both give (name, capacity, consumed) per volume. Consumed is capacity minus the bytes usable by
the broker (KIP-827's usable bytes; statvfs's f_bavail), so "free" in the limits means what the
broker can still write, reserved blocks excluded.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from protocol.api_keys import ApiKey
from proxy.net.upstream_client import UpstreamLogin, request

DESCRIBE_LOG_DIRS_VERSION = 4  # the first with total and usable bytes (KIP-827)

Usage = tuple[str, int, int]  # volume name, capacity, consumed (bytes)


def statvfs_usage(log_dirs: Sequence[str]) -> list[Usage]:
    """Usage of the file systems holding ``log_dirs``; dirs on one file system count once (the
    first one listed names it). Raises OSError for a dir that cannot be measured."""
    seen: set[int] = set()
    out: list[Usage] = []
    for path in log_dirs:
        device = os.stat(path).st_dev
        if device in seen:
            continue
        seen.add(device)
        st = os.statvfs(path)
        capacity = st.f_blocks * st.f_frsize
        usable = st.f_bavail * st.f_frsize
        out.append((path, capacity, max(0, capacity - usable)))
    return out


async def describe_log_dirs_usage(
    host: str, port: int, timeout: float, login: UpstreamLogin | None = None
) -> list[Usage]:
    """One broker's log dirs, asked of that broker (each broker answers for its own disks)."""
    body: dict[str, Any] = {"topics": []}  # no partitions: the log dirs' totals only
    resp = await request(
        host, port, ApiKey.DESCRIBE_LOG_DIRS, DESCRIBE_LOG_DIRS_VERSION, body, timeout, login
    )
    code = int(resp.get("error_code", 0))
    if code:
        raise ConnectionError(f"DescribeLogDirs to {host}:{port} failed with error {code}")
    out: list[Usage] = []
    for result in resp.get("results") or []:
        if int(result.get("error_code", 0)):
            continue  # an offline log dir: the broker reports it, its partitions are elsewhere
        total, usable = int(result.get("total_bytes", -1)), int(result.get("usable_bytes", -1))
        if total <= 0 or usable < 0:
            raise ConnectionError(f"broker {host}:{port} does not report log dir sizes (KIP-827)")
        out.append((str(result["log_dir"]), total, max(0, min(total, total - usable))))
    if not out:
        raise ConnectionError(f"broker {host}:{port} reported no online log dir")
    return out
