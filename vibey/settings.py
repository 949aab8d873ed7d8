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
    poll_interval_seconds = 5.0      # VIBEY_QUEUE_POLL_INTERVAL
    max_attempts = 5                 # VIBEY_QUEUE_MAX_ATTEMPTS

    [queue.lease_seconds]            # per job kind (or alias), plus "default"
    default = 120                    # VIBEY_QUEUE_LEASE_SECONDS_DEFAULT
    "build.implement" = 7200

    [bus]
    amqp_url = "amqp://guest:guest@127.0.0.1:5672/"   # VIBEY_AMQP_URL
    prefix = "vibey"                                  # VIBEY_BUS_PREFIX
    vhost = "/"                                       # VIBEY_BUS_VHOST

Exceptions::

    SettingsError (ValueError)      a setting is unreadable, mistyped or out of range
    ├── DatabaseNotConfigured       no database URL where one is needed
    └── QueueBackendNotConfigured   the rabbitmq backend without an AMQP URL
"""

from __future__ import annotations

import math
import os
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal, cast, get_args

from workflows.job import REGISTERED_KINDS, LeasePolicy, UnknownJobKindError

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
        "max_attempts": "VIBEY_QUEUE_MAX_ATTEMPTS",
        "lease_seconds": None,
    },
    "bus": {"amqp_url": "VIBEY_AMQP_URL", "prefix": "VIBEY_BUS_PREFIX", "vhost": "VIBEY_BUS_VHOST"},
}
LEASE_DEFAULT_ENV = "VIBEY_QUEUE_LEASE_SECONDS_DEFAULT"
# job.lease_ms is a PostgreSQL integer: a lease is at most 2^31-1 ms (about 24.8 days).
MAX_LEASE_SECONDS = (2**31 - 1) // 1000


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


@dataclass(frozen=True, slots=True)
class QueueSettings:
    backend: QueueBackend = "rabbitmq"
    poll_interval_seconds: float = 5.0
    max_attempts: int = 5
    lease: LeasePolicy = field(default_factory=LeasePolicy)

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
        if self.max_attempts < 1:
            raise SettingsError(
                f"max_attempts must be at least 1, got {self.max_attempts}: "
                "fix VIBEY_QUEUE_MAX_ATTEMPTS (or max_attempts under [queue])"
            )


@dataclass(frozen=True, slots=True)
class BusSettings:
    amqp_url: str | None = None
    prefix: str = "vibey"
    vhost: str = "/"

    def __post_init__(self) -> None:
        if self.amqp_url is not None and not self.amqp_url.startswith(_AMQP_SCHEMES):
            raise SettingsError(
                f"the AMQP URL must start with amqp:// or amqps://, got {_scheme(self.amqp_url)}: "
                "fix VIBEY_AMQP_URL (or amqp_url under [bus])"
            )
        if not self.prefix:
            raise SettingsError("the bus prefix must not be empty: fix prefix under [bus]")


@dataclass(frozen=True, slots=True)
class Settings:
    database: DatabaseSettings = field(default_factory=DatabaseSettings)
    queue: QueueSettings = field(default_factory=QueueSettings)
    bus: BusSettings = field(default_factory=BusSettings)
    config_file: Path | None = None

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
    src = {name: _Source(name, table.get(name, {}), env, f"{where} [{name}]") for name in _KEYS}
    return Settings(
        database=_database(src["database"]),
        queue=_queue(src["queue"]),
        bus=_bus(src["bus"]),
        config_file=path,
    )


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
        if section not in _KEYS:
            raise SettingsError(
                f"{where}: unknown section [{section}]; known sections: {', '.join(_KEYS)}"
            )
        if not isinstance(body, dict):
            raise SettingsError(f"{where}: {section} must be a [{section}] table")
        for key in body:
            if key not in _KEYS[section]:
                raise SettingsError(
                    f"{where}: unknown key {key!r} in [{section}]; "
                    f"known keys: {', '.join(_KEYS[section])}"
                )


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

    def seconds(self, key: str) -> float | None:
        variable, value = self._lookup(key)
        if variable is not None:
            return _env_seconds(variable, value)
        if value is not None and not _is_number(value):
            raise self._wrong_type(key, value, "a number of seconds")
        return None if value is None else float(value)

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


def _queue(src: _Source) -> QueueSettings:
    return QueueSettings(
        **_given(
            backend=src.text("backend"),
            poll_interval_seconds=src.seconds("poll_interval_seconds"),
            max_attempts=src.integer("max_attempts"),
            lease=_lease(src),
        )
    )


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
    try:
        return LeasePolicy().with_overrides(
            {kind: timedelta(seconds=value) for kind, value in seconds.items()}
        )
    except UnknownJobKindError as exc:
        raise SettingsError(
            f"{src.where}: lease_seconds names unknown job kind {exc.kind!r}: use default or "
            f"one of {', '.join(sorted(REGISTERED_KINDS))}"
        ) from exc


def _bus(src: _Source) -> BusSettings:
    return BusSettings(
        **_given(amqp_url=src.text("amqp_url"), prefix=src.text("prefix"), vhost=src.text("vhost"))
    )


def _scheme(url: str) -> str:
    """Only the scheme: the rest of a URL may hold a password."""
    scheme, sep, _ = url.partition("://")
    return f"'{scheme}://…'" if sep else "a URL without a scheme"
