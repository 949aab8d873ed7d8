"""A vibey stack for end-to-end tests: `vibey worker` fleets and the `vibey` command, run as
processes against the test's own database and broker namespace (a command forked from a
process that imported the CLI once, where :data:`FORKED_CLI` is set: tests/cli_fork.py).

Everything a test starts is stopped by pid (process group) when the test ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.cli_fork import forked_cli

REPO = Path(__file__).resolve().parents[2]
VIBEY = str(Path(sys.executable).with_name("vibey"))
DEMO_SCRIPT = REPO / "ops" / "demo" / "demo.toml"

# What `gate list`, `workflow list` and `workflow status` show, as one digest: the workflows'
# progress, the gates' answers and the steps' states.
MARK = """
SELECT md5(concat_ws('|',
    (SELECT string_agg(concat_ws(':', id, status, phase, cycle, last_seq, applied_seq), ','
                       ORDER BY id) FROM workflow),
    (SELECT string_agg(concat_ws(':', id, answered_at, escalated_at, reminded), ','
                       ORDER BY id) FROM gate),
    (SELECT string_agg(concat_ws(':', id, state, attempts), ',' ORDER BY id) FROM job)))
"""
# A command runs forked from a process that imported the CLI (tests/cli_fork.py) where this is
# set: the acceptance and real-CLI tests set it (:func:`forked_commands`, autouse in their
# conftest.py); the workers always start as `vibey worker` processes of their own.
FORKED_CLI = False
REREAD_S = 3.0  # the CLI reads again after this long even when the digest did not change

Answerer = Callable[[Mapping[str, Any]], str | None]


@pytest.fixture(autouse=True)  # autouse where a conftest.py imports it
def forked_commands(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stack's `vibey` commands fork from a process that imported the CLI once
    (tests/cli_fork.py): each is still a process, without an interpreter's start."""
    monkeypatch.setattr(sys.modules[__name__], "FORKED_CLI", True)


def cooperative(gate: Mapping[str, Any], *, deploy: bool = False, visual: bool = False) -> str:
    """The answer a cooperative person gives: accept, decline the opt-ins (unless asked to
    opt in), retry a failed step, and answer a free question with some text."""
    name, answers = gate.get("name") or "", list(gate.get("answers") or [])
    if gate.get("kind") == "review_feedback":
        return "accept"
    if gate.get("kind") == "ladder_exhausted":
        return "2"  # grant two more attempts at the ladder's top
    if name == "deployment.opt_in":
        return "yes" if deploy else "no"
    if name == "visual.opt_in":
        return "yes" if visual else "no"
    for preferred in ("accept", "retry", "yes"):
        if preferred in answers:
            return preferred
    return answers[0] if answers else "an answer from the test"


