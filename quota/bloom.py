"""Bloom filters of producer ids, and KIP-936's time-controlled pair of them. Sans-IO.

A filter answers "seen this producer id before?" in fixed memory, wrongly "yes" with a small
probability and never wrongly "no". Sizing follows the standard formulas: for a target
false-positive rate p, k = ceil(-log2 p) hash functions, and m bits hold n = m (ln 2)^2 / -ln p
ids before the rate passes p (the filter's ``capacity``). Past that it keeps working, but more and
more new ids look known, so counts made with it become a lower bound.

Positions come from one splitmix64 mix of the id and the seed, split in two halves for double
hashing (Kirsch-Mitzenmacher: g_i = h1 + i * h2 mod m, h2 odd). The seed is injected so that runs
are reproducible and a client cannot aim ids at positions it cannot know.
"""

from __future__ import annotations

import math

_M64 = (1 << 64) - 1


def mix64(x: int) -> int:
    """splitmix64's finaliser: a fast bijective mix of a 64-bit integer."""
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


def hash_count(false_positive_rate: float) -> int:
    """k = ceil(-log2 p): the optimal number of hash functions at a filter's capacity."""
    if not 0.0 < false_positive_rate < 1.0:
        raise ValueError(f"false_positive_rate must be in (0, 1), not {false_positive_rate}")
    return max(1, math.ceil(-math.log2(false_positive_rate)))


def capacity_of(bits: int, false_positive_rate: float) -> int:
    """n = m (ln 2)^2 / -ln p: how many ids m bits hold before the false-positive rate passes p."""
    return int(bits * math.log(2) ** 2 / -math.log(false_positive_rate))


class BloomFilter:
    """A classic bloom filter of 64-bit producer ids over a bytearray of ``nbytes``."""

    __slots__ = ("_bits", "_key", "_range", "bits", "capacity", "count", "false_positive_rate", "hashes")

    def __init__(self, nbytes: int, false_positive_rate: float, seed: int = 0) -> None:
        if nbytes < 1:
            raise ValueError(f"a bloom filter needs at least one byte, not {nbytes}")
        self._bits = bytearray(nbytes)
        self.bits = nbytes * 8
        self.false_positive_rate = false_positive_rate
        self.hashes = hash_count(false_positive_rate)
        self.capacity = capacity_of(self.bits, false_positive_rate)
        self.count = 0  # ids added (each add of an id not already present counts once)
        self._key = mix64(seed & _M64)
        self._range = range(self.hashes)

    @property
    def nbytes(self) -> int:
        return len(self._bits)

    def geometry(self) -> tuple[int, int, int]:
        """Filters with equal geometry put an id at the same positions: one computation serves both."""
        return (self.bits, self.hashes, self._key)

    def positions(self, pid: int) -> list[int]:
        h = mix64((pid & _M64) ^ self._key)
        h1, h2, m = h >> 32, (h & 0xFFFFFFFF) | 1, self.bits
        out = []
        for _ in self._range:
            out.append(h1 % m)
            h1 += h2
        return out

    def has(self, positions: list[int]) -> bool:
        bits = self._bits
        for i in positions:  # noqa: SIM110 - a loop is a third faster than all() over a generator
            if not bits[i >> 3] >> (i & 7) & 1:
                return False
        return True

    def put(self, positions: list[int]) -> None:
        bits = self._bits
        for i in positions:
            bits[i >> 3] |= 1 << (i & 7)
        self.count += 1

    def add(self, pid: int) -> None:
        self.put(self.positions(pid))

    def __contains__(self, pid: int) -> bool:
        return self.has(self.positions(pid))

    def fill_ratio(self) -> float:
        """Share of bits set; the false-positive rate now is about this to the power ``hashes``."""
        return sum(b.bit_count() for b in self._bits) / self.bits


