"""A connection's coroutines: opening its upstream connection, and a stage's work while the
connection is held. Pure Python on purpose, beside the compiled pipeline: a coroutine compiled by
mypyc shows none of its references to the garbage collector, so pipeline -> task -> coroutine ->
pipeline would never be freed (docs/architecture.md, "The compiled hot path")."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from proxy.net.transports import PlainUpstreamProtocol, UpstreamProtocol
from proxy.ratelog import RateLimitedLog

if TYPE_CHECKING:
    from proxy.pipeline.connection import Pipeline
    from proxy.pipeline.flow import ConnectionFlow

log = logging.getLogger("proxy.pipeline.connection")  # what the connection says
unreachable_log = RateLimitedLog(log)


async def connect_upstream(pipeline: Pipeline) -> None:
    """Open the upstream connection (on the client's first bytes), then read what waited. A
    task: a failure here would leave the client paused as "connecting" for good."""
    try:
        await _open_upstream(pipeline)
    except Exception:
        pipeline.failed("connecting upstream or reading the first requests")


async def _open_upstream(pipeline: Pipeline) -> None:
    server = pipeline.server
    targets = server.brokers.upstream_for(pipeline.node_id)
    if not targets:
        pipeline.close(f"no known address for broker node {pipeline.node_id}")
        return
    last: BaseException | None = None
    backoff = server.brokers.backoff
    for host, port in backoff.order(targets):
        if pipeline.closed:  # a cancel the wait below swallowed (3.11's wait_for can)
            return
        wait = backoff.delay((host, port))
        if wait > 0:
            # The broker failed its last connects: held (not read) as a slow connect would
            # hold it, so a client's reconnect loop keeps a backoff through the proxy too.
            await asyncio.sleep(wait)
        tls = server.upstream_ssl()
        # Plaintext is read as bytes, TLS into the decoder's buffers (decrypted straight in).
        reads = UpstreamProtocol if tls else PlainUpstreamProtocol
        started = backoff.clock()
        try:
            transport, _ = await asyncio.wait_for(
                pipeline.loop.create_connection(
                    lambda: reads(pipeline),  # noqa: B023 - called before the loop goes on
                    host,
                    port,
                    ssl=tls,
                    server_hostname=host if tls else None,
                ),
                server.cfg.connect_timeout_seconds,
            )
        except (TimeoutError, OSError) as exc:
            last = exc
            pipeline.metrics.upstream_errors.labels("connect").inc()
            failed = backoff.failed((host, port), started)
            if failed is not None:  # the first of an outage, then one line per 10 s
                log.warning(
                    "upstream %s:%d unreachable (%d failed connects since the last such line, "
                    "retrying with backoff up to %g s): %r",
                    host,
                    port,
                    failed,
                    backoff.ceiling,
                    exc,
                )
            continue
        back = backoff.succeeded((host, port))
        if back is not None:
            log.info("upstream %s:%d reachable again after %d failed connects over %.1f s", host, port, *back)
        if pipeline.closed:
            transport.close()
            return
        pipeline.upstream_connected(transport, f"{host}:{port}")
        return
    # The upstream's own line says why (at most one per 10 s); one line per client would
    # flood the log while clients reconnect, so these are rate-limited too.
    unreachable_log.log(
        logging.INFO,
        "no-upstream",
        "conn %d from %s on %s closed: no upstream broker reachable (last error %r)",
        pipeline.id,
        pipeline.peer,
        pipeline.listener.name,
        last,
    )
    pipeline.close()


async def held(conn: ConnectionFlow, reason: str, work: Coroutine[Any, Any, bool | None], what: str) -> None:
    """``work`` with ``conn`` held for ``reason`` (``ConnectionFlow.spawn_held``): the hold ends
    when it does, unless it returns True; an exception closes the connection."""
    try:
        keep = await work
    except Exception:
        conn.failed(what)
        return
    if not keep:
        conn.release(reason)
