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


def own_tcp_connections_to(ports: set[int]) -> list[str]:
    """This process's TCP sockets connected to one of ``ports`` (IPv4 and IPv6), as "local port ->
    remote port (state)": after a test, a socket the test itself still holds explains a connection
    its proxy still counts."""
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
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            remote_port = int(remote.rsplit(":", 1)[1], 16)
            if inode in inodes and remote_port in ports:
                local_port = int(local.rsplit(":", 1)[1], 16)
                found.append(f"{local_port} -> {remote_port} (state {int(state, 16):#x})")
    return found
