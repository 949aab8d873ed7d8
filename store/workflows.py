"""Workflow instances in PostgreSQL: start, record an event, answer a gate, cancel, verify.

Every write is one transaction that (1) locks the workflow row, (2) appends the event to the
workflow's history, (3) runs it through the definition (:func:`workflows.engine.apply`) and
(4) carries out the commands: steps become jobs (with their outbox rows on the RabbitMQ
backend), gates become gate rows, timers become timer jobs with ``run_after``. Events on one
workflow therefore serialise on its row, and each is applied exactly once.

A start, an answer and a cancel are each a span when the store is given event spans
(``store.event_spans``): the outbox rows of their transaction carry its traceparent.

Lock order, everywhere: the workflow row, then job rows, then gate rows. A step's settle
locks its workflow before its fenced job write (:meth:`WorkflowStore.settle_txn`), a gate
answer locks the workflow before the gate.

A definition that raises, a command the store cannot carry out, or a definition version this
process does not have never crash-loops a worker: the event is recorded undecided, the
workflow is ``blocked`` behind a ``workflow_error`` gate, and later events queue behind it.
Answering that gate ``retry`` applies the queued events (with whatever code now runs),
``cancel`` cancels the workflow. Answering a parked job's ``budget_exhausted`` gate ``stop``
cancels its workflow too (the answer locks the workflow first, as a workflow gate's does).

Exceptions::

    StoreError
    └── WorkflowNotFound    no workflow with that id, or none ever for that project
"""

from __future__ import annotations

import contextlib
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from types import MappingProxyType
from typing import Any
from uuid import UUID

import psycopg
from psycopg import Cursor
from psycopg import errors as pg_errors
from psycopg.rows import DictRow, dict_row
from psycopg.types.json import Jsonb

from store.db import Conn, Pool, fetch_all, fetch_one, statement, transaction
from store.errors import DecisionFailed, SettleRefused, StoreError
from store.event_spans import (
    NO_SPANS,
    EventSpan,
    EventSpans,
    answer_trace,
    event_span,
    traced_unit,
)
from store.events import drafted, emit_on
from store.gate_rows import gate_from_row
from store.jobs import ACKED, PostgresJobRepository, unread_batch
from store.ledger import Ledger
from store.retry import retried
from store.settle import event_facts, is_one_statement, settle_txn
from store.sql import load
from store.unit_of_work import UnitOfWork
from store.workflow_reads import (
    GateAnswerOutcome,
    HistoryEntry,
    StartOutcome,
    Verification,
    Workflow,
    WorkflowNotFound,
    WorkflowReads,
    workflow_from_row,
)
from workflows.budget import STOP
from workflows.effects import (
    Effects,
    StepToRun,
    WindDown,
    blocked,
    effects,
    error_text,
    settled_event,
    unblocked,
)
from workflows.engine import (
    CancelRequested,
    Command,
    Definition,
    Event,
    GateAnswered,
    Header,
    OpenGate,
    Registry,
    Started,
    Status,
    WorkflowError,
    apply,
    decode_event,
    encode_commands,
    encode_event,
    engine_rule,
)
from workflows.events import Draft, gate_opened, implied, recorded, status_changed
from workflows.gates import BUDGET_EXHAUSTED, RETRY_OR_CANCEL
from workflows.gates import WORKFLOW_ERROR as WORKFLOW_ERROR_GATE
from workflows.ledger import engine_events, open_finding_ids
from workflows.queue import (
    AnswerStatus,
    EnqueueRequest,
    Gate,
    Job,
    JsonObject,
    Settled,
)
from workflows.steps import Outcome, Success

Q = load("workflows.sql")
__all__ = [
    "GateAnswerOutcome",
    "HistoryEntry",
    "StartOutcome",
    "Verification",
    "Workflow",
    "WorkflowNotFound",
    "WorkflowStore",
]

WORKFLOW_ERROR = WORKFLOW_ERROR_GATE.name
REPLAY_CACHE = 10_000
WORKFLOW_ERROR_ANSWERS = RETRY_OR_CANCEL
LIVE_INDEX = "workflow_one_live_per_project"  # one running or blocked workflow a project
START_ROUNDS = 5  # starts sent again after projects found live, before the careful path


