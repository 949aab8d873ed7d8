"""The outbox relay: publishes dispatch pointers with pipelined publisher confirms.

A committing transaction writes its outbox rows already claimed for this process's relay and,
after the commit, hands them (their pointer fields, from the INSERT's ``RETURNING``: the relay
does not read the outbox again) to :meth:`Relay.submit`, which returns at once: the step's
thread never waits for the broker. The relay publishes each pointer with ``mandatory`` on a
confirm-mode channel without waiting for the confirm of the one before (confirms arrive in
batches), and only when the broker confirmed a message it did not return does it mark the
row sent. A returned (unroutable) or nacked message, or one whose connection died before its
confirm, gives its row back for the next drain: published at least once, never marked sent
without a routed confirm. :meth:`Relay.drain` (the reconciler's) claims the rows nobody holds,
including those claimed by a relay that died.

Routing: a due pointer goes to the work exchange; one that is not due goes to the largest wait
tier not longer than what remains (``workflows.dispatch.WaitTiers``), published to that tier's
exchange with the pointer's real routing key. Whether a project's key is its dedicated one is
read from ``project_route`` (``store.routes``: a :class:`~store.routes.RouteCache` in a
long-lived process, refreshed on NOTIFY), the same answer in every publisher.

Each message carries ``correlation_id`` (the job's workflow, else the job), the W3C
``traceparent`` its row was written with (a traced workflow event's: every relay sends it, a
drain's resend included), else in a traced process that of a ``publish`` span
(``actors.tracing``), and, where the work
queues honour message priorities on the connected broker (``actors.capabilities.
message_priorities``: detected at each connect, never assumed), the job's priority.

Threads: pika's ``SelectConnection`` runs in its own I/O thread; everything that touches
PostgreSQL runs in the relay's worker thread. They talk through thread-safe queues and
``ioloop.add_callback_threadsafe``.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pika
import pika.channel
import pika.frame
import pika.spec

from actors.amqp import parameters
from actors.capabilities import MessagePriorities, detect, message_priorities
from actors.topology import QUORUM, QueueNames
from store.dispatch import DispatchRecords
from store.errors import DatabaseUnavailable
from store.unit_of_work import OutboxRow
from workflows.dispatch import DispatchEnvelope, Lane, WaitTiers, encode, tier_name
from workflows.kinds import StepKinds

log = logging.getLogger(__name__)

OUTBOX_HEADER = "vibey-outbox-id"
SOLO_HEADER = "x-vibey-solo"  # run with nothing else in flight in the worker process
TRACE_HEADERS = ("traceparent", "tracestate")  # W3C trace context (actors.tracing), if traced
RECONNECT_DELAYS = (0.1, 0.5, 1.0, 2.0, 5.0)
RETRY_PAUSE_S = 0.5  # between reads of submitted rows while PostgreSQL does not answer


@dataclass(frozen=True, slots=True)
class Publication:
    outbox_id: int
    exchange: str
    routing_key: str
    body: bytes
    message_id: str
    solo: bool = False
    priority: int = 0  # the job's (mapped to the broker's levels when published)
    correlation_id: str | None = None  # the workflow (else the job)
    trace_headers: tuple[tuple[str, str], ...] = ()  # W3C trace context, when traced


class Router:
    """Where a pointer goes: the work exchange when due, else a wait tier's exchange; into the
    lane its kind declares (``kinds``: the registered definitions'; a kind none declares goes
    to the interactive lane); to the project's dedicated queues when ``dedicated`` (the
    project routes, ``store.routes``) holds the project."""

    def __init__(
        self,
        *,
        names: QueueNames,
        tiers: WaitTiers,
        dedicated: Container[str] = (),
        kinds: StepKinds | None = None,
    ) -> None:
        self._names = names
        self._tiers = tiers
        self._dedicated = dedicated
        self._kinds = kinds if kinds is not None else StepKinds()

    def dedicated(self, project_id: str) -> bool:
        return project_id in self._dedicated

    def queue(self, kind: str, project_id: str) -> str:
        """The work queue a due pointer of ``kind`` for ``project_id`` lands in."""
        lane = self.lane(kind)
        return self._names.work_queue(lane, project_id if self.dedicated(project_id) else None)

    def lane(self, kind: str) -> Lane:
        if kind in self._kinds:
            return self._kinds[kind].lane
        return Lane.INTERACTIVE

    def publication(self, row: OutboxRow, now: datetime) -> Publication:
        envelope = DispatchEnvelope(
            job_id=row.job_id,
            project_id=row.project_id,
            dispatch_seq=row.dispatch_seq,
            kind=row.kind,
            not_before=row.not_before,
        )
        key = self._names.routing_key(
            self.lane(row.kind), row.project_id, dedicated=row.project_id in self._dedicated
        )
        tier = self._tiers.route(row.not_before - now)
        exchange = (
            self._names.work_exchange
            if tier is None
            else self._names.tier_exchange(tier_name(tier))
        )
        return Publication(
            row.id,
            exchange,
            key,
            encode(envelope),
            envelope.message_id,
            solo=row.solo,
            priority=row.priority,
            correlation_id=str(row.workflow_id or row.job_id),
        )


class Relay:
    """One per process. ``start()`` before use, ``stop()`` at exit."""

    def __init__(
        self,
        *,
        url: str,
        records: DispatchRecords,
        router: Router,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        mark_batch: int = 256,
        trace_headers: Callable[[OutboxRow], Mapping[str, str]] | None = None,
    ) -> None:
        """``trace_headers``: the trace context to send with a row's pointer that carries
        none of its own (a traced process's :meth:`actors.tracing.StepTracer.
        publish_headers`); None sends none. A row's stored traceparent is always sent."""
        self._url = url
        self._trace_headers = trace_headers
        self._records = records
        self._router = router
        self._clock = clock
        self._mark_batch = mark_batch
        self._inbox: queue.Queue[tuple[OutboxRow | int, ...] | None] = queue.Queue()
        self._results: queue.Queue[tuple[int, bool]] = queue.Queue()
        self._stopping = threading.Event()
        self._ready = threading.Event()
        self._lock = threading.Lock()
        self._in_flight = 0  # submitted ids not yet marked or released
        self._idle = threading.Condition(self._lock)
        self._io: _Publisher | None = None
        self._threads: list[threading.Thread] = []
        self.published = 0
        self.returned = 0

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, *, timeout: float = 10.0) -> None:
        self._io = _Publisher(self._url, self._results, self._stopping, self._ready)
        for target, name in ((self._io.run, "relay-io"), (self._work, "relay-worker")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)
        if not self._ready.wait(timeout):
            raise TimeoutError(f"the relay could not reach RabbitMQ within {timeout}s")

    def stop(self, *, timeout: float = 10.0) -> None:
        self.flush(timeout=timeout)
        self._stopping.set()
        self._inbox.put(None)
        if self._io is not None:
            self._io.close()
        for thread in self._threads:
            thread.join(timeout=timeout)

    @property
    def priorities(self) -> MessagePriorities:
        """What the work queues do with message priorities on the broker last connected."""
        return self._io.priorities if self._io is not None else MessagePriorities()

    # -- the two ways rows arrive ----------------------------------------------------------

    def submit(self, rows: Sequence[OutboxRow | int]) -> None:
        """Publish rows this process just committed (already claimed for this relay): their
        pointer fields as the commit returned them, or ids to read (unsent ones only).

        Rows with their fields go straight from the committing thread to the I/O thread (one
        thread hand-off, not two: the worker thread, which may be inside a mark-sent commit,
        is not on the path of a pointer); ids go to the worker thread, which reads them."""
        if not rows:
            return
        with self._lock:
            self._in_flight += len(rows)
        if self._io is None:  # not started: the worker thread publishes them once it runs
            self._inbox.put(tuple(rows))
            return
        ids = tuple(row for row in rows if not isinstance(row, OutboxRow))
        if ids:
            self._inbox.put(ids)
        ready = [row for row in rows if isinstance(row, OutboxRow)]
        if ready:
            self._publish_rows(ready)

    def drain(self, *, limit: int = 500, reclaim_after: timedelta = timedelta(seconds=30)) -> int:
        """Claim unsent rows nobody holds (or a dead relay held) and publish them."""
        rows = self._records.claim_outbox(limit=limit, reclaim_after=reclaim_after)
        if rows:
            with self._lock:
                self._in_flight += len(rows)
            self._inbox.put(tuple(rows))
        return len(rows)

    def flush(self, *, timeout: float = 10.0) -> bool:
        """Wait until every row handed over so far is marked sent or given back."""
        deadline = time.monotonic() + timeout
        with self._idle:
            while self._in_flight > 0:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not self._idle.wait(remaining):
                    return False
        return True

    # -- the worker thread -----------------------------------------------------------------

    def _work(self) -> None:
        while not self._stopping.is_set():
            ids = self._collect()
            if ids:
                self._publish(ids)
            self._settle_confirms()

    def _collect(self) -> list[OutboxRow | int]:
        ids: list[OutboxRow | int] = []
        try:
            first = self._inbox.get(timeout=0.01)
        except queue.Empty:
            return ids
        if first is not None:
            ids.extend(first)
        while True:
            try:
                more = self._inbox.get_nowait()
            except queue.Empty:
                return ids
            if more is not None:
                ids.extend(more)

    def _publish(self, items: list[OutboxRow | int]) -> None:
        rows = [item for item in items if isinstance(item, OutboxRow)]
        ids = [item for item in items if not isinstance(item, OutboxRow)]
        try:
            rows += self._records.outbox_rows(ids) if ids else []
        except DatabaseUnavailable as exc:  # past the store's retries: keep the ids, try again
            log.warning("relay: PostgreSQL did not answer (%s); %d rows wait", exc, len(ids))
            time.sleep(RETRY_PAUSE_S)
            self._inbox.put(tuple(ids))
            items = list(rows)  # the ids stay in flight
        except Exception:
            log.exception(
                "relay: could not read %d outbox rows; the reconciler will resend", len(ids)
            )
        self._done(len(items) - len(rows))  # already sent by someone else, or unread
        self._publish_rows(rows)

    def _publish_rows(self, rows: list[OutboxRow]) -> None:
        """Hand rows to the I/O thread (from any thread); a row that cannot be routed stays
        claimed, for a drain's reclaim."""
        try:
            now = self._clock()
            publications = [
                replace(pub, trace_headers=self._trace_of(row))
                for pub, row in zip(
                    (self._router.publication(row, now) for row in rows), rows, strict=True
                )
            ]
        except Exception:
            log.exception("relay: could not route %d rows; a drain will reclaim them", len(rows))
            self._done(len(rows))
            return
        assert self._io is not None
        self._io.publish(publications)

    def _trace_of(self, row: OutboxRow) -> tuple[tuple[str, str], ...]:
        """A row's stored traceparent (the workflow event that wrote it), sent by every
        relay, traced or not; else a traced relay's publish span; else none."""
        if row.traceparent:
            return (("traceparent", row.traceparent),)
        if self._trace_headers is not None:
            return tuple(self._trace_headers(row).items())
        return ()

    def _settle_confirms(self) -> None:
        sent: list[int] = []
        failed: list[int] = []
        while len(sent) + len(failed) < self._mark_batch:
            try:
                outbox_id, ok = self._results.get_nowait()
            except queue.Empty:
                break
            (sent if ok else failed).append(outbox_id)
        if not sent and not failed:
            return
        try:
            self._records.mark_sent(sent)
            self._records.release(failed)
        except Exception:
            log.exception("relay: could not mark %d rows; they will be sent again", len(sent))
        self.published += len(sent)
        self.returned += len(failed)
        self._done(len(sent) + len(failed))

    def _done(self, count: int) -> None:
        if count:
            with self._idle:
                self._in_flight -= count
                if self._in_flight <= 0:
                    self._idle.notify_all()


class _Publisher:
    """The I/O thread: a confirm-mode channel on a ``SelectConnection``, reconnecting."""

    def __init__(
        self,
        url: str,
        results: queue.Queue[tuple[int, bool]],
        stopping: threading.Event,
        ready: threading.Event,
    ) -> None:
        self._params = parameters(url)  # one per node: the next one at each reconnect
        self._results = results
        self._stopping = stopping
        self._ready = ready
        self._connection: pika.SelectConnection | None = None
        self._channel: pika.channel.Channel | None = None
        self._next_tag = 0
        self._pending: dict[int, int] = {}  # delivery tag -> outbox id
        self._returned: set[int] = set()
        self._backlog: list[Publication] = []
        self.priorities = MessagePriorities()  # the work queues', detected at each connect

    def run(self) -> None:
        attempt = 0
        while not self._stopping.is_set():
            self._connection = pika.SelectConnection(
                self._params[attempt % len(self._params)],
                on_open_callback=self._on_open,
                on_open_error_callback=self._on_closed,
                on_close_callback=self._on_closed,
            )
            self._connection.ioloop.start()
            self._connection.ioloop.close()  # its wakeup socket pair
            self._fail_pending()
            if self._stopping.is_set():
                break
            delay = RECONNECT_DELAYS[min(attempt, len(RECONNECT_DELAYS) - 1)]
            log.warning(
                "relay: connection to RabbitMQ lost, reconnect %d in %.1fs", attempt + 1, delay
            )
            attempt += 1
            time.sleep(delay)

    def publish(self, publications: list[Publication]) -> None:
        connection = self._connection
        if connection is None or not publications:
            self._fail(p.outbox_id for p in publications)
            return
        try:
            connection.ioloop.add_callback_threadsafe(lambda: self._send(publications))
        except Exception:  # noqa: BLE001 - the loop is gone: give the rows back
            self._fail(p.outbox_id for p in publications)

    def close(self) -> None:
        connection = self._connection
        if connection is not None:
            with contextlib.suppress(Exception):  # already closed
                connection.ioloop.add_callback_threadsafe(self._close)

    # -- ioloop callbacks ------------------------------------------------------------------

    def _close(self) -> None:
        if self._connection is not None and self._connection.is_open:
            self._connection.close()
        elif self._connection is not None:
            self._connection.ioloop.stop()

    def _on_open(self, connection: Any) -> None:
        self.priorities = message_priorities({"x-queue-type": QUORUM}, detect(connection))
        connection.channel(on_open_callback=self._on_channel)

    def _on_channel(self, channel: pika.channel.Channel) -> None:
        self._channel = channel
        self._next_tag = 0
        channel.add_on_return_callback(self._on_return)
        channel.add_on_close_callback(self._on_channel_closed)
        channel.confirm_delivery(ack_nack_callback=self._on_confirm, callback=self._on_confirming)

    def _on_channel_closed(self, _channel: Any, reason: Any) -> None:
        """A closed channel (a broker error, or shutdown) ends this connection: the run
        loop fails what is pending and reconnects."""
        self._channel = None
        if self._connection is not None and self._connection.is_open:
            log.warning("relay: channel closed: %s", reason)
            self._connection.close()

    def _on_confirming(self, _frame: Any) -> None:
        self._ready.set()
        backlog, self._backlog = self._backlog, []
        if backlog:
            self._send(backlog)

    def _on_closed(self, _connection: Any, reason: Any = None) -> None:
        self._channel = None
        if reason is not None and not self._stopping.is_set():
            log.warning("relay: RabbitMQ connection closed: %s", reason)
        if self._connection is not None:
            self._connection.ioloop.stop()

    def _send(self, publications: list[Publication]) -> None:
        channel = self._channel
        if channel is None or not channel.is_open:
            self._backlog.extend(publications)
            return
        for pub in publications:
            properties = pika.BasicProperties(
                content_type="application/json",
                delivery_mode=2,
                message_id=pub.message_id,
                correlation_id=pub.correlation_id,
                priority=self.priorities.of(pub.priority),
                type="job.dispatch",
                headers={
                    OUTBOX_HEADER: pub.outbox_id,
                    SOLO_HEADER: pub.solo,
                    **dict(pub.trace_headers),
                },
            )
            channel.basic_publish(
                pub.exchange, pub.routing_key, pub.body, properties, mandatory=True
            )
            self._next_tag += 1
            self._pending[self._next_tag] = pub.outbox_id

    def _on_return(
        self, _channel: Any, method: Any, properties: pika.BasicProperties, _body: bytes
    ) -> None:
        outbox_id = (properties.headers or {}).get(OUTBOX_HEADER)
        log.warning(
            "relay: pointer %s was unroutable (%s)", properties.message_id, method.reply_text
        )
        if isinstance(outbox_id, int):
            self._returned.add(outbox_id)

    def _on_confirm(self, frame: pika.frame.Method) -> None:
        method = frame.method
        ok = isinstance(method, pika.spec.Basic.Ack)
        tags = (
            [t for t in self._pending if t <= method.delivery_tag]
            if method.multiple
            else [method.delivery_tag]
        )
        for tag in tags:
            outbox_id = self._pending.pop(tag, None)
            if outbox_id is not None:
                routed = ok and outbox_id not in self._returned
                self._returned.discard(outbox_id)
                self._results.put((outbox_id, routed))

    def _fail_pending(self) -> None:
        pending, self._pending = self._pending, {}
        backlog, self._backlog = self._backlog, []
        self._fail([*pending.values(), *(p.outbox_id for p in backlog)])
        self._returned.clear()

    def _fail(self, outbox_ids: Iterable[int]) -> None:
        for outbox_id in outbox_ids:
            self._results.put((outbox_id, False))
