"""Settings: read once at start from the TOML file and the environment, and passed down.

The settings are declared in :mod:`actors.config` (one field per key: type, default,
variable, help, constraint); this module reads them. Sources, strongest first: ``VIBEY_*``
environment variables, the TOML file, the defaults. The TOML file is ``$VIBEY_CONFIG`` when
set (a missing file is an error), else ``./vibey.toml`` when it exists, else none. An empty
variable counts as unset. This is the only module that reads ``os.environ``; tests pass a
dict to :func:`load_settings` instead. Every key, its variable and default: docs/settings.md.

Lists come from the environment comma-separated (``1,5,30``; an empty item is an error),
``[engine] command`` as shell words. Besides the declared keys the file holds the roster's
``[engines.<id>]`` tables (``actors.agents.roster``) and ``[notify.webhooks.<name>]``
(``actors.webhooks``; ``VIBEY_NOTIFY_WEBHOOK_<NAME>_SECRET`` overrides a secret). Settings
that were removed because nothing read them are errors naming why, in the file and in the
environment alike.

Exceptions::

    SettingsError (ValueError)      a setting is unreadable, mistyped or out of range
    ├── DatabaseNotConfigured       no database URL where one is needed
    └── QueueBackendNotConfigured   the rabbitmq backend without an AMQP URL
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from actors.config import (
    AMQP_FIX,
    DATABASE_FIX,
    ENGINES,
    LANES,
    MAX_LEASE_SECONDS,
    QUEUE_BACKENDS,
    BusSettings,
    ConsoleSettings,
    DatabaseNotConfigured,
    DatabaseSettings,
    EngineSettings,
    MetricsSettings,
    ProjectSettings,
    QueueBackend,
    QueueBackendNotConfigured,
    QueueSettings,
    RabbitMqSettings,
    Settings,
    TracingSettings,
    WorkerSettings,
    WorkflowSettings,
    check_project_ids,
    is_loopback,
    keys,
    sections,
)
from actors.declare import (
    MAX_INTERVAL_SECONDS,
    Section,
    SettingsError,
    Unreadable,
    replace,
    split_list,
    validate,
)

__all__ = [
    "AMQP_FIX",
    "DATABASE_FIX",
    "ENGINES",
    "LANES",
    "MAX_INTERVAL_SECONDS",
    "MAX_LEASE_SECONDS",
    "QUEUE_BACKENDS",
    "BusSettings",
    "ConsoleSettings",
    "DatabaseNotConfigured",
    "DatabaseSettings",
    "EngineSettings",
    "MetricsSettings",
    "ProjectSettings",
    "QueueBackend",
    "QueueBackendNotConfigured",
    "QueueSettings",
    "RabbitMqSettings",
    "Settings",
    "SettingsError",
    "TracingSettings",
    "WorkerSettings",
    "WorkflowSettings",
    "check_project_ids",
    "is_loopback",
    "load_settings",
    "replace",
    "split_list",
]

CONFIG_FILENAME = "vibey.toml"
# Tables read by their own parsers, not declared in actors.config.
_PARSED_APART = ("engines", "notify")

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


def load_settings(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Settings:
    """The settings in effect; raises :class:`SettingsError` on the first problem found."""
    env = {k: v for k, v in (os.environ if environ is None else environ).items() if v != ""}
    path = _config_path(env, Path.cwd() if cwd is None else cwd)
    toml = _read_toml(path) if path is not None else {}
    where = str(path) if path is not None else CONFIG_FILENAME
    _check_sections(toml, where)
    _check_removed(toml, env, where)
    values = _merged(toml, _from_environment(env))
    apart = {name: values.pop(name, {}) for name in _PARSED_APART}
    return validate(Settings, values, where).model_copy(
        update={
            "engines": _roster(apart["engines"], where),
            "webhooks": _webhooks(apart["notify"], env, where),
            "agent_env": _agent_env(env),
            "config_file": path,
        }
    )


def _from_environment(env: Mapping[str, str]) -> dict[str, Any]:
    """The declared variables that are set, read into a nested table as the file's."""
    values: dict[str, Any] = {}
    for key in keys():
        raw = env.get(key.env) if key.env is not None else None
        if raw is None or key.kind is None:
            continue
        try:
            value = key.kind.parse(raw)
        except Unreadable as exc:
            raise SettingsError(f"{key.env} {exc}") from None
        except ValueError:
            wanted = key.kind.env_wanted or key.kind.wanted
            raise SettingsError(f"{key.env} must be {wanted}, got {raw!r}") from None
        path = key.path() if key.env_item is None else (*key.path(), key.env_item)
        table = values
        for part in path[:-1]:
            table = table.setdefault(part, {})
        table[path[-1]] = value
    return values


def _merged(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``over``'s values, table by table (a file's key that should be a table
    and is not stays, for the check to name)."""
    merged = dict(base)
    for name, value in over.items():
        below = merged.get(name)
        if isinstance(value, dict) and isinstance(below, dict):
            merged[name] = _merged(below, value)
        elif not isinstance(value, dict) or below is None:
            merged[name] = value
    return merged


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


def _check_sections(toml: Mapping[str, Any], where: str) -> None:
    known = [*(s.table for s in _top_sections()), *_PARSED_APART]
    for section in toml:
        if section not in known:
            raise SettingsError(
                f"{where}: unknown section [{section}]; known sections: {', '.join(known)}"
            )


def _top_sections() -> list[type[Section]]:
    return [s for s in sections() if "." not in s.table]


def _check_removed(toml: Mapping[str, Any], env: Mapping[str, str], where: str) -> None:
    for (section, key), (variable, why) in _REMOVED.items():
        table: Any = toml
        for part in section.split("."):
            table = table.get(part, {}) if isinstance(table, dict) else {}
        if isinstance(table, dict) and key in table:
            raise SettingsError(f"{where}: {key} under [{section}] was removed ({why}): delete it")
        if variable in env:
            raise SettingsError(
                f"{variable} ({key} under [{section}]) was removed ({why}): unset it"
            )


def _agent_env(env: Mapping[str, str]) -> dict[str, str]:
    """The base environment every engine gets (``actors.agents.roster.BASE_ENV``)."""
    from actors.agents.roster import BASE_ENV

    return {name: env[name] for name in BASE_ENV if name in env}


def _roster(tables: Any, where: str) -> tuple[Any, ...]:
    if tables == {}:
        return ()
    from actors.agents.roster import RosterError, parse_roster

    try:
        return parse_roster(tables, where)
    except RosterError as exc:
        raise SettingsError(str(exc)) from None


def _webhooks(notify: Any, env: Mapping[str, str], where: str) -> tuple[Any, ...]:
    """``[notify.webhooks.<name>]``; ``VIBEY_NOTIFY_WEBHOOK_<NAME>_SECRET`` overrides a secret
    (so it need not live in the file)."""
    if notify == {}:
        return ()
    from actors.webhook_spec import WebhookConfigError, parse_webhooks

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
