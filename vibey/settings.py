"""Settings: one frozen object, read once at start and passed down.

Sources, strongest first: ``VIBEY_*`` environment variables, the TOML file, the defaults. The
TOML file is ``$VIBEY_CONFIG`` when set (a missing file is an error), else ``./vibey.toml``
when it exists, else none. An empty variable counts as unset. This is the only module that
reads ``os.environ``; tests pass a dict to :func:`load_settings` instead.

The file, every key optional (unknown sections and keys are errors)::

    [database]
    url = "postgresql://vibey@127.0.0.1:5432/vibey"   # VIBEY_PG_URL
    pool_min = 1                                      # VIBEY_PG_POOL_MIN
    pool_max = 10                                     # VIBEY_PG_POOL_MAX

    [queue]
    backend = "rabbitmq"             # or "postgres"; VIBEY_QUEUE_BACKEND
    poll_interval_seconds = 5.0      # postgres backend: idle backstop; VIBEY_QUEUE_POLL_INTERVAL

    [queue.lease_seconds]            # per job kind (or alias), plus "default"
    default = 120                    # VIBEY_QUEUE_LEASE_SECONDS_DEFAULT
    "build.implement" = 7200

    [queue.rabbitmq]                 # the rabbitmq backend
    wait_tiers_seconds = [1, 5, 30, 120, 600, 3600]   # VIBEY_QUEUE_WAIT_TIERS=1,5,30,...
    delivery_limit = 20              # work queues' x-delivery-limit; VIBEY_QUEUE_DELIVERY_LIMIT
    reconcile_interval_seconds = 30  # VIBEY_QUEUE_RECONCILE_INTERVAL
    redispatch_after_seconds = 120   # resend a lost pointer after; VIBEY_QUEUE_REDISPATCH_AFTER
    reclaim_after_seconds = 30       # outbox rows a dead relay held; VIBEY_QUEUE_RECLAIM_AFTER
    in_place_steps = 16              # next steps a worker runs itself after a settle, no broker
                                     # hop between them (0: none); VIBEY_QUEUE_IN_PLACE_STEPS
    consumer_timeout_seconds = 21600 # above the longest lease; VIBEY_QUEUE_CONSUMER_TIMEOUT
    dedicated_projects = []          # routed at worker start; VIBEY_QUEUE_DEDICATED_PROJECTS=p1,p2
    # prefetch = 8                   # unset: the worker's threads; VIBEY_QUEUE_PREFETCH

    [bus]
    amqp_url = "amqp://guest:guest@127.0.0.1:5672/"   # VIBEY_AMQP_URL
    prefix = "vibey"                                  # VIBEY_BUS_PREFIX
    vhost = "/"                                       # for a URL naming none; VIBEY_BUS_VHOST

    [worker]                         # `vibey worker`; its flags override these
    processes = 2                    # VIBEY_WORKER_PROCESSES
    threads = 8                      # per process; VIBEY_WORKER_THREADS
    lanes = ["interactive", "build"] # VIBEY_WORKER_LANES=interactive,build
    handlers = "actors.handlers:build_handlers"       # VIBEY_WORKER_HANDLERS

    [workflow]                       # the workflow definitions (the CLI and the worker)
    definitions = "workflows.protocol:DEFINITIONS"    # VIBEY_WORKFLOW_DEFINITIONS
    default_definition = "vibey-protocol"             # VIBEY_WORKFLOW_DEFAULT_DEFINITION
    review_feedback = true           # REVIEW asks the user; false: unattended
                                     # VIBEY_WORKFLOW_REVIEW_FEEDBACK
    # budget_dollars = 50            # a new workflow's budget (unset: none); its engine steps
    # budget_tokens = 2000000        # park at a budget_exhausted gate once the ledger's spend
                                     # reaches it; VIBEY_WORKFLOW_BUDGET_DOLLARS, ..._TOKENS

    [project]                        # what becomes of the integrated work
    # push = "git@host:org/app.git"  # build.integrate pushes there; VIBEY_PROJECT_PUSH
    push_branch = "vibey/{project}"  # the remote branch; VIBEY_PROJECT_PUSH_BRANCH

    [engine]                         # who does a step's work
    name = "scripted"                # or "command"; `workflow start`'s engine; VIBEY_ENGINE_NAME
    command = ["my-agent", "--x"]    # the command engine's argv; VIBEY_ENGINE_COMMAND (shell words)
    timeout_seconds = 7200           # the command's time limit; VIBEY_ENGINE_TIMEOUT
    workspace = ".vibey/work"        # engines' repositories and worktrees; VIBEY_ENGINE_WORKSPACE
    # max_dollars = 20             # a bounded BUILD job's spend cap; VIBEY_ENGINE_MAX_DOLLARS
    # max_turns = 200              # turn cap of one; VIBEY_ENGINE_MAX_TURNS (unset: no cap)

    [console]                        # `vibey console`: the web console (docs/console.md)
    host = "127.0.0.1"               # VIBEY_CONSOLE_HOST; anything but loopback needs allow_remote
    port = 8377                      # VIBEY_CONSOLE_PORT
    allow_remote = false             # VIBEY_CONSOLE_ALLOW_REMOTE=1: may bind beyond loopback
    username = "admin"               # who signs in with password_hash; VIBEY_CONSOLE_USERNAME
    password_hash = "scrypt$..."     # `vibey console hash`; VIBEY_CONSOLE_PASSWORD_HASH
    token_hash = "scrypt$..."        # a token's hash (sign in with it, or Bearer); ..._TOKEN_HASH
    read_only = false                # a shared screen: no form, no write; VIBEY_CONSOLE_READ_ONLY
    anonymous_read = false           # pages without signing in (never writes); ..._ANONYMOUS_READ
    poll_seconds = 0.5               # how often it looks for a change without the domain
                                     # events (postgres backend, broker away); VIBEY_CONSOLE_POLL
    safety_poll_seconds = 5.0        # ... while the events arrive; VIBEY_CONSOLE_SAFETY_POLL
    follow_events = true             # pages woken by vibey.events (rabbitmq backend);
                                     # false: the poll alone; VIBEY_CONSOLE_FOLLOW_EVENTS

    [engines.claude]                 # the roster: one table per engine (docs/engines.md)
    adapter = "claude-code"          # claude-code, codex, gemini, aider, command, scripted
    weight = 3                       # binary, args, local, capabilities, phases, effort, env,
                                     # timeout_seconds: see actors/agents/roster.py
    confinement = "auto"             # bwrap, landlock, none; network_allow, read_allow,
                                     # write_allow (docs/engines.md, "Containment")

    [notify.webhooks.ops]            # `vibey notify`: domain events POSTed, signed (docs/events.md)
    url = "https://hooks.example/vibey"
    events = ["gate.opened"]         # types, families ("gate") or "*"; default gate.opened
    secret = "…"                     # HMAC-SHA256 key; VIBEY_NOTIFY_WEBHOOK_OPS_SECRET wins
    # max_attempts = 8, timeout_seconds = 5

Lists come from the environment comma-separated (``1,5,30``); an empty item is an error.
Durations are numbers of seconds: finite, more than 0 and at most a year. Settings that were
removed because nothing read them (``[queue] max_attempts``: attempts are declared per step
kind; ``[queue.rabbitmq] first_claim_wait_seconds``: the fleet's consumers never waited on a
first claim) are errors naming why, in the file and in the environment alike. Project ids,
lanes and wait tiers must each appear once. A project id is non-empty, has no '.', '*', '#'
or whitespace and at most 200 characters (it is a word of a routing key).

This module is past 600 lines on purpose: it is the one place that names every setting, its
variable, its default and its check, and the error messages must agree with each other. Should
it grow further, the per-section dataclasses are the seam to split along.

Exceptions::

    SettingsError (ValueError)      a setting is unreadable, mistyped or out of range
    ├── DatabaseNotConfigured       no database URL where one is needed
    └── QueueBackendNotConfigured   the rabbitmq backend without an AMQP URL
"""

