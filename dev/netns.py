"""A network namespace joined to this one by a veth pair, so a test can cut the network between
a broker inside it and the proxy and clients outside, and heal it (Linux, root, iproute2).

Cutting takes the inner end of the pair down: packets to and from the namespace are dropped
silently, as with a pulled cable (no reset, no "unreachable"), and connections stay open on
both sides until someone's timeout notices. Healing brings it back up; open connections that
survived their timeouts carry on.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import subprocess
import uuid
from types import TracebackType


class NetnsUnavailable(RuntimeError):
    """Network namespaces cannot be made here (not root, no iproute2, or a restricted kernel)."""


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if proc.returncode != 0:
        raise NetnsUnavailable(f"ip {' '.join(args)}: {proc.stderr.strip() or proc.returncode}")


class NetworkNamespace:
    """``with NetworkNamespace() as ns``: ``ns.inner_address`` is reachable from here until
    ``ns.cut()``; ``ns.exec_prefix()`` runs a command inside. Everything is removed on exit."""

    def __init__(self) -> None:
        if os.geteuid() != 0:
            raise NetnsUnavailable("network namespaces need root")
        if shutil.which("ip") is None:
            raise NetnsUnavailable("no `ip` command (iproute2)")
        tag = uuid.uuid4().hex[:6]
        self.name = f"kthrottle-{tag}"
        self.outer_link, self.inner_link = f"kto{tag}", f"kti{tag}"  # at most 15 characters
        subnet = random.randrange(1, 255)
        self.outer_address, self.inner_address = f"10.231.{subnet}.1", f"10.231.{subnet}.2"
        self._made: list[str] = []

    def __enter__(self) -> NetworkNamespace:
        try:
            _ip("netns", "add", self.name)
            self._made.append("netns")
            _ip("link", "add", self.outer_link, "type", "veth", "peer", "name", self.inner_link)
            self._made.append("link")
            _ip("link", "set", self.inner_link, "netns", self.name)
            _ip("addr", "add", f"{self.outer_address}/24", "dev", self.outer_link)
            _ip("link", "set", self.outer_link, "up")
            _ip("-n", self.name, "addr", "add", f"{self.inner_address}/24", "dev", self.inner_link)
            _ip("-n", self.name, "link", "set", self.inner_link, "up")
            _ip("-n", self.name, "link", "set", "lo", "up")
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.remove()

    def exec_prefix(self) -> list[str]:
        """Put before a command to run it inside (``ip netns exec`` execs it: the pid is its own)."""
        return ["ip", "netns", "exec", self.name]

    def cut(self) -> None:
        _ip("-n", self.name, "link", "set", self.inner_link, "down")

    def heal(self) -> None:
        _ip("-n", self.name, "link", "set", self.inner_link, "up")

    def remove(self) -> None:
        """Delete the pair and the namespace (idempotent; processes inside should be gone first)."""
        if "link" in self._made:
            with contextlib.suppress(NetnsUnavailable):
                _ip("link", "del", self.outer_link)  # takes its peer with it
        if "netns" in self._made:
            with contextlib.suppress(NetnsUnavailable):
                _ip("netns", "del", self.name)
        self._made.clear()
