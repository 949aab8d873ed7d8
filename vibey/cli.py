"""The ``vibey`` command: it loads the settings, calls the store, prints; it decides nothing.

Exit codes (:class:`ExitCode`, the only place they are defined)::

    0  OK           done; for ``doctor``: healthy
    1  FAILURE      the command ran and found a problem (a store error, an unhealthy doctor)
    2  USAGE        a bad argument or a bad configuration (a SettingsError)
    3  UNAVAILABLE  a service did not answer (PostgreSQL)

Errors are one line on stderr, ``vibey: <what happened and what to do>``; ``-v/--verbose``
adds the traceback and the library logs (connect retries among them).
"""

from __future__ import annotations

import enum
import json
import logging
import sys
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from typing import Annotated, Any

from cyclopts import App, CycloptsError, Parameter
from rich.console import Console
from rich.text import Text

from store import migrate as migrations
from store.errors import DatabaseUnavailable, StoreError
from store.pool import redact
from vibey.settings import Settings, SettingsError, load_settings


class ExitCode(enum.IntEnum):
    OK = 0
    FAILURE = 1
    USAGE = 2
    UNAVAILABLE = 3


def _version() -> str:
    try:
        return metadata.version("vibey")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from an uninstalled tree
        return "0+unknown"


def _one_line(text: str) -> str:
    return "; ".join(line.strip() for line in text.splitlines() if line.strip())


def _format_usage_error(error: CycloptsError) -> Text:
    return Text(f"vibey: {_one_line(str(error))} (see `vibey --help`)")


app = App(
    name="vibey",
    help="A durable workflow engine on Dramatiq, RabbitMQ and PostgreSQL.",
    version=_version,
    error_console=Console(stderr=True, soft_wrap=True, highlight=False),
    error_formatter=_format_usage_error,
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
    try:
        result = app(tokens)
    except SettingsError as exc:
        return _fail(exc, ExitCode.USAGE, verbose=verbose)
    except DatabaseUnavailable as exc:
        return _fail(exc, ExitCode.UNAVAILABLE, verbose=verbose)
    except StoreError as exc:
        return _fail(exc, ExitCode.FAILURE, verbose=verbose)
    except Exception as exc:  # noqa: BLE001 - the last stop: a bug still ends in one line
        hint = "" if verbose else " (run with -v for the traceback)"
        return _fail(exc, ExitCode.FAILURE, verbose=verbose, prefix="internal error: ", hint=hint)
    return ExitCode(result) if isinstance(result, int) else ExitCode.OK


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
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


@dataclass(frozen=True, slots=True)
class DoctorReport:
    """What ``vibey doctor --json`` prints: one flat JSON object with exactly these keys.

    URLs have their password replaced by ``***``; ``null`` means not set. ``postgres_error``
    is null when PostgreSQL answered. ``pending_migrations`` lists ``NNNN_name`` strings.
    ``healthy`` is true when PostgreSQL answered and no migration is pending.
    """

    version: str
    config_file: str | None
    database_url: str | None
    pool_min: int
    pool_max: int
    queue_backend: str
    queue_poll_interval_seconds: float
    queue_max_attempts: int
    lease_default_seconds: float
    amqp_url: str | None
    bus_prefix: str
    bus_vhost: str
    postgres_ok: bool
    postgres_error: str | None
    pending_migrations: list[str]
    healthy: bool


@app.command
def doctor(
    *, json_output: Annotated[bool, Parameter(name="--json", negative=())] = False
) -> ExitCode:
    """Show the settings in effect and check PostgreSQL and the migrations.

    Exits 0 when healthy, 1 when PostgreSQL does not answer or a migration is pending.

    Parameters
    ----------
    json_output
        Print one flat JSON object instead of text (keys: see ``vibey.cli.DoctorReport``).
    """
    report = _diagnose(load_settings())
    if json_output:
        print(json.dumps(asdict(report), indent=2))
    else:
        _print_report(report)
    return ExitCode.OK if report.healthy else ExitCode.FAILURE


def _diagnose(settings: Settings) -> DoctorReport:
    url = settings.database.url
    error: str | None = None
    pending: list[str] = []
    try:
        found = migrations.pending(settings.require_database_url())
        pending = [f"{m.version:04d}_{m.name}" for m in found]
    except (SettingsError, DatabaseUnavailable) as exc:
        error = _one_line(str(exc))
    return DoctorReport(
        version=_version(),
        config_file=None if settings.config_file is None else str(settings.config_file),
        database_url=None if url is None else redact(url),
        pool_min=settings.database.pool_min,
        pool_max=settings.database.pool_max,
        queue_backend=settings.queue.backend,
        queue_poll_interval_seconds=settings.queue.poll_interval_seconds,
        queue_max_attempts=settings.queue.max_attempts,
        lease_default_seconds=settings.queue.lease.default.total_seconds(),
        amqp_url=None if settings.bus.amqp_url is None else redact(settings.bus.amqp_url),
        bus_prefix=settings.bus.prefix,
        bus_vhost=settings.bus.vhost,
        postgres_ok=error is None,
        postgres_error=error,
        pending_migrations=pending,
        healthy=error is None and not pending,
    )


def _print_report(report: DoctorReport) -> None:
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
    for label, value in rows:
        print(f"{label + ':':<15} {value}")
    print("healthy" if report.healthy else "not healthy")


def _migrations_line(pending: Sequence[str]) -> str:
    if not pending:
        return "up to date"
    return f"PROBLEM: {len(pending)} pending ({', '.join(pending)}): run `vibey migrate`"


def main(argv: Sequence[str] | None = None) -> int:
    """The console script (``vibey = "vibey.cli:main"``): returns the exit code.

    A bad argument never gets here: cyclopts prints one line and exits 2 (``ExitCode.USAGE``).
    """
    result = app.meta(list(argv) if argv is not None else None, result_action="return_value")
    return int(result) if isinstance(result, int) else ExitCode.OK
