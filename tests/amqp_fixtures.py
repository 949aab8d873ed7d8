"""RabbitMQ fixtures (star-imported by ``tests/conftest.py``).

The broker comes from ``VIBEY_TEST_AMQP_URL`` when it is set (it must answer); otherwise from a
testcontainers RabbitMQ where Docker works; otherwise every test that needs it fails with the
line that fixes it. Nothing is skipped.

Isolation: each pytest process (each xdist worker) creates one vhost, ``vibey_test_<worker>_<pid>``,
with ``rabbitmqctl`` when the URL points at this machine and ``rabbitmqctl`` answers, and deletes
it at the end of the session (creating one costs about 1.5 s, so not one per test). Otherwise it
uses the URL's own vhost. Inside it, each test has its own name prefix (``t<8 hex>``), and its
teardown deletes every queue and exchange declared through ``amqp.channel()`` whose name starts
with that prefix.
"""

from __future__ import annotations

import gc
import ipaddress
import json
import os
import shutil
import subprocess
import uuid
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import pika
import pika.exceptions
import pytest

from actors.topology import QueueNames

__all__ = ["amqp", "amqp_broker", "amqp_prefix", "amqp_url", "amqp_vhost"]

AMQP_FIX = (
    "no RabbitMQ for the tests: export VIBEY_TEST_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/ "
    "(or run `just up`), or start Docker so testcontainers can"
)
RABBITMQ_IMAGE = "rabbitmq:3.10"  # the dev broker's series; production is 4.x, test it by URL
CTL_TIMEOUT_SECONDS = 60

Ctl = Callable[..., str]  # rabbitmqctl ARGS... -> stdout; raises RuntimeError on failure


@dataclass(frozen=True)
class AmqpBroker:
    """The session's broker: a URL and, when reachable, a way to run rabbitmqctl on it."""

    url: str
    ctl: Ctl | None


@dataclass(frozen=True)
class AmqpVhost:
    url: str  # vhost-qualified
    name: str
    ctl: Ctl | None


def with_vhost(url: str, vhost: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path="/" + quote(vhost, safe="")))


def vhost_of(url: str) -> str:
    return str(pika.URLParameters(url).virtual_host)


def _problem(url: str) -> str | None:
    """None when ``url`` opens an AMQP connection, else why not, in one line."""
    params = pika.URLParameters(url)
    params.connection_attempts = 1
    params.socket_timeout = 5
    params.blocked_connection_timeout = 5
    try:
        pika.BlockingConnection(params).close()
    except pika.exceptions.AMQPError as exc:
        return repr(exc)[:300]  # pika's repr names the cause; its str is often empty
    except OSError as exc:
        return str(exc)[:300]
    return None


