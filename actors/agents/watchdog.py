"""The loop service's watchdog: a supervising parent that restarts a wedged or crashed service.

``vibey loop-service`` runs as two processes. The parent (:class:`Watchdog`) starts the
service itself as a child (``vibey loop-service ... --watched-by <parent pid> --heartbeat
<file>``) in a session of its own and watches two things:

* **its exit**: a child that exits while the parent is not stopping (a crash, a SIGKILL, an
  exit code other than 0) is started again;
* **its heartbeat**: the service's I/O loop ticks :class:`Heartbeat` (at most once a second)
  with ``time.monotonic()`` (a system-wide clock on Linux, so two processes compare it) and
  the process groups of its runs. A heartbeat older than ``stale_after`` seconds (counted
  from the child's start until its first beat) means the service is wedged: its process
  group is sent SIGTERM, then SIGKILL after ``grace`` seconds; the run groups its last beat
  named are killed the same way (no engine process is left), and the child is started again.

Restarts back off (:data:`BACKOFF`: 1 s doubling to 30 s, back to 1 s once a child has run
for ``stale_after``), each logged at WARNING with its cause. SIGTERM and SIGINT are passed on
to the child, which drains; the parent then exits as the child did. The child dies with the
parent (``PR_SET_PDEATHSIG``), so a SIGKILLed parent leaves no service behind.

:func:`heartbeat_age` is the one staleness check: the watchdog's and the pod's liveness probe
(``/healthz`` answers 503 while the heartbeat is stale, :meth:`Watchdog.healthy`); the
readiness probe's ``/readyz`` also answers 503 while the engine's binary is not found
(:meth:`Watchdog.ready`).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from actors.agents.process import group_alive, kill_group

log = logging.getLogger("vibey.loop_service.watchdog")
BEAT_EVERY_S = 1.0
POLL_S = 0.25
PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class Backoff:
    """A restart's delay: ``first`` doubling up to ``most``."""

    first: float = 1.0
    most: float = 30.0

    def delay(self, restarts: int) -> float:
        return float(min(self.most, self.first * 2 ** max(0, restarts - 1)))


BACKOFF = Backoff()


