"""What the connected RabbitMQ honours, derived from its version.

RabbitMQ 3.10 accepts unknown ``x-`` queue arguments silently (``x-consumer-timeout`` is taken
and ignored), so a declaration cannot tell us what works: the version can. The server announces
it in the AMQP handshake (``server_properties["version"]``); :func:`detect` reads it from a pika
connection and :func:`capabilities_for` maps it, purely, to a :class:`BrokerCapabilities`.

A version that cannot be read maps to the conservative answer: every capability ``False`` and
``version == "unknown"``. ``xdeath_count_reliable`` is ``False`` there too: when in doubt, do not
count attempts with ``x-death``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

UNKNOWN_VERSION = "unknown"

# major.minor[.patch] and then nothing, or a pre-release / build suffix ("4.0.0-rc.1", "3.13.7+x").
_VERSION = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?(?:[-+~][0-9A-Za-z.+~-]*)?")

Version = tuple[int, int, int]

# capability -> (first version that has it, last version + 1 that has it); None = open.
_RANGES: dict[str, tuple[Version | None, Version | None]] = {
    "per_queue_consumer_timeout": ((3, 12, 0), None),
    "quorum_priorities": ((4, 0, 0), None),
    "default_delivery_limit_20": ((4, 0, 0), None),
    "consumer_timeout_quorum_only": ((4, 3, 0), None),
    "xdeath_count_reliable": (None, (4, 0, 0)),
}

_MEANING: dict[str, str] = {
    "per_queue_consumer_timeout": "x-consumer-timeout queue argument honoured",
    "quorum_priorities": "quorum queues honour message priorities",
    "default_delivery_limit_20": "quorum queues default to x-delivery-limit 20",
    "consumer_timeout_quorum_only": "consumer timeouts apply to quorum queues only",
    "xdeath_count_reliable": "x-death count is kept on republish",
}


@dataclass(frozen=True, slots=True)
class BrokerCapabilities:
    """Version-gated RabbitMQ behaviours; the defaults are the conservative answer."""

    version: str = UNKNOWN_VERSION
    per_queue_consumer_timeout: bool = False  # >= 3.12
    quorum_priorities: bool = False  # >= 4.0
    default_delivery_limit_20: bool = False  # >= 4.0
    consumer_timeout_quorum_only: bool = False  # >= 4.3
    xdeath_count_reliable: bool = False  # < 4.0

    @property
    def known(self) -> bool:
        return self.version != UNKNOWN_VERSION

    def as_table(self) -> list[tuple[str, str]]:
        """Rows for ``vibey doctor``: the version, then each capability with yes or no."""
        rows = [("RabbitMQ version", self.version)]
        for name in _RANGES:
            answer = "yes" if getattr(self, name) else "no"
            rows.append((f"{name} ({_MEANING[name]}, {_range_text(name)})", answer))
        return rows


def parse_version(version: str) -> Version | None:
    """``(major, minor, patch)``, or None when the text is not a RabbitMQ release version.

    Versions below 3.0 are refused: a RabbitMQ built from source reports ``0.0.0``.
    """
    match = _VERSION.fullmatch(version.strip())
    if match is None:
        return None
    major, minor, patch = (int(part) if part else 0 for part in match.groups())
    if major < 3:
        return None
    return major, minor, patch


def capabilities_for(version: str) -> BrokerCapabilities:
    """The capabilities of a RabbitMQ announcing ``version`` (pure)."""
    parsed = parse_version(version)
    if parsed is None:
        return BrokerCapabilities()
    flags = {name: _in_range(parsed, *bounds) for name, bounds in _RANGES.items()}
    return BrokerCapabilities(version=version.strip(), **flags)


def detect(connection: Any) -> BrokerCapabilities:
    """The capabilities of the broker behind an open pika connection.

    Takes a ``pika.BlockingConnection`` (whose handshake lives on ``connection._impl``) or an
    asynchronous pika connection; a missing or garbled version gives the conservative answer.
    """
    impl = getattr(connection, "_impl", connection)
    properties = getattr(impl, "server_properties", None) or {}
    raw = properties.get("version") if isinstance(properties, dict) else None
    if isinstance(raw, bytes):
        raw = raw.decode("utf-8", errors="replace")
    return capabilities_for(raw) if isinstance(raw, str) else BrokerCapabilities()


def _in_range(version: Version, first: Version | None, end: Version | None) -> bool:
    return (first is None or version >= first) and (end is None or version < end)


def _range_text(name: str) -> str:
    first, end = _RANGES[name]
    parts = []
    if first is not None:
        parts.append(f">= {_short(first)}")
    if end is not None:
        parts.append(f"< {_short(end)}")
    return " and ".join(parts)


def _short(version: Version) -> str:
    return f"{version[0]}.{version[1]}"


# Quorum queues (RabbitMQ 4.0+) have two priority levels: a priority above 4 is "high".
QUORUM_HIGH_PRIORITY = 5


@dataclass(frozen=True, slots=True)
class MessagePriorities:
    """How a queue honours AMQP message priorities. ``top``: the highest value it tells apart
    from 0 (0: it ignores them); ``binary``: only two levels, 0 and ``top``."""

    top: int = 0
    binary: bool = False

    @property
    def honoured(self) -> bool:
        return self.top > 0

    @property
    def levels(self) -> int:
        return 1 if not self.honoured else 2 if self.binary else self.top + 1

    def of(self, job_priority: int) -> int | None:
        """The AMQP priority for a job's priority (higher is more urgent); None: send none."""
        if not self.honoured or job_priority <= 0:
            return None
        return self.top if self.binary else min(job_priority, self.top)

    def describe(self) -> str:
        if not self.honoured:
            return "ignored (FIFO within a queue; the lanes keep interactive steps apart)"
        return f"honoured, {self.levels} levels"


def message_priorities(arguments: Mapping[str, Any], caps: BrokerCapabilities) -> MessagePriorities:
    """What a queue declared with ``arguments`` does with message priorities on a broker with
    ``caps``: detected from its type and the version, never assumed.

    Quorum queues honour two levels from RabbitMQ 4.0 (and reject ``x-max-priority``);
    before that they ignore priorities. A classic queue honours ``0..x-max-priority``.
    """
    if arguments.get("x-queue-type") == "quorum":
        return (
            MessagePriorities(QUORUM_HIGH_PRIORITY, binary=True)
            if caps.quorum_priorities
            else (MessagePriorities())
        )
    top = arguments.get("x-max-priority")
    if isinstance(top, int) and not isinstance(top, bool) and top > 0:
        return MessagePriorities(min(top, 255))
    return MessagePriorities()
