"""The read side of the list commands: one page at a time, by keyset, filtered in SQL.

Every list (open gates, workflows, a workflow's history, a project's ledger) pages the same
way: a :class:`PageSpec` says how many rows, in which order, and after which key; the answer
is a :class:`Page` with the rows, how many rows the filters match in all, and the key to pass
as ``after`` for the next page (None on the last). No page uses OFFSET: a page is an index
scan that starts at the key and stops after ``limit + 1`` rows, however deep it is
(``store/sql/listings.sql``, ``migrations/0009_list_indexes.sql``).

The keys: open gates ``(opened_at, id)``, workflows ``(updated_at, id)``, history and ledger
events ``(seq,)``. :meth:`Listings.stream` yields every matching row through a server-side
cursor, for ``--all --json``, without holding them all in memory.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from uuid import UUID

from psycopg.rows import DictRow, dict_row

from store.db import Pool, fetch_all, fetch_one, transaction
from store.sql import load

if TYPE_CHECKING:  # each list's rows are read by its own module, imported when it is listed
    from store.workflow_reads import HistoryEntry, Workflow
    from workflows.engine import Status
    from workflows.ledger import LedgerEvent
    from workflows.queue import Gate

Q = load("listings.sql")
W = load("workflows.sql")
DEFAULT_LIMIT = 50
# A page's count stops here ("more than 10,000"): it reads at most this many index entries.
COUNT_CAP = 10_000
STREAM_BATCH = 1000  # rows a round trip when streaming every row

T = TypeVar("T")
Key = tuple[Any, ...]


@dataclass(frozen=True, slots=True)
class PageSpec:
    """Which page: at most ``limit`` rows (None: every one), oldest or newest first, after the
    row whose key is ``after`` (None: from the start)."""

    limit: int | None = DEFAULT_LIMIT
    newest_first: bool = False
    after: Key | None = None


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    total: int  # rows the filters match on every page together, at most COUNT_CAP...
    next_after: Key | None  # the last item's key when more rows follow, else None
    total_capped: bool = False  # ...and True when more than COUNT_CAP match


@dataclass(frozen=True, slots=True)
class GateFilter:
    """Open gates: of a project, of a gate kind, open for at least / less than a duration."""

    project_id: str | None = None
    kind: str | None = None
    older_than: timedelta | None = None
    newer_than: timedelta | None = None
    tenant: str | None = None  # only the projects of this tenant (project_tenant)


@dataclass(frozen=True, slots=True)
class WorkflowFilter:
    """Workflows: of a status, project, definition; not updated for at least / less than."""

    status: Status | None = None
    project_id: str | None = None
    definition: str | None = None
    older_than: timedelta | None = None
    newer_than: timedelta | None = None
    tenant: str | None = None  # only the projects of this tenant (project_tenant)


@dataclass(frozen=True, slots=True)
class _List(Generic[T]):
    page: str  # query names in listings.sql
    count: str
    after: Callable[[Key | None], dict[str, Any]]  # the key as the page query's parameters
    key: Callable[[DictRow], Key]
    item: Callable[[DictRow], T]


def _after_moment(key: Key | None) -> dict[str, Any]:
    at, id_ = key if key is not None else (None, None)
    return {"after_at": at, "after_id": id_}


def _after_seq(key: Key | None) -> dict[str, Any]:
    return {"after_seq": None if key is None else key[0]}


def _gate_item(row: DictRow) -> tuple[Gate, float]:
    from store.gate_rows import gate_from_row

    return gate_from_row(row), (row["now"] - row["opened_at"]).total_seconds()


def _workflow_item(row: DictRow) -> Workflow:
    from store.workflow_reads import workflow_from_row

    return workflow_from_row(row)


def _history_item(row: DictRow) -> HistoryEntry:
    from store.workflow_reads import HistoryEntry

    return HistoryEntry(row["seq"], row["event"], row["commands"], row["recorded_at"])


def _ledger_item(row: DictRow) -> LedgerEvent:
    from store.ledger import event_from_row

    return event_from_row(row)


GATES: _List[tuple[Gate, float]] = _List(
    "gate_page", "gate_count", _after_moment, lambda r: (r["opened_at"], r["id"]), _gate_item
)
WORKFLOWS: _List[Workflow] = _List(
    "workflow_page",
    "workflow_count",
    _after_moment,
    lambda r: (r["updated_at"], r["id"]),
    _workflow_item,
)
HISTORY: _List[HistoryEntry] = _List(
    "history_page", "history_count", _after_seq, lambda r: (r["seq"],), _history_item
)
# A workflow past its retention: its events come from its archive (store/retention.py).
ARCHIVED_HISTORY: _List[HistoryEntry] = _List(
    "archived_history_page",
    "archived_history_count",
    _after_seq,
    lambda r: (r["seq"],),
    _history_item,
)
LEDGER: _List[LedgerEvent] = _List(
    "ledger_page", "ledger_count", _after_seq, lambda r: (int(r["seq"]),), _ledger_item
)


def directed(query: str, *, newest_first: bool) -> str:
    """The page query in the order asked for: the only text put into listings.sql's SQL."""
    cmp, order = ("<", "DESC") if newest_first else (">", "ASC")
    return query.replace("{cmp}", cmp).replace("{dir}", order)


