"""An engine process never outlives the attempt that owns it, and a workdir's lease keeps a
second attempt out while the first one's processes live.

These start real processes: a stand-in worker (a Python process that runs an agent under the
supervising wrapper, as a handler does) and an agent that starts a child in its group and one
that escapes into a session of its own; then SIGKILL the worker.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from actors.agents.lease import WorktreeBusy, WorktreeLease, is_held, read_holder, stop_all
from actors.agents.process import run_supervised

AGENT = textwrap.dedent(
    """
    import os, signal, subprocess, sys, time, pathlib
    out = pathlib.Path(sys.argv[1])
    if len(sys.argv) > 2:  # a stubborn agent: it ignores SIGTERM
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    escapee = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True
    )
    out.write_text(f"{os.getpid()} {child.pid} {escapee.pid}")
    time.sleep(600)
    """
)

WORKER = textwrap.dedent(
    """
    import sys, pathlib
    from actors.agents.lease import WorktreeLease
    from actors.agents.process import run_supervised
    workdir, agent, pids = (pathlib.Path(a) for a in sys.argv[1:4])
    extra = sys.argv[4:]
    with WorktreeLease().hold(workdir, "job-1", 1, "claim-1") as held:
        run_supervised(
            [sys.executable, str(agent), str(pids), *extra], cwd=workdir, env=None,
            stdout=sys.stdout.buffer, stderr=sys.stderr.buffer, timeout=600,
            lock_fd=held.fd, on_start=held.started,
        )
    """
)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rpartition(")")[2].split()[0] != "Z"
    except OSError:
        return False


def wait_until(predicate: Callable[[], bool], seconds: float = 15.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.05)
    return predicate()


def start_worker(tmp_path: Path, *extra: str) -> tuple[subprocess.Popen[bytes], list[int]]:
    workdir = tmp_path / "tree"
    workdir.mkdir(exist_ok=True)
    (tmp_path / "agent.py").write_text(AGENT)
    pids = tmp_path / "pids"
    pids.unlink(missing_ok=True)
    worker = subprocess.Popen(
        [sys.executable, "-c", WORKER, str(workdir), str(tmp_path / "agent.py"), str(pids), *extra],
        cwd=Path(__file__).resolve().parents[2],
    )
    assert wait_until(lambda: pids.exists() and len(pids.read_text().split()) == 3)
    return worker, [int(p) for p in pids.read_text().split()]


def test_a_sigkilled_worker_leaves_no_engine_process(tmp_path: Path) -> None:
    worker, (agent, child, escapee) = start_worker(tmp_path)
    assert all(map(alive, (agent, child, escapee)))
    assert is_held(tmp_path / "tree")
    holder = read_holder(tmp_path / "tree")
    assert holder is not None and holder.pgid is not None and alive(holder.pgid)
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    assert wait_until(lambda: not any(map(alive, (agent, child, escapee)))), [
        pid for pid in (agent, child, escapee) if alive(pid)
    ]
    assert wait_until(lambda: not is_held(tmp_path / "tree"))


def test_a_retry_stops_the_older_attempt_before_it_starts(tmp_path: Path) -> None:
    """A stubborn agent (it ignores SIGTERM) whose wrapper is SIGKILLed during its grace,
    right after the worker: the agent lives on and holds the lock, so the job's next attempt
    finds it, stops its group and only then starts."""
    worker, (agent, child, _escapee) = start_worker(tmp_path, "stubborn")
    holder = read_holder(tmp_path / "tree")
    assert holder is not None and holder.pgid is not None
    worker.send_signal(signal.SIGKILL)
    worker.wait()
    time.sleep(0.3)
    os.kill(holder.pgid, signal.SIGKILL)  # the wrapper, not the group
    time.sleep(0.3)
    assert alive(agent) and is_held(tmp_path / "tree")
    lease = WorktreeLease(grace=1.0, fence=lambda h: h.owner == "claim-2")
    with lease.hold(tmp_path / "tree", "job-1", 2, "claim-2") as held:
        assert not alive(agent) and not alive(child)
        assert held.holder.attempt == 2
    assert not is_held(tmp_path / "tree")


def test_another_jobs_live_attempt_makes_the_workdir_busy(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    tree.mkdir()
    first = WorktreeLease()
    other = WorktreeLease(grace=0.2, fence=lambda holder: True)  # its lease is current
    busy = pytest.raises(WorktreeBusy, match="job job-a attempt 1")
    with first.hold(tree, "job-a", 1, "claim-a"), busy, other.hold(tree, "job-b", 1, "claim-b"):
        pass
    with other.hold(tree, "job-b", 1, "claim-b") as held:  # free again
        assert held.holder.job_id == "job-b"


def test_a_stale_attempt_never_stops_the_current_one(tmp_path: Path) -> None:
    """An attempt whose own claim PostgreSQL no longer grants finds the newer one busy."""
    tree = tmp_path / "tree"
    tree.mkdir()
    current = WorktreeLease()
    stale = WorktreeLease(grace=0.2, fence=lambda holder: holder.owner == "claim-2")
    busy = pytest.raises(WorktreeBusy)
    with current.hold(tree, "job-1", 2, "claim-2"), busy, stale.hold(tree, "job-1", 1, "claim-1"):
        pass


def test_a_stop_request_ends_the_group_within_the_grace(tmp_path: Path) -> None:
    (tmp_path / "agent.py").write_text(AGENT)
    stop = threading.Event()

    def stop_once_started() -> None:  # the agent wrote its pids: it runs
        wait_until(lambda: (tmp_path / "pids").exists(), 30)
        stop.set()

    threading.Thread(target=stop_once_started, daemon=True).start()
    started = time.monotonic()
    with (tmp_path / "out").open("wb") as out:
        done = run_supervised(
            [sys.executable, str(tmp_path / "agent.py"), str(tmp_path / "pids")],
            cwd=tmp_path,
            env=None,
            stdout=out,
            stderr=out,
            timeout=60,
            grace=1.0,
            stop=stop,
        )
    assert done.stopped and time.monotonic() - started < 40
    pids = [int(p) for p in (tmp_path / "pids").read_text().split()]
    assert wait_until(lambda: not any(map(alive, pids)), 5)


def test_a_vibey_dir_is_ignored_by_git(tmp_path: Path) -> None:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    with WorktreeLease().hold(tmp_path, "job-1", 1, "claim-1"):
        status = subprocess.run(
            ["git", "status", "--porcelain"], cwd=tmp_path, capture_output=True, text=True
        )
    assert status.stdout == ""


def test_stop_all_stops_every_engine_in_a_project(tmp_path: Path) -> None:
    """What `vibey workflow cancel` does on the machine: the project's engines stop."""
    worker, (agent, child, _escapee) = start_worker(tmp_path)
    assert alive(agent)
    stopped = stop_all(tmp_path, grace=1.0)
    assert [h.job_id for h in stopped] == ["job-1"]
    assert wait_until(lambda: not alive(agent) and not alive(child))
    worker.wait(timeout=30)
