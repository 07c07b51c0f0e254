"""What gateway replicas tell each other through the exchange topic, as bytes. Sans-IO.

Two kinds of record share the topic:

- A usage report (``UsageReport``), published by every replica a few times a second: what its
  clients used of each cluster-wide quota since its previous report (bytes per client bucket and
  per partition, new producer ids), plus what the others need to know of it (whether it can
  trust the exchange, where its admin endpoint answers a liveness probe). Reports are columnar
  and compressed, so 10,000 active entities cost a few milliseconds to write or read.
- A mutation record (``MutationRecord``), one per CreateTopics, CreatePartitions or DeleteTopics
  a replica admits under a cluster-wide ``controller_mutation_rate``: every replica applies them in
  the topic's order, so all decide as the one controller would (quota/cluster_mutations.py).

Version 1 reports (JSON rates per bucket, the previous release) are still read: their rates are
turned into usage over the time since that replica's previous report.
"""

from __future__ import annotations

import json
import math
import re
import struct
import sys
import zlib
from array import array
from dataclasses import dataclass, field
from itertools import accumulate, filterfalse

# Kinds of usage entry: (first, second) name the entity or the partition.
PRODUCE = "p"  # (user, client-id) bucket, produced bytes
FETCH = "f"  # (user, client-id) bucket, fetched bytes
PRODUCE_PARTITION = "P"  # (topic, partition), produced bytes (KIP-1010)
FETCH_PARTITION = "F"  # (topic, partition), fetched bytes
PRODUCER_ID = "i"  # (user, producer id): a producer id new to this replica (KIP-936)
# What an entry's flags say of the sender's clients of that bucket, lately.
BLOCKED = 1  # held back by the shared bucket: they want more than they get
CAPPED = 2  # held at the sender's fair part of the quota (quota/manager.py ``_fair_ms``)
KINDS = frozenset({PRODUCE, FETCH, PRODUCE_PARTITION, FETCH_PARTITION, PRODUCER_ID})
# Kinds whose second name is a number (a partition, a producer id), as ``str(int)`` writes it.
NUMBERED = frozenset({PRODUCE_PARTITION, FETCH_PARTITION, PRODUCER_ID})
_NUMBER = re.compile(r"-?[0-9]{1,20}")

MAGIC = b"KTX"
USAGE_V2 = 2
MUTATION_V2 = 3
_HEADER = struct.Struct(">3sBI")  # magic, version, length of the JSON head that follows


class ReportError(ValueError):
    """A record of the exchange that cannot be read: skipped, counted and logged."""


@dataclass(slots=True)
class UsageReport:
    """One replica's usage since its previous report, and its state."""

    instance: str
    seq: int  # 1, 2, ... per replica process; a gap means reports were missed
    at_ms: float  # the replica's wall clock when it made the report
    address: str | None = None  # host:port of its admin endpoint (the liveness probe), if any
    fallback: bool = False  # it cannot trust the exchange now and holds quota / replicas alone
    leaving: bool = False  # it is shutting down: forget it at once
    kinds: list[str] = field(default_factory=list)  # one character per entry
    firsts: list[str] = field(default_factory=list)
    seconds: list[str] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    # BLOCKED | CAPPED: the sender's clients of this entry were throttled lately, and by what
    # (the replicas whose clients want more share the quota equally).
    flags: list[int] = field(default_factory=list)
    legacy_rates: bool = False  # version 1: values are rates (per second), not usage
    # Random per process: a replica restarted under the same instance name counts its reports
    # from 1 again, and is told apart from the process it replaces.
    incarnation: str = ""

    def __len__(self) -> int:
        return len(self.kinds)

    def add(self, kind: str, first: str, second: str, value: float, flags: int = 0) -> None:
        self.kinds.append(kind)
        self.firsts.append(first)
        self.seconds.append(second)
        self.values.append(value)
        self.flags.append(flags)

    def grouped(self) -> dict[str, tuple[list[tuple[str, str]], list[float], list[int]]]:
        """Per kind: the entries' (first, second) keys, values and flags, in order (a report of
        one kind, the usual, is split in C: 10,000 entries in well under a millisecond)."""
        kinds = set(self.kinds)
        if len(kinds) == 1:
            return {kinds.pop(): (list(zip(self.firsts, self.seconds, strict=True)), self.values, self.flags)}
        out: dict[str, tuple[list[tuple[str, str]], list[float], list[int]]] = {}
        for kind, first, second, value, flags in zip(
            self.kinds, self.firsts, self.seconds, self.values, self.flags, strict=True
        ):
            group = out.get(kind)
            if group is None:
                group = out[kind] = ([], [], [])
            group[0].append((first, second))
            group[1].append(value)
            group[2].append(flags)
        return out

    def extend(self, kind: str, keys: list[tuple[str, str]], values: list[float], flags: list[int]) -> None:
        """Many entries of one kind at once (``add`` for a whole table)."""
        self.kinds.extend(kind * len(keys))
        self.firsts.extend(k[0] for k in keys)
        self.seconds.extend(k[1] for k in keys)
        self.values.extend(values)
        self.flags.extend(flags)

    def entries(self) -> list[tuple[str, str, str, float]]:
        return list(zip(self.kinds, self.firsts, self.seconds, self.values, strict=True))

    def encode(self) -> bytes:
        strings = [*self.firsts, *self.seconds]
        joined = "\0".join(strings)
        # Names split on NUL, unless a name holds one (a client id can): then their lengths.
        separated = joined.count("\0") == max(0, len(strings) - 1)
        head = {
            "instance": self.instance,
            "seq": self.seq,
            "incarnation": self.incarnation,
            "at_ms": int(self.at_ms),
            "address": self.address,
            "fallback": self.fallback,
            "leaving": self.leaving,
            "n": len(self.kinds),
            "names": "nul" if separated else "lengths",
        }
        head_bytes = json.dumps(head, separators=(",", ":")).encode()
        blob = (joined if separated else "".join(strings)).encode("utf-8", "surrogatepass")
        lengths = b"" if separated else _little(array("I", map(len, strings))).tobytes()
        body = b"".join(
            (
                "".join(self.kinds).encode("ascii"),
                struct.pack(">I", len(blob)),
                blob,
                lengths,
                _little(array("d", self.values)).tobytes(),
                bytes(self.flags),
            )
        )
        return _HEADER.pack(MAGIC, USAGE_V2, len(head_bytes)) + head_bytes + zlib.compress(body, 1)


