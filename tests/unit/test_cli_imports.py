"""`import vibey.cli` stays light: no database driver, broker client nor Dramatiq is loaded
before a command that needs one runs (``vibey --version`` and ``--help`` pay for none)."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

from vibey.cli_workflow import StatusName
from workflows.engine import Status

HEAVY = ("psycopg", "psycopg_pool", "pika", "dramatiq", "sqlalchemy", "sqlmodel", "tenacity")


def loaded_after(statement: str) -> set[str]:
    probe = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    return set(done.stdout.split())


def test_importing_the_cli_loads_no_driver_broker_client_nor_dramatiq() -> None:
    loaded = loaded_after("import vibey.cli")
    assert "vibey.cli" in loaded and "cyclopts" in loaded  # the probe did import it
    heavy = sorted(m for m in loaded if m.split(".")[0] in HEAVY)
    assert heavy == []
    assert not [m for m in loaded if m.startswith(("store", "actors"))]


def test_the_cli_status_names_are_the_engine_statuses() -> None:
    assert set(get_args(StatusName)) == {s.value for s in Status}


def test_vibey_version_is_answered_before_the_cli_is_imported() -> None:
    loaded = loaded_after("from vibey.launch import main; main(['--version'])")
    assert "vibey.launch" in loaded
    assert not [m for m in loaded if m.split(".")[0] in ("cyclopts", "rich", "psycopg")]
    assert "vibey.cli" not in loaded


def test_the_command_groups_are_imported_only_when_one_runs() -> None:
    loaded = loaded_after("import vibey.cli")
    assert not [m for m in loaded if m.startswith("vibey.cli_")]
    assert "vibey.settings" not in loaded


def test_the_top_level_help_lists_every_group_without_importing_it() -> None:
    from vibey.command_groups import GROUPS

    probe = (
        "import sys, contextlib, io\n"
        "from vibey.cli import app\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out), contextlib.suppress(SystemExit):\n"
        "    app(['--help'])\n"
        "print(out.getvalue())\n"
        "print('LOADED', ' '.join(m for m in sys.modules if m.startswith('vibey.cli_')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    help_text, loaded = done.stdout.rsplit("LOADED", 1)
    assert loaded.split() == []
    for name, (_path, summary) in GROUPS.items():
        assert name in help_text and summary.split()[0] in help_text


def test_a_read_command_loads_the_rows_it_reads_not_the_job_queue() -> None:
    loaded = loaded_after("import vibey.client_reads, store.listings, store.gate_rows")
    assert "store.workflow_reads" in loaded  # the probe did import the reads
    assert not [m for m in loaded if m in ("store.jobs", "store.workflows", "store.unit_of_work")]
    assert not [m for m in loaded if m.split(".")[0] in ("pika", "dramatiq")]


def test_loading_the_settings_reads_no_key_docstring() -> None:
    probe = (
        "from vibey.settings import load_settings\n"
        "from actors.declare import _docstrings\n"
        "load_settings({'VIBEY_PG_URL': 'postgresql://u@h/db'})\n"
        "print(_docstrings.cache_info().currsize)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert done.stdout.split() == ["0"]
