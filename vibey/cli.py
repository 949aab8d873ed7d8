"""The ``vibey`` command: it loads the settings, calls the store, prints; it decides nothing.

Commands: ``migrate``, ``doctor``, ``worker`` here; ``workflow ...`` in
:mod:`vibey.cli_workflow`, ``gate ...`` in :mod:`vibey.cli_gate`, ``project ...`` in
:mod:`vibey.cli_project`; ``completion SHELL`` prints a
shell completion script and ``--install-completion`` installs one.

Exit codes: :class:`vibey.render.ExitCode` (0 ok, 1 failure, 2 usage, 3 unavailable), and the
JSON shapes of ``--json``, are defined and documented in :mod:`vibey.render`.

Errors are one line on stderr, ``vibey: <what happened and what to do>``; ``-v/--verbose``
adds the traceback and the library logs (connect retries among them).

Start-up is kept short: ``import vibey.cli`` loads cyclopts, rich and the command modules,
never psycopg, pika nor Dramatiq (tests/unit/test_cli_imports.py). Each command imports the
store, the settings and the ``actors`` modules it uses when it runs, so ``--version`` and
``--help`` pay for none of them and a read command not for Dramatiq.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import traceback
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, fields, replace
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any, Literal

from cyclopts import App, CycloptsError, Parameter

from vibey import __version__
from vibey.command_groups import GROUPS
from vibey.render import CommandError, ExitCode

if TYPE_CHECKING:
    from actors.capabilities import BrokerCapabilities
    from vibey.settings import Settings

if TYPE_CHECKING:
    from actors.worker import WorkerConfig

PROBE_TIMEOUT_SECONDS = 5.0


def _version() -> str:
    return __version__


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _usage(error: CycloptsError) -> ExitCode:
    """A bad argument: one line on stderr, exit 2. Printed here rather than by cyclopts, whose
    error console would load rich for every command."""
    print(f"vibey: {_one_line(str(error))} (see `vibey --help`)", file=sys.stderr)
    return ExitCode.USAGE


app = App(
    name="vibey",
    help="A durable workflow engine on Dramatiq, RabbitMQ and PostgreSQL.",
    version=_version,
    print_error=False,
    exit_on_error=False,
)
for _name, (_path, _help) in GROUPS.items():  # imported when one of their commands runs
    app.command(_path, name=_name, help=_help)
app.register_install_completion_command(
    help="Install the shell completion script (--shell bash|zsh|fish|powershell, -o FILE)."
)


@app.meta.default
def _launch(
    *tokens: Annotated[str, Parameter(show=False, allow_leading_hyphen=True)],
    verbose: Annotated[bool, Parameter(name=("-v", "--verbose"), negative=())] = False,
) -> ExitCode:
    """Run a vibey command.

    Parameters
    ----------
    verbose
        On an error, print the traceback too; show library logs (connect retries among them).
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.ERROR,
        format="%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    if not verbose:  # pika logs its own connect failures; doctor reports them in one line
        logging.getLogger("pika").setLevel(logging.CRITICAL)
    try:
        result = app(tokens)
    except CycloptsError as exc:
        return _usage(exc)
    except CommandError as exc:
        return _fail(exc, exc.code, verbose=verbose)
    except BrokenPipeError:  # the reader left (`vibey gate list | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return ExitCode.OK
    except Exception as exc:  # noqa: BLE001 - the last stop: a bug still ends in one line
        code = _layer_code(exc)
        if code is not None:
            return _fail(exc, code, verbose=verbose)
        hint = "" if verbose else " (run with -v for the traceback)"
        return _fail(exc, ExitCode.FAILURE, verbose=verbose, prefix="internal error: ", hint=hint)
    return ExitCode(result) if isinstance(result, int) else ExitCode.OK


