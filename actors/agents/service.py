"""``vibey loop-service --engine <id>``: one long-lived process per engine, fed by RabbitMQ.

The service consumes ``<p>.runs.<engine>`` (:mod:`actors.runs_topology`) and hands each request
to its :class:`~actors.agents.run_host.RunHost`, which runs the engine's CLI adapter. One pika
connection, owned by the thread that calls :meth:`LoopService.run`; runs and probes execute in
their own threads and hand back to it through ``add_callback_threadsafe``. Per request:

1. not a request, or forged (another engine, a cwd outside the root, another argv, an
   environment or a binary in the message) → ``rejected`` with the reason to ``reply_to``, the
   body republished to ``<p>.runs.dlx`` with the reason in ``x-vibey-rejected``, acked;
2. its result file exists (a redelivery) → that result is republished, acked;
   it started once and runs nowhere here → ``abandoned``;
3. late (past ``start_by``) → ``rejected``;
4. the worktree's run (:func:`~actors.agents.run_host.admit`): free → start; the same run →
   attach the delivery to it; a lower attempt of the same key → stop it, ``superseded`` for it,
   then start; a higher one → ``superseded`` for this one; another key → ``rejected: worktree
   busy`` (the caller defers without burning an attempt; nothing queues behind a run).

A started run sends ``accepted`` (pid, instance), then its output's new lines as ``progress``
(every ``progress_every`` s, ``seq`` counting from 0; advisory, never the caller's evidence)
and, at its end, its result is written to
``<cwd>/.vibey/diagnostics/<run_id>.result.json``, published with a publisher confirm, and only
then is the request acked. The broker prefetch is ``prefetch + 1``: the extra slot lets a
superseding or a busy request be answered while ``prefetch`` runs are in progress; a request
that may start but finds every slot taken waits in the service (its ``start_by`` is checked
again when it starts).

Probes (``<p>.runs.<engine>.probe``) are consumed on their own channel and run in their own
threads, so they are answered while a long run is in progress; each is answered first with a
``status`` (the runs in flight here, the probe answered before this one), then its result.
Control messages (stop, wind_down) arrive on an exclusive queue bound to
``<p>.runs.control`` with key ``<engine>``.

A request the broker dead-letters (its delivery limit reached: it crashed its service each
time) is copied by the dead-letter fanout to ``<p>.runs.dead.answers``, which every service
consumes: the caller named in its ``reply_to`` gets ``dead_lettered`` at once (and the result
file is written), instead of waiting for its deadline; ``<p>.runs.dead`` keeps the original.

SIGTERM drains: consuming stops, runs get ``drain_grace`` seconds to finish, then are stopped
(``abandoned``); an unstarted request is returned to the queue.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from uuid import UUID

import pika
import pika.exceptions

from actors.agents.roster import AgentSpec
from actors.agents.run_host import (
    BUSY,
    Active,
    Admission,
    RunHost,
    admit,
    output_paths,
    read_result,
    write_result,
)
from actors.agents.watchdog import Heartbeat
from actors.amqp import parameters
from actors.capabilities import detect
from actors.runs_topology import REJECTED_HEADER, RunsTopology
from workflows.runs import (
    MAX_IN_FLIGHT,
    MAX_TEXT_CHARS,
    ControlCommand,
    InFlight,
    Purpose,
    RunAccepted,
    RunCodecError,
    RunControl,
    RunProgress,
    RunRequest,
    RunResult,
    RunStatus,
    ServiceStatus,
    decode,
    decode_request,
    encode,
    is_late,
)

log = logging.getLogger("vibey.loop_service")
PROBE_PREFETCH = 4
CONTENT_TYPE = "application/json"
RECONNECT_S = 1.0
PROGRESS_EVERY_S = 1.0  # how often a run's new output lines are sent as progress (0: never)
PROGRESS_BYTES = 256 * 1024  # read of the output a tick at most; the rest at the next


@dataclass
class _Deliveries:
    """The unacked deliveries of each run, and the request waiting for a free slot."""

    tags: dict[str, list[tuple[Any, int]]] = field(default_factory=dict)
    listeners: dict[str, set[str]] = field(default_factory=dict)  # other reply queues of a run
    waiting: list[tuple[RunRequest, Any, int]] = field(default_factory=list)


class LoopService:
    def __init__(
        self,
        *,
        host: RunHost,
        amqp_url: str,
        topology: RunsTopology,
        prefetch: int = 1,
        drain_grace: float = 60.0,
        heartbeat: Heartbeat | None = None,
        progress_every: float = PROGRESS_EVERY_S,
    ) -> None:
        self.host = host
        self._heartbeat = heartbeat
        self._progress_every = progress_every
        self._tailers: dict[str, threading.Thread] = {}  # run id → its progress thread
        self._last_probe: tuple[datetime, str] | None = None  # when, and its outcome
        self.engine = host.spec.id
        self._url = amqp_url
        self._topology = topology
        self._prefetch = prefetch
        self._drain_grace = drain_grace
        self._deliveries = _Deliveries()
        self._connection: Any = None
        self._publisher: Any = None
        self._running = 0
        self._queued: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self.ready = threading.Event()  # consuming (tests wait for it)

    # -- the loop ------------------------------------------------------------------------------

    def run(self, stop: threading.Event) -> None:
        """Serves until ``stop`` is set, reconnecting when the broker goes away; then drains."""
        while not stop.is_set():
            self._beat()
            try:
                self._serve(stop)
            except pika.exceptions.AMQPError as exc:
                self.ready.clear()
                log.warning("loop service %s: the broker connection failed (%s)", self.engine, exc)
                time.sleep(RECONNECT_S)

    def _serve(self, stop: threading.Event) -> None:
        connection = pika.BlockingConnection(parameters(self._url))
        self._connection = connection
        try:
            caps = detect(connection)
            setup = connection.channel()
            self._topology.declare(setup, caps)
            self._publisher = connection.channel()
            self._publisher.confirm_delivery()
            runs = connection.channel()
            runs.basic_qos(prefetch_count=self._prefetch + 1)
            tag = runs.basic_consume(self._topology.queue(self.engine), self._on_run)
            probes = connection.channel()
            probes.basic_qos(prefetch_count=PROBE_PREFETCH)
            probes.basic_consume(self._topology.probe_queue(self.engine), self._on_probe)
            control = connection.channel()
            queue = self._topology.declare_control_queue(control, self.engine)
            control.basic_consume(queue, self._on_control, auto_ack=True)
            dead = connection.channel()
            dead.basic_qos(prefetch_count=PROBE_PREFETCH)
            dead.basic_consume(self._topology.dead_answers_queue, self._on_dead)
            self._deliveries.tags.clear()  # the old channels' deliveries come back redelivered
            self._deliveries.waiting.clear()
            self._run_queued()
            self.ready.set()
            while not stop.is_set():
                self._process(connection)
            self._drain(runs, tag)
        finally:
            self.ready.clear()
            if connection.is_open:
                connection.close()

    def _drain(self, runs: Any, tag: str) -> None:
        runs.basic_cancel(tag)
        for _request, channel, delivery in self._deliveries.waiting:
            channel.basic_nack(delivery, requeue=True)
        self._deliveries.waiting.clear()
        deadline = time.monotonic() + self._drain_grace
        while self.host.active() and time.monotonic() < deadline:
            self._process(self._connection)
        for active in self.host.active():
            active.why_stopped, active.detail = RunStatus.ABANDONED, "the service drained"
            active.stop.set()
        while self._running:
            self._process(self._connection)

    # -- run requests --------------------------------------------------------------------------

    def _on_run(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        try:
            request = decode_request(body)
        except RunCodecError as exc:
            self._forged(channel, method.delivery_tag, properties, body, str(exc), None)
            return
        why = self.host.check(request)
        if why is not None:
            self._forged(channel, method.delivery_tag, properties, body, why, request)
            return
        self._admit(request, channel, method.delivery_tag)

    def _admit(self, request: RunRequest, channel: Any, delivery: int) -> None:
        existing = read_result(request.cwd, request.run_id)
        if existing is not None:
            log.info("run %s: redelivered; its result is republished", request.run_id)
            self._settle(request, existing, [(channel, delivery)], persist=False)
            return
        active = self.host.find(request.run_id)
        if active is not None:  # redelivered while it runs here: its end settles this one too
            self._attach(active, request, channel, delivery)
            return
        if self.host.orphaned(request):
            ended = self.host.ended(request, RunStatus.ABANDONED, "its service went away mid-run")
            self._settle(request, ended, [(channel, delivery)])
            return
        if is_late(request, datetime.now(UTC)):
            late = f"late: start_by {request.start_by.isoformat()} has passed"
            self._settle(
                request, self.host.ended(request, RunStatus.REJECTED, late), [(channel, delivery)]
            )
            return
        if self._running >= self._prefetch:
            decision, active = self._peek(request)
            if decision is Admission.START:
                self._deliveries.waiting.append((request, channel, delivery))
                return
        decision, active = self.host.admit(request)
        self._act(decision, active, request, channel, delivery)

    def _peek(self, request: RunRequest) -> tuple[Admission, Active | None]:
        cwd = os.path.realpath(request.cwd)
        same = [a for a in self.host.active() if os.path.realpath(a.request.cwd) == cwd]
        current = same[0] if same else None
        return admit(None if current is None else current.request, request), current

    def _act(
        self,
        decision: Admission,
        active: Active | None,
        request: RunRequest,
        channel: Any,
        delivery: int,
    ) -> None:
        run_id = str(request.run_id)
        if decision is Admission.START:
            assert active is not None
            self._deliveries.tags[run_id] = [(channel, delivery)]
            self._spawn(lambda: self._execute(active), f"run-{run_id}")
        elif decision is Admission.ATTACH:
            assert active is not None
            self._attach(active, request, channel, delivery)
        elif decision is Admission.SUPERSEDE:
            assert active is not None
            self._deliveries.tags[run_id] = [(channel, delivery)]
            self._spawn(lambda: self._supersede(active, request), f"supersede-{run_id}")
        elif decision is Admission.STALE:
            holder = active.request if active is not None else None
            held = holder.supersedes.attempt if holder and holder.supersedes else "?"
            ended = self.host.ended(
                request, RunStatus.SUPERSEDED, f"attempt {held} holds the worktree"
            )
            self._settle(request, ended, [(channel, delivery)])
        else:
            who = active.request if active is not None else None
            key = who.supersedes.key if who is not None and who.supersedes else "none"
            detail = f"{BUSY}: run {who.run_id if who else '?'} (run key {key}) works there"
            self._settle(
                request, self.host.ended(request, RunStatus.REJECTED, detail), [(channel, delivery)]
            )

    def _spawn(self, target: Callable[[], None], name: str) -> None:
        self._running += 1
        threading.Thread(target=target, name=name, daemon=True).start()

    def _supersede(self, old: Active, request: RunRequest) -> None:
        log.info("run %s supersedes run %s", request.run_id, old.request.run_id)
        active = self.host.supersede(old, request)
        if active is None:
            ended = self.host.ended(request, RunStatus.REJECTED, f"{BUSY}: taken meanwhile")
            write_result(request.cwd, ended)
            self._later(lambda: self._finish(request, ended))
            return
        old.settled.wait(self.host.spec.supersede_grace_seconds + 10)  # superseded published
        self._execute(active)

    def _execute(self, active: Active) -> None:
        request = active.request
        try:
            result = self.host.execute(active, self._accepted)
        except Exception as exc:  # the run could not even start: say so, never hang the caller
            log.exception("run %s failed to start", request.run_id)
            result = self.host.ended(request, RunStatus.REJECTED, f"the service failed: {exc}")
            write_result(request.cwd, result)
        tailer = self._tailers.pop(str(request.run_id), None)
        if tailer is not None:  # its last lines go before the result
            tailer.join(5)
        self._later(lambda: self._finish(request, result, active))

    def _accepted(self, active: Active) -> None:
        assert active.pid is not None and active.started_at is not None
        accepted = RunAccepted(
            active.request.run_id, self.host.instance, active.pid, active.started_at
        )
        self._later(lambda: self._reply(active.request.reply_to, active.request.run_id, accepted))
        if self._progress_every > 0:
            name = f"progress-{active.request.run_id}"
            tailer = threading.Thread(target=self._tail, args=(active,), name=name, daemon=True)
            self._tailers[str(active.request.run_id)] = tailer
            tailer.start()

    def _tail(self, active: Active) -> None:
        """Sends each new line of the run's output (its transcript) as ``vibey.run.progress/1``,
        every ``progress_every`` s while it runs, then once more. Advisory: the caller's
        evidence is the transcript on disk, never these messages."""
        stdout = output_paths(active.request.cwd, active.request.run_id)[0]
        reply_to, run_id = active.request.reply_to, active.request.run_id
        seq, offset, partial = 0, 0, b""
        while True:
            ended = active.done.wait(self._progress_every)
            lines, offset, partial = _new_lines(stdout, offset, partial, ended)
            for line in lines:
                self._later(_progress_reply(self._reply, reply_to, RunProgress(run_id, seq, line)))
                seq += 1
            if ended and not partial and len(lines) == 0:
                return

    def _attach(self, active: Active, request: RunRequest, channel: Any, delivery: int) -> None:
        run_id = str(request.run_id)
        self._deliveries.tags.setdefault(run_id, []).append((channel, delivery))
        if request.reply_to != active.request.reply_to:
            self._deliveries.listeners.setdefault(run_id, set()).add(request.reply_to)
            if active.pid is not None and active.started_at is not None:
                accepted = RunAccepted(
                    request.run_id, self.host.instance, active.pid, active.started_at
                )
                self._reply(request.reply_to, request.run_id, accepted)

    def _finish(self, request: RunRequest, result: RunResult, active: Active | None = None) -> None:
        """On the connection's thread: publish, ack every delivery of the run, start the next."""
        self._running -= 1
        tags = self._deliveries.tags.pop(str(request.run_id), [])
        for reply_to in self._deliveries.listeners.pop(str(request.run_id), set()):
            self._reply(reply_to, request.run_id, result)
        self._settle(request, result, tags, persist=False)
        if active is not None:
            active.settled.set()
        while self._deliveries.waiting and self._running < self._prefetch:
            waiting, channel, delivery = self._deliveries.waiting.pop(0)
            self._admit(waiting, channel, delivery)

    def _settle(
        self,
        request: RunRequest,
        result: RunResult,
        deliveries: list[tuple[Any, int]],
        *,
        persist: bool = True,
    ) -> None:
        if persist:
            write_result(request.cwd, result)
        self._reply(request.reply_to, request.run_id, result)
        for channel, delivery in deliveries:
            try:
                channel.basic_ack(delivery)
            except pika.exceptions.AMQPError:  # its channel died: the redelivery is settled
                log.info("run %s: its delivery's channel is gone", request.run_id)

    def _forged(
        self,
        channel: Any,
        delivery: int,
        properties: Any,
        body: bytes,
        why: str,
        request: RunRequest | None,
    ) -> None:
        log.warning("loop service %s: a request is refused and dead-lettered: %s", self.engine, why)
        reply_to = request.reply_to if request is not None else properties.reply_to
        if reply_to and request is not None:
            self._reply(reply_to, request.run_id, self.host.ended(request, RunStatus.REJECTED, why))
        elif reply_to and _uuid_or_none(properties.correlation_id) is not None:
            run_id = _uuid_or_none(properties.correlation_id)
            assert run_id is not None
            now = datetime.now(UTC)
            refused = RunResult(
                run_id, RunStatus.REJECTED, None, None, now, why, self.host.instance
            )
            self._reply(reply_to, run_id, refused)
        headers = {REJECTED_HEADER: why[:500], "x-vibey-engine": self.engine}
        self._publisher.basic_publish(
            self._topology.dead_exchange,
            self.engine,
            body,
            pika.BasicProperties(headers=headers, delivery_mode=2, content_type=CONTENT_TYPE),
        )
        channel.basic_ack(delivery)

    # -- dead-lettered requests ----------------------------------------------------------------

    def _on_dead(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        """A dead-lettered request (a copy from ``<p>.runs.dead.answers``): its caller is told
        ``dead_lettered`` now instead of waiting for its deadline. A forged request was answered
        ``rejected`` when it was refused (its ``x-vibey-rejected`` header); one that is not a
        request at all names no caller. Its result file is written when the request is this
        engine's and passes :meth:`RunHost.check` (a caller whose reply is lost reads it)."""
        headers = properties.headers or {}
        try:
            request = decode_request(body)
        except RunCodecError:
            request = None
        if request is not None and REJECTED_HEADER not in headers:
            detail = f"dead-lettered ({_death_reason(headers)}): its service never settled it"
            result = self.host.ended(request, RunStatus.DEAD_LETTERED, detail)
            mine = request.engine == self.engine and self.host.check(request) is None
            if mine and read_result(request.cwd, request.run_id) is None:
                write_result(request.cwd, result)
            log.warning("run %s of engine %s: %s", request.run_id, request.engine, detail)
            self._reply(request.reply_to, request.run_id, result)
        channel.basic_ack(method.delivery_tag)

    # -- probes and control --------------------------------------------------------------------

    def _on_probe(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        try:
            request = decode_request(body)
        except RunCodecError as exc:
            self._forged(channel, method.delivery_tag, properties, body, str(exc), None)
            return
        why = self.host.check(request)
        if why is None and request.purpose is not Purpose.PROBE:
            why = "the probe queue takes probes only"
        if why is not None:
            self._forged(channel, method.delivery_tag, properties, body, why, request)
            return

        self._reply(request.reply_to, request.run_id, self._status(request))

        def probe() -> None:
            result = self.host.probe(request)
            self._later(lambda: self._probed(channel, method.delivery_tag, request, result))

        threading.Thread(target=probe, name=f"probe-{request.run_id}", daemon=True).start()

    def _status(self, probe: RunRequest) -> ServiceStatus:
        """This service's status for ``probe``: its runs in flight, its previous probe."""
        runs = tuple(
            InFlight(a.request.run_id, a.request.cwd, a.started_at) for a in self.host.active()
        )[:MAX_IN_FLIGHT]
        at, outcome = self._last_probe or (None, "")
        return ServiceStatus(probe.run_id, self.host.instance, datetime.now(UTC), runs, at, outcome)

    def _probed(self, channel: Any, delivery: int, request: RunRequest, result: RunResult) -> None:
        answer = result.detail.strip().splitlines()[:1] or [""]
        self._last_probe = (result.finished_at, f"{result.status.value}: {answer[0][:200]}")
        self._reply(request.reply_to, request.run_id, result)
        channel.basic_ack(delivery)

    def _on_control(self, channel: Any, method: Any, properties: Any, body: bytes) -> None:
        try:
            message = decode(body)
        except RunCodecError as exc:
            log.warning("loop service %s: a control message is refused: %s", self.engine, exc)
            return
        if not isinstance(message, RunControl) or message.engine != self.engine:
            return
        active = self.host.find(message.run_id)
        if active is None:
            return
        if message.command is ControlCommand.STOP:
            active.why_stopped, active.detail = RunStatus.ABANDONED, "stopped by a control message"
            active.stop.set()
            return
        inbox = Path(active.request.cwd) / ".vibey" / "inbox"
        inbox.mkdir(parents=True, exist_ok=True)
        command = json.dumps({"command": "wind_down"})
        (inbox / f"{message.run_id}-wind-down.json").write_text(command, encoding="utf-8")
        grace = self.host.spec.supersede_grace_seconds

        def wind_down() -> None:
            if not active.done.wait(grace):
                active.why_stopped, active.detail = RunStatus.ABANDONED, "wound down"
                active.stop.set()

        threading.Thread(target=wind_down, daemon=True).start()

    # -- publishing (on the connection's thread) -----------------------------------------------

    def _later(self, callback: Callable[[], None]) -> None:
        """Runs ``callback`` on the connection's thread. It is queued, so a run that ends while
        the broker is away is settled after the reconnect; the loop is woken when it can be."""
        self._queued.put(callback)
        with contextlib.suppress(pika.exceptions.AMQPError, AttributeError):
            self._connection.add_callback_threadsafe(self._run_queued)

    def _run_queued(self) -> None:
        while True:
            try:
                callback = self._queued.get_nowait()
            except queue.Empty:
                return
            callback()

    def _process(self, connection: Any) -> None:
        connection.process_data_events(time_limit=0.2)
        self._run_queued()
        self._beat()

    def _beat(self) -> None:
        """The watchdog's heartbeat (:mod:`actors.agents.watchdog`), with the process groups
        of the runs in progress (the watchdog kills them when it kills a wedged service)."""
        if self._heartbeat is not None:
            self._heartbeat.beat(a.pid for a in self.host.active() if a.pid is not None)

    def _reply(
        self,
        reply_to: str,
        run_id: object,
        message: RunAccepted | RunProgress | RunResult | ServiceStatus,
    ) -> None:
        self._publish("", reply_to, encode(message), str(run_id))

    def _publish(self, exchange: str, key: str, body: bytes, correlation_id: str) -> None:
        properties = pika.BasicProperties(
            correlation_id=correlation_id, content_type=CONTENT_TYPE, delivery_mode=2
        )
        self._publisher.basic_publish(exchange, key, body, properties)  # not mandatory


def _progress_reply(
    reply: Callable[[str, object, RunProgress], None], reply_to: str, progress: RunProgress
) -> Callable[[], None]:
    return lambda: reply(reply_to, progress.run_id, progress)


def _new_lines(
    path: Path, offset: int, partial: bytes, ended: bool
) -> tuple[list[str], int, bytes]:
    """The whole lines written to ``path`` since ``offset`` (at most :data:`PROGRESS_BYTES` of
    it a tick; the last, unfinished line too once the run ``ended``), the new offset and the
    unfinished rest."""
    try:
        with path.open("rb") as out:
            out.seek(offset)
            chunk = out.read(PROGRESS_BYTES)
    except OSError:
        return [], offset, partial
    offset += len(chunk)
    *whole, partial = (partial + chunk).split(b"\n")
    if ended and partial and len(chunk) < PROGRESS_BYTES:
        whole, partial = [*whole, partial], b""
    lines = [line.decode("utf-8", "replace")[:MAX_TEXT_CHARS] for line in whole]
    return [line.replace("\x00", "") for line in lines if line.strip()], offset, partial


def _death_reason(headers: Mapping[str, Any]) -> str:
    """Why the broker dead-lettered a message (``x-first-death-reason``, else ``x-death``)."""
    reason = headers.get("x-first-death-reason")
    deaths = headers.get("x-death")
    if reason is None and isinstance(deaths, list) and deaths and isinstance(deaths[0], dict):
        reason = deaths[0].get("reason")
    if isinstance(reason, bytes):
        reason = reason.decode("utf-8", "replace")
    return str(reason or "unknown reason")


def _uuid_or_none(value: object) -> UUID | None:
    try:
        return UUID(str(value)) if value else None
    except ValueError:
        return None


def build_service(
    spec: AgentSpec,
    *,
    amqp_url: str,
    prefix: str,
    root: Path,
    agent_env: Mapping[str, str],
    state_dir: Path,
    drain_grace: float = 60.0,
    grace: float = 2.0,
    instance: str | None = None,
    heartbeat: Heartbeat | None = None,
    progress_every: float = PROGRESS_EVERY_S,
) -> LoopService:
    """The loop service of ``spec`` (an engine with a CLI adapter): its adapter gets the
    engine's own environment from ``agent_env`` and ``spec.env``, never from a message."""
    from actors.agents.adapters import CLI_ADAPTERS

    if spec.adapter not in CLI_ADAPTERS:
        raise ValueError(f"engine {spec.id}: a loop service hosts CLI adapters, not {spec.adapter}")
    if spec.local and spec.prefetch > 1:
        log.warning(
            "engine %s is local and its prefetch is %d: its runs share one machine's model",
            spec.id,
            spec.prefetch,
        )
    adapter = CLI_ADAPTERS[spec.adapter](
        spec, worker_env=agent_env, transcripts=state_dir / "transcripts"
    )
    name = instance or f"{socket.gethostname()}:{os.getpid()}"
    host = RunHost(adapter, root=root, instance=name, grace=grace)
    return LoopService(
        host=host,
        amqp_url=amqp_url,
        topology=RunsTopology(prefix, (spec.id,)),
        prefetch=spec.prefetch,
        drain_grace=drain_grace,
        heartbeat=heartbeat,
        progress_every=progress_every,
    )