@dataclass(frozen=True, slots=True)
class MutationRecord:
    """A mutation request a replica asks all replicas to admit in the topic's order.

    ``quota`` and ``burst_seconds`` are the asking replica's, so every replica replays the same
    bucket whatever config it has loaded; ``refund`` gives back what the broker refused."""

    instance: str
    request: int  # unique per replica: how the asking replica finds its answer
    user: str
    client_id: str
    bucket: tuple[str, str]
    costs: tuple[int, ...]
    strict: bool
    quota: float
    burst_seconds: float
    refund: int = 0  # > 0: give back this many partitions' tokens, admit nothing

    def encode(self) -> bytes:
        doc = {
            "instance": self.instance,
            "request": self.request,
            "user": self.user,
            "client_id": self.client_id,
            "bucket": list(self.bucket),
            "costs": list(self.costs),
            "strict": self.strict,
            "quota": self.quota,
            "burst_seconds": self.burst_seconds,
            "refund": self.refund,
        }
        head = json.dumps(doc, separators=(",", ":")).encode()
        return _HEADER.pack(MAGIC, MUTATION_V2, len(head)) + head


def _little(values: array[int] | array[float]) -> array[int] | array[float]:
    """The array in little-endian order whatever this machine's is (the wire is little-endian)."""
    if sys.byteorder != "little":
        values = array(values.typecode, values)
        values.byteswap()
    return values


def decode_record(data: bytes) -> UsageReport | MutationRecord:
    """A record's value read back: a usage report (version 2, or version 1 JSON) or a mutation;
    ``ReportError`` on any problem, so a record is applied whole or not at all."""
    try:
        return _decode_record(data)
    except (OverflowError, RecursionError) as exc:  # a number past a float's range, JSON too deep
        raise ReportError(f"unusable: {exc}") from exc


def _decode_record(data: bytes) -> UsageReport | MutationRecord:
    if data[:1] == b"{":
        return _decode_v1(data)
    if len(data) < _HEADER.size:
        raise ReportError(f"{len(data)} bytes: too short for a record of the exchange")
    magic, version, head_len = _HEADER.unpack_from(data)
    if magic != MAGIC:
        raise ReportError("not a record of the kthrottle exchange")
    start = _HEADER.size
    try:
        head = json.loads(data[start : start + head_len])
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReportError(f"unreadable head: {exc}") from exc
    if not isinstance(head, dict):
        raise ReportError("unreadable head: not an object")
    if version == USAGE_V2:
        return _decode_usage(head, data[start + head_len :])
    if version == MUTATION_V2:
        return _decode_mutation(head)
    raise ReportError(f"version {version} is newer than this release reads (it reads 1 to {MUTATION_V2})")


def _text(head: dict[str, object], key: str, empty: bool = False) -> str:
    value = head.get(key)
    if not isinstance(value, str) or (not empty and not value):
        raise ReportError(f"{key}: must be a{'' if empty else ' non-empty'} string")
    return value


def _integer(head: dict[str, object], key: str) -> int:
    value = head.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ReportError(f"{key}: must be an integer")
    return value