def _layer_code(exc: Exception) -> ExitCode | None:
    """The exit code of a settings or store error; None for anything else. Looked up in the
    modules the command loaded: one it never imported raised nothing."""
    settings = sys.modules.get("vibey.settings")
    if settings is not None and isinstance(exc, settings.SettingsError):
        return ExitCode.USAGE
    errors = sys.modules.get("store.errors")
    if errors is not None and isinstance(exc, errors.DatabaseUnavailable):
        return ExitCode.UNAVAILABLE
    if errors is not None and isinstance(exc, errors.StoreError):
        return ExitCode.FAILURE
    return None


def _fail(
    exc: BaseException, code: ExitCode, *, verbose: bool, prefix: str = "", hint: str = ""
) -> ExitCode:
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    message = _one_line(str(exc)) or type(exc).__name__
    print(f"vibey: {prefix}{message}{hint}", file=sys.stderr)
    return code


@app.command
def migrate() -> ExitCode:
    """Apply the pending database migrations (safe to run concurrently, and again)."""
    from store import migrate as migrations
    from vibey.settings import load_settings

    url = load_settings().require_database_url()
    report = migrations.migrate(url)
    for migration in report.applied:
        print(f"applied {migration.version:04d}_{migration.name}")
    now, earlier = len(report.applied), report.already_applied
    if now:
        print(f"database is up to date ({_count(now, 'migration')} applied now, {earlier} earlier)")
    else:
        print(f"database is up to date ({_count(earlier, 'migration')} applied earlier)")
    return ExitCode.OK


def _count(n: int, noun: str) -> str:
    plural = f"{noun}es" if noun.endswith("s") else f"{noun}s"
    return f"{n} {noun}" if n == 1 else f"{n} {plural}"


@dataclass(frozen=True, slots=True)
class DoctorReport:
    """What ``vibey doctor --json`` prints: one JSON object with exactly these keys, flat but
    for ``broker_capabilities``, ``stack`` and ``settings``.

    URLs have their password replaced by ``***``; ``null`` means not set. ``postgres_error``
    is null when PostgreSQL answered. ``pending_migrations`` lists ``NNNN_name`` strings.
    ``amqp_ok`` is true when RabbitMQ answered, false when it did not (or the rabbitmq backend
    has no AMQP URL), null when it was not asked (no AMQP URL, on the postgres backend);
    ``amqp_error`` says why it is not true (null on the postgres backend without a URL).
    ``broker_version`` and ``broker_capabilities`` (``{name: bool}``, see
    ``actors.capabilities``) are null unless RabbitMQ answered. ``healthy`` is true when
    PostgreSQL answered, no migration is pending and, on the rabbitmq backend, RabbitMQ answered.
    ``stack`` lists the whole-stack checks run once healthy (``actors.doctor``: topology,
    consumers, reconcile heartbeat, outbox lag, consumer_timeout, dead letters), each
    ``{"name", "status" (ok|problem|info), "detail", "fix"}``; ``settings`` lists, in the same
    shape, every setting that is inert in this configuration or contradicts another
    (``vibey.setting_checks``; run whether or not healthy); ``next_command`` is the fix of the
    first problem of either (null when there is none). ``in_effect`` maps every setting,
    ``"section.key"`` (docs/settings.md), to its value in effect: URLs without their password,
    a console hash as ``"<set>"``.
    """

    version: str
    config_file: str | None
    database_url: str | None
    pool_min: int
    pool_max: int
    queue_backend: str
    queue_poll_interval_seconds: float
    lease_default_seconds: float
    amqp_url: str | None
    bus_prefix: str
    bus_vhost: str
    postgres_ok: bool
    postgres_error: str | None
    pending_migrations: list[str]
    amqp_ok: bool | None
    amqp_error: str | None
    broker_version: str | None
    broker_capabilities: dict[str, bool] | None
    healthy: bool
    stack: list[dict[str, Any]]
    settings: list[dict[str, Any]]
    next_command: str | None
    in_effect: dict[str, Any]