class WorkflowStore(WorkflowReads):
    def __init__(
        self,
        *,
        pool: Pool,
        jobs: PostgresJobRepository,
        registry: Registry,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        ledger: Ledger | None = None,
        events: EventSpans = NO_SPANS,
    ) -> None:
        """With ``ledger``, every applied event also appends the ledger events its definition
        says it produces (a definition's optional ``ledger_events``), in the same transaction.
        ``events``: the spans of a start, an answer and a cancel (``store.event_spans``)."""
        self._pool = pool
        self._events = events
        self._ledger = ledger
        self._jobs = jobs
        self._registry = registry
        self._clock = clock
        # Workflows whose history this process has replayed, with the definition and version
        # it replayed them through: bounded, oldest out.
        self._replayed: OrderedDict[UUID, tuple[str, int]] = OrderedDict()

    @property
    def registry(self) -> Registry:
        return self._registry

    @property
    def jobs(self) -> PostgresJobRepository:
        return self._jobs

    @property
    def events(self) -> EventSpans:
        return self._events

    # -- writes ----------------------------------------------------------------------------

    @retried("start a workflow", idempotent=False)
    def start(
        self, project_id: str, *, definition: str, input: JsonObject | None = None
    ) -> StartOutcome:
        """Start ``definition`` for the project, or find its live workflow (``created``
        false: nothing changed). One round trip and one commit (:meth:`start_many`)."""
        attributes = {"vibey.event.type": "workflow.started", "vibey.project": project_id}
        with event_span(self._events, "workflow started", attributes) as span:
            return self._start_all([(project_id, input or {})], definition, span)[0]

    @retried("start workflows", idempotent=False)
    def start_many(
        self, starts: Sequence[tuple[str, JsonObject]], *, definition: str
    ) -> list[StartOutcome]:
        """Start ``definition`` for each ``(project, input)`` in one transaction and one
        commit: all of them or, on an error, none (a project with a live workflow gets that
        one, as :meth:`start` gives it). Re-run after a commit cut off, it starts nothing
        twice: the starts that landed are the projects' live workflows.

        One round trip for the batch: every insert and what each first event decides (its
        history, jobs, outbox rows, domain events) are sent with the COMMIT and read after
        it. A project found live fails that transaction on the one-live-workflow index: its
        live workflow is read, and the others are sent again. A first event the careful path
        would block (a definition that raises, a command the store refuses) is started by
        that path: each insert read back, each decision under a savepoint
        (:meth:`start_txn`)."""
        return self._start_all(starts, definition, None)

    def _start_all(
        self, starts: Sequence[tuple[str, JsonObject]], definition: str, span: EventSpan | None
    ) -> list[StartOutcome]:
        chosen = self._registry.latest(definition)
        # Each project's new workflow id, the same whichever attempt commits it (a traced
        # start's span is in that workflow's trace).
        ids = {project: uuid.uuid4() for project, _ in starts}
        live: dict[str, Workflow] = {}
        made: dict[str, Workflow] = {}
        for _ in range(START_ROUNDS):
            todo = _firsts(starts, live)
            try:
                made = self._start_fresh(todo, chosen, ids, span) if todo else {}
                break
            except pg_errors.UniqueViolation as exc:
                if exc.diag.constraint_name != LIVE_INDEX:
                    return self._start_carefully(starts, definition, ids, span)
                live |= self._lives([project for project, _ in todo])
            except (StoreError, psycopg.OperationalError):
                raise
            except Exception:  # noqa: BLE001 - the careful path blocks it, or raises it
                return self._start_carefully(starts, definition, ids, span)
        else:
            return self._start_carefully(starts, definition, ids, span)
        outcomes: list[StartOutcome] = []
        for project, _ in starts:
            if project in made:  # the first start of the project in the batch made it
                outcomes.append(StartOutcome(made.pop(project), created=True))
                live[project] = outcomes[-1].workflow
            else:
                outcomes.append(StartOutcome(live[project], created=False))
        return outcomes

    def _start_fresh(
        self,
        starts: Sequence[tuple[str, JsonObject]],
        chosen: Definition[Any],
        ids: Mapping[str, UUID],
        span: EventSpan | None,
    ) -> dict[str, Workflow]:
        """Start each project (none has two starts here) in one unit and one round trip;
        raises what the unit raised (a project's live workflow: ``UniqueViolation``)."""
        with self._jobs.units.begin() as unit:
            made = [
                self._send_start(unit, chosen, ids[project], project, input)
                for project, input in starts
            ]
            if span is not None:
                first = made[0][0]
                unit.trace(
                    span.traceparent(
                        first.id,
                        {
                            "vibey.workflow.id": str(first.id),
                            "vibey.workflow.definition": first.definition,
                        },
                    )
                )
        workflows = [read() for _, read in made]  # their rows came back with the COMMIT
        return {w.project_id: w for w in workflows}

    def _send_start(
        self,
        unit: UnitOfWork,
        chosen: Definition[Any],
        workflow_id: UUID,
        project_id: str,
        input: JsonObject,
    ) -> tuple[Workflow, Callable[[], Workflow]]:
        """Send a new workflow's insert and its first event's writes, reading nothing: the
        workflow as decided, and what reads its row once the unit committed."""
        now = self._clock()
        state = dict(chosen.encode_state(chosen.initial()))
        workflow = Workflow(
            id=workflow_id,
            project_id=project_id,
            definition=chosen.name,
            version=chosen.version,
            phase=chosen.first_phase,
            cycle=0,
            status=Status.RUNNING,
            completion_mode=None,
            reason=None,
            input=dict(input),
            state=state,
            last_seq=0,
            applied_seq=0,
            created_at=now,  # the row's now(), read after the commit
            updated_at=now,
            finished_at=None,
        )
        cur = unit.conn.cursor(row_factory=dict_row)
        cur.execute(
            Q["insert_new_workflow"].encode(),
            _new_row(workflow.id, project_id, chosen, input, state),
        )
        event = Started(input=dict(input))
        started = self._decide(
            unit, workflow, 1, event, now, pending=False, facts=recorded(event), created=True
        )

        def read() -> Workflow:
            with cur:
                row = cur.fetchone()
            if row is None:  # pragma: no cover - a committed insert returned its row
                raise StoreError(f"project {project_id}: the started workflow's row is missing")
            inserted = workflow_from_row(row)
            stamp = inserted.updated_at  # the transaction's now(), as its update stamped it
            return replace(
                started,
                input=inserted.input,
                created_at=inserted.created_at,
                updated_at=stamp,
                finished_at=stamp if started.status.finished else None,
            )

        return started, read

    def _start_carefully(
        self,
        starts: Sequence[tuple[str, JsonObject]],
        definition: str,
        ids: Mapping[str, UUID],
        span: EventSpan | None,
    ) -> list[StartOutcome]:
        """The starts one statement at a time (:meth:`start_txn`), in one unit."""
        with self._jobs.units.begin() as unit:
            outcomes = [
                self.start_txn(
                    unit, project, definition=definition, input=input, workflow_id=ids[project]
                )
                for project, input in starts
            ]
            first = outcomes[0].workflow
            if span is not None and outcomes[0].created:
                unit.trace(
                    span.traceparent(
                        first.id,
                        {
                            "vibey.workflow.id": str(first.id),
                            "vibey.workflow.definition": first.definition,
                        },
                    )
                )
        return outcomes

    def _lives(self, projects: Sequence[str]) -> dict[str, Workflow]:
        """The live workflows of ``projects`` (one statement)."""
        with statement(self._pool) as conn:
            rows = fetch_all(conn, Q["lives_for_projects"], {"projects": list(projects)})
        return {row["project_id"]: workflow_from_row(row) for row in rows}

    def start_txn(
        self,
        unit: UnitOfWork,
        project_id: str,
        *,
        definition: str,
        input: JsonObject,
        workflow_id: UUID | None = None,
    ) -> StartOutcome:
        """A start in the caller's unit, one statement at a time: the insert read back (a
        conflict: the live workflow read), the first event decided under a savepoint."""
        conn = unit.conn
        chosen = self._registry.latest(definition)
        row = fetch_one(
            conn,
            Q["insert_workflow"],
            _new_row(
                workflow_id or uuid.uuid4(),
                project_id,
                chosen,
                input,
                dict(chosen.encode_state(chosen.initial())),
            ),
        )
        if row is None:  # the project has a live workflow (the partial unique index)
            live = fetch_one(conn, Q["live_for_project"], {"project_id": project_id})
            if live is None:  # pragma: no cover - the conflict guarantees it
                raise StoreError(f"project {project_id}: workflow start conflicted and vanished")
            return StartOutcome(workflow_from_row(live), created=False)
        started = self._record(
            unit, workflow_from_row(row), Started(input=dict(input)), created=True
        )
        return StartOutcome(started, created=True)

    @retried("record a workflow event", idempotent=False)
    def record(self, workflow_id: UUID, event: Event) -> Workflow:
        """Record one event (and carry out what it decides) in its own transaction."""
        with self._jobs.units.begin() as unit:
            return self.record_txn(unit, workflow_id, event)

    def record_txn(self, unit: UnitOfWork, workflow_id: UUID, event: Event) -> Workflow:
        return self._record(unit, self._lock(unit.conn, workflow_id), event)

    @retried("cancel a workflow", idempotent=False)
    def cancel(self, workflow_id: UUID, *, by: str, reason: str = "") -> Workflow:
        return traced_unit(
            self._jobs.units.begin,
            self._events,
            "workflow cancelled",
            {"vibey.event.type": "workflow.cancelled", "vibey.cancelled_by": by},
            lambda unit: self.record_txn(unit, workflow_id, CancelRequested(by=by, reason=reason)),
            lambda done: (
                done.id,
                {"vibey.workflow.id": str(done.id), "vibey.status": done.status.value},
            ),
        )

    def settle(self, job: Job, outcome: Outcome) -> Settled:
        """A step's settle in a unit of work of its own (:meth:`settle_txn`): one commit. A
        plain job's nack and defer are one statement, with no BEGIN/COMMIT around it. A
        commit cut off mid-flight raises ``CommitUnknown``: the caller reads the row."""
        one = job.workflow_id is None and is_one_statement(outcome)
        with self._jobs.units.begin(one_statement=one) as unit:
            return self.settle_txn(unit, job, outcome)

    def settle_txn(
        self,
        unit: UnitOfWork,
        job: Job,
        outcome: Outcome,
        *,
        locked: Workflow | None = None,
        claimed: bool = False,
        savepoint: bool = True,
    ) -> Settled:
        """A step's settle, in the caller's unit of work: the fenced write ``outcome`` asks
        for (ack, nack, defer, park) and, for a workflow's step, first the workflow's lock
        (unless the caller took it: ``locked``) and, when the write applied and finished the
        step, its event (``StepSucceeded``/``TimerFired``/``StepFailed``) with everything
        it decides.

        ``claimed``: the caller claimed the job in this unit (a short step), so its fence
        holds till the commit. A success's ack is then not read before the event is decided:
        it travels with the decision's statements, and is checked before the commit (one
        round trip fewer); one that did not apply raises :class:`SettleRefused`, and the
        unit rolls back, the event with it.

        ``savepoint=False``: the event's decision runs without the savepoint that lets a
        failed one block the workflow and still commit the settle (one statement fewer a
        step); a decision that fails raises :class:`DecisionFailed` instead, and the caller
        rolls the unit back and settles again with it."""
        if job.workflow_id is None or job.step is None:
            return settle_txn(self._jobs, unit, job, outcome)
        conn = unit.conn
        workflow = locked or self._lock(conn, job.workflow_id)
        if claimed and isinstance(outcome, Success):
            acked = self._jobs.ack_unread_txn(unit, job.lease, result=outcome.result)
            self._settled(unit, workflow, job, job.step, outcome, ACKED, savepoint=savepoint)
            settled = acked()
            if settled != ACKED:
                raise SettleRefused(f"job {job.id}: the ack of a job claimed in its unit missed")
            return settled
        settled = settle_txn(self._jobs, unit, job, outcome)
        if settled.applied:
            self._settled(unit, workflow, job, job.step, outcome, settled, savepoint=savepoint)
        return settled

    def _settled(
        self,
        unit: UnitOfWork,
        workflow: Workflow,
        job: Job,
        step: str,
        outcome: Outcome,
        settled: Settled,
        *,
        savepoint: bool = True,
    ) -> None:
        """What a step's applied settle records on its workflow: its event, and what that
        decides (cancelled dependents, the engine's ledger evidence)."""
        conn = unit.conn
        result, failure, evidence = event_facts(outcome)
        settlement = settled_event(
            job.kind, step, job.payload, settled.state, result=result, failure=failure
        )
        if settlement.cancel_dependents is not None:
            why = settlement.cancel_dependents
            conn.execute(Q["cancel_dependents"], {"job_id": job.id, "why": why})
        if evidence and self._ledger is not None:  # what the engine reports it did
            self._ledger.append_on(
                conn,
                job.project_id,
                engine_events(evidence),
                causation_id=str(job.id),
                correlation_id=str(workflow.id),
                job_id=job.id,
                workflow_id=workflow.id,
            )
        if settlement.event is not None:
            self._record(
                unit,
                workflow,
                settlement.event,
                cause=str(job.id),
                job_id=job.id,
                savepoint=savepoint,
            )

    @retried("answer a gate", idempotent=False)
    def answer(self, gate_id: UUID, answer: str, *, by: str) -> GateAnswerOutcome:
        return traced_unit(
            self._jobs.units.begin,
            self._events,
            "gate answered",
            {"vibey.event.type": "gate.answered", "vibey.gate.id": str(gate_id)},
            lambda unit: self.answer_txn(unit, gate_id, answer, by=by),
            answer_trace,
        )

    def answer_txn(
        self, unit: UnitOfWork, gate_id: UUID, answer: str, *, by: str, source: str = "person"
    ) -> GateAnswerOutcome:
        """Answer a gate: validated against its answers or schema before anything is written,
        applied once (a second answer finds it answered). ``source`` says who: a ``person``,
        or the gate's ``default`` at its deadline (:mod:`store.gate_deadlines`)."""
        conn = unit.conn
        # One round trip: the workflow of a workflow gate, then the gate, locked in that order.
        locked = self._lock_of(unit, Q["lock_workflow_of_gate"], {"gate_id": gate_id})
        found = self._jobs.lock_gate_txn(unit, gate_id)
        workflow = locked()
        if found is None:
            return GateAnswerOutcome(AnswerStatus.UNKNOWN_GATE)
        if found.name is None or found.workflow_id is None:  # a parked job's gate
            problem = self._invalid(found, answer) if found.open else ""
            if problem:
                return GateAnswerOutcome(AnswerStatus.INVALID_ANSWER, found, problem)
            # What the answer grants (attempts, a refund) is the gate kind's: the repository
            # applies it.
            outcome = self._jobs.answer_gate_txn(unit, gate_id, answer=answer, answered_by=by)
            if outcome.status is AnswerStatus.ANSWERED:
                fact = recorded(GateAnswered(gate=found.kind, answer=answer, by=by))
                facts = [Draft(d.event_type, {**d.payload, "gate_id": str(gate_id)}) for d in fact]
                correlation = None if found.workflow_id is None else str(found.workflow_id)
                emit_on(
                    conn,
                    found.project_id,
                    facts,
                    correlation_id=correlation,
                    causation_id=f"gate:{gate_id}",
                )
                if found.kind == BUDGET_EXHAUSTED.name and answer == STOP and workflow:
                    self._stop_over_budget(unit, workflow, by)
            return GateAnswerOutcome(outcome.status, outcome.gate)
        gate = found
        if workflow is None:  # pragma: no cover - a workflow gate's workflow is never deleted
            raise WorkflowNotFound(f"no workflow {found.workflow_id}")
        if not gate.open:
            return GateAnswerOutcome(AnswerStatus.ALREADY_ANSWERED, gate)
        problem = self._invalid(gate, answer)
        if problem:
            return GateAnswerOutcome(AnswerStatus.INVALID_ANSWER, gate, problem)
        row = fetch_one(
            conn,
            Q["answer_workflow_gate"],
            {"gate_id": gate_id, "answer": answer, "answered_by": by, "source": source},
        )
        answered = gate_from_row(row) if row is not None else gate
        if gate.kind == WORKFLOW_ERROR:
            self._resolve_block(unit, workflow, answer, by)
        else:
            event = GateAnswered(gate=str(gate.name), answer=answer, by=by)
            self._record(unit, workflow, event, caused_by=f"gate:{gate_id}")
        return GateAnswerOutcome(AnswerStatus.ANSWERED, answered)

    @retried("answer a gate by its name", idempotent=False)
    def answer_named(
        self, workflow_id: UUID, name: str, answer: str, *, by: str
    ) -> GateAnswerOutcome:
        return traced_unit(
            self._jobs.units.begin,
            self._events,
            "gate answered",
            {"vibey.event.type": "gate.answered", "vibey.gate.name": name},
            lambda unit: self.answer_named_txn(unit, workflow_id, name, answer, by=by),
            answer_trace,
        )

    def answer_named_txn(
        self, unit: UnitOfWork, workflow_id: UUID, name: str, answer: str, *, by: str
    ) -> GateAnswerOutcome:
        """Answer workflow ``workflow_id``'s gate ``name`` (a link sent ahead, a retried
        request): an open gate is answered as by its id, an answered one is
        ``ALREADY_ANSWERED``, and one the workflow has not opened yet is ``NOT_OPEN`` with
        nothing recorded (never held to be applied later: answer again once it opens)."""
        self._lock(unit.conn, workflow_id)  # the order every answer takes: workflow, gate
        row = fetch_one(unit.conn, Q["gate_by_name"], {"workflow_id": workflow_id, "name": name})
        if row is None:
            return GateAnswerOutcome(AnswerStatus.NOT_OPEN)
        return self.answer_txn(unit, row["id"], answer, by=by)

    # -- the core: one event through the definition -----------------------------------------

    def _record(
        self,
        unit: UnitOfWork,
        workflow: Workflow,
        event: Event,
        *,
        cause: str | None = None,
        job_id: UUID | None = None,
        caused_by: str | None = None,
        created: bool = False,
        savepoint: bool = True,
    ) -> Workflow:
        """The event recorded (and decided, unless the workflow is blocked); the workflow
        after it. The domain events it reports (``workflows.events``) are written with it;
        ``caused_by`` is their causation (default: ``cause``, the job). ``savepoint``: as
        :meth:`settle_txn`'s."""
        conn = unit.conn
        now = self._clock()
        seq = workflow.last_seq + 1
        facts = recorded(event)
        if workflow.status is Status.BLOCKED and not isinstance(event, CancelRequested):
            return self._save(
                conn,
                workflow,
                workflow.header,
                None,
                last_seq=seq,
                applied_seq=None,
                history=_history_row(seq, event, now),
                events=_event_params(workflow, facts, caused_by or cause),
            )
        # The event's own facts go with what its decision implies (one statement) when they
        # share a causation; else they are written first, outside the decision's savepoint.
        together = caused_by is None or caused_by == cause
        if not together:
            self._emit(conn, workflow, facts, caused_by)
        if not savepoint:  # a statement read after the commit fails with the COMMIT
            unit.fail_as(lambda exc: DecisionFailed(_failed(workflow, exc)))
        try:
            # A failed decision leaves nothing behind: rolled back to the savepoint, or, with
            # none, with the whole unit (DecisionFailed).
            with unit.savepoint() if savepoint else contextlib.nullcontext():
                return self._decide(
                    unit,
                    workflow,
                    seq,
                    event,
                    now,
                    pending=False,
                    cause=(cause, job_id),
                    facts=facts if together else (),
                    created=created,
                )
        except Exception as exc:  # any definition bug blocks, never loops
            if not savepoint:
                if unit.conn.broken:  # a lost connection is the caller's, as everywhere
                    raise
                raise DecisionFailed(_failed(workflow, exc)) from exc
            if together:
                self._emit(conn, workflow, facts, cause)
            return self._block(conn, workflow, seq, event, now, exc)

    def _decide(
        self,
        unit: UnitOfWork,
        workflow: Workflow,
        seq: int,
        event: Event,
        now: datetime,
        *,
        pending: bool,
        cause: tuple[str | None, UUID | None] = (None, None),
        facts: Sequence[Draft] = (),
        created: bool = False,
    ) -> Workflow:
        """``facts``: the event's own domain events, written with what the decision implies
        (one statement). ``created``: this transaction inserted the workflow's row."""
        ruled = engine_rule(workflow.header, event)
        definition: Definition[Any] | None = None
        replayed: Callable[[], None] | None = None
        if ruled is not None:  # no definition needed (it may be the thing that is broken)
            produced: tuple[Command, ...] = ()
            header, encoded = ruled, None
        else:
            definition = self._registry.get(workflow.definition, workflow.version)
            replayed = self._replay_check(unit, workflow)
            try:
                state = definition.decode_state(workflow.state)
                header, decision = apply(definition, workflow.header, state, event, now)
            except Exception:
                _replayed_first(replayed)
                raise
            produced, encoded = decision.commands, definition.encode_state(decision.state)
        try:
            return self._write_decision(
                unit,
                workflow,
                seq,
                event,
                now,
                (header, encoded, produced, definition),
                pending=pending,
                cause=cause,
                facts=facts,
                created=created,
                replayed=replayed,
            )
        except Exception:
            _replayed_first(replayed)
            raise

    def _write_decision(
        self,
        unit: UnitOfWork,
        workflow: Workflow,
        seq: int,
        event: Event,
        now: datetime,
        decided: tuple[Header, JsonObject | None, tuple[Command, ...], Definition[Any] | None],
        *,
        pending: bool,
        cause: tuple[str | None, UUID | None],
        facts: Sequence[Draft],
        created: bool,
        replayed: Callable[[], None] | None,
    ) -> Workflow:
        """What :meth:`_decide` decided, written. ``replayed``: the non-determinism guard whose
        history read travels with the first read here, checked before the workflow's update
        (within the caller's savepoint: a divergence undoes the writes sent before it)."""
        conn = unit.conn
        header, encoded, produced, definition = decided
        commands = encode_commands(produced)
        history: dict[str, Any] | None = None  # written with the workflow's update
        if pending:
            conn.execute(
                Q["decide_history"],
                {"workflow_id": workflow.id, "seq": seq, "commands": Jsonb(commands)},
            )
        else:
            event_json = Jsonb(encode_event(event))
            history = {"seq": seq, "event": event_json, "commands": Jsonb(commands), "at": now}
        drafts = [*facts, *implied(event, workflow.header, header, produced)]
        rows = effects(str(workflow.id), workflow.header, header, produced, self._registry.kinds)
        # The domain events go with the history row and the state (one statement fewer) when
        # nothing in between writes events of its own (a gate's opening): their order holds.
        events = _event_params(workflow, drafts, cause[0]) if history and not rows.gates else None
        if events is None:
            self._emit(conn, workflow, drafts, cause[0])
        else:  # and a finished workflow's open gates are closed by that statement too
            events["closing"] = None if rows.wind_down is None else rows.wind_down.closing
        self._carry_out(unit, workflow, rows, now, close_gates=events is None, fresh=created)
        if definition is not None and not workflow.status.finished:
            self._write_ledger(conn, workflow, definition, event, produced, cause)
        last = max(seq, workflow.last_seq)
        if replayed is not None:
            replayed()
        # A step's settle does not read the new stamps back (one round trip fewer); the
        # workflow it returns keeps the old updated_at/finished_at. Nor does a start: the row
        # it inserted carries this transaction's now(), which is what the update stamps.
        read = cause[1] is None and not created
        saved = self._save(
            conn,
            workflow,
            header,
            encoded,
            last_seq=last,
            applied_seq=seq,
            read=read,
            history=history,
            events=events,
        )
        if created:
            now_of_txn = workflow.updated_at
            finished = now_of_txn if header.status.finished else None
            saved = replace(saved, updated_at=now_of_txn, finished_at=finished)
        return saved

    def _write_ledger(
        self,
        conn: Conn,
        workflow: Workflow,
        definition: Definition[Any],
        event: Event,
        commands: Sequence[Command],
        cause: tuple[str | None, UUID | None],
    ) -> None:
        hook = getattr(definition, "ledger_events", None)
        if self._ledger is None or hook is None:
            return

        def open_findings() -> frozenset[str]:
            rows = fetch_all(conn, Q["finding_events"], {"project_id": workflow.project_id})
            return open_finding_ids((r["kind"], r["payload"]) for r in rows)

        events = hook(event, commands, open_findings)
        self._ledger.append_on(
            conn,
            workflow.project_id,
            events,
            causation_id=cause[0],
            correlation_id=str(workflow.id),
            job_id=cause[1],
            workflow_id=workflow.id,
        )

    def _replay_check(self, unit: UnitOfWork, workflow: Workflow) -> Callable[[], None] | None:
        """The non-determinism guard: the first time this process touches a workflow, replay
        its history through the definition this process runs. A definition changed under the
        same version raises (``WorkflowError``), and the event blocks the workflow behind a gate
        instead of being decided by code that would not have made the history it extends.

        The history read is the one sent with the workflow's lock when the claim knew the
        workflow (:meth:`lock_of_job_txn`), else sent now; the check is made when the returned
        function is called (None: nothing to check), so that the read travels with the
        caller's next one instead of costing a round trip of its own."""
        ahead: tuple[UUID, Cursor[DictRow]] | None = unit.sent_with_claim()
        cur = None
        if ahead is not None:
            of, cur = ahead
            if of != workflow.id:  # the pointer named another workflow: the read is not this
                cur.close()
                cur = None
        if workflow.applied_seq == 0 or self._replayed_through(workflow):
            if cur is not None:
                cur.close()
            return None
        if cur is None:
            cur = _send_history(unit.conn, workflow.id)
        verdict: list[WorkflowError | None] = []  # once checked: its divergence, or None

        def check() -> None:
            if not verdict:
                with cur:
                    rows = cur.fetchall()
                try:
                    self._replays(workflow, rows)
                except WorkflowError as exc:
                    verdict.append(exc)
                    raise
                verdict.append(None)
            elif (divergence := verdict[0]) is not None:
                raise divergence

        return check

    def _replays(self, workflow: Workflow, history: Sequence[DictRow]) -> None:
        """Raise ``WorkflowError`` unless ``history`` replays to the workflow's row."""
        divergence = self._diverges(workflow, history)
        if divergence is not None:
            raise WorkflowError(
                f"non-determinism: {divergence} (the {workflow.definition} v{workflow.version} "
                "this process runs does not reproduce the workflow's history)"
            )
        self._replayed[workflow.id] = (workflow.definition, workflow.version)
        while len(self._replayed) > REPLAY_CACHE:
            self._replayed.popitem(last=False)

    def _replayed_through(self, workflow: Workflow) -> bool:
        """Whether this process replayed ``workflow``'s history through the definition and
        version the workflow runs."""
        return self._replayed.get(workflow.id) == (workflow.definition, workflow.version)

    def _emit(
        self, conn: Conn, workflow: Workflow, drafts: Sequence[Draft], cause: str | None
    ) -> None:
        emit_on(
            conn,
            workflow.project_id,
            drafts,
            correlation_id=str(workflow.id),
            causation_id=cause,
        )

    def _carry_out(
        self,
        unit: UnitOfWork,
        workflow: Workflow,
        implied: Effects,
        now: datetime,
        *,
        close_gates: bool = True,
        fresh: bool = False,
    ) -> None:
        """Write what the decision implies (``workflows.effects``): jobs, gates, wind-down
        (``close_gates``: its open gates closed here, else by the workflow's update).
        ``fresh``: the workflow's row is new in this transaction (no job of it exists), so
        its jobs may wait on one another. Jobs that wait on none already written (or none at
        all) are sent without being read back (``enqueue_unread_txn``)."""
        if implied.steps:
            requests = self._requests(unit.conn, workflow, implied.steps, fresh=fresh)
            if unread_batch(requests, fresh=fresh):
                self._jobs.enqueue_unread_txn(unit, requests, fresh=fresh)
            else:
                self._jobs.enqueue_batch_txn(unit, requests)
        for gate in implied.gates:
            self._open_gate(unit.conn, workflow, gate, now)
        if implied.wind_down is not None:
            self._wind_down(unit.conn, workflow, implied.wind_down, close_gates=close_gates)

    def _requests(
        self, conn: Conn, workflow: Workflow, steps: Sequence[StepToRun], *, fresh: bool = False
    ) -> list[EnqueueRequest]:
        """The steps as job requests, their ``after`` names resolved to job ids (this batch's,
        or earlier steps' of the workflow: none when it is ``fresh``, nothing to read)."""
        chosen = {step.name: uuid.uuid4() for step in steps}
        wanted = sorted({a for step in steps for a in step.after} - set(chosen))
        known: dict[str, UUID] = dict(chosen)
        if wanted:
            query = {"workflow_id": workflow.id, "steps": wanted}
            rows = [] if fresh else fetch_all(conn, Q["step_ids"], query)
            known |= {r["step"]: r["id"] for r in rows}
            missing = [w for w in wanted if w not in known]
            if missing:
                raise WorkflowError(f"a step depends on unknown step(s): {', '.join(missing)}")
        return [_request(workflow, step, chosen[step.name], known) for step in steps]

    def _open_gate(self, conn: Conn, workflow: Workflow, command: OpenGate, now: datetime) -> None:
        gate_id = uuid.uuid4()
        deadline_at = None if command.deadline is None else now + command.deadline
        conn.execute(
            Q["open_workflow_gate"],
            {
                "id": gate_id,
                "project_id": workflow.project_id,
                "workflow_id": workflow.id,
                "name": command.gate,
                "kind": command.kind,
                "prompt": command.question,
                "answers": Jsonb(list(command.answers)),
                "schema": Jsonb(dict(command.schema)),
                "context": Jsonb(dict(command.context)),
                "evidence": Jsonb(dict(command.evidence)),
                "deadline_at": deadline_at,
                "on_deadline": None if deadline_at is None else command.on_deadline,
                "default_answer": command.default,
                "reminders": Jsonb([r.total_seconds() for r in command.reminders]),
            },
        )
        self._emit(conn, workflow, [gate_opened(gate_id, command, deadline_at)], None)

    def _wind_down(
        self, conn: Conn, workflow: Workflow, wind_down: WindDown, *, close_gates: bool = True
    ) -> None:
        if wind_down.cancel_steps:
            conn.execute(Q["cancel_steps"], {"workflow_id": workflow.id, "why": wind_down.why})
        if not close_gates:
            return
        conn.execute(
            Q["close_open_gates"],
            {"workflow_id": workflow.id, "answer": wind_down.closing, "answered_by": "vibey"},
        )

    def _block(
        self, conn: Conn, workflow: Workflow, seq: int, event: Event, now: datetime, exc: Exception
    ) -> Workflow:
        history = _history_row(seq, event, now)
        return self._write_block(
            conn, workflow, seq, error_text(exc), last_seq=seq, history=history
        )

    def _write_block(
        self,
        conn: Conn,
        workflow: Workflow,
        seq: int,
        error: str,
        *,
        last_seq: int,
        history: Mapping[str, Any] | None = None,
    ) -> Workflow:
        """The one block path (``workflows.effects.blocked``): the header (with ``history``,
        the undecided event's row, in its statement) and the error gate."""
        block = blocked(workflow.header, seq, error, nonce=uuid.uuid4().hex[:8])
        saved = self._save(
            conn,
            workflow,
            block.header,
            None,
            last_seq=last_seq,
            applied_seq=None,
            history=history,
        )
        self._open_gate(conn, workflow, block.gate, self._clock())
        self._emit(conn, workflow, status_changed(workflow.header, block.header), None)
        return saved

    def _stop_over_budget(self, unit: UnitOfWork, workflow: Workflow, by: str) -> None:
        """``stop`` to a ``budget_exhausted`` gate abandons the workflow: it is cancelled
        (its steps stop, its other gates close), in the answer's transaction."""
        if workflow.status.finished:
            return
        reason = "its budget is spent and budget_exhausted was answered stop"
        self._record(unit, workflow, CancelRequested(by=by, reason=reason))

    def _resolve_block(self, unit: UnitOfWork, workflow: Workflow, answer: str, by: str) -> None:
        conn = unit.conn
        if answer == "cancel":
            self._record(unit, workflow, CancelRequested(by=by, reason="after a workflow error"))
            return
        if workflow.status is not Status.BLOCKED:
            return
        current = self._save(
            conn,
            workflow,
            unblocked(workflow.header),
            None,
            last_seq=workflow.last_seq,
            applied_seq=None,
        )
        for entry in self._history(conn, workflow.id, after=workflow.applied_seq):
            event = decode_event(entry["event"])
            try:
                with unit.savepoint():
                    current = self._decide(
                        unit, current, entry["seq"], event, self._clock(), pending=True
                    )
            except Exception as exc:  # noqa: BLE001 - blocked again, behind a new gate
                error = error_text(exc)
                self._write_block(conn, current, entry["seq"], error, last_seq=current.last_seq)
                return

    # -- rows ------------------------------------------------------------------------------

    def lock_of_job_txn(
        self, unit: UnitOfWork, job_id: UUID, *, workflow: UUID | None = None
    ) -> Callable[[], Workflow | None]:
        """Lock the workflow of job ``job_id`` (none for a plain job), read when the returned
        function is called. The job's locked claim, the caller's next statement, takes it
        first, in its own statement (``dispatch.sql``'s ``lock_pointer``); a caller whose
        next statement was not that claim has it locked at the read.

        ``workflow``: the job's workflow as its pointer names it. When this process has not
        replayed it, its history is read behind the claim, under the lock, in the claim's
        round trip (the non-determinism guard's read: :meth:`_replay_check`)."""
        then = None
        if workflow is not None and workflow not in self._replayed:
            named = workflow

            def then() -> tuple[UUID, Cursor[DictRow]]:
                return named, _send_history(unit.conn, named)

        unit.lock_workflow_with_claim(job_id, then=then)

        def read() -> Workflow | None:
            locked, workflow = unit.claimed_workflow(job_id)
            if locked:
                return workflow
            return self._lock_of(unit, Q["lock_workflow_of_job"], {"job_id": job_id})()

        return read

    def _lock_of(
        self, unit: UnitOfWork, query: str, params: Mapping[str, Any]
    ) -> Callable[[], Workflow | None]:
        cur = unit.conn.cursor(row_factory=dict_row)
        cur.execute(query.encode(), params)

        def read() -> Workflow | None:
            with cur:
                row = cur.fetchone()
            return None if row is None else workflow_from_row(row)

        return read

    def _lock(self, conn: Conn, workflow_id: UUID) -> Workflow:
        row = fetch_one(conn, Q["lock_workflow"], {"id": workflow_id})
        if row is None:
            raise WorkflowNotFound(f"no workflow {workflow_id}")
        return workflow_from_row(row)

    def _save(
        self,
        conn: Conn,
        workflow: Workflow,
        header: Header,
        state: JsonObject | None,
        *,
        last_seq: int,
        applied_seq: int | None,
        read: bool = True,
        history: Mapping[str, Any] | None = None,
        events: Mapping[str, Any] | None = None,
    ) -> Workflow:
        """``history``: the event's history row (seq, event, commands, at), written in the
        same statement (``save_workflow``); with it, ``events``: its domain events and the
        note a finished workflow's open gates are closed with (:func:`_event_params`)."""
        new_state = workflow.state if state is None else state
        applied = workflow.applied_seq if applied_seq is None else applied_seq
        run = fetch_one if read else _queued
        stamps = run(
            conn,
            Q["save_workflow"],
            {**_NOTHING_BESIDE, **(history or {}), **(events or {})}
            | {
                "id": workflow.id,
                "phase": header.phase,
                "cycle": header.cycle,
                "status": header.status.value,
                "completion_mode": header.completion_mode,
                "reason": header.reason,
                "state": Jsonb(dict(new_state)),
                "last_seq": last_seq,
                "applied_seq": applied,
            },
        )
        if stamps is None:  # pragma: no cover - the row is locked by this transaction
            raise WorkflowNotFound(f"no workflow {workflow.id}")
        return replace(
            workflow,
            updated_at=stamps.get("updated_at", workflow.updated_at),
            finished_at=stamps.get("finished_at", workflow.finished_at),
            phase=header.phase,
            cycle=header.cycle,
            status=header.status,
            completion_mode=header.completion_mode,
            reason=header.reason,
            state=new_state,
            last_seq=last_seq,
            applied_seq=applied,
        )

    def _invalid(self, gate: Gate, answer: str) -> str:
        """What is wrong with ``answer`` to ``gate`` ("" if nothing): its answers or schema,
        else its kind's (the one validator every answer path shares)."""
        gates = self._registry.gates
        return gates.problem(gate.kind, answer, answers=gate.answers, schema=gate.schema) or ""

    @retried("verify a workflow's history", idempotent=True)
    def verify(self, workflow_id: UUID, *, block: bool = False) -> Verification:
        """Replay the history through the definition and compare with the stored state. With
        ``block``, a divergence blocks the workflow behind a ``workflow_error`` gate."""
        with transaction(self._pool) as conn:
            workflow = self._lock(conn, workflow_id) if block else self._get(conn, workflow_id)
            history = self._history(conn, workflow_id)
            divergence = self._diverges(workflow, history)
            running = workflow.status is Status.RUNNING
            if divergence is not None and block and running:
                error = f"NonDeterminismError: {divergence}"
                workflow = self._write_block(
                    conn, workflow, workflow.applied_seq, error, last_seq=workflow.last_seq
                )
        return Verification(workflow, workflow.applied_seq, divergence)


