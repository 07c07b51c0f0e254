"""Admin HTTP: /metrics (Prometheus), /healthz (process up), /readyz (config loaded, upstream
reachable), the quota views, and the client-quota API (KIP-546's describe and alter over HTTP).

Probes, /metrics, /volume and /cluster/peer are open (the listener defaults to 127.0.0.1).
Endpoints that name users, client ids or addresses, and those that change state, need
``Authorization: Bearer <token>`` with the token in ``admin.token_file`` (compared in constant
time; 401 without it, 403 when wrong); with no token file they are refused unless
``admin.allow_unauthenticated_reads`` / ``admin.allow_unauthenticated_changes`` open them.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.admin.connections import connection_rows
from proxy.config import AdminConfig
from proxy.secrets import register
from proxy.shared.quota_api import QuotaApiService
from proxy.shared.throttling import QuotaEnforcer
from quota import client_quota_ops as ops
from quota.keys import ANONYMOUS, CONTROLLER_MUTATION_RATE, DEFAULT, PRODUCER_IDS_RATE, REQUEST_PERCENTAGE
from quota.rate import throttle_time_ms

if TYPE_CHECKING:  # the server starts the admin endpoints: it is above them
    from proxy.server import ProxyServer

log = logging.getLogger(__name__)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

# Open to anyone who reaches the port: probes, metrics (per-entity series are bounded and named
# only for the busiest), the volume state and the replicas' liveness probe.
OPEN_ENDPOINTS = ("/metrics", "/healthz", "/readyz", "/volume", "/cluster/peer")
# They name users, client ids or addresses: the token, unless admin.allow_unauthenticated_reads
# (``AdminAuth.protect(reading=True)``). Every endpoint that changes state goes through
# ``AdminAuth.protect``.
TOKEN_READ_ENDPOINTS = (
    "/quotas",
    "/quotas/entity",
    "/quotas/ip",
    "/quotas/cluster",
    "/quotas/client-quotas (GET)",
)


class AdminAuth:
    """The bearer token of the protected endpoints: read at start, read again when the file
    changes (its mtime, size or inode), never logged."""

    def __init__(self, cfg: AdminConfig) -> None:
        self.path: Path | None = cfg.token_file
        self.open = cfg.allow_unauthenticated_changes
        self.open_reads = cfg.allow_unauthenticated_reads
        self._signature: tuple[int, int, int] | None = None
        self._token: bytes | None = None
        if self.path is not None:
            self._load()

    def _load(self) -> None:
        assert self.path is not None
        try:
            st = os.stat(self.path)
            signature = (st.st_mtime_ns, st.st_size, st.st_ino)
            if signature == self._signature:
                return
            token = self.path.read_bytes().strip()
        except OSError as exc:
            if self._token is not None or self._signature is None:
                log.warning(
                    "admin: token file %s unreadable (%s); protected endpoints refused",
                    self.path,
                    exc.strerror,
                )
            self._token, self._signature = None, (0, 0, 0)
            return
        self._signature = signature
        self._token = token or None
        if self._token is not None:
            register(self._token.decode(errors="replace"))
        if self._token is None:
            log.warning("admin: token file %s is empty; protected endpoints refused", self.path)
        else:
            log.info("admin: token read from %s", self.path)

    def check(self, request: web.Request, reading: bool = False) -> web.Response | None:
        """None when the request may change state (``reading``: may read what names users,
        client ids or addresses); else the refusal to send."""
        if reading and self.open_reads:
            return None
        if self.path is None:
            if self.open and not reading:
                return None
            if reading:
                return _error(
                    403,
                    "admin endpoints that name users, client ids or addresses need a token: set "
                    "admin.token_file (or admin.allow_unauthenticated_reads: true)",
                )
            return _error(
                403,
                "state-changing admin endpoints are disabled: set admin.token_file "
                "(or admin.allow_unauthenticated_changes: true)",
            )
        self._load()
        header = request.headers.get("Authorization", "")
        scheme, _sep, given = header.partition(" ")
        if scheme.lower() != "bearer" or not given.strip():
            response = _error(401, "give Authorization: Bearer <token> (the contents of admin.token_file)")
            response.headers["WWW-Authenticate"] = 'Bearer realm="kthrottle"'
            return response
        if self._token is None:
            return _error(403, "the admin token file is unreadable or empty: refused")
        if not hmac.compare_digest(given.strip().encode(), self._token):
            return _error(403, "wrong admin token")
        return None

    def protect(self, handler: Handler, reading: bool = False) -> Handler:
        """``handler`` behind the token (``reading``: an endpoint that names users, client ids
        or addresses, opened by allow_unauthenticated_reads rather than _changes)."""

        async def guarded(request: web.Request) -> web.StreamResponse:
            refused = self.check(request, reading)
            return refused if refused is not None else await handler(request)

        return guarded


def _error(status: int, message: str, **extra: Any) -> web.Response:
    return web.json_response({"error": message, **extra}, status=status)


def _filter_component(entity_type: str, value: str) -> ops.Component:
    """?user=alice (exact), ?user=<default> (the default entity), ?user=* (any name)."""
    if value == DEFAULT:
        return ops.Component(entity_type, ops.MATCH_DEFAULT)
    if value == "*":
        return ops.Component(entity_type, ops.MATCH_ANY)
    return ops.Component(entity_type, ops.MATCH_EXACT, value)


def describe_query(service: QuotaApiService, query: Any) -> tuple[int, dict[str, Any]]:
    """GET /quotas/client-quotas: Kafka's describe with filters from the query string."""
    components = []
    params = {ops.USER: "user", ops.CLIENT_ID: "client-id", ops.IP: "ip"}
    for entity_type, param in params.items():
        value = query.get(param, query.get(param.replace("-", "_")))
        if value is not None:
            components.append(_filter_component(entity_type, value))
    strict = str(query.get("strict", "false")).lower() in ("1", "true", "yes")
    found = service.describe(components, strict, source="http")
    if isinstance(found, ops.ApiError):
        return 400, {"error": found.message, "error_code": found.name}
    return 200, {
        "strict": strict,
        "entries": [{"entity": dict(entity), "values": values} for entity, values in found],
    }


