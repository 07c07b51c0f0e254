"""Which stages see a request: resolved once per key and version, and again after a reconfigure."""

from __future__ import annotations

from collections.abc import Collection

from proxy.metrics import ProxyMetrics
from proxy.pipeline.stages.base import Stage
from proxy.pipeline.stages.chain import StageChain
from proxy.shared.throttling import QuotaEnforcer
from quota.config import QuotaConfig


class _Keyed(Stage):
    """Asks for the keys in ``wanted`` as they are when the chain resolves them."""

    def __init__(self, wanted: set[int]) -> None:
        self.wanted = wanted

    def request_keys(self) -> Collection[int]:
        return set(self.wanted)


def test_the_stages_of_a_key_follow_a_reconfigure_even_for_the_key_asked_last() -> None:
    enforcer = QuotaEnforcer(QuotaConfig.model_validate({}), ProxyMetrics(), clock=lambda: 0.0)
    wanted = {0}
    produce, both = _Keyed(wanted), _Keyed({0, 1})
    chain = StageChain([produce, both], enforcer)
    assert chain.for_request(0, 9) == (produce, both)
    assert chain.for_request(0, 9) == (produce, both)  # asked again: the same
    assert chain.for_request(1, 12) == (both,)
    assert chain.for_request(0, 10) == (produce, both)
    wanted.discard(0)
    assert chain.for_request(0, 10) == (produce, both)  # resolved once, until a reconfigure
    enforcer.reconfigure(QuotaConfig.model_validate({}))
    assert chain.for_request(0, 10) == (both,)
    assert chain.for_request(2, 0) == ()
