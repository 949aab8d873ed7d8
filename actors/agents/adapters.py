"""The adapters by name, as ``[engines.<id>] adapter`` names them, and the engine a roster
member runs on."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path

from actors.agents.aider import AiderAdapter
from actors.agents.base import Engine, EngineTask, EngineVerdict
from actors.agents.claude_code import ClaudeCodeAdapter
from actors.agents.cli import CliAdapter, Context, Launch, fault
from actors.agents.codex import CodexAdapter
from actors.agents.command import CommandEngine
from actors.agents.gemini import GeminiAdapter
from actors.agents.roster import AgentSpec
from actors.agents.run_client import RunClient, ServiceLaunch
from actors.agents.scripted import ScriptedEngine

CLI_ADAPTERS: Mapping[str, type[CliAdapter]] = {
    cls.adapter: cls for cls in (ClaudeCodeAdapter, CodexAdapter, GeminiAdapter, AiderAdapter)
}
"""The CLI adapters by name; each has its entry in :data:`actors.agents.catalog.CATALOG`."""


def engine_for(
    spec: AgentSpec,
    *,
    worker_env: Mapping[str, str],
    state_dir: Path,
    context: Context | None = None,
    runs: RunClient | None = None,
) -> Engine:
    """The engine that runs ``spec``'s steps: its CLI adapter, the command engine (its
    ``binary`` and ``args`` as the command, its own environment), or the scripted engine.
    With ``invocation = "service"`` the CLI adapter's runs go to the engine's loop service
    through ``runs`` (no broker: every run is an engine fault that says so)."""
    if spec.adapter == "scripted":
        return ScriptedEngine()
    if spec.adapter == "command":
        return CommandEngine(
            (spec.binary, *spec.args),
            timedelta(seconds=spec.timeout_seconds),
            scratch_root=state_dir,
            env=spec.environment(worker_env),
            confinement=spec.confined(state_dir / "homes"),
        )
    adapter = CLI_ADAPTERS[spec.adapter]
    launch = None
    if spec.as_service:
        launch = ServiceLaunch(spec, runs) if runs is not None else _no_broker(spec)
    transcripts = state_dir / "transcripts"
    return adapter(
        spec, worker_env=worker_env, transcripts=transcripts, context=context, launch=launch
    )


def _no_broker(spec: AgentSpec) -> Launch:
    def launch(task: EngineTask, args: Sequence[str], workdir: Path) -> EngineVerdict:
        return fault(
            f'engine {spec.id} has invocation = "service" but this worker has no broker: '
            'set VIBEY_AMQP_URL, or invocation = "subprocess"'
        )

    return launch
