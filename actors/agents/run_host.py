"""What a loop service does with a run request, apart from the broker (seed 000 §13).

A :class:`RunHost` hosts one engine's CLI adapter (:mod:`actors.agents.cli`): it checks a
request (:meth:`RunHost.check`), decides what the request means for the worktree it names
(:func:`admit`), runs the adapter's binary with the request's arguments under the supervising
wrapper (:func:`actors.agents.process.run_supervised`: the run dies with the service), and
keeps each run's files in ``<cwd>/.vibey/diagnostics/``:

``<run_id>.stdout`` / ``.stderr``   the CLI's output (the caller reads the transcript there)
``<run_id>.started``                the run started (no result beside it: it was abandoned)
``<run_id>.result.json``            the ``vibey.run.result/1`` body, written before the
                                    request is acked; a redelivered request republishes it

**Security.** The service runs only its descriptor's binary (looked up on the engine's own
PATH, never named by a message); ``args[0]`` must be the adapter's run verb for a run and the
argv must be the adapter's version argv for a probe; ``cwd`` (symlinks resolved) must lie under
the configured root; the environment is the engine's own (``AgentSpec.environment`` of the
service's configuration). A message carrying an environment or a binary is refused by the codec
(:data:`workflows.runs.FORBIDDEN_FIELDS`).

**One run per worktree.** The host keeps the active run of each cwd; a higher attempt of the
same run key supersedes it (stop, ``grace``, kill), another key is ``worktree busy``. Across
service restarts, ``<cwd>/.vibey/run.lock`` is ``flock``-ed and inherited by the engine process,
so a run of a previous instance that is still winding down keeps the worktree busy.
"""

from __future__ import annotations

import enum
import fcntl
import json
import os
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from actors.agents.catalog import RUN_VERBS
from actors.agents.cli import CliAdapter
from actors.agents.confine import ConfinementError
from actors.agents.lease import vibey_dir
from actors.agents.process import Exit, run_supervised
from workflows.runs import (
    Purpose,
    RunCodecError,
    RunRequest,
    RunResult,
    RunStatus,
    decode,
    encode,
)

PROBE_TIMEOUT_S = 10.0
PROBE_OUTPUT_CHARS = 4000
RUN_LOCK = "run.lock"
BUSY = "worktree busy"


def diagnostics(cwd: str | Path) -> Path:
    return Path(cwd) / ".vibey" / "diagnostics"


def result_path(cwd: str | Path, run_id: object) -> Path:
    return diagnostics(cwd) / f"{run_id}.result.json"


def output_paths(cwd: str | Path, run_id: object) -> tuple[Path, Path]:
    where = diagnostics(cwd)
    return where / f"{run_id}.stdout", where / f"{run_id}.stderr"


def read_result(cwd: str | Path, run_id: object) -> RunResult | None:
    """The persisted result of ``run_id``, or None (no file, or not a result)."""
    try:
        message = decode(result_path(cwd, run_id).read_bytes())
    except (OSError, RunCodecError):
        return None
    return message if isinstance(message, RunResult) else None