@app.command
def doctor(
    *,
    json_output: Annotated[bool, Parameter(name="--json", negative=())] = False,
    conformance: Annotated[bool, Parameter(negative=())] = False,
    engine: str | None = None,
    record: Annotated[bool, Parameter(negative=())] = False,
    probe: Annotated[bool, Parameter(name="--probe", negative=())] = False,
    stack: Annotated[bool, Parameter(name="--stack", negative=())] = False,
) -> ExitCode:
    """Show the settings in effect and check PostgreSQL, the migrations and RabbitMQ.

    RabbitMQ is asked (one connection, 5 s at most) whenever an AMQP URL is set: whether it
    answers, its version and what that version honours. Exits 0 when healthy, 1 when
    PostgreSQL does not answer, a migration is pending, or (on the rabbitmq backend) RabbitMQ
    does not answer or has no AMQP URL.

    Parameters
    ----------
    json_output
        Print one JSON object instead of text (keys: see ``vibey.cli.DoctorReport``).
    conformance
        Instead: run the configured engines' conformance checks (installed, version, a tiny
        headless task in a temp repository); exits 0 when every one passes.
    engine
        With --conformance: only this engine (an [engines.<id>] id).
    record
        With --conformance: record each result in engine_health; only a recorded pass within
        its TTL makes an engine eligible for rotation.
    probe
        Print nothing; only the exit code (a Kubernetes readiness probe; no stack checks).
    stack
        Exit 1 also when a whole-stack check finds a problem (printed either way).
    """
    if conformance or engine or record:
        if not conformance:
            raise CommandError("--engine and --record go with --conformance", ExitCode.USAGE)
        from vibey.cli_engine import run_conformance

        return run_conformance(engine, record=record, json_output=json_output)
    from vibey.settings import load_settings

    report, caps = _diagnose(load_settings(), stack=not probe)
    if probe:
        return ExitCode.OK if report.healthy else ExitCode.FAILURE
    if json_output:
        print(json.dumps(asdict(report), indent=2))
    else:
        _print_report(report, caps)
    failed = not report.healthy or (stack and report.next_command is not None)
    return ExitCode.FAILURE if failed else ExitCode.OK


@dataclass(frozen=True, slots=True)
class _AmqpCheck:
    ok: bool | None
    error: str | None
    caps: BrokerCapabilities | None


def _check_rabbitmq(settings: Settings) -> _AmqpCheck:
    from store.pool import redact
    from vibey.settings import QueueBackendNotConfigured

    url = settings.bus.amqp_url
    if url is None:
        if settings.queue.backend == "rabbitmq":
            return _AmqpCheck(False, _one_line(str(QueueBackendNotConfigured())), None)
        return _AmqpCheck(None, None, None)
    from actors.probe import probe  # pika: see the module docstring

    caps, why = probe(url, PROBE_TIMEOUT_SECONDS)
    if caps is None:
        return _AmqpCheck(False, f"RabbitMQ at {redact(url)} {why}", None)
    return _AmqpCheck(True, None, caps)


def _capability_map(caps: BrokerCapabilities) -> dict[str, bool]:
    return {f.name: getattr(caps, f.name) for f in fields(caps) if f.name != "version"}


