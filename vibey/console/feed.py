"""Live updates: one task a console process reads the change marker every ``interval``
seconds and wakes every server-sent-event stream when it moved.

The marker comes from one function (``read``: :meth:`ConsoleData.last_change`, a cheap poll of
PostgreSQL, ``store.changes``); feeding the console from the domain events instead replaces
that function and nothing else. A failed read is logged and retried at the next tick: a page
stays as it is while the database is away.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from starlette.concurrency import run_in_threadpool

log = logging.getLogger(__name__)

KEEPALIVE_S = 15.0


class ChangeFeed:
    def __init__(self, read: Callable[[], str], *, interval: float) -> None:
        self._read = read
        self._interval = interval
        self.marker: str | None = None
        self._moved = asyncio.Event()

    async def run(self) -> None:
        """Poll until cancelled."""
        failing = False
        while True:
            try:
                marker = await run_in_threadpool(self._read)
                failing = False
            except Exception as exc:  # noqa: BLE001 - logged once, tried again next tick
                if not failing:
                    log.warning("console: cannot read the last change (%s); trying again", exc)
                failing = True
            else:
                self.publish(marker)
            await asyncio.sleep(self._interval)

    def publish(self, marker: str) -> None:
        if marker != self.marker:
            self.marker = marker
            moved, self._moved = self._moved, asyncio.Event()
            moved.set()

    async def changes(self, seen: str | None) -> AsyncIterator[str | None]:
        """Each new marker after ``seen`` as it comes; None every KEEPALIVE_S without one."""
        while True:
            moved = self._moved
            if self.marker is not None and self.marker != seen:
                seen = self.marker
                yield seen
                continue
            try:
                await asyncio.wait_for(moved.wait(), timeout=KEEPALIVE_S)
            except TimeoutError:
                yield None