def write_result(cwd: str | Path, result: RunResult) -> None:
    """Durably: a staging file, fsync, rename."""
    path = result_path(cwd, result.run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(f".{os.getpid()}.tmp")
    with staging.open("wb") as out:
        out.write(encode(result))
        out.flush()
        os.fsync(out.fileno())
    staging.replace(path)


class Admission(enum.Enum):
    START = "start"
    SUPERSEDE = "supersede"  # stop the active run first, then start
    ATTACH = "attach"  # this very run is active (a redelivery): its end settles this one too
    STALE = "stale"  # a higher attempt of the same key holds the worktree
    BUSY = "busy"  # another key (or none) holds the worktree


def admit(active: RunRequest | None, incoming: RunRequest) -> Admission:
    """What ``incoming`` means for a worktree whose active run is ``active`` (pure)."""
    if active is None:
        return Admission.START
    if active.run_id == incoming.run_id:
        return Admission.ATTACH
    mine, theirs = incoming.supersedes, active.supersedes
    if mine is None or theirs is None or mine.key != theirs.key:
        return Admission.BUSY
    return Admission.SUPERSEDE if mine.attempt > theirs.attempt else Admission.STALE


@dataclass
class Active:
    """A run in progress."""

    request: RunRequest
    stop: threading.Event = field(default_factory=threading.Event)
    started_at: datetime | None = None
    pid: int | None = None
    why_stopped: RunStatus | None = None  # superseded / abandoned, when the host stopped it
    detail: str = ""
    done: threading.Event = field(default_factory=threading.Event)  # its process ended
    settled: threading.Event = field(default_factory=threading.Event)  # its result published


class RunHost:
    """One engine's runs (see the module docstring)."""

    def __init__(
        self, adapter: CliAdapter, *, root: Path, instance: str, grace: float = 2.0
    ) -> None:
        self.adapter = adapter
        self.spec = adapter.spec
        self.root = Path(os.path.realpath(root))
        self.instance = instance
        self.grace = grace
        self._lock = threading.Lock()
        self._active: dict[str, Active] = {}

    # -- checks ------------------------------------------------------------------------------

    def check(self, request: RunRequest) -> str | None:
        """Why ``request`` is refused as forged, or None."""
        if request.engine != self.spec.id:
            return (
                f"the request is for engine {request.engine!r}; this service runs {self.spec.id!r}"
            )
        real = Path(os.path.realpath(request.cwd))
        if real != self.root and self.root not in real.parents:
            return f"cwd {request.cwd} is not under the configured root {self.root}"
        if not real.is_dir():
            return f"cwd {request.cwd} is not a directory"
        if request.purpose is Purpose.PROBE:
            if list(request.args) != self.adapter.version_argv():
                return f"a probe may only ask {' '.join(self.adapter.version_argv())}"
            return None
        verb = RUN_VERBS.get(self.spec.adapter)
        if verb is None or not request.args or request.args[0] != verb:
            shown = request.args[0] if request.args else "nothing"
            return f"a run's args[0] must be {verb!r} for {self.spec.adapter}, got {shown!r}"
        return None

    # -- the worktree's one run --------------------------------------------------------------

    def admit(self, request: RunRequest) -> tuple[Admission, Active | None]:
        """Registers ``request`` as the cwd's run when it may start at once; else says why not
        (for SUPERSEDE, the run to stop: call :meth:`supersede`)."""
        key = os.path.realpath(request.cwd)
        with self._lock:
            current = self._active.get(key)
            decision = admit(None if current is None else current.request, request)
            if decision is Admission.START:
                self._active[key] = Active(request)
                return decision, self._active[key]
            return decision, current

    def supersede(self, old: Active, request: RunRequest) -> Active | None:
        """Stops ``old`` (its process group: SIGTERM, the spec's grace, SIGKILL) and registers
        ``request`` in its place; None when another request took the worktree meanwhile."""
        old.why_stopped = RunStatus.SUPERSEDED
        attempt = request.supersedes.attempt if request.supersedes else 0
        old.detail = f"superseded by attempt {attempt} (run {request.run_id})"
        old.stop.set()
        old.done.wait(self.spec.supersede_grace_seconds + 4 * self.grace + 5)
        key = os.path.realpath(request.cwd)
        with self._lock:
            if key in self._active and self._active[key] is not old:
                return None
            self._active[key] = Active(request)
            return self._active[key]

    def find(self, run_id: object) -> Active | None:
        with self._lock:
            return next((a for a in self._active.values() if a.request.run_id == run_id), None)

    def active(self) -> list[Active]:
        with self._lock:
            return list(self._active.values())

    def _release(self, active: Active) -> None:
        with self._lock:
            key = os.path.realpath(active.request.cwd)
            if self._active.get(key) is active:
                del self._active[key]
        active.done.set()

    # -- running -----------------------------------------------------------------------------

    def execute(self, active: Active, on_start: Callable[[Active], None]) -> RunResult:
        """Runs ``active``'s request to its end and persists the result, then releases the
        worktree (always; a redelivery that finds it free finds the result too)."""
        try:
            result = self._execute(active, on_start)
            write_result(active.request.cwd, result)
        finally:
            self._release(active)
        return result

    def _execute(self, active: Active, on_start: Callable[[Active], None]) -> RunResult:
        request = active.request
        binary = self.adapter.binary()
        if binary is None:
            return self.ended(request, RunStatus.REJECTED, f"{self.spec.binary!r} is not installed")
        lock_fd = _run_lock(Path(request.cwd), self.grace)
        if lock_fd is None:
            return self.ended(request, RunStatus.REJECTED, f"{BUSY}: a previous run winds down")
        stdout, stderr = output_paths(request.cwd, request.run_id)
        stdout.parent.mkdir(parents=True, exist_ok=True)
        started = stdout.with_suffix(".started")
        timeout = min(request.deadline_seconds, self.spec.timeout_seconds)

        def started_run(pid: int) -> None:
            active.pid, active.started_at = pid, datetime.now(UTC)
            started.write_text(json.dumps({"pid": pid, "instance": self.instance}))
            on_start(active)

        try:
            with stdout.open("wb") as out, stderr.open("wb") as err:
                done = run_supervised(
                    [binary, *request.args],
                    cwd=Path(request.cwd),
                    env=self.adapter.environment,
                    stdout=out,
                    stderr=err,
                    timeout=timeout,
                    grace=self.spec.supersede_grace_seconds,
                    lock_fd=lock_fd,
                    stop=active.stop,
                    on_start=started_run,
                    confine=self.adapter.confinement,
                    project=self._project(request.cwd),
                )
        except ConfinementError as exc:
            return self.ended(request, RunStatus.REJECTED, str(exc))
        finally:
            os.close(lock_fd)
        return self._ended_run(active, done)

    def _project(self, cwd: str) -> str | None:
        """The project a run's cwd belongs to (its first part under the root): its HOME."""
        parts = Path(os.path.realpath(cwd)).relative_to(self.root).parts
        return parts[0] if parts else None

    def _ended_run(self, active: Active, done: Exit) -> RunResult:
        status = RunStatus.EXITED
        detail = f"exit {done.returncode}"
        if done.timed_out:
            status, detail = RunStatus.DEADLINE_EXCEEDED, "killed at its deadline"
        elif done.stopped:
            status = active.why_stopped or RunStatus.ABANDONED
            detail = active.detail or "stopped"
        return self.ended(active.request, status, detail, done.returncode, active.started_at)

    def probe(self, request: RunRequest) -> RunResult:
        """Runs the probe's argv (the version argv) with a short timeout; the output is the
        detail."""
        binary = self.adapter.binary()
        if binary is None:
            return self.ended(request, RunStatus.REJECTED, f"{self.spec.binary!r} is not installed")
        started = datetime.now(UTC)
        try:
            done = subprocess.run(
                [binary, *request.args],
                cwd=request.cwd,
                env=self.adapter.environment,
                capture_output=True,
                text=True,
                timeout=PROBE_TIMEOUT_S,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return self.ended(request, RunStatus.DEADLINE_EXCEEDED, "the probe hung", None, started)
        output = (done.stdout + done.stderr)[-PROBE_OUTPUT_CHARS:]
        return self.ended(request, RunStatus.EXITED, output, done.returncode, started)

    def ended(
        self,
        request: RunRequest,
        status: RunStatus,
        detail: str,
        exit_code: int | None = None,
        started_at: datetime | None = None,
    ) -> RunResult:
        code = None if exit_code is None else max(-255, min(255, exit_code))
        return RunResult(
            request.run_id, status, code, started_at, datetime.now(UTC), detail, self.instance
        )

    def orphaned(self, request: RunRequest) -> bool:
        """Whether ``request`` started once (a previous delivery) and is not running here."""
        started = output_paths(request.cwd, request.run_id)[0].with_suffix(".started")
        return started.exists() and self.find(request.run_id) is None


def _run_lock(cwd: Path, grace: float) -> int | None:
    """The cwd's run lock, waited for up to ``grace`` (a previous instance's run winding down);
    None when it stays held."""
    fd = os.open(vibey_dir(cwd) / RUN_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    deadline = time.monotonic() + grace
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                return None
            time.sleep(0.05)