from __future__ import annotations

import math
import os
import re
import shlex
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast, get_args
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from workflows.budget import Budget, BudgetError
from workflows.dispatch import DEFAULT_WAIT_TIERS, MAX_PROJECT_ID_CHARS, Lane, WaitTiers
from workflows.job import LeasePolicy, valid_kind_name

if TYPE_CHECKING:  # the roster's parser is imported when a roster is read
    from actors.agents.roster import AgentSpec
    from actors.webhooks import WebhookSpec

QueueBackend = Literal["rabbitmq", "postgres"]
QUEUE_BACKENDS: tuple[str, ...] = get_args(QueueBackend)

CONFIG_FILENAME = "vibey.toml"

DATABASE_FIX = (
    "VIBEY_PG_URL is not set: export VIBEY_PG_URL=postgresql://USER@HOST:5432/DB "
    "(or run `just up`, which writes .env)"
)
AMQP_FIX = (
    "the queue backend is rabbitmq but VIBEY_AMQP_URL is not set: "
    "export VIBEY_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/, "
    'or set backend = "postgres" under [queue] in vibey.toml (or VIBEY_QUEUE_BACKEND=postgres)'
)

_PG_SCHEMES = ("postgresql://", "postgres://")
_AMQP_SCHEMES = ("amqp://", "amqps://")
LANES: tuple[str, ...] = tuple(lane.value for lane in Lane)
# A project id is one word of a routing key: no separator, no wildcard, no whitespace.
_NOT_IN_PROJECT_ID = re.compile(r"[.*#\s]")
# Every exchange and queue name starts with the prefix; a wildcard there would match others.
_NOT_IN_PREFIX = re.compile(r"[*#\s]")
# "module:attribute", as `vibey worker --handlers`, [worker] handlers and [workflow]
# definitions take it.
_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")
# The longest interval a setting takes: a year (anything longer is a typo).
MAX_INTERVAL_SECONDS = 365 * 24 * 3600.0

# Every TOML key, by section, with the environment variable that overrides it (if any).
_KEYS: Mapping[str, Mapping[str, str | None]] = {
    "database": {
        "url": "VIBEY_PG_URL",
        "pool_min": "VIBEY_PG_POOL_MIN",
        "pool_max": "VIBEY_PG_POOL_MAX",
    },
    "queue": {
        "backend": "VIBEY_QUEUE_BACKEND",
        "poll_interval_seconds": "VIBEY_QUEUE_POLL_INTERVAL",
        "lease_seconds": None,  # a table of its own, read by _lease
        "rabbitmq": None,  # the table below
    },
    "queue.rabbitmq": {
        "wait_tiers_seconds": "VIBEY_QUEUE_WAIT_TIERS",
        "delivery_limit": "VIBEY_QUEUE_DELIVERY_LIMIT",
        "reconcile_interval_seconds": "VIBEY_QUEUE_RECONCILE_INTERVAL",
        "redispatch_after_seconds": "VIBEY_QUEUE_REDISPATCH_AFTER",
        "reclaim_after_seconds": "VIBEY_QUEUE_RECLAIM_AFTER",
        "in_place_steps": "VIBEY_QUEUE_IN_PLACE_STEPS",
        "consumer_timeout_seconds": "VIBEY_QUEUE_CONSUMER_TIMEOUT",
        "dedicated_projects": "VIBEY_QUEUE_DEDICATED_PROJECTS",
        "prefetch": "VIBEY_QUEUE_PREFETCH",
        "outbox_retention_seconds": "VIBEY_QUEUE_OUTBOX_RETENTION",
    },
    "bus": {"amqp_url": "VIBEY_AMQP_URL", "prefix": "VIBEY_BUS_PREFIX", "vhost": "VIBEY_BUS_VHOST"},
    "worker": {
        "processes": "VIBEY_WORKER_PROCESSES",
        "threads": "VIBEY_WORKER_THREADS",
        "lanes": "VIBEY_WORKER_LANES",
        "handlers": "VIBEY_WORKER_HANDLERS",
    },
    "workflow": {
        "definitions": "VIBEY_WORKFLOW_DEFINITIONS",
        "default_definition": "VIBEY_WORKFLOW_DEFAULT_DEFINITION",
        "archive_after_seconds": "VIBEY_WORKFLOW_ARCHIVE_AFTER",
        "review_feedback": "VIBEY_WORKFLOW_REVIEW_FEEDBACK",
        "budget_dollars": "VIBEY_WORKFLOW_BUDGET_DOLLARS",
        "budget_tokens": "VIBEY_WORKFLOW_BUDGET_TOKENS",
    },
    "project": {"push": "VIBEY_PROJECT_PUSH", "push_branch": "VIBEY_PROJECT_PUSH_BRANCH"},
    "engine": {
        "name": "VIBEY_ENGINE_NAME",
        "command": "VIBEY_ENGINE_COMMAND",
        "timeout_seconds": "VIBEY_ENGINE_TIMEOUT",
        "workspace": "VIBEY_ENGINE_WORKSPACE",
        "max_dollars": "VIBEY_ENGINE_MAX_DOLLARS",
        "max_turns": "VIBEY_ENGINE_MAX_TURNS",
    },
    "engines": {},  # [engines.<id>] tables, one per engine: actors.agents.roster reads them
    "notify": {},  # [notify.webhooks.<name>] tables: actors.webhooks reads them
    "metrics": {"port": "VIBEY_METRICS_PORT"},
    "console": {
        "host": "VIBEY_CONSOLE_HOST",
        "port": "VIBEY_CONSOLE_PORT",
        "allow_remote": "VIBEY_CONSOLE_ALLOW_REMOTE",
        "username": "VIBEY_CONSOLE_USERNAME",
        "password_hash": "VIBEY_CONSOLE_PASSWORD_HASH",
        "token_hash": "VIBEY_CONSOLE_TOKEN_HASH",
        "read_only": "VIBEY_CONSOLE_READ_ONLY",
        "anonymous_read": "VIBEY_CONSOLE_ANONYMOUS_READ",
        "poll_seconds": "VIBEY_CONSOLE_POLL",
        "safety_poll_seconds": "VIBEY_CONSOLE_SAFETY_POLL",
        "follow_events": "VIBEY_CONSOLE_FOLLOW_EVENTS",
    },
    "tracing": {
        "otlp_endpoint": "VIBEY_TRACING_OTLP_ENDPOINT",
        "service_name": "VIBEY_TRACING_SERVICE_NAME",
    },
}
ENGINES: tuple[str, ...] = ("scripted", "command")
LEASE_DEFAULT_ENV = "VIBEY_QUEUE_LEASE_SECONDS_DEFAULT"
# job.lease_ms is a PostgreSQL integer: a lease is at most 2^31-1 ms (about 24.8 days).
MAX_LEASE_SECONDS = (2**31 - 1) // 1000


