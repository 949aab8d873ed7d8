"""The supervising wrapper every engine process runs under: it dies with the worker.

Run as a script, never imported by the worker (``python -I -S supervise.py PARENT GRACE
FDS [NAME=VALUE...] -- ARGV...``: the worker's pid, the stop grace in seconds, the file
descriptors the engine inherits, comma-separated, and variables added to its environment),
so it starts in milliseconds and imports only the standard library. The worker starts it in
a new session, so the wrapper leads a process group that holds the engine and
everything the engine starts. The wrapper:

1. asks the kernel to send it SIGTERM when its parent (the worker thread that started it)
   dies (``PR_SET_PDEATHSIG``; a SIGKILLed worker counts), and exits at once when its parent
   is already gone (the race between fork and that call);
2. becomes a child subreaper (``PR_SET_CHILD_SUBREAPER``), so a descendant that leaves the
   group (``setsid``) is reparented to it, not to init, and can still be found and killed;
3. runs the engine (inheriting the worktree's lease lock, ``pass_fds``: the lock stays held
   while any of them lives) and waits for it, checking its parent every ``POLL_S``;
4. on SIGTERM/SIGINT/SIGHUP or a dead parent: SIGTERM to the group, ``GRACE`` seconds, then
   SIGKILL to every process left in the group and every descendant; on the engine's own exit,
   SIGKILL to whatever it left behind. A confined engine's sandbox (``bwrap``, the direct
   child) is spared the SIGTERM: it would tear its PID namespace down at once, cutting the
   engine's grace short; the processes inside get it, and the SIGKILL takes the sandbox too;
5. exits as the engine did (the same status, or the same signal).

On a platform without ``prctl`` (not Linux) steps 1 and 2 are skipped and the parent check
of step 3 is what notices a dead worker.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
import sys
import time

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
POLL_S = 0.2
_STOP = {"requested": False}


def _prctl(option: int, value: int) -> None:
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def _on_signal(signum: int, frame: object) -> None:
    _STOP["requested"] = True


def _children(pid: int) -> list[int]:
    """Direct children of ``pid`` (``/proc/<pid>/task/*/children``)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
    return found


def _group_members(pgid: int) -> list[int]:
    members: list[int] = []
    with contextlib.suppress(OSError):
        for name in os.listdir("/proc"):
            if name.isdigit() and int(name) != os.getpid():
                with contextlib.suppress(OSError, ValueError, IndexError):
                    with open(f"/proc/{name}/stat") as f:
                        stat = f.read()
                    if int(stat.rpartition(")")[2].split()[2]) == pgid:
                        members.append(int(name))
    return members


def _descendants() -> list[int]:
    seen: list[int] = []
    todo = _children(os.getpid())
    while todo:
        pid = todo.pop()
        if pid not in seen:
            seen.append(pid)
            todo += _children(pid)
    return seen


def _kill_all(signum: int, spare: int | None = None) -> None:
    for pid in {*_group_members(os.getpgid(0)), *_descendants()} - {spare}:
        with contextlib.suppress(OSError):
            os.kill(pid, signum)


def _reap() -> None:
    with contextlib.suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0] > 0:
            pass


def _stop(engine: subprocess.Popen[bytes], grace: float) -> None:
    sandbox = isinstance(engine.args, list) and os.path.basename(str(engine.args[0])) == "bwrap"
    _kill_all(signal.SIGTERM, spare=engine.pid if sandbox else None)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and engine.poll() is None:
        time.sleep(0.05)
    _kill_all(signal.SIGKILL)


def _exit_as(returncode: int) -> None:
    if returncode < 0:
        if -returncode not in (signal.SIGKILL, signal.SIGSTOP):
            signal.signal(-returncode, signal.SIG_DFL)
        os.kill(os.getpid(), -returncode)
        time.sleep(1)
    sys.exit(returncode if returncode >= 0 else 128 - returncode)


def main(args: list[str]) -> None:
    if "--" not in args or len(args) < 5:
        sys.exit("usage: supervise.py PARENT_PID GRACE_S FDS [NAME=VALUE...] -- ARGV...")
    split = args.index("--")
    parent, grace, fds_arg = int(args[0]), float(args[1]), args[2]
    variables, argv = args[3:split], args[split + 1 :]
    for variable in variables:
        name, _, value = variable.partition("=")
        os.environ[name] = value
    fds = tuple(int(fd) for fd in fds_arg.split(",") if fd)
    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, _on_signal)
    _prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != parent:  # the worker died before the kernel could be told
        sys.exit(128 + signal.SIGTERM)
    _prctl(PR_SET_CHILD_SUBREAPER, 1)
    try:
        engine = subprocess.Popen(argv, pass_fds=fds)
    except OSError as exc:
        sys.exit(f"vibey: cannot start {argv[0]}: {exc}")
    while engine.poll() is None:
        if _STOP["requested"] or os.getppid() != parent:
            _stop(engine, grace)
            break
        time.sleep(POLL_S)
    returncode = engine.wait()
    _kill_all(signal.SIGKILL)  # whatever it left behind
    _reap()
    _exit_as(returncode)


if __name__ == "__main__":
    main(sys.argv[1:])
