"""The ``[notify.webhooks.<name>]`` tables: what a webhook is, read from the settings. Light (the
standard library and the pure event vocabulary), so reading the settings loads no broker client;
the service that posts them is :mod:`actors.webhooks`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from workflows.events import EventType


class WebhookConfigError(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class WebhookSpec:
    """One ``[notify.webhooks.<name>]`` table. ``events``: types (``gate.opened``), families
    (``gate``) or ``*``."""

    name: str
    url: str
    events: tuple[str, ...] = (EventType.GATE_OPENED.value,)
    secret: str = ""
    max_attempts: int = 8
    timeout_s: float = 5.0

    def wants(self, event_type: str) -> bool:
        family = event_type.split(".", 1)[0]
        return any(e in ("*", event_type, family) for e in self.events)


def parse_webhooks(tables: Any, where: str) -> tuple[WebhookSpec, ...]:
    """The ``[notify.webhooks.<name>]`` tables as specs; one line saying what is wrong."""
    if not isinstance(tables, Mapping):
        raise WebhookConfigError(f"{where}: [notify.webhooks] is a table of tables")
    specs = []
    known = {"url", "events", "secret", "max_attempts", "timeout_seconds"}
    for name, table in sorted(tables.items()):
        at = f"{where} [notify.webhooks.{name}]"
        if not isinstance(table, Mapping):
            raise WebhookConfigError(f"{at} must be a table")
        unknown = sorted(set(table) - known)
        if unknown:
            raise WebhookConfigError(
                f"{at}: unknown key {unknown[0]!r}; known: {', '.join(sorted(known))}"
            )
        url = table.get("url")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise WebhookConfigError(f'{at}: url = "https://…" is required')
        events = table.get("events", [EventType.GATE_OPENED.value])
        if not isinstance(events, list) or not all(isinstance(e, str) for e in events):
            raise WebhookConfigError(f"{at}: events is a list of event types")
        secret = table.get("secret", "")
        if not isinstance(secret, str) or not secret:
            raise WebhookConfigError(f'{at}: secret = "…" is required (the POSTs are signed)')
        specs.append(
            WebhookSpec(
                name=name,
                url=url,
                events=tuple(events),
                secret=secret,
                max_attempts=int(table.get("max_attempts", 8)),
                timeout_s=float(table.get("timeout_seconds", 5.0)),
            )
        )
    return tuple(specs)