def _send_history(conn: Conn, workflow_id: UUID) -> Cursor[DictRow]:
    """A workflow's whole history (the non-determinism guard's read), sent and not read."""
    cur = conn.cursor(row_factory=dict_row)
    cur.execute(Q["history"].encode(), {"workflow_id": workflow_id, "after": 0})
    return cur


def _replayed_first(check: Callable[[], None] | None) -> None:
    """On a decision's error: the non-determinism guard's verdict first (its
    ``WorkflowError`` is what blocks the workflow, as when it ran before the decision); its
    read failing too leaves the decision's error to propagate."""
    if check is None:
        return
    try:
        check()
    except WorkflowError:
        raise
    except Exception:  # noqa: BLE001 - the caller raises the decision's error
        pass


def _failed(workflow: Workflow, exc: BaseException) -> str:
    return f"workflow {workflow.id}: {type(exc).__name__}"


def _history_row(seq: int, event: Event, at: datetime) -> dict[str, Any]:
    """An event's history row as ``save_workflow`` writes it, undecided (no commands yet)."""
    return {"seq": seq, "event": Jsonb(encode_event(event)), "commands": None, "at": at}


# ``save_workflow``'s parameters when it writes nothing beside the workflow: no history row
# (``history``), no domain events and no gate close (``events``: :func:`_event_params`).
_NOTHING_BESIDE: Mapping[str, Any] = MappingProxyType(
    {"seq": None, "event": None, "commands": None, "at": None}
    | {"project_id": None, "correlation_id": None, "causation_id": None, "closing": None}
    | {"events": None}
)