# Settings removed because nothing read them: naming one is an error that says why.
_REMOVED: Mapping[tuple[str, str], tuple[str, str]] = {
    ("queue", "max_attempts"): (
        "VIBEY_QUEUE_MAX_ATTEMPTS",
        "attempts are declared per step kind (StepKind.max_attempts); nothing read it",
    ),
    ("queue.rabbitmq", "first_claim_wait_seconds"): (
        "VIBEY_QUEUE_FIRST_CLAIM_WAIT",
        "the fleet's consumers never wait for a first claim; nothing read it",
    ),
}


class SettingsError(ValueError):
    """A setting is unreadable, mistyped or out of range; the message names the fix."""


class DatabaseNotConfigured(SettingsError):
    def __init__(self) -> None:
        super().__init__(DATABASE_FIX)


class QueueBackendNotConfigured(SettingsError):
    def __init__(self, message: str = AMQP_FIX) -> None:
        super().__init__(message)


@dataclass(frozen=True, slots=True)
class DatabaseSettings:
    url: str | None = None
    pool_min: int = 1
    pool_max: int = 10

    def __post_init__(self) -> None:
        if self.url is not None and not self.url.startswith(_PG_SCHEMES):
            raise SettingsError(
                f"the database URL must start with postgresql:// or postgres://, got "
                f"{_scheme(self.url)}: fix VIBEY_PG_URL (or url under [database])"
            )
        if not 0 <= self.pool_min <= self.pool_max or self.pool_max < 1:
            raise SettingsError(
                "the pool sizes must satisfy 0 <= pool_min <= pool_max and pool_max >= 1, got "
                f"pool_min={self.pool_min}, pool_max={self.pool_max}: "
                "fix VIBEY_PG_POOL_MIN / VIBEY_PG_POOL_MAX (or [database])"
            )


def _fix(variable: str, key: str, section: str) -> str:
    return f"fix {variable} (or {key} under [{section}])"


def _check_interval(
    value: float,
    variable: str,
    key: str,
    *,
    zero_ok: bool = False,
    section: str = "queue.rabbitmq",
) -> None:
    low_ok = value >= 0 if zero_ok else value > 0
    if not (math.isfinite(value) and low_ok and value <= MAX_INTERVAL_SECONDS):
        low = "at least 0" if zero_ok else "more than 0"
        raise SettingsError(
            f"{key} must be {low} and at most {MAX_INTERVAL_SECONDS:.0f} seconds, got {value}: "
            + _fix(variable, key, section)
        )


def _check_unique(values: tuple[Any, ...], what: str, fix: str) -> None:
    repeated = sorted({str(v) for v in values if values.count(v) > 1})
    if repeated:
        raise SettingsError(f"{what} repeat ({', '.join(repeated)}): list each once; {fix}")


def check_project_ids(project_ids: Iterable[str], fix: str) -> tuple[str, ...]:
    """The ids as a tuple when each can be a word of a routing key and none repeats.

    ``fix`` names where they came from, e.g. ``"fix --project"``.
    """
    ids = tuple(project_ids)
    for project in ids:
        if not project or _NOT_IN_PROJECT_ID.search(project):
            raise SettingsError(
                f"project id {project!r} cannot be a word of a routing key: it must be non-empty "
                f"and contain no '.', '*', '#' or whitespace; {fix}"
            )
        if len(project) > MAX_PROJECT_ID_CHARS:
            raise SettingsError(
                f"project id {project[:20]!r}... is {len(project)} characters; the limit is "
                f"{MAX_PROJECT_ID_CHARS}; {fix}"
            )
    _check_unique(ids, "project ids", fix)
    return ids


