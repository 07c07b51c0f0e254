"""The proxy's own Metadata lookup for topic ids no client Metadata has shown it yet.

A request that names a topic by an unknown id asks for a lookup; the lookups run one at a time,
at most one a second (a restart under many clients with cached ids asks once, not once per
request), and each learns every topic of the cluster. When one ends, the bytes that waited are
charged to their topic quotas and the capture records that waited are written with names.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from protocol.frames import FrameError
from protocol.schema import SchemaError
from proxy.shared.throttling import QuotaEnforcer
from proxy.shared.topic_catalog import TopicCatalog
from proxy.shared.topic_names import TopicNames

log = logging.getLogger(__name__)

MIN_INTERVAL_SECONDS = 1.0
ATTEMPTS = 5  # lookups that fail in a row before the waiting bytes are given up (counted, logged)
# A broker that cannot be reached or answers what cannot be read.
LOOKUP_ERRORS = (ConnectionError, OSError, SchemaError, FrameError, asyncio.IncompleteReadError)


class TopicIdLookup:
    def __init__(
        self,
        catalog: TopicCatalog,
        names: TopicNames,
        enforcer: QuotaEnforcer,
        min_interval: float = MIN_INTERVAL_SECONDS,
    ) -> None:
        self.catalog = catalog
        self.names = names
        self.enforcer = enforcer
        self.min_interval = min_interval
        self.lookups = 0
        self._wanted = False
        self._last = float("-inf")
        self._task: asyncio.Task[None] | None = None
        self._after: list[Callable[[], None]] = []
        # The proxy's event loop, learned from the first connection (requests are read in loop
        # callbacks, where it is running; a test harness may drive them from outside it).
        self.loop: asyncio.AbstractEventLoop | None = None

    @property
    def running(self) -> bool:
        return self._task is not None

    def wanted(self) -> None:
        """An unknown id was met: look it up soon (from the event loop; never blocks)."""
        self._wanted = True
        if self._task is None:
            loop = self.loop or asyncio.get_running_loop()
            self._task = loop.create_task(self._run())

    def after(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` when the lookup under way ends (at once if none is)."""
        if self._task is None:
            callback()
        else:
            self._after.append(callback)

    def close(self) -> None:
        if self._task is not None:
            self._task.cancel()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        try:
            while self._wanted:
                self._wanted = False
                pause = self._last + self.min_interval - loop.time()
                if pause > 0:
                    await asyncio.sleep(pause)
                self._last = loop.time()
                self.lookups += 1
                try:
                    pairs = await self.catalog.topic_ids()
                except LOOKUP_ERRORS as exc:
                    failures += 1
                    log.warning("topic id lookup failed (%d of %d): %s", failures, ATTEMPTS, exc)
                    if failures < ATTEMPTS:
                        self._wanted = True
                        continue
                else:
                    failures = 0
                    self.names.learn(pairs, every_topic=True)
                self.enforcer.names_found()
                self._run_after()
        finally:
            self._task = None
            self._run_after()

    def _run_after(self) -> None:
        waiting, self._after = self._after, []
        for callback in waiting:
            try:
                callback()
            except Exception:  # one bad callback must not keep the others' records back
                log.exception("after a topic id lookup")
