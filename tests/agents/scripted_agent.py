"""A stand-in coding agent for the ``command`` engine: it answers every kind as the scripted
engine would (the workflow input's ``engine.script``), working in its directory as a real
agent does, and keeps a record for the chaos test.

``python scripted_agent.py RUNS_LOG [SECONDS]``: every run appends ``{"event": "start",
pid, cwd, kind, job, t}`` to RUNS_LOG, works SECONDS (default 1) with a child process beside
it, and appends ``{"event": "end", …}`` when it finishes or is asked to stop (SIGTERM). A run
that starts while another live run's pid is recorded in its directory appends ``{"event":
"overlap", …}``: two attempts in one worktree.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from actors.agents import EngineTask, ScriptedEngine


def log(runs: Path, event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, "pid": os.getpid(), "t": time.time(), **fields})
    with runs.open("a") as handle:  # one short write: appends do not interleave
        handle.write(line + "\n")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def main() -> None:
    runs, seconds = Path(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 1.0
    plan = json.loads(Path(os.environ["VIBEY_PLAN"]).read_text())
    cwd = Path.cwd()
    marker = cwd / ".vibey" / "agent.pid"
    marker.parent.mkdir(exist_ok=True)
    fields = {"cwd": str(cwd), "kind": plan["kind"], "attempt": plan["attempt"]}
    if marker.exists():
        other = int(marker.read_text() or 0)
        if other and other != os.getpid() and alive(other):
            log(runs, "overlap", other=other, **fields)
    marker.write_text(str(os.getpid()))
    log(runs, "start", **fields)

    def stop(signum: int, frame: object) -> None:
        log(runs, "end", stopped=True, **fields)
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    log(runs, "child", child=child.pid, **fields)
    time.sleep(seconds)
    child.kill()
    kind = plan["kind"]
    task = EngineTask(
        kind,
        plan["project_id"],
        plan["cycle"],
        plan["subject"],
        plan["attempt"],
        plan["input"],
        cwd if kind == "build.implement" else None,
        effort=os.environ.get("VIBEY_EFFORT"),
    )
    verdict = ScriptedEngine().run(task)
    Path(os.environ["VIBEY_VERDICT"]).write_text(json.dumps(asdict(verdict), default=str))
    if marker.read_text() == str(os.getpid()):
        marker.unlink()
    log(runs, "end", stopped=False, **fields)


if __name__ == "__main__":
    main()
