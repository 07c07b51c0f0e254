"""Admin HTTP: /metrics (Prometheus), /healthz (process up), /readyz (config loaded, upstream reachable)."""

from __future__ import annotations

from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.server import ProxyServer
from proxy.throttling import QuotaEnforcer
from quota.keys import ANONYMOUS, CONTROLLER_MUTATION_RATE, PRODUCER_IDS_RATE, REQUEST_PERCENTAGE
from quota.rate import throttle_time_ms


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
            "bucket": {"user": bucket[0], "client_id": bucket[1]},
        }
        if rate is not None:
            measured, window = rate.measure(now), rate.window_ms(now)
            state.update(
                rate=measured,
                window_ms=window,
                throttle_ms=throttle_time_ms(measured, match.quota, window) if match else 0,
                samples=[{"start_ms_ago": now - start, "bytes": value} for start, value in rate.samples(now)],
            )
        out[quotas.key] = state
    out[CONTROLLER_MUTATION_RATE] = enforcer.mutations.state(user, client_id, now)
    out[REQUEST_PERCENTAGE] = enforcer.request_time.state(user, client_id, now)
    out[PRODUCER_IDS_RATE] = enforcer.producer_ids.state(user, now)
    return out


def build_app(server: ProxyServer) -> web.Application:
    async def metrics(_request: web.Request) -> web.Response:
        body = generate_latest(server.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(_request: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def readyz(_request: web.Request) -> web.Response:
        ready = server.upstream_ready and not server.draining
        body = {
            "ready": ready,
            "upstream_reachable": server.upstream_ready,
            "draining": server.draining,
            "brokers": {str(k): f"{h}:{p}" for k, (h, p) in sorted(server.brokers.real.items())},
            "listeners": {name: lst.port for name, lst in server.listeners.items()},
        }
        return web.json_response(body, status=200 if ready else 503)

    async def quotas(_request: web.Request) -> web.Response:
        cfg = server.enforcer.cfg
        return web.json_response(cfg.model_dump(mode="json", by_alias=True, exclude_none=True))

    async def entity(request: web.Request) -> web.Response:
        user = request.query.get("user", ANONYMOUS)
        client_id = request.query.get("client_id", "")
        return web.json_response(entity_state(server.enforcer, user, client_id))

    async def ip(request: web.Request) -> web.Response:
        address = request.query.get("ip", "")
        if not address:
            return web.json_response({"error": "give ?ip=<client address>"}, status=400)
        enforcer = server.enforcer
        state = enforcer.connections.state(address, enforcer.now_ms())
        return web.json_response(state)

    app = web.Application()
    app.router.add_get("/quotas", quotas)
    app.router.add_get("/quotas/entity", entity)
    app.router.add_get("/quotas/ip", ip)

    async def volume(_request: web.Request) -> web.Response:
        if server.volume is None:
            return web.json_response({"enabled": False})
        return web.json_response({"enabled": True, **server.volume.quotas.describe(server.volume.now_ms())})

    async def cluster(_request: web.Request) -> web.Response:
        service = server.cluster_quotas
        if service is None:
            return web.json_response({"enabled": False})
        return web.json_response({"enabled": True, **service.rates.describe(service.now_ms())})

    app.router.add_get("/volume", volume)
    app.router.add_get("/quotas/cluster", cluster)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
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
