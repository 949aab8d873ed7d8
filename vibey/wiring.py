"""Settings in, the parts' configurations out: it translates; it decides nothing.

What the processes build from these configurations, they build through :mod:`actors.graph`,
the one place the object graph is assembled (a worker process started for the fleet is
given its :class:`actors.worker.WorkerConfig`, and reads no settings).

Every value comes from :class:`vibey.settings.Settings` (the command line's choices arrive as
arguments, or already folded into the settings with ``vibey.settings.replace``). Whatever cannot
run is a :class:`vibey.settings.SettingsError` here, in the process that was started, before a
worker process is spawned: a child that fails at start would only be respawned.

The ``actors`` modules (Dramatiq, pika) are imported by the functions that build the fleet's
parts, so that a CLI command that only reads the store does not load them.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from actors.loaders import load_object
from vibey.settings import Settings, SettingsError, check_project_ids
from workflows.engine import Registry
from workflows.job import UnknownJobKindError

if TYPE_CHECKING:
    from actors.agents.roster import AgentSpec
    from actors.worker import WorkerConfig

DEFINITIONS_FIX = "fix VIBEY_WORKFLOW_DEFINITIONS (or definitions under [workflow])"


def worker_config(settings: Settings, *, projects: Sequence[str] = ()) -> WorkerConfig:
    """The fleet's configuration; ``projects``: serve only their dedicated queues (on the
    postgres backend: claim only their jobs).

    Checked in this order: on the rabbitmq backend an AMQP URL is set (else
    :class:`~vibey.settings.QueueBackendNotConfigured`, naming both fixes), a database URL is
    set, the project ids, then the queue names, the handlers and the workflow definitions.
    """
    from actors.worker import WorkerConfig

    if settings.queue.backend != "postgres":
        settings.require_amqp_url()
    settings.require_database_url()
    projects = check_project_ids(projects, "fix --project")
    config = WorkerConfig(**dict(settings), projects=projects)
    _check_names(config)
    _check_handlers(config.worker.handlers)
    _check_leases(settings, load_registry(settings))
    return config.model_copy(update={"drain_grace": drain_grace(settings)})


def longest_lease(settings: Settings) -> timedelta:
    """The longest lease a step can hold: every declared kind's lease, with the settings'
    overrides (``[queue.lease_seconds]``) applied."""
    policy = settings.queue.lease
    kinds = load_registry(settings).kinds
    declared = [policy.lease_for(name, kind.lease) for name, kind in kinds.items()]
    return max([policy.default, *policy.by_kind.values(), *declared])


def drain_grace(settings: Settings) -> timedelta:
    """How long a SIGTERMed worker lets its running steps settle: the longest lease (a step
    holds one while it runs). The Kubernetes manifests read the same function, so a pod's
    ``terminationGracePeriodSeconds`` is this plus the fleet's margin (vibey.kube)."""
    return longest_lease(settings)


def service_drain_grace(settings: Settings, spec: AgentSpec) -> timedelta:
    """A loop service's drain grace: the longest of the leases and the engine's own
    ``timeout_seconds`` (a run may take that long). The manifests read it too."""
    return max(drain_grace(settings), timedelta(seconds=spec.timeout_seconds))


def check_consumer_timeout(settings: Settings) -> None:
    """A SettingsError (one line) when the work queues' consumer timeout is not above the
    longest lease: a step that holds its delivery longer would have its channel closed."""
    problem = consumer_timeout_problem(settings)
    if problem is not None:
        raise SettingsError(problem)


def consumer_timeout_problem(settings: Settings) -> str | None:
    """What is wrong with ``consumer_timeout_seconds`` against the longest lease, or None."""
    from actors.topology import CONSUMER_TIMEOUT_FIX
    from actors.topology import consumer_timeout_problem as problem

    if settings.queue.backend != "rabbitmq":
        return None
    timeout = timedelta(seconds=settings.queue.rabbitmq.consumer_timeout_seconds)
    found = problem(timeout, longest_lease(settings))
    return None if found is None else f"{found}; {CONSUMER_TIMEOUT_FIX}"


def _check_names(config: WorkerConfig) -> None:
    """Every exchange and queue name the fleet would declare is one the broker takes."""
    try:
        config.topology()
        config.queues()
    except ValueError as exc:
        raise SettingsError(
            f"{exc}: fix prefix under [bus] (VIBEY_BUS_PREFIX), --project or "
            "dedicated_projects under [queue.rabbitmq]"
        ) from exc


def _check_handlers(path: str) -> None:
    try:
        load_object(path)
    except (ImportError, AttributeError) as exc:
        raise SettingsError(
            f"the handlers {path!r} cannot be loaded ({type(exc).__name__}: {exc}): "
            "fix --handlers, VIBEY_WORKER_HANDLERS (or handlers under [worker])"
        ) from exc


def _check_leases(settings: Settings, registry: Registry) -> None:
    """Every kind ``[queue.lease_seconds]`` names is one a registered definition declares."""
    try:
        settings.queue.lease.resolved(registry.kinds.canonical)
    except UnknownJobKindError as exc:
        raise SettingsError(
            f"[queue.lease_seconds] names unknown job kind {exc.kind!r}: use default or one of "
            f"{', '.join(sorted(registry.kinds.names()))}"
        ) from exc


def load_registry(settings: Settings) -> Registry:
    """The workflow definitions ``[workflow] definitions`` names (an iterable of them)."""
    path = settings.workflow.definitions
    try:
        return Registry(load_object(path))
    except (ImportError, AttributeError, TypeError, ValueError) as exc:
        raise SettingsError(
            f"the workflow definitions {path!r} cannot be loaded ({type(exc).__name__}: {exc}): "
            + DEFINITIONS_FIX
        ) from exc
