"""The Python client: start workflows, read them and their cost, wait, answer their gates.

::

    from vibey import Client

    with Client() as client:                       # settings from vibey.toml and VIBEY_*
        run = client.start("acme", "orders", {"order": "A-1", "amount": 120})
        gate = client.list_gates(project="acme")[0]
        client.answer(gate.id, "approve", by="ops@acme")
        done = client.wait(run.id, timeout=30)     # the finished workflow, or a typed error
        spent = client.cost("acme")                # tokens and dollars so far, from the ledger

One client holds a small connection pool and one relay (one AMQP connection, publisher
confirms) for its whole life: every commit's dispatch pointers are handed to it right after
the commit, and :meth:`flush` waits until the broker confirmed them. It routes a project's
pointers as every worker does, by the project routes in PostgreSQL (``store.routes``, kept
current by NOTIFY). It is safe to share across threads. Without RabbitMQ (or when it does
not answer at start) pointers are left in the outbox for the workers' reconcilers, which send
them within their reconcile interval.

Exceptions::

    ClientError
    ├── WorkflowFailed       wait(): the workflow failed
    ├── WorkflowCancelled    wait(): the workflow was cancelled
    ├── WaitTimeout          wait(): still running when the timeout ran out (also a TimeoutError)
    └── AnswerRefused        answer(): unknown gate, not open yet, answered already, or an
                             invalid answer (its message is the one refusal vibey prints)
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from actors.graph import Bus, assemble
from actors.relay import Router
from actors.topology import QueueNames
from actors.tracing import step_tracer
from store.cost import CostReads, WorkflowCost
from store.db import Pool
from store.pool import open_pool
from store.routes import read_routes
from store.unit_of_work import OutboxRow
from store.workflow_reads import (
    GateAnswerOutcome,
    HistoryEntry,
    StartOutcome,
    Verification,
    Workflow,
)
from vibey.render import answers_text, clock
from vibey.settings import Settings, load_settings
from vibey.wiring import load_registry
from workflows.budget import Budget, budget_of, with_budget
from workflows.engine import Registry, Status
from workflows.queue import AnswerStatus, Gate

RELAY_CONNECT_SECONDS = 2.0
FLUSH_SECONDS = 5.0
STOP_SECONDS = 5.0
PENDING_LIMIT = 100_000  # ids kept to give back unsent rows at flush (older ones: reclaimed)


class ClientError(Exception):
    """Root of the client's errors."""


class WorkflowEnded(ClientError):
    def __init__(self, workflow: Workflow) -> None:
        super().__init__(
            f"workflow {workflow.id} ({workflow.project_id}) {workflow.status.value}: "
            f"{workflow.reason or 'no reason recorded'}"
        )
        self.workflow = workflow


class WorkflowFailed(WorkflowEnded):
    pass


class WorkflowCancelled(WorkflowEnded):
    pass


class WaitTimeout(ClientError, TimeoutError):
    def __init__(self, workflow: Workflow, timeout: float) -> None:
        super().__init__(
            f"workflow {workflow.id} is still {workflow.status.value} after {timeout:g}s "
            f"({workflow.phase or 'no phase'})"
        )
        self.workflow = workflow


class AnswerRefused(ClientError):
    """An answer that was not recorded. Its message is the one line every surface shows
    (`vibey gate answer`, the console, a Python caller); ``outcome`` says why, and
    :attr:`invalid` whether the answer itself was wrong (the gate takes others)."""

    def __init__(self, outcome: GateAnswerOutcome, gate: str, answer: str) -> None:
        super().__init__(refusal(outcome, gate, answer))
        self.outcome = outcome

    @property
    def invalid(self) -> bool:
        return self.outcome.status is AnswerStatus.INVALID_ANSWER