@dataclass
class Stack:
    pg_url: str
    amqp_url: str
    prefix: str
    workspace: Path
    logs: Path
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    config: Path | None = None  # a vibey.toml for every command and worker
    extra_env: dict[str, str] = field(default_factory=dict)  # for every command and worker
    _logs: list[Any] = field(default_factory=list)
    _db: psycopg.Connection[Any] | None = None  # for :meth:`_mark`

    @property
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEY_")}
        return (
            env
            | {
                "VIBEY_PG_URL": self.pg_url,
                "VIBEY_AMQP_URL": self.amqp_url,
                "VIBEY_BUS_PREFIX": self.prefix,
                "VIBEY_QUEUE_RECONCILE_INTERVAL": "1",
                "VIBEY_QUEUE_REDISPATCH_AFTER": "5",
                "VIBEY_QUEUE_RECLAIM_AFTER": "5",
                "VIBEY_ENGINE_WORKSPACE": str(self.workspace),
                "VIBEY_CONFIG": str(self.config) if self.config else "",
                "VIBEY_WORKFLOW_REVIEW_FEEDBACK": "false",  # unattended unless a test opts in
            }
            | self.extra_env
        )

    def vibey(
        self, *args: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess[str]:
        if FORKED_CLI:
            done = forked_cli().run(args, cwd=self.workspace.parent, env=self.env, timeout=timeout)
        else:
            done = subprocess.run(
                [VIBEY, *args],
                env=self.env,
                cwd=self.workspace.parent,
                capture_output=True,
                text=True,
                timeout=timeout,
            )
        if check and done.returncode != 0:
            raise AssertionError(
                f"vibey {' '.join(args)} exited {done.returncode}: {done.stderr.strip()}"
            )
        return done

    def json(self, *args: str) -> Any:
        return json.loads(self.vibey(*args, "--json").stdout)

    def every(self, *args: str) -> list[Any]:
        """Every row of a list command: ``--all --json`` prints one JSON object a line."""
        return [
            json.loads(line) for line in self.vibey(*args, "--all", "--json").stdout.splitlines()
        ]

    def start_worker(
        self, *args: str, processes: int = 1, threads: int = 8
    ) -> subprocess.Popen[bytes]:
        log = (self.logs / f"worker-{len(self.workers)}.log").open("wb")
        self._logs.append(log)
        proc = subprocess.Popen(
            [VIBEY, "worker", "--processes", str(processes), "--threads", str(threads), *args],
            env=self.env,
            cwd=self.workspace.parent,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: killed as one
        )
        self.workers.append(proc)
        return proc

    def kill_worker(self, proc: subprocess.Popen[bytes], sig: int = signal.SIGKILL) -> None:
        """``sig`` to the worker's process group, then wait for its supervisor. Nothing is sent
        to one already reaped: its id is free, and the box's pids wrap within minutes under the
        suite (32,768 of them), so a group of that id may be another test's: a fake engine in a
        session of its own was seen killed by signal 9 mid-conformance, the likely cause."""
        if proc.poll() is not None:
            return
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)

    def stop(self) -> None:
        for proc in self.workers:
            if proc.poll() is None:
                self.kill_worker(proc, signal.SIGTERM)
                # SIGTERM stops the supervisor; make sure its children are gone too (at once:
                # the id was the group's a moment ago, not reused yet).
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        for log in self._logs:
            log.close()
        if self._db is not None:
            self._db.close()

    def worker_log(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-4000:] for p in self.logs.glob("*.log"))

    # -- driving workflows through the CLI ----------------------------------------------------

    def status(self, project: str) -> Any:
        return self.json("workflow", "status", project)

    def open_gates(self, project: str | None = None) -> list[Any]:
        args = ("gate", "list") + (("--project", project) if project else ())
        gates: list[Any] = self.json(*args)["gates"]
        return gates

    def drive(
        self,
        projects: list[str],
        answer: Answerer = cooperative,
        *,
        deadline_s: float = 180,
        until: Callable[[Any], bool] | None = None,
    ) -> dict[str, Any]:
        """Answer every open gate of ``projects`` with ``answer`` until each workflow is
        finished (or ``until(status)`` holds, or ``answer`` returns None for a gate).

        The gates and the workflows are read through the ``vibey`` command, after each
        change of the rows they show (:meth:`_mark`, one query), and every few seconds even
        without one: a read command costs a process start, which polling at a fixed pace
        paid several times a second for the whole run."""
        done: dict[str, Any] = {}
        answered: list[tuple[str, str, str]] = []
        started = time.monotonic()
        seen, read_at = None, 0.0
        while len(done) < len(projects):
            if time.monotonic() - started > deadline_s:
                states = {p: self.status(p)["workflow"] for p in projects if p not in done}
                raise AssertionError(
                    f"not finished in {deadline_s}s: {states}\nanswered: {answered}\n"
                    f"{self.worker_log()}"
                )
            mark = self._mark()
            if mark is not None and mark == seen and time.monotonic() - read_at < REREAD_S:
                time.sleep(0.1)
                continue
            seen, read_at = mark, time.monotonic()
            waiting = [p for p in projects if p not in done]
            replies = self._answer_gates(waiting, answer, done)
            answered += [(g["project"], g["name"] or g["kind"], r) for g, r in replies]
            self._collect_finished(waiting, until, done)
            if not replies:
                time.sleep(0.2)
        return done

    def _mark(self) -> str | None:
        """A digest of what the CLI's reads show (workflows, gates, steps): when it is the
        same, so is what they would print. None when the database does not answer."""
        try:
            if self._db is None or self._db.closed:
                self._db = psycopg.connect(self.pg_url, autocommit=True, connect_timeout=5)
            row = self._db.execute(MARK).fetchone()
        except psycopg.Error:
            self._db = None
            return None
        return None if row is None else str(row[0])

    def _answer_gates(
        self, projects: list[str], answer: Answerer, done: dict[str, Any]
    ) -> list[tuple[Any, str]]:
        replies: list[tuple[Any, str]] = []
        for gate in self.open_gates():
            if gate["project"] not in projects:
                continue
            reply = answer(gate)
            if reply is None:
                done[gate["project"]] = self.status(gate["project"])
            else:
                replies.append((gate, reply))
        with ThreadPoolExecutor(max_workers=4) as pool:  # as several people would
            list(pool.map(lambda r: self.vibey("gate", "answer", r[0]["id"], r[1]), replies))
        return replies

    def _collect_finished(
        self, projects: list[str], until: Callable[[Any], bool] | None, done: dict[str, Any]
    ) -> None:
        finished = {
            wf["project"]
            for wf in self.json("workflow", "list", "--limit", "1000")["workflows"]
            if wf["status"] in ("completed", "failed", "cancelled")
        }
        for project in projects:
            if project in done:
                continue
            if project in finished:
                done[project] = self.status(project)
            elif until is not None:
                status = self.status(project)
                if until(status):
                    done[project] = status


def declare_topology(pg_url: str, amqp: Any) -> None:
    """Declare the fleet's topology in the test's broker namespace (the fixture cleans it up)."""
    from actors.capabilities import detect
    from actors.config import BusSettings, DatabaseSettings
    from actors.worker import WorkerConfig

    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))
    connection.close()


@contextmanager
def stack(pg_url: str, amqp_url: str, prefix: str, tmp: Path) -> Iterator[Stack]:
    (tmp / "work").mkdir()
    (tmp / "logs").mkdir()
    running = Stack(pg_url, amqp_url, prefix, tmp / "work", tmp / "logs")
    try:
        yield running
    finally:
        running.stop()
