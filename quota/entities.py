"""Which quota applies to a (user, client-id), and who shares its bucket (KIP-55).

Levels, most specific first, as Kafka's DefaultQuotaCallback walks them:
1 (user, client-id)  2 (user, <default> client)  3 user  4 (<default> user, client-id)
5 (<default> user, <default> client)  6 <default> user  7 client-id  8 <default> client-id.

The matched level decides the bucket: at levels 1, 2, 4, 5 each (user, client-id) pair has its
own; at 3 and 6 all clients of a user share one; at 7 and 8 each client id has one, across users.

Beyond Kafka, entities may match by group or prefix (``quotas.groups``,
``quotas.client_id_prefixes``), each sharing one bucket: at level 3 after the exact user, the
user's group (bucket ``("<group:NAME>", "")``); at level 7 after the exact client id, the longest
client-id prefix (``("", "<prefix:P>")``), then the client id's group (``("", "<group:NAME>")``).
``Match.via`` says which.
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
    via: str = ""  # "group:NAME" or "prefix:P" when matched through one, else ""


Level = tuple[int, "ClientQuotas | None", Bucket, str]


def _group_of(cfg: QuotaConfig, kind: str, name: str) -> tuple[str, ClientQuotas] | None:
    for group_name, group in getattr(cfg, "groups", {}).items():
        if name in getattr(group, kind):
            return group_name, group
    return None


def _prefix_of(cfg: QuotaConfig, client_id: str) -> tuple[str, ClientQuotas] | None:
    """The longest client-id prefix entry that ``client_id`` starts with."""
    found: tuple[str, ClientQuotas] | None = None
    for prefix, quotas in getattr(cfg, "client_id_prefixes", {}).items():
        if client_id.startswith(prefix) and (found is None or len(prefix) > len(found[0])):
            found = (prefix, quotas)
    return found


def _levels(cfg: QuotaConfig, user: str, client_id: str) -> list[Level]:
    users = cfg.users
    exact_user = users.get(user)
    default_user = users.get(DEFAULT)
    levels: list[Level] = [
        (1, exact_user.clients.get(client_id) if exact_user else None, (user, client_id), ""),
        (2, exact_user.clients.get(DEFAULT) if exact_user else None, (user, client_id), ""),
        (3, exact_user, (user, ""), ""),
    ]
    user_group = _group_of(cfg, "users", user)
    if user_group is not None:
        levels.append((3, user_group[1], (f"<group:{user_group[0]}>", ""), f"group:{user_group[0]}"))
    levels += [
        (4, default_user.clients.get(client_id) if default_user else None, (user, client_id), ""),
        (5, default_user.clients.get(DEFAULT) if default_user else None, (user, client_id), ""),
        (6, default_user, (user, ""), ""),
        (7, cfg.clients.get(client_id), ("", client_id), ""),
    ]
    prefix = _prefix_of(cfg, client_id)
    if prefix is not None:
        levels.append((7, prefix[1], ("", f"<prefix:{prefix[0]}>"), f"prefix:{prefix[0]}"))
    client_group = _group_of(cfg, "client_ids", client_id)
    if client_group is not None:
        levels.append((7, client_group[1], ("", f"<group:{client_group[0]}>"), f"group:{client_group[0]}"))
    levels.append((8, cfg.clients.get(DEFAULT), ("", client_id), ""))
    return levels


def resolve(cfg: QuotaConfig, user: str, client_id: str, key: str) -> Match | None:
    """The quota of kind ``key`` for this user and client id, or None when none applies.

    A user or client literally named '<default>' cannot be told from the default entity, as in
    Kafka, where that name is reserved.
    """
    for level, quotas, bucket, via in _levels(cfg, user, client_id):
        if quotas is not None:
            value = quotas.get(key)
            if value is not None:
                return Match(level, bucket, value, quotas.scope, via)
    return None


def named_bucket(bucket: Bucket) -> bool:
    """A group's or prefix's bucket (``<group:N>``, ``<prefix:P>``), not an entity's own."""
    return any(part.startswith(("<group:", "<prefix:")) and part.endswith(">") for part in bucket)


def bucket_quota(cfg: QuotaConfig, bucket: Bucket, key: str) -> Match | None:
    """The quota a bucket is held to (for its metrics): a group's or prefix's bucket by its
    name, any other as its (user, client id) resolves."""
    user, client_id = bucket
    if user.startswith("<group:") and user.endswith(">"):
        return _named(cfg, "groups", user[7:-1], bucket, key, 3, "group")
    for tag, table, kind in (("<prefix:", "client_id_prefixes", "prefix"), ("<group:", "groups", "group")):
        if client_id.startswith(tag) and client_id.endswith(">"):
            return _named(cfg, table, client_id[len(tag) : -1], bucket, key, 7, kind)
    return resolve(cfg, user, client_id, key) if user or client_id else None


def _named(
    cfg: QuotaConfig, table: str, name: str, bucket: Bucket, key: str, level: int, kind: str
) -> Match | None:
    quotas = getattr(cfg, table, {}).get(name)
    if quotas is None:
        return None
    value = quotas.get(key)
    return None if value is None else Match(level, bucket, value, quotas.scope, f"{kind}:{name}")


def any_entity_quota(cfg: QuotaConfig, key: str) -> bool:
    """Whether any user, client id or (user, client-id) has a quota of kind ``key``: when none
    does, the proxy skips that quota's work altogether."""
    entities = [*cfg.clients.values(), *cfg.users.values()]
    entities += [c for u in cfg.users.values() for c in u.clients.values()]
    entities += [*getattr(cfg, "client_id_prefixes", {}).values(), *getattr(cfg, "groups", {}).values()]
    return any(q.get(key) is not None for q in entities)


def any_cluster_scope(cfg: QuotaConfig) -> bool:
    """Whether any entity or topic asks for ``scope: cluster`` (the exchange is needed then)."""
    entities = [*cfg.clients.values(), *cfg.users.values()]
    entities += [c for u in cfg.users.values() for c in u.clients.values()]
    entities += [*getattr(cfg, "client_id_prefixes", {}).values(), *getattr(cfg, "groups", {}).values()]
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
