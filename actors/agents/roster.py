"""The engine roster: one :class:`AgentSpec` per ``[engines.<id>]`` table of vibey.toml.

::

    [engines.claude]
    adapter = "claude-code"          # claude-code, codex, gemini, aider, command, scripted
    binary = "claude"                # a path, or a name looked up on the engine's PATH
    args = ["--model", "sonnet"]     # added to every invocation
    weight = 3                       # its share of rotation (0: never picked)
    local = false                    # a local engine runs only while it is switched on
    capabilities = ["edit", "test"]  # what a boundary may require of it
    phases = ["build", "review"]     # the phases it may work in (empty: all)
    timeout_seconds = 3600           # one invocation's wall clock (the group is killed past it)
    env = { ANTHROPIC_API_KEY = "…" }  # the only variables it gets besides a minimal base
    invocation = "subprocess"        # or "service": runs go to `vibey loop-service --engine claude`
    prefetch = 1                     # service: runs at once (1-64; above 1 on a local one warns)
    queue_wait_seconds = 300         # service: no `accepted` by then → the step defers
    supersede_grace_seconds = 30     # service: a superseded run's stop grace before the kill
    abandoned_runs = 5               # service: a job's runs abandoned this often → it fails
    confinement = "auto"             # bwrap, landlock, none (off: loud); auto: the first found
    network_allow = ["api.anthropic.com:443"]  # default: the adapter's API, env's base URLs
    read_allow = ["/srv/reference"]  # more paths it may read (its worktree, runtime: always)
    write_allow = ["/var/cache/npm"] # more paths it may write (its worktree, HOME: always)

    [engines.claude.effort]          # vibey's five levels onto native flags; a level left
    TRIVIAL = ["--max-turns", "5"]   # out takes the nearest lower one that is given
    HIGH = ["--model", "opus", "--max-turns", "60"]

The orchestrator's own environment is never passed to an engine: it gets ``BASE_ENV`` (PATH,
HOME, LANG, TERM, taken from the worker when set) and ``env``.
"""

from __future__ import annotations

import math
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.agents.catalog import ADAPTERS, API_HOSTS, DEFAULT_BINARIES, SERVICE_ADAPTERS
from actors.agents.confine import (
    MODES,
    Confinement,
    ConfinementError,
    check_endpoint,
    config_endpoints,
    env_endpoints,
)
from workflows.effort import LADDERS, Effort

EFFORT_LEVELS: tuple[str, ...] = tuple(level.name for level in Effort)
PHASES: tuple[str, ...] = tuple(phase.value for phase in LADDERS)  # the phases engines work in
BASE_ENV: tuple[str, ...] = ("PATH", "HOME", "LANG", "LC_ALL", "TERM", "TMPDIR")
KEYS: tuple[str, ...] = (
    "adapter",
    "binary",
    "args",
    "weight",
    "local",
    "capabilities",
    "phases",
    "effort",
    "env",
    "timeout_seconds",
    "invocation",
    "prefetch",
    "queue_wait_seconds",
    "supersede_grace_seconds",
    "abandoned_runs",
    "confinement",
    "network_allow",
    "read_allow",
    "write_allow",
)
INVOCATIONS: tuple[str, ...] = ("subprocess", "service")
MAX_PREFETCH = 64


class RosterError(ValueError):
    """An ``[engines.<id>]`` table that cannot be used; the message names the fix."""