class Heartbeat:
    """The service's side: :meth:`beat` writes ``{"monotonic", "pid", "groups"}`` to ``path``
    (staged and renamed, so a reader never sees half a beat), at most every ``every`` s."""

    def __init__(self, path: Path, *, every: float = BEAT_EVERY_S) -> None:
        self.path = path
        self._every = every
        self._last = -float("inf")

    def beat(self, groups: Iterable[int] = (), *, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < self._every:
            return
        self._last = now
        body = {"monotonic": now, "pid": os.getpid(), "groups": sorted(set(groups))}
        staging = self.path.with_suffix(f".{os.getpid()}.tmp")
        with contextlib.suppress(OSError):
            staging.write_text(json.dumps(body), encoding="utf-8")
            staging.replace(self.path)


def read_beat(path: Path) -> dict[str, object] | None:
    try:
        beat = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return beat if isinstance(beat, dict) else None


def heartbeat_age(path: Path, *, since: float | None = None) -> float:
    """Seconds since the last beat in ``path``; with no beat yet, since ``since`` (a
    ``time.monotonic()`` value: the child's start), else infinity."""
    beat = read_beat(path)
    at = beat.get("monotonic") if beat is not None else None
    if isinstance(at, int | float):
        return max(0.0, time.monotonic() - float(at))
    return time.monotonic() - since if since is not None else float("inf")


def die_with_parent(parent: int) -> None:
    """In the child: SIGKILL when ``parent`` dies; exit now when it is already gone."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:
        raise SystemExit(f"vibey loop-service: its watchdog (pid {parent}) is gone")


class Watchdog:
    """Runs ``command(heartbeat_path)`` as the service and keeps it alive (module docstring)."""

    def __init__(
        self,
        *,
        command: Callable[[Path], Sequence[str]],
        heartbeat: Path,
        stale_after: float = 60.0,
        grace: float = 5.0,
        stop_wait: float = 120.0,
        backoff: Backoff = BACKOFF,
        env: dict[str, str] | None = None,
        can_run: Callable[[], bool] | None = None,
    ) -> None:
        """``can_run``: whether the service can run its engine now (its binary is found);
        :meth:`ready` is false while it says no."""
        self._command = command
        self._can_run = can_run
        self.heartbeat = heartbeat
        self.stale_after = stale_after
        self._grace = grace
        self._stop_wait = stop_wait
        self._backoff = backoff
        self._env = env
        self.child: subprocess.Popen[bytes] | None = None
        self.restarts = 0
        self._started = time.monotonic()

    def healthy(self) -> bool:
        """The liveness probe: the child's heartbeat is fresh (the same check as the
        watchdog's)."""
        return heartbeat_age(self.heartbeat, since=self._started) <= self.stale_after

    def ready(self) -> bool:
        """The readiness probe: live, and able to run its engine (a pod whose image lacks
        the engine's CLI is never ready, so no rollout completes with it)."""
        return self.healthy() and (self._can_run is None or self._can_run())

    def run(self, stop: threading.Event) -> int:
        """Keeps a child running until ``stop``; then passes SIGTERM on and returns the last
        child's exit code (0 when it drained cleanly)."""
        failures = 0
        while True:
            child = self._start()
            why = self._watch(child, stop)
            if why is None:  # stopping
                return self._stopped(child)
            ran_for = time.monotonic() - self._started
            failures = 1 if ran_for >= self.stale_after else failures + 1
            self.restarts += 1
            delay = self._backoff.delay(failures)
            log.warning(
                "loop service (pid %d) %s; restart %d in %.1f s",
                child.pid,
                why,
                self.restarts,
                delay,
            )
            if stop.wait(delay):
                return 0

    def _start(self) -> subprocess.Popen[bytes]:
        with contextlib.suppress(OSError):
            self.heartbeat.unlink()
        self._started = time.monotonic()
        self.child = subprocess.Popen(
            list(self._command(self.heartbeat)), env=self._env, start_new_session=True
        )
        log.info("loop service started (pid %d)", self.child.pid)
        return self.child

    def _watch(self, child: subprocess.Popen[bytes], stop: threading.Event) -> str | None:
        """Why ``child`` must be restarted; None once ``stop`` is set."""
        while not stop.wait(POLL_S):
            code = child.poll()
            if code is not None:
                self._kill_runs()
                return f"exited with {code}"
            age = heartbeat_age(self.heartbeat, since=self._started)
            if age > self.stale_after:
                self._kill(child)
                return (
                    f"is wedged (no heartbeat for {age:.1f} s, the limit is {self.stale_after:g})"
                )
        return None

    def _kill(self, child: subprocess.Popen[bytes]) -> None:
        """SIGTERM to the child's group, ``grace``, SIGKILL; then the same for its runs."""
        kill_group(child.pid, signal.SIGTERM)
        try:
            child.wait(self._grace)
        except subprocess.TimeoutExpired:
            kill_group(child.pid)
            child.wait()
        kill_group(child.pid)  # whatever of its group is left
        self._kill_runs()

    def _kill_runs(self) -> None:
        beat = read_beat(self.heartbeat) or {}
        groups = [g for g in beat.get("groups", []) or [] if isinstance(g, int) and g > 1]  # type: ignore[attr-defined]
        for group in groups:
            kill_group(group, signal.SIGTERM)
        deadline = time.monotonic() + self._grace
        while groups and time.monotonic() < deadline and any(group_alive(g) for g in groups):
            time.sleep(0.05)
        for group in groups:
            kill_group(group)

    def _stopped(self, child: subprocess.Popen[bytes]) -> int:
        with contextlib.suppress(ProcessLookupError):
            child.send_signal(signal.SIGTERM)
        try:
            return child.wait(self._stop_wait)
        except subprocess.TimeoutExpired:
            log.warning("loop service (pid %d) did not drain in time; killed", child.pid)
            self._kill(child)
            return 1
