"""ops/check/used_modules.py (run by `just check`): a production module only the tests import
fails the check, by name; so does an entry of its list that is no longer needed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ops" / "check"))
import used_modules

pytestmark = pytest.mark.unit


class FakeGraph:
    """An import graph given as each module's direct imports."""

    def __init__(self, imports: dict[str, set[str]]) -> None:
        self._imports = imports

    @property
    def modules(self) -> set[str]:
        return set(self._imports)

    def find_modules_directly_imported_by(self, module: str) -> set[str]:
        return self._imports[module]


GRAPH = FakeGraph(
    {
        "vibey": set(),
        "vibey.launch": {"vibey.cli"},
        "vibey.cli": {"store.jobs"},
        "store": set(),
        "store.jobs": {"workflows.job"},
        "workflows": set(),
        "workflows.job": set(),
        "store.orphan": {"store.helper"},  # imported by no production module: only tests
        "store.helper": set(),  # imported only by the orphan: unused with it
        "actors": set(),
        "actors.script": set(),  # started by path
    }
)
FOUND = {"vibey.launch": "pyproject.toml [project.scripts] vibey"}


def test_an_orphaned_module_and_what_only_it_imports_fail_the_check_by_name() -> None:
    assert used_modules.unused(GRAPH, FOUND) == [
        "actors",
        "actors.script",
        "store.helper",
        "store.orphan",
    ]
    lines = used_modules.problems(GRAPH, FOUND, {"actors.script": "run by path"})
    assert [line.split(":")[0] for line in lines] == ["store.helper", "store.orphan"]
    assert "only the tests do" in lines[0]


def test_a_reached_module_reaches_its_packages() -> None:
    assert "store" not in used_modules.unused(GRAPH, FOUND)
    assert "workflows" not in used_modules.unused(GRAPH, FOUND)


def test_a_needless_or_unknown_entry_fails_the_check() -> None:
    entries = {"store.orphan": "x", "actors.script": "x", "vibey.cli": "x", "store.gone": "x"}
    lines = used_modules.problems(GRAPH, FOUND, entries)
    assert lines == [
        "ENTRIES names store.gone, which is no module: remove it",
        "ENTRIES names vibey.cli, which is reached anyway: remove it",
    ]


def test_the_entry_points_are_read_from_the_scripts_the_names_and_the_command_lines(
    tmp_path: Path,
) -> None:
    (tmp_path / "pyproject.toml").write_text('[project.scripts]\nvibey = "vibey.launch:main"\n')
    (tmp_path / "vibey").mkdir()
    (tmp_path / "vibey" / "groups.py").write_text(
        'GROUPS = {"gate": "vibey.cli_gate:gate_app"}\n'
        'argv = [sys.executable, "-m", "vibey", "loop-service"]\n'
        'git("commit", "-m", "vibey: start")  # a message, not a module\n'
    )
    (tmp_path / "ops" / "kubernetes").mkdir(parents=True)
    (tmp_path / "ops" / "kubernetes" / "fleet.yaml").write_text(
        'args: ["dramatiq", "actors.fleet_actors"]\n'
    )
    found = used_modules.found_entries(tmp_path, {"vibey.__main__", "vibey.cli_gate"})
    assert sorted(found) == [
        "actors.fleet_actors",
        "vibey.__main__",
        "vibey.cli_gate",
        "vibey.launch",
    ]


def test_the_project_passes_the_check() -> None:
    assert used_modules.main() == 0