class BadBody(ValueError):
    """A POST body that is not an alteration request."""


def _entity_pairs(raw: Any) -> tuple[tuple[str, str | None], ...]:
    if isinstance(raw, dict):
        return tuple((str(t), None if n is None else str(n)) for t, n in raw.items())
    if isinstance(raw, list):
        return tuple(
            (str(e["entity_type"]), None if e.get("entity_name") is None else str(e["entity_name"]))
            for e in raw
        )
    raise BadBody("entity must be an object {type: name} or a list of {entity_type, entity_name}")


def alterations_from_json(body: Any) -> tuple[list[ops.Alteration], bool]:
    """POST /quotas/client-quotas: Kafka's AlterClientQuotas request as JSON."""
    if not isinstance(body, dict) or not isinstance(body.get("entries"), list):
        raise BadBody('give {"entries": [{"entity": {...}, "ops": [...]}], "validate_only": false}')
    out = []
    try:
        for entry in body["entries"]:
            op_list = []
            for op in entry.get("ops") or []:
                remove = bool(op.get("remove", False))
                value = op.get("value")
                if not remove and (isinstance(value, bool) or not isinstance(value, int | float)):
                    raise BadBody(f"op {op.get('key')!r}: value must be a number (or remove: true)")
                op_list.append(ops.Op(str(op["key"]), None if remove else float(value)))
            out.append(ops.Alteration(_entity_pairs(entry.get("entity")), tuple(op_list)))
    except (KeyError, TypeError, AttributeError) as exc:
        raise BadBody(f"malformed entry: {exc!r}") from exc
    return out, bool(body.get("validate_only", False))


def entity_state(enforcer: QuotaEnforcer, user: str, client_id: str) -> dict[str, Any]:
    """The live state of one (user, client-id) for each of its quotas: why, how much, how fast."""
    now = enforcer.now_ms()
    out: dict[str, Any] = {"user": user, "client_id": client_id, "dry_run": enforcer.dry_run}
    for quotas in (enforcer.produce, enforcer.fetch):
        match = quotas.match(user, client_id)
        bucket = match.bucket if match is not None else ("", client_id)
        rate = quotas.clients.get(bucket)
        state: dict[str, Any] = {
            "quota": match.quota if match else None,
            "level": match.level if match else None,
            "via": match.via if match else None,
            "bucket": {"user": bucket[0], "client_id": bucket[1]},
        }
        if rate is not None:
            measured, window = rate.measure(now), rate.window_ms(now)
            throttle_ms = throttle_time_ms(measured, match.quota, window) if match else 0
            shaper = quotas.shaper(bucket) if quotas.shaped(match) else None
            if shaper is not None:  # steady shaping: the token bucket decides the throttle
                throttle_ms = shaper.throttle_ms(now)
                state["tokens"] = shaper.tokens(now)
            state.update(
                rate=measured,
                window_ms=window,
                throttle_ms=throttle_ms,
                samples=[{"start_ms_ago": now - start, "bytes": value} for start, value in rate.samples(now)],
            )
        if enforcer.cluster is not None:
            # One quota across the gateway's replicas: this replica's share and the total.
            mine, total = quotas.shared_rates(bucket, now)
            state["cluster"] = {
                "shared": quotas.shared(match),
                "this_replica_rate": mine,
                "cluster_rate": total,
                "multiplier": enforcer.cluster.multiplier if quotas.shared(match) else 1.0,
                **quotas.fairness(bucket, now),
            }
            if "rate" in state:
                state["rate"] = total
        out[quotas.key] = state
    out[CONTROLLER_MUTATION_RATE] = enforcer.mutations.state(user, client_id, now)
    out[REQUEST_PERCENTAGE] = enforcer.request_time.state(user, client_id, now)
    out[PRODUCER_IDS_RATE] = enforcer.producer_ids.state(user, now)
    out.update(enforcer.groups.state(user, client_id, now))
    return out


