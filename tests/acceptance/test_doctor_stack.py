"""`vibey doctor` and `vibey queue stats` on a deliberately broken stack name each problem
and the fixing command.

Broken: the topology is declared but no worker consumes (a stopped consumer), no process ever
reconciled, and a dispatch has been unsent for ten minutes (a stale outbox). Then the fixes
the doctor prints are run, one at a time, until it is satisfied.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

from actors.capabilities import detect
from actors.config import BusSettings, DatabaseSettings
from actors.worker import WorkerConfig
from tests.acceptance.stack import Stack, stack
from tests.amqp_fixtures import Amqp


@pytest.fixture
def broken(pg_url: str, amqp: Amqp, tmp_path: Path) -> Iterator[Stack]:
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))
    connection.close()
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO job (id, project_id, cycle, kind, subject, idempotency_key, "
            "dispatch_seq, lease_ms) VALUES ('00000000-0000-4000-8000-000000000001', 'p', 0, "
            "'design.spec', '', 'k', 1, 120000)"
        )
        conn.execute(
            "INSERT INTO job_outbox (key, job_id, project_id, dispatch_seq, kind, not_before, "
            "created_at) VALUES ('dispatch:1', '00000000-0000-4000-8000-000000000001', 'p', 1, "
            "'design.spec', now(), now() - interval '10 minutes')"
        )
    with stack(pg_url, amqp.url, amqp.prefix, tmp_path) as running:
        yield running


def doctor(e2e: Stack) -> tuple[int, dict]:
    run = e2e.vibey("doctor", "--stack", "--json", check=False)
    return run.returncode, json.loads(run.stdout)


def problems(report: dict) -> dict[str, str]:
    return {c["name"]: c["fix"] for c in report["stack"] if c["status"] == "problem"}


def test_doctor_names_each_problem_with_its_fix_until_the_stack_is_whole(broken: Stack) -> None:
    code, report = doctor(broken)
    assert code == 1 and report["healthy"] is True  # the services answer; the stack is broken
    assert problems(report) == {
        "consumers": "vibey worker --lanes interactive",
        "reconcile": "vibey reconcile (or vibey worker: every worker reconciles)",
        "outbox": "vibey reconcile --once",
    }
    assert report["next_command"] == "vibey worker --lanes interactive"
    text = broken.vibey("doctor", check=False)
    assert text.returncode == 0  # without --stack only the services decide the exit code
    assert "consumers:      PROBLEM: no consumer on" in text.stdout
    assert text.stdout.splitlines()[-2:] == ["next: vibey worker --lanes interactive", "healthy"]
    stats = json.loads(broken.vibey("queue", "stats", "--json").stdout)
    fixes = {p["fix"] for p in stats["problems"]}
    assert fixes == {"vibey worker --lanes interactive", "vibey worker --lanes build"} | {
        "vibey reconcile --once"
    }, stats["problems"]
    shown = broken.vibey("queue", "stats").stdout
    assert "PROBLEM: no consumer on" in shown and "(a stale outbox); fix: vibey reconcile" in shown
    assert shown.splitlines()[-1] == "next: vibey worker --lanes interactive"

    broken.vibey("reconcile", "--once")  # the outbox's fix: sends it, records a heartbeat
    code, report = doctor(broken)
    assert set(problems(report)) == {"consumers"}

    broken.start_worker(processes=1, threads=2)
    deadline = time.monotonic() + 60
    while (code := doctor(broken)[0]) != 0 and time.monotonic() < deadline:
        time.sleep(1)
    assert code == 0, (doctor(broken)[1]["stack"], broken.worker_log())
