"""Coding-agent CLIs behind the engine seam: what every adapter shares.

An adapter (:mod:`actors.agents.claude_code`, ``codex``, ``gemini``, ``aider``) says two
things: how a plan becomes its CLI's command line (:meth:`CliAdapter.invocation`) and how its
CLI's output reads (:meth:`CliAdapter.read`, into a :class:`Reading`). This module does the
rest, the same for all of them:

1. writes the plan (:mod:`actors.agents.plans`) to ``<workdir>/.vibey/plans/<job>.md`` and
   ``.json``: the kind, the effort, the accepted spec and design answers, the work item, the
   result it must report and where (``<workdir>/.vibey/verdicts/<job>.json``, or a JSON
   object as its final message);
2. runs the CLI in the step's workdir under the supervising wrapper (it dies with the worker),
   with the engine's own environment only (``AgentSpec.environment``), its stdout kept as the
   transcript under ``transcripts`` (by reference: a path and its SHA-256), within its
   ``timeout_seconds`` (past it the whole process group is killed);
3. judges the run, structured output first, known strings second, exit codes last:

   ==============================================  ========================================
   what the CLI said                               verdict
   ==============================================  ========================================
   a limit with a reset time                       capacity: WindowExhausted(resets_at)
   credits, billing or quota spent (no reset)      capacity: CreditsExhausted
   an authentication failure                       capacity: AuthenticationFailed
   a hang past the timeout, a crash, a malformed   failed, engine fault
   stream, an error it reported, exit ≠ 0
   a result that is not a JSON object              failed, engine fault (evidence kept)
   build.implement that changed nothing            failed, engine fault ("exit 0, nothing
                                                   changed" is not a success)
   ``{"status": "failed", "detail"}`` reported     failed (the kind's failure class)
   otherwise                                       ok, the reported result
   ==============================================  ========================================

Every verdict's evidence carries the ledger entries of the run: TurnRequested, TurnCompleted,
ToolInvoked and FileEdited (what the CLI reported and what the worktree shows changed, each
file once, as its path relative to the step's directory), BudgetSpent (tokens always, dollars
where the CLI reports them), CapacityRejected, and TranscriptRecorded.

**Streamed evidence.** When the task has a ``stream`` sink (the handlers give one that appends
to the ledger at once), TurnRequested goes there when the CLI starts, and a watcher reads the
transcript as it grows (every :data:`STREAM_INTERVAL_S`, whole lines only, through the
adapter's own ``read``) and sends each ToolInvoked and FileEdited the CLI reports as it
reports it. Those entries are left out of the verdict's evidence (``evidence["streamed"]``
counts them), so the ledger holds each once; a sink that fails keeps its entries in the
evidence instead.

**Decided early.** The same watcher runs whatever the sink: when a reading says the run is
already decided (``Reading.decided``: the CLI keeps retrying what no retry fixes, e.g. a key
the API refused), the CLI's process group is stopped at once and the run is judged from what
it printed, instead of waiting out the CLI's own retries.
"""

from __future__ import annotations

import abc
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from actors.agents.base import EngineTask, EngineVerdict
from actors.agents.confine import Confinement
from actors.agents.plans import Plan, write_plan
from actors.agents.process import Exit, run_supervised
from actors.agents.roster import AgentSpec
from workflows.capacity import Exhausted, encode_state
from workflows.ledger import LedgerEvent
from workflows.noloss import BriefMode, HandoffBrief, RuleFailure, Spec
from workflows.protocol.kinds import BUILD_IMPLEMENT

TAIL_CHARS = 4000
STREAM_INTERVAL_S = 0.5
Context = Callable[[EngineTask], Mapping[str, Any]]
Launch = Callable[[EngineTask, Sequence[str], Path], "tuple[Exit, Path, str] | EngineVerdict"]
"""Runs the CLI's arguments (argv after the binary) for ``task`` in ``workdir`` somewhere else
(a loop service, :mod:`actors.agents.run_client`): how it ended, the transcript's path and the
stderr text; or a verdict when the run never got to judge (a fault)."""
Entry = dict[str, Any]
log = logging.getLogger(__name__)


