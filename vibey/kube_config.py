"""The shape of a Kubernetes fleet (``fleet.toml`` in an overlay), read and checked.

``fleet.toml`` says what runs where: the Secret holding the URLs, the worktrees
volume, the worker pools (which lanes and projects each consumes, processes × threads, the
replica range KEDA may use) and the replicas and resources of the loop services (one per
engine the settings run with ``invocation = "service"``). The overlay's ``vibey.toml``
(named by ``settings``) is the fleet's own settings: it is loaded with
:func:`vibey.settings.load_settings`, so the same checks apply as at a worker's start, and the
two files must agree. What cannot work is a :class:`FleetError` naming the fix:

* a pool bound to a project that is not in ``dedicated_projects`` (its queue never gets a
  message, and its trigger would watch nothing);
* a lane, or a dedicated project's lane, that no pool consumes (its jobs would never run, and
  nothing scales for them);
* a ``[[fleet.engines]]`` entry for an engine the settings do not run as a loop service;
* unknown keys, names Kubernetes refuses, an empty replica range.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.topology import check_token
from vibey.settings import LANES, Settings, SettingsError, load_settings

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|Ki|Mi|Gi|Ti|k|M|G|T)?$")
ACCESS_MODES = ("ReadWriteMany", "ReadWriteOnce")


class FleetError(ValueError):
    """A fleet that cannot work; the message says what to change (one line)."""


@dataclass(frozen=True, slots=True)
class Resources:
    cpu: str = "500m"
    memory: str = "1Gi"
    cpu_limit: str | None = None
    memory_limit: str | None = "2Gi"


@dataclass(frozen=True, slots=True)
class Pool:
    """One worker Deployment: ``vibey worker`` on ``lanes`` (of ``projects``' dedicated
    queues, or the shared ones when empty), ``processes`` × ``threads`` steps at once."""

    name: str
    lanes: tuple[str, ...]
    projects: tuple[str, ...] = ()
    processes: int = 1
    threads: int = 4
    min_replicas: int = 0
    max_replicas: int = 10
    resources: Resources = field(default_factory=Resources)

    @property
    def parallelism(self) -> int:
        return self.processes * self.threads

    def prefetch(self, settings: Settings) -> int:
        """Each process's prefetch: the settings' (default: the threads), never above the
        threads, so a busy pod holds no pointer it cannot run (KEDA counts held pointers)."""
        return min(settings.queue.rabbitmq.prefetch or self.threads, self.threads)


@dataclass(frozen=True, slots=True)
class Engine:
    """One loop service: ``vibey loop-service --engine <id>`` for an engine the settings run
    with ``invocation = "service"``, a Deployment scaled by ``<prefix>.runs.<id>``'s length.
    ``prefetch`` and ``run_seconds`` (its ``timeout_seconds``) come from the settings'
    ``[engines.<id>]``; a ``[[fleet.engines]]`` entry sets the replicas and resources."""

    id: str
    prefetch: int = 1
    run_seconds: int = 7200
    min_replicas: int = 0
    max_replicas: int = 2
    resources: Resources = field(default_factory=Resources)


@dataclass(frozen=True, slots=True)
class Console:
    """``vibey console`` in the cluster (``[fleet.console]``): a Deployment and a ClusterIP
    Service the operator's ingress routes to; its password and token hashes come from the
    Secret ``secret`` (keys ``password-hash``, ``token-hash``: ``vibey console hash``)."""

    secret: str = "vibey-console"
    replicas: int = 1
    port: int = 8377
    read_only: bool = False
    resources: Resources = field(
        default_factory=lambda: Resources(cpu="100m", memory="256Mi", memory_limit="512Mi")
    )


@dataclass(frozen=True, slots=True)
class Worktrees:
    size: str = "50Gi"
    access_mode: str = "ReadWriteMany"
    storage_class: str | None = None


@dataclass(frozen=True, slots=True)
class Fleet:
    name: str
    settings: Settings
    settings_file: str
    secret: str = "vibey-urls"
    keda: bool = True
    metrics_port: int = 9108
    grace_margin_seconds: int = 120
    pools: tuple[Pool, ...] = ()
    engines: tuple[Engine, ...] = ()
    worktrees: Worktrees = field(default_factory=Worktrees)
    console: Console | None = None
    notify_secret: str = "vibey-notify"  # keys <webhook>-secret, for `vibey notify`

    @property
    def backend(self) -> str:
        return self.settings.queue.backend

    @property
    def drain_grace_seconds(self) -> int:
        """A worker's drain grace (``vibey.wiring.drain_grace``, the function ``vibey worker``
        reads too): the pods' ``terminationGracePeriodSeconds`` is this plus the margin."""
        from vibey.wiring import drain_grace

        return int(drain_grace(self.settings).total_seconds() + 0.999)


