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

from tests.acceptance.stack import forked_commands

__all__ = ["forked_commands"]  # autouse: a workflow's `vibey` commands fork (tests/cli_fork.py)

ROOT = Path(__file__).resolve().parents[2]
INSTALL = ROOT / "ops" / "real-cli" / "install.sh"
CLIS = ("claude", "codex", "gemini", "aider")


# The whole protocol workflows (the ``e2e`` fixture's) take most of the tier, aider's the
# longest (a Python CLI that loads litellm on every turn): they go first, slowest first, so
# that `--dist worksteal` spreads the short tests around them and the tier does not end
# waiting on one started last.
SLOWEST = ("test_aider.py", "test_codex.py", "test_gemini.py", "test_claude.py")


def _rank(item: pytest.Item) -> tuple[int, int]:
    if "e2e" not in getattr(item, "fixturenames", ()):
        return (1, 0)
    name = item.path.name
    return (0, SLOWEST.index(name) if name in SLOWEST else len(SLOWEST))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark this folder's tests ``real_cli``; its whole workflows first (in the places this
    folder's tests held: the others stay put)."""
    here = Path(__file__).parent
    places = [i for i, item in enumerate(items) if Path(str(item.fspath)).is_relative_to(here)]
    for i in places:
        items[i].add_marker(pytest.mark.real_cli)
    ordered = sorted((items[i] for i in places), key=_rank)
    for place, item in zip(places, ordered, strict=True):
        items[place] = item


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