@dataclass
class Reading:
    """What a CLI's output says (filled by an adapter's ``read``)."""

    text: str = ""  # the final message
    turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    dollars: float | None = None
    tools: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    capacity: Exhausted | None = None
    error: str | None = None  # a failure the CLI reported
    malformed: str | None = None  # output that is not the CLI's format
    session: str | None = None
    decided: bool = False  # the output already decides the run (``capacity``): stop the CLI


@dataclass
class Streamed:
    """What went to a task's stream sink while the CLI ran (so the evidence leaves it out)."""

    requested: bool = False
    tools: int = 0  # the first n tools the CLI reported
    files: set[str] = field(default_factory=set)

    @property
    def entries(self) -> int:
        return int(self.requested) + self.tools + len(self.files)


class _Watcher(threading.Thread):
    """Reads the transcript as it grows: streams the tools and files the CLI reports (when
    the task has a sink), and sets ``decided`` once a reading decides the run."""

    def __init__(
        self,
        adapter: CliAdapter,
        transcript: Path,
        task: EngineTask,
        streamed: Streamed,
        workdir: Path,
    ) -> None:
        super().__init__(name=f"stream-{adapter.spec.id}", daemon=True)
        self._adapter, self._transcript, self._task = adapter, transcript, task
        self._streamed, self._workdir = streamed, workdir
        self._done = threading.Event()
        self.decided = threading.Event()
        self._size = -1

    def run(self) -> None:
        while not self._done.wait(STREAM_INTERVAL_S):
            self.poll()

    def stop(self) -> None:
        self._done.set()
        self.join(timeout=10)
        self.poll()  # what came after the last look, before the verdict is judged

    def poll(self) -> None:
        try:
            raw = self._transcript.read_bytes()
        except OSError:
            return
        whole = raw[: raw.rfind(b"\n") + 1]
        if len(whole) == self._size:
            return
        self._size = len(whole)
        reading = self._adapter.read(whole.decode("utf-8", errors="replace"), "", 0)
        if reading.decided:
            self.decided.set()
        if self._task.stream is None:
            return
        engine, done = self._adapter.spec.id, self._streamed
        tools = reading.tools[done.tools :]
        files = [f for f in edited(self._workdir, reading.files) if f not in done.files]
        entries = [_tool(engine, t) for t in tools] + [_file(engine, f) for f in files]
        if entries and _sent(self._task, entries):
            done.tools += len(tools)
            done.files.update(files)


def _sent(task: EngineTask, entries: list[Entry]) -> bool:
    """Whether the task's sink took ``entries`` (a failing sink leaves them to the verdict)."""
    if task.stream is None:
        return False
    if task.stream(entries):
        return True
    log.warning("streaming %d evidence entries failed; they go with the verdict", len(entries))
    return False


def _tool(engine: str, tool: str) -> Entry:
    return {"kind": "ToolInvoked", "payload": {"engine": engine, "tool": tool}}


def _file(engine: str, path: str) -> Entry:
    return {"kind": "FileEdited", "payload": {"engine": engine, "path": path}}


def _turn(engine: str, task: EngineTask) -> dict[str, Any]:
    return {"engine": engine, "kind": task.kind, "subject": task.subject, "attempt": task.attempt}