def refusal(outcome: GateAnswerOutcome, gate: str, answer: str) -> str:
    """The one-line refusal of ``answer`` to ``gate`` (as the caller named it)."""
    found = outcome.gate
    if outcome.status is AnswerStatus.UNKNOWN_GATE:
        return f"no gate {gate}"
    if outcome.status is AnswerStatus.NOT_OPEN:
        return (
            f"gate {gate} is not open yet: the workflow has not asked it, and nothing was "
            "recorded; answer it once `vibey gate list` shows it"
        )
    if outcome.status is AnswerStatus.ALREADY_ANSWERED:
        if found is None or found.answered_at is None:  # pragma: no cover - the store sets both
            return f"gate {gate} is already answered; nothing changed"
        return (
            f"gate {gate} was already answered by {found.answered_by} at "
            f"{clock(found.answered_at)} ({found.answer!r}); nothing changed"
        )
    if found is not None and found.answers:
        return f"{answer} is not an answer to gate {gate}; valid: {', '.join(found.answers)}"
    why = outcome.detail or "the gate does not take it"
    valid = answers_text(found) if found is not None else "see `vibey gate show`"
    tail = "" if valid in why else f"; valid: {valid}"  # a pattern's hint says it already
    return f"{answer} is not an answer to gate {gate} ({why}){tail}"


@dataclass(frozen=True, slots=True)
class Dispatch:
    """What the commits since the last flush left for RabbitMQ: ``rows`` outbox rows,
    ``published`` of them confirmed by the broker (``tried``: whether a relay was running)."""

    rows: int
    published: int
    tried: bool


