"""What :class:`vibey.client.Client` does on its connection pool alone: the reads every list
and show command prints, and the routine writes that need neither the job repository nor the
relay (a project's tenant and route, an engine rotation request).

These methods build no object graph, load no workflow definition unless one is needed (a
workflow's one-line description) and import neither pika nor Dramatiq, so a read command
stays as light as it was when it opened its own pool: ``vibey gate list`` pays for PostgreSQL
and nothing else.

Pages: a :class:`~store.listings.PageSpec` says how many rows, which order and after which
key; the answer is a :class:`~store.listings.Page` (the rows, how many match in all, the key
of the next page). The ``iter_*`` methods yield every matching row through a server-side
cursor instead, without holding them all.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any
from uuid import UUID

from store.events import EventLog
from store.listings import GateFilter, Listings, Page, PageSpec, WorkflowFilter
from store.workflow_reads import HistoryEntry, Workflow, WorkflowLookup, describe

if TYPE_CHECKING:
    from store.db import Pool
    from store.engine_health import EngineHealth, RotationRequest
    from store.operations import DeadLetter
    from store.routes import ProjectRoute
    from vibey.settings import Settings
    from workflows.engine import Registry
    from workflows.events import DomainEvent
    from workflows.ledger import LedgerEvent, LedgerVerification
    from workflows.queue import Gate

EVERY_GATE = GateFilter()  # no filter
EVERY_WORKFLOW = WorkflowFilter()
FIRST_PAGE = PageSpec()  # the first DEFAULT_LIMIT rows, oldest first


class ClientReads:
    """The pool-only part of :class:`vibey.client.Client` (its module docstring)."""

    settings: Settings
    _pool: Pool

    def __init__(self, pool: Pool, registry: Registry | None) -> None:
        self._pool = pool
        self._registry = registry
        self._registry_lock = threading.Lock()
        self._listings = Listings(pool)
        self._lookup = WorkflowLookup(pool)
        self._events = EventLog(pool=pool)

    @property
    def registry(self) -> Registry:
        """The workflow definitions the settings name, loaded on first use."""
        with self._registry_lock:
            if self._registry is None:
                from vibey.wiring import load_registry

                self._registry = load_registry(self.settings)
            return self._registry

    # -- workflows ---------------------------------------------------------------------------

    def status(self, workflow: UUID | str) -> Workflow:
        """A workflow by id, or a project's live (else latest) workflow by project id. Raises
        :class:`~store.workflow_reads.WorkflowNotFound` for an unknown id or project."""
        if isinstance(workflow, UUID):
            return self._lookup.get(workflow)
        return self._lookup.for_project(workflow)

    def describe(self, workflow: Workflow) -> str:
        """The workflow in one line, as its definition describes it (``vibey workflow
        status`` prints it under the header)."""
        return describe(self.registry, workflow)

    def steps(self, workflow: UUID) -> list[Mapping[str, Any]]:
        """The workflow's steps, one dict a step (``step``, ``kind``, ``state``, ...)."""
        return [dict(row) for row in self._lookup.steps(workflow)]

    def history(self, workflow: UUID) -> list[HistoryEntry]:
        """The workflow's whole history (:meth:`history_page` pages it)."""
        return self._lookup.history(workflow)

    def workflow_page(
        self, where: WorkflowFilter = EVERY_WORKFLOW, page: PageSpec = FIRST_PAGE
    ) -> Page[Workflow]:
        """Workflows by their last update (``newest_first``: the most recently updated);
        ``where`` filters them by status, project, tenant, definition and age."""
        return self._listings.workflows(where, page)

    def iter_workflows(
        self, where: WorkflowFilter = EVERY_WORKFLOW, *, newest_first: bool = False
    ) -> Iterator[Workflow]:
        return self._listings.stream_workflows(where, newest_first=newest_first)

    def history_page(
        self, workflow: UUID, page: PageSpec = FIRST_PAGE, *, kind: str | None = None
    ) -> Page[HistoryEntry]:
        """A workflow's history events by seq (its archive once it was archived); ``kind``:
        only events of that type (``started``, ``gate_answered``, ...)."""
        return self._listings.history(workflow, kind, page)

    def iter_history(
        self, workflow: UUID, *, kind: str | None = None, newest_first: bool = False
    ) -> Iterator[HistoryEntry]:
        return self._listings.stream_history(workflow, kind, newest_first=newest_first)

    # -- gates -------------------------------------------------------------------------------

    def list_gates(self, project: str | None = None) -> list[Gate]:
        """The open gates (workflow questions and parked jobs), oldest first."""
        return [gate for gate, _ in self.inbox(project)]

    def inbox(self, project: str | None = None) -> list[tuple[Gate, float]]:
        """:meth:`list_gates`, each with the seconds it has waited by the database's clock."""
        return self._lookup.inbox(project)

    def gate_page(
        self, where: GateFilter = EVERY_GATE, page: PageSpec = FIRST_PAGE
    ) -> Page[tuple[Gate, float]]:
        """Open gates by when they opened, each with the seconds it has waited; ``where``
        filters them by project, tenant, gate kind and age."""
        return self._listings.gates(where, page)

    def iter_gates(
        self, where: GateFilter = EVERY_GATE, *, newest_first: bool = False
    ) -> Iterator[tuple[Gate, float]]:
        return self._listings.stream_gates(where, newest_first=newest_first)

    # -- the ledger --------------------------------------------------------------------------

    def ledger_head(self, project: str) -> int:
        """The seq of the project's last ledger event; 0: it has no ledger."""
        return self._listings.ledger_head(project)

    def ledger_page(
        self, project: str, page: PageSpec = FIRST_PAGE, *, kind: str | None = None
    ) -> Page[LedgerEvent]:
        """A project's ledger events by seq; ``kind``: only events of that kind."""
        return self._listings.ledger(project, kind, page)

    def iter_ledger(
        self, project: str, *, kind: str | None = None, newest_first: bool = False
    ) -> Iterator[LedgerEvent]:
        return self._listings.stream_ledger(project, kind, newest_first=newest_first)

    def verify_ledger(self, project: str) -> LedgerVerification:
        """Recompute every digest of the project's ledger and check its seqs and head, in one
        snapshot. A project with no ledger verifies ``ok`` with ``count`` 0."""
        from store.ledger import Ledger

        return Ledger(self._pool).verify(project)

    # -- domain events and tenants -----------------------------------------------------------

    def events(
        self,
        *,
        limit: int = 20,
        after: int = 0,
        newest: bool = True,
        project: str | None = None,
        tenant: str | None = None,
        event_type: str | None = None,
    ) -> list[tuple[int, DomainEvent]]:
        """Domain events after seq ``after``, each with its seq, in seq order: the newest
        ``limit`` of them (``newest=False``: the oldest). ``event_type`` may be a family
        (``gate``); ``vibey events tail --follow`` calls this again with the last seq."""
        return self._events.recent(
            limit=limit,
            after=after,
            newest=newest,
            tenant=tenant,
            project=project,
            event_type=event_type,
        )

    def set_tenant(self, project: str, tenant: str) -> None:
        """Put ``project`` in ``tenant``: its events from now on carry it."""
        self._events.set_tenant(project, tenant)

    def tenant(self, project: str) -> str:
        """The tenant ``project`` belongs to (``default`` when none was set)."""
        return self._events.tenant_of(project)

    # -- project routes ----------------------------------------------------------------------

    def routes(self) -> list[ProjectRoute]:
        """The projects routed to their dedicated queues, with when and by whom."""
        from store.routes import list_routes

        return list_routes(self._pool)

    def dedicate(self, project: str, *, by: str) -> bool:
        """Route ``project``'s pointers to its dedicated queues; True when it was not routed
        before (its claimable pointers are then sent again on the new route)."""
        from store.routes import dedicate

        return dedicate(self._pool, project, by=by)

    def undedicate(self, project: str) -> bool:
        """Route ``project`` back to the shared lane queues; True when it was routed before."""
        from store.routes import undedicate

        return undedicate(self._pool, project)

    # -- engines and operations --------------------------------------------------------------

    def engine_health(self) -> list[EngineHealth]:
        """Every engine's recorded health: its circuit, capacity and last doctor pass."""
        from store.engine_health import EngineHealthStore

        return EngineHealthStore(pool=self._pool).all()

    def rotate_engine(self, project: str, *, by: str) -> RotationRequest:
        """Ask that ``project``'s next engine-driven attempt rotate away from the engine it
        last ran on (an open request is replaced); nothing running is interrupted."""
        from store.engine_health import EngineHealthStore

        return EngineHealthStore(pool=self._pool).request_rotation(project, by=by)

    def dead_letters(self, *, after: int | None = None, limit: int = 100) -> list[DeadLetter]:
        """The dead letters kept (messages that named no job), oldest first, after id
        ``after``."""
        from store.operations import OperationsStore

        return OperationsStore(self._pool).dead_letters(after=after, limit=limit)