class CliAdapter(abc.ABC):
    """The shared run (see the module docstring); subclasses give ``invocation`` and
    ``read``."""

    adapter = ""
    judged_by_worktree = False  # aider: its exit code can say success when nothing changed

    def __init__(
        self,
        spec: AgentSpec,
        *,
        worker_env: Mapping[str, str],
        transcripts: Path,
        context: Context | None = None,
        grace: float = 2.0,
        launch: Launch | None = None,
    ) -> None:
        self.spec = spec
        self._env = spec.environment(worker_env)
        self._transcripts = transcripts
        self._context = context
        self._grace = grace
        self._launch = launch  # None: the CLI runs here, a child of this process

    @property
    def confinement(self) -> Confinement:
        """How its runs are confined, read as each run starts (a base URL written into the
        CLI's config after this adapter was made is allowed too)."""
        return self.spec.confined(self._transcripts.parent / "homes")

    @property
    def environment(self) -> Mapping[str, str]:
        """What the engine's process gets (its spec's ``env`` over the minimal base)."""
        return self._env

    # -- what an adapter says ---------------------------------------------------------------

    @abc.abstractmethod
    def invocation(self, task: EngineTask, plan: Plan, prompt: str) -> list[str]:
        """The CLI's argv for this attempt (each adapter's own flags)."""

    @abc.abstractmethod
    def read(self, stdout: str, stderr: str, returncode: int) -> Reading:
        """What the CLI's output says: verdict, evidence, capacity (each adapter's format)."""

    def version_argv(self) -> list[str]:
        return ["--version"]

    def write_brief(
        self,
        task: EngineTask,
        ledger_range: Sequence[LedgerEvent],
        spec: Spec,
        *,
        mode: BriefMode,
        number: int,
        fix: tuple[RuleFailure, ...] = (),
    ) -> HandoffBrief:
        """The handoff brief, synthesised from the ledger range (an engine out of credits
        cannot be asked for one): everything the no-loss gate asks of the range and the
        spec, each item with what the ledger says of it."""
        from actors.agents.scripted import complete_brief

        return complete_brief(ledger_range, spec, mode)

    # -- the run ----------------------------------------------------------------------------

    def binary(self) -> str | None:
        """The binary's path, looked up on the engine's own PATH; None when not installed."""
        return shutil.which(self.spec.binary, path=self._env.get("PATH"))

    def run(self, task: EngineTask) -> EngineVerdict:
        binary = self.binary() if self._launch is None else self.spec.binary
        if binary is None:
            return fault(f"engine {self.spec.id}: {self.spec.binary!r} is not installed")
        workdir = task.workdir or task.worktree
        if workdir is None:
            return fault(f"engine {self.spec.id}: {task.kind} has no directory to work in")
        refused = self.confinement.mechanism
        if self._launch is None and refused.refused:
            return fault(
                f"engine {self.spec.id}: confinement {self.spec.confinement} is {refused.why}"
            )
        context = self._context(task) if self._context is not None else {}
        plan = write_plan(workdir, task, context, self.spec.id)
        before = _tree_state(workdir)
        args = self.invocation(task, plan, plan.prompt)
        streamed = Streamed()
        if task.stream is not None:
            requested = {"kind": "TurnRequested", "payload": _turn(self.spec.id, task)}
            streamed.requested = _sent(task, [requested])
        if self._launch is None:
            done, transcript, stderr = self._spawn(task, [binary, *args], workdir, streamed)
        else:  # a loop service runs it: its evidence arrives with the verdict, not streamed
            launched = self._launch(task, args, workdir)
            if isinstance(launched, EngineVerdict):
                return launched
            done, transcript, stderr = launched
        stdout = transcript.read_text(encoding="utf-8", errors="replace")
        if done.stopped:  # cut off mid-line, maybe: what decided it is in the whole lines
            stdout = stdout[: stdout.rfind("\n") + 1]
        reading = self.read(stdout, stderr, done.returncode)
        changed = _changed(workdir, before)
        return self.judge(task, plan, done, reading, changed, transcript, streamed)

    def _spawn(
        self, task: EngineTask, argv: Sequence[str], workdir: Path, streamed: Streamed
    ) -> tuple[Exit, Path, str]:
        self._transcripts.mkdir(parents=True, exist_ok=True)
        name = f"{task.job_id or task.subject or task.kind}-{task.attempt}-{self.spec.id}"
        transcript = self._transcripts / f"{name}.log"
        errors = self._transcripts / f"{name}.stderr"
        held = task.lease
        watcher = _Watcher(self, transcript, task, streamed, workdir)
        with transcript.open("wb") as out, errors.open("wb") as err:
            watcher.start()
            try:
                done = self._supervised(
                    argv, workdir, out, err, held, task.project_id, watcher.decided
                )
            finally:
                watcher.stop()
        return done, transcript, errors.read_text(encoding="utf-8", errors="replace")

    def _supervised(
        self,
        argv: Sequence[str],
        workdir: Path,
        out: Any,
        err: Any,
        held: Any,
        project: str,
        stop: threading.Event | None = None,
    ) -> Exit:
        return run_supervised(
            argv,
            cwd=workdir,
            env=self._env,
            stdout=out,
            stderr=err,
            timeout=self.spec.timeout_seconds,
            grace=self._grace,
            lock_fd=None if held is None else held.fd,
            stop=stop,
            on_start=None if held is None else held.started,
            confine=self.confinement,
            project=project,
        )

    # -- the judgement ----------------------------------------------------------------------

    def judge(
        self,
        task: EngineTask,
        plan: Plan,
        done: Exit,
        reading: Reading,
        changed: list[str],
        transcript: Path,
        streamed: Streamed | None = None,
    ) -> EngineVerdict:
        streamed = streamed or Streamed()
        ledger = self._ledger(task, reading, changed, transcript, done, streamed)
        evidence: dict[str, Any] = {
            "ledger": ledger,
            "streamed": streamed.entries,
            "engine_id": self.spec.id,
            "exit_code": done.returncode,
            "transcript": str(transcript),
            "stdout_tail": reading.text[-TAIL_CHARS:],
        }
        if reading.capacity is not None:
            state = encode_state(reading.capacity)
            ledger.append(
                {"kind": "CapacityRejected", "payload": {**state, "engine": self.spec.id}}
            )
            detail = f"engine {self.spec.id}: {reading.capacity.kind.value}"
            return EngineVerdict("capacity", {"capacity": state}, evidence, detail)
        why = _fault_of(done, reading, self.spec.timeout_seconds)
        if why is not None:
            return fault(f"engine {self.spec.id}: {why}", evidence)
        result = reported_result(plan.verdict_file, reading.text)
        if isinstance(result, str):
            return fault(f"engine {self.spec.id}: {result}", evidence)
        if task.kind == BUILD_IMPLEMENT and not changed and not _earlier_work(task):
            return fault(f"engine {self.spec.id} exited 0 but changed nothing", evidence)
        if result.get("status") == "failed":
            return EngineVerdict("failed", evidence=evidence, detail=str(result.get("detail", "")))
        return EngineVerdict("ok", result=result, evidence=evidence, detail=reading.text[-300:])

    def _ledger(
        self,
        task: EngineTask,
        reading: Reading,
        changed: list[str],
        transcript: Path,
        done: Exit,
        streamed: Streamed,
    ) -> list[dict[str, Any]]:
        """The run's entries, less those already streamed."""
        engine = self.spec.id
        turn = _turn(engine, task)
        entries: list[Entry] = (
            [] if streamed.requested else [{"kind": "TurnRequested", "payload": turn}]
        )
        entries += [_tool(engine, t) for t in reading.tools[streamed.tools :]]
        workdir = task.workdir or task.worktree
        reported = edited(workdir, reading.files) if workdir else reading.files
        files = sorted({*reported, *changed} - streamed.files)
        entries += [_file(engine, f) for f in files]
        status = "timeout" if done.timed_out else "stopped" if done.stopped else ""
        status = status or f"exit {done.returncode}"
        entries.append({"kind": "TurnCompleted", "payload": {**turn, "status": status}})
        spent: dict[str, Any] = {
            "engine": engine,
            "turns": max(1, reading.turns),
            "input_tokens": reading.input_tokens,
            "output_tokens": reading.output_tokens,
        }
        if reading.dollars is not None:
            spent["dollars"] = reading.dollars
        entries.append({"kind": "BudgetSpent", "payload": spent})
        digest = hashlib.sha256(transcript.read_bytes()).hexdigest()
        recorded = {"engine": engine, "path": str(transcript), "sha256": digest}
        entries.append({"kind": "TranscriptRecorded", "payload": recorded})
        return entries