def _local_ctl(*args: str) -> str:
    done = subprocess.run(
        ["rabbitmqctl", "-q", *args],
        capture_output=True,
        text=True,
        timeout=CTL_TIMEOUT_SECONDS,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {done.stderr.strip()[:300]}")
    return done.stdout


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or "localhost"
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@pytest.fixture(scope="session")
def amqp_broker() -> Iterator[AmqpBroker]:
    url = os.environ.get("VIBEY_TEST_AMQP_URL")
    if url:
        problem = _problem(url)
        if problem:
            pytest.fail(
                f"VIBEY_TEST_AMQP_URL does not answer ({problem}). {AMQP_FIX}", pytrace=False
            )
        local = _is_loopback(url) and shutil.which("rabbitmqctl") is not None
        yield AmqpBroker(url, _local_ctl if local else None)
        return
    yield from _container_broker()


def _container_broker() -> Iterator[AmqpBroker]:
    with warnings.catch_warnings():
        # testcontainers 4.15 decorates RabbitMqContainer with a deprecated helper at import.
        warnings.simplefilter("ignore", DeprecationWarning)
        from testcontainers.community.rabbitmq import RabbitMqContainer
    docker_problem = None
    try:
        container = RabbitMqContainer(RABBITMQ_IMAGE).start()
    except Exception as exc:  # noqa: BLE001 - any Docker failure means "no container here"
        docker_problem = str(exc).splitlines()[0][:120] if str(exc) else repr(exc)
    if docker_problem is not None:
        with warnings.catch_warnings():  # the failed Docker client leaves its socket to the GC
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        pytest.fail(f"{AMQP_FIX} (Docker: {docker_problem})", pytrace=False)
    try:
        params = container.get_connection_params()
        host, port = params.host, params.port
        url = f"amqp://{container.username}:{container.password}@{host}:{port}/"

        def ctl(*args: str) -> str:
            code, output = container.exec(["rabbitmqctl", "-q", *args])
            text = output.decode() if isinstance(output, bytes) else str(output)
            if code != 0:
                raise RuntimeError(f"rabbitmqctl {' '.join(args)}: {text.strip()[:300]}")
            return text

        yield AmqpBroker(url, ctl)
    finally:
        container.stop()


@pytest.fixture(scope="session")
def amqp_url(amqp_broker: AmqpBroker) -> str:
    """The broker's URL as given (its own vhost)."""
    return amqp_broker.url


@pytest.fixture(scope="session")
def amqp_vhost(amqp_broker: AmqpBroker) -> Iterator[AmqpVhost]:
    """One vhost for this pytest process, or the URL's own when it cannot be created."""
    ctl, user = amqp_broker.ctl, pika.URLParameters(amqp_broker.url).credentials.username
    name = f"vibey_test_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}_{os.getpid()}"
    url = with_vhost(amqp_broker.url, name)
    if ctl is None or not _create_vhost(ctl, name, user, url):
        # rabbitmqctl is missing, refused, or reached another node: it says nothing about ours.
        yield AmqpVhost(amqp_broker.url, vhost_of(amqp_broker.url), None)
        return
    try:
        yield AmqpVhost(url, name, ctl)
    finally:
        ctl("delete_vhost", name)


def _create_vhost(ctl: Ctl, name: str, user: str, url: str) -> bool:
    """Create the vhost; False (and nothing left behind) when this broker is not ctl's node."""
    try:
        ctl("add_vhost", name)
    except RuntimeError:
        return False
    try:
        ctl("set_permissions", "-p", name, user, ".*", ".*", ".*")
    except RuntimeError:
        ctl("delete_vhost", name)
        return False
    if _problem(url) is not None:  # rabbitmqctl reached another node than the URL
        ctl("delete_vhost", name)
        return False
    return True


@pytest.fixture
def amqp_prefix() -> str:
    return f"t{uuid.uuid4().hex[:8]}"


class RecordingChannel:
    """A pika BlockingChannel that remembers the queues and exchanges it declares."""

    def __init__(self, channel: Any, amqp: Amqp) -> None:
        self._channel = channel
        self._amqp = amqp

    def queue_declare(self, queue: str, *args: Any, **kwargs: Any) -> Any:
        self._amqp.queues.add(queue)
        return self._channel.queue_declare(queue, *args, **kwargs)

    def exchange_declare(self, exchange: str, *args: Any, **kwargs: Any) -> Any:
        self._amqp.exchanges.add(exchange)
        return self._channel.exchange_declare(exchange, *args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._channel, name)


@dataclass
class Amqp:
    """What a RabbitMQ test gets: a vhost URL, its own name prefix, and cleanup."""

    url: str
    vhost: str
    prefix: str
    names: QueueNames
    ctl: Ctl | None
    queues: set[str] = field(default_factory=set)
    exchanges: set[str] = field(default_factory=set)
    _connections: list[Any] = field(default_factory=list)

    def connect(self) -> pika.BlockingConnection:
        """A new connection, closed at teardown."""
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        self._connections.append(connection)
        return connection

    def channel(self, connection: pika.BlockingConnection | None = None) -> RecordingChannel:
        """A channel whose declarations are deleted at teardown."""
        return RecordingChannel((connection or self.connect()).channel(), self)

    def list_queues(self) -> dict[str, dict[str, Any]]:
        """This test's queues as rabbitmqctl sees them: name -> {"type", "arguments"}."""
        if self.ctl is None:
            raise RuntimeError("no rabbitmqctl for this broker")
        rows = json.loads(
            self.ctl(
                "list_queues", "-p", self.vhost, "name", "type", "arguments", "--formatter", "json"
            )
        )
        return {
            row["name"]: {
                "type": row["type"],
                "arguments": {key: value for key, _type, value in row["arguments"]},
            }
            for row in rows
            if row["name"].startswith(self.prefix + ".")
        }

    def cleanup(self) -> None:
        for connection in self._connections:
            if connection.is_open:
                connection.close()
        connection = pika.BlockingConnection(pika.URLParameters(self.url))
        try:
            channel = connection.channel()
            for queue in sorted(n for n in self.queues if n.startswith(self.prefix)):
                channel.queue_delete(queue)
            for exchange in sorted(n for n in self.exchanges if n.startswith(self.prefix)):
                channel.exchange_delete(exchange)
        finally:
            connection.close()


@pytest.fixture
def amqp(amqp_vhost: AmqpVhost, amqp_prefix: str) -> Iterator[Amqp]:
    broker = Amqp(
        url=amqp_vhost.url,
        vhost=amqp_vhost.name,
        prefix=amqp_prefix,
        names=QueueNames(amqp_prefix),
        ctl=amqp_vhost.ctl,
    )
    try:
        yield broker
    finally:
        broker.cleanup()
