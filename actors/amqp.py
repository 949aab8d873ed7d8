"""Several AMQP URLs, one per node of a RabbitMQ cluster.

``[bus] amqp_url`` (``VIBEY_AMQP_URL``) may list several URLs separated by ``;``, as Dramatiq's
RabbitmqBroker takes them. A connection tries them in order (pika's BlockingConnection takes
the list), so a client whose node went away reconnects to the next one; the relay's
asynchronous connection moves to the next URL at each reconnect.

The blocking connection and the errors its users catch are named here, so that pika stays in
the broker modules (the import-linter contract "pika stays in the broker modules").
"""

from __future__ import annotations

import pika
from pika import BlockingConnection as BlockingConnection
from pika.exceptions import AMQPError as AMQPError
from pika.exceptions import ChannelClosedByBroker as ChannelClosedByBroker
from pika.exceptions import IncompatibleProtocolError as IncompatibleProtocolError
from pika.exceptions import ProbableAccessDeniedError as ProbableAccessDeniedError
from pika.exceptions import ProbableAuthenticationError as ProbableAuthenticationError


def split_urls(url: str) -> list[str]:
    """The URLs of ``url`` (one, or several separated by ``;``), in order."""
    return [part.strip() for part in url.split(";") if part.strip()]


def parameters(url: str, *, timeout: float | None = None) -> list[pika.URLParameters]:
    """One ``URLParameters`` per URL; ``timeout``: one attempt each, bounded by it."""
    params = [pika.URLParameters(part) for part in split_urls(url)]
    if timeout is not None:
        for one in params:
            one.connection_attempts = 1
            one.retry_delay = 0
            one.socket_timeout = timeout
            one.stack_timeout = timeout
            one.blocked_connection_timeout = timeout
    return params


def with_query(url: str, query: str) -> str:
    """``query`` (as ``heartbeat=30``) added to every URL of ``url``."""
    return ";".join(f"{u}{'&' if '?' in u else '?'}{query}" for u in split_urls(url))


def connect(url: str, *, timeout: float | None = None) -> BlockingConnection:
    """A blocking connection to the first node of ``url`` that answers (see :func:`parameters`)."""
    return BlockingConnection(parameters(url, timeout=timeout))
