"""``vibey doctor``'s settings checks: a setting nothing reads here, or two that contradict.

Every setting does something; one that does nothing in the configuration at hand (a
``[queue.rabbitmq]`` key on the postgres backend, the postgres backend's poll interval on
the rabbitmq one) or that contradicts another (a consumer timeout not above the longest
lease; a prefetch below the threads, which leaves threads idle) is reported, never accepted
silently. Pure: settings (and the longest lease) in, findings out.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from vibey.settings import QueueSettings, RabbitMqSettings, Settings

OK, PROBLEM, INFO = "ok", "problem", "info"

# [queue.rabbitmq] keys the postgres backend also reads (its reaper runs on this interval).
_BOTH_BACKENDS = frozenset({"reconcile_interval_seconds"})


def _finding(status: str, detail: str, fix: str | None = None) -> dict[str, Any]:
    return {"name": "settings", "status": status, "detail": detail, "fix": fix}


def setting_checks(settings: Settings, longest_lease: timedelta | None) -> list[dict[str, Any]]:
    """What is inert or contradictory in ``settings``; one ok finding when nothing is."""
    found = [*_inert(settings), *_contradictions(settings, longest_lease)]
    settled = found or [_finding(OK, "every setting is read, and none contradicts another")]
    return [*settled, *confinements(settings)]


def confinements(settings: Settings) -> list[dict[str, Any]]:
    """One finding per configured engine: what confines its runs and what they may reach; a
    problem when nothing does (off by setting, or unavailable here)."""
    found = []
    for spec in settings.engines:
        if spec.adapter == "scripted":
            continue
        confinement = spec.confined(None)
        mechanism = confinement.mechanism
        name = f"confinement {spec.id}"
        if mechanism.kind != "none":
            found.append(
                {"name": name, "status": OK, "detail": confinement.describe(), "fix": None}
            )
            continue
        fix = (
            f'set confinement = "auto" in [engines.{spec.id}]'
            if confinement.mode == "none"
            else "apt-get install bubblewrap (or allow user namespaces), or a Landlock kernel"
        )
        detail = f"{confinement.describe()}: its runs read, write and reach all the worker can"
        found.append({"name": name, "status": PROBLEM, "detail": detail, "fix": fix})
    return found


def _inert(settings: Settings) -> list[dict[str, Any]]:
    queue = settings.queue
    if queue.backend == "rabbitmq":
        if queue.poll_interval_seconds != QueueSettings().poll_interval_seconds:
            return [
                _finding(
                    PROBLEM,
                    f"poll_interval_seconds = {queue.poll_interval_seconds:g} is inert: only "
                    "the postgres backend reads it (RabbitMQ pushes deliveries)",
                    "remove poll_interval_seconds under [queue] (or VIBEY_QUEUE_POLL_INTERVAL)",
                )
            ]
        return []
    defaults = RabbitMqSettings()
    changed = [
        name
        for name in RabbitMqSettings.model_fields
        if name not in _BOTH_BACKENDS and getattr(queue.rabbitmq, name) != getattr(defaults, name)
    ]
    if not changed:
        return []
    return [
        _finding(
            PROBLEM,
            f"{', '.join(changed)} under [queue.rabbitmq] are inert on the postgres backend",
            'remove them, or set backend = "rabbitmq" under [queue]',
        )
    ]


def _contradictions(settings: Settings, longest_lease: timedelta | None) -> list[dict[str, Any]]:
    if settings.queue.backend != "rabbitmq":
        return []
    from actors.topology import CONSUMER_TIMEOUT_FIX, consumer_timeout_problem

    rabbitmq, found = settings.queue.rabbitmq, []
    timeout = timedelta(seconds=rabbitmq.consumer_timeout_seconds)
    wrong = None if longest_lease is None else consumer_timeout_problem(timeout, longest_lease)
    if wrong is not None:
        detail = f"{wrong}; `vibey worker` refuses to start"
        found.append(_finding(PROBLEM, detail, CONSUMER_TIMEOUT_FIX))
    threads = settings.worker.threads
    if rabbitmq.prefetch is not None and rabbitmq.prefetch < threads:
        found.append(
            _finding(
                PROBLEM,
                f"prefetch {rabbitmq.prefetch} is below the worker's {threads} threads: each "
                f"lane queue keeps at most {rabbitmq.prefetch} of them busy",
                "raise prefetch under [queue.rabbitmq] (or unset it: as many as the threads)",
            )
        )
    if rabbitmq.redispatch_after_seconds < rabbitmq.reclaim_after_seconds:
        found.append(
            _finding(
                INFO,
                f"redispatch_after_seconds ({rabbitmq.redispatch_after_seconds:g}) is below "
                f"reclaim_after_seconds ({rabbitmq.reclaim_after_seconds:g}): the lost-dispatch "
                "sweep may resend a pointer a live relay is still publishing (a harmless copy)",
            )
        )
    return found
