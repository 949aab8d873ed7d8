"""`vibey loop-service` as a process: SIGTERM drains it, and a SIGKILLed service's run is
abandoned (its engine process dies with it) so a restarted service runs the next attempt
alone in the worktree."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from actors.agents import EngineTask
from actors.agents.adapters import engine_for
from actors.agents.roster import AgentSpec
from actors.agents.run_client import RunClient, RunCut
from actors.capabilities import detect
from actors.runs_topology import RunsTopology
from tests.agents.fake_cli import SOURCE, host_pid, install
from tests.amqp_fixtures import Amqp
from workflows.runs import RunResult, RunStatus, decode

ENGINE = "claude"


class Services:
    """Starts `vibey loop-service` processes; kills what is left at teardown (by pid)."""

    def __init__(self, amqp: Amqp, tmp_path: Path) -> None:
        fakes = install(tmp_path / "bin")
        self.state = tmp_path / "fake"
        self.state.mkdir()
        self.root = tmp_path / "work"
        self.root.mkdir()
        config = tmp_path / "vibey.toml"
        config.write_text(
            f"[engines.{ENGINE}]\n"
            'adapter = "claude-code"\n'
            f'binary = "{fakes["claude"]}"\n'
            'invocation = "service"\n'
            "queue_wait_seconds = 30\n"
            "supersede_grace_seconds = 1\n"
            f'env = {{ FAKE_STATE = "{self.state}" }}\n'
            f'read_allow = ["{SOURCE}"]\nwrite_allow = ["{self.state}"]\n'
        )
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(tmp_path),
            "VIBEY_CONFIG": str(config),
            "VIBEY_AMQP_URL": amqp.url,
            "VIBEY_BUS_PREFIX": amqp.prefix,
            "VIBEY_ENGINE_WORKSPACE": str(self.root),
        }
        self.spec = AgentSpec(
            id=ENGINE, adapter="claude-code", binary=str(fakes["claude"]), invocation="service",
            queue_wait_seconds=30, supersede_grace_seconds=1,
        )  # fmt: skip
        topology = RunsTopology(amqp.prefix, (ENGINE,))
        amqp.queues.update(q.name for q in topology.queues(detect(amqp.connect())))
        amqp.exchanges.update(e.name for e in topology.exchanges())
        self.client = RunClient(amqp.url, topology)
        self.amqp = amqp
        self.topology = topology
        self.processes: list[subprocess.Popen[bytes]] = []
        self.log = tmp_path / "service.log"

    def start(self, drain_grace: float = 2.0, *flags: str) -> subprocess.Popen[bytes]:
        with self.log.open("ab") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "vibey", "loop-service", "--engine", ENGINE,
                 "--drain-grace", str(drain_grace), *flags],
                env=self.env, stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip
        self.processes.append(process)
        self._wait_consumer()
        return process

    def _wait_consumer(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            channel = self.amqp.connect().channel()
            with contextlib.suppress(Exception):
                frame = channel.queue_declare(self.topology.queue(ENGINE), passive=True)
                if frame.method.consumer_count > 0:
                    return
            time.sleep(0.2)
        pytest.fail(f"the loop service never consumed: {self.log.read_text()[-2000:]}")

    def engine(self) -> Any:
        return engine_for(self.spec, worker_env={}, state_dir=self.root / ".w", runs=self.client)

    def spans(self) -> list[dict[str, Any]]:
        path = self.state / "spans.jsonl"
        return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []

    def stop_all(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
            process.wait(30)


@pytest.fixture
def services(amqp: Amqp, tmp_path: Path) -> Iterator[Services]:
    services = Services(amqp, tmp_path)
    try:
        yield services
    finally:
        services.stop_all()
        for span in services.spans():  # no engine process outlives the test
            pid = host_pid(span)
            with contextlib.suppress(ProcessLookupError):
                if pid is not None:
                    os.kill(pid, signal.SIGKILL)


def task(workdir: Path, attempt: int, sleep: float) -> EngineTask:
    step_input = {"answers": {}, "engine": {"name": "svc"}, "fake_sleep": sleep}
    return EngineTask(
        "design.research", "demo", 0, "core", attempt, step_input, None,
        workdir=workdir, job_id="job-1",
    )  # fmt: skip


def in_thread(target: Any, *args: Any) -> tuple[threading.Thread, list[Any]]:
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(target(*args))
        except Exception as exc:  # noqa: BLE001 - the test reads it
            out.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, out


def alive(pid: int | None) -> bool:
    if pid is None:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(OSError), open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0] != "Z"
    return False


def wait_for(predicate: Any, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.05)


def results(workdir: Path) -> list[RunResult]:
    found = [decode(p.read_bytes()) for p in (workdir / ".vibey/diagnostics").glob("*.result.json")]
    return [r for r in found if isinstance(r, RunResult)]


def test_sigterm_drains_the_service_and_cuts_a_long_run_at_the_grace(services: Services) -> None:
    process = services.start(drain_grace=2.0)
    workdir = services.root / "wt"
    workdir.mkdir()
    thread, out = in_thread(services.engine().run, task(workdir, 1, sleep=60))
    wait_for(lambda: any(s["event"] == "start" for s in services.spans()))
    pid = host_pid(services.spans()[0])
    began = time.monotonic()
    process.send_signal(signal.SIGTERM)
    assert process.wait(30) == 0
    assert time.monotonic() - began < 15
    thread.join(30)
    cut = out[0]
    assert isinstance(cut, RunCut), cut  # the step defers: no attempt burned, no circuit failure
    assert "abandoned" in str(cut) and "drained" in str(cut)
    assert not alive(pid), "the engine process outlived the drained service"


def test_a_sigkilled_service_abandons_its_run_and_the_next_attempt_runs_alone(
    services: Services,
) -> None:
    first = services.start()
    workdir = services.root / "wt"
    workdir.mkdir()
    old, old_out = in_thread(services.engine().run, task(workdir, 1, sleep=60))
    wait_for(lambda: any(s["event"] == "start" for s in services.spans()))
    old_pid = host_pid(services.spans()[0])
    first.kill()
    first.wait(10)
    wait_for(lambda: not alive(old_pid), 15)  # it died with its service
    died_at = time.time()
    services.start()  # the redelivered attempt 1 is abandoned, never run again
    old.join(60)
    assert isinstance(old_out[0], RunCut) and "abandoned" in str(old_out[0])
    new = services.engine().run(task(workdir, 2, sleep=0))
    assert new.status == "ok", new.detail
    starts = [s for s in services.spans() if s["event"] == "start"]
    assert len(starts) == 2  # attempt 1 once, attempt 2 once
    assert starts[1]["at"] >= died_at - 0.5
    assert sorted(r.status for r in results(workdir)) == [RunStatus.ABANDONED, RunStatus.EXITED]


def children(services: Services) -> list[int]:
    """The service processes the watchdog started, in order (from its log)."""
    text = services.log.read_text(errors="replace")
    return [int(m) for m in re.findall(r"loop service started \(pid (\d+)\)", text)]


def test_the_watchdog_restarts_a_wedged_service_which_then_serves_a_run(
    services: Services,
) -> None:
    watchdog = services.start(2.0, "--stale-after", "3")
    wait_for(lambda: len(children(services)) == 1)
    (wedged,) = children(services)
    workdir = services.root / "wt"
    workdir.mkdir()
    old, old_out = in_thread(services.engine().run, task(workdir, 1, sleep=60))
    wait_for(lambda: any(s["event"] == "start" for s in services.spans()))
    engine_pid = host_pid(services.spans()[0])
    os.kill(wedged, signal.SIGSTOP)  # wedged: alive, holding its deliveries, answering nothing
    wait_for(lambda: len(children(services)) == 2, 30)
    assert "is wedged (no heartbeat" in services.log.read_text()
    wait_for(lambda: not alive(wedged), 15)
    wait_for(lambda: not alive(engine_pid), 15)  # no engine process outlives the wedged service
    assert watchdog.poll() is None
    services._wait_consumer()
    old.join(60)
    assert isinstance(old_out[0], RunCut), old_out  # the redelivered attempt 1: abandoned
    new = services.engine().run(task(workdir, 2, sleep=0))
    assert new.status == "ok", new.detail
    assert [s["event"] for s in services.spans()].count("start") == 2
    watchdog.send_signal(signal.SIGTERM)
    assert watchdog.wait(30) == 0
    assert not any(alive(pid) for pid in children(services))


def test_the_watchdog_restarts_a_crashed_service(services: Services) -> None:
    watchdog = services.start(2.0, "--stale-after", "30")
    wait_for(lambda: len(children(services)) == 1)
    os.kill(children(services)[0], signal.SIGKILL)
    wait_for(lambda: len(children(services)) == 2, 30)
    assert "exited with -9; restart 1" in services.log.read_text()
    services._wait_consumer()
    workdir = services.root / "wt"
    workdir.mkdir()
    assert services.engine().run(task(workdir, 1, sleep=0)).status == "ok"
    watchdog.kill()  # the service dies with its watchdog
    wait_for(lambda: not alive(children(services)[1]), 15)


def engine_list(services: Services, *flags: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "vibey", "engine", "list", *flags],
        env=services.env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_engine_list_shows_the_loop_service_and_a_probe(services: Services) -> None:
    services.start()
    (row,) = json.loads(engine_list(services, "--json"))["engines"]
    assert row["invocation"] == "service"
    service = row["service"]
    assert service["consumers"] == 1 and service["queued"] == 0
    assert service["probe"].startswith("exited: claude 9.9.9"), row
    assert service["probe_seconds"] < 1.0 and service["probe_at"]
    assert service["in_flight"] == [] and service["previous_probe"] is None


def test_engine_list_shows_the_runs_in_flight_and_the_probe_before(services: Services) -> None:
    services.start()
    workdir = services.root / "wt"
    workdir.mkdir()
    thread, _out = in_thread(services.engine().run, task(workdir, 1, sleep=20))
    wait_for(lambda: any(s["event"] == "start" for s in services.spans()))
    (started,) = (workdir / ".vibey/diagnostics").glob("*.started")
    run_id = started.name.removesuffix(".started")
    (first,) = json.loads(engine_list(services, "--json"))["engines"]
    (row,) = json.loads(engine_list(services, "--json"))["engines"]
    service = row["service"]
    assert [r["run_id"] for r in service["in_flight"]] == [run_id]
    assert service["in_flight"][0]["cwd"] == str(workdir.resolve())
    assert service["in_flight"][0]["started_at"]
    assert service["instance"]
    assert service["previous_probe"]["outcome"].startswith("exited: claude 9.9.9")
    assert service["previous_probe"]["at"] >= first["service"]["probe_at"]
    table = engine_list(services)
    assert "1 in flight" in table and f"run {run_id} in {workdir.resolve()}" in table
    assert "last probe at " in table and "probe before it: " in table
    engine = host_pid(services.spans()[0])
    assert engine is not None
    os.kill(engine, signal.SIGKILL)  # the run ends; the fixture stops all
    thread.join(30)


def test_engine_list_without_an_answer_leaves_the_runs_in_flight_unknown(
    services: Services,
) -> None:
    process = services.start()
    os.kill(process.pid, signal.SIGSTOP)  # the watchdog; its child next
    for child in children(services):
        os.kill(child, signal.SIGSTOP)
    try:
        (row,) = json.loads(engine_list(services, "--json"))["engines"]
        assert row["service"]["probe"] == "no answer within 2 s"
        assert row["service"]["in_flight"] is None and row["service"]["probe_at"]
        assert "in flight unknown (no answer)" in engine_list(services)
    finally:
        for pid in [process.pid, *children(services)]:
            os.kill(pid, signal.SIGCONT)
