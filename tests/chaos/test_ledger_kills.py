"""Chaos on the ledger: 8 appender processes × 4 projects × 500 events, 20% of them SIGKILLed.

8 slots run appender processes (``ledger_appender.py``) that append 1-5 events a transaction
to the 4 projects at random, each for a short lifetime; a process that ends is replaced until
every project holds 500 events. One appender in five is doomed: it is SIGKILLed (by pid) either
mid-transaction (its rows inserted, the project's head row locked, nothing committed) or at
a random moment after its first commit. The whole run is bounded (``DEADLINE_S``).

Invariants, per project: seq is exactly 1..500 (no gap, no duplicate) and the head says 500;
every transaction an appender reported committed is there, whole; no event of a transaction
killed before its commit is there; ``vibey ledger verify`` passes.

Reproduce the choices with ``VIBEY_CHAOS_SEED=<seed printed by the run>`` (the timing of
the processes still varies).
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import psycopg
import pytest

from tests.chaos.figures import figure

pytestmark = pytest.mark.chaos

SLOTS = 8
PROJECTS = tuple(f"chaos-ledger-{i}" for i in range(4))
TARGET = 500
KILL_SHARE = 0.20
LIFETIME = (4, 14)  # transactions an appender commits before it ends (and is replaced)
DEADLINE_S = 50
APPENDER = Path(__file__).with_name("ledger_appender.py")


@dataclass
class Tally:
    spawned: int = 0
    doomed: int = 0  # doomed appenders still running
    killed_holding: int = 0
    killed_anywhere: int = 0
    full: bool = False
    committed: dict[str, list[tuple[int, int, str]]] = field(
        default_factory=lambda: defaultdict(list)
    )
    held: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def killed(self) -> int:
        return self.killed_holding + self.killed_anywhere


class Fleet:
    """Spawns appenders into free slots, dooms one in five, SIGKILLs the doomed by pid."""

    def __init__(self, url: str, seed: int) -> None:
        self.url, self.rng, self.tally = url, random.Random(seed), Tally()
        self.slots: list[subprocess.Popen[str] | None] = [None] * SLOTS
        self.pids: set[int] = set()
        self.readers: list[threading.Thread] = []

    def spawn(self, slot: int) -> None:
        t = self.tally
        doom = t.killed + t.doomed < KILL_SHARE * (t.spawned + 1)
        mode = self.rng.choice(("holding", "anywhere")) if doom else None
        lifetime = self.rng.randint(*LIFETIME)
        hold_at = self.rng.randint(1, lifetime) if mode == "holding" else 0
        if mode == "anywhere":
            lifetime = 10_000  # alive until it is killed
        proc = subprocess.Popen(
            [
                sys.executable,
                str(APPENDER),
                "--url",
                self.url,
                "--projects",
                ",".join(PROJECTS),
                "--target",
                str(TARGET),
                "--seed",
                str(self.rng.randrange(2**31)),
                "--lifetime",
                str(lifetime),
                "--hold-at",
                str(hold_at),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        with t.lock:
            t.spawned += 1
            t.doomed += 1 if mode else 0
        self.slots[slot] = proc
        self.pids.add(proc.pid)
        delay = self.rng.uniform(0.0, 0.05)
        reader = threading.Thread(target=self.read, args=(proc, mode, delay), daemon=True)
        reader.start()
        self.readers.append(reader)

    def read(self, proc: subprocess.Popen[str], mode: str | None, delay: float) -> None:
        assert proc.stdout is not None
        t = self.tally
        timer: threading.Timer | None = None
        for line in proc.stdout:
            word, *rest = line.split()
            with t.lock:
                if word == "DONE":
                    project, first, last, token = rest
                    t.committed[project].append((int(first), int(last), token))
                elif word == "FULL":
                    t.full = True
            if word == "HELD":
                os.kill(proc.pid, signal.SIGKILL)
                with t.lock:
                    t.held.add(rest[3])
                    t.killed_holding += 1
            elif word == "DONE" and mode == "anywhere" and timer is None:
                timer = threading.Timer(delay, self.kill_anywhere, args=(proc,))
                timer.start()
        proc.wait()
        proc.stdout.close()
        if proc.stdin is not None:
            with contextlib.suppress(BrokenPipeError):
                proc.stdin.close()
        if timer is not None:
            timer.join()
        with t.lock:  # killed or not (it may have found every project full first)
            t.doomed -= 1 if mode else 0

    def kill_anywhere(self, proc: subprocess.Popen[str]) -> None:
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            with self.tally.lock:
                self.tally.killed_anywhere += 1

    def run(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            running = False
            for slot, proc in enumerate(self.slots):
                if proc is not None and proc.poll() is None:
                    running = True
                elif not self.tally.full:
                    self.spawn(slot)
                    running = True
            if not running:
                return
            time.sleep(0.01)
        pytest.fail(f"the appenders did not fill the projects within {DEADLINE_S}s")

    def stop(self) -> None:
        for proc in self.slots:
            if proc is not None and proc.poll() is None:
                proc.kill()
        for proc in self.slots:
            if proc is not None:
                proc.wait(timeout=10)
        for reader in self.readers:
            reader.join(timeout=10)
        for pid in self.pids:  # every process this test started is gone, by pid
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)


def stored(url: str, project: str) -> tuple[list[tuple[int, str]], int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT seq, payload->>'token' FROM ledger_event WHERE project_id = %s ORDER BY seq",
            (project,),
        ).fetchall()
        head = conn.execute(
            "SELECT last_seq FROM ledger_head WHERE project_id = %s", (project,)
        ).fetchone()
    return [(int(s), str(t)) for s, t in rows], int(head[0]) if head else 0


def verify_all(url: str) -> list[subprocess.CompletedProcess[str]]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEY_")} | {
        "VIBEY_PG_URL": url
    }
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "vibey", "ledger", "verify", project],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for project in PROJECTS
    ]
    done = []
    for proc in procs:
        out, err = proc.communicate(timeout=30)
        done.append(subprocess.CompletedProcess(proc.args, proc.returncode, out, err))
    return done


def test_sigkilled_appenders_leave_gapless_verified_ledgers(pg_url: str) -> None:
    seed = int(os.environ.get("VIBEY_CHAOS_SEED") or random.SystemRandom().randrange(2**31))
    figure(f"\nledger chaos seed: {seed} (rerun with VIBEY_CHAOS_SEED={seed})")
    started = time.monotonic()
    fleet = Fleet(pg_url, seed)
    try:
        fleet.run(started + DEADLINE_S)
    finally:
        fleet.stop()
    elapsed = time.monotonic() - started
    t = fleet.tally
    total = TARGET * len(PROJECTS)
    figure(
        f"ledger chaos: {total} events in {elapsed:.1f}s with {SLOTS} appenders at once: "
        f"{total / elapsed:.0f} appends/s (process start-up included); {t.spawned} appender "
        f"processes, {t.killed} SIGKILLed ({t.killed / t.spawned:.0%}): {t.killed_holding} "
        f"mid-transaction holding the head, {t.killed_anywhere} at a random moment"
    )
    for project in PROJECTS:
        rows, head = stored(pg_url, project)
        assert [seq for seq, _ in rows] == list(range(1, TARGET + 1)), project
        assert head == TARGET, project
        tokens = dict(rows)
        for first, last, token in t.committed[project]:
            assert all(tokens[s] == token for s in range(first, last + 1)), (project, token)
        assert not t.held & set(tokens.values()), "a transaction killed before commit is there"
    reported = {tok for p in PROJECTS for _, _, tok in t.committed[p]}
    present = {tok for p in PROJECTS for _, tok in stored(pg_url, p)[0]}
    # what committed but was never reported (killed between commit and its DONE line) is fine
    assert reported <= present
    assert t.killed >= 0.15 * t.spawned and t.killed_holding >= 1 and t.killed_anywhere >= 1
    for project, run in zip(PROJECTS, verify_all(pg_url), strict=True):
        assert run.returncode == 0, run.stderr
        assert run.stdout.startswith(
            f"ledger of {project}: {TARGET} events, seq 1..{TARGET}, digests match"
        ), run.stdout
    assert time.monotonic() - started < 60