def _decode_usage(head: dict[str, object], compressed: bytes) -> UsageReport:
    instance = _text(head, "instance")
    seq, at_ms, n = _integer(head, "seq"), _integer(head, "at_ms"), _integer(head, "n")
    address = head.get("address")
    if address is not None and not isinstance(address, str):
        raise ReportError("address: must be a string or null")
    incarnation = head.get("incarnation", "")
    if not isinstance(incarnation, str):
        raise ReportError("incarnation: must be a string")
    try:
        body = zlib.decompress(compressed)
    except zlib.error as exc:
        raise ReportError(f"body: {exc}") from exc
    separated = head.get("names", "lengths") == "nul"
    try:
        kinds = body[:n].decode("ascii")
        (blob_len,) = struct.unpack_from(">I", body, n)
        at = n + 4
        blob = body[at : at + blob_len].decode("utf-8", "surrogatepass")
        at += blob_len
        lengths = array("I")
        if not separated:
            lengths.frombytes(body[at : at + 2 * n * lengths.itemsize])
            at += 2 * n * lengths.itemsize
        values = array("d")
        values.frombytes(body[at : at + n * values.itemsize])
        at += n * values.itemsize
        flags = body[at : at + n]
        at += n
    except (struct.error, UnicodeDecodeError, ValueError) as exc:
        raise ReportError(f"body: {exc}") from exc
    if sys.byteorder != "little":
        lengths.byteswap()
        values.byteswap()
    sizes = (len(kinds), len(values), len(flags))
    if at != len(body) or sizes != (n,) * 3:
        raise ReportError(f"body: not {n} entries")
    if not KINDS.issuperset(kinds):
        raise ReportError(f"body: unknown entry kind in {sorted(set(kinds) - KINDS)}")
    if separated:
        strings = blob.split("\0") if n else []
    else:
        ends = list(accumulate(lengths))
        if len(ends) != 2 * n or (ends[-1] if ends else 0) != len(blob):
            raise ReportError("body: names do not add up")
        starts = [0, *ends[:-1]] if ends else []
        strings = [blob[a:b] for a, b in zip(starts, ends, strict=True)]
    if len(strings) != 2 * n:
        raise ReportError("body: names do not add up")
    if not NUMBERED.isdisjoint(kinds):
        seconds = strings[n:]
        if not NUMBERED.issuperset(kinds):
            seconds = [s for k, s in zip(kinds, seconds, strict=True) if k in NUMBERED]
        bad = next(filterfalse(_NUMBER.fullmatch, seconds), None)
        if bad is not None:
            raise ReportError(f"body: {bad[:40]!r} is not a partition or producer id")
    floats = values.tolist()
    if not math.isfinite(sum(floats)):  # any inf or NaN makes the sum so (or a sum past 1e308)
        raise ReportError("body: a value is not finite")
    return UsageReport(
        instance,
        seq,
        float(at_ms),
        address,
        head.get("fallback") is True,
        head.get("leaving") is True,
        list(kinds),
        strings[:n],
        strings[n:],
        floats,
        list(flags),
        incarnation=incarnation,
    )


def _decode_mutation(head: dict[str, object]) -> MutationRecord:
    bucket, costs = head.get("bucket"), head.get("costs")
    if not (isinstance(bucket, list) and len(bucket) == 2 and all(isinstance(b, str) for b in bucket)):
        raise ReportError("bucket: must be [user, client_id]")
    if not (isinstance(costs, list) and all(isinstance(c, int) and c >= 0 for c in costs)):
        raise ReportError("costs: must be a list of partition counts")
    quota, burst = head.get("quota"), head.get("burst_seconds")
    for name, value in (("quota", quota), ("burst_seconds", burst)):
        if not isinstance(value, int | float) or isinstance(value, bool) or not value > 0:
            raise ReportError(f"{name}: must be a positive number")
        if not math.isfinite(value):
            raise ReportError(f"{name}: must be finite")
    assert isinstance(quota, int | float) and isinstance(burst, int | float)
    if not math.isfinite(float(quota) * float(burst)):  # the bucket's size: both finite, yet past 1e308
        raise ReportError("quota x burst_seconds: must be finite")
    refund = _integer(head, "refund")
    return MutationRecord(
        _text(head, "instance"),
        _integer(head, "request"),
        _text(head, "user", empty=True),
        _text(head, "client_id", empty=True),
        (bucket[0], bucket[1]),
        tuple(costs),
        head.get("strict") is True,
        float(quota),
        float(burst),
        max(0, refund),
    )


def _decode_v1(data: bytes) -> UsageReport:
    """The previous release's report: rates (bytes per second) per client bucket."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ReportError(f"not JSON: {exc}") from exc
    if not isinstance(doc, dict) or doc.get("v") != 1:
        raise ReportError("not a usage report of version 1")
    instance, rates = _text(doc, "instance"), doc.get("rates")
    at_ms = _integer(doc, "at_ms")
    if not isinstance(rates, list):
        raise ReportError("rates: must be a list")
    report = UsageReport(instance, 0, float(at_ms), legacy_rates=True)  # no flags
    for i, item in enumerate(rates):
        ok = (
            isinstance(item, list)
            and len(item) == 4
            and item[0] in (PRODUCE, FETCH)
            and isinstance(item[1], str)
            and isinstance(item[2], str)
            and isinstance(item[3], int | float)
            and not isinstance(item[3], bool)
            and math.isfinite(item[3])
            and item[3] >= 0
        )
        if not ok:
            raise ReportError(f"rates[{i}]: must be [kind p|f, user, client_id, rate >= 0]")
        report.add(item[0], item[1], item[2], float(item[3]))
    return report
