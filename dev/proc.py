"""What a process holds, read from /proc (Linux): its resident memory and open descriptors.
Tests and benchmarks use these to check the proxy gives back what it took."""

from __future__ import annotations

import os


def rss_bytes(pid: int) -> int:
    """Resident set size of ``pid``, in bytes."""
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def open_fds(pid: int) -> int:
    """Descriptors ``pid`` has open."""
    return len(os.listdir(f"/proc/{pid}/fd"))
