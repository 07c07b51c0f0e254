"""Byte-rate quota enforcement for the pipeline: what a Produce or Fetch costs, and the answer.

The policy is in ``quota/``; this module turns decoded messages into quota inputs and decisions
into bytes (a patched throttle_time_ms, an empty throttled fetch response). Like the broker,
the proxy answers at once with the throttle time and then mutes the client connection.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from protocol import messages
from protocol.api_keys import ApiKey, api_name
from protocol.errors import ErrorCode
from protocol.schema import message_codec
from proxy.metrics import ProxyMetrics
from proxy.ratelog import RateLimitedLog
from proxy.shared.topic_names import TopicNames
from quota.client_id_policy import ClientIdPolicy
from quota.cluster import ClusterLink
from quota.cluster_mutations import Alone, LogAdmission, MutationLog
from quota.cluster_report import MutationRecord
from quota.config import QuotaConfig
from quota.connections import ConnectionRateQuotas
from quota.entities import Bucket
from quota.exemptions import Exemptions
from quota.generation import Generation
from quota.group_requests import GroupRequestQuotas
from quota.manager import ByteRateQuotas, Decision, FetchGrant, PartitionUsage
from quota.mutations import Admission, MutationQuotas
from quota.producer_ids import ProducerIdQuotas
from quota.request_time import RequestTimeQuotas
from quota.request_time import exempt as time_exempt

if TYPE_CHECKING:
    from proxy.shared.admission import MutationState

log = logging.getLogger(__name__)
throttle_log = RateLimitedLog(log)

MAX_UNRESOLVED_CHARGES = 10_000  # requests' worth of bytes waiting for a topic id lookup
INVALID_SESSION_ID = 0
INITIAL_EPOCH = 0
FINAL_EPOCH = -1


@dataclass(slots=True)
class FetchRequestInfo:
    session_id: int
    session_epoch: int
    grant: FetchGrant | None = None  # its share of the entity's fetch allowance, while in flight


def _usage(parts: list[messages.PartitionBytes]) -> list[PartitionUsage]:
    """What each partition is charged: its records, less a trailing partial batch (Fetch)."""
    return [
        PartitionUsage(p.topic, p.partition, p.size - p.partial) for p in parts if isinstance(p.topic, str)
    ]


class ProduceCharge(NamedTuple):
    throttle_ms: int  # decided (the caller applies it unless in dry-run)
    partitions: list[messages.PartitionBytes]
    new_producer_ids: int  # -1: producer ids not tracked for this user


class FetchCharge(NamedTuple):
    throttle_ms: int  # decided (the caller applies it unless in dry-run)
    partitions: list[messages.PartitionBytes]
    refuse: bool = True  # answer empty with the throttle (Kafka); else deliver with it (steady)


class MutationExchange(Protocol):
    """Where cluster-wide mutation requests are decided (proxy/shared/cluster_quotas.py)."""

    async def admit_mutation(self, record: MutationRecord) -> LogAdmission | None: ...

    def refund_mutation(self, record: MutationRecord) -> None: ...


class QuotaEnforcer:
    """Shared by all pipelines of one proxy: the quota state, the topic names and the clock."""

    def __init__(
        self,
        cfg: QuotaConfig,
        metrics: ProxyMetrics,
        clock: Callable[[], float] = time.monotonic,
        topic_names: TopicNames | None = None,
    ) -> None:
        self.clock = clock
        self.metrics = metrics
        self.topic_names = topic_names if topic_names is not None else TopicNames()
        # Partition bytes addressed by an id not known yet: charged once the lookup names them.
        self._unresolved: list[tuple[ByteRateQuotas, list[messages.PartitionBytes]]] = []
        self.lookup_topic_ids: Callable[[], None] = lambda: None  # the server starts a Metadata lookup
        # One quota across connections and brokers: an entity over its byte-rate quota has every
        # connection held until its throttle has passed (produce?, bucket) -> until (ms).
        self._holds: dict[tuple[bool, Bucket], float] = {}
        now = self.now_ms()
        self.cfg = cfg
        self.rules = Generation()  # raised at each reconfigure: pipelines resolve their stages again
        self.produce = ByteRateQuotas(cfg, produce=True, now_ms=now)
        self.fetch = ByteRateQuotas(cfg, produce=False, now_ms=now)
        self.mutations = MutationQuotas(cfg, now)
        self.producer_ids = ProducerIdQuotas(cfg, now)
        self.request_time = RequestTimeQuotas(cfg, now)
        self.connections = ConnectionRateQuotas(cfg, now)
        self.groups = GroupRequestQuotas(cfg, now)
        self.exemptions = Exemptions(cfg.exempt)
        self.client_id_policy = ClientIdPolicy(cfg.client_id_policy)
        # One quota across gateway replicas (proxy/shared/cluster_quotas.py), while the exchange runs.
        self.cluster: ClusterLink | None = None
        self.mutation_log = MutationLog()  # cluster-wide KIP-599 buckets, replayed from the topic
        self.mutation_exchange: MutationExchange | None = None
        self._mutation_requests = 0

    def attach_cluster(self, link: ClusterLink, mutations: MutationExchange | None = None) -> None:
        """The exchange runs: quotas of every entity not scoped to ``instance`` hold once across
        the replicas from now on."""
        self.cluster = link
        self.produce.cluster = self.fetch.cluster = self.producer_ids.cluster = link
        self.mutation_exchange = mutations
        self.rules.advance()

    def now_ms(self) -> float:
        return self.clock() * 1000.0

    @property
    def dry_run(self) -> bool:
        return self.cfg.dry_run

    def _mode(self, exempt: bool) -> str:
        """How a decision is counted: applied, or only reported (dry-run, an exempt client)."""
        return "exempt" if exempt else "dry-run" if self.dry_run else "applied"

    def expire_idle(self) -> int:
        """Drop idle quota state even when no request comes to do it (each table expires on its
        own traffic otherwise, so a burst of client ids followed by silence would stay forever)."""
        now = self.now_ms()
        for key in [k for k, until in self._holds.items() if until <= now]:
            del self._holds[key]
        tables = (
            self.produce,
            self.fetch,
            self.mutations,
            self.producer_ids,
            self.request_time,
            self.connections,
            self.groups,
        )
        return sum(table.maybe_expire(now) for table in tables)

    def reconfigure(self, cfg: QuotaConfig) -> None:
        self.cfg = cfg
        self.rules.advance()
        self.produce.reconfigure(cfg)
        self.fetch.reconfigure(cfg)
        self.mutations.reconfigure(cfg)
        self.producer_ids.reconfigure(cfg)
        self.request_time.reconfigure(cfg)
        self.connections.reconfigure(cfg)
        self.groups.reconfigure(cfg, self.now_ms())
        self.exemptions = Exemptions(cfg.exempt)
        self.client_id_policy = ClientIdPolicy(cfg.client_id_policy)

    # --- produce ---------------------------------------------------------------------------

    def on_produce(
        self,
        user: str,
        client_id: str,
        request_size: int,
        partitions: list[messages.PartitionBytes],
        exempt: bool = False,
    ) -> ProduceCharge:
        """Charge a Produce request (header + body bytes; per-partition record bytes; producer ids
        new to the user, KIP-936) whose partitions are ``partitions`` (``produce_scan``). The
        throttle decided is the largest of the quotas it is over."""
        self._name_topics(self.produce, partitions)
        now = self.now_ms()
        usage = _usage(partitions)
        decision = self.produce.record(user, client_id, request_size, usage, now)
        self._count(ApiKey.PRODUCE, decision, user, client_id, exempt)
        self._hold(True, decision, now, exempt)
        if exempt:  # measured; owes nothing, takes nothing from a bucket it shares
            self.produce.unrecord(decision, request_size, usage, now, keep_rates=True)
        throttle = decision.throttle_ms
        new_ids = -1
        if self.producer_ids.active:
            ids = [pid for p in partitions for pid in p.producer_ids]
            if ids and self.producer_ids.match(user) is not None:
                pid = self.producer_ids.record(user, ids, now)
                new_ids = pid.new_ids
                if pid.throttled:
                    quota = pid.match.quota if pid.match else 0
                    why = f"{pid.rate:.4g} new producer ids/s over {quota:g}"
                    self._throttled("Produce", pid.throttle_ms, "producer-ids", user, client_id, why, exempt)
                    throttle = max(throttle, pid.throttle_ms)
        return ProduceCharge(throttle, partitions, new_ids)

    # --- fetch -------------------------------------------------------------------------------

    def fetch_grant(self, user: str, client_id: str, requested: int | None) -> FetchGrant | None:
        """What a Fetch's max_bytes is lowered to (None: leave it), held against its entity's
        allowance until ``release_fetch`` (``ByteRateQuotas.grant_fetch``). A dry run lowers it to
        Kafka's cap alone and holds nothing."""
        if self.dry_run:
            match = self.fetch.match(user, client_id)
            cap = self.fetch.max_bytes_in_window(user, client_id)
            if match is None or cap is None:
                return None
            return FetchGrant(match.bucket, cap, 0, self.now_ms())
        return self.fetch.grant_fetch(user, client_id, requested, self.now_ms())

    def release_fetch(self, grant: FetchGrant) -> None:
        """A granted fetch was answered, or its connection closed first."""
        self.fetch.release(grant)

    def on_fetch_response(
        self,
        user: str,
        client_id: str,
        response_size: int,
        body: dict[str, Any],
        busy: float | None,
        grant: FetchGrant | None = None,
        exempt: bool = False,
    ) -> FetchCharge:
        """Charge a fetch response (its bytes; its upstream time when ``busy`` is given); the
        throttle decided is what to answer it with (0: let it through).

        As Kafka does, a fetch over either quota is answered empty, so its bytes are taken back;
        except one sized to the client's quota by steady shaping (``fetch_grant``), which is
        delivered with its throttle: nothing fetched is thrown away.
        The time of a fetch that came back without records is not charged: the broker was
        waiting out max_wait_ms, not working.
        """
        if grant is not None:
            self.release_fetch(grant)  # what it brought is charged instead
        now = self.now_ms()
        throttle = 0
        decision: Decision | None = None
        parts = messages.fetch_response_partitions(body)
        waiting = self._name_topics(self.fetch, parts)
        if self.fetch.steady:
            # A trailing partial batch is thrown away by the client and fetched again: charged
            # then. (Sized to what the entity may take now, fetches end in one far more often
            # than a broker's own, and charging it held a consumer 6% under its quota.)
            response_size -= sum(p.partial for p in parts)
        else:
            for p in parts:
                p.partial = 0  # kafka shaping: charged whole, as a broker does
        usage = _usage(parts)
        if self.fetch.active:
            decision = self.fetch.record(user, client_id, response_size, usage, now)
            self._count(ApiKey.FETCH, decision, user, client_id, exempt)
            self._hold(False, decision, now, exempt)
            if exempt:  # measured; owes nothing, takes nothing from a bucket it shares
                self.fetch.unrecord(decision, response_size, usage, now, keep_rates=True)
            throttle = decision.throttle_ms
        request_ms = 0
        if busy is not None and any(p.size for p in parts):
            request_ms = self.on_request_time(user, client_id, ApiKey.FETCH, busy, exempt)
            throttle = max(throttle, request_ms)
        # A fetch whose throttles all come from steady shaping (token buckets that its bytes are
        # paid into) goes out with them; any other throttle refuses it whole, as Kafka does.
        deliver = decision is not None and decision.deliverable and not request_ms
        if deliver and decision is not None and decision.bounded and decision.owed_ms > 0 and not exempt:
            # Fetched while its entity still owed: delivered, the bound would let the bytes of
            # one batch through every bound's time whatever the quota. Answered empty with what
            # it owed (its bytes not charged), it comes back once that is paid.
            deliver = False
            throttle = max(1, min(throttle, decision.owed_ms))
            self.metrics.bounded_throttles.labels("Fetch", "refused").inc()
        refuse = bool(throttle) and not deliver and not exempt
        if refuse and decision is not None and not self.dry_run:
            self.fetch.unrecord(decision, response_size, usage, now)
            if waiting is not None:  # answered empty: those bytes never reach the client either
                self._unresolved.remove(waiting)
        return FetchCharge(throttle, parts, refuse)

    # --- one quota across connections ----------------------------------------------------------

    def _hold(self, produce: bool, decision: Decision, now: float, exempt: bool = False) -> None:
        """Remember an entity's throttle, so its other connections are held until it has passed.

        A broker enforces its own copy of a quota on its own connections; the proxy sees every
        connection of a client to every broker and holds them all, so neither parallel
        connections nor another broker's share let the client past its quota."""
        if decision.client_throttle_ms <= 0 or self.dry_run or exempt or not self.cfg.hold_across_connections:
            return
        key = (produce, decision.bucket)
        until = now + decision.client_throttle_ms
        if until > self._holds.get(key, 0.0):
            self._holds[key] = until

    def hold_ms(self, produce: bool, user: str, client_id: str) -> int:
        """How long a Produce (or Fetch) of this entity must wait before it is read: the rest of
        a throttle decided on another of its connections, or for a Fetch, until what the
        entity's fetches in flight hold has refilled (``ByteRateQuotas.fetch_wait_ms``); 0: go on."""
        table = self.produce if produce else self.fetch
        now = self.now_ms()
        wait = 0
        if not produce and table.grants and not self.dry_run:
            wait = table.fetch_wait_ms(user, client_id, now)
        if not self._holds:
            return wait
        match = table.match(user, client_id)
        if match is None:
            return wait
        key = (produce, match.bucket)
        until = self._holds.get(key)
        if until is None:
            return wait
        left = until - now
        if left <= 0:
            del self._holds[key]
            return wait
        return max(wait, math.ceil(left))

    # --- topic ids (Produce and Fetch v13+) ----------------------------------------------------

    def _name_topics(
        self, table: ByteRateQuotas, parts: list[messages.PartitionBytes]
    ) -> tuple[ByteRateQuotas, list[messages.PartitionBytes]] | None:
        """Give ``parts`` their topic names; bytes under an id not known yet wait for the lookup
        (counted, never dropped: ``names_found`` charges them to their topic quotas)."""
        unknown = self.topic_names.rename(parts)
        if not unknown:
            return None
        self.metrics.topic_ids.labels("unresolved").inc(len(unknown))
        waiting = None
        if table.active:
            if len(self._unresolved) >= MAX_UNRESOLVED_CHARGES:
                # A lookup that never ends: the oldest bytes give way, and say so.
                self._give_up(self._unresolved.pop(0)[1], "too many waiting for a lookup")
            waiting = (table, unknown)
            self._unresolved.append(waiting)
        self.lookup_topic_ids()
        return waiting

    def names_found(self) -> None:
        """The lookup finished: charge the waiting bytes whose ids now have names; the rest name no
        topic of the cluster (deleted meanwhile) and are counted and logged."""
        waiting, self._unresolved = self._unresolved, []
        now = self.now_ms()
        for table, parts in waiting:
            unknown = self.topic_names.rename(parts)
            named = [p for p in parts if isinstance(p.topic, str)]
            if named:
                self.metrics.topic_ids.labels("resolved").inc(len(named))
                table.record_partitions(_usage(named), now)
            if unknown:
                self._give_up(unknown, "the cluster has no topic with that id")

    def _give_up(self, parts: list[messages.PartitionBytes], why: str) -> None:
        self.metrics.topic_ids.labels("unknown").inc(len(parts))
        ids = sorted({p.topic.hex() for p in parts if isinstance(p.topic, bytes)})
        throttle_log.log(
            logging.WARNING,
            "topic-ids",
            "%d partitions' bytes under topic ids %s count towards no topic quota: %s",
            len(parts),
            ", ".join(ids[:5]),
            why,
        )

    def reserve_producer_id(self, user: str, client_id: str, exempt: bool = False) -> int:
        """How long an InitProducerId waits before it is forwarded (ProducerIdQuotas.reserve);
        0 in a dry run or for an exempt client (the wait is reported, not applied)."""
        if not self.producer_ids.active or self.producer_ids.match(user) is None:
            return 0
        wait = self.producer_ids.reserve(user, self.now_ms())
        if wait:
            why = "user over its rate"
            self._throttled("InitProducerId", wait, "producer-ids", user, client_id, why, exempt)
        return 0 if self.dry_run or exempt else wait

    def on_init_producer_id(
        self, user: str, client_id: str, producer_id: int = -1, reserved: bool = False, exempt: bool = False
    ) -> int:
        """The answer to an InitProducerId: its id is counted; under kafka shaping, a user over
        producer_ids_rate has it answered with the throttle its next new id would meet, so the
        new producer waits before its first Produce (ProducerIdQuotas.settle)."""
        if not self.producer_ids.active or self.producer_ids.match(user) is None:
            return 0
        throttle = self.producer_ids.settle(user, producer_id, self.now_ms(), reserved)
        if throttle:
            why = "user over its rate"
            self._throttled("InitProducerId", throttle, "producer-ids", user, client_id, why, exempt)
        return 0 if self.dry_run or exempt else throttle

    # --- request time (request_percentage) --------------------------------------------------

    def request_time_charged(self, api_key: int, acks: int | None = None) -> bool:
        return self.request_time.active and not time_exempt(api_key, acks=acks)

    def on_request_time(
        self, user: str, client_id: str, api_key: int, seconds: float, exempt: bool = False
    ) -> int:
        """Charge the upstream time of one request; the throttle decided (capped at one window
        sample; the caller applies it unless in a dry run or exempt)."""
        decision = self.request_time.record(user, client_id, seconds, self.now_ms())
        if decision.throttled:
            name = api_name(api_key) or str(api_key)
            self._throttled(
                name,
                decision.throttle_ms,
                "request-time",
                user,
                client_id,
                f"{decision.percentage:.3g}% over {decision.match.quota if decision.match else 0:g}%",
                exempt,
            )
        return decision.throttle_ms

    def record_request_time(self, user: str, client_id: str, seconds: float) -> None:
        """Charge the upstream time of a request already answered (an opening ApiVersions,
        charged once the next request showed no SASL login follows): the bucket holds it, and
        the requests after it meet its throttle; none is reported for it."""
        self.request_time.record(user, client_id, seconds, self.now_ms())

    # --- consumer-group guard rails --------------------------------------------------------

    def group_request_wait(self, key: str, user: str, client_id: str, api: str, exempt: bool = False) -> int:
        """How long a group request waits before the coordinator sees it: while its bucket owes
        (GroupRequestQuotas.wait_ms); 0 in a dry run or for an exempt client (reported only)."""
        wait = self.groups.wait_ms(key, user, client_id, self.now_ms())
        if not wait:
            return 0
        mode = self._mode(exempt)
        self.metrics.group_requests_held.labels(api, key, mode).inc()
        throttle_log.log(
            logging.INFO,
            key,
            "%s from user %s, client %s waits %d ms: over %s (%s)",
            api,
            user,
            client_id,
            wait,
            key,
            mode,
        )
        return 0 if self.dry_run or exempt else wait

    def on_group_request(self, key: str, user: str, client_id: str, api: str, exempt: bool = False) -> int:
        """Charge a group request going on to the coordinator; the throttle its answer carries
        (0 in a dry run or for an exempt client, whose requests charge nothing)."""
        if exempt:
            return 0
        decision = self.groups.record(key, user, client_id, self.now_ms())
        if decision.throttle_ms:
            quota = decision.match.quota if decision.match else 0.0
            self._throttled(api, decision.throttle_ms, key, user, client_id, f"over {quota:g}/s")
        return 0 if self.dry_run else decision.throttle_ms

    # --- connection rate (KIP-612) ------------------------------------------------------------

    def on_connection(self, ip: str, exempt: bool = False) -> int:
        """Charge a new client connection to its IP; the time to hold it before closing, or 0
        (``exempt``: its listener or address is, so it is counted and never held)."""
        if not self.connections.active:
            return 0
        decision = self.connections.on_accept(ip, self.now_ms())
        if decision.throttled:
            mode = self._mode(exempt)
            self.metrics.throttled_connections.labels(mode).inc()
            throttle_log.log(
                logging.INFO,
                "connections",
                "connection from %s over connection_creation_rate %g/s (rate %.3g/s): "
                "held %d ms, then closed (%s)",
                ip,
                decision.quota or 0.0,
                decision.rate,
                decision.throttle_ms,
                mode,
            )
            if self.dry_run or exempt:
                return 0
        return decision.throttle_ms

    def _throttled(
        self,
        api: str,
        throttle_ms: int,
        quota: str,
        user: str,
        client_id: str,
        why: str,
        exempt: bool = False,
    ) -> None:
        mode = self._mode(exempt)
        self.metrics.quota_throttles.labels(api, quota, mode).inc()
        self.metrics.throttle_seconds.labels(api).inc(throttle_ms / 1000.0)
        throttle_log.log(
            logging.INFO,
            quota,
            "%s from user %s, client %s throttled %d ms by %s: %s (%s)",
            api,
            user,
            client_id,
            throttle_ms,
            quota,
            why,
            mode,
        )

    # --- partition mutations (KIP-599) ---------------------------------------------------------

    def mutation_quota_applies(self, user: str, client_id: str) -> bool:
        return self.mutations.active and self.mutations.match(user, client_id) is not None

    async def on_mutation(
        self, user: str, client_id: str, state: MutationState, peer: str, exempt: bool = False
    ) -> int:
        """Decide which topics of a priced mutation request are admitted, and its throttle;
        returns the throttle decided (applied unless in dry-run). A cluster-wide quota is
        decided by the replay of the exchange topic, in its order, as the one controller would;
        when the exchange does not answer, by this replica alone on its part of the quota."""
        strict = state.strict
        admitted = await self._admit_across_replicas(user, client_id, state)
        if admitted is None:
            now = self.now_ms()
            link = self.cluster if self._mutation_shared(user, client_id) else None
            scale, alone = 1.0, None
            if link is not None:
                # Its part, from what the replay left when it began to decide alone (each time,
                # when the exchange is up but did not answer in time).
                scale = link.multiplier
                since = link.alone_since_ms if link.local_only else now
                alone = Alone(since, self.mutation_log if link.sharing_since_ms > -math.inf else None)
            admitted = self.mutations.admit(user, client_id, state.costs, strict, now, scale, alone)
        state.bucket = admitted.bucket
        name = api_name(state.api_key) or str(state.api_key)
        bound = self.cfg.max_throttle_ms
        if strict and bound is not None and admitted.throttle_ms > bound:
            # Strict versions refuse what the bucket cannot take, so a shorter wait before the
            # client asks again lets nothing more through (the bucket still owes the rest).
            admitted = dataclasses.replace(admitted, throttle_ms=bound)
            self.metrics.bounded_throttles.labels(name, "bounded").inc()
        mode = self._mode(exempt)
        rejected = admitted.accepted.count(False)
        if rejected:
            self.metrics.mutation_rejected_topics.labels(name, mode).inc(rejected)
        if admitted.throttle_ms or rejected:
            self.metrics.throttled_requests.labels(name, mode).inc()
            self.metrics.throttle_seconds.labels(name).inc(admitted.throttle_ms / 1000.0)
            throttle_log.log(
                logging.INFO,
                "mutation",
                "%s v%d from %s (user %s, client %s): %d of %d topics rejected, throttle %d ms (%s, %s)",
                name,
                state.version,
                peer,
                user,
                client_id,
                rejected,
                len(state.refs),
                admitted.throttle_ms,
                "strict" if strict else "permissive",
                mode,
            )
        if self.dry_run or exempt:
            state.accepted = (True,) * len(state.refs)
            state.throttle_ms = 0
        else:
            state.accepted = admitted.accepted
            state.throttle_ms = admitted.throttle_ms
        return admitted.throttle_ms

    def refund_mutations(self, state: MutationState, indexes: list[int]) -> None:
        """Give back tokens for admitted topics the broker refused (Kafka never charged them)."""
        if state.bucket is None:
            return
        amount = sum(state.costs[i] for i in indexes)
        if state.record is not None and self.mutation_exchange is not None:
            self.mutation_exchange.refund_mutation(dataclasses.replace(state.record, refund=amount))
            return
        self.mutations.refund(state.bucket, amount, self.now_ms())

    def _mutation_shared(self, user: str, client_id: str) -> bool:
        match = self.mutations.match(user, client_id)
        return self.cluster is not None and match is not None and match.scope != "instance"

    async def _admit_across_replicas(
        self, user: str, client_id: str, state: MutationState
    ) -> Admission | None:
        """The replay's decision for a cluster-wide mutation quota (None: not cluster-wide, or
        the exchange did not answer in time)."""
        exchange, link = self.mutation_exchange, self.cluster
        match = self.mutations.match(user, client_id)
        if exchange is None or link is None or match is None or match.scope == "instance" or link.local_only:
            return None
        self._mutation_requests += 1
        window = self.cfg.controller_window
        record = MutationRecord(
            "",  # the exchange fills in its instance
            self._mutation_requests,
            user,
            client_id,
            match.bucket,
            tuple(state.costs),
            state.strict,
            match.quota * link.multiplier,
            window.num * window.size_seconds,
        )
        decided = await exchange.admit_mutation(record)
        if decided is None:
            return None
        state.record = record
        return Admission(decided.accepted, decided.throttle_ms, match.bucket, match, decided.tokens)

    def _count(
        self, api_key: int, decision: Decision, user: str, client_id: str, exempt: bool = False
    ) -> None:
        if decision.bounded:
            self.metrics.bounded_throttles.labels(
                "Produce" if api_key == ApiKey.PRODUCE else "Fetch", "bounded"
            ).inc()
        if decision.throttled:
            name = "Produce" if api_key == ApiKey.PRODUCE else "Fetch"
            mode = self._mode(exempt)
            self.metrics.throttled_requests.labels(name, mode).inc()
            self.metrics.throttle_seconds.labels(name).inc(decision.throttle_ms / 1000.0)
            throttle_log.log(
                logging.INFO,
                name,
                "%s from user %s, client %s throttled %d ms (client %d ms, partition %d ms, %s)",
                name,
                user,
                client_id,
                decision.throttle_ms,
                decision.client_throttle_ms,
                decision.partition_throttle_ms,
                mode,
            )


