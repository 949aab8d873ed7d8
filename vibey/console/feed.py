"""Live updates: the domain events wake every server-sent-event stream of a console process;
a poll of PostgreSQL is the fallback.

Two things move the feed's marker (an opaque token the pages carry, ``<process>.<n>``):

- **a domain event**: an :class:`EventSource` (``actors.event_watch.EventWatch`` on the
  ``vibey.events`` exchange, a transient queue bound with ``#``) calls back on its own thread;
  :meth:`ChangeFeed.listen` hands each event into the asyncio loop
  (``loop.call_soon_threadsafe``), where :meth:`ChangeFeed.event` moves the marker and records
  the event's type and workflow, which the stream sends to the page;
- **the poll**: ``read`` (:meth:`ConsoleData.last_change`, one cheap query, ``store.changes``)
  moves the marker when its value differs from the previous read.

The poll's pace is what was chosen for the fallback: every ``interval`` (``[console]
poll_seconds``, 0.5 s) while no events arrive — no broker configured (the postgres backend,
whose workers publish nothing to the exchange), or the events consumer disconnected (it
reconnects with backoff); every ``safety_interval`` (``safety_poll_seconds``, 5 s; never
faster than ``interval``) while the consumer is connected. That slow tick is the safety net
for what the events do not report (a step claimed, an engine's health probe) and for an event
lost with a connection. Whenever
the consumer connects or disconnects the poll reads at once, so the gap between the last read
and the first event (or the first fast read) is covered.

A failed read is logged and retried at the next tick: a page stays as it is while the
database is away. A change seen by both paths may refresh a page twice; never zero times.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Protocol

from starlette.concurrency import run_in_threadpool

from workflows.events import DomainEvent

log = logging.getLogger(__name__)

KEEPALIVE_S = 15.0


class EventSource(Protocol):
    """Domain events as they are published, told to two callbacks on the source's own thread:
    ``on_event`` (the event, or None for one the codec refused) and ``on_state`` (True once
    nothing published from then on is missed, False when that stops)."""

    def start(
        self,
        *,
        on_event: Callable[[DomainEvent | None], None],
        on_state: Callable[[bool], None],
    ) -> None: ...

    def stop(self) -> None: ...


@dataclass(frozen=True, slots=True)
class Change:
    """A new marker and what moved it: a domain event's type and workflow (None: the poll)."""

    marker: str
    event_type: str | None = None
    workflow_id: str | None = None


class ChangeFeed:
    def __init__(
        self, read: Callable[[], str], *, interval: float, safety_interval: float | None = None
    ) -> None:
        self._read = read
        self._interval = interval
        self._safety_interval = max(interval, safety_interval or interval)
        self._prefix = secrets.token_hex(4)  # a page from before a restart refreshes once
        self._moves = 0
        self._polled: str | None = None
        self.last: Change | None = None
        self.live = False  # whether the domain events arrive
        self._moved = asyncio.Event()
        self._read_now = asyncio.Event()

    @property
    def marker(self) -> str | None:
        return None if self.last is None else self.last.marker

    @property
    def poll_interval(self) -> float:
        """The poll's current pace: slow while the events arrive, fast otherwise."""
        return self._safety_interval if self.live else self._interval

    async def run(self) -> None:
        """Poll until cancelled, at :attr:`poll_interval` (read at once when it changes)."""
        failing = False
        while True:
            self._read_now.clear()
            try:
                value = await run_in_threadpool(self._read)
                failing = False
            except Exception as exc:  # noqa: BLE001 - logged once, tried again next tick
                if not failing:
                    log.warning("console: cannot read the last change (%s); trying again", exc)
                failing = True
            else:
                self.polled(value)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._read_now.wait(), timeout=self.poll_interval)

    def polled(self, value: str) -> None:
        """A read of the change marker: the feed moves when it differs from the last read."""
        if value != self._polled:
            self._polled = value
            self._move(Change(""))

    def event(self, event: DomainEvent | None) -> None:
        """A domain event arrived: the feed moves."""
        if event is None:
            self._move(Change(""))
            return
        self._move(Change("", event.event_type.value, event.correlation_id))

    def events_live(self, live: bool) -> None:
        """The events began or stopped arriving: the poll reads now, then at its new pace."""
        if live != self.live:
            self.live = live
            self._read_now.set()

    def listen(self, source: EventSource) -> None:
        """Start ``source``, its callbacks handed into the running loop (call from it)."""
        loop = asyncio.get_running_loop()

        def soon(callback: Callable[..., None], *args: object) -> None:
            with contextlib.suppress(RuntimeError):  # the loop closed: the console is stopping
                loop.call_soon_threadsafe(callback, *args)

        source.start(
            on_event=lambda event: soon(self.event, event),
            on_state=lambda live: soon(self.events_live, live),
        )

    def _move(self, change: Change) -> None:
        self._moves += 1
        self.last = Change(f"{self._prefix}.{self._moves}", change.event_type, change.workflow_id)
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()

    async def changes(self, seen: str | None) -> AsyncIterator[Change | None]:
        """The newest change each time the marker moves past ``seen`` (several moves between
        two reads come as the newest one); None every KEEPALIVE_S without one."""
        while True:
            moved = self._moved
            last = self.last
            if last is not None and last.marker != seen:
                seen = last.marker
                yield last
                continue
            try:
                await asyncio.wait_for(moved.wait(), timeout=KEEPALIVE_S)
            except TimeoutError:
                yield None