def json_lines(stdout: str) -> list[dict[str, Any]] | str:
    """The JSON objects of an NDJSON stream (lines that are other JSON values are skipped),
    or why it is not one: the first line that is not JSON."""
    events: list[dict[str, Any]] = []
    for number, line in enumerate(stdout.splitlines(), 1):
        if not line.strip():
            continue
        try:
            event = json.loads(line)
        except ValueError:
            return f"line {number} is not JSON: {line[:120]!r}"
        if isinstance(event, dict):
            events.append(event)
    return events


def edited(workdir: Path, paths: Sequence[str]) -> list[str]:
    """The files a CLI reported editing, each once, as git names them: relative to
    ``workdir`` (an absolute path inside it, however spelt, becomes relative; one outside it
    stays absolute), in the order first reported; vibey's own ``.vibey/`` (the plan, the
    verdict file) left out, as :func:`_changed` leaves it out."""
    root = os.path.realpath(workdir)
    names: dict[str, None] = {}
    for path in paths:
        full = os.path.realpath(os.path.join(root, path))
        inside = full == root or full.startswith(root + os.sep)
        names[os.path.relpath(full, root) if inside else os.path.normpath(path)] = None
    return [name for name in names if not name.startswith(".vibey/")]


def fault(detail: str, evidence: Mapping[str, Any] | None = None) -> EngineVerdict:
    return EngineVerdict("failed", evidence=dict(evidence or {}), detail=detail, engine_fault=True)


