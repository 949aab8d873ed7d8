"""Chaos: engine processes under SIGKILLed workers. No agent outlives its attempt, and no two
attempts ever work in one worktree.

Three worker processes run the protocol on the ``command`` engine, whose command is a
stand-in agent (tests/agents/scripted_agent.py: it answers as the scripted engine would, works
a second in its directory with a child process beside it, and records every run's pid,
directory, start and end, and any run that starts while another is alive in its directory).
While the workflows run, a worker that has an agent running is SIGKILLed, at least
``KILLS`` times. At the end: every workflow completed, no run overlapped another in one
directory (neither by the agents' own check nor by the recorded intervals), and no agent
process, nor any child of one, is left.

Reproduce with ``VIBEY_CHAOS_SEED=<seed printed by the run>``.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import sys
import threading
import time
from collections import defaultdict
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg_pool import ConnectionPool

from actors.capabilities import detect
from actors.config import (
    BusSettings,
    DatabaseSettings,
    EngineSettings,
    QueueSettings,
    RabbitMqSettings,
    WorkerSettings,
)
from actors.fleet import Supervisor
from actors.worker import WorkerConfig
from store.jobs import PostgresJobRepository
from store.ledger import Ledger
from store.workflows import WorkflowStore
from tests.acceptance.stack import cooperative
from tests.amqp_fixtures import Amqp
from tests.chaos.figures import figure
from tests.chaos.fleet import chaos_seed
from workflows.engine import Registry, Status
from workflows.protocol import DEFINITIONS
from workflows.protocol.kinds import STEP_KINDS
from workflows.queue import Gate

pytestmark = pytest.mark.chaos

AGENT = Path(__file__).resolve().parents[1] / "agents" / "scripted_agent.py"
WORKFLOWS = 3
KILLS = 20
DEADLINE_S = 540.0
LEASE = timedelta(seconds=8)
SCRIPT = {
    "build": {
        "work_items": [{"id": "core", "title": "Core"}, {"id": "cli", "title": "CLI"}],
        "verify_failures": 1,
    },
}


def answer_for(gate: Gate) -> str:
    return cooperative({"name": gate.name, "kind": gate.kind, "answers": list(gate.answers)})


def agent_processes(marker: str) -> dict[int, int]:
    """pid → parent pid of every live process whose command line names ``marker``."""
    found: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            stat = Path(f"/proc/{name}/stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        if marker in cmdline and stat[0] != "Z":
            found[int(name)] = int(stat[1])
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def overlaps(runs: list[dict[str, Any]]) -> list[tuple[str, Any, Any]]:
    """Pairs of runs in one directory whose recorded [start, end] intervals intersect."""
    spans: dict[int, dict[str, Any]] = {}
    for run in runs:
        if run["event"] in ("start", "end"):
            spans.setdefault(run["pid"], {"cwd": run["cwd"]})[run["event"]] = run["t"]
    by_dir: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for span in spans.values():
        if "start" in span and "end" in span:
            by_dir[span["cwd"]].append((span["start"], span["end"]))
    found = []
    for cwd, intervals in by_dir.items():
        intervals.sort()
        for first, second in itertools.pairwise(intervals):
            if second[0] < first[1]:
                found.append((cwd, first, second))
    return found


def test_sigkilled_workers_leave_no_agent_and_never_two_in_one_worktree(
    pg_url: str, amqp: Amqp, tmp_path: Path
) -> None:
    seed = chaos_seed("agents")
    rng = random.Random(seed)
    runs_log = tmp_path / "runs.jsonl"
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
        queue=QueueSettings(
            # Every kind's lease short, the protocol's declared ones (2 h for build.implement) too.
            lease_seconds=dict.fromkeys(("default", *STEP_KINDS), LEASE.total_seconds()),
            rabbitmq=RabbitMqSettings(
                wait_tiers_seconds=(1, 5),
                reconcile_interval_seconds=1,
                redispatch_after_seconds=8,
                reclaim_after_seconds=5,
            ),
        ),
        worker=WorkerSettings(threads=2),
        engine=EngineSettings(
            workspace=str(tmp_path / "work"),
            command=(sys.executable, str(AGENT), str(runs_log), "0.5"),
            timeout_seconds=60,
        ),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))  # cleaned up
    connection.close()
    supervisor = Supervisor(config, processes=3)
    fleet = threading.Thread(target=supervisor.run, daemon=True)
    started = time.monotonic()
    kills = 0
    with ConnectionPool(pg_url, min_size=1, max_size=4, kwargs={"autocommit": True}) as pool:
        jobs = PostgresJobRepository(pool=pool, leases=config.queue.lease, dispatch=True)
        store = WorkflowStore(
            pool=pool, jobs=jobs, registry=Registry(DEFINITIONS), ledger=Ledger(pool)
        )
        ids = [
            store.start(
                f"ag{n:02d}",
                definition="vibey-protocol",
                input={"engine": {"name": "command", "script": SCRIPT}},
            ).workflow.id
            for n in range(WORKFLOWS)
        ]
        fleet.start()
        next_kill = time.monotonic() + 2.0
        try:
            while time.monotonic() - started < DEADLINE_S:
                for gate, _waited in store.inbox():
                    store.answer(gate.id, answer_for(gate), by="chaos")
                done = all(store.get(i).status.finished for i in ids)
                if done and kills >= KILLS:
                    break
                if done:  # more workflows, so the kills keep landing mid-attempt
                    n = len(ids)
                    given = {"engine": {"name": "command", "script": SCRIPT}}
                    ids.append(
                        store.start(
                            f"ag{n:02d}", definition="vibey-protocol", input=given
                        ).workflow.id
                    )
                if time.monotonic() >= next_kill and kills < KILLS:
                    kills += kill_a_working_worker(supervisor, str(AGENT), rng)
                    next_kill = time.monotonic() + rng.uniform(0.5, 2.5)
                time.sleep(0.1)
        finally:
            supervisor.stop()
            fleet.join(timeout=120)
        workflows = [store.get(i) for i in ids]
    deadline = time.monotonic() + 10
    while agent_processes(str(AGENT)) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = agent_processes(str(AGENT))
    runs = [json.loads(line) for line in runs_log.read_text().splitlines()]
    children = [r["child"] for r in runs if r["event"] == "child"]
    figure(
        f"agent chaos tally (seed {seed}): workflows={len(ids)} kills mid-attempt={kills} "
        f"runs={sum(r['event'] == 'start' for r in runs)} respawns={supervisor.respawns} "
        f"statuses={sorted({w.status.value for w in workflows})} "
        f"wall={time.monotonic() - started:.1f}s"
    )
    assert [r for r in runs if r["event"] == "overlap"] == []
    assert overlaps(runs) == []
    assert left == {}, f"engine processes outlived their attempts: {left}"
    assert [pid for pid in children if alive(pid)] == []
    assert kills >= KILLS, "the chaos did not happen"
    assert all(w.status is Status.COMPLETED for w in workflows), [
        (w.project_id, w.status.value, w.phase, w.reason) for w in workflows
    ]


def kill_a_working_worker(supervisor: Supervisor, marker: str, rng: random.Random) -> int:
    """SIGKILL a worker process that has an agent running (the agent's wrapper is its
    child); 1 if one was killed."""
    workers = set(supervisor.pids)
    agents = agent_processes(marker)
    wrappers = {pid: parent for pid, parent in agents.items() if parent in workers}
    if not wrappers:
        return 0
    victim = rng.choice(sorted(set(wrappers.values())))
    os.kill(victim, signal.SIGKILL)
    return 1