def throttled_fetch_response(version: int, throttle_ms: int, request: FetchRequestInfo) -> bytearray:
    """The empty response a broker sends to a throttled fetch (error NONE, no partitions).

    The broker keeps an incremental session's id and answers a full or sessionless fetch with
    INVALID_SESSION_ID, so the client starts over with a full fetch, as it would against Kafka.
    """
    incremental = request.session_epoch not in (INITIAL_EPOCH, FINAL_EPOCH)
    body: dict[str, Any] = {
        "throttle_time_ms": messages.wire_throttle_ms(throttle_ms),
        "error_code": int(ErrorCode.NONE),
        "session_id": request.session_id if incremental else INVALID_SESSION_ID,
        "responses": [],
    }
    return messages.encode(ApiKey.FETCH, version, body, response=True)


def fetch_request_info(version: int, body: dict[str, Any]) -> FetchRequestInfo:
    return FetchRequestInfo(int(body.get("session_id", 0)), int(body.get("session_epoch", FINAL_EPOCH)))


def cap_fetch_max_bytes(
    version: int, frame: bytes | bytearray, body_offset: int, cap: int
) -> bytearray | None:
    """A Fetch request with its max_bytes lowered to ``cap`` (a copy: the decoder's frames are
    immutable ``bytes``); None when it asks for no more than that."""
    if version < 3:
        return None
    codec = message_codec("FetchRequest", version)
    _obj, _end, positions = codec.read_with_positions(memoryview(frame), body_offset)
    pos = positions.get("max_bytes")
    if pos is None:
        return None
    current = int.from_bytes(frame[pos : pos + 4], "big", signed=True)
    if current <= cap:
        return None
    capped = bytearray(frame)
    capped[pos : pos + 4] = max(cap, 1).to_bytes(4, "big", signed=True)
    return capped