def gate_params(where: GateFilter) -> dict[str, Any]:
    return {
        "project_id": where.project_id,
        "kind": where.kind,
        "older_than": where.older_than,
        "newer_than": where.newer_than,
        "tenant": where.tenant,
    }


def workflow_params(where: WorkflowFilter) -> dict[str, Any]:
    return {
        "status": None if where.status is None else where.status.value,
        "project_id": where.project_id,
        "definition": where.definition,
        "older_than": where.older_than,
        "newer_than": where.newer_than,
        "tenant": where.tenant,
    }


class Listings:
    """The list commands' reads on ``pool``."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    def gates(self, where: GateFilter, spec: PageSpec) -> Page[tuple[Gate, float]]:
        """Open gates (workflow questions and parked jobs) by how long they have waited, each
        with the seconds it has waited by the database's clock."""
        return self._page(GATES, gate_params(where), spec)

    def workflows(self, where: WorkflowFilter, spec: PageSpec) -> Page[Workflow]:
        """Workflows by their last update (newest first: the most recently updated)."""
        return self._page(WORKFLOWS, workflow_params(where), spec)

    def history(self, workflow_id: UUID, kind: str | None, spec: PageSpec) -> Page[HistoryEntry]:
        """A workflow's history events by seq; ``kind``: only events of that type."""
        listing = self._history_of(workflow_id)
        return self._page(listing, {"workflow_id": workflow_id, "kind": kind}, spec)

    def ledger(self, project_id: str, kind: str | None, spec: PageSpec) -> Page[LedgerEvent]:
        """A project's ledger events by seq; ``kind``: only events of that kind."""
        return self._page(LEDGER, {"project_id": project_id, "kind": kind}, spec)

    def stream_gates(
        self, where: GateFilter, *, newest_first: bool
    ) -> Iterator[tuple[Gate, float]]:
        return self._stream(GATES, gate_params(where), newest_first)

    def stream_workflows(self, where: WorkflowFilter, *, newest_first: bool) -> Iterator[Workflow]:
        return self._stream(WORKFLOWS, workflow_params(where), newest_first)

    def stream_history(
        self, workflow_id: UUID, kind: str | None, *, newest_first: bool
    ) -> Iterator[HistoryEntry]:
        listing = self._history_of(workflow_id)
        return self._stream(listing, {"workflow_id": workflow_id, "kind": kind}, newest_first)

    def _history_of(self, workflow_id: UUID) -> _List[HistoryEntry]:
        """The live history's listing, or the archive's once the workflow was archived."""
        with transaction(self._pool) as conn:
            row = fetch_one(conn, Q["is_archived"], {"workflow_id": workflow_id})
        return ARCHIVED_HISTORY if row is not None and row["archived"] else HISTORY

    def stream_ledger(
        self, project_id: str, kind: str | None, *, newest_first: bool
    ) -> Iterator[LedgerEvent]:
        return self._stream(LEDGER, {"project_id": project_id, "kind": kind}, newest_first)

    def workflow_for_project(self, project_id: str) -> Workflow:
        """The project's live workflow, else its most recent one."""
        from store.workflow_reads import WorkflowNotFound, workflow_from_row

        with transaction(self._pool) as conn:
            row = fetch_one(conn, W["latest_for_project"], {"project_id": project_id})
        if row is None:
            raise WorkflowNotFound(
                f"project {project_id!r} has no workflow; start one with "
                f"`vibey workflow start {project_id}`"
            )
        return workflow_from_row(row)

    def ledger_head(self, project_id: str) -> int:
        with transaction(self._pool) as conn:
            row = fetch_one(
                conn, Q["ledger_count"], {"project_id": project_id, "kind": None, "cap": None}
            )
        return 0 if row is None else int(row["n"])

    def _page(self, of: _List[T], filters: Mapping[str, Any], spec: PageSpec) -> Page[T]:
        if spec.limit is not None and spec.limit < 1:
            raise ValueError(f"a page holds at least one row, not {spec.limit}")
        limit = None if spec.limit is None else spec.limit + 1  # one more: do more follow?
        params = {**filters, **of.after(spec.after), "limit": limit, "cap": COUNT_CAP + 1}
        query = directed(Q[of.page], newest_first=spec.newest_first)
        with transaction(self._pool) as conn:  # one snapshot, one now(): page and count agree
            rows = fetch_all(conn, query, params)
            counted = fetch_one(conn, Q[of.count], params)
        more = spec.limit is not None and len(rows) > spec.limit
        rows = rows[: spec.limit] if more else rows
        total = 0 if counted is None else int(counted["n"])
        capped = total > COUNT_CAP and not (counted or {}).get("exact", False)
        return Page(
            items=[of.item(row) for row in rows],
            total=COUNT_CAP if capped else total,
            next_after=of.key(rows[-1]) if more else None,
            total_capped=capped,
        )

    def _stream(self, of: _List[T], filters: Mapping[str, Any], newest_first: bool) -> Iterator[T]:
        params = {**filters, **of.after(None), "limit": None}
        query = directed(Q[of.page], newest_first=newest_first)
        with (
            transaction(self._pool) as conn,
            conn.cursor(name="vibey_listing", row_factory=dict_row) as cur,
        ):
            cur.itersize = STREAM_BATCH
            cur.execute(query.encode(), params)
            for row in cur:
                yield of.item(row)