class TimedBloomFilter:
    """KIP-936's TimedBloomFilter: at most two filters of one user, the newest written, both read.

    The first filter starts with the user's first producer id. A new one starts with the first id
    seen once the newest is half a window old, and a filter is dropped once it is a full window
    old; so at most two are ever live (when one starts the other is at least half a window old,
    any older one at least a whole window). An id observed at t is remembered at least until
    t + window / 2 and at most until t + window; observing it again re-adds it to the newest
    filter, so an id used at least every half window is never new again however long it lives.

    Each filter gets half of ``max_bytes``, so the pair never holds more than ``max_bytes``.
    """

    __slots__ = ("_filters", "_last_pid", "false_positive_rate", "max_bytes", "seed", "window_ms")

    def __init__(
        self, window_ms: float, max_bytes: int, false_positive_rate: float, now_ms: float, seed: int = 0
    ) -> None:
        if window_ms <= 0:
            raise ValueError(f"window_ms must be positive, not {window_ms}")
        self.window_ms = window_ms
        self.max_bytes = max_bytes
        self.false_positive_rate = false_positive_rate
        self.seed = seed
        self._filters: list[tuple[float, BloomFilter]] = []  # (created ms, filter), oldest first
        self._last_pid: int | None = None  # known to be in the newest filter: the common repeat is free
        self._start(now_ms)

    def configure(self, max_bytes: int, false_positive_rate: float) -> None:
        """New sizing for filters started from now on; live filters keep theirs until dropped."""
        self.max_bytes = max_bytes
        self.false_positive_rate = false_positive_rate

    def _start(self, now_ms: float) -> None:
        bloom = BloomFilter(max(1, self.max_bytes // 2), self.false_positive_rate, self.seed)
        self._filters.append((now_ms, bloom))
        self._last_pid = None

    def expire(self, now_ms: float) -> int:
        """Drop filters a full window old; returns how many."""
        filters = self._filters
        dropped = 0
        while filters and now_ms - filters[0][0] >= self.window_ms:
            del filters[0]
            dropped += 1
        if not filters:
            self._last_pid = None
        return dropped

    def observe(self, pid: int, now_ms: float) -> bool:
        """Note that ``pid`` was used now; True when no live filter held it (a new id)."""
        filters = self._filters
        if not filters or now_ms - filters[-1][0] >= self.window_ms / 2:
            self.expire(now_ms)
            self._start(now_ms)
        elif now_ms - filters[0][0] >= self.window_ms:
            self.expire(now_ms)  # only the older one can be a window old here; the newest stays
        if pid == self._last_pid:
            return False
        newest = filters[-1][1]
        positions = newest.positions(pid)
        if newest.has(positions):
            self._last_pid = pid
            return False
        seen = False
        if len(filters) > 1:
            older = filters[0][1]
            same = older.geometry() == newest.geometry()
            seen = older.has(positions if same else older.positions(pid))
        newest.put(positions)  # written only to the newest, also when the older one knew it
        self._last_pid = pid
        return not seen

    def __contains__(self, pid: int) -> bool:
        """Whether a filter still held holds ``pid`` (does not rotate or expire anything)."""
        return any(pid in bloom for _, bloom in self._filters)

    def expired(self, now_ms: float) -> bool:
        """No live filter is left: the user's ids are all forgotten and the pair can be dropped."""
        return all(now_ms - created >= self.window_ms for created, _ in self._filters)

    @property
    def empty(self) -> bool:
        return not self._filters

    @property
    def nbytes(self) -> int:
        """Memory held by the filters now (expired ones count until dropped)."""
        return sum(bloom.nbytes for _, bloom in self._filters)

    @property
    def capacity(self) -> int:
        """Ids one filter of the current sizing holds at the configured false-positive rate."""
        return capacity_of(max(1, self.max_bytes // 2) * 8, self.false_positive_rate)

    @property
    def hashes(self) -> int:
        return hash_count(self.false_positive_rate)

    def filters(self) -> list[tuple[float, BloomFilter]]:
        """(created ms, filter) of each filter held, oldest first: for the admin API and tests."""
        return list(self._filters)