@dataclass(frozen=True, slots=True)
class RabbitMqSettings:
    """``[queue.rabbitmq]``: the wait tiers, queue arguments and reconcile timings."""

    wait_tiers: WaitTiers = DEFAULT_WAIT_TIERS
    delivery_limit: int = 20
    reconcile_interval_seconds: float = 30.0
    redispatch_after_seconds: float = 120.0
    reclaim_after_seconds: float = 30.0
    in_place_steps: int = 16  # a chain's bound (actors.in_place); 0: every step via the broker
    consumer_timeout_seconds: float = 21600.0  # work queues' x-consumer-timeout (6 h)
    dedicated_projects: tuple[str, ...] = ()  # written to project_route when a worker starts
    prefetch: int | None = None  # None: as many as the worker has threads
    outbox_retention_seconds: float = 86400.0  # sent outbox rows are pruned after this

    def __post_init__(self) -> None:
        _check_interval(
            self.outbox_retention_seconds,
            "VIBEY_QUEUE_OUTBOX_RETENTION",
            "outbox_retention_seconds",
        )
        if self.in_place_steps < 0:
            raise SettingsError(
                f"in_place_steps must be at least 0, got {self.in_place_steps}: "
                + _fix("VIBEY_QUEUE_IN_PLACE_STEPS", "in_place_steps", "queue.rabbitmq")
                + " (0 turns continuing in place off)"
            )
        if self.delivery_limit < 0:
            raise SettingsError(
                f"delivery_limit must be at least 0, got {self.delivery_limit}: "
                + _fix("VIBEY_QUEUE_DELIVERY_LIMIT", "delivery_limit", "queue.rabbitmq")
            )
        _check_interval(
            self.reconcile_interval_seconds,
            "VIBEY_QUEUE_RECONCILE_INTERVAL",
            "reconcile_interval_seconds",
        )
        _check_interval(
            self.redispatch_after_seconds,
            "VIBEY_QUEUE_REDISPATCH_AFTER",
            "redispatch_after_seconds",
        )
        _check_interval(
            self.reclaim_after_seconds, "VIBEY_QUEUE_RECLAIM_AFTER", "reclaim_after_seconds"
        )
        _check_interval(
            self.consumer_timeout_seconds,
            "VIBEY_QUEUE_CONSUMER_TIMEOUT",
            "consumer_timeout_seconds",
        )
        check_project_ids(
            self.dedicated_projects,
            _fix("VIBEY_QUEUE_DEDICATED_PROJECTS", "dedicated_projects", "queue.rabbitmq"),
        )
        if self.prefetch is not None and self.prefetch < 1:
            raise SettingsError(
                f"prefetch must be at least 1, got {self.prefetch}: "
                + _fix("VIBEY_QUEUE_PREFETCH", "prefetch", "queue.rabbitmq")
                + ", or leave it unset (as many as the worker has threads)"
            )


@dataclass(frozen=True, slots=True)
class QueueSettings:
    backend: QueueBackend = "rabbitmq"
    poll_interval_seconds: float = 5.0  # the postgres backend's idle wakeup backstop
    lease: LeasePolicy = field(default_factory=LeasePolicy)
    rabbitmq: RabbitMqSettings = field(default_factory=RabbitMqSettings)

    def __post_init__(self) -> None:
        if self.backend not in QUEUE_BACKENDS:
            raise SettingsError(
                f"unknown queue backend {self.backend!r}: set VIBEY_QUEUE_BACKEND (or backend "
                f"under [queue]) to one of {', '.join(QUEUE_BACKENDS)}"
            )
        if not (math.isfinite(self.poll_interval_seconds) and self.poll_interval_seconds > 0):
            raise SettingsError(
                "the queue poll interval must be a positive number of seconds, got "
                f"{self.poll_interval_seconds}: fix VIBEY_QUEUE_POLL_INTERVAL "
                "(or poll_interval_seconds under [queue])"
            )


@dataclass(frozen=True, slots=True)
class BusSettings:
    amqp_url: str | None = None
    prefix: str = "vibey"
    vhost: str = "/"

    def __post_init__(self) -> None:
        urls = None if self.amqp_url is None else self.amqp_url.split(";")
        for url in urls or ():
            if not url.strip().startswith(_AMQP_SCHEMES):
                raise SettingsError(
                    f"the AMQP URL must start with amqp:// or amqps://, got {_scheme(url)}: "
                    "fix VIBEY_AMQP_URL (or amqp_url under [bus]); several URLs (one per "
                    "node of a cluster) are separated by ';'"
                )
        if not self.prefix or _NOT_IN_PREFIX.search(self.prefix):
            raise SettingsError(
                f"the bus prefix {self.prefix!r} must be non-empty and contain no '*', '#' or "
                "whitespace: fix VIBEY_BUS_PREFIX (or prefix under [bus])"
            )
        if urls is not None:
            joined = ";".join(_with_vhost(url.strip(), self.vhost) for url in urls)
            object.__setattr__(self, "amqp_url", joined)


def _with_vhost(url: str, vhost: str) -> str:
    """``[bus] vhost`` applied to the AMQP URL: a URL that names no vhost gets it; one that
    names the same is kept; one that names another is an error. ``/`` (the default) leaves
    the URL to decide."""
    if not vhost:
        raise SettingsError(
            "the bus vhost must not be empty: fix VIBEY_BUS_VHOST (or vhost under [bus])"
        )
    parts = urlsplit(url)
    named = unquote(parts.path[1:]) if parts.path not in ("", "/") else None
    if vhost == "/" or named == vhost:
        return url
    if named is None:
        return urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))
    raise SettingsError(
        f"the AMQP URL names vhost {named!r} but the bus vhost is {vhost!r}: drop one "
        "(VIBEY_AMQP_URL's path, or VIBEY_BUS_VHOST / vhost under [bus])"
    )


def _worker_fix(key: str) -> str:
    return f"fix --{key}, VIBEY_WORKER_{key.upper()} (or {key} under [worker])"


@dataclass(frozen=True, slots=True)
class WorkerSettings:
    """``[worker]``: what ``vibey worker`` runs; its flags override these (``replace``)."""

    processes: int = 2
    threads: int = 8
    lanes: tuple[str, ...] = LANES
    handlers: str = "actors.handlers:build_handlers"

    def __post_init__(self) -> None:
        for key, value in (("processes", self.processes), ("threads", self.threads)):
            if value < 1:
                raise SettingsError(
                    f"the worker's {key} must be at least 1, got {value}: " + _worker_fix(key)
                )
        fix = _worker_fix("lanes")
        if not self.lanes:
            raise SettingsError(f"a worker needs at least one lane ({', '.join(LANES)}): {fix}")
        for lane in self.lanes:
            if lane not in LANES:
                raise SettingsError(
                    f"unknown lane {lane!r}: the lanes are {', '.join(LANES)}; {fix}"
                )
        _check_unique(self.lanes, "lanes", fix)
        if not _IMPORT_PATH.fullmatch(self.handlers):
            raise SettingsError(
                f"the handlers {self.handlers!r} are not an import path module:attribute "
                f"(as in actors.handlers:build_handlers): {_worker_fix('handlers')}"
            )


