"""`just up` and `just down` (ops/local/up.sh, ops/local/down.sh), run as a user runs them.

Against the services already running (PostgreSQL and RabbitMQ from the test fixtures), in a
namespace of the test's own: a fresh database, the fixture's vhost and name prefix, and a
temporary state folder (``VIBEY_STATE_DIR``), settings file (``VIBEY_ENV_FILE``) and engine
workspace. ``VIBEY_LOCAL_SERVICES=none``: the scripts must find the services, never start one.

up ends with the demo waiting at its first gate and prints the ``vibey gate answer`` command
that continues it; answering every gate brings the demo to its end; down stops the worker fleet
up started (its whole process group) and nothing else, and a second down has nothing to do.
The whole test is bounded (``BUDGET_S``): every step gets what is left of it.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pika
import pika.exceptions
import psycopg
import pytest
from psycopg import sql

from actors.topology import QueueNames
from tests.acceptance.console_process import free_port
from tests.amqp_fixtures import Amqp
from workflows.dispatch import DEFAULT_WAIT_TIERS, Lane

REPO = Path(__file__).resolve().parents[2]
UP, DOWN = REPO / "ops" / "local" / "up.sh", REPO / "ops" / "local" / "down.sh"
VIBEY = str(Path(sys.executable).with_name("vibey"))
BUDGET_S = 300.0  # up starts the web console too, and a loaded 2-core box needs the margin
DOWN_S = 30.0  # kept back for down, whatever the steps before it took
ANSWER_LINE = re.compile(r"^\s*vibey gate answer ([0-9a-f-]{36}) (.+)$", re.MULTILINE)
ENDED = ("completed", "failed", "cancelled")


class Budget:
    def __init__(self, seconds: float) -> None:
        self.deadline = time.monotonic() + seconds

    def left(self, keep: float = 0.0) -> float:
        return max(1.0, self.deadline - time.monotonic() - keep)


def run(script: Path, env: Mapping[str, str], timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(script)],
        cwd=REPO,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def vibey_json(env: Mapping[str, str], *args: str) -> Any:
    done = subprocess.run(
        [VIBEY, *args, "--json"], env=dict(env), capture_output=True, text=True, timeout=30
    )
    assert done.returncode == 0, f"vibey {' '.join(args)}: {done.stderr}"
    return json.loads(done.stdout)


def group_members(pgid: int) -> list[str]:
    """The live (not zombie) processes of the process group: "pid stat args" each."""
    out = subprocess.run(
        ["ps", "-ww", "-eo", "pid=,pgid=,stat=,args="], capture_output=True, text=True, check=True
    ).stdout
    members = []
    for line in out.splitlines():
        pid, group, stat, *args = line.split(None, 3)
        if int(group) == pgid and not stat.startswith("Z"):
            members.append(f"{pid} {stat} {' '.join(args)}")
    return members


def recorded_worker(state: Path, what: str = "worker") -> int | None:
    pids = state / "pids"
    if not pids.exists():
        return None
    for line in pids.read_text().splitlines():
        fields = line.split("\t")
        if fields[:2] == [what, "group"]:
            return int(fields[2])
    return None


def with_database(url: str, database: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


def drop_database(admin_url: str, database: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(database))
        )


def answers_at_postgres(url: str) -> bool:
    with psycopg.connect(url, connect_timeout=5) as conn:
        return conn.execute("SELECT 1").fetchone() == (1,)


def answers_at_rabbitmq(url: str) -> bool:
    params = pika.URLParameters(url)
    params.connection_attempts, params.socket_timeout = 1, 5
    pika.BlockingConnection(params).close()
    return True


def delete_topology(url: str, prefix: str) -> None:
    """The fleet's queues and exchanges under ``prefix`` (the vhost may be shared)."""
    names, tiers = QueueNames(prefix), DEFAULT_WAIT_TIERS.names
    queues = [names.work_queue(lane) for lane in Lane] + [names.dead_queue]
    queues += [names.tier_queue(tier) for tier in tiers]
    exchanges = [names.work_exchange, names.dead_exchange]
    exchanges += [names.tier_exchange(tier) for tier in tiers]
    queues.append(f"{prefix}.notify.webhooks")  # `vibey notify`'s, on the events exchange
    exchanges.append(f"{prefix}.events")
    connection = pika.BlockingConnection(pika.URLParameters(url))
    try:
        channel = connection.channel()
        for queue in queues:
            channel.queue_delete(queue)
        for exchange in exchanges:
            channel.exchange_delete(exchange)
    finally:
        connection.close()


