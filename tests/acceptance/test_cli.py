"""The ``vibey`` command, run as a user runs it: a subprocess with its own environment and cwd."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, fields
from importlib import metadata
from pathlib import Path

import psycopg
import pytest

from store.migrate import shipped
from vibey.cli import DoctorReport


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def stderr_lines(self) -> list[str]:
        return self.stderr.splitlines()


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any VIBEY_* variable, plus ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEY_")}
    env.update(extra)
    return env


def vibey(*args: str, cwd: Path, env: Mapping[str, str] | None = None) -> Run:
    done = subprocess.run(
        [sys.executable, "-m", "vibey", *args],
        cwd=cwd,
        env=clean_env() if env is None else dict(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return Run(done.returncode, done.stdout, done.stderr)


def with_password(url: str, password: str) -> str:
    """``url`` with a password added (trust auth ignores it; the CLI must never print it)."""
    scheme, _, rest = url.partition("://")
    user, _, host = rest.partition("@")
    return f"{scheme}://{user}:{password}@{host}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def applied_versions(url: str) -> list[int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT version FROM schema_migrations ORDER BY 1").fetchall()
    return [int(r[0]) for r in rows]


def test_migrate_without_a_database_url_exits_2_with_one_line(tmp_path: Path) -> None:
    run = vibey("migrate", cwd=tmp_path)
    assert run.code == 2
    assert len(run.stderr_lines) == 1, run.stderr
    assert run.stderr_lines[0].startswith("vibey: VIBEY_PG_URL is not set: export VIBEY_PG_URL=")
    assert run.stdout == ""


def test_migrate_applies_then_applies_nothing(tmp_path: Path, empty_pg_url: str) -> None:
    env = clean_env(VIBEY_PG_URL=empty_pg_url)
    first = vibey("migrate", cwd=tmp_path, env=env)
    assert first.code == 0, first.stderr
    names = [f"applied {m.version:04d}_{m.name}" for m in shipped()]
    assert first.stdout.splitlines()[:-1] == names
    assert first.stdout.splitlines()[-1].startswith("database is up to date")
    assert applied_versions(empty_pg_url) == [m.version for m in shipped()]

    again = vibey("migrate", cwd=tmp_path, env=env)
    assert again.code == 0, again.stderr
    assert "applied 0" not in again.stdout
    assert again.stdout.splitlines() == [
        f"database is up to date ({len(shipped())} migration"
        f"{'' if len(shipped()) == 1 else 's'} applied earlier)"
    ]


def test_migrate_reads_the_url_from_vibey_toml(tmp_path: Path, empty_pg_url: str) -> None:
    (tmp_path / "vibey.toml").write_text(f'[database]\nurl = "{empty_pg_url}"\n')
    run = vibey("migrate", cwd=tmp_path)
    assert run.code == 0, run.stderr
    assert applied_versions(empty_pg_url) == [m.version for m in shipped()]


def test_a_database_that_does_not_answer_exits_3_with_one_line(tmp_path: Path) -> None:
    url = f"postgresql://vibey:hunter2@127.0.0.1:{free_port()}/vibey"
    run = vibey("migrate", cwd=tmp_path, env=clean_env(VIBEY_PG_URL=url))
    assert run.code == 3
    assert len(run.stderr_lines) == 1, run.stderr
    assert "did not answer" in run.stderr
    assert "hunter2" not in run.stderr


def test_verbose_adds_the_traceback(tmp_path: Path) -> None:
    run = vibey("-v", "migrate", cwd=tmp_path)
    assert run.code == 2
    assert "Traceback (most recent call last)" in run.stderr
    assert run.stderr_lines[-1].startswith("vibey: VIBEY_PG_URL is not set")


def test_a_changed_migration_exits_1_with_one_line(tmp_path: Path, pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute("UPDATE schema_migrations SET checksum = 'tampered' WHERE version = 1")
    run = vibey("migrate", cwd=tmp_path, env=clean_env(VIBEY_PG_URL=pg_url))
    assert run.code == 1
    assert len(run.stderr_lines) == 1, run.stderr
    assert "was changed after it was applied" in run.stderr


def test_doctor_json_on_a_migrated_database_is_healthy(tmp_path: Path, pg_url: str) -> None:
    url = with_password(pg_url, "hunter2")
    run = vibey("doctor", "--json", cwd=tmp_path, env=clean_env(VIBEY_PG_URL=url))
    assert run.code == 0, run.stderr
    report = json.loads(run.stdout)
    assert report["healthy"] is True
    assert report["postgres_ok"] is True
    assert report["postgres_error"] is None
    assert report["pending_migrations"] == []
    assert report["database_url"] == with_password(pg_url, "***")
    assert "hunter2" not in run.stdout
    assert report["version"] == metadata.version("vibey")
    assert set(report) == {f.name for f in fields(DoctorReport)}  # the documented keys
    assert all(not isinstance(v, dict) for v in report.values())  # flat


def test_doctor_json_reports_pending_migrations(tmp_path: Path, empty_pg_url: str) -> None:
    run = vibey("doctor", "--json", cwd=tmp_path, env=clean_env(VIBEY_PG_URL=empty_pg_url))
    assert run.code == 1
    report = json.loads(run.stdout)
    assert report["postgres_ok"] is True
    assert report["healthy"] is False
    assert report["pending_migrations"] == [f"{m.version:04d}_{m.name}" for m in shipped()]


def test_doctor_without_a_database_is_unhealthy_and_names_the_fix(tmp_path: Path) -> None:
    run = vibey("doctor", "--json", cwd=tmp_path)
    assert run.code == 1
    report = json.loads(run.stdout)
    assert report["database_url"] is None
    assert report["postgres_ok"] is False
    assert "VIBEY_PG_URL" in report["postgres_error"]


def test_doctor_when_postgresql_does_not_answer_is_unhealthy(tmp_path: Path) -> None:
    url = f"postgresql://vibey:hunter2@127.0.0.1:{free_port()}/vibey"
    run = vibey("doctor", "--json", cwd=tmp_path, env=clean_env(VIBEY_PG_URL=url))
    assert run.code == 1
    report = json.loads(run.stdout)
    assert report["postgres_ok"] is False
    assert "did not answer" in report["postgres_error"]
    assert "hunter2" not in run.stdout


def test_doctor_text_says_what_to_do(tmp_path: Path, empty_pg_url: str) -> None:
    run = vibey("doctor", cwd=tmp_path, env=clean_env(VIBEY_PG_URL=empty_pg_url))
    assert run.code == 1
    assert "vibey migrate" in run.stdout
    assert run.stdout.splitlines()[-1] == "not healthy"


@pytest.mark.parametrize(
    "args",
    [("migrate", "--no-such-option"), ("--no-such-option",), ("no-such-command",)],
)
def test_bad_arguments_exit_2_with_one_line(tmp_path: Path, args: tuple[str, ...]) -> None:
    run = vibey(*args, cwd=tmp_path)
    assert run.code == 2
    assert len(run.stderr_lines) == 1, run.stderr
    assert run.stderr_lines[0].startswith("vibey: ")
    assert args[-1] in run.stderr


def test_a_bad_queue_backend_exits_2_with_one_line(tmp_path: Path) -> None:
    run = vibey("doctor", cwd=tmp_path, env=clean_env(VIBEY_QUEUE_BACKEND="kafka"))
    assert run.code == 2
    assert len(run.stderr_lines) == 1, run.stderr
    assert "'kafka'" in run.stderr
    assert run.stdout == ""


def test_version(tmp_path: Path) -> None:
    run = vibey("--version", cwd=tmp_path)
    assert run.code == 0
    assert run.stdout.strip() == metadata.version("vibey")


def test_the_console_script_entry_point_is_main(tmp_path: Path) -> None:
    from vibey.cli import main

    assert main(["--version"]) == 0
    (entry,) = [e for e in metadata.entry_points(group="console_scripts") if e.name == "vibey"]
    assert entry.value == "vibey.cli:main"