def _diagnose(
    settings: Settings, *, stack: bool = True
) -> tuple[DoctorReport, BrokerCapabilities | None]:
    from actors.config import in_effect
    from store import migrate as migrations
    from store.errors import DatabaseUnavailable, MigrationError
    from store.pool import redact
    from vibey.settings import SettingsError

    url = settings.database.url
    error: str | None = None
    pending: list[str] = []
    try:
        # A newer schema is fine while every migration this code lacks serves it (an
        # expanding release mid-rollout): store.migrate's compatibility rule.
        found = migrations.pending(settings.require_database_url())
        pending = [f"{m.version:04d}_{m.name}" for m in found]
    except (SettingsError, DatabaseUnavailable, MigrationError) as exc:
        error = _one_line(str(exc))
    amqp = _check_rabbitmq(settings)
    rabbitmq_fine = settings.queue.backend != "rabbitmq" or amqp.ok is True
    report = DoctorReport(
        version=_version(),
        config_file=None if settings.config_file is None else str(settings.config_file),
        database_url=None if url is None else redact(url),
        pool_min=settings.database.pool_min,
        pool_max=settings.database.pool_max,
        queue_backend=settings.queue.backend,
        queue_poll_interval_seconds=settings.queue.poll_interval_seconds,
        lease_default_seconds=settings.queue.lease.default.total_seconds(),
        amqp_url=None if settings.bus.amqp_url is None else redact(settings.bus.amqp_url),
        bus_prefix=settings.bus.prefix,
        bus_vhost=settings.bus.vhost,
        postgres_ok=error is None,
        postgres_error=error,
        pending_migrations=pending,
        amqp_ok=amqp.ok,
        amqp_error=amqp.error,
        broker_version=None if amqp.caps is None else amqp.caps.version,
        broker_capabilities=None if amqp.caps is None else _capability_map(amqp.caps),
        healthy=error is None and not pending and rabbitmq_fine,
        stack=[],
        settings=_setting_checks(settings),
        next_command=None,
        in_effect=dict(in_effect(settings, redact)),
    )
    stack_found: list[dict[str, Any]] = []
    if stack and report.healthy:
        from vibey.cli_ops import stack_checks  # pika, the store: only once the basics pass

        stack_found = stack_checks(settings, amqp.caps)
    every = [*report.settings, *stack_found]
    fixes = [c["fix"] for c in every if c["status"] == "problem" and c["fix"]]
    report = replace(report, stack=stack_found, next_command=fixes[0] if fixes else None)
    return report, amqp.caps


def _setting_checks(settings: Settings) -> list[dict[str, Any]]:
    from vibey.setting_checks import setting_checks
    from vibey.settings import SettingsError
    from vibey.wiring import longest_lease

    try:
        longest = longest_lease(settings)
    except SettingsError:  # the definitions do not load: the stack checks say so
        longest = None
    return setting_checks(settings, longest)


def _print_report(report: DoctorReport, caps: BrokerCapabilities | None) -> None:
    rows: list[tuple[str, Any]] = [
        ("vibey", report.version),
        ("config file", report.config_file or "none"),
        ("database url", report.database_url or "not set"),
        ("pool size", f"{report.pool_min}..{report.pool_max}"),
        ("queue backend", report.queue_backend),
        ("amqp url", report.amqp_url or "not set"),
        ("bus", f"prefix {report.bus_prefix}, vhost {report.bus_vhost}"),
        ("postgresql", "answers" if report.postgres_ok else f"PROBLEM: {report.postgres_error}"),
    ]
    if report.postgres_ok:
        rows.append(("migrations", _migrations_line(report.pending_migrations)))
    rows.append(("rabbitmq", _rabbitmq_line(report)))
    for label, value in rows:
        print(f"{label + ':':<15} {value}")
    for label, value in caps.as_table()[1:] if caps is not None else ():
        print(f"  {label}: {value}")
    _print_in_effect(report.in_effect)
    for check in [*report.settings, *report.stack]:
        mark = {"ok": "ok", "problem": "PROBLEM", "info": "note"}[check["status"]]
        print(f"{check['name'] + ':':<15} {mark}: {check['detail']}")
    if report.next_command is not None:
        print(f"next: {report.next_command}")
    print("healthy" if report.healthy else "not healthy")


def _print_in_effect(values: Mapping[str, Any]) -> None:
    """The settings not at their default (the JSON report lists every one)."""
    from actors.config import Settings, in_effect

    defaults = dict(in_effect(Settings(), lambda url: url))
    changed = {key: value for key, value in values.items() if value != defaults[key]}
    at_default = len(values) - len(changed)
    print(f"{'in effect:':<15} {at_default} settings at their default, {len(changed)} set here")
    for key, value in changed.items():
        print(f"  {key} = {json.dumps(value)}")


