"""A worktree's lease: at most one attempt works in a directory at a time.

``<dir>/.vibey/lease.lock`` is ``flock``-ed by the attempt that works there, and the lock's
file descriptor is inherited by its engine process (see :mod:`actors.agents.process`), so the
lock is held while the attempt's worker *or* any of its engine processes lives: a SIGKILLed
worker whose engine is still winding down keeps the worktree locked. ``lease.json`` beside it
says who holds it: ``{job_id, attempt, owner, pgid, started}``.

A new attempt that finds the lock held (:meth:`WorktreeLease.hold`):

* held by an older attempt of the **same job** (another lease owner: PostgreSQL's fence gave
  the job to this attempt, so the other is stale) → stops it (SIGTERM to its process group,
  ``grace``, SIGKILL) and only then starts;
* held by **another job** whose lease PostgreSQL still grants to the recorded owner
  (``fence(holder)``) → :class:`WorktreeBusy`: the handler defers without burning an attempt;
  when the fence says that job's lease is gone, it is stale too and is stopped.

``.vibey/`` holds a ``.gitignore`` of ``*``: nothing of it is ever committed.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from actors.agents.process import group_alive, kill_group

LOCK_FILE, HOLDER_FILE = "lease.lock", "lease.json"
POLL_S = 0.05


class WorktreeBusy(Exception):
    """Another job's live attempt works in this directory."""

    def __init__(self, directory: Path, holder: Holder | None) -> None:
        who = "an attempt" if holder is None else f"job {holder.job_id} attempt {holder.attempt}"
        super().__init__(f"{directory} is busy: {who} is working there")
        self.holder = holder


@dataclass(frozen=True, slots=True)
class Holder:
    job_id: str
    attempt: int
    owner: str
    pgid: int | None = None
    started: str = ""


Fence = Callable[[Holder], bool]
"""Whether PostgreSQL still grants ``holder.job_id``'s lease to ``holder.owner`` (the lease
token of the claim that started the attempt)."""


def vibey_dir(directory: Path) -> Path:
    path = directory / ".vibey"
    path.mkdir(parents=True, exist_ok=True)
    ignore = path / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n", encoding="utf-8")
    return path


@dataclass
class Held:
    """A held lease: pass ``fd`` to the engine process and call :meth:`started` with its
    process group."""

    directory: Path
    fd: int
    holder: Holder

    def started(self, pgid: int) -> None:
        self.holder = Holder(**{**asdict(self.holder), "pgid": pgid})
        _write_holder(self.directory, self.holder)


class WorktreeLease:
    def __init__(self, *, grace: float = 2.0, fence: Fence | None = None) -> None:
        self._grace = grace
        self._fence = fence

    @contextlib.contextmanager
    def hold(self, directory: Path, job_id: str, attempt: int, owner: str) -> Iterator[Held]:
        """The lease on ``directory`` for this attempt, for the ``with`` block's length."""
        lock = vibey_dir(directory) / LOCK_FILE
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        me = Holder(job_id, attempt, owner, started=datetime.now(UTC).isoformat())
        try:
            if not _try_lock(fd):
                self._take_over(directory, fd, me)
            _write_holder(directory, me)
            yield Held(directory, fd, me)
        finally:
            os.close(fd)  # releases the lock unless an engine process still holds it

    def _take_over(self, directory: Path, fd: int, me: Holder) -> None:
        holder = read_holder(directory)
        if holder is None:  # being written, or written by nothing: give it a moment
            if _wait_lock(fd, self._grace):
                return
            raise WorktreeBusy(directory, None)
        if holder.job_id == me.job_id:
            # an older attempt of this job: stale only if PostgreSQL gives the job to us
            stale = holder.owner != me.owner and self._current(me)
        else:
            stale = not self._current(holder)
        if not stale:
            raise WorktreeBusy(directory, holder)
        stop_holder(holder, self._grace)
        if not _wait_lock(fd, self._grace):
            raise WorktreeBusy(directory, holder)

    def _current(self, holder: Holder) -> bool:
        return True if self._fence is None else self._fence(holder)


def stop_holder(holder: Holder, grace: float) -> None:
    """SIGTERM to the holder's process group, ``grace`` seconds, then SIGKILL, and up to
    ``grace`` more for the group to be gone: SIGKILL lands on each process in its own time, so
    the lock (released by the first to die) would otherwise let a new attempt start beside a
    process of the old one that has not died yet. (A member left a zombie by a parent that
    never reaps it counts until that bound.)"""
    if holder.pgid is None:
        return
    kill_group(holder.pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group_alive(holder.pgid):
        time.sleep(POLL_S)
    kill_group(holder.pgid)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and group_alive(holder.pgid):
        time.sleep(POLL_S)


def read_holder(directory: Path) -> Holder | None:
    try:
        data: Any = json.loads((directory / ".vibey" / HOLDER_FILE).read_text(encoding="utf-8"))
        return Holder(**data)
    except (OSError, ValueError, TypeError):
        return None


def is_held(directory: Path) -> bool:
    """Whether some attempt (or its engine process) holds ``directory``'s lease now."""
    lock = directory / ".vibey" / LOCK_FILE
    if not lock.exists():
        return False
    fd = os.open(lock, os.O_RDWR | os.O_CLOEXEC)
    try:
        return not _try_lock(fd)
    finally:
        os.close(fd)


def _write_holder(directory: Path, holder: Holder) -> None:
    path = directory / ".vibey" / HOLDER_FILE
    staging = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
    staging.write_text(json.dumps(asdict(holder)), encoding="utf-8")
    staging.replace(path)


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _wait_lock(fd: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if _try_lock(fd):
            return True
        time.sleep(POLL_S)
    return _try_lock(fd)


def stop_all(root: Path, grace: float = 2.0) -> list[Holder]:
    """Stops every attempt that holds a lease on a directory under ``root`` (a project's
    workspace): what ``vibey workflow cancel`` does to the workflow's engine processes."""
    stopped = []
    for lock in sorted(root.glob(f"**/.vibey/{LOCK_FILE}")):
        directory = lock.parent.parent
        holder = read_holder(directory)
        if holder is not None and is_held(directory):
            stop_holder(holder, grace)
            stopped.append(holder)
    return stopped
