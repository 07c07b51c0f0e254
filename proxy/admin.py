"""Admin HTTP: /metrics (Prometheus), /healthz (process up), /readyz (config loaded, upstream reachable)."""

from __future__ import annotations

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from proxy.server import ProxyServer


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

    app = web.Application()
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
