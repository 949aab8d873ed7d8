"""Chaos: loop services and workers SIGKILLed at random while ten protocol workflows run on an
engine in service mode (a fake claude, tests/agents/fake_cli.py).

One `vibey loop-service` (prefetch 4) and two `vibey worker` processes; every kind's lease is
short, so a SIGKILLed worker's job comes back soon as a higher attempt, which supersedes the
run its dead predecessor left in the service. At the end: every workflow completed, every
ledger verifies, no two runs overlapped in one worktree (the fake CLI's spans), and no engine
process is left.

Reproduce with ``VIBEY_CHAOS_SEED=<seed printed by the run>``.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from actors.capabilities import detect
from actors.config import BusSettings, DatabaseSettings
from actors.runs_topology import RunsTopology
from actors.worker import WorkerConfig
from tests.acceptance.stack import VIBEY, Stack, stack
from tests.agents.fake_cli import SOURCE, install, span_key
from tests.amqp_fixtures import Amqp
from tests.chaos.figures import figure
from tests.chaos.fleet import chaos_seed
from workflows.protocol.kinds import STEP_KINDS

pytestmark = pytest.mark.chaos

WORKFLOWS = 10
KILLS = 4
LEASE_S = 10
DEADLINE_S = 540.0
# Engine runs the workflows need at the least, without a kill: each of the WORKFLOWS projects
# runs its engine steps (design to deploy, two work items) once or more.
RUNS_AT_LEAST = 80
SCRIPT = '[build]\nwork_items = [{ id = "core", title = "Core" }, { id = "cli", title = "CLI" }]\n'


@pytest.fixture
def chaos_stack(pg_url: str, amqp: Amqp, tmp_path: Path) -> Iterator[Stack]:
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))  # cleaned up
    runs = RunsTopology(amqp.prefix, ("claude",))
    amqp.queues.update(q.name for q in runs.queues(detect(connection)))
    amqp.exchanges.update(e.name for e in runs.exchanges())
    connection.close()
    with stack(pg_url, amqp.url, amqp.prefix, tmp_path) as running:
        yield running


class LoopService:
    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self.process: subprocess.Popen[bytes] | None = None
        self.started = 0

    def start(self) -> None:
        self.started += 1
        with (self.stack.logs / f"loop-{self.started}.log").open("wb") as log:
            self.process = subprocess.Popen(
                [VIBEY, "loop-service", "--engine", "claude", "--drain-grace", "5"],
                env=self.stack.env,
                cwd=self.stack.workspace.parent,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(30)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def config_toml(fake: Path, state: Path) -> str:
    leases = "\n".join(f'"{kind}" = {LEASE_S}' for kind in STEP_KINDS)
    return (
        f'[engines.claude]\nadapter = "claude-code"\nbinary = "{fake}"\ninvocation = "service"\n'
        "prefetch = 4\nqueue_wait_seconds = 20\nsupersede_grace_seconds = 1\n"
        f'timeout_seconds = 60\nenv = {{ FAKE_STATE = "{state}" }}\n'
        f'read_allow = ["{SOURCE}"]\nwrite_allow = ["{state}"]\n\n'
        f"[queue.lease_seconds]\ndefault = {LEASE_S}\n{leases}\n"
    )


def engine_processes(fake: Path) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = Path(f"/proc/{name}/stat").read_text().rpartition(")")[2].split()[0]
            if str(fake) in cmdline and state != "Z":
                found.append(int(name))
    return found


def run_starts(state: Path) -> int:
    """How many engine runs have started so far (the fake CLI's start spans)."""
    try:
        return (state / "spans.jsonl").read_text().count('"event": "start"')
    except FileNotFoundError:
        return 0


def kill_points(rng: random.Random) -> list[int]:
    """The run starts at which a process is killed: KILLS + 2 of them, at least three runs
    apart, all within the first half of the runs the workflows need."""
    spaced = sorted(rng.sample(range(RUNS_AT_LEAST // 2 // 3), KILLS + 2))
    return [2 + 3 * n for n in spaced]


def chaos_on_runs(
    stop: threading.Event,
    rng: random.Random,
    state: Path,
    service: LoopService,
    chaos_stack: Stack,
    workers: list[subprocess.Popen[bytes]],
    kills: dict[str, int],
) -> None:
    """Kill on events, not on a clock: at chosen run starts among the first ones, which come
    long before the last workflow can finish (it needs RUNS_AT_LEAST runs), so KILLS kills
    happen whatever the box's speed. Each lands while a run is going on."""
    for trigger in kill_points(rng):
        while run_starts(state) < trigger:
            if stop.wait(0.05):
                return
        if stop.wait(rng.uniform(0.0, 0.5)):
            return
        if rng.random() < 0.5:
            service.kill()
            kills["service"] += 1
            service.start()
        else:
            victim = rng.randrange(len(workers))
            chaos_stack.kill_worker(workers[victim])
            kills["worker"] += 1
            workers[victim] = chaos_stack.start_worker(processes=1, threads=4)


def overlaps(spans: list[dict[str, Any]]) -> list[tuple[str, Any, Any]]:
    """Runs of one worktree whose recorded [start, end] intervals intersect."""
    start = {span_key(s): s for s in spans if s["event"] == "start"}
    end = {span_key(s): s["at"] for s in spans if s["event"] == "end"}
    by_cwd: dict[str, list[tuple[float, float]]] = defaultdict(list)
    for pid, span in start.items():
        if pid in end:
            by_cwd[span["cwd"]].append((span["at"], end[pid]))
    found = []
    for cwd, runs in by_cwd.items():
        latest: tuple[float, float] | None = None
        for run in sorted(runs):
            if latest is not None and run[0] < latest[1]:
                found.append((cwd, latest, run))
            if latest is None or run[1] > latest[1]:
                latest = run
    return found


def test_sigkilled_loop_services_and_workers_complete_every_workflow_once(
    chaos_stack: Stack, tmp_path: Path
) -> None:
    seed = chaos_seed("loop-services")
    rng = random.Random(seed)
    fakes = install(tmp_path / "bin")
    state = tmp_path / "fake-state"
    chaos_stack.config = tmp_path / "vibey.toml"
    chaos_stack.config.write_text(config_toml(fakes["claude"], state))
    (tmp_path / "script.toml").write_text(SCRIPT)
    service = LoopService(chaos_stack)
    service.start()
    kills = {"service": 0, "worker": 0}
    stop = threading.Event()
    try:
        deadline = time.monotonic() + 60
        while chaos_stack.vibey("doctor", "--conformance", "--record", check=False).returncode:
            assert time.monotonic() < deadline, "the conformance check never passed"
            time.sleep(1)
        workers = [chaos_stack.start_worker(processes=1, threads=4) for _ in range(2)]
        projects = [f"lc{n:02d}" for n in range(WORKFLOWS)]
        script = str(tmp_path / "script.toml")
        start = ("workflow", "start", "--engines", "claude", "--script", script)
        with ThreadPoolExecutor(max_workers=4) as starting:  # as several people would
            list(starting.map(lambda p: chaos_stack.vibey(*start[:2], p, *start[2:]), projects))

        killer = threading.Thread(
            target=chaos_on_runs,
            args=(stop, rng, state, service, chaos_stack, workers, kills),
            daemon=True,
        )
        killer.start()
        began = time.monotonic()
        finished = chaos_stack.drive(projects, deadline_s=DEADLINE_S)
        stop.set()
        killer.join(60)
        statuses = {p: finished[p]["workflow"]["status"] for p in projects}
        with ThreadPoolExecutor(max_workers=4) as verifying:
            verified = list(
                verifying.map(lambda p: chaos_stack.vibey("ledger", "verify", p), projects)
            )
        for project, done in zip(projects, verified, strict=True):
            assert "digests match" in done.stdout, (project, done.stdout)
    finally:
        stop.set()
        service.stop()
    spans = [json.loads(x) for x in (state / "spans.jsonl").read_text().splitlines()]
    ended = {span_key(s) for s in spans if s["event"] == "end"}
    unended = {span_key(s) for s in spans if s["event"] == "start"} - ended  # killed mid-run
    figure(
        f"loop-service chaos tally (seed {seed}): kills={kills} services={service.started} "
        f"runs={sum(s['event'] == 'start' for s in spans)} "
        f"unended={len(unended)} "
        f"wall={time.monotonic() - began:.1f}s"
    )
    assert set(statuses.values()) == {"completed"}, statuses
    assert overlaps(spans) == []
    deadline = time.monotonic() + 15
    while engine_processes(fakes["claude"]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert engine_processes(fakes["claude"]) == [], "an engine process outlived its run"
    assert sum(kills.values()) >= KILLS, f"the chaos did not happen: {kills}"