class Client:
    """A pool, the workflow store and one persistent relay; close it (or use ``with``)."""

    def __init__(
        self,
        settings: Settings | None = None,
        *,
        registry: Registry | None = None,
        pool: Pool | None = None,
        pool_size: int = 4,
        connect_relay: bool = True,
        listen_routes: bool = True,
        name: str = "vibey-client",
    ) -> None:
        """``settings`` default to :func:`vibey.settings.load_settings`; ``registry`` to the
        definitions they name. ``pool``: share one the caller owns (it is not closed).
        ``name`` prefixes the relay's id (who holds an outbox row it was handed).
        ``listen_routes=False`` reads the project routes once instead of following their
        changes (one CLI command)."""
        self.settings = settings if settings is not None else load_settings()
        self.registry = registry if registry is not None else load_registry(self.settings)
        url = self.settings.require_database_url()
        self._owns_pool = pool is None
        self._pool = pool or open_pool(url, min_size=1, max_size=pool_size, name="vibey-client")
        self._lock = threading.Lock()
        self._pending: deque[int] = deque(maxlen=PENDING_LIMIT)
        rabbitmq = self.settings.queue.backend == "rabbitmq"
        bus = self._bus(listen=url if listen_routes else None) if connect_relay else None
        self._tried = bus is not None  # whether a relay was tried
        tracing = self.settings.tracing
        graph = assemble(
            self._pool,
            registry=self.registry,
            leases=self.settings.queue.lease,
            owner=f"{name}:{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}",
            tracer=step_tracer(tracing.otlp_endpoint, service_name=tracing.service_name),
            dispatch=rabbitmq,
            bus=bus,
            connect=RELAY_CONNECT_SECONDS,
            on_commit=self._committed,
        )
        self._relay, self._routes = graph.relay, graph.routes
        self._records = graph.records
        self._published_before = 0
        self.jobs, self.store = graph.jobs, graph.workflows

    def _bus(self, *, listen: str | None) -> Bus | None:
        """Where this client's relay sends its pointers: none without an AMQP URL, or on the
        postgres backend (the workers claim the jobs from PostgreSQL)."""
        settings = self.settings
        if settings.queue.backend != "rabbitmq" or settings.bus.amqp_url is None:
            return None
        return Bus(
            url=settings.bus.amqp_url,
            names=QueueNames(settings.bus.prefix),
            tiers=settings.queue.rabbitmq.wait_tiers,
            listen=listen,
        )

    def _committed(self, rows: Sequence[OutboxRow]) -> None:
        with self._lock:
            self._pending.extend(row.id for row in rows)

    # -- workflows ---------------------------------------------------------------------------

    def start(
        self,
        project: str,
        definition: str | None = None,
        input: Mapping[str, Any] | None = None,
        *,
        budget: Budget | None = None,
    ) -> Workflow:
        """Start ``definition`` (its newest version; default: the only or first registered)
        for ``project``, or return the project's live workflow if it has one. A new workflow
        is one round trip to PostgreSQL and one commit: its row, history, first jobs, outbox
        rows and domain events are sent with the COMMIT (``WorkflowStore.start_many``).

        ``budget``: what the workflow may spend (dollars, tokens) before its next engine step
        parks behind a ``budget_exhausted`` gate (default: ``[workflow] budget_dollars`` /
        ``budget_tokens``; none when neither is set). Raises
        :class:`~workflows.budget.BudgetError` for a budget in ``input`` that is not one."""
        return self.start_outcome(project, definition, input, budget=budget).workflow

    def start_outcome(
        self,
        project: str,
        definition: str | None = None,
        input: Mapping[str, Any] | None = None,
        *,
        budget: Budget | None = None,
    ) -> StartOutcome:
        """:meth:`start`, saying also whether this call created the workflow (``created``)
        or found the project's live one (``created`` false: nothing changed)."""
        name = definition or self._default_definition()
        given = self.budgeted(input or {}, budget)
        return self.store.start(project, definition=name, input=given)

    def budgeted(self, given: Mapping[str, Any], budget: Budget | None = None) -> dict[str, Any]:
        """The workflow input ``given`` with its budget: ``budget``, else the one ``given``
        holds, else the settings' default (:mod:`workflows.budget`)."""
        held = budget_of(given)
        return with_budget(given, budget or held or self.settings.workflow.budget())

    def cost(self, workflow: UUID | str) -> WorkflowCost:
        """What a workflow (by id, or a project's live, else latest, one) has cost so far, by
        engine, phase and step, from the ledger's BudgetSpent events, and its budget. Raises
        :class:`~store.workflow_reads.WorkflowNotFound` for an unknown id or project."""
        found = self.status(workflow)
        return CostReads(self._pool).workflow_cost(found.id, found.project_id)

    def start_many(
        self,
        starts: Iterable[str | tuple[str, Mapping[str, Any] | None]],
        definition: str | None = None,
    ) -> list[Workflow]:
        """Start ``definition`` for many projects in one transaction (one commit and one
        round trip for the batch, not one a workflow): each item a project id, or
        ``(project, input)``. All or
        none: an error starts nothing. A project with a live workflow gets that one, as
        :meth:`start` gives it. The list is in the order given. Each workflow's budget is the
        one its input holds, else the settings' default (:meth:`budgeted`)."""
        name = definition or self._default_definition()
        batch = [
            (item, self.budgeted({}))
            if isinstance(item, str)
            else (item[0], self.budgeted(item[1] or {}))
            for item in starts
        ]
        if not batch:
            return []
        return [o.workflow for o in self.store.start_many(batch, definition=name)]

    def status(self, workflow: UUID | str) -> Workflow:
        """A workflow by id, or a project's live (else latest) workflow by project id."""
        if isinstance(workflow, UUID):
            return self.store.get(workflow)
        return self.store.for_project(workflow)

    def describe(self, workflow: Workflow) -> str:
        """The workflow in one line, as its definition describes it (``vibey workflow
        status`` prints it under the header)."""
        return self.store.describe(workflow)

    def steps(self, workflow: UUID) -> list[Mapping[str, Any]]:
        """The workflow's steps, one dict a step (``step``, ``kind``, ``state``, ...)."""
        return [dict(row) for row in self.store.steps(workflow)]

    def history(self, workflow: UUID) -> list[HistoryEntry]:
        return self.store.history(workflow)

    def verify(self, workflow: UUID, *, block: bool = False) -> Verification:
        """Replay the workflow's history through the code this process runs and compare the
        result with the stored state. ``block``: a divergence blocks a running workflow behind
        a ``workflow_error`` gate (answer it ``retry`` or ``cancel``)."""
        return self.store.verify(workflow, block=block)

    def cancel(self, workflow: UUID, *, by: str, reason: str = "") -> Workflow:
        return self.store.cancel(workflow, by=by, reason=reason)

    def wait(self, workflow: UUID, timeout: float = 60.0, *, poll: float = 0.002) -> Workflow:
        """The workflow once completed. Raises :class:`WorkflowFailed`,
        :class:`WorkflowCancelled`, or :class:`WaitTimeout` when it is still running (or
        blocked, or waiting at a gate) after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        delay = poll
        while True:
            current = self.store.get(workflow)
            if current.status is Status.COMPLETED:
                return current
            if current.status is Status.FAILED:
                raise WorkflowFailed(current)
            if current.status is Status.CANCELLED:
                raise WorkflowCancelled(current)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(current, timeout)
            time.sleep(min(delay, remaining))
            delay = min(delay * 1.5, 0.1)

    def router(self) -> Router:
        """How pointers are routed now (the rabbitmq backend): each kind to its lane, each
        project to its dedicated queues when the project routes say so."""
        routes = self._routes if self._routes is not None else read_routes(self._pool)
        return Router(
            names=QueueNames(self.settings.bus.prefix),
            tiers=self.settings.queue.rabbitmq.wait_tiers,
            dedicated=routes,
            kinds=self.registry.kinds,
        )

    # -- gates -------------------------------------------------------------------------------

    def list_gates(self, project: str | None = None) -> list[Gate]:
        """The open gates (workflow questions and parked jobs), oldest first."""
        return [gate for gate, _ in self.inbox(project)]

    def inbox(self, project: str | None = None) -> list[tuple[Gate, float]]:
        """:meth:`list_gates`, each with the seconds it has waited by the database's clock."""
        return self.store.inbox(project)

    def gate(self, gate: UUID) -> Gate | None:
        """One gate by id, open or answered (who answered it, when and how); None when there
        is no such gate."""
        return self.jobs.get_gate(gate)

    def answer(self, gate: UUID | str, value: str | int, *, by: str) -> Gate:
        """Answer an open gate (validated by its kind); the answered gate.

        ``gate``: its id (a UUID, or its text), or ``"WORKFLOW_ID:NAME"``, a workflow's gate
        by the name its definition gives it (as a link sent ahead names it). Raises
        :class:`AnswerRefused` for an unknown gate, one the workflow has not opened yet, a
        second answer or an invalid one (nothing is recorded), and ValueError for a ``gate``
        that is neither form."""
        named = str(gate)
        workflow, _, name = named.partition(":")
        gate_id = gate if isinstance(gate, UUID) else UUID(workflow)
        if name:
            outcome = self.store.answer_named(gate_id, name, str(value), by=by)
        else:
            outcome = self.store.answer(gate_id, str(value), by=by)
        if outcome.status is not AnswerStatus.ANSWERED or outcome.gate is None:
            raise AnswerRefused(outcome, named, str(value))
        return outcome.gate

    # -- dispatch and life -------------------------------------------------------------------

    def flush(self, timeout: float = FLUSH_SECONDS) -> Dispatch:
        """Wait (at most ``timeout``) until the broker confirmed every pointer committed so far;
        what it did not confirm is left to the reconcilers. Never raises for the broker."""
        with self._lock:
            ids = tuple(self._pending)
            self._pending.clear()
        if self._relay is None:
            return Dispatch(len(ids), 0, tried=self._tried)
        if not self._relay.flush(timeout=timeout) or self._relay.returned:
            self._records.release(ids)  # only rows still unsent: back to the reconcilers
        published = self._relay.published - self._published_before
        self._published_before = self._relay.published
        return Dispatch(len(ids), published, tried=True)

    publish = flush  # the CLI's name for it

    def close(self) -> None:
        if self._relay is not None:
            self.flush(timeout=STOP_SECONDS)
            self._relay.stop(timeout=STOP_SECONDS)
            self._relay = None
        if self._routes is not None:
            self._routes.stop()
            self._routes = None
        if self._owns_pool:
            self._pool.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _default_definition(self) -> str:
        names = sorted({name.split(" v")[0] for name in self.registry.known()})
        if not names:
            raise ClientError("no workflow definition is registered: fix [workflow] definitions")
        return names[0]


@contextmanager
def workflow_client(settings: Settings) -> Iterator[Client]:
    """A client for one CLI command, closed on the way out. Checks the database URL, then the
    definitions, then connects (DatabaseUnavailable if it cannot)."""
    settings.require_database_url()
    client = Client(
        settings,
        registry=load_registry(settings),
        pool_size=2,
        listen_routes=False,
        name="vibey-cli",
    )
    try:
        yield client
    finally:
        client.close()
