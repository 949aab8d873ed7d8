"""A project's own test command, run in the integrated tree by build.verify.

:func:`test_command` is the configured one (``project.json`` beside the project's
repository, written by ``vibey workflow start --test-command``), else the one a common layout
implies (:data:`DETECTED`, first match wins), else none. :func:`run_tests` runs it under the
supervising wrapper, holding the tree's lease, within a timeout.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from actors.agents.lease import Held
from actors.agents.process import run_supervised

TAIL_CHARS = 3000
FACTS = "project.json"


def _make_has_test(tree: Path) -> bool:
    makefile = tree / "Makefile"
    return (
        makefile.is_file()
        and re.search(r"^test:", makefile.read_text(errors="replace"), re.M) is not None
    )


def _package_has_test(tree: Path) -> bool:
    try:
        scripts = json.loads((tree / "package.json").read_text()).get("scripts", {})
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(scripts, dict) and "test" in scripts


DETECTED: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("justfile", ("just", "test")),
    ("Makefile", ("make", "test")),
    ("package.json", ("npm", "test")),
    ("Cargo.toml", ("cargo", "test")),
    ("go.mod", ("go", "test", "./...")),
    ("pyproject.toml", ("python3", "-m", "pytest", "-q")),
    ("pytest.ini", ("python3", "-m", "pytest", "-q")),
    ("setup.py", ("python3", "-m", "pytest", "-q")),
)


@dataclass(frozen=True, slots=True)
class TestsRun:
    command: tuple[str, ...]
    exit_code: int
    output_tail: str
    timed_out: bool = False

    @property
    def passed(self) -> bool:
        return self.exit_code == 0 and not self.timed_out

    def evidence(self) -> dict[str, object]:
        return {
            "command": list(self.command),
            "exit_code": self.exit_code,
            "passed": self.passed,
            "output_tail": self.output_tail,
        }


def project_facts(project_dir: Path) -> Mapping[str, object]:
    try:
        facts = json.loads((project_dir / FACTS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return facts if isinstance(facts, dict) else {}


def find_test_command(project_dir: Path, tree: Path) -> tuple[str, ...] | None:
    configured = project_facts(project_dir).get("test_command")
    if isinstance(configured, list) and configured and all(isinstance(w, str) for w in configured):
        return tuple(configured)
    for marker, command in DETECTED:
        if not (tree / marker).is_file():
            continue
        if marker == "Makefile" and not _make_has_test(tree):
            continue
        if marker == "package.json" and not _package_has_test(tree):
            continue
        if marker == "justfile" and "test" not in (tree / marker).read_text(errors="replace"):
            continue
        return command
    return None


def run_tests(
    command: Sequence[str],
    tree: Path,
    *,
    env: Mapping[str, str] | None,
    lease: Held | None,
    timeout: float = 1800.0,
) -> TestsRun:
    output = tree / ".vibey" / "tests.log"
    output.parent.mkdir(exist_ok=True)
    try:
        with output.open("wb") as out:
            done = run_supervised(
                command,
                cwd=tree,
                env=env,
                stdout=out,
                stderr=out,
                timeout=timeout,
                lock_fd=None if lease is None else lease.fd,
                on_start=None if lease is None else lease.started,
            )
    except OSError as exc:
        return TestsRun(tuple(command), 127, str(exc))
    tail = output.read_text(encoding="utf-8", errors="replace")[-TAIL_CHARS:]
    return TestsRun(tuple(command), done.returncode, tail, done.timed_out)
