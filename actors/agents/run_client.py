"""The caller's side of the run protocol: a step whose engine runs in a loop service.

An engine with ``invocation = "service"`` is still its CLI adapter (:mod:`actors.agents.cli`):
the worker writes the plan, builds the CLI's arguments, and judges the run from the
transcript, exactly as in subprocess mode. Only the launch differs (:class:`ServiceLaunch`):
the worker sends a ``vibey.run.request/1`` to ``<p>.runs.<engine>`` and waits for the result
on its own exclusive reply queue (:class:`RunClient`).

**The wait.** This first version waits in the worker's thread: a blocking wait on the reply
queue, whose AMQP heartbeats pika keeps serving while it waits; the job's lease is kept by the
worker's heartbeat thread, as for a subprocess run. The thread is held for the run's length
(as it is in subprocess mode); it is not for the queue wait, which is bounded by the engine's
``queue_wait_seconds``.

=======================================  =================================================
what happened                            what the step sees
=======================================  =================================================
no ``accepted`` by ``start_by``          :class:`EngineQueueSaturated`: the step defers,
(the service is saturated or down)       ``capacity=False``, no attempt burned
``rejected: worktree busy``              :class:`~actors.agents.lease.WorktreeBusy`: defers
``rejected`` as late                     :class:`EngineQueueSaturated`
``superseded``, ``abandoned`` (the       :class:`RunCut`: defers, no attempt burned, no
fleet cut it: a higher attempt, its      circuit failure recorded
service gone or drained)
``abandoned`` for the job's              an engine fault: the attempt fails (each further
``abandoned_runs``-th time (default 5)   cut too), so the job's attempts run out and it
                                         fails or parks like other exhausted work
``rejected`` otherwise (forged, no       an engine fault (the job's attempt fails)
binary), ``dead_lettered``, no result
by the deadline
``exited`` with 75 (a wind-down)         :class:`RunWoundDown`: defers, no attempt burned
``exited`` / ``deadline_exceeded``       the adapter judges the transcript, as ever
``progress`` (its output's new lines)    logged at DEBUG and handed to ``on_progress``;
                                         a ``seq`` gap logged at WARNING; never evidence
the reply lost (connection gone, reply   the result file ``<cwd>/.vibey/diagnostics/
queue gone)                              <run_id>.result.json`` is read until the deadline
=======================================  =================================================
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import pika
import pika.exceptions

from actors.agents.base import EngineError, EngineTask, EngineVerdict
from actors.agents.cli import fault
from actors.agents.lease import WorktreeBusy
from actors.agents.process import Exit
from actors.agents.roster import AgentSpec
from actors.agents.run_host import BUSY, output_paths, read_result
from actors.amqp import parameters
from actors.runs_topology import RunsTopology, declare_reply_queue
from workflows.runs import (
    Purpose,
    RunAccepted,
    RunCodecError,
    RunProgress,
    RunRequest,
    RunResult,
    RunStatus,
    ServiceStatus,
    Supersedes,
    decode,
    encode,
)

NOT_FOUND = 404  # AMQP reply code: the exchange published to does not exist
log = logging.getLogger("vibey.run_client")
POLL_S = 1.0
SLACK = timedelta(seconds=30)  # past the deadline, before the result file is given up on
UNSET_REPLY = "unset"


WIND_DOWN_EXIT = 75  # the engine wound down on request (EX_TEMPFAIL): run it again later


class RunDeferred(EngineError):
    """The run did not happen, or stopped short, for a reason that is not the work's nor the
    engine's capacity: the step defers with ``capacity=False`` (no attempt burned, no circuit
    opened)."""


class EngineQueueSaturated(RunDeferred):
    """No loop service accepted the run by its ``start_by`` (or it arrived late)."""


class RunWoundDown(RunDeferred):
    """The engine exited 75: it wound down on request, and the step runs again later."""


class RunCut(RunDeferred):
    """The fleet cut the run short: a higher attempt superseded it, or its service went away
    or drained. Neither the work's fault nor the engine's: no attempt, no circuit failure."""


@dataclass(frozen=True, slots=True)
class RunClient:
    """Sends run requests to one prefix's loop services and waits for their results."""

    amqp_url: str
    topology: RunsTopology
    poll: float = POLL_S
    on_progress: Callable[[RunProgress], None] | None = None  # besides the DEBUG log line

    def request(
        self,
        spec: AgentSpec,
        args: Sequence[str],
        cwd: Path,
        *,
        purpose: Purpose = Purpose.RUN,
        supersedes: Supersedes | None = None,
        caller: str = "",
        deadline_seconds: float | None = None,
    ) -> RunRequest:
        now = datetime.now(UTC)
        return RunRequest(
            run_id=uuid.uuid4(),
            engine=spec.id,
            purpose=purpose,
            args=tuple(args),
            cwd=str(cwd.resolve()),
            supersedes=supersedes,
            deadline_seconds=deadline_seconds or spec.timeout_seconds,
            start_by=now + timedelta(seconds=spec.queue_wait_seconds),
            requested_at=now,
            reply_to=UNSET_REPLY,
            caller=caller,
        )

    def run(
        self, request: RunRequest, on_status: Callable[[ServiceStatus], None] | None = None
    ) -> RunResult:
        """Sends ``request`` (its ``reply_to`` set to a fresh reply queue) and returns its
        result; :class:`EngineQueueSaturated` when nothing accepted it by its ``start_by``.
        A probe's ``status`` (the service's runs in flight) goes to ``on_status``."""
        params = parameters(self.amqp_url)
        for one in params:
            one.client_properties = {"connection_name": f"vibey-run-{request.run_id}"}
        connection = pika.BlockingConnection(params)
        try:
            channel = connection.channel()
            reply = declare_reply_queue(channel)
            sent = _with_reply(request, reply)
            try:
                self._send(channel, sent)
            except pika.exceptions.ChannelClosedByBroker as exc:
                if exc.reply_code != NOT_FOUND:
                    raise
                # No runs exchange yet (no loop service ever started, or it is still starting):
                # the request was refused, not lost; there is no result file to wait for.
                raise EngineQueueSaturated(
                    f"no run exchange for engine {request.engine} ({exc.reply_text}): start "
                    f"`vibey loop-service --engine {request.engine}`"
                ) from None
            return self._wait(channel, sent, on_status)
        except pika.exceptions.AMQPError as exc:
            log.warning(
                "run %s: the reply is lost (%r); reading its result file", request.run_id, exc
            )
            return self._from_file(request)
        finally:
            if connection.is_open:
                connection.close()

    def queue_status(self, engine: str) -> tuple[int, int] | None:
        """``(consumers, queued requests)`` of the engine's run queue; None when it is not
        declared (no service ever started) or the broker does not answer."""
        try:
            connection = pika.BlockingConnection(parameters(self.amqp_url, timeout=5))
        except pika.exceptions.AMQPError:
            return None
        try:
            frame = connection.channel().queue_declare(self.topology.queue(engine), passive=True)
            return int(frame.method.consumer_count), int(frame.method.message_count)
        except pika.exceptions.AMQPError:
            return None
        finally:
            if connection.is_open:
                connection.close()

    def probe(
        self,
        spec: AgentSpec,
        cwd: Path,
        args: Sequence[str],
        wait: float,
        on_status: Callable[[ServiceStatus], None] | None = None,
    ) -> RunResult:
        """A probe (``args``: the adapter's version argv) answered within ``wait`` seconds;
        :class:`EngineQueueSaturated` when no service answered. The answering service's
        status (its runs in flight) goes to ``on_status``."""
        request = self.request(replace(spec, queue_wait_seconds=wait), args, cwd,
                               purpose=Purpose.PROBE, deadline_seconds=wait)  # fmt: skip
        return self.run(request, on_status)

    def _send(self, channel: Any, request: RunRequest) -> None:
        channel.confirm_delivery()
        key = (
            self.topology.probe_key(request.engine)
            if request.purpose is Purpose.PROBE
            else self.topology.run_key(request.engine)
        )
        properties = pika.BasicProperties(
            message_id=str(request.run_id),
            correlation_id=str(request.run_id),
            reply_to=request.reply_to,
            delivery_mode=2,
            content_type="application/json",
        )
        try:
            channel.basic_publish(
                self.topology.exchange, key, encode(request), properties, mandatory=True
            )
        except pika.exceptions.UnroutableError:
            raise EngineQueueSaturated(
                f"no queue for engine {request.engine}: start `vibey loop-service --engine "
                f"{request.engine}`"
            ) from None

    def _wait(
        self,
        channel: Any,
        request: RunRequest,
        on_status: Callable[[ServiceStatus], None] | None = None,
    ) -> RunResult:
        accepted = False
        progress = _Progress(request.run_id, self.on_progress)
        give_up = request.start_by + timedelta(seconds=request.deadline_seconds) + SLACK
        for method, _properties, body in channel.consume(
            request.reply_to, auto_ack=True, inactivity_timeout=self.poll
        ):
            now = datetime.now(UTC)
            if method is not None:
                message = _decoded(body)
                if isinstance(message, RunResult) and message.run_id == request.run_id:
                    progress.ended()
                    return message
                if isinstance(message, RunProgress) and message.run_id == request.run_id:
                    progress.record(message)
                status = isinstance(message, ServiceStatus) and message.run_id == request.run_id
                if status and on_status is not None:
                    on_status(message)  # type: ignore[arg-type]
                accepted = accepted or (
                    isinstance(message, RunAccepted) and message.run_id == request.run_id
                )
            if not accepted and now > request.start_by:
                raise EngineQueueSaturated(
                    f"engine {request.engine}: no loop service accepted run {request.run_id} "
                    f"within {(request.start_by - request.requested_at).total_seconds():g} s"
                )
            found = read_result(request.cwd, request.run_id) if accepted else None
            if found is not None:  # the reply was lost, the file was written
                return found
            if now > give_up:
                break
        return self._from_file(request)

    def _from_file(self, request: RunRequest) -> RunResult:
        give_up = request.start_by + timedelta(seconds=request.deadline_seconds) + SLACK
        while True:
            found = read_result(request.cwd, request.run_id)
            if found is not None:
                return found
            if datetime.now(UTC) > give_up:
                return RunResult(
                    request.run_id,
                    RunStatus.ABANDONED,
                    None,
                    None,
                    datetime.now(UTC),
                    "no result arrived and none was written by the deadline",
                )
            time.sleep(self.poll)


