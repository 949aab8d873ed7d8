"""``vibey workflow start P --test-command "…"`` prepares the project's facts
(``<workspace>/P/project.json``) with or without ``--repo``: a new project has no folder yet,
and the docs promise a new empty repository when ``--repo`` is left out."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from vibey.cli_workflow import prepare_project
from vibey.render import CommandError
from vibey.settings import Settings, load_settings


def settings(workspace: Path) -> Settings:
    return load_settings({"VIBEY_ENGINE_WORKSPACE": str(workspace)}, cwd=workspace.parent)


def test_a_new_project_without_repo_gets_its_test_command(tmp_path: Path) -> None:
    workspace = tmp_path / "work"
    prepare_project(settings(workspace), "fresh", None, None, "python3 -m pytest -q tests")
    facts = json.loads((workspace / "fresh" / "project.json").read_text())
    assert facts == {"test_command": ["python3", "-m", "pytest", "-q", "tests"]}


def test_a_second_start_keeps_the_facts_it_does_not_change(tmp_path: Path) -> None:
    workspace = tmp_path / "work"
    prepare_project(settings(workspace), "fresh", None, None, "make test")
    prepare_project(settings(workspace), "fresh", None, None, "just test")
    facts = json.loads((workspace / "fresh" / "project.json").read_text())
    assert facts == {"test_command": ["just", "test"]}


def test_an_imported_repository_is_recorded_with_its_test_command(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    subprocess.run(["git", "init", "-q", "-b", "main", str(source)], check=True)
    (source / "a.txt").write_text("a\n")
    git = ["git", "-C", str(source), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "a"], check=True)
    workspace = tmp_path / "work"
    prepare_project(settings(workspace), "imported", str(source), None, "make test")
    facts = json.loads((workspace / "imported" / "project.json").read_text())
    assert facts == {"repo": str(source), "test_command": ["make", "test"]}
    assert (workspace / "imported" / "repo" / "a.txt").is_file()


def test_a_branch_without_a_repo_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(CommandError, match="--branch goes with --repo"):
        prepare_project(settings(tmp_path / "work"), "p", None, "dev", None)


def test_an_unwritable_workspace_names_the_project_not_none(tmp_path: Path) -> None:
    blocker = tmp_path / "work"
    blocker.write_text("a file where the workspace should be")
    with pytest.raises(CommandError) as raised:
        prepare_project(settings(blocker), "p", None, None, "make test")
    assert str(raised.value).startswith("cannot prepare project p:")
    assert "None" not in str(raised.value)
