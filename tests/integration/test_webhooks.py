"""Webhooks on the real stack: a local receiver gets one signed POST per gate opened; a dead
receiver (it accepts connections and never answers) delays neither the workflows nor the live
receiver; every attempt is recorded in PostgreSQL."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from actors.event_publisher import EventPublisher
from actors.webhook_spec import WebhookConfigError, WebhookSpec, parse_webhooks
from actors.webhooks import SIGNATURE_HEADER, TIMESTAMP_HEADER, WebhookService, sign, verify
from store.events import EventLog
from store.jobs import PostgresJobRepository
from store.webhooks import WebhookDeliveries
from store.workflows import WorkflowStore
from tests.amqp_fixtures import Amqp
from tests.deadline_definition import Deadlined
from workflows.engine import Registry, Status
from workflows.events import decode
from workflows.queue import AnswerStatus

SECRET = "s3cret"


class Receiver(ThreadingHTTPServer):
    def __init__(self) -> None:
        self.posts: list[tuple[dict[str, str], bytes]] = []
        super().__init__(("127.0.0.1", 0), _Handler)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/hook"


class _Handler(BaseHTTPRequestHandler):
    server: Receiver

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.posts.append((dict(self.headers.items()), body))
        self.send_response(204)
        self.end_headers()

    def log_message(self, *_args: Any) -> None:
        pass


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    server = Receiver()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture
def black_hole() -> Iterator[str]:
    """A port that accepts connections (the backlog) and never answers."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(64)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/hook"
    sock.close()


def wait_for(check: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_receiver_gets_a_signed_post_per_gate_opened_and_a_dead_one_delays_nothing(
    pool: ConnectionPool, amqp: Amqp, receiver: Receiver, black_hole: str
) -> None:
    exchange, queue = f"{amqp.prefix}.events", f"{amqp.prefix}.webhooks"
    amqp.exchanges.add(exchange)
    amqp.queues.add(queue)
    specs = [
        WebhookSpec("live", receiver.url, ("gate.opened",), SECRET),
        WebhookSpec("dead", black_hole, ("gate",), SECRET, max_attempts=3, timeout_s=1.0),
    ]
    service = WebhookService(
        amqp_url=amqp.url,
        pool=pool,
        specs=specs,
        exchange=exchange,
        queue=queue,
        interval=0.1,
        backoff_s=(0.2,),
    )
    service.consumer.declare(amqp.channel())
    store = WorkflowStore(
        pool=pool,
        jobs=PostgresJobRepository(pool=pool),
        registry=Registry([Deadlined(deadline=None)]),
    )
    publisher = EventPublisher(url=amqp.url, events=EventLog(pool=pool), exchange=exchange)
    service.start()
    try:
        began = time.monotonic()
        started = [store.start(f"w{n}", definition="deadlined").workflow for n in range(3)]
        publisher.publish_pending()
        wait_for(lambda: len(receiver.posts) >= 3, 10, "the live receiver got no POSTs")
        live_took = time.monotonic() - began
        # The dead endpoint holds each attempt for its 1 s timeout: the live one never waited.
        assert live_took < 3, live_took
        for workflow in started:  # the workflows go on regardless
            gate = store.jobs.open_gates(workflow.project_id)[0]
            assert store.answer(gate.id, "yes", by="ann").status is AnswerStatus.ANSWERED
            assert store.get(workflow.id).status is Status.COMPLETED
        assert time.monotonic() - began < 5
        now = time.time()
        ids = set()
        for headers, body in receiver.posts:
            assert verify(
                SECRET, body, headers[TIMESTAMP_HEADER], headers[SIGNATURE_HEADER], now=now
            )
            assert not verify(
                "wrong", body, headers[TIMESTAMP_HEADER], headers[SIGNATURE_HEADER], now=now
            )
            event = decode(body)
            assert event.event_type.value == "gate.opened" and headers["X-Vibey-Event-Id"] == str(
                event.event_id
            )
            ids.add(event.event_id)
        assert len(receiver.posts) == len(ids) == 3
        deliveries = WebhookDeliveries(pool=pool)
        wait_for(
            lambda: all(d["state"] == "failed" for d in deliveries.deliveries("dead")),
            30,
            "the dead webhook's deliveries were not given up",
        )
    finally:
        service.stop()
        publisher.close()
    dead = deliveries.deliveries("dead")
    assert len(dead) == 3 and all(d["attempts"] == 3 == d["recorded"] for d in dead)
    attempts = deliveries.attempts("dead")
    assert len(attempts) == 9 and all(a["error"] and a["status_code"] is None for a in attempts)
    live = deliveries.deliveries("live")
    assert [d["state"] for d in live] == ["delivered"] * 3
    assert [a["status_code"] for a in deliveries.attempts("live")] == [204] * 3


def test_signatures_refuse_a_replayed_or_tampered_post() -> None:
    body = b'{"x":1}'
    signature = sign(SECRET, 1_000, body)
    assert verify(SECRET, body, "1000", signature, now=1_100)
    assert not verify(SECRET, body, "1000", signature, now=1_000 + 301)  # replayed later
    assert not verify(SECRET, body + b" ", "1000", signature, now=1_100)
    assert not verify(SECRET, body, None, signature, now=1_100)


def test_webhook_tables_are_checked() -> None:
    (spec,) = parse_webhooks({"ops": {"url": "https://x/h", "secret": "k"}}, "vibey.toml")
    assert (
        spec.events == ("gate.opened",)
        and spec.wants("gate.opened")
        and not spec.wants("gate.answered")
    )
    assert WebhookSpec("a", "http://x", ("gate",), "k").wants("gate.expired")
    with pytest.raises(WebhookConfigError, match="secret"):
        parse_webhooks({"ops": {"url": "https://x/h"}}, "vibey.toml")
    with pytest.raises(WebhookConfigError, match="unknown key"):
        parse_webhooks({"ops": {"url": "https://x/h", "secret": "k", "retries": 3}}, "vibey.toml")