@dataclass(frozen=True, slots=True)
class WorkflowSettings:
    """``[workflow]``: the definitions the CLI and the worker load, and the one
    ``vibey workflow start`` uses without ``--definition``."""

    definitions: str = "workflows.protocol:DEFINITIONS"
    default_definition: str = "vibey-protocol"
    # a finished workflow's jobs and gates are deleted, its history archived, after this
    archive_after_seconds: float = 30 * 86400.0
    review_feedback: bool = True  # REVIEW opens a review.feedback gate (False: unattended)
    # a new workflow's budget when `workflow start` gives none (None: no bound; docs/protocol.md)
    budget_dollars: float | None = None
    budget_tokens: int | None = None

    def __post_init__(self) -> None:
        try:
            self.budget()
        except BudgetError as exc:
            raise SettingsError(
                f"{exc}: fix VIBEY_WORKFLOW_BUDGET_DOLLARS / VIBEY_WORKFLOW_BUDGET_TOKENS (or "
                "budget_dollars / budget_tokens under [workflow]), or leave them unset"
            ) from None
        if not (math.isfinite(self.archive_after_seconds) and self.archive_after_seconds > 0):
            raise SettingsError(
                f"archive_after_seconds must be more than 0, got {self.archive_after_seconds}: "
                + _fix("VIBEY_WORKFLOW_ARCHIVE_AFTER", "archive_after_seconds", "workflow")
            )
        if not _IMPORT_PATH.fullmatch(self.definitions):
            raise SettingsError(
                f"the workflow definitions {self.definitions!r} are not an import path "
                "module:attribute (as in workflows.protocol:DEFINITIONS): "
                "fix VIBEY_WORKFLOW_DEFINITIONS (or definitions under [workflow])"
            )
        if not self.default_definition.strip():
            raise SettingsError(
                "the default workflow definition must not be empty: fix "
                "VIBEY_WORKFLOW_DEFAULT_DEFINITION (or default_definition under [workflow])"
            )

    def budget(self) -> Budget | None:
        """The default budget of a new workflow (None: unbounded)."""
        if self.budget_dollars is None and self.budget_tokens is None:
            return None
        return Budget(dollars=self.budget_dollars, tokens=self.budget_tokens)


@dataclass(frozen=True, slots=True)
class ProjectSettings:
    """``[project]``: where build.integrate pushes the integrated branch (``push``: a git
    remote, a URL or a path; None: nowhere) and the remote branch's name (``{project}`` is
    the project id)."""

    push: str | None = None
    push_branch: str = "vibey/{project}"

    def __post_init__(self) -> None:
        if self.push is not None and not self.push.strip():
            raise SettingsError(
                "the push remote must not be empty: fix VIBEY_PROJECT_PUSH (or push under "
                "[project]), or leave it unset"
            )
        branch = self.push_branch.replace("{project}", "p")
        if not branch.strip() or any(c in branch for c in " ~^:?*[\\") or ".." in branch:
            raise SettingsError(
                f"{self.push_branch!r} is not a branch name: fix VIBEY_PROJECT_PUSH_BRANCH "
                "(or push_branch under [project])"
            )

    def branch_for(self, project: str) -> str:
        return self.push_branch.replace("{project}", project)


@dataclass(frozen=True, slots=True)
class EngineSettings:
    """``[engine]``: the engine ``vibey workflow start`` names in a workflow's input (unless
    ``--script`` chooses the scripted one), and what the worker gives the engines."""

    name: str = "scripted"
    command: tuple[str, ...] = ()
    timeout_seconds: float = 7200.0
    workspace: str = ".vibey/work"
    max_dollars: float | None = None  # spend caps of a bounded BUILD job (None: no cap)
    max_turns: int | None = None

    def __post_init__(self) -> None:
        for key, cap in (("max_dollars", self.max_dollars), ("max_turns", self.max_turns)):
            if cap is not None and not (math.isfinite(cap) and cap > 0):
                raise SettingsError(
                    f"{key} must be more than 0, got {cap}: fix VIBEY_ENGINE_{key.upper()} "
                    f"(or {key} under [engine]), or leave it unset for no cap"
                )
        if self.name not in ENGINES:
            raise SettingsError(
                f"unknown engine {self.name!r}: set VIBEY_ENGINE_NAME (or name under [engine]) "
                f"to one of {', '.join(ENGINES)}"
            )
        if self.name == "command" and not self.command:
            raise SettingsError(
                "the command engine needs a command: set command under [engine] "
                '(as in command = ["my-agent", "--flag"]) or VIBEY_ENGINE_COMMAND'
            )
        timeout = self.timeout_seconds
        if not (math.isfinite(timeout) and 0 < timeout <= MAX_INTERVAL_SECONDS):
            raise SettingsError(
                f"the engine timeout must be more than 0 and at most {MAX_INTERVAL_SECONDS:.0f} "
                f"seconds, got {timeout}: fix VIBEY_ENGINE_TIMEOUT (or timeout_seconds under "
                "[engine])"
            )
        if not self.workspace.strip():
            raise SettingsError(
                "the engine workspace must not be empty: fix VIBEY_ENGINE_WORKSPACE "
                "(or workspace under [engine])"
            )


@dataclass(frozen=True, slots=True)
class MetricsSettings:
    """``[metrics]``: the port a worker, the reconciler or a loop service serves Prometheus
    metrics and ``/healthz`` on (None: no endpoint)."""

    port: int | None = None

    def __post_init__(self) -> None:
        if self.port is not None and not 1 <= self.port <= 65535:
            raise SettingsError(
                f"the metrics port must be 1..65535, got {self.port}: "
                "fix VIBEY_METRICS_PORT (or port under [metrics]), or leave it unset"
            )


LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})


@dataclass(frozen=True, slots=True)
class ConsoleSettings:
    """``[console]``: where `vibey console` listens and who may use it. The hashes are
    ``scrypt$N$r$p$salt$digest`` (`vibey console hash` prints one); with neither, the console
    is read-only and needs no sign-in.

    Live updates (``vibey.console.feed``): with ``follow_events`` and the rabbitmq backend the
    domain events wake the pages and PostgreSQL is read every ``safety_poll_seconds``; without
    them (or while the broker is away) it is read every ``poll_seconds``. The slow pace is
    never faster than the fast one (a ``safety_poll_seconds`` below ``poll_seconds`` acts as
    ``poll_seconds``)."""

    host: str = "127.0.0.1"
    port: int = 8377
    allow_remote: bool = False
    username: str = "admin"
    password_hash: str | None = None
    token_hash: str | None = None
    read_only: bool = False
    anonymous_read: bool = False
    poll_seconds: float = 0.5
    safety_poll_seconds: float = 5.0
    follow_events: bool = True

    def __post_init__(self) -> None:
        if not 1 <= self.port <= 65535:
            raise SettingsError(
                f"the console port must be 1..65535, got {self.port}: "
                + _fix("VIBEY_CONSOLE_PORT", "port", "console")
            )
        if not self.allow_remote and not is_loopback(self.host):
            raise SettingsError(
                f"the console binds only to loopback, not {self.host!r}: use 127.0.0.1, or set "
                "allow_remote = true under [console] (VIBEY_CONSOLE_ALLOW_REMOTE=1), with a "
                "password_hash or token_hash"
            )
        for key, value in (("password_hash", self.password_hash), ("token_hash", self.token_hash)):
            if value is not None and not value.startswith("scrypt$"):
                raise SettingsError(
                    f"the console's {key} is not a scrypt hash: make one with "
                    f"`vibey console hash` and set VIBEY_CONSOLE_{key.upper()} (or {key} "
                    "under [console])"
                )
        _check_interval(self.poll_seconds, "VIBEY_CONSOLE_POLL", "poll_seconds", section="console")
        _check_interval(
            self.safety_poll_seconds,
            "VIBEY_CONSOLE_SAFETY_POLL",
            "safety_poll_seconds",
            section="console",
        )

    @property
    def signs_in(self) -> bool:
        """Whether anyone can sign in (a password or a token hash is set)."""
        return self.password_hash is not None or self.token_hash is not None


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