@pytest.fixture
def up_env(tmp_path: Path, pg_admin_url: str, amqp: Amqp) -> Iterator[dict[str, str]]:
    database = f"vibey_up_{uuid.uuid4().hex[:12]}"
    config = tmp_path / "vibey.toml"  # a webhook (to a closed port): up starts `vibey notify`
    config.write_text(
        '[notify.webhooks.ops]\nurl = "http://127.0.0.1:9/hook"\nevents = ["gate.opened"]\n'
        'secret = "s3cret"\nmax_attempts = 2\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEY_")}
    env |= {
        "VIBEY_PG_URL": with_database(pg_admin_url, database),
        "VIBEY_TEST_PG_URL": pg_admin_url,  # up creates the database through it
        "VIBEY_AMQP_URL": amqp.url,
        "VIBEY_BUS_PREFIX": amqp.prefix,
        "VIBEY_STATE_DIR": str(tmp_path / "state"),
        "VIBEY_ENV_FILE": str(tmp_path / "env"),
        "VIBEY_LOCAL_SERVICES": "none",
        "VIBEY_WORKER_PROCESSES": "1",
        "VIBEY_UP_WORKER_TIMEOUT": "30",
        "VIBEY_UP_DEMO_TIMEOUT": "20",
        "VIBEY_DOWN_TIMEOUT": "10",
        "VIBEY_CONSOLE_PORT": str(free_port()),
        "VIBEY_CONFIG": str(config),
        # ps cuts its lines at $COLUMNS when it has no terminal; CI's shell sets 80, which cut
        # "…/.venv/bin/vibey console" off a longer checkout path, so down took the console for gone.
        "COLUMNS": "40",
    }
    try:
        yield env
    finally:
        for what in ("worker", "console", "notify"):
            group = recorded_worker(tmp_path / "state", what)
            if group is not None:  # the test failed before down: end what up started
                with suppress(ProcessLookupError, PermissionError):
                    os.killpg(group, signal.SIGKILL)
        drop_database(pg_admin_url, database)
        delete_topology(amqp.url, amqp.prefix)


def test_up_waits_at_the_first_gate_and_down_stops_what_up_started(
    tmp_path: Path, up_env: dict[str, str], pg_admin_url: str, amqp: Amqp
) -> None:
    budget = Budget(BUDGET_S)
    state = Path(up_env["VIBEY_STATE_DIR"])

    up = run(UP, up_env, budget.left(keep=DOWN_S + 10))
    output = up.stdout + up.stderr
    assert up.returncode == 0, output[-4000:]
    assert "PostgreSQL: answering" in up.stdout and "RabbitMQ: answering" in up.stdout
    commands = ANSWER_LINE.findall(up.stdout)
    assert commands, f"no `vibey gate answer` line:\n{output[-4000:]}"
    assert (tmp_path / "env").read_text().count("VIBEY_PG_URL=") == 1

    worker = recorded_worker(state)
    assert worker is not None, (state / "pids").read_text()
    members = group_members(worker)
    assert any(m.endswith("vibey worker") for m in members), members
    # The web console: started, its URL printed, signed in with the token up made.
    console = recorded_worker(state, "console")
    url = f"http://127.0.0.1:{up_env['VIBEY_CONSOLE_PORT']}/"
    assert console is not None and f"console     {url}" in up.stdout, up.stdout[-3000:]
    assert (state / "console.token").read_text().strip()
    with urllib.request.urlopen(f"{url}healthz", timeout=5) as healthz:
        assert healthz.headers["X-Vibey-Pid"] == str(console)
    # The webhooks' consumer, since a webhook is configured.
    notify = recorded_worker(state, "notify")
    assert notify is not None and f"notify: started (pid {notify}" in up.stdout, up.stdout[-3000:]
    assert any(m.endswith("vibey notify") for m in group_members(notify))

    # A second up reuses the fleet and the demo: nothing new runs.
    again = run(UP, up_env, budget.left(keep=DOWN_S + 5))
    assert again.returncode == 0, (again.stdout + again.stderr)[-4000:]
    assert f"reusing the fleet a previous `just up` started (pid {worker})" in again.stdout
    assert "already there" in again.stdout
    assert recorded_worker(state) == worker
    assert f"reusing the console a previous `just up` started (pid {console})" in again.stdout
    assert (state / "pids").read_text().count("worker\t") == 1
    assert f"notify: reusing pid {notify}" in again.stdout

    # The printed command continues the demo; answering every gate brings it to its end.
    gate_id, answer = commands[0]
    done = subprocess.run(
        [VIBEY, "gate", "answer", gate_id, *shlex.split(answer), "--by", "test"],
        env=up_env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    status = drive_to_the_end(up_env, budget.deadline - DOWN_S)
    assert status["workflow"]["status"] == "completed", status["workflow"]
    assert status["workflow"]["phase"] == "done"

    down = run(DOWN, up_env, budget.left())
    assert down.returncode == 0, down.stdout + down.stderr
    assert f"stopped the worker fleet (process group {worker})" in down.stdout
    assert group_members(worker) == []
    assert f"stopped the web console (process group {console})" in down.stdout
    assert group_members(console) == []
    assert f"stopped the webhooks' consumer (process group {notify})" in down.stdout
    assert group_members(notify) == []
    assert not (state / "pids").exists()
    assert answers_at_postgres(pg_admin_url)
    assert answers_at_rabbitmq(amqp.url)

    second = run(DOWN, up_env, budget.left())
    assert second.returncode == 0, second.stderr
    assert second.stdout.startswith("nothing to stop")


def drive_to_the_end(env: Mapping[str, str], deadline: float) -> Any:
    """Answer each open gate of the demo until it ends: its first answer (or some text), but
    "no" to the opt-in phases, which keeps the run short."""
    while True:
        status = vibey_json(env, "workflow", "status", "demo")
        if status["workflow"]["status"] in ENDED:
            return status
        if time.monotonic() > deadline:
            pytest.fail(f"the demo did not end in time: {status['workflow']}")
        for gate in vibey_json(env, "gate", "list", "--project", "demo")["gates"]:
            answers = gate.get("answers") or ["an answer from the test"]
            reply = "no" if str(gate.get("name")).endswith("opt_in") else answers[0]
            subprocess.run(
                [VIBEY, "gate", "answer", gate["id"], reply, "--by", "test"],
                env=dict(env),
                capture_output=True,
                timeout=30,
                check=False,  # answered meanwhile: the next round sees what is open
            )
        time.sleep(0.5)
