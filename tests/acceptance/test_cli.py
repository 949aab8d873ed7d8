"""The ``vibey`` command, run as a user runs it: a subprocess with its own environment and cwd."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from importlib import metadata
from pathlib import Path
from typing import TypeVar

import pika
import pika.exceptions
import psycopg
import pytest

from actors.capabilities import BrokerCapabilities, capabilities_for, detect
from actors.config import keys
from actors.topology import QueueNames
from store.migrate import shipped
from tests.amqp_fixtures import Amqp
from tests.cli_fork import forked_cli
from vibey.cli import DoctorReport
from vibey.settings import AMQP_FIX
from workflows.dispatch import DEFAULT_WAIT_TIERS, Lane

T = TypeVar("T")


@dataclass(frozen=True)
class Run:
    code: int
    stdout: str
    stderr: str

    @property
    def stderr_lines(self) -> list[str]:
        return self.stderr.splitlines()


def clean_env(**extra: str) -> dict[str, str]:
    """The test process's environment without any VIBEY_* variable, plus ``extra``; REVIEW
    runs unattended (no review.feedback gate) unless ``extra`` says otherwise."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEY_")}
    env["VIBEY_WORKFLOW_REVIEW_FEEDBACK"] = "false"
    env.update(extra)
    return env


def vibey(*args: str, cwd: Path, env: Mapping[str, str] | None = None, forked: bool = False) -> Run:
    """``vibey ARGS`` as a fresh interpreter (``python -m vibey``), or, ``forked``, forked from
    a process that imported the CLI once (tests/cli_fork.py): a process of its own either way."""
    env = clean_env() if env is None else dict(env)
    if forked:
        done = forked_cli().run(args, cwd=cwd, env=env, timeout=120)
    else:
        done = subprocess.run(
            [sys.executable, "-m", "vibey", *args],
            cwd=cwd,
            env=env,
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


@pytest.mark.parametrize(
    "args", [("frobnicate",), ("frobnicate", "--help"), ("frobnicate", "-h", "x"), ("wokrer",)]
)
def test_an_unknown_command_exits_2_with_one_line_whatever_follows(
    tmp_path: Path, args: tuple[str, ...]
) -> None:
    run = vibey(*args, cwd=tmp_path)
    assert run.code == 2, run
    assert run.stdout == ""
    [line] = run.stderr_lines
    assert line.startswith(f'vibey: Unknown command "{args[0]}". Available commands: workflow')


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


def announced_version(url: str) -> str:
    """The version the broker at ``url`` announces, read here without vibey's probe."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        return detect(connection).version
    finally:
        connection.close()


def capability_map(caps: BrokerCapabilities) -> dict[str, bool]:
    return {name: getattr(caps, name) for name in caps.__dataclass_fields__ if name != "version"}


def test_doctor_json_on_a_migrated_database_is_healthy(
    tmp_path: Path, pg_url: str, amqp_url: str
) -> None:
    url = with_password(pg_url, "hunter2")
    env = clean_env(VIBEY_PG_URL=url, VIBEY_AMQP_URL=amqp_url)
    run = vibey("doctor", "--json", cwd=tmp_path, env=env)
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
    nested = {
        k for k, v in report.items() if isinstance(v, dict | list) and k != "pending_migrations"
    }
    assert nested == {"broker_capabilities", "stack", "settings", "in_effect"}  # flat but these
    assert report["in_effect"]["database.url"] == with_password(pg_url, "***")
    assert report["in_effect"]["queue.backend"] == "rabbitmq"
    assert set(report["in_effect"]) == {f"{key.table}.{key.name}" for key in keys()}


def test_doctor_json_reports_the_broker_and_what_it_honours(
    tmp_path: Path, pg_url: str, amqp_url: str
) -> None:
    env = clean_env(VIBEY_PG_URL=pg_url, VIBEY_AMQP_URL=amqp_url)
    report = json.loads(vibey("doctor", "--json", cwd=tmp_path, env=env).stdout)
    assert report["amqp_ok"] is True
    assert report["amqp_error"] is None
    version = report["broker_version"]
    assert version == announced_version(amqp_url)
    assert version.startswith(("3.", "4."))  # this machine's broker is 3.10; production 4.x
    expected = capability_map(capabilities_for(version))
    assert report["broker_capabilities"] == expected
    assert set(expected) >= {"per_queue_consumer_timeout", "xdeath_count_reliable"}
    assert all(isinstance(v, bool) for v in report["broker_capabilities"].values())


def test_doctor_text_shows_the_broker_capability_table(
    tmp_path: Path, pg_url: str, amqp_url: str
) -> None:
    env = clean_env(VIBEY_PG_URL=pg_url, VIBEY_AMQP_URL=amqp_url)
    run = vibey("doctor", cwd=tmp_path, env=env)
    assert run.code == 0, run.stdout + run.stderr
    version = announced_version(amqp_url)
    assert f"rabbitmq:       answers, RabbitMQ {version}; what it honours:" in run.stdout
    for label, answer in capabilities_for(version).as_table()[1:]:
        assert f"  {label}: {answer}" in run.stdout
    assert run.stdout.splitlines()[-1] == "healthy"


def test_doctor_when_rabbitmq_does_not_answer_is_unhealthy(tmp_path: Path, pg_url: str) -> None:
    amqp = f"amqp://guest:hunter2@127.0.0.1:{free_port()}/"
    run = vibey(
        "doctor", "--json", cwd=tmp_path, env=clean_env(VIBEY_PG_URL=pg_url, VIBEY_AMQP_URL=amqp)
    )
    assert run.code == 1
    report = json.loads(run.stdout)
    assert report["postgres_ok"] is True
    assert report["amqp_ok"] is False
    assert "did not answer" in report["amqp_error"]
    assert (report["broker_version"], report["broker_capabilities"]) == (None, None)
    assert report["healthy"] is False
    assert "hunter2" not in run.stdout
    assert run.stderr == ""  # pika's own connect errors are not printed


def test_doctor_on_the_rabbitmq_backend_without_an_amqp_url_names_both_fixes(
    tmp_path: Path, pg_url: str
) -> None:
    run = vibey("doctor", "--json", cwd=tmp_path, env=clean_env(VIBEY_PG_URL=pg_url))
    assert run.code == 1
    report = json.loads(run.stdout)
    assert report["postgres_ok"] is True
    assert report["amqp_ok"] is False
    assert report["amqp_error"] == AMQP_FIX
    assert report["healthy"] is False


def test_doctor_on_the_postgres_backend_needs_no_rabbitmq(tmp_path: Path, pg_url: str) -> None:
    env = clean_env(VIBEY_PG_URL=pg_url, VIBEY_QUEUE_BACKEND="postgres")
    run = vibey("doctor", "--json", cwd=tmp_path, env=env)
    assert run.code == 0, run.stdout
    report = json.loads(run.stdout)
    assert (report["amqp_ok"], report["amqp_error"]) == (None, None)
    assert report["healthy"] is True


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
    from vibey.launch import main as launch

    assert main(["--version"]) == 0 and launch(["--version"]) == 0
    (entry,) = [e for e in metadata.entry_points(group="console_scripts") if e.name == "vibey"]
    assert entry.value == "vibey.launch:main"  # answers --version before importing vibey.cli


# --- vibey worker -----------------------------------------------------------------------------

PG_STUB = "postgresql://vibey@127.0.0.1:5432/vibey"  # never connected to: these runs stop before
AMQP_STUB = "amqp://guest:guest@127.0.0.1:5672/"


def test_worker_without_an_amqp_url_exits_2_naming_both_fixes(tmp_path: Path) -> None:
    run = vibey("worker", cwd=tmp_path, env=clean_env(VIBEY_PG_URL=PG_STUB))
    assert run.code == 2
    assert run.stderr_lines == [f"vibey: {AMQP_FIX}"]
    assert "export VIBEY_AMQP_URL=" in run.stderr
    assert 'backend = "postgres"' in run.stderr
    assert run.stdout == ""  # it never said it runs anything: nothing started


def test_worker_without_any_url_names_the_amqp_fix_first(tmp_path: Path) -> None:
    run = vibey("worker", "--processes", "1", cwd=tmp_path)
    assert run.code == 2
    assert run.stderr_lines == [f"vibey: {AMQP_FIX}"]


def test_worker_on_the_postgres_backend_needs_a_database_not_rabbitmq(tmp_path: Path) -> None:
    env = clean_env(VIBEY_QUEUE_BACKEND="postgres")
    run = vibey("worker", cwd=tmp_path, env=env)
    assert run.code == 2
    (line,) = run.stderr_lines
    assert "VIBEY_PG_URL is not set" in line and "AMQP" not in line
    assert run.stdout == ""


def test_worker_help_documents_its_flags(tmp_path: Path) -> None:
    run = vibey("worker", "--help", cwd=tmp_path)
    assert run.code == 0, run.stderr
    for flag in ("--processes", "--threads", "--project", "--lanes", "--handlers"):
        assert flag in run.stdout
    assert "SIGTERM" in run.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--lanes", "interactive,fast"), "unknown lane 'fast'"),
        (("--lanes", "build,,interactive"), "empty item"),
        (("--project", "a.b"), "'a.b'"),
        (("--project", "a*"), "'a*'"),
        (("--project", "#"), "'#'"),
        (("--project", "two words"), "'two words'"),
        (("--threads", "0"), "--threads"),
        (("--processes", "-1"), "--processes"),
        (("--handlers", "no_such_module:HANDLERS"), "no_such_module"),
        (("--handlers", "not an import path"), "module:attribute"),
    ],
)
def test_worker_with_a_bad_flag_exits_2_with_one_line(
    tmp_path: Path, args: tuple[str, ...], named: str
) -> None:
    env = clean_env(VIBEY_PG_URL=PG_STUB, VIBEY_AMQP_URL=AMQP_STUB)
    run = vibey("worker", *args, cwd=tmp_path, env=env)
    assert run.code == 2
    assert len(run.stderr_lines) == 1, run.stderr
    assert named in run.stderr
    assert run.stdout == ""


def test_worker_with_a_consumer_timeout_below_the_longest_lease_exits_2(tmp_path: Path) -> None:
    env = clean_env(
        VIBEY_PG_URL=PG_STUB, VIBEY_AMQP_URL=AMQP_STUB, VIBEY_QUEUE_CONSUMER_TIMEOUT="3600"
    )
    run = vibey("worker", cwd=tmp_path, env=env)
    assert run.code == 2
    (line,) = run.stderr_lines
    assert "consumer_timeout_seconds (3600 s) is not above the longest lease (7200 s)" in line
    assert "VIBEY_QUEUE_CONSUMER_TIMEOUT" in line
    assert run.stdout == ""


def test_worker_with_a_bad_lane_in_the_environment_exits_2(tmp_path: Path) -> None:
    env = clean_env(VIBEY_PG_URL=PG_STUB, VIBEY_AMQP_URL=AMQP_STUB, VIBEY_WORKER_LANES="bulk")
    run = vibey("worker", cwd=tmp_path, env=env)
    assert run.code == 2
    assert run.stderr_lines == [
        "vibey: unknown lane 'bulk': the lanes are interactive, build; "
        "fix --lanes, VIBEY_WORKER_LANES (or lanes under [worker])"
    ]


def wait_for(
    check: Callable[[], T | None],
    timeout: float,
    what: str,
    process: subprocess.Popen[bytes],
    log: Path,
) -> T:
    """``check()``'s first answer that is not None; fails at once if ``process`` exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found is not None:
            return found
        if process.poll() is not None:
            break
        time.sleep(0.1)
    tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
    raise AssertionError(
        f"no {what} within {timeout} s (exit code {process.poll()}); the worker's stderr ends:\n"
        f"{tail}"
    )


def consumed(url: str, queues: list[str]) -> bool | None:
    """True when every queue exists and has a consumer; None otherwise."""
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        for queue in queues:
            channel = connection.channel()
            try:
                frame = channel.queue_declare(queue, passive=True)
            except pika.exceptions.ChannelClosedByBroker:
                return None  # not declared yet (404)
            if frame.method.consumer_count < 1:
                return None
        return True
    finally:
        connection.close()


def the_topology(prefix: str) -> tuple[list[str], list[str]]:
    """Every queue and exchange the default fleet declares under ``prefix``."""
    names, tiers = QueueNames(prefix), DEFAULT_WAIT_TIERS.names
    queues = [names.work_queue(lane) for lane in Lane] + [names.dead_queue]
    queues += [names.tier_queue(tier) for tier in tiers]
    exchanges = [names.work_exchange, names.dead_exchange]
    exchanges += [names.tier_exchange(tier) for tier in tiers]
    return queues, exchanges


def delete_topology(url: str, prefix: str) -> list[str]:
    """Delete the fleet's queues and exchanges; returns the names that still exist after."""
    queues, exchanges = the_topology(prefix)
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        for queue in queues:
            channel.queue_delete(queue)
        for exchange in exchanges:
            channel.exchange_delete(exchange)
        left = []
        for name, passive in [(q, "queue") for q in queues] + [(x, "exchange") for x in exchanges]:
            channel = connection.channel()
            try:
                if passive == "queue":
                    channel.queue_declare(name, passive=True)
                else:
                    channel.exchange_declare(name, passive=True)
                left.append(name)
            except pika.exceptions.ChannelClosedByBroker:
                pass  # 404: gone
        return left
    finally:
        connection.close()


def test_worker_runs_the_fleet_until_sigterm_then_exits_0(
    tmp_path: Path, pg_url: str, amqp: Amqp
) -> None:
    env = clean_env(VIBEY_PG_URL=pg_url, VIBEY_AMQP_URL=amqp.url, VIBEY_BUS_PREFIX=amqp.prefix)
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    lanes = [QueueNames(amqp.prefix).work_queue(lane) for lane in Lane]
    with out.open("w") as stdout, err.open("w") as stderr:
        worker = subprocess.Popen(
            [sys.executable, "-m", "vibey", "worker", "--processes", "1", "--threads", "2"],
            cwd=tmp_path,
            env=env,
            stdout=stdout,
            stderr=stderr,
            start_new_session=True,  # its own process group, so a failed test can end it all
        )
    try:
        line = wait_for(
            lambda: next(iter(out.read_text().splitlines()), None),
            20,
            "line saying what runs",
            worker,
            err,
        )
        assert line.startswith(
            f"vibey worker: 1 process of 2 threads each on {', '.join(lanes)} at amqp://"
        ), line
        wait_for(lambda: consumed(amqp.url, lanes), 30, "consumer on both lane queues", worker, err)
        worker.send_signal(signal.SIGTERM)
        code = worker.wait(timeout=20)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
            worker.wait()
        left = delete_topology(amqp.url, amqp.prefix)
    log = err.read_text(errors="replace")
    assert code == 0, log[-3000:]
    assert out.read_text().splitlines()[-1] == "vibey worker: stopped (0 respawns)"
    assert "Traceback" not in log
    assert left == []