def _fault_of(done: Exit, reading: Reading, timeout: float) -> str | None:
    if done.timed_out:
        return f"hung past its {timeout:g} s timeout; its process group was killed"
    if done.returncode < 0 or done.returncode > 128:
        signum = -done.returncode if done.returncode < 0 else done.returncode - 128
        return f"killed by signal {signum}"
    if reading.malformed is not None:
        return f"malformed output: {reading.malformed}"
    if reading.error is not None:
        return f"reported an error: {reading.error[:500]}"
    if done.returncode != 0:
        return f"exited with status {done.returncode}"
    return None


_JSON_BLOCK = re.compile(r"```(?:json)?\s*(\{.*?\})\s*```", re.DOTALL)


def reported_result(verdict_file: Path, text: str) -> dict[str, Any] | str:
    """The result the engine reported: its verdict file, else the last JSON object of its
    final message (a fenced block, or the whole message); else why there is none. The object
    is the kind's result; ``{"status": "failed", "detail": …}`` reports a failure."""
    candidates: list[str] = []
    if verdict_file.is_file():
        candidates.append(verdict_file.read_text(encoding="utf-8", errors="replace"))
    candidates += list(reversed(_JSON_BLOCK.findall(text)))
    candidates.append(text.strip())
    for candidate in candidates:
        try:
            parsed = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(parsed, dict):
            return parsed
    return (
        f"reported no result: no verdict file at {verdict_file} and no JSON object in its "
        "final message"
    )


def _tree_state(workdir: Path) -> str | None:
    """HEAD of ``workdir`` when it is a git work tree; None when it is not."""
    return _git(workdir, "rev-parse", "HEAD")


def _changed(workdir: Path, before: str | None) -> list[str]:
    """Files changed in ``workdir`` since ``before`` (committed or not), .vibey/ excluded."""
    if before is None:
        return []
    committed = _git(workdir, "diff", "--name-only", before, "HEAD") or ""
    status = _git(workdir, "status", "--porcelain", "--untracked-files=all") or ""
    pending = [line[3:] for line in status.splitlines() if len(line) > 3]
    files = {*committed.splitlines(), *pending}
    return sorted(f for f in files if f and not f.startswith(".vibey/"))


def _earlier_work(task: EngineTask) -> bool:
    """Whether the item's branch already holds commits of its own (past the integration
    branch, else main): an earlier attempt of this job did the work (its worker died after
    the run, which a loop service finishes), so a replay that changes nothing is no fault."""
    workdir = task.worktree or task.workdir
    if workdir is None:
        return False
    for base in ("vibey/integration", "main"):
        count = _git(workdir, "rev-list", "--count", f"{base}..HEAD")
        if count is not None:
            return count.isdigit() and int(count) > 0
    return False


def _git(cwd: Path, *args: str) -> str | None:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    return done.stdout.strip() if done.returncode == 0 else None
