"""The Gemini CLI's home for one engine: the settings vibey writes so that a headless run
starts, never in the step's worktree.

Gemini CLI 0.61 reads its user settings from ``$GEMINI_CLI_HOME/.gemini/settings.json``
(``GEMINI_CLI_HOME`` defaults to the user's home). Two of them matter to a headless run:

* ``security.auth.selectedType``: without it the CLI takes the auth type from the
  environment, and ``GOOGLE_GEMINI_BASE_URL`` alone makes that the ``gateway`` type, which
  0.61's headless check refuses: exit 41, "Invalid auth method selected.". An API key
  (``GEMINI_API_KEY``) selects ``gemini-api-key`` (which still honours the base URL);
  ``GOOGLE_GENAI_USE_VERTEXAI=true`` selects ``vertex-ai``;
* ``general.maxAttempts``: how often the CLI itself retries a chat request (its default is
  10, backing off from 5 s to 30 s: about three minutes for a rate limit). vibey judges
  capacity itself (the engine's circuit, the window's reset), so it asks for
  :data:`MAX_ATTEMPTS`.

:func:`engine_environment` writes that file under ``<state>/gemini/<engine>`` (only when it
changes, by a rename, so parallel runs never read half a file) and gives the engine's
environment with ``GEMINI_CLI_HOME`` pointing there. An engine whose own ``env`` sets
``GEMINI_CLI_HOME`` keeps that home untouched: its user manages the settings there (the auth
type, ``general.maxAttempts``, a model, a Google login, which lives there too).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

HOME_VARIABLE = "GEMINI_CLI_HOME"
MAX_ATTEMPTS = 3
log = logging.getLogger(__name__)


def auth_type(env: Mapping[str, str]) -> str | None:
    """The auth type the engine's environment means (None: the CLI decides, and says what
    is missing)."""
    if env.get("GOOGLE_GENAI_USE_VERTEXAI", "").lower() == "true":
        return "vertex-ai"
    if env.get("GEMINI_API_KEY"):
        return "gemini-api-key"
    return None


def settings(env: Mapping[str, str]) -> dict[str, Any]:
    """The user settings vibey writes for an engine with environment ``env``."""
    written: dict[str, Any] = {"general": {"maxAttempts": MAX_ATTEMPTS}}
    selected = auth_type(env)
    if selected is not None:
        written["security"] = {"auth": {"selectedType": selected}}
    return written


def engine_environment(env: Mapping[str, str], state_dir: Path, engine: str) -> dict[str, str]:
    """``env`` with ``GEMINI_CLI_HOME`` set to the engine's own home, its settings written
    (``env`` unchanged when it names a home of its own)."""
    if env.get(HOME_VARIABLE):
        return dict(env)
    home = state_dir / "gemini" / engine
    try:
        write_settings(home, settings(env))
    except OSError as error:  # the run then says what the CLI misses (exit 41, named)
        log.warning("engine %s: cannot write its Gemini settings in %s: %s", engine, home, error)
    return {**env, HOME_VARIABLE: str(home)}


def write_settings(home: Path, values: Mapping[str, Any]) -> Path:
    """``<home>/.gemini/settings.json`` holding ``values`` (rewritten only when different)."""
    path = home / ".gemini" / "settings.json"
    text = json.dumps(values, indent=2, sort_keys=True) + "\n"
    try:
        if path.read_text(encoding="utf-8") == text:
            return path
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f".settings.{os.getpid()}.{threading.get_ident()}.tmp")
    staging.write_text(text, encoding="utf-8")
    staging.replace(path)
    return path