def load_fleet(path: Path) -> Fleet:
    """``fleet.toml`` and the settings it names, checked together."""
    try:
        table = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise FleetError(f"{path}: {exc}") from exc
    where = str(path)
    top = _only(table, {"fleet"}, where)
    body = _only(top.get("fleet", {}), _FLEET_KEYS, f"{where} [fleet]")
    settings_file = str(body.get("settings", "vibey.toml"))
    env = {"VIBEY_CONFIG": settings_file, **_webhook_secrets(path.parent / settings_file)}
    try:
        settings = load_settings(env, cwd=path.parent)
    except SettingsError as exc:
        raise FleetError(f"{path.parent / settings_file}: {exc}") from exc
    fleet = Fleet(
        name=_label(str(body.get("name", "vibey")), "name", where),
        settings=settings,
        settings_file=settings_file,
        secret=_label(str(body.get("secret", "vibey-urls")), "secret", where),
        keda=bool(body.get("keda", True)),
        metrics_port=int(body.get("metrics_port", 9108)),
        grace_margin_seconds=int(body.get("grace_margin_seconds", 120)),
        pools=tuple(_pool(p, f"{where} [[fleet.pools]]") for p in body.get("pools", [])),
        engines=_engines(settings, body.get("engines", []), f"{where} [[fleet.engines]]"),
        worktrees=_worktrees(body.get("worktrees", {}), f"{where} [fleet.worktrees]"),
        console=_console(body.get("console"), f"{where} [fleet.console]"),
        notify_secret=_label(
            str(body.get("notify_secret", "vibey-notify")), "notify_secret", where
        ),
    )
    check_fleet(fleet, where)
    return fleet


_FLEET_KEYS = {
    "name",
    "settings",
    "secret",
    "keda",
    "metrics_port",
    "grace_margin_seconds",
    "pools",
    "engines",
    "worktrees",
    "console",
    "notify_secret",
}


def webhook_secret_variable(name: str) -> str:
    """The variable a webhook's secret is read from (``vibey.settings``' rule)."""
    return "VIBEY_NOTIFY_WEBHOOK_" + re.sub(r"[^A-Z0-9]", "_", name.upper()) + "_SECRET"


