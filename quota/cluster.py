"""Byte-rate quotas that hold across proxy instances (``scope: cluster``).

KIP-13 left cluster-wide quotas out: each broker enforced its own share. Here every instance
publishes, once per interval, the rate it measured for each cluster-scoped bucket (its own share of
the traffic), and reads the others'. A bucket's rate is then its local rate plus the fresh rates of
the other instances, and Kafka's throttle formula runs on that sum: with the same throttle applied
on every instance, each client's share slows by the same factor and the sum converges to the quota.

When the exchange cannot be trusted (this instance has not read its own report back within the
staleness: the topic is down or lagging), each instance falls back to ``quota / n``, ``n`` the
instances last seen live, and says so (``fallback``).

Sans-IO: reports are bytes in and out, times are passed in ms.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

Bucket = tuple[str, str]
PRODUCE_KIND, FETCH_KIND = "p", "f"
REPORT_VERSION = 1


class ReportError(ValueError):
    """A usage report that cannot be read: skipped (its instance then counts as silent)."""


@dataclass(frozen=True, slots=True)
class UsageReport:
    """One instance's rates per cluster-scoped bucket at ``at_ms`` (bytes per second)."""

    instance: str
    at_ms: float
    rates: tuple[tuple[str, str, str, float], ...]  # kind, user, client_id, rate

    def encode(self) -> bytes:
        doc = {
            "v": REPORT_VERSION,
            "instance": self.instance,
            "at_ms": int(self.at_ms),
            "rates": [[k, u, c, round(r, 1)] for k, u, c, r in self.rates],
        }
        return json.dumps(doc, separators=(",", ":")).encode()

    @staticmethod
    def decode(data: bytes) -> UsageReport:
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            raise ReportError(f"not JSON: {exc}") from exc
        if not isinstance(doc, dict) or doc.get("v") != REPORT_VERSION:
            raise ReportError(f"not a usage report of version {REPORT_VERSION}")
        instance, at_ms, rates = doc.get("instance"), doc.get("at_ms"), doc.get("rates")
        if not isinstance(instance, str) or not instance:
            raise ReportError("instance: must be a non-empty string")
        if not isinstance(at_ms, int) or isinstance(at_ms, bool):
            raise ReportError("at_ms: must be an integer")
        if not isinstance(rates, list):
            raise ReportError("rates: must be a list")
        out = []
        for i, item in enumerate(rates):
            ok = (
                isinstance(item, list)
                and len(item) == 4
                and item[0] in (PRODUCE_KIND, FETCH_KIND)
                and isinstance(item[1], str)
                and isinstance(item[2], str)
                and isinstance(item[3], int | float)
                and not isinstance(item[3], bool)
                and math.isfinite(item[3])
                and item[3] >= 0
            )
            if not ok:
                raise ReportError(f"rates[{i}]: must be [kind p|f, user, client_id, rate >= 0]")
            out.append((item[0], item[1], item[2], float(item[3])))
        return UsageReport(instance, float(at_ms), tuple(out))


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    instances: int  # live instances, this one included
    fallback: bool  # the exchange is not trusted: quota / instances applies
    own_lag_ms: float | None  # age of this instance's latest report read back (None: never)


class ClusterView(Protocol):
    """What ByteRateQuotas asks of the exchange (ClusterRates, or an adapter of its clock)."""

    def share(self, kind: str, bucket: Bucket, quota: float, local_rate: float, now_ms: float) -> float: ...