@dataclass(frozen=True, slots=True)
class TracingSettings:
    """``[tracing]``: OpenTelemetry traces of the steps and of the workflow events recorded
    outside a step (a start, an answer, a cancel, a gate's deadline: in workers and in the
    client and CLI alike), exported over OTLP/HTTP to ``otlp_endpoint`` (None: off, the API's
    no-op; ``actors/tracing.py``)."""

    otlp_endpoint: str | None = None
    service_name: str = "vibey"

    def __post_init__(self) -> None:
        endpoint = self.otlp_endpoint
        if endpoint is not None and not endpoint.startswith(("http://", "https://")):
            raise SettingsError(
                f"the OTLP endpoint must be an http(s) URL, got {endpoint!r}: fix "
                "VIBEY_TRACING_OTLP_ENDPOINT (or otlp_endpoint under [tracing]), or leave it unset"
            )


@dataclass(frozen=True, slots=True)
class Settings:
    database: DatabaseSettings = field(default_factory=DatabaseSettings)
    queue: QueueSettings = field(default_factory=QueueSettings)
    bus: BusSettings = field(default_factory=BusSettings)
    worker: WorkerSettings = field(default_factory=WorkerSettings)
    workflow: WorkflowSettings = field(default_factory=WorkflowSettings)
    engine: EngineSettings = field(default_factory=EngineSettings)
    project: ProjectSettings = field(default_factory=ProjectSettings)
    engines: tuple[AgentSpec, ...] = ()  # the roster: [engines.<id>] tables, in id order
    agent_env: Mapping[str, str] = field(default_factory=dict)  # the base engines get
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    console: ConsoleSettings = field(default_factory=ConsoleSettings)
    webhooks: tuple[WebhookSpec, ...] = ()  # [notify.webhooks.<name>] tables, in name order
    tracing: TracingSettings = field(default_factory=TracingSettings)
    config_file: Path | None = None

    def roster(self, only: Iterable[str] = ()) -> tuple[AgentSpec, ...]:
        """The configured engines, narrowed to ``only`` when given (each must be one)."""
        wanted = tuple(only)
        ids = {spec.id for spec in self.engines}
        unknown = [engine for engine in wanted if engine not in ids]
        if unknown:
            known = ", ".join(sorted(ids)) or "none: add [engines.<id>] tables to vibey.toml"
            raise SettingsError(f"unknown engine {unknown[0]!r}; configured engines: {known}")
        return tuple(spec for spec in self.engines if not wanted or spec.id in wanted)

    def require_database_url(self) -> str:
        if self.database.url is None:
            raise DatabaseNotConfigured()
        return self.database.url

    def require_amqp_url(self) -> str:
        if self.bus.amqp_url is not None:
            return self.bus.amqp_url
        if self.queue.backend == "rabbitmq":
            raise QueueBackendNotConfigured()
        raise QueueBackendNotConfigured(
            "VIBEY_AMQP_URL is not set: export VIBEY_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/"
        )


