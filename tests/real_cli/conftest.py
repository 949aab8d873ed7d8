"""The real-binary tier: the four coding CLIs as they ship, at the versions pinned in
``ops/real-cli`` (npm into a project-local prefix, aider in a venv of its own), each pointed at
a scripted local model server that speaks its provider's wire protocol.

The CLIs are installed by ``ops/real-cli/install.sh`` (``just real-cli-install``; ``.ci/run``
runs it). A missing install fails every test of the tier with the line that fixes it: nothing
here is skipped.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "ops" / "real-cli" / "install.sh"
CLIS = ("claude", "codex", "gemini", "aider")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if Path(str(item.fspath)).is_relative_to(Path(__file__).parent):
            item.add_marker(pytest.mark.real_cli)


@pytest.fixture(scope="session")
def real_cli_bin() -> Path:
    """The folder holding the pinned ``claude``, ``codex``, ``gemini`` and ``aider``."""
    prefix = Path(os.environ.get("VIBEY_REAL_CLI_PREFIX", ROOT / ".vibey" / "real-cli"))
    folder = prefix / "bin"
    missing = [cli for cli in CLIS if not (folder / cli).exists()]
    if missing:
        pytest.fail(
            f"the real CLIs are not installed ({', '.join(missing)} missing in {folder}): "
            "run `just real-cli-install` (ops/real-cli/install.sh)",
            pytrace=False,
        )
    return folder


def cli_version(folder: Path, cli: str) -> str:
    """What ``<cli> --version`` prints, first line."""
    done = subprocess.run(
        [str(folder / cli), "--version"], capture_output=True, text=True, timeout=60, check=False
    )
    return (done.stdout or done.stderr).strip().splitlines()[0]
