"""``connection_creation_rate`` per client IP (KIP-612), sans-IO: every call takes the time in ms.

As Kafka's ConnectionQuotas does it:

- The quota of an IP is its own entry, else the ``<default>`` IP entry, else none (no state kept).
- Each IP has its own rate, also under the default quota: one IP's storm never throttles another.
- Each accepted connection records 1 into the IP's rate, then the rate is checked. On a violation
  the connection is un-recorded (it will not be served, so it should not count) and the throttle
  is Kafka's formula capped at one window sample (``quota.window.size.seconds``).
- A throttled connection is accepted at the TCP level but never served: Kafka does not read from
  it and closes it once the throttle time has passed, which holds the client back for that long
  instead of letting it reconnect at once. Doing that is the caller's part.

IPs are compared as addresses, not strings ('::ffff:10.0.0.7' is 10.0.0.7, as Java's InetAddress
has it). Kafka resolves host names in the config; this module does no I/O, so only IP literals
and ``<default>`` ever match.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass

from quota.config import QuotaConfig
from quota.idle import drop_idle
from quota.keys import DEFAULT
from quota.rate import SampledRate, throttle_time_ms


def canonical_ip(ip: str) -> str:
    """One spelling per address; a string that is not an IP literal is returned as it is."""
    try:
        address = ipaddress.ip_address(ip)
    except ValueError:
        return ip
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)


@dataclass(frozen=True, slots=True)
class ConnectionDecision:
    """throttle_ms > 0: do not serve the connection, close it after that long. ``rate`` is the
    IP's rate with this connection counted; ``quota`` None means no quota applies to the IP."""

    throttle_ms: int
    rate: float
    quota: float | None

    @property
    def throttled(self) -> bool:
        return self.throttle_ms > 0


class ConnectionRateQuotas:
    """Connection creation rates of the client IPs under a quota."""

    def __init__(self, cfg: QuotaConfig, now_ms: float) -> None:
        self.window = cfg.window.quota_window()
        self.rates: dict[str, SampledRate] = {}
        self._last_expiry_ms = now_ms
        self._apply(cfg)

    def _apply(self, cfg: QuotaConfig) -> None:
        self.cfg = cfg
        quotas = {
            canonical_ip(name): q.connection_creation_rate
            for name, q in cfg.ips.items()
            if q.connection_creation_rate is not None
        }
        self._default = quotas.pop(DEFAULT, None)
        self._quotas = quotas
        self.active = self._default is not None or bool(quotas)

    def reconfigure(self, cfg: QuotaConfig) -> None:
        """Apply a new config; rates are kept unless the window changed (Kafka keeps its sensors)."""
        window = cfg.window.quota_window()
        if window != self.window:
            self.window = window
            self.rates.clear()
        self._apply(cfg)

    def quota(self, ip: str) -> float | None:
        """The IP's own quota, else the <default> one (Kafka's connectionRateForIp)."""
        return self._quotas.get(canonical_ip(ip), self._default)

    def _max_throttle_ms(self) -> int:
        return int(self.window.size_ms)  # Kafka: quotaWindowSizeSeconds in ms

    def on_accept(self, ip: str, now_ms: float) -> ConnectionDecision:
        """Count a new connection from ``ip`` and decide; a throttled one is taken back out."""
        key = canonical_ip(ip)
        quota = self._quotas.get(key, self._default)
        if quota is None:
            self.maybe_expire(now_ms)
            return ConnectionDecision(0, 0.0, None)
        rate = self.rates.get(key)
        if rate is None:
            rate = self.rates[key] = SampledRate(self.window, now_ms)
        rate.record(1.0, now_ms)
        measured = rate.measure(now_ms)
        throttle = min(throttle_time_ms(measured, quota, rate.window_ms(now_ms)), self._max_throttle_ms())
        if throttle > 0:
            rate.unrecord(1.0, now_ms)
            rate.throttled_ms += throttle
        self.maybe_expire(now_ms)
        return ConnectionDecision(throttle, measured, quota)

    def state(self, ip: str, now_ms: float) -> dict[str, object]:
        """The IP's quota, where it comes from and its rate, for the admin API; creates nothing."""
        key = canonical_ip(ip)
        source = "ip" if key in self._quotas else ("default" if self._default is not None else None)
        rate = self.rates.get(key)
        return {
            "ip": key,
            "quota": self._quotas.get(key, self._default),
            "source": source,
            "rate": rate.measure(now_ms) if rate is not None else 0.0,
            "throttle_ms_total": rate.throttled_ms if rate is not None else 0.0,
        }

    def snapshot(self, now_ms: float) -> list[tuple[str, float, float]]:
        """(ip, rate, throttle ms so far) of every IP with state, for metrics."""
        return [(ip, rate.measure(now_ms), rate.throttled_ms) for ip, rate in self.rates.items()]

    def maybe_expire(self, now_ms: float) -> int:
        """Drop IPs idle for ``idle_expiry_seconds`` (Kafka: one hour); at most once a window sample."""
        if now_ms - self._last_expiry_ms < self.window.size_ms:
            return 0
        self._last_expiry_ms = now_ms
        return drop_idle(self.rates, now_ms - self.cfg.idle_expiry_seconds * 1000.0)