class _Progress:
    """A run's progress messages as the caller records them: each line logged at DEBUG (and
    handed to ``on_progress``), a gap in ``seq`` (a lost message) at WARNING, the count at
    the end. Advisory: the step's evidence is still the transcript on disk."""

    def __init__(self, run_id: UUID, on_progress: Callable[[RunProgress], None] | None) -> None:
        self.run_id = run_id
        self._on_progress = on_progress
        self.next_seq = 0
        self.lost = 0

    def record(self, message: RunProgress) -> None:
        if message.seq > self.next_seq:
            self.lost += message.seq - self.next_seq
            log.warning("run %s: progress %d-%d lost", self.run_id, self.next_seq, message.seq - 1)
        self.next_seq = max(self.next_seq, message.seq + 1)
        log.debug("run %s progress %d: %s", self.run_id, message.seq, message.line[:300])
        if self._on_progress is not None:
            self._on_progress(message)

    def ended(self) -> None:
        if self.next_seq:
            log.info("run %s: %d progress line(s), %d lost", self.run_id, self.next_seq, self.lost)


def _with_reply(request: RunRequest, reply_to: str) -> RunRequest:
    return replace(request, reply_to=reply_to)


def _decoded(body: bytes) -> object:
    try:
        return decode(body)
    except RunCodecError:
        return None