def load_settings(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Settings:
    """The settings in effect; raises :class:`SettingsError` on the first problem found."""
    env = {k: v for k, v in (os.environ if environ is None else environ).items() if v != ""}
    path = _config_path(env, Path.cwd() if cwd is None else cwd)
    table = _read_toml(path) if path is not None else {}
    where = str(path) if path is not None else CONFIG_FILENAME
    _check_keys(table, where)
    _check_removed_variables(env)
    src = {name: _Source(name, _table(table, name), env, f"{where} [{name}]") for name in _KEYS}
    return Settings(
        database=_database(src["database"]),
        queue=_queue(src["queue"], src["queue.rabbitmq"]),
        bus=_bus(src["bus"]),
        worker=_worker(src["worker"]),
        workflow=_workflow(src["workflow"]),
        engine=_engine(src["engine"]),
        project=ProjectSettings(
            **_given(
                push=src["project"].text("push"), push_branch=src["project"].text("push_branch")
            )
        ),
        engines=_roster(table.get("engines", {}), where),
        agent_env=_agent_env(env),
        metrics=MetricsSettings(**_given(port=src["metrics"].integer("port"))),
        console=_console(src["console"]),
        webhooks=_webhooks(table.get("notify", {}), env, where),
        tracing=TracingSettings(
            **_given(
                otlp_endpoint=src["tracing"].text("otlp_endpoint") or None,
                service_name=src["tracing"].text("service_name"),
            )
        ),
        config_file=path,
    )


def _agent_env(env: Mapping[str, str]) -> dict[str, str]:
    """The base environment every engine gets (``actors.agents.roster.BASE_ENV``)."""
    from actors.agents.roster import BASE_ENV

    return {name: env[name] for name in BASE_ENV if name in env}


def _roster(tables: Any, where: str) -> tuple[AgentSpec, ...]:
    if tables == {}:  # no [engines.<id>] table: the roster's parser is not even imported
        return ()
    from actors.agents.roster import RosterError, parse_roster

    try:
        return parse_roster(tables, where)
    except RosterError as exc:
        raise SettingsError(str(exc)) from None


def _webhooks(notify: Any, env: Mapping[str, str], where: str) -> tuple[WebhookSpec, ...]:
    """``[notify.webhooks.<name>]``; ``VIBEY_NOTIFY_WEBHOOK_<NAME>_SECRET`` overrides a secret
    (so it need not live in the file)."""
    if notify == {}:
        return ()
    from actors.webhooks import WebhookConfigError, parse_webhooks

    if not isinstance(notify, dict) or set(notify) - {"webhooks"}:
        raise SettingsError(f"{where}: [notify] holds only [notify.webhooks.<name>] tables")
    tables = notify.get("webhooks", {})
    if isinstance(tables, dict):
        tables = {
            name: {**body, "secret": env[variable]}
            if isinstance(body, dict) and (variable := _secret_variable(name)) in env
            else body
            for name, body in tables.items()
        }
    try:
        return parse_webhooks(tables, where)
    except WebhookConfigError as exc:
        raise SettingsError(str(exc)) from None


def _secret_variable(name: str) -> str:
    return "VIBEY_NOTIFY_WEBHOOK_" + re.sub(r"[^A-Z0-9]", "_", name.upper()) + "_SECRET"


def _table(table: Mapping[str, Any], dotted: str) -> Mapping[str, Any]:
    """The (checked) table ``dotted`` names, as in ``queue.rabbitmq``; empty when absent."""
    for part in dotted.split("."):
        table = table.get(part, {})
    return table


def _config_path(env: Mapping[str, str], cwd: Path) -> Path | None:
    named = env.get("VIBEY_CONFIG")
    if named is not None:
        path = Path(named) if Path(named).is_absolute() else cwd / named
        if not path.is_file():
            raise SettingsError(
                f"VIBEY_CONFIG names {path}, which is not a file: "
                "fix the path or unset VIBEY_CONFIG"
            )
        return path
    default = cwd / CONFIG_FILENAME
    return default if default.is_file() else None


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise SettingsError(f"{path} is not valid TOML ({exc}): fix the file") from exc
    except OSError as exc:
        raise SettingsError(f"{path} cannot be read ({exc.strerror}): fix its permissions") from exc


def _check_keys(table: Mapping[str, Any], where: str) -> None:
    for section, body in table.items():
        if section not in _KEYS or "." in section:
            raise SettingsError(
                f"{where}: unknown section [{section}]; known sections: {', '.join(_KEYS)}"
            )
        if section not in ("engines", "notify"):  # their tables are checked by their readers
            _check_section(section, body, where)


def _check_removed_variables(env: Mapping[str, str]) -> None:
    for (section, key), (variable, why) in _REMOVED.items():
        if variable in env:
            raise SettingsError(
                f"{variable} ({key} under [{section}]) was removed ({why}): unset it"
            )


def _check_section(section: str, body: Any, where: str) -> None:
    if not isinstance(body, dict):
        raise SettingsError(f"{where}: {section} must be a [{section}] table")
    for key, value in body.items():
        if (section, key) in _REMOVED:
            raise SettingsError(
                f"{where}: {key} under [{section}] was removed ({_REMOVED[section, key][1]}): "
                "delete it"
            )
        if key not in _KEYS[section]:
            raise SettingsError(
                f"{where}: unknown key {key!r} in [{section}]; "
                f"known keys: {', '.join(_KEYS[section])}"
            )
        if f"{section}.{key}" in _KEYS:
            _check_section(f"{section}.{key}", value, where)


@dataclass(frozen=True, slots=True)
class _Source:
    """One TOML section and the environment, read key by key; the environment wins."""

    section: str
    toml: Mapping[str, Any]
    env: Mapping[str, str]
    where: str

    def text(self, key: str) -> str | None:
        variable, value = self._lookup(key)
        if variable is None and value is not None and not isinstance(value, str):
            raise self._wrong_type(key, value, "a string")
        return cast(str | None, value)

    def integer(self, key: str) -> int | None:
        variable, value = self._lookup(key)
        if variable is not None:
            try:
                return int(value.strip())
            except ValueError:
                raise SettingsError(f"{variable} must be an integer, got {value!r}") from None
        if value is not None and not _is_int(value):
            raise self._wrong_type(key, value, "an integer")
        return cast(int | None, value)

    def boolean(self, key: str) -> bool | None:
        variable, value = self._lookup(key)
        if variable is not None:
            word = value.strip().lower()
            if word not in ("true", "false", "1", "0", "yes", "no"):
                raise SettingsError(f"{variable} must be true or false, got {value!r}")
            return word in ("true", "1", "yes")
        if value is not None and not isinstance(value, bool):
            raise self._wrong_type(key, value, "true or false")
        return None if value is None else bool(value)

    def seconds(self, key: str) -> float | None:
        variable, value = self._lookup(key)
        if variable is not None:
            return _env_seconds(variable, value)
        if value is not None and not _is_number(value):
            raise self._wrong_type(key, value, "a number of seconds")
        return None if value is None else float(value)

    def number(self, key: str) -> float | None:
        """A plain number (an amount of dollars)."""
        variable, value = self._lookup(key)
        if variable is not None:
            try:
                return float(value.strip())
            except ValueError:
                raise SettingsError(f"{variable} must be a number, got {value!r}") from None
        if value is not None and not _is_number(value):
            raise self._wrong_type(key, value, "a number")
        return None if value is None else float(value)

    def seconds_list(self, key: str) -> tuple[float, ...] | None:
        variable, value = self._lookup(key)
        if variable is not None:
            items = _env_items(variable, value)
            try:
                return tuple(float(item) for item in items)
            except ValueError:
                raise SettingsError(
                    f"{variable} must be comma-separated seconds (as in 1,5,30), got {value!r}"
                ) from None
        if value is not None and not (isinstance(value, list) and all(map(_is_number, value))):
            raise self._wrong_type(key, value, "a list of numbers of seconds")
        return None if value is None else tuple(float(v) for v in value)

    def words(self, key: str) -> tuple[str, ...] | None:
        variable, value = self._lookup(key)
        if variable is not None:
            return _env_items(variable, value)
        if value is not None and not (
            isinstance(value, list) and all(isinstance(v, str) for v in value)
        ):
            raise self._wrong_type(key, value, "a list of strings")
        return None if value is None else tuple(value)

    def flag(self, key: str) -> bool | None:
        """A boolean: true/false in TOML; 1/0, true/false, yes/no in the environment."""
        variable, value = self._lookup(key)
        if variable is not None:
            word = value.strip().lower()
            if word in ("1", "true", "yes", "on"):
                return True
            if word in ("0", "false", "no", "off"):
                return False
            raise SettingsError(f"{variable} must be 1 or 0 (true or false), got {value!r}")
        if value is not None and not isinstance(value, bool):
            raise self._wrong_type(key, value, "true or false")
        return value

    def argv(self, key: str) -> tuple[str, ...] | None:
        """A command line: shell words in the environment, a list of strings in TOML."""
        variable, value = self._lookup(key)
        if variable is not None:
            try:
                return tuple(shlex.split(value))
            except ValueError as exc:
                raise SettingsError(
                    f"{variable} is not a command line ({exc}): quote it as a shell would"
                ) from None
        return self.words(key)

    def _lookup(self, key: str) -> tuple[str | None, Any]:
        variable = _KEYS[self.section][key]
        if variable is not None and variable in self.env:
            return variable, self.env[variable]
        return None, self.toml.get(key)

    def _wrong_type(self, key: str, value: Any, wanted: str) -> SettingsError:
        return SettingsError(f"{self.where}: {key} must be {wanted}, got {value!r}")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return _is_int(value) or isinstance(value, float)


def split_list(raw: str) -> tuple[str, ...] | None:
    """The items of a comma-separated list, stripped; None when an item is empty."""
    items = tuple(item.strip() for item in raw.split(","))
    return None if any(not item for item in items) else items


def _env_items(variable: str, raw: str) -> tuple[str, ...]:
    items = split_list(raw)
    if items is None:
        raise SettingsError(
            f"{variable} has an empty item in {raw!r}: separate the values with single commas"
        )
    return items


def _env_seconds(variable: str, raw: str) -> float:
    try:
        return float(raw.strip())
    except ValueError:
        raise SettingsError(f"{variable} must be a number of seconds, got {raw!r}") from None


def _given(**values: Any) -> dict[str, Any]:
    """The values that were set; the dataclass defaults stand in for the others."""
    return {name: value for name, value in values.items() if value is not None}


def _database(src: _Source) -> DatabaseSettings:
    return DatabaseSettings(
        **_given(
            url=src.text("url"),
            pool_min=src.integer("pool_min"),
            pool_max=src.integer("pool_max"),
        )
    )


def _queue(src: _Source, rabbitmq: _Source) -> QueueSettings:
    return QueueSettings(
        **_given(
            backend=src.text("backend"),
            poll_interval_seconds=src.seconds("poll_interval_seconds"),
            lease=_lease(src),
            rabbitmq=_rabbitmq(rabbitmq),
        )
    )


def _rabbitmq(src: _Source) -> RabbitMqSettings:
    return RabbitMqSettings(
        **_given(
            wait_tiers=_wait_tiers(src.seconds_list("wait_tiers_seconds")),
            delivery_limit=src.integer("delivery_limit"),
            reconcile_interval_seconds=src.seconds("reconcile_interval_seconds"),
            redispatch_after_seconds=src.seconds("redispatch_after_seconds"),
            reclaim_after_seconds=src.seconds("reclaim_after_seconds"),
            in_place_steps=src.integer("in_place_steps"),
            consumer_timeout_seconds=src.seconds("consumer_timeout_seconds"),
            dedicated_projects=src.words("dedicated_projects"),
            prefetch=src.integer("prefetch"),
            outbox_retention_seconds=src.seconds("outbox_retention_seconds"),
        )
    )


def _wait_tiers(seconds: tuple[float, ...] | None) -> WaitTiers | None:
    if seconds is None:
        return None
    try:
        return WaitTiers.from_seconds(seconds)
    except (ValueError, OverflowError) as exc:  # OverflowError: inf, or beyond timedelta
        shown = ", ".join(f"{s:g}" for s in seconds)
        raise SettingsError(
            f"the wait tiers [{shown}] are not usable ({exc}): "
            + _fix("VIBEY_QUEUE_WAIT_TIERS", "wait_tiers_seconds", "queue.rabbitmq")
        ) from exc


def _lease(src: _Source) -> LeasePolicy:
    table = src.toml.get("lease_seconds", {})
    if not isinstance(table, dict):
        raise SettingsError(f"{src.where}: lease_seconds must be a [queue.lease_seconds] table")
    seconds: dict[str, float] = {}
    for kind, value in table.items():
        if isinstance(value, dict):
            raise SettingsError(
                f"{src.where}: lease_seconds.{kind} is a table; quote kinds that contain a dot, "
                f'as in "build.implement" = 7200'
            )
        if not _is_number(value):
            raise SettingsError(
                f"{src.where}: lease_seconds.{kind} must be a number of seconds, got {value!r}"
            )
        seconds[kind] = float(value)
    if LEASE_DEFAULT_ENV in src.env:
        seconds["default"] = _env_seconds(LEASE_DEFAULT_ENV, src.env[LEASE_DEFAULT_ENV])
    for kind, value in seconds.items():
        if not 0 < value <= MAX_LEASE_SECONDS:
            raise SettingsError(
                f"the lease for {kind!r} must be more than 0 and at most {MAX_LEASE_SECONDS} "
                f"seconds, got {value}: fix [queue.lease_seconds] (or {LEASE_DEFAULT_ENV})"
            )
    for kind in seconds:
        if kind != "default" and not valid_kind_name(kind):
            raise SettingsError(
                f"{src.where}: lease_seconds names {kind!r}, which is not a job kind: use "
                'default or a kind such as "build.implement" (the workers check it is declared)'
            )
    return LeasePolicy().with_overrides(
        {kind: timedelta(seconds=value) for kind, value in seconds.items()}
    )


def _bus(src: _Source) -> BusSettings:
    return BusSettings(
        **_given(amqp_url=src.text("amqp_url"), prefix=src.text("prefix"), vhost=src.text("vhost"))
    )


def _worker(src: _Source) -> WorkerSettings:
    return WorkerSettings(
        **_given(
            processes=src.integer("processes"),
            threads=src.integer("threads"),
            lanes=src.words("lanes"),
            handlers=src.text("handlers"),
        )
    )


def _scheme(url: str) -> str:
    """Only the scheme: the rest of a URL may hold a password."""
    scheme, sep, _ = url.partition("://")
    return f"'{scheme}://…'" if sep else "a URL without a scheme"


def _workflow(src: _Source) -> WorkflowSettings:
    return WorkflowSettings(
        **_given(
            definitions=src.text("definitions"),
            default_definition=src.text("default_definition"),
            archive_after_seconds=src.seconds("archive_after_seconds"),
            review_feedback=src.boolean("review_feedback"),
            budget_dollars=src.number("budget_dollars"),
            budget_tokens=src.integer("budget_tokens"),
        )
    )


def _engine(src: _Source) -> EngineSettings:
    return EngineSettings(
        **_given(
            name=src.text("name"),
            command=src.argv("command"),
            timeout_seconds=src.seconds("timeout_seconds"),
            workspace=src.text("workspace"),
            max_dollars=src.seconds("max_dollars"),
            max_turns=src.integer("max_turns"),
        )
    )


def _console(src: _Source) -> ConsoleSettings:
    return ConsoleSettings(
        **_given(
            host=src.text("host"),
            port=src.integer("port"),
            allow_remote=src.flag("allow_remote"),
            username=src.text("username"),
            password_hash=src.text("password_hash"),
            token_hash=src.text("token_hash"),
            read_only=src.flag("read_only"),
            anonymous_read=src.flag("anonymous_read"),
            poll_seconds=src.seconds("poll_seconds"),
            safety_poll_seconds=src.seconds("safety_poll_seconds"),
            follow_events=src.flag("follow_events"),
        )
    )
