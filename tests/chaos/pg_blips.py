"""What the PostgreSQL blip tests share: a `vibey worker` fleet in a subprocess, an in-process
starter (store + relay) for the workflows, a backend killer confined to one database, and the
completion curve they print.

The killer only ever terminates backends of the test's own database
(``WHERE datname = <that db> AND pid <> pg_backend_pid()``): other tests share the server.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg

REPO = Path(__file__).resolve().parents[2]
VIBEY = str(Path(sys.executable).with_name("vibey"))

KILL_BACKENDS = """
SELECT now(), count(pg_terminate_backend(pid))
FROM pg_stat_activity
WHERE datname = %s AND pid <> pg_backend_pid()
"""


def database_of(url: str) -> str:
    return urlsplit(url).path.lstrip("/")


def worker_env(
    pg_url: str, amqp_url: str, prefix: str, extra: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The environment of a `vibey worker` with the queue settings at their defaults (the
    lost-dispatch sweep at 120 s, the reconciler every 30 s): what an operator runs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEY_")}
    return env | {
        "VIBEY_PG_URL": pg_url,
        "VIBEY_AMQP_URL": amqp_url,
        "VIBEY_BUS_PREFIX": prefix,
        "PYTHONPATH": str(REPO),  # the test definitions and handlers live under tests/
        **(extra or {}),
    }


@contextmanager
def vibey_worker(
    env: Mapping[str, str], log: Path, *, processes: int = 2, threads: int = 4
) -> Iterator[subprocess.Popen[bytes]]:
    """`vibey worker` in its own process group, stopped (then killed) by pid at the end."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [VIBEY, "worker", "--processes", str(processes), "--threads", str(threads)],
            env=dict(env),
            cwd=REPO,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            yield proc
        finally:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            with suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=60)
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


@contextmanager
def held(proc: subprocess.Popen[bytes]) -> Iterator[None]:
    """The fleet of :func:`vibey_worker` (its whole process group) stopped (SIGSTOP) for the
    block and continued (SIGCONT) after it: what it has under way stays under way."""
    os.killpg(proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGCONT)


@dataclass
class Killer:
    """Rounds of ``pg_terminate_backend`` on one database's backends, in a thread."""

    admin_url: str
    database: str
    min_rounds: int = 10
    min_kills: int = 100
    max_rounds: int = 60
    pause_s: float = 0.4
    rounds: list[tuple[datetime, int]] = field(default_factory=list)
    # While set, the rounds go on past their minimums (bounded by max_rounds).
    keep_going: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def kills(self) -> int:
        return sum(n for _, n in self.rounds)

    @property
    def enough(self) -> bool:
        """Both minimums reached."""
        return len(self.rounds) >= self.min_rounds and self.kills >= self.min_kills

    @property
    def last_kill(self) -> datetime:
        return self.rounds[-1][0]

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="pg-killer", daemon=True)
        self._thread.start()

    def join(self, timeout: float = 120.0) -> None:
        assert self._thread is not None
        self._thread.join(timeout)

    def _run(self) -> None:
        with psycopg.connect(self.admin_url, autocommit=True) as conn:
            while len(self.rounds) < self.max_rounds:
                if self.enough and not self.keep_going.is_set():
                    return
                row = conn.execute(KILL_BACKENDS, (self.database,)).fetchone()
                assert row is not None
                self.rounds.append((row[0], int(row[1])))
                time.sleep(self.pause_s)


def sample(url: str, query: str) -> tuple[datetime, int] | None:
    """(database now, count) on a fresh connection; None while it does not answer."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=2) as conn:
            row = conn.execute(f"SELECT now(), ({query})".encode()).fetchone()
    except psycopg.OperationalError:
        return None
    return None if row is None else (row[0], int(row[1]))


def scalar(url: str, query: str) -> Any:
    with psycopg.connect(url, autocommit=True, connect_timeout=5) as conn:
        row = conn.execute(query.encode()).fetchone()
    return None if row is None else row[0]


def curve(points: list[tuple[datetime, int]], origin: datetime, *, step_s: float = 1.0) -> str:
    """``+Ns:count`` per ``step_s`` bucket (its last sample), origin at 0; a bucket that
    repeats the one before is left out (a flat stretch reads as a gap in the seconds)."""
    buckets: dict[int, int] = {}
    for at, done in points:
        buckets[int((at - origin).total_seconds() // step_s)] = done
    shown, previous = [], None
    for k, v in sorted(buckets.items()):
        if v != previous:
            shown.append(f"+{int(k * step_s)}s:{v}")
        previous = v
    return " ".join(shown)