def abandoned_path(workdir: Path, key: str) -> Path:
    """Where the runs of run key ``key`` (a job) that came back ``abandoned`` are counted."""
    digest = hashlib.sha256(key.encode("utf-8")).hexdigest()[:24]
    return workdir / ".vibey" / "diagnostics" / f"abandoned-{digest}.jsonl"


def record_abandoned(workdir: Path, key: str, run_id: UUID, detail: str) -> int:
    """Appends one abandoned run of ``key`` (once per run id); how many there are now."""
    path = abandoned_path(workdir, key)
    path.parent.mkdir(parents=True, exist_ok=True)
    seen = path.read_text(encoding="utf-8").splitlines() if path.exists() else []
    runs = {_run_id_of(line) for line in seen} - {None}
    if str(run_id) not in runs:
        line = json.dumps({"key": key, "run_id": str(run_id), "detail": detail[:500]})
        with path.open("a", encoding="utf-8") as out:
            out.write(line + "\n")
        runs.add(str(run_id))
    return len(runs)


def _run_id_of(line: str) -> str | None:
    try:
        found = json.loads(line).get("run_id")
    except (ValueError, AttributeError):
        return None
    return found if isinstance(found, str) else None


class ServiceLaunch:
    """A :data:`~actors.agents.cli.Launch` that runs the CLI in the engine's loop service."""

    def __init__(self, spec: AgentSpec, client: RunClient, *, caller: str = "") -> None:
        self.spec = spec
        self.client = client
        self.caller = caller

    def __call__(
        self, task: EngineTask, args: Sequence[str], workdir: Path
    ) -> tuple[Exit, Path, str] | EngineVerdict:
        key = task.job_id or f"{task.project_id}:{task.kind}:{task.subject}"
        request = self.client.request(
            self.spec, args, workdir, supersedes=Supersedes(key, task.attempt), caller=self.caller
        )
        result = self.client.run(request)
        stdout, stderr = output_paths(request.cwd, request.run_id)
        return self._ended(request, result, workdir, stdout, stderr)

    def _ended(
        self, request: RunRequest, result: RunResult, workdir: Path, stdout: Path, stderr: Path
    ) -> tuple[Exit, Path, str] | EngineVerdict:
        engine = self.spec.id
        if result.status is RunStatus.REJECTED and result.detail.startswith(BUSY):
            raise WorktreeBusy(workdir, None)
        if result.status is RunStatus.REJECTED and result.detail.startswith("late"):
            raise EngineQueueSaturated(f"engine {engine}: {result.detail}")
        cut = result.status in (RunStatus.SUPERSEDED, RunStatus.ABANDONED)
        if cut and result.service_instance:
            detail = f"engine {engine}: run {request.run_id} {result.status}: {result.detail}"
            if result.status is RunStatus.ABANDONED and request.supersedes is not None:
                count = record_abandoned(workdir, request.supersedes.key, request.run_id, detail)
                if count >= self.spec.abandoned_runs:
                    limit = f"the limit is {self.spec.abandoned_runs}, [engines.{engine}]"
                    evidence = {"engine_id": engine, "run_id": str(request.run_id)}
                    return fault(
                        f"{detail}; its runs were abandoned {count} times ({limit} "
                        "abandoned_runs): this attempt fails",
                        {**evidence, "abandoned": count},
                    )
            raise RunCut(detail)
        if result.status not in (RunStatus.EXITED, RunStatus.DEADLINE_EXCEEDED):
            detail = f"engine {engine}: run {request.run_id} {result.status}: {result.detail}"
            return fault(detail, {"engine_id": engine, "run_id": str(request.run_id)})
        if not stdout.exists():
            stdout.parent.mkdir(parents=True, exist_ok=True)
            stdout.touch()
        if result.status is RunStatus.EXITED and result.exit_code == WIND_DOWN_EXIT:
            raise RunWoundDown(f"engine {engine}: run {request.run_id} wound down (exit 75)")
        timed_out = result.status is RunStatus.DEADLINE_EXCEEDED
        code = result.exit_code if result.exit_code is not None else -9
        text = stderr.read_text(encoding="utf-8", errors="replace") if stderr.exists() else ""
        return Exit(0, code, timed_out=timed_out), stdout, text
