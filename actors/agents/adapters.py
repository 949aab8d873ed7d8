"""The adapters by name, as ``[engines.<id>] adapter`` names them, and the engine a roster
member runs on."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from pathlib import Path

from actors.agents.aider import AiderAdapter
from actors.agents.base import Engine
from actors.agents.claude_code import ClaudeCodeAdapter
from actors.agents.cli import CliAdapter, Context
from actors.agents.codex import CodexAdapter
from actors.agents.command import CommandEngine
from actors.agents.gemini import GeminiAdapter
from actors.agents.roster import AgentSpec
from actors.agents.scripted import ScriptedEngine

CLI_ADAPTERS: Mapping[str, type[CliAdapter]] = {
    "claude-code": ClaudeCodeAdapter,
    "codex": CodexAdapter,
    "gemini": GeminiAdapter,
    "aider": AiderAdapter,
}


def engine_for(
    spec: AgentSpec,
    *,
    worker_env: Mapping[str, str],
    state_dir: Path,
    context: Context | None = None,
) -> Engine:
    """The engine that runs ``spec``'s steps: its CLI adapter, the command engine (its
    ``binary`` and ``args`` as the command, its own environment), or the scripted engine."""
    if spec.adapter == "scripted":
        return ScriptedEngine()
    if spec.adapter == "command":
        return CommandEngine(
            (spec.binary, *spec.args),
            timedelta(seconds=spec.timeout_seconds),
            scratch_root=state_dir,
            env=spec.environment(worker_env),
        )
    adapter = CLI_ADAPTERS[spec.adapter]
    return adapter(
        spec, worker_env=worker_env, transcripts=state_dir / "transcripts", context=context
    )
