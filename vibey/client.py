"""The Python client: start workflows, read them and their cost, wait, answer their gates.

::

    from vibey import Client

    with Client() as client:                       # settings from vibey.toml and VIBEY_*
        run = client.start("acme", "orders", {"order": "A-1", "amount": 120})
        gate = client.list_gates(project="acme")[0]
        client.answer(gate.id, "approve", by="ops@acme")
        done = client.wait(run.id, timeout=30)     # the finished workflow, or a typed error
        spent = client.cost("acme")                # tokens and dollars so far, from the ledger

Every `vibey` command a user runs goes through these methods, so Python can do what the
command line does. Besides the workflow and gate methods here, the reads and routine writes of
:class:`~vibey.client_reads.ClientReads` (which the client extends) use the pool alone: the
pages and streams of ``gate_page``/``iter_gates``, ``workflow_page``/``iter_workflows``,
``history_page``/``iter_history`` and ``ledger_page``/``iter_ledger`` (a
:class:`~store.listings.PageSpec` in, a :class:`~store.listings.Page` out), ``ledger_head``,
``verify_ledger``, ``events``, ``tenant``/``set_tenant``, ``routes``/``dedicate``/
``undedicate``, ``engine_health``, ``rotate_engine`` and ``dead_letters``; and
:meth:`Client.queue_stats`. :func:`read_client` is a command's client for those: one
connection, no relay, nothing of :mod:`actors` loaded.

One client holds a small connection pool and one relay (one AMQP connection, publisher
confirms; :mod:`vibey.client_graph` builds and stops them) for its whole life: every commit's
dispatch pointers are handed to it right after the commit, and :meth:`flush` waits until the
broker confirmed them. It routes a project's pointers as every worker does, by the project
routes in PostgreSQL (``store.routes``, kept current by NOTIFY). It is safe to share across
threads. Without RabbitMQ (or when it does not answer at start) pointers are left in the outbox
for the workers' reconcilers, which send them within their reconcile interval.

Exceptions::

    ClientError
    ├── WorkflowFailed       wait(): the workflow failed
    ├── WorkflowCancelled    wait(): the workflow was cancelled
    ├── WaitTimeout          wait(): still running when the timeout ran out (also a TimeoutError)
    └── AnswerRefused        answer(): unknown gate, not open yet, answered already, or an
                             invalid answer (its message is the one refusal vibey prints)
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import closing, contextmanager
from typing import TYPE_CHECKING, Any
from uuid import UUID

from store.cost import CostReads, WorkflowCost
from store.workflow_reads import GateAnswerOutcome, StartOutcome, Verification, Workflow
from vibey.client_graph import ClientGraph
from vibey.render import answers_text, clock
from vibey.settings import Settings
from workflows.budget import Budget, budget_of, with_budget
from workflows.engine import Registry, Status
from workflows.queue import AnswerStatus, Gate

if TYPE_CHECKING:
    from actors.queue_stats import QueueStats


WAIT_FLAT = 50  # polls at the first interval: a workflow of up to 50 polls is seen promptly
WAIT_GROWTH = 1.5  # then each interval this much longer than the one before
WAIT_CAP_S = 0.1  # and never longer than this


def wait_delays(poll: float) -> Iterator[float]:
    """The pauses between :meth:`Client.wait`'s polls: ``poll`` ``WAIT_FLAT`` times, then
    growing by ``WAIT_GROWTH`` up to ``WAIT_CAP_S`` (a ``poll`` above the cap is kept)."""
    for _ in range(WAIT_FLAT):
        yield poll
    delay = poll
    while True:
        delay = max(min(delay * WAIT_GROWTH, WAIT_CAP_S), poll)
        yield delay


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


class Client(ClientGraph):
    """A pool, the workflow store and one persistent relay; close it (or use ``with``).

    The reads and routine writes of :class:`~vibey.client_reads.ClientReads` use the pool
    alone. The rest of the graph (job repository, workflow store, relay: one
    :func:`actors.graph.assemble`) is built with the client when ``connect_relay`` is true,
    else at the first call that needs it; building it, :meth:`flush` and :meth:`close` are
    :class:`~vibey.client_graph.ClientGraph`'s, the workflow and gate methods this class's."""

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
        blocked, or waiting at a gate) after ``timeout`` seconds.

        Its status is read every ``poll`` seconds for the first ``WAIT_FLAT`` polls (a short
        workflow is seen within a poll of its end), then ever less often, up to every
        ``WAIT_CAP_S`` (:func:`wait_delays`)."""
        deadline = time.monotonic() + timeout
        delays = wait_delays(poll)
        while True:
            current = self.status(workflow)
            if current.status is Status.COMPLETED:
                return current
            if current.status is Status.FAILED:
                raise WorkflowFailed(current)
            if current.status is Status.CANCELLED:
                raise WorkflowCancelled(current)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise WaitTimeout(current, timeout)
            time.sleep(min(next(delays), remaining))

    # -- gates -------------------------------------------------------------------------------

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

    # -- operations --------------------------------------------------------------------------

    def queue_stats(self) -> QueueStats:
        """Each queue's ready messages and consumers (RabbitMQ's, or the claimable rows on the
        postgres backend), the leased jobs by lane, the dead letters, the outbox's lag, the
        routed projects, the claimable job waiting longest, and each problem with the command
        that fixes it (``vibey queue stats``). Raises
        :class:`~vibey.settings.SettingsError` when the fleet's settings do not hold."""
        from actors.queue_stats import gather
        from vibey.wiring import worker_config

        return gather(worker_config(self.settings), self._pool)

    def _default_definition(self) -> str:
        names = sorted({name.split(" v")[0] for name in self.registry.known()})
        if not names:
            raise ClientError("no workflow definition is registered: fix [workflow] definitions")
        return names[0]


@contextmanager
def workflow_client(settings: Settings) -> Iterator[Client]:
    """A client for one CLI command, closed on the way out. Checks the database URL, then the
    definitions, then connects (DatabaseUnavailable if it cannot)."""
    from vibey.wiring import load_registry

    settings.require_database_url()
    with closing(
        Client(
            settings,
            registry=load_registry(settings),
            pool_size=2,
            listen_routes=False,
            name="vibey-cli",
        )
    ) as client:
        yield client


@contextmanager
def read_client(settings: Settings, *, registry: Registry | None = None) -> Iterator[Client]:
    """A client for one read command (or a routine write on the pool alone): one
    connection, no relay, the definitions (``registry``, else the settings') loaded only if a
    workflow is described. Checks the database URL, then connects (DatabaseUnavailable if it
    cannot); closed on the way out."""
    settings.require_database_url()
    with closing(
        Client(
            settings,
            registry=registry,
            pool_size=1,
            connect_relay=False,
            listen_routes=False,
            name="vibey-cli",
        )
    ) as client:
        yield client