def _event_params(workflow: Workflow, drafts: Sequence[Draft], cause: str | None) -> dict[str, Any]:
    """The parameters of ``drafts`` as ``save_workflow`` writes them (those of
    ``store.events.emit_on``, whose ``insert_events`` it embeds); the caller adds
    ``closing``, the note its open gates are closed with (None: they stay open)."""
    return {
        "project_id": workflow.project_id,
        "correlation_id": str(workflow.id),
        "causation_id": cause,
        "events": drafted(drafts)[1] if drafts else None,
    }


def _new_row(
    workflow_id: UUID,
    project_id: str,
    chosen: Definition[Any],
    input: JsonObject,
    state: JsonObject,
) -> dict[str, Any]:
    """The parameters of a new workflow's row (``insert_workflow``, ``insert_new_workflow``):
    ``chosen``'s first phase, cycle 0, its initial ``state``."""
    return {
        "id": workflow_id,
        "project_id": project_id,
        "definition": chosen.name,
        "version": chosen.version,
        "phase": chosen.first_phase,
        "cycle": 0,
        "input": Jsonb(dict(input)),
        "state": Jsonb(state),
    }


def _firsts(
    starts: Sequence[tuple[str, JsonObject]], live: Mapping[str, Workflow]
) -> list[tuple[str, JsonObject]]:
    """The first start of each project without a live workflow, in order (a project's later
    starts in the batch find the workflow its first made)."""
    seen: set[str] = set()
    firsts: list[tuple[str, JsonObject]] = []
    for project, input in starts:
        if project not in live and project not in seen:
            seen.add(project)
            firsts.append((project, input))
    return firsts


def _queued(conn: Conn, query: str, params: Mapping[str, Any]) -> Mapping[str, Any]:
    """Send a statement whose result nobody reads (it travels with the next read)."""
    conn.execute(query.encode(), params)
    return {}


def _request(
    workflow: Workflow, step: StepToRun, job_id: UUID, known: Mapping[str, UUID]
) -> EnqueueRequest:
    return EnqueueRequest(
        project_id=workflow.project_id,
        kind=step.kind,
        subject=step.subject,
        cycle=step.cycle,
        payload=step.payload,
        delay=step.delay,
        depends_on=tuple(known[a] for a in step.after),
        max_attempts=step.max_attempts,
        job_id=job_id,
        workflow_id=workflow.id,
        step=step.name,
        lease=step.lease,
    )