@dataclass(frozen=True, slots=True)
class AgentSpec:
    id: str
    adapter: str
    binary: str = ""
    args: tuple[str, ...] = ()
    weight: int = 1
    local: bool = False
    capabilities: frozenset[str] = frozenset()
    phases: frozenset[str] = frozenset()
    effort: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    env: Mapping[str, str] = field(default_factory=dict)
    timeout_seconds: float = 7200.0
    invocation: str = "subprocess"  # "service": a loop service runs it (actors.agents.service)
    prefetch: int = 1
    queue_wait_seconds: float = 300.0
    supersede_grace_seconds: float = 30.0
    abandoned_runs: int = 5  # a job's runs cut `abandoned` this often: the next cut fails it
    confinement: str = "auto"  # auto, bwrap, landlock, none (actors.agents.confine)
    network_allow: tuple[str, ...] | None = None  # None: the adapter's API and env's base URLs
    read_allow: tuple[str, ...] = ()
    write_allow: tuple[str, ...] = ()

    @property
    def network(self) -> tuple[str, ...]:
        """The ``host:port`` its runs may reach: ``network_allow``, else the adapter's model
        API host and the host of each base URL its ``env`` names (a variable, or Codex's
        ``$CODEX_HOME/config.toml``), read when asked: a run reads it as it starts."""
        if self.network_allow is not None:
            return self.network_allow
        named = [*env_endpoints(self.env), *config_endpoints(self.env)]
        return tuple(dict.fromkeys([*API_HOSTS.get(self.adapter, ()), *named]))

    def confined(self, homes: Path | None) -> Confinement:
        """Its runs' confinement, its HOMEs kept under ``homes``."""
        return Confinement(
            self.id, self.confinement, self.network, self.read_allow, self.write_allow, homes
        )

    @property
    def as_service(self) -> bool:
        return self.invocation == "service"

    def effort_args(self, level: str | None) -> tuple[str, ...]:
        """The native flags for ``level``, saturating: the nearest level at or below it that
        the table gives (none given below: the nearest above; none at all: nothing)."""
        if not self.effort or level not in EFFORT_LEVELS:
            return ()
        rank = EFFORT_LEVELS.index(level)
        below = [lv for lv in EFFORT_LEVELS[: rank + 1] if lv in self.effort]
        above = [lv for lv in EFFORT_LEVELS[rank:] if lv in self.effort]
        return self.effort[below[-1] if below else above[0]]

    def allows(self, phase: str) -> bool:
        return not self.phases or phase in self.phases

    def environment(self, worker_env: Mapping[str, str]) -> dict[str, str]:
        """What the engine process gets: the minimal base, then ``env``."""
        base = {name: worker_env[name] for name in BASE_ENV if name in worker_env}
        return {**base, **self.env}


def installed(spec: AgentSpec, worker_env: Mapping[str, str] | None = None) -> bool:
    """Whether ``spec``'s binary is found on the PATH the engine gets (``worker_env``'s, or
    its own ``env``'s; neither: the process's); vibey's own scripted engine always is."""
    if spec.adapter == "scripted":
        return True
    path = spec.environment(worker_env or {}).get("PATH")
    return shutil.which(spec.binary, path=path) is not None


def parse_roster(tables: Any, where: str) -> tuple[AgentSpec, ...]:
    """The ``[engines]`` tables as specs, in id order; :class:`RosterError` on the first
    problem found."""
    if not isinstance(tables, Mapping):
        raise RosterError(f"{where}: engines must be tables, as in [engines.claude]")
    specs = (_spec(str(i), body, f"{where} [engines.{i}]") for i, body in sorted(tables.items()))
    return tuple(specs)


def _spec(id_: str, body: Any, where: str) -> AgentSpec:
    if not isinstance(body, Mapping):
        raise RosterError(f'{where}: must be a table with at least adapter = "…"')
    unknown = sorted(set(body) - set(KEYS))
    if unknown:
        raise RosterError(f"{where}: unknown key {unknown[0]!r}; known keys: {', '.join(KEYS)}")
    adapter = body.get("adapter")
    if adapter not in ADAPTERS:
        raise RosterError(f"{where}: adapter must be one of {', '.join(ADAPTERS)}, got {adapter!r}")
    binary = _text(body.get("binary", DEFAULT_BINARIES.get(adapter, "")), "binary", where)
    if adapter == "command" and not binary:
        raise RosterError(f'{where}: the command adapter needs binary = "path/to/agent"')
    return AgentSpec(
        id=id_,
        adapter=adapter,
        binary=binary,
        args=_words(body.get("args", []), "args", where),
        weight=_weight(body.get("weight", 1), where),
        local=_flag(body.get("local", False), where),
        capabilities=frozenset(_words(body.get("capabilities", []), "capabilities", where)),
        phases=_phases(body.get("phases", []), where),
        effort=_effort(body.get("effort", {}), where),
        env=_env(body.get("env", {}), where),
        timeout_seconds=_timeout(body.get("timeout_seconds", 7200.0), where),
        **_service(adapter, body, where),
        **_confinement(body, where),
    )