def _webhook_secrets(settings_path: Path) -> dict[str, str]:
    """A stand-in secret per webhook of the settings, so they load at render time: in the
    cluster each comes from the Secret ``notify_secret`` (never from the ConfigMap)."""
    try:
        table = tomllib.loads(settings_path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return {}  # load_settings reports it
    hooks = table.get("notify", {}).get("webhooks", {}) if isinstance(table, dict) else {}
    names = hooks if isinstance(hooks, dict) else {}
    return {webhook_secret_variable(str(name)): "set-from-the-secret" for name in names}


def check_fleet(fleet: Fleet, where: str) -> None:
    """The cross-checks between the pools, the engines and the settings."""
    if not fleet.pools:
        raise FleetError(f"{where}: no [[fleet.pools]]: add one per lane (or one for all)")
    _unique([p.name for p in fleet.pools], "pool name", where)
    dedicated = set(fleet.settings.queue.rabbitmq.dedicated_projects)
    rabbitmq = fleet.backend == "rabbitmq"
    for pool in fleet.pools:
        for project in pool.projects:
            if rabbitmq and project not in dedicated:
                raise FleetError(
                    f"{where}: pool {pool.name!r} serves the dedicated queues of project "
                    f"{project!r}, but {project!r} is not in dedicated_projects under "
                    f"[queue.rabbitmq] of {fleet.settings_file}, so no job is routed there: "
                    "add it there, or remove it from the pool's projects"
                )
    served = {(lane, project) for p in fleet.pools for lane in p.lanes for project in p.projects}
    shared = {lane for p in fleet.pools if not p.projects for lane in p.lanes}
    for lane in LANES:
        if lane not in shared:
            raise FleetError(
                f"{where}: no pool consumes the shared {lane!r} lane, so its jobs never run "
                f"and no trigger scales for them: add {lane!r} to the lanes of a pool "
                "without projects"
            )
        for project in sorted(dedicated) if rabbitmq else ():
            if (lane, project) not in served:
                raise FleetError(
                    f"{where}: project {project!r} is dedicated (dedicated_projects in "
                    f"{fleet.settings_file}) but no pool consumes its {lane!r} lane, so its "
                    f"{lane} jobs never run and no trigger scales for them: add a pool with "
                    f'lanes = ["{lane}"] and projects = ["{project}"]'
                )


def _pool(raw: Any, where: str) -> Pool:
    body = _only(raw, {*Pool.__dataclass_fields__, *Resources.__dataclass_fields__}, where)
    name = _label(_required(body, "name", where), "pool name", where)
    where = f"{where} {name!r}"
    lanes = tuple(body.get("lanes", LANES))
    for lane in lanes:
        if lane not in LANES:
            raise FleetError(f"{where}: unknown lane {lane!r}; the lanes are {', '.join(LANES)}")
    if not lanes:
        raise FleetError(f"{where}: lanes is empty: name at least one of {', '.join(LANES)}")
    projects = tuple(str(p) for p in body.get("projects", ()))
    for project in projects:
        try:
            check_token(project, "project id")
        except ValueError as exc:
            raise FleetError(f"{where}: {exc}") from exc
    pool = Pool(
        name=name,
        lanes=lanes,
        projects=projects,
        processes=_positive(body, "processes", 1, where),
        threads=_positive(body, "threads", 4, where),
        min_replicas=int(body.get("min_replicas", 0)),
        max_replicas=_positive(body, "max_replicas", 10, where),
        resources=_resources(body, where),
    )
    if not 0 <= pool.min_replicas <= pool.max_replicas:
        raise FleetError(
            f"{where}: min_replicas {pool.min_replicas} must be between 0 and max_replicas "
            f"{pool.max_replicas}"
        )
    return pool


def _engines(settings: Settings, raw: Any, where: str) -> tuple[Engine, ...]:
    """One loop service per service engine of the settings, each shaped by its entry."""
    if not isinstance(raw, list):
        raise FleetError(f"{where}: expected an array of tables")
    entries = [_engine_entry(e, where) for e in raw]
    _unique([str(e["id"]) for e in entries], "engine id", where)
    services = {spec.id: spec for spec in settings.engines if spec.as_service}
    for entry in entries:
        if entry["id"] not in services:
            raise FleetError(
                f"{where}: engine {entry['id']!r} has no loop service: it needs an "
                f'[engines.{entry["id"]}] table with invocation = "service" in the settings, '
                "or remove its [[fleet.engines]] entry"
            )
    given = {str(e["id"]): e for e in entries}
    return tuple(
        _engine(spec.id, spec.prefetch, spec.timeout_seconds, given.get(spec.id, {}), where)
        for spec in services.values()
    )


def _engine_entry(raw: Any, where: str) -> dict[str, Any]:
    if isinstance(raw, dict):
        for key in ("prefetch", "enabled"):
            if key in raw:
                raise FleetError(
                    f"{where}: {key} is not a fleet key: an engine's loop service runs when "
                    'its [engines.<id>] table in the settings has invocation = "service", '
                    "with that table's prefetch"
                )
    keys = {"id", "min_replicas", "max_replicas", *Resources.__dataclass_fields__}
    body = _only(raw, keys, where)
    engine_id = _required(body, "id", where)
    _label(engine_id, "engine id", where)
    return body


def _engine(
    engine_id: str, prefetch: int, run_seconds: float, body: dict[str, Any], where: str
) -> Engine:
    where = f"{where} {engine_id!r}"
    _label(engine_id, "engine id", where)
    engine = Engine(
        id=engine_id,
        prefetch=prefetch,
        run_seconds=int(run_seconds + 0.999),
        min_replicas=int(body.get("min_replicas", 0)),
        max_replicas=_positive(body, "max_replicas", 2, where),
        resources=_resources(body, where),
    )
    if not 0 <= engine.min_replicas <= engine.max_replicas:
        raise FleetError(
            f"{where}: min_replicas {engine.min_replicas} must be between 0 and max_replicas "
            f"{engine.max_replicas}"
        )
    return engine


def _resources(body: dict[str, Any], where: str) -> Resources:
    given = {k: str(body[k]) for k in Resources.__dataclass_fields__ if k in body}
    for key, value in given.items():
        if not _QUANTITY.match(value):
            raise FleetError(f"{where}: {key} {value!r} is not a Kubernetes quantity")
    return Resources(**given)


def _worktrees(raw: Any, where: str) -> Worktrees:
    body = _only(raw, set(Worktrees.__dataclass_fields__), where)
    access = str(body.get("access_mode", "ReadWriteMany"))
    if access not in ACCESS_MODES:
        raise FleetError(f"{where}: access_mode {access!r} is not one of {', '.join(ACCESS_MODES)}")
    storage_class = body.get("storage_class")
    return Worktrees(
        size=str(body.get("size", "50Gi")),
        access_mode=access,
        storage_class=None if storage_class is None else str(storage_class),
    )


def _console(raw: Any, where: str) -> Console | None:
    if raw is None:
        return None
    keys = {"secret", "replicas", "port", "read_only", *Resources.__dataclass_fields__}
    body = _only(raw, keys, where)
    default = Console()
    given = {k: str(body[k]) for k in Resources.__dataclass_fields__ if k in body}
    resources = _resources(body, where) if given else default.resources
    port = _positive(body, "port", default.port, where)
    if port > 65535:
        raise FleetError(f"{where}: port must be at most 65535, got {port}")
    return Console(
        secret=_label(str(body.get("secret", default.secret)), "secret", where),
        replicas=_positive(body, "replicas", default.replicas, where),
        port=port,
        read_only=bool(body.get("read_only", False)),
        resources=resources,
    )


def _only(raw: Any, keys: set[str], where: str) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise FleetError(f"{where}: expected a table")
    unknown = sorted(set(raw) - keys)
    if unknown:
        raise FleetError(
            f"{where}: unknown key {unknown[0]!r}; the keys are {', '.join(sorted(keys))}"
        )
    return raw


def _required(body: dict[str, Any], key: str, where: str) -> str:
    value = body.get(key)
    if not isinstance(value, str) or not value:
        raise FleetError(f"{where}: {key} is missing (a non-empty string)")
    return value


def _positive(body: dict[str, Any], key: str, default: int, where: str) -> int:
    value = body.get(key, default)
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise FleetError(f"{where}: {key} must be a whole number of at least 1, got {value!r}")
    return value


def _label(value: str, what: str, where: str) -> str:
    if len(value) > 40 or not _DNS_LABEL.match(value):
        raise FleetError(
            f"{where}: {what} {value!r} must be a DNS label of at most 40 characters "
            "(lower-case letters, digits, '-')"
        )
    return value


def _unique(values: list[str], what: str, where: str) -> None:
    seen: set[str] = set()
    for value in values:
        if value in seen:
            raise FleetError(f"{where}: {what} {value!r} is used twice")
        seen.add(value)
