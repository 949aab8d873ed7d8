"""No-op step handlers for ``ops/bench/steps.py``, each run stamped into a per-process file.

A worker loads this registry as ``bench_handlers:HANDLERS`` (``ops/bench`` on its
``PYTHONPATH``). When ``VIBEY_BENCH_STEP_DIR`` names a directory, every run appends one line
``<subject> <job id> <start> <end>`` to ``<dir>/<pid>.steps``: the job's subject
(``<tag>:<chain>:<index>``), its id, and ``time.time()`` when the handler was entered and when
it returns. The variable is read at each run (the worker processes inherit it from the
forkserver, which the bench starts after setting it).
"""

from __future__ import annotations

import os
import threading
import time
from typing import TextIO

from workflows.queue import Job
from workflows.steps import Handlers, Short, Success

ENV = "VIBEY_BENCH_STEP_DIR"
# One kind per lane: design.interview runs in the INTERACTIVE lane, build.implement in BUILD.
KINDS = ("design.interview", "build.implement")

_lock = threading.Lock()
_out: tuple[int, str, TextIO] | None = None  # (pid, directory, line-buffered file)


def _file(directory: str) -> TextIO:
    """This process's file in ``directory`` (reopened after a fork or a new directory)."""
    global _out
    pid = os.getpid()
    if _out is None or _out[0] != pid or _out[1] != directory:
        if _out is not None and _out[0] == pid:
            _out[2].close()
        path = os.path.join(directory, f"{pid}.steps")
        # Line-buffered: a worker process ends with os._exit, which flushes nothing.
        _out = (pid, directory, open(path, "a", buffering=1, encoding="utf-8"))  # noqa: SIM115
    return _out[2]


def noop(job: Job) -> Success:
    start = time.time()
    end = time.time()
    directory = os.environ.get(ENV)
    if directory:
        with _lock:
            _file(directory).write(f"{job.subject} {job.id} {start:.6f} {end:.6f}\n")
    return Success()


HANDLERS: Handlers = dict.fromkeys(KINDS, Short(noop))
