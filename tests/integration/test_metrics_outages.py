"""A scrape names the right outage: RabbitMQ unreachable while PostgreSQL answers, and the
reverse. Each source is reached through a TCP proxy of the test's own (closed to make it
unreachable, opened again on the same port): the shared services are never stopped.

``vibey_broker_up`` and ``vibey_store_up`` each say whether their own source answered, the
other source's gauges stay in the scrape, and the exporter reads the broker over one
long-lived connection (opened again only after the outage).
"""

from __future__ import annotations

import socket
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from urllib.parse import urlsplit, urlunsplit

import pytest

from actors import metrics
from actors.capabilities import detect
from actors.config import BusSettings, DatabaseSettings
from actors.worker import WorkerConfig
from store.operations import OperationsStore
from store.pool import open_pool
from tests.amqp_fixtures import Amqp
from tests.chaos.tcp_proxy import TcpProxy


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def via(url: str, port: int) -> str:
    """``url`` with its host and port replaced by the proxy's."""
    parts = urlsplit(url)
    credentials = parts.netloc.rpartition("@")[0]
    netloc = f"{credentials}@127.0.0.1:{port}" if credentials else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


def target(url: str) -> tuple[str, int]:
    parts = urlsplit(url)
    return parts.hostname or "127.0.0.1", int(parts.port or 0)


def scrape(port: int) -> dict[str, float]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=60) as answer:
        text = answer.read().decode()
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


@contextmanager
def exporter(
    pg_url: str, amqp_url: str, dead_queue: str
) -> Iterator[tuple[int, metrics.QueueDepth]]:
    pool = open_pool(pg_url, min_size=1, max_size=2, name="metrics-test")
    depth = metrics.QueueDepth(amqp_url, dead_queue)
    collector = metrics.StoreCollector(OperationsStore(pool), dead_queue_depth=depth)
    server = metrics.MetricsServer(port=0, host="127.0.0.1", collectors=[collector]).start()
    try:
        yield server.port, depth
    finally:
        server.stop()
        depth.close()
        pool.close()


@pytest.fixture
def dead_queue(pg_url: str, amqp: Amqp) -> str:
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))
    connection.close()
    return config.names.dead_queue


STORE_GAUGES = (
    "vibey_outbox_unsent",
    "vibey_dead_letters_kept",
    "vibey_reconcile_heartbeat_age_seconds",
)


def test_rabbitmq_unreachable_reads_as_the_broker_not_the_store(
    pg_url: str, amqp: Amqp, dead_queue: str
) -> None:
    port = free_port()
    proxy = TcpProxy(listen_port=port, target=target(amqp.url))
    with exporter(pg_url, via(amqp.url, port), dead_queue) as (http, depth):
        for _ in range(3):
            up = scrape(http)
            assert up["vibey_broker_up"] == 1 and up["vibey_store_up"] == 1
            assert up["vibey_dead_letter_queue_depth"] == 0
        assert depth.opened == 1  # one connection, kept across scrapes
        proxy.close()
        down = scrape(http)
        assert down["vibey_broker_up"] == 0
        assert down["vibey_store_up"] == 1
        assert all(gauge in down for gauge in STORE_GAUGES), down
        assert "vibey_dead_letter_queue_depth" not in down
        proxy = TcpProxy(listen_port=port, target=target(amqp.url))
        try:
            back = scrape(http)
            assert back["vibey_broker_up"] == 1 and back["vibey_dead_letter_queue_depth"] == 0
            assert depth.opened == 2  # opened again after the failure, not per scrape
            scrape(http)
            assert depth.opened == 2
        finally:
            proxy.close()


def test_postgresql_unreachable_reads_as_the_store_not_the_broker(
    pg_url: str, amqp: Amqp, dead_queue: str
) -> None:
    port = free_port()
    proxy = TcpProxy(listen_port=port, target=target(pg_url))
    try:
        with exporter(via(pg_url, port), amqp.url, dead_queue) as (http, _depth):
            up = scrape(http)
            assert up["vibey_store_up"] == 1 and up["vibey_broker_up"] == 1
            proxy.close()
            down = scrape(http)
            assert down["vibey_store_up"] == 0
            assert not any(gauge in down for gauge in STORE_GAUGES), down
            assert down["vibey_broker_up"] == 1
            assert down["vibey_dead_letter_queue_depth"] == 0
    finally:
        proxy.close()