class ClusterRates:
    """The other instances' rates per bucket, and whether the exchange can be trusted."""

    def __init__(self, instance: str, staleness_ms: float, now_ms: float, assumed_instances: int = 1) -> None:
        self.instance = instance
        self.staleness_ms = staleness_ms
        self._started_ms = now_ms
        self._reports: dict[str, UsageReport] = {}  # other instances, latest
        self._remote: dict[tuple[str, Bucket], tuple[float, int]] = {}  # over fresh reports
        self._remote_at_ms = -math.inf  # when _remote was summed
        self._own_seen_ms: float | None = None  # SnapshotAt of our latest report read back
        self._own: dict[tuple[str, Bucket], float] = {}  # its rates, as the others read them
        self.round_trip_ms: float | None = None  # publish to read-back of the latest own report
        self._last_live = max(1, assumed_instances)  # until the exchange has told

    def reconfigure(self, staleness_ms: float) -> None:
        self.staleness_ms = staleness_ms
        self._remote_at_ms = -math.inf

    def update(self, report: UsageReport, now_ms: float | None = None) -> None:
        """A report read from the topic (this instance's own included: that proves the loop;
        ``now_ms`` then gives the exchange's round trip, ``round_trip_ms``)."""
        if report.instance == self.instance:
            if now_ms is not None:
                self.round_trip_ms = now_ms - report.at_ms
            if self._own_seen_ms is None or report.at_ms >= self._own_seen_ms:
                self._own_seen_ms = report.at_ms
                self._own = {(k, (u, c)): r for k, u, c, r in report.rates}
            return
        held = self._reports.get(report.instance)
        if held is None or report.at_ms >= held.at_ms:
            self._reports[report.instance] = report
            self._remote_at_ms = -math.inf

    def forget(self, instance: str) -> None:
        if self._reports.pop(instance, None) is not None:
            self._remote_at_ms = -math.inf

    def _fresh(self, report: UsageReport, now_ms: float) -> bool:
        return now_ms - report.at_ms <= self.staleness_ms

    def status(self, now_ms: float) -> ClusterStatus:
        live = 1 + sum(1 for r in self._reports.values() if self._fresh(r, now_ms))
        own = self._own_seen_ms
        lag = None if own is None else now_ms - own
        trusted = lag is not None and lag <= self.staleness_ms
        if trusted:
            self._last_live = live
        elif own is None and now_ms - self._started_ms <= self.staleness_ms:
            # Just started: the first report has not come back yet, nor maybe the others'.
            return ClusterStatus(max(live, self._last_live), False, lag)
        return ClusterStatus(live if trusted else self._last_live, not trusted, lag)

    def describe(self, now_ms: float) -> dict[str, object]:
        """For the admin endpoint: this instance, the exchange's health, the others' reports."""
        st = self.status(now_ms)
        return {
            "instance": self.instance,
            "instances": st.instances,
            "fallback": st.fallback,
            "own_lag_ms": st.own_lag_ms,
            "staleness_ms": self.staleness_ms,
            "others": [
                {
                    "instance": r.instance,
                    "age_ms": now_ms - r.at_ms,
                    "fresh": self._fresh(r, now_ms),
                    "rates": [list(x) for x in r.rates[:50]],
                    "buckets": len(r.rates),
                }
                for r in sorted(self._reports.values(), key=lambda r: r.instance)
            ],
        }

    def _totals(self, now_ms: float) -> dict[tuple[str, Bucket], tuple[float, int]]:
        """Per (kind, bucket): the other instances' fresh rates summed, and how many report it
        (recomputed at most every 100 ms)."""
        if now_ms - self._remote_at_ms > 100.0 or now_ms < self._remote_at_ms:
            totals: dict[tuple[str, Bucket], tuple[float, int]] = {}
            for report in self._reports.values():
                if not self._fresh(report, now_ms):
                    continue
                for k, user, client_id, rate in report.rates:
                    key = (k, (user, client_id))
                    total, count = totals.get(key, (0.0, 0))
                    totals[key] = (total + rate, count + 1)
            self._remote = totals
            self._remote_at_ms = now_ms
            stale = [i for i, r in self._reports.items() if now_ms - r.at_ms > 10 * self.staleness_ms]
            for instance in stale:  # long gone: drop, so the table stays bounded
                del self._reports[instance]
        return self._remote

    def remote_rate(self, kind: str, bucket: Bucket, now_ms: float) -> float:
        """The other instances' fresh rates for a bucket, summed."""
        return self._totals(now_ms).get((kind, bucket), (0.0, 0))[0]

    def share(self, kind: str, bucket: Bucket, quota: float, local_rate: float, now_ms: float) -> float:
        """This instance's part of a cluster quota, enforced on its local rate.

        Fallback (exchange not trusted): quota / instances. Else, with d the rates of the
        instances serving the bucket as last reported (this one's too: every instance computes
        from the same figures, so the parts sum to the quota), n of them,
        and a margin m = quota / (4 n): quota x (d_self + m) / (sum d + n m). The parts sum to
        the quota; an instance whose clients want less than its part gives the rest to the others,
        and when all want more the parts converge to quota / n (each step moves a fifth of the
        way). Enforcing a part on the local rate keeps the throttle as immediate as Kafka's own,
        where throttling the summed rate would react to the others' bursts a report late.
        """
        status = self.status(now_ms)
        if status.fallback:
            return quota / status.instances
        if self._own_seen_ms is None:  # no report has come back yet: assume the others exist
            return quota / status.instances
        others, count = self._totals(now_ms).get((kind, bucket), (0.0, 0))
        if count == 0:
            return quota
        n = count + 1
        margin = quota / (4 * n)
        mine = self._own.get((kind, bucket), 0.0)
        return quota * (mine + margin) / (others + mine + n * margin)


def report(instance: str, now_ms: float, rates: Iterable[tuple[str, Bucket, float]]) -> UsageReport:
    """This instance's report from (kind, bucket, rate) of its cluster-scoped buckets."""
    return UsageReport(instance, now_ms, tuple((k, b[0], b[1], r) for k, b, r in rates if r > 0))