def _rabbitmq_line(report: DoctorReport) -> str:
    if report.amqp_ok is None:
        return "not asked (no AMQP URL; the postgres backend needs none)"
    if not report.amqp_ok:
        return f"PROBLEM: {report.amqp_error}"
    return f"answers, RabbitMQ {report.broker_version}; what it honours:"


def _migrations_line(pending: Sequence[str]) -> str:
    if not pending:
        return "up to date"
    return f"PROBLEM: {len(pending)} pending ({', '.join(pending)}): run `vibey migrate`"


@app.command
def worker(
    *,
    processes: int | None = None,
    threads: int | None = None,
    project: Annotated[
        tuple[str, ...], Parameter(name="--project", negative=(), show_default=False)
    ] = (),
    lanes: str | None = None,
    handlers: str | None = None,
    definitions: str | None = None,
) -> ExitCode:
    """Run the worker fleet until SIGTERM or SIGINT: Dramatiq on the rabbitmq backend, the
    drive loop (SKIP LOCKED claims, LISTEN/NOTIFY wakeups) on the postgres backend.

    Runs PROCESSES worker processes of THREADS threads each under a supervisor that respawns
    a process that dies (at once when it was killed; after a doubling delay, at most 30 s,
    when it keeps failing right after its start). Without --project the fleet serves the
    shared lane queues (every project); with it, only those projects' dedicated queues (on
    the postgres backend, only their jobs), and it routes those projects there (the project
    routes in PostgreSQL every publisher reads; it says so when a project was not routed
    before; `vibey project undedicate P` undoes it). It exits 2 when
    consumer_timeout_seconds is not above the longest lease. A process serving both lanes
    keeps one of its threads for the interactive lane. It prints one line saying what it
    runs; SIGTERM or Ctrl-C stops taking work and lets running steps settle for up to the
    longest lease (a step still running then is cut, and its lease is reaped by a
    reconciler), then exits 0. The flags override [worker] in vibey.toml and VIBEY_WORKER_*;
    it needs VIBEY_PG_URL, and VIBEY_AMQP_URL on the rabbitmq backend.

    Parameters
    ----------
    processes
        Worker processes (default: [worker] processes, 2).
    threads
        Threads per process (default: [worker] threads, 8).
    project
        Serve only this project's dedicated queues; repeat for several.
    lanes
        Comma-separated lanes to consume, of interactive and build (default: both).
    handlers
        The step handlers, as module:attribute (default: actors.handlers:build_handlers).
    definitions
        The workflow definitions, as module:attribute (default: [workflow] definitions,
        workflows.protocol:DEFINITIONS). Modules are found from the current directory too.
    """
    from vibey.settings import load_settings
    from vibey.settings import replace as checked

    settings = _with_worker_flags(load_settings(), processes, threads, lanes, handlers)
    if definitions is not None:
        workflow = checked(settings.workflow, definitions=definitions)
        settings = checked(settings, workflow=workflow)
    from actors.fleet import supervise  # Dramatiq: see the module docstring
    from vibey.cli_project import route_at_start
    from vibey.wiring import check_consumer_timeout, worker_config

    config = worker_config(settings, projects=project)
    check_consumer_timeout(settings)
    for routed in route_at_start(config):
        queues = ", ".join(q for q in config.queues() if q.endswith(f".p.{routed}"))
        print(
            f"vibey worker: project {routed} was not routed to its dedicated queues; routed now "
            f"(its pointers go to {queues or 'its dedicated queues'} from now on, and its "
            f"claimable ones were sent there again; `vibey project undedicate {routed}` "
            "undoes it)",
            flush=True,
        )
    count, threads = settings.worker.processes, config.worker.threads
    # A SIGTERM before the supervisor takes the signals over ends here, like a SIGINT.
    signal.signal(signal.SIGTERM, _interrupt)
    logging.getLogger("actors.fleet").setLevel(logging.INFO)  # respawns are worth a line
    try:
        print(
            f"vibey worker: {_count(count, 'process')} of {_count(threads, 'thread')} "
            f"each on {_serves(config)}; SIGTERM or Ctrl-C stops it",
            flush=True,
        )
        respawns = supervise(config, processes=count)
    except KeyboardInterrupt:
        return ExitCode.OK
    print(f"vibey worker: stopped ({_count(respawns, 'respawn')})", flush=True)
    return ExitCode.OK


