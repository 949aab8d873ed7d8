"""Starting an engine process so that it never outlives the attempt that owns it.

:func:`run_supervised` starts ``argv`` under the supervising wrapper
(:mod:`actors.agents.supervise`, run as a script) in a new session: the wrapper leads the
process group, dies with the worker thread that started it (``PR_SET_PDEATHSIG``) and takes
the whole group down with it. The caller waits up to ``timeout``; past it, or when ``stop``
is set (a cancel), the wrapper is asked to stop (SIGTERM: it signals the group, waits
``grace``, then kills what is left), and after ``2 × grace`` the group is killed outright.
Whatever is left in the group when the wrapper exits is killed too.

``lock_fd`` (the worktree lease's lock, see :mod:`actors.agents.lease`) is inherited by the
wrapper and the engine, so the lock is held exactly as long as one of them lives.

``confine`` (:class:`actors.agents.confine.Confinement`) runs the engine inside its
confinement: the wrapper starts the sandbox, the sandbox the engine. Every engine run goes
through here, whoever starts it (a worker's adapter or command engine, a loop service,
a conformance check), so none escapes it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from actors.agents.confine import Confinement

SUPERVISOR = Path(__file__).with_name("supervise.py")


@dataclass(frozen=True, slots=True)
class Exit:
    """How an engine process ended: ``returncode`` as :class:`subprocess.Popen` gives it
    (negative: killed by that signal); ``timed_out`` past the timeout; ``stopped`` on a stop
    request."""

    pid: int
    returncode: int
    timed_out: bool = False
    stopped: bool = False


def supervised_argv(
    argv: Sequence[str], grace: float, fds: Sequence[int] = (), extra: Mapping[str, str] = {}
) -> list[str]:
    """The wrapper's command line for ``argv`` (see :mod:`actors.agents.supervise`)."""
    head = [sys.executable, "-I", "-S", str(SUPERVISOR), str(os.getpid()), f"{grace:g}"]
    variables = [f"{name}={value}" for name, value in extra.items()]
    return [*head, ",".join(map(str, fds)), *variables, "--", *argv]


def run_supervised(
    argv: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str] | None,
    extra: Mapping[str, str] = {},
    stdout: IO[bytes],
    stderr: IO[bytes],
    timeout: float,
    grace: float = 2.0,
    lock_fd: int | None = None,
    stop: threading.Event | None = None,
    on_start: Callable[[int], None] | None = None,
    confine: Confinement | None = None,
    project: str | None = None,
    run_dir: Path | None = None,
) -> Exit:
    """Runs ``argv`` supervised in ``cwd`` with exactly ``env`` (None: the worker's) plus
    ``extra``, and waits for it (see the module docstring). With ``confine`` it runs
    confined (``project`` picks its HOME, ``run_dir`` is writable besides ``cwd``; an
    ``env`` of None is then the minimal base, never the worker's whole environment);
    :class:`actors.agents.confine.ConfinementError` when its mechanism is unavailable."""
    if confine is None:
        return _run(argv, cwd, env, extra, stdout, stderr, timeout, grace, lock_fd, stop, on_start)
    if env is None:
        from actors.agents.roster import BASE_ENV

        env = {name: os.environ[name] for name in BASE_ENV if name in os.environ}
    with confine.enter(argv, cwd=cwd, env=env, project=project, run_dir=run_dir) as jailed:
        inner, inner_env = jailed
        return _run(
            inner, cwd, inner_env, extra, stdout, stderr, timeout, grace, lock_fd, stop, on_start
        )


def _run(
    argv: Sequence[str],
    cwd: Path,
    env: Mapping[str, str] | None,
    extra: Mapping[str, str],
    stdout: IO[bytes],
    stderr: IO[bytes],
    timeout: float,
    grace: float,
    lock_fd: int | None,
    stop: threading.Event | None,
    on_start: Callable[[int], None] | None,
) -> Exit:
    fds = () if lock_fd is None else (lock_fd,)
    process = subprocess.Popen(
        supervised_argv(argv, grace, fds, extra),
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=stdout,
        stderr=stderr,
        start_new_session=True,
        pass_fds=fds,
    )
    try:
        if on_start is not None:
            on_start(process.pid)
        return _wait(process, timeout, grace, stop)
    finally:
        kill_group(process.pid)
        process.wait()


def _wait(
    process: subprocess.Popen[bytes], timeout: float, grace: float, stop: threading.Event | None
) -> Exit:
    step = 0.25 if stop is not None else timeout
    waited = 0.0
    while waited < timeout:
        try:
            return Exit(process.pid, process.wait(min(step, timeout - waited)))
        except subprocess.TimeoutExpired:
            waited += step
        if stop is not None and stop.is_set():
            return Exit(process.pid, _terminate(process, grace), stopped=True)
    return Exit(process.pid, _terminate(process, grace), timed_out=True)


def _terminate(process: subprocess.Popen[bytes], grace: float) -> int:
    """SIGTERM to the wrapper (it stops the group within ``grace``); the group is killed
    outright if it has not ended after twice that."""
    with contextlib.suppress(ProcessLookupError):
        process.send_signal(signal.SIGTERM)
    try:
        return process.wait(2 * grace + 1)
    except subprocess.TimeoutExpired:
        kill_group(process.pid)
        return process.wait()


def kill_group(pgid: int, signum: signal.Signals = signal.SIGKILL) -> None:
    # ProcessLookupError: the group is empty; PermissionError: its id is someone else's now.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
