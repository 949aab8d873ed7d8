"""The console's live updates on the real stack: `vibey console` against PostgreSQL and
RabbitMQ. An event the real publisher sends to the events exchange wakes an open
server-sent-event stream within a second while the poll is an hour apart (only the event path
can explain it); without the events — the postgres backend, or a broker that does not answer
— the poll keeps the stream live; a console whose broker goes away falls back to the poll and
follows the events again once the broker is back."""

from __future__ import annotations

import http.client
import json
import queue
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit
from uuid import uuid4

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from actors.event_publisher import EventPublisher
from store.events import EventLog
from tests.acceptance.console_process import Console, console_process, free_port, wait_feed
from tests.acceptance.stack import DEMO_SCRIPT, Stack
from tests.amqp_fixtures import Amqp
from tests.chaos.tcp_proxy import TcpProxy

AN_HOUR = "3600"
WITHIN_S = 1.0


class Stream:
    """One open /events stream, read on a thread: each ``change`` as (monotonic time, data)."""

    def __init__(self, console: Console) -> None:
        self._log = console.log
        self._http = http.client.HTTPConnection("127.0.0.1", console.port, timeout=60)
        self._http.request("GET", "/events", headers={"Accept": "text/event-stream"})
        answer = self._http.getresponse()
        assert answer.status == 200, answer.read()
        self.changes: queue.Queue[tuple[float, dict[str, Any]]] = queue.Queue()
        threading.Thread(target=self._read, args=(answer,), daemon=True).start()

    def _read(self, answer: http.client.HTTPResponse) -> None:
        event = None
        try:
            for raw in answer:
                line = raw.decode().rstrip("\n")
                if line.startswith("event: "):
                    event = line.removeprefix("event: ")
                elif line.startswith("data: ") and event == "change":
                    self.changes.put((time.monotonic(), json.loads(line.removeprefix("data: "))))
        except (OSError, ValueError, AttributeError):
            return  # closed at the end of the test (http.client drops its file: AttributeError)

    def next(self, timeout: float) -> tuple[float, dict[str, Any]]:
        try:
            return self.changes.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(
                f"no change on the stream within {timeout}s; the console's log:\n"
                + self._log.read_text(errors="replace")[-3000:]
            ) from None

    def quiet(self, seconds: float) -> None:
        """Wait ``seconds``, then forget what came (the start's reads settle)."""
        time.sleep(seconds)
        while not self.changes.empty():
            self.changes.get_nowait()

    def close(self) -> None:
        self._http.close()


@contextmanager
def streaming(console: Console) -> Iterator[Stream]:
    stream = Stream(console)
    try:
        yield stream
    finally:
        stream.close()


@pytest.fixture
def publisher(pool: ConnectionPool, amqp: Amqp) -> Iterator[EventPublisher]:
    """The publisher a worker runs (``actors.worker.event_service``), on the test's exchange."""
    amqp.exchanges.add(f"{amqp.prefix}.events")
    published = EventPublisher(
        url=amqp.url, events=EventLog(pool=pool), exchange=f"{amqp.prefix}.events"
    )
    yield published
    published.close()


def open_a_gate(pg_url: str) -> None:
    """A change the domain events do not report (written behind the store's back)."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO gate (id, project_id, kind, prompt) VALUES (%s, 'p', 'approval', 'ok?')",
            (uuid4(),),
        )


def slow_poll(e2e: Stack, **extra: str) -> dict[str, str]:
    return e2e.env | {"VIBEY_CONSOLE_POLL": AN_HOUR, "VIBEY_CONSOLE_SAFETY_POLL": AN_HOUR} | extra


def test_a_published_event_wakes_a_stream_within_a_second_while_the_poll_sleeps(
    e2e: Stack, publisher: EventPublisher, tmp_path: Path
) -> None:
    with console_process(slow_poll(e2e), e2e.workspace.parent, tmp_path / "console.log") as web:
        wait_feed(web, "events")
        with streaming(web) as stream:
            stream.next(timeout=5)  # the marker of the console's first reads
            stream.quiet(0.5)
            e2e.vibey("workflow", "start", "demo", "--script", str(DEMO_SCRIPT))
            assert publisher.publish_pending() >= 1  # workflow.started, and what follows it
            sent = time.monotonic()
            arrived, change = stream.next(timeout=5)
    assert arrived - sent < WITHIN_S, f"{arrived - sent:.2f}s"
    assert change["event_type"] in {"workflow.started", "phase.transitioned", "gate.opened"}
    assert change["workflow_id"] == e2e.status("demo")["workflow"]["id"]


@pytest.mark.parametrize("without", ["the postgres backend", "a broker that does not answer"])
def test_without_the_events_the_poll_keeps_a_stream_live(
    e2e: Stack, pg_url: str, tmp_path: Path, without: str
) -> None:
    if without == "the postgres backend":
        env = e2e.env | {"VIBEY_QUEUE_BACKEND": "postgres"}
    else:
        env = e2e.env | {"VIBEY_AMQP_URL": f"amqp://guest:guest@127.0.0.1:{free_port()}/"}
    env |= {"VIBEY_CONSOLE_POLL": "0.2", "VIBEY_CONSOLE_SAFETY_POLL": AN_HOUR}
    with console_process(env, e2e.workspace.parent, tmp_path / "console.log") as web:
        with streaming(web) as stream:
            stream.next(timeout=5)
            stream.quiet(0.5)
            open_a_gate(pg_url)
            changed = time.monotonic()
            arrived, change = stream.next(timeout=5)
        assert web.feed() == "poll"
    assert arrived - changed < 2.0, f"{arrived - changed:.2f}s"
    assert change["event_type"] is None  # the poll saw it


def test_a_console_whose_broker_goes_away_polls_then_follows_the_events_again(
    e2e: Stack, amqp: Amqp, pg_url: str, publisher: EventPublisher, tmp_path: Path
) -> None:
    broker = urlsplit(amqp.url)
    target = (broker.hostname or "127.0.0.1", broker.port or 5672)
    proxy = TcpProxy(listen_port=0, target=target)
    port = proxy.port
    login = broker.netloc.rsplit("@", 1)[0] + "@" if "@" in broker.netloc else ""
    via_proxy = urlunsplit(broker._replace(netloc=f"{login}127.0.0.1:{port}"))
    env = e2e.env | {
        "VIBEY_AMQP_URL": via_proxy,
        "VIBEY_CONSOLE_POLL": "0.2",
        "VIBEY_CONSOLE_SAFETY_POLL": AN_HOUR,
    }
    try:
        with console_process(env, e2e.workspace.parent, tmp_path / "console.log") as web:
            wait_feed(web, "events")
            with streaming(web) as stream:
                stream.next(timeout=5)
                proxy.close()  # the broker goes away: no connection is accepted either
                wait_feed(web, "poll", timeout=10)
                stream.quiet(0.5)
                open_a_gate(pg_url)
                stream.next(timeout=3)  # the fast poll keeps the page live meanwhile
                proxy = TcpProxy(listen_port=port, target=target)
                wait_feed(web, "events", timeout=30)  # reconnected, with backoff
                stream.quiet(0.5)
                e2e.vibey("workflow", "start", "demo", "--script", str(DEMO_SCRIPT))
                assert publisher.publish_pending() >= 1
                sent = time.monotonic()
                arrived, change = stream.next(timeout=5)
        assert arrived - sent < WITHIN_S, f"{arrived - sent:.2f}s"
        assert change["event_type"] is not None
    finally:
        proxy.close()