def _serves(config: WorkerConfig) -> str:
    from store.pool import redact

    if config.queue.backend == "postgres":
        projects = ", ".join(config.projects) or "every project"
        return (
            f"lanes {', '.join(config.worker.lanes)} of {projects} at {redact(config.pg_url)} "
            "(postgres backend: SKIP LOCKED claims, LISTEN/NOTIFY wakeups)"
        )
    return f"{', '.join(config.queues())} at {redact(config.amqp_url)}"


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def _with_worker_flags(
    settings: Settings,
    processes: int | None,
    threads: int | None,
    lanes: str | None,
    handlers: str | None,
) -> Settings:
    """The settings with the command line's choices in [worker] (checked like the rest)."""
    from vibey.settings import SettingsError, split_list
    from vibey.settings import replace as checked

    given: dict[str, Any] = {}
    if lanes is not None:
        parsed = split_list(lanes)
        if parsed is None:
            raise SettingsError(
                f"--lanes has an empty item in {lanes!r}: separate the lanes with single commas"
            )
        given["lanes"] = parsed
    flags = {"processes": processes, "threads": threads, "handlers": handlers}
    given.update({name: value for name, value in flags.items() if value is not None})
    return checked(settings, worker=checked(settings.worker, **given)) if given else settings


@app.command
def completion(shell: Literal["bash", "zsh", "fish", "powershell"], /) -> ExitCode:
    """Print the shell completion script for SHELL.

    For bash: ``vibey completion bash > ~/.local/share/bash-completion/completions/vibey``
    (or ``eval "$(vibey completion bash)"`` in ~/.bashrc); ``vibey --install-completion``
    does this for the shell it detects.

    Parameters
    ----------
    shell
        bash, zsh, fish or powershell.
    """
    print(app.generate_completion(shell=shell), end="")
    return ExitCode.OK


def _unknown_command(tokens: Sequence[str]) -> str | None:
    """The first word when it names no command (cyclopts would print the help for it)."""
    first = next((t for t in tokens if not t.startswith("-")), None)
    if first is None or tokens.index(first) != 0 or first in app:
        return None
    return first


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``vibey`` with ``argv`` (default: the command line); returns the exit code.

    The console script is :func:`vibey.launch.main`, which answers ``--version`` before this
    module is imported. A bad argument prints one line and returns 2 (``ExitCode.USAGE``); an
    unknown command exits 2 too, whatever follows it (``--help`` included).
    """
    tokens = list(argv) if argv is not None else sys.argv[1:]
    if os.getcwd() not in sys.path:  # user definitions and handlers, as dramatiq's CLI does
        sys.path.insert(0, os.getcwd())
    unknown = _unknown_command(tokens)
    if unknown is not None:
        known = ", ".join(name for name in app if not name.startswith("-"))
        print(
            f'vibey: Unknown command "{unknown}". Available commands: {known}. '
            "(see `vibey --help`)",
            file=sys.stderr,
        )
        return ExitCode.USAGE
    try:
        result = app.meta(tokens, result_action="return_value")
    except CycloptsError as exc:
        return _usage(exc)
    return int(result) if isinstance(result, int) else ExitCode.OK
