"""A counter of the quota rules in force, raised at each change (a reload, the exchange joined).

Each connection reads it per request to know whether what it resolved from the rules (its
stages, its exemptions and client id policy) still holds. Compiled, that read is a native
attribute of a native object; off the enforcer, an interpreted class, it was a dictionary lookup.
"""

from __future__ import annotations


class Generation:
    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def advance(self) -> None:
        self.value += 1
