"""Which quota applies to a (user, client-id), and who shares its bucket (KIP-55).

Levels, most specific first, as Kafka's DefaultQuotaCallback walks them:
1 (user, client-id)  2 (user, <default> client)  3 user  4 (<default> user, client-id)
5 (<default> user, <default> client)  6 <default> user  7 client-id  8 <default> client-id.

The matched level decides the bucket: at levels 1, 2, 4, 5 each (user, client-id) pair has its
own; at 3 and 6 all clients of a user share one; at 7 and 8 each client id has one, across users.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from quota.keys import DEFAULT

if TYPE_CHECKING:  # at run time any object with these attributes (quota.plain_config)
    from quota.config import ClientQuotas, QuotaConfig

Bucket = tuple[str, str]  # (user, client-id), "" where the level does not split by it


@dataclass(frozen=True, slots=True)
class Match:
    level: int
    bucket: Bucket
    quota: float
    scope: str | None = None  # the entity's scope: "instance", "cluster", or None (the default)


def _levels(cfg: QuotaConfig, user: str, client_id: str) -> list[tuple[int, ClientQuotas | None, Bucket]]:
    users = cfg.users
    exact_user = users.get(user)
    default_user = users.get(DEFAULT)
    return [
        (1, exact_user.clients.get(client_id) if exact_user else None, (user, client_id)),
        (2, exact_user.clients.get(DEFAULT) if exact_user else None, (user, client_id)),
        (3, exact_user, (user, "")),
        (4, default_user.clients.get(client_id) if default_user else None, (user, client_id)),
        (5, default_user.clients.get(DEFAULT) if default_user else None, (user, client_id)),
        (6, default_user, (user, "")),
        (7, cfg.clients.get(client_id), ("", client_id)),
        (8, cfg.clients.get(DEFAULT), ("", client_id)),
    ]


def resolve(cfg: QuotaConfig, user: str, client_id: str, key: str) -> Match | None:
    """The quota of kind ``key`` for this user and client id, or None when none applies.

    A user or client literally named '<default>' cannot be told from the default entity, as in
    Kafka, where that name is reserved.
    """
    for level, quotas, bucket in _levels(cfg, user, client_id):
        if quotas is not None:
            value = quotas.get(key)
            if value is not None:
                return Match(level, bucket, value, quotas.scope)
    return None


def any_entity_quota(cfg: QuotaConfig, key: str) -> bool:
    """Whether any user, client id or (user, client-id) has a quota of kind ``key``: when none
    does, the proxy skips that quota's work altogether."""
    entities = [*cfg.clients.values(), *cfg.users.values()]
    entities += [c for u in cfg.users.values() for c in u.clients.values()]
    return any(q.get(key) is not None for q in entities)


def any_cluster_scope(cfg: QuotaConfig) -> bool:
    """Whether any entity or topic asks for ``scope: cluster`` (the exchange is needed then)."""
    entities = [*cfg.clients.values(), *cfg.users.values()]
    entities += [c for u in cfg.users.values() for c in u.clients.values()]
    return any(q.scope == "cluster" for q in entities) or any(
        t.scope == "cluster" for t in cfg.topics.values()
    )


def topic_scope(cfg: QuotaConfig, topic: str) -> str | None:
    """The scope of the quota entry that gives a topic its partition quota (as topic_quota)."""
    for name in (topic, DEFAULT):
        quotas = cfg.topics.get(name)
        if quotas is not None and (quotas.producer_byte_rate or quotas.consumer_byte_rate):
            return quotas.scope
    return None


def topic_quota(cfg: QuotaConfig, topic: str, produce: bool) -> float | None:
    """Per-partition quota of a topic (KIP-1010), falling back to the '<default>' topic."""
    for name in (topic, DEFAULT):
        quotas = cfg.topics.get(name)
        if quotas is not None:
            value = quotas.producer_byte_rate if produce else quotas.consumer_byte_rate
            if value is not None:
                return value
    return None