def _confinement(body: Mapping[str, Any], where: str) -> dict[str, Any]:
    mode = body.get("confinement", "auto")
    if mode not in MODES:
        raise RosterError(f"{where}: confinement must be one of {', '.join(MODES)}, got {mode!r}")
    network = body.get("network_allow")
    if network is not None:
        try:
            network = tuple(check_endpoint(e) for e in _words(network, "network_allow", where))
        except ConfinementError as exc:
            raise RosterError(f"{where}: {exc}") from None
    paths = {}
    for key in ("read_allow", "write_allow"):
        words = _words(body.get(key, []), key, where)
        relative = [w for w in words if not Path(w).is_absolute()]
        if relative:
            raise RosterError(f"{where}: {key} takes absolute paths, got {relative[0]!r}")
        paths[key] = words
    return {"confinement": mode, "network_allow": network, **paths}


def _service(adapter: str, body: Mapping[str, Any], where: str) -> dict[str, Any]:
    invocation = body.get("invocation", "subprocess")
    if invocation not in INVOCATIONS:
        raise RosterError(f"{where}: invocation must be subprocess or service, got {invocation!r}")
    if invocation == "service" and adapter not in SERVICE_ADAPTERS:
        raise RosterError(
            f"{where}: a loop service hosts the {', '.join(SERVICE_ADAPTERS)} adapters; "
            f'set invocation = "subprocess" for the {adapter} adapter'
        )
    prefetch = body.get("prefetch", 1)
    if isinstance(prefetch, bool) or not isinstance(prefetch, int):
        raise RosterError(f"{where}: prefetch must be a whole number 1-64, got {prefetch!r}")
    if not 1 <= prefetch <= MAX_PREFETCH:
        raise RosterError(f"{where}: prefetch must be 1-{MAX_PREFETCH}, got {prefetch}")
    return {
        "invocation": invocation,
        "prefetch": prefetch,
        "queue_wait_seconds": _timeout(body.get("queue_wait_seconds", 300.0), where),
        "supersede_grace_seconds": _timeout(body.get("supersede_grace_seconds", 30.0), where),
        "abandoned_runs": _abandoned(body.get("abandoned_runs", 5), where),
    }


def _abandoned(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1000:
        raise RosterError(f"{where}: abandoned_runs must be a whole number 1-1000, got {value!r}")
    return value


def _text(value: Any, key: str, where: str) -> str:
    if not isinstance(value, str):
        raise RosterError(f"{where}: {key} must be a string, got {value!r}")
    return value


def _words(value: Any, key: str, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise RosterError(f"{where}: {key} must be a list of strings, got {value!r}")
    return tuple(value)


def _weight(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise RosterError(f"{where}: weight must be a whole number at least 0, got {value!r}")
    return value


def _flag(value: Any, where: str) -> bool:
    if not isinstance(value, bool):
        raise RosterError(f"{where}: local must be true or false, got {value!r}")
    return value


def _phases(value: Any, where: str) -> frozenset[str]:
    phases = tuple(p.lower() for p in _words(value, "phases", where))
    for phase in phases:
        if phase not in PHASES:
            raise RosterError(f"{where}: unknown phase {phase!r}; phases: {', '.join(PHASES)}")
    return frozenset(phases)


def _effort(value: Any, where: str) -> dict[str, tuple[str, ...]]:
    if not isinstance(value, Mapping):
        raise RosterError(f"{where}: effort must be a table of level = [flags]")
    levels: dict[str, tuple[str, ...]] = {}
    for level, flags in value.items():
        if level not in EFFORT_LEVELS:
            raise RosterError(
                f"{where}: unknown effort level {level!r}; levels: {', '.join(EFFORT_LEVELS)}"
            )
        levels[level] = _words(flags, f"effort.{level}", where)
    return levels


def _env(value: Any, where: str) -> dict[str, str]:
    if not isinstance(value, Mapping) or not all(isinstance(v, str) for v in value.values()):
        raise RosterError(f'{where}: env must be a table of NAME = "value" strings')
    return {str(k): v for k, v in value.items()}


def _timeout(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RosterError(f"{where}: timeout_seconds must be a number, got {value!r}")
    if not (math.isfinite(value) and 0 < value <= 365 * 24 * 3600):
        raise RosterError(f"{where}: timeout_seconds must be more than 0 and at most a year")
    return float(value)
