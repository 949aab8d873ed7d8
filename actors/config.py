"""The settings, declared once: one field per key, with its type, default, environment
variable, constraint and (the docstring below it) its help. Everything else is derived from
these declarations: ``vibey.settings`` reads the TOML file and the ``VIBEY_*`` variables into
them, ``vibey doctor`` shows them in effect (:func:`in_effect`), ``docs/settings.md`` lists
them (a unit test keeps it equal to :func:`table`), and a worker reads them itself
(``actors.worker.WorkerConfig`` is a :class:`Settings` with its process's choices added).

A setting is ``key: Type = setting(default, "VIBEY_VARIABLE", constraint=...)`` in its
section's model, then its help as a docstring. The type says how the environment's text is
read and what a wrong value is told to be; the constraint (pydantic's ``gt``, ``ge``, ``le``,
...) and the validators say what is refused; a refusal is one :class:`SettingsError` line
naming the key, what is wrong and the variable or TOML key to fix (``actors.declare``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal, get_args
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from pydantic import AfterValidator, BaseModel, SkipValidation, StrictFloat, model_validator

from actors.agents.roster import AgentSpec
from actors.declare import (
    Argv,
    Flag,
    Int,
    Key,
    Kind,
    Number,
    Seconds,
    SecondsList,
    Section,
    SettingsError,
    Text,
    Words,
    check,
    setting,
)
from actors.webhook_spec import WebhookSpec
from workflows.budget import Budget
from workflows.dispatch import DEFAULT_WAIT_TIERS, MAX_PROJECT_ID_CHARS, Lane, WaitTiers
from workflows.job import LeasePolicy, valid_kind_name

# job.lease_ms is a PostgreSQL integer: a lease is at most 2^31-1 ms (about 24.8 days).
MAX_LEASE_SECONDS = (2**31 - 1) // 1000
LANES: tuple[str, ...] = tuple(lane.value for lane in Lane)
LOOPBACK_HOSTS = frozenset({"127.0.0.1", "::1", "localhost"})
QueueBackend = Literal["rabbitmq", "postgres"]
QUEUE_BACKENDS: tuple[str, ...] = get_args(QueueBackend)
ENGINES: tuple[str, ...] = ("scripted", "command")

DATABASE_FIX = (
    "VIBEY_PG_URL is not set: export VIBEY_PG_URL=postgresql://USER@HOST:5432/DB "
    "(or run `just up`, which writes .env)"
)
AMQP_FIX = (
    "the queue backend is rabbitmq but VIBEY_AMQP_URL is not set: "
    "export VIBEY_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/, "
    'or set backend = "postgres" under [queue] in vibey.toml (or VIBEY_QUEUE_BACKEND=postgres)'
)
_NOT_IN_PROJECT_ID = re.compile(r"[.*#\s]")  # a project id is one word of a routing key
_NOT_IN_PREFIX = re.compile(r"[*#\s]")  # every exchange and queue name starts with the prefix
_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)*:[A-Za-z_]\w*")


class DatabaseNotConfigured(SettingsError):
    def __init__(self) -> None:
        super().__init__(DATABASE_FIX)


class QueueBackendNotConfigured(SettingsError):
    def __init__(self, message: str = AMQP_FIX) -> None:
        super().__init__(message)


# --- the sections -----------------------------------------------------------------------------


def _scheme(url: str) -> str:
    """Only the scheme: the rest of a URL may hold a password."""
    scheme, sep, _ = url.partition("://")
    return f"'{scheme}://…'" if sep else "a URL without a scheme"


def _postgres_url(url: str | None) -> str | None:
    if url is None or url.startswith(("postgresql://", "postgres://")):
        return None
    return f"the database URL must start with postgresql:// or postgres://, got {_scheme(url)}"


class DatabaseSettings(Section):
    table: ClassVar[str] = "database"
    url: Annotated[Text | None, check(_postgres_url)] = setting(None, "VIBEY_PG_URL")
    """the PostgreSQL database (postgresql://USER@HOST:5432/DB)"""
    pool_min: Int = setting(1, "VIBEY_PG_POOL_MIN")
    """connections a process's pool keeps open"""
    pool_max: Int = setting(10, "VIBEY_PG_POOL_MAX")
    """connections a process's pool opens at most"""

    @model_validator(mode="after")
    def _pool_sizes(self) -> DatabaseSettings:
        if not 0 <= self.pool_min <= self.pool_max or self.pool_max < 1:
            raise ValueError(
                "the pool sizes must satisfy 0 <= pool_min <= pool_max and pool_max >= 1, got "
                f"pool_min={self.pool_min}, pool_max={self.pool_max}: "
                "fix VIBEY_PG_POOL_MIN / VIBEY_PG_POOL_MAX (or [database])"
            )
        return self


def project_id_problem(ids: Iterable[str]) -> str | None:
    """Why ``ids`` cannot be words of routing keys (or repeat), or None."""
    ids = tuple(ids)
    for project in ids:
        if not project or _NOT_IN_PROJECT_ID.search(project):
            return (
                f"project id {project!r} cannot be a word of a routing key: it must be "
                "non-empty and contain no '.', '*', '#' or whitespace"
            )
        if len(project) > MAX_PROJECT_ID_CHARS:
            return (
                f"project id {project[:20]!r}... is {len(project)} characters; the limit is "
                f"{MAX_PROJECT_ID_CHARS}"
            )
    return _repeated(ids, "project ids")


def _repeated(values: tuple[Any, ...], what: str) -> str | None:
    repeated = sorted({str(v) for v in values if values.count(v) > 1})
    return f"{what} repeat ({', '.join(repeated)}): list each once" if repeated else None


def check_project_ids(project_ids: Iterable[str], fix: str) -> tuple[str, ...]:
    """The ids as a tuple when each can be a word of a routing key and none repeats.

    ``fix`` names where they came from, e.g. ``"fix --project"``.
    """
    ids = tuple(project_ids)
    problem = project_id_problem(ids)
    if problem is not None:
        raise SettingsError(f"{problem}; {fix}")
    return ids


def _wait_tiers_problem(seconds: tuple[float, ...]) -> str | None:
    try:
        WaitTiers.from_seconds(seconds)
    except (ValueError, OverflowError) as exc:  # OverflowError: inf, or beyond timedelta
        return f"the wait tiers [{', '.join(f'{s:g}' for s in seconds)}] are not usable ({exc})"
    return None


class RabbitMqSettings(Section):
    """``[queue.rabbitmq]``: the wait tiers, queue arguments and reconcile timings."""

    table: ClassVar[str] = "queue.rabbitmq"
    wait_tiers_seconds: Annotated[SecondsList, check(_wait_tiers_problem)] = setting(
        DEFAULT_WAIT_TIERS.seconds, "VIBEY_QUEUE_WAIT_TIERS"
    )
    """the fixed delays a waiting step is parked on (one delay queue each)"""
    delivery_limit: Int = setting(20, "VIBEY_QUEUE_DELIVERY_LIMIT", ge=0)
    """work queues' x-delivery-limit (0: none)"""
    reconcile_interval_seconds: Seconds = setting(30.0, "VIBEY_QUEUE_RECONCILE_INTERVAL")
    """how often the reconciler runs"""
    redispatch_after_seconds: Seconds = setting(120.0, "VIBEY_QUEUE_REDISPATCH_AFTER")
    """a claimable job's lost pointer is re-sent after"""
    reclaim_after_seconds: Seconds = setting(30.0, "VIBEY_QUEUE_RECLAIM_AFTER")
    """outbox rows a dead relay held are taken over after"""
    in_place_steps: Int = setting(16, "VIBEY_QUEUE_IN_PLACE_STEPS", ge=0)
    """next steps a worker runs itself after a settle, no broker hop (0: none)"""
    in_place_ms: Int = setting(250, "VIBEY_QUEUE_IN_PLACE_MS", ge=1)
    """wall time an in-place chain runs before its next step goes through the broker (ms)"""
    consumer_timeout_seconds: Seconds = setting(21600.0, "VIBEY_QUEUE_CONSUMER_TIMEOUT")
    """work queues' x-consumer-timeout; above the longest lease"""
    dedicated_projects: Annotated[Words, check(project_id_problem)] = setting(
        (), "VIBEY_QUEUE_DEDICATED_PROJECTS"
    )
    """projects routed to their own queues at worker start"""
    prefetch: Int | None = setting(None, "VIBEY_QUEUE_PREFETCH", ge=1)
    """deliveries a queue's consumer holds (unset: the threads)"""
    outbox_retention_seconds: Seconds = setting(86400.0, "VIBEY_QUEUE_OUTBOX_RETENTION")
    """sent outbox rows are pruned after"""

    @property
    def wait_tiers(self) -> WaitTiers:
        return WaitTiers.from_seconds(self.wait_tiers_seconds)


def _leases_problem(leases: Mapping[str, float]) -> str | None:
    for kind, value in leases.items():
        if not 0 < value <= MAX_LEASE_SECONDS:
            return (
                f"the lease for {kind!r} must be more than 0 and at most {MAX_LEASE_SECONDS} "
                f"seconds, got {value}"
            )
        if kind != "default" and not valid_kind_name(kind):
            return (
                f"lease_seconds names {kind!r}, which is not a job kind: use default or a kind "
                'such as "build.implement" (the workers check it is declared)'
            )
    return None


def _flat_leases(value: Any) -> Any:
    for kind, seconds in value.items() if isinstance(value, dict) else ():
        if isinstance(seconds, dict):
            raise ValueError(
                f"lease_seconds.{kind} is a table; quote kinds that contain a dot, as in "
                '"build.implement" = 7200'
            )
    return value


LeaseTable = Annotated[
    Mapping[str, StrictFloat],
    Kind("a [queue.lease_seconds] table of seconds", float, "a number of seconds"),
]


class QueueSettings(Section):
    table: ClassVar[str] = "queue"
    backend: Annotated[QueueBackend, Kind("a string", str)] = setting(
        "rabbitmq", "VIBEY_QUEUE_BACKEND"
    )
    """rabbitmq, or postgres (no broker: the drive loop)"""
    poll_interval_seconds: Seconds = setting(5.0, "VIBEY_QUEUE_POLL_INTERVAL")
    """the postgres backend's idle wakeup backstop"""
    lease_seconds: Annotated[LeaseTable, check(_leases_problem)] = setting(
        {}, "VIBEY_QUEUE_LEASE_SECONDS_DEFAULT", env_item="default"
    )
    """a claim's lease per job kind (or alias), plus default"""
    rabbitmq: RabbitMqSettings = RabbitMqSettings()

    @model_validator(mode="before")
    @classmethod
    def _lease_table(cls, values: Any) -> Any:
        if isinstance(values, dict):
            _flat_leases(values.get("lease_seconds"))
        return values

    @property
    def lease(self) -> LeasePolicy:
        overrides = {kind: timedelta(seconds=s) for kind, s in self.lease_seconds.items()}
        return LeasePolicy().with_overrides(overrides)


def _amqp_url(url: str | None) -> str | None:
    for one in () if url is None else url.split(";"):
        if not one.strip().startswith(("amqp://", "amqps://")):
            return (
                f"the AMQP URL must start with amqp:// or amqps://, got {_scheme(one)} (several "
                "URLs, one per node of a cluster, are separated by ';')"
            )
    return None


def _prefix(prefix: str) -> str | None:
    if not prefix or _NOT_IN_PREFIX.search(prefix):
        return f"the bus prefix {prefix!r} must be non-empty and contain no '*', '#' or whitespace"
    return None


class BusSettings(Section):
    table: ClassVar[str] = "bus"
    amqp_url: Annotated[Text | None, check(_amqp_url)] = setting(None, "VIBEY_AMQP_URL")
    """RabbitMQ (amqp://USER:PASS@HOST:5672/; ';' between nodes)"""
    prefix: Annotated[Text, check(_prefix)] = setting("vibey", "VIBEY_BUS_PREFIX")
    """every exchange's and queue's name starts with it"""
    vhost: Text = setting("/", "VIBEY_BUS_VHOST", min_length=1)
    """the vhost of an AMQP URL that names none"""

    @model_validator(mode="after")
    def _apply_vhost(self) -> BusSettings:
        if self.amqp_url is not None:
            urls = self.amqp_url.split(";")
            joined = ";".join(_with_vhost(url.strip(), self.vhost) for url in urls)
            object.__setattr__(self, "amqp_url", joined)
        return self


def _with_vhost(url: str, vhost: str) -> str:
    """A URL that names no vhost gets it; one that names the same is kept; one that names
    another is an error. ``/`` (the default) leaves the URL to decide."""
    parts = urlsplit(url)
    named = unquote(parts.path[1:]) if parts.path not in ("", "/") else None
    if vhost == "/" or named == vhost:
        return url
    if named is None:
        return urlunsplit(parts._replace(path="/" + quote(vhost, safe="")))
    raise ValueError(
        f"the AMQP URL names vhost {named!r} but the bus vhost is {vhost!r}: drop one "
        "(VIBEY_AMQP_URL's path, or VIBEY_BUS_VHOST / vhost under [bus])"
    )


def _lanes_problem(lanes: tuple[str, ...]) -> str | None:
    if not lanes:
        return f"a worker needs at least one lane ({', '.join(LANES)})"
    for lane in lanes:
        if lane not in LANES:
            return f"unknown lane {lane!r}: the lanes are {', '.join(LANES)}"
    return _repeated(lanes, "lanes")


def _import_path(what: str, example: str) -> AfterValidator:
    def problem(path: str) -> str | None:
        if _IMPORT_PATH.fullmatch(path):
            return None
        return f"{what} {path!r} are not an import path module:attribute (as in {example})"

    return check(problem)


class WorkerSettings(Section):
    """``[worker]``: what ``vibey worker`` runs; its flags override these (``replace``)."""

    table: ClassVar[str] = "worker"
    processes: Int = setting(2, "VIBEY_WORKER_PROCESSES", flag="--processes", ge=1)
    """worker processes"""
    threads: Int = setting(8, "VIBEY_WORKER_THREADS", flag="--threads", ge=1)
    """threads per process"""
    lanes: Annotated[Words, check(_lanes_problem)] = setting(
        LANES, "VIBEY_WORKER_LANES", flag="--lanes"
    )
    """the lanes it consumes"""
    handlers: Annotated[Text, _import_path("the handlers", "actors.handlers:build_handlers")] = (
        setting("actors.handlers:build_handlers", "VIBEY_WORKER_HANDLERS", flag="--handlers")
    )
    """the step handlers: a registry, or a factory (module:attribute)"""


def _blank(what: str) -> AfterValidator:
    return check(lambda text: None if text is None or text.strip() else f"{what} is empty")


class WorkflowSettings(Section):
    """``[workflow]``: the definitions the CLI and the worker load, and the one
    ``vibey workflow start`` uses without ``--definition``."""

    table: ClassVar[str] = "workflow"
    definitions: Annotated[
        Text, _import_path("the workflow definitions", "workflows.protocol:DEFINITIONS")
    ] = setting("workflows.protocol:DEFINITIONS", "VIBEY_WORKFLOW_DEFINITIONS")
    """the workflow definitions (module:attribute)"""
    default_definition: Annotated[Text, _blank("the default workflow definition")] = setting(
        "vibey-protocol", "VIBEY_WORKFLOW_DEFAULT_DEFINITION"
    )
    """`workflow start`'s definition"""
    archive_after_seconds: Seconds = setting(30 * 86400.0, "VIBEY_WORKFLOW_ARCHIVE_AFTER")
    """a finished workflow's jobs and gates are deleted, its history archived, after"""
    review_feedback: Flag = setting(True, "VIBEY_WORKFLOW_REVIEW_FEEDBACK")
    """REVIEW asks the user (false: unattended)"""
    budget_dollars: Number | None = setting(None, "VIBEY_WORKFLOW_BUDGET_DOLLARS", gt=0)
    """a new workflow's budget (unset: none)"""
    budget_tokens: Int | None = setting(None, "VIBEY_WORKFLOW_BUDGET_TOKENS", gt=0)
    """a new workflow's token budget (unset: none)"""

    def budget(self) -> Budget | None:
        """The default budget of a new workflow (None: unbounded)."""
        if self.budget_dollars is None and self.budget_tokens is None:
            return None
        return Budget(dollars=self.budget_dollars, tokens=self.budget_tokens)


def _branch_problem(pattern: str) -> str | None:
    branch = pattern.replace("{project}", "p")
    if not branch.strip() or any(c in branch for c in " ~^:?*[\\") or ".." in branch:
        return f"{pattern!r} is not a branch name"
    return None


class ProjectSettings(Section):
    """``[project]``: where build.integrate pushes the integrated branch."""

    table: ClassVar[str] = "project"
    push: Annotated[Text | None, _blank("the push remote")] = setting(None, "VIBEY_PROJECT_PUSH")
    """a git remote, URL or path build.integrate pushes to"""
    push_branch: Annotated[Text, check(_branch_problem)] = setting(
        "vibey/{project}", "VIBEY_PROJECT_PUSH_BRANCH"
    )
    """the remote branch ({project}: its id)"""

    def branch_for(self, project: str) -> str:
        return self.push_branch.replace("{project}", project)


class EngineSettings(Section):
    """``[engine]``: the engine ``vibey workflow start`` names (unless ``--script`` chooses
    the scripted one), and what the worker gives the engines."""

    table: ClassVar[str] = "engine"
    name: Annotated[Literal["scripted", "command"], Kind("a string", str)] = setting(
        "scripted", "VIBEY_ENGINE_NAME"
    )
    """`workflow start`'s engine: scripted or command"""
    command: Argv = setting((), "VIBEY_ENGINE_COMMAND")
    """the command engine's argv (shell words)"""
    timeout_seconds: Seconds = setting(7200.0, "VIBEY_ENGINE_TIMEOUT")
    """the command's time limit"""
    workspace: Annotated[Text, _blank("the engine workspace")] = setting(
        ".vibey/work", "VIBEY_ENGINE_WORKSPACE"
    )
    """engines' repositories and worktrees"""
    max_dollars: Number | None = setting(
        None, "VIBEY_ENGINE_MAX_DOLLARS", gt=0, allow_inf_nan=False
    )
    """a bounded BUILD job's spend cap (unset: none)"""
    max_turns: Int | None = setting(None, "VIBEY_ENGINE_MAX_TURNS", gt=0)
    """a bounded BUILD job's turn cap (unset: none)"""

    @model_validator(mode="after")
    def _command_engine(self) -> EngineSettings:
        if self.name == "command" and not self.command:
            raise ValueError(
                "the command engine needs a command: set command under [engine] "
                '(as in command = ["my-agent", "--flag"]) or VIBEY_ENGINE_COMMAND'
            )
        return self


class MetricsSettings(Section):
    """``[metrics]``: where a worker, the reconciler or a loop service serves metrics."""

    table: ClassVar[str] = "metrics"
    port: Int | None = setting(None, "VIBEY_METRICS_PORT", ge=1, le=65535)
    """Prometheus /metrics and /healthz (unset: none)"""


def is_loopback(host: str) -> bool:
    return host in LOOPBACK_HOSTS or host.startswith("127.")


def _scrypt(value: str | None) -> str | None:
    if value is None or value.startswith("scrypt$"):
        return None
    return "it is not a scrypt hash: make one with `vibey console hash`"


class ConsoleSettings(Section):
    """``[console]``: where `vibey console` listens and who may use it (docs/console.md).
    With neither hash, the console is read-only and needs no sign-in. With ``follow_events``
    and the rabbitmq backend the domain events wake the pages and PostgreSQL is read every
    ``safety_poll_seconds``; otherwise every ``poll_seconds`` (the slow pace is never faster)."""

    table: ClassVar[str] = "console"
    host: Text = setting("127.0.0.1", "VIBEY_CONSOLE_HOST")
    """beyond loopback only with allow_remote"""
    port: Int = setting(8377, "VIBEY_CONSOLE_PORT", ge=1, le=65535)
    """the console's port"""
    allow_remote: Flag = setting(False, "VIBEY_CONSOLE_ALLOW_REMOTE")
    """may bind beyond loopback"""
    username: Text = setting("admin", "VIBEY_CONSOLE_USERNAME")
    """who signs in with password_hash"""
    password_hash: Annotated[Text | None, check(_scrypt)] = setting(
        None, "VIBEY_CONSOLE_PASSWORD_HASH"
    )
    """`vibey console hash` of the password"""
    token_hash: Annotated[Text | None, check(_scrypt)] = setting(None, "VIBEY_CONSOLE_TOKEN_HASH")
    """a token's hash (sign in with it, or Bearer)"""
    read_only: Flag = setting(False, "VIBEY_CONSOLE_READ_ONLY")
    """a shared screen: no form, no write"""
    anonymous_read: Flag = setting(False, "VIBEY_CONSOLE_ANONYMOUS_READ")
    """pages without signing in (never writes)"""
    poll_seconds: Seconds = setting(0.5, "VIBEY_CONSOLE_POLL")
    """how often it looks for a change without the domain events"""
    safety_poll_seconds: Seconds = setting(5.0, "VIBEY_CONSOLE_SAFETY_POLL")
    """... while the domain events arrive"""
    follow_events: Flag = setting(True, "VIBEY_CONSOLE_FOLLOW_EVENTS")
    """pages woken by vibey.events (false: the poll alone)"""

    @model_validator(mode="after")
    def _loopback(self) -> ConsoleSettings:
        if not self.allow_remote and not is_loopback(self.host):
            raise ValueError(
                f"the console binds only to loopback, not {self.host!r}: use 127.0.0.1, or set "
                "allow_remote = true under [console] (VIBEY_CONSOLE_ALLOW_REMOTE=1), with a "
                "password_hash or token_hash"
            )
        return self

    @property
    def signs_in(self) -> bool:
        """Whether anyone can sign in (a password or a token hash is set)."""
        return self.password_hash is not None or self.token_hash is not None


def _http(endpoint: str | None) -> str | None:
    if endpoint is None or endpoint.startswith(("http://", "https://")):
        return None
    return f"the OTLP endpoint must be an http(s) URL, got {endpoint!r}"


class TracingSettings(Section):
    """``[tracing]``: OpenTelemetry traces exported over OTLP/HTTP (``actors/tracing.py``)."""

    table: ClassVar[str] = "tracing"
    otlp_endpoint: Annotated[Text | None, check(_http)] = setting(
        None, "VIBEY_TRACING_OTLP_ENDPOINT"
    )
    """OTLP/HTTP endpoint (unset: no tracing)"""
    service_name: Text = setting("vibey", "VIBEY_TRACING_SERVICE_NAME")
    """the traces' service"""


class Settings(Section):
    """Every setting: read once at start (``vibey.settings.load_settings``) and passed down."""

    database: DatabaseSettings = DatabaseSettings()
    queue: QueueSettings = QueueSettings()
    bus: BusSettings = BusSettings()
    worker: WorkerSettings = WorkerSettings()
    workflow: WorkflowSettings = WorkflowSettings()
    engine: EngineSettings = EngineSettings()
    project: ProjectSettings = ProjectSettings()
    metrics: MetricsSettings = MetricsSettings()
    console: ConsoleSettings = ConsoleSettings()
    tracing: TracingSettings = TracingSettings()
    # Read by their own parsers: [engines.<id>] (actors.agents.roster), in id order, and
    # [notify.webhooks.<name>] (actors.webhooks), in name order.
    engines: SkipValidation[tuple[AgentSpec, ...]] = ()
    webhooks: SkipValidation[tuple[WebhookSpec, ...]] = ()
    agent_env: Mapping[str, str] = {}  # the base environment engines get
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


# --- what is derived from the declarations ----------------------------------------------------


def sections(model: type[BaseModel] = Settings) -> Iterator[type[Section]]:
    """Every section ``model`` holds, nested ones after their parent."""
    for field in model.model_fields.values():
        if isinstance(field.annotation, type) and issubclass(field.annotation, Section):
            yield field.annotation
            yield from sections(field.annotation)


def keys() -> Iterator[Key]:
    """Every declared setting, in declaration order."""
    for section in sections():
        for name, field in section.model_fields.items():
            if isinstance(field.json_schema_extra, dict):  # declared with setting()
                yield Key(section, name, field)


def in_effect(settings: Settings, redact: Callable[[str], str]) -> list[tuple[str, Any]]:
    """``(section.key, value)`` for every declared setting; a hash shows as ``<set>``, a URL
    through ``redact`` (no password)."""
    rows = []
    for key in keys():
        value: Any = settings
        for part in key.path():
            value = getattr(value, part)
        if value is not None and key.name.endswith(("_hash", "url")):
            value = "<set>" if key.name.endswith("_hash") else redact(str(value))
        rows.append((f"{key.table}.{key.name}", value))
    return rows


def table() -> str:
    """The settings as a Markdown table (``docs/settings.md`` holds it)."""
    rows = ["| key | variable | default | what |", "| --- | --- | --- | --- |"]
    for key in keys():
        default = key.field.default
        shown = "unset" if default is None else _toml(default)
        what = key.help
        rows.append(f"| `[{key.table}] {key.name}` | `{key.env or ''}` | {shown} | {what} |")
    return "\n".join(rows) + "\n"


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, tuple | list):
        return "`[" + ", ".join(_toml(v).strip("`") for v in value) + "]`"
    if isinstance(value, str):
        return f'`"{value}"`'
    if isinstance(value, float) and value.is_integer():
        return f"`{int(value)}`"
    return f"`{value}`" if not isinstance(value, dict) else "`{}`"
