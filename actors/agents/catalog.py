"""The adapters vibey ships, one entry each: what the roster, the confinement and the loop
service know of an adapter by its ``[engines.<id>] adapter`` name.

A CLI adapter's class (:data:`actors.agents.adapters.CLI_ADAPTERS`) says how to run its CLI and
read its output; its entry here says the rest:

* ``binary``: the ``binary`` an ``[engines.<id>]`` table gets when it names none (``""``: the
  adapter runs no CLI of its own: ``command`` runs the table's ``binary``, ``scripted`` none);
* ``api_hosts``: what a confined run may reach by default (``network_allow`` replaces it);
* ``run_verb``: a run's ``args[0]``, which a loop service checks before it runs a request; an
  adapter with one may run as a service (``invocation = "service"``).

Adding an adapter: its module (a :class:`~actors.agents.cli.CliAdapter`), its class in
``CLI_ADAPTERS``, its entry here, and its section of docs/engines.md.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Adapter:
    name: str
    binary: str = ""
    api_hosts: tuple[str, ...] = ()
    run_verb: str | None = None


CATALOG: tuple[Adapter, ...] = (
    Adapter("claude-code", "claude", ("api.anthropic.com:443",), "-p"),
    Adapter("codex", "codex", ("api.openai.com:443", "chatgpt.com:443"), "exec"),
    Adapter("gemini", "gemini", ("generativelanguage.googleapis.com:443",), "-p"),
    Adapter("aider", "aider", ("api.openai.com:443", "api.anthropic.com:443"), "--message"),
    Adapter("command"),
    Adapter("scripted"),
)

ADAPTERS: tuple[str, ...] = tuple(a.name for a in CATALOG)
DEFAULT_BINARIES: Mapping[str, str] = {a.name: a.binary for a in CATALOG if a.binary}
API_HOSTS: Mapping[str, tuple[str, ...]] = {a.name: a.api_hosts for a in CATALOG if a.api_hosts}
RUN_VERBS: Mapping[str, str] = {a.name: a.run_verb for a in CATALOG if a.run_verb is not None}
SERVICE_ADAPTERS: tuple[str, ...] = tuple(RUN_VERBS)
