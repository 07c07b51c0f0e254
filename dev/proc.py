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


def own_tcp_sockets() -> list[tuple[int, int, int]]:
    """This process's TCP sockets (IPv4 and IPv6, librdkafka's included), as (local port, remote
    port, TCP state) read from /proc/net."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as fh:
                rows = fh.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if fields[9] in inodes:
                local, remote = (int(address.rsplit(":", 1)[1], 16) for address in fields[1:3])
                found.append((local, remote, int(fields[3], 16)))
    return found


def own_tcp_connections_to(ports: set[int]) -> list[str]:
    """This process's TCP sockets connected to one of ``ports``, as "local port -> remote port
    (state)": after a test, a socket the test itself still holds explains a connection its proxy
    still counts."""
    return [
        f"{local} -> {remote} (state {state:#x})"
        for local, remote, state in own_tcp_sockets()
        if remote in ports
    ]