def build_app(server: ProxyServer, auth: AdminAuth | None = None) -> web.Application:
    auth = auth or AdminAuth(server.cfg.admin)

    async def metrics(_request: web.Request) -> web.Response:
        body = generate_latest(server.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_request: web.Request) -> web.Response:
        ready = server.upstream_ready and not server.draining
        body: dict[str, Any] = {
            "ready": ready,
            "upstream_reachable": server.upstream_ready,
            "draining": server.draining,
            "brokers": {str(k): f"{h}:{p}" for k, (h, p) in sorted(server.brokers.real.items())},
            "listeners": {name: lst.port for name, lst in server.listeners.items()},
        }
        if server.cluster_quotas is not None:
            # Detail only: a replica that holds its part of the quotas alone still serves.
            mode = server.cluster_quotas.mode
            body["cluster_quotas"] = {
                "replicas": mode.instances,
                "fallback": mode.fallback,
                "reason": mode.reason,
                "multiplier": round(mode.multiplier, 4),
            }
        return web.json_response(body, status=200 if ready else 503)

    async def peer(_request: web.Request) -> web.Response:
        """The other replicas' liveness probe: who answers at this address (open, as /healthz)."""
        if server.cluster_quotas is None:
            return _error(404, "cluster quotas are not enabled here")
        return web.json_response(server.cluster_quotas.peer_answer())

    async def quotas(_request: web.Request) -> web.Response:
        cfg = server.enforcer.cfg
        return web.json_response(cfg.model_dump(mode="json", by_alias=True, exclude_none=True))

    async def entity(request: web.Request) -> web.Response:
        user = request.query.get("user", ANONYMOUS)
        client_id = request.query.get("client_id", "")
        return web.json_response(entity_state(server.enforcer, user, client_id))

    async def connections(request: web.Request) -> web.Response:
        query = request.query
        try:
            broker = int(query["broker"]) if query.get("broker") else None
            limit = int(query.get("limit", "100"))
            answer = connection_rows(
                server.pipelines,
                asyncio.get_running_loop().time(),
                user=query.get("user"),
                client_id=query.get("client_id"),
                broker=broker,
                sort=query.get("sort", "bytes_in"),
                limit=limit,
            )
        except ValueError as exc:
            return _error(400, str(exc))
        return web.json_response(answer)

    async def ip(request: web.Request) -> web.Response:
        address = request.query.get("ip", "")
        if not address:
            return web.json_response({"error": "give ?ip=<client address>"}, status=400)
        enforcer = server.enforcer
        state = enforcer.connections.state(address, enforcer.now_ms())
        return web.json_response(state)

    app = web.Application()
    app.router.add_get("/quotas", auth.protect(quotas, reading=True))
    app.router.add_get("/quotas/entity", auth.protect(entity, reading=True))
    app.router.add_get("/quotas/ip", auth.protect(ip, reading=True))
    app.router.add_get("/connections", auth.protect(connections, reading=True))

    async def volume(_request: web.Request) -> web.Response:
        if server.volume is None:
            return web.json_response({"enabled": False})
        return web.json_response({"enabled": True, **server.volume.quotas.describe(server.volume.now_ms())})

    async def cluster(_request: web.Request) -> web.Response:
        service = server.cluster_quotas
        if service is None:
            return web.json_response({"enabled": False})
        return web.json_response({"enabled": True, **service.describe()})

    def quota_api() -> QuotaApiService | web.Response:
        if server.quota_api is None:
            return _error(409, "quota_api.mode is forward: the brokers hold the client quotas")
        return server.quota_api

    async def client_quotas(request: web.Request) -> web.Response:
        service = quota_api()
        if isinstance(service, web.Response):
            return service
        status, body = describe_query(service, request.query)
        return web.json_response(body, status=status)

    async def alter_client_quotas(request: web.Request) -> web.Response:
        service = quota_api()
        if isinstance(service, web.Response):
            return service
        try:
            alterations, validate_only = alterations_from_json(await request.json())
        except (BadBody, json.JSONDecodeError, UnicodeDecodeError) as exc:
            return _error(400, str(exc))
        result = await service.alter(alterations, validate_only, source="http")
        entries = [
            {"entity": dict(entity), "error_code": err.name, "error": err.message}
            for entity, err in result.results
        ]
        log.info(
            "admin: client quotas altered over HTTP%s: %s",
            " (validate only)" if validate_only else "",
            "; ".join(f"{e['entity']} {e['error_code']}" for e in entries),
        )
        return web.json_response({"validate_only": validate_only, "entries": entries})

    app.router.add_get("/quotas/client-quotas", auth.protect(client_quotas, reading=True))
    app.router.add_post("/quotas/client-quotas", auth.protect(alter_client_quotas))
    app.router.add_get("/volume", volume)
    app.router.add_get("/quotas/cluster", auth.protect(cluster, reading=True))
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/cluster/peer", peer)
    return app


async def start_admin(server: ProxyServer) -> tuple[web.AppRunner, int]:
    """Start the admin server; returns the runner (to clean up) and the bound port."""
    runner = web.AppRunner(build_app(server), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, server.cfg.admin.host, server.cfg.admin.port)
    await site.start()
    addresses = runner.addresses
    port = int(addresses[0][1]) if addresses else server.cfg.admin.port
    return runner, port
