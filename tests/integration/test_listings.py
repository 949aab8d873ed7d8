"""The list commands' reads (store.listings) on a real PostgreSQL: keyset pages in both orders
add up to the whole list, filters are applied in SQL, and at 100,000 rows each filtered page is
an index scan (the plans are read with EXPLAIN)."""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from store.listings import (
    COUNT_CAP,
    GateFilter,
    Listings,
    Page,
    PageSpec,
    WorkflowFilter,
    directed,
    gate_params,
    workflow_params,
)
from store.sql import load
from workflows.engine import Status
from workflows.ledger import EventKind, NewEvent

Q = load("listings.sql")


@pytest.fixture
def lists(pool: ConnectionPool) -> Listings:
    return Listings(pool)


def add_gates(conn: psycopg.Connection, n: int, *, same_moment: bool = False) -> None:
    """``n`` open gates over projects p0..p2 and kinds approval/handoff, one a minute back
    from now (or all at one moment), and one answered gate that no list shows."""
    opened = "now() - interval '1 hour'" if same_moment else "now() - i * interval '1 minute'"
    conn.execute(
        "INSERT INTO gate (id, project_id, kind, prompt, opened_at) "
        "SELECT gen_random_uuid(), 'p' || (i %% 3), "
        "CASE WHEN i %% 2 = 0 THEN 'approval' ELSE 'handoff' END, 'q' || i, "
        f"{opened} FROM generate_series(1, %s) AS i",
        (n,),
    )
    conn.execute(
        "INSERT INTO gate (id, project_id, kind, prompt, answer, answered_by, answered_at) "
        "VALUES (gen_random_uuid(), 'p0', 'approval', 'done', 'yes', 'me', now())"
    )


def add_workflows(conn: psycopg.Connection, n: int) -> None:
    """``n`` workflows, one project each; every third completed, the others blocked."""
    conn.execute(
        "INSERT INTO workflow (id, project_id, definition, version, phase, state, status, "
        "completion_mode, finished_at, updated_at) "
        "SELECT gen_random_uuid(), 'w' || i, CASE WHEN i %% 5 = 0 THEN 'other' ELSE 'tiny' END, "
        "1, 'design', '{}'::jsonb, "
        "CASE WHEN i %% 3 = 0 THEN 'completed' ELSE 'blocked' END::workflow_status, "
        "CASE WHEN i %% 3 = 0 THEN 'local' END, CASE WHEN i %% 3 = 0 THEN now() END, "
        "now() - i * interval '1 second' FROM generate_series(1, %s) AS i",
        (n,),
    )


def every_page(fetch: Any, limit: int, newest_first: bool) -> tuple[list[Any], list[Page[Any]]]:
    pages: list[Page[Any]] = []
    after = None
    while True:
        page = fetch(PageSpec(limit=limit, newest_first=newest_first, after=after))
        pages.append(page)
        if page.next_after is None:
            break
        after = page.next_after
    return [item for page in pages for item in page.items], pages


def gate_ids(items: Sequence[Any]) -> list[UUID]:
    return [gate.id for gate, _ in items]


@pytest.mark.parametrize("newest_first", [False, True])
def test_gate_pages_add_up_to_the_whole_inbox_in_order(
    pool: ConnectionPool, lists: Listings, newest_first: bool
) -> None:
    with pool.connection() as conn:
        add_gates(conn, 120)
    everything = lists.gates(GateFilter(), PageSpec(limit=None, newest_first=newest_first))
    assert everything.total == 120 and len(everything.items) == 120
    assert everything.next_after is None and not everything.total_capped
    opened = [gate.opened_at for gate, _ in everything.items]
    assert opened == sorted(opened, reverse=newest_first)
    items, pages = every_page(lambda s: lists.gates(GateFilter(), s), 50, newest_first)
    assert [len(p.items) for p in pages] == [50, 50, 20]
    assert {p.total for p in pages} == {120}
    assert gate_ids(items) == gate_ids(everything.items)
    waited = [w for _, w in everything.items]
    assert waited == sorted(waited, reverse=not newest_first)


def test_gates_opened_at_one_moment_page_by_id_without_loss_or_repeat(
    pool: ConnectionPool, lists: Listings
) -> None:
    with pool.connection() as conn:
        add_gates(conn, 40, same_moment=True)
    items, pages = every_page(lambda s: lists.gates(GateFilter(), s), 7, False)
    assert len(pages) == 6
    assert len(set(gate_ids(items))) == 40
    assert gate_ids(items) == sorted(gate_ids(items), key=str)


def test_gate_filters_are_applied_in_sql(pool: ConnectionPool, lists: Listings) -> None:
    with pool.connection() as conn:
        add_gates(conn, 120)
        conn.execute("INSERT INTO project_tenant (project_id, tenant_id) VALUES ('p1', 'acme')")
    everything = lists.gates(GateFilter(), PageSpec(limit=None)).items
    cases = {
        GateFilter(project_id="p1"): lambda g, w: g.project_id == "p1",
        GateFilter(kind="handoff"): lambda g, w: g.kind == "handoff",
        GateFilter(project_id="p0", kind="approval"): lambda g, w: (
            (g.project_id, g.kind) == ("p0", "approval")
        ),
        GateFilter(older_than=timedelta(minutes=100)): lambda g, w: w >= 100 * 60,
        GateFilter(newer_than=timedelta(minutes=30)): lambda g, w: w < 30 * 60,
        GateFilter(tenant="acme"): lambda g, w: g.project_id == "p1",
        GateFilter(tenant="default", kind="handoff"): lambda g, w: (
            g.project_id != "p1" and g.kind == "handoff"
        ),
    }
    for where, keep in cases.items():
        expected = [(g, w) for g, w in everything if keep(g, w)]
        page = lists.gates(where, PageSpec(limit=10))
        assert 0 < len(expected) < 120, where
        assert page.total == len(expected), where
        assert gate_ids(page.items) == gate_ids(expected[:10]), where


def test_workflow_pages_newest_first_and_by_status(pool: ConnectionPool, lists: Listings) -> None:
    with pool.connection() as conn:
        add_workflows(conn, 90)
    items, pages = every_page(lambda s: lists.workflows(WorkflowFilter(), s), 25, True)
    assert [len(p.items) for p in pages] == [25, 25, 25, 15]
    updated = [wf.updated_at for wf in items]
    assert updated == sorted(updated, reverse=True) and len({wf.id for wf in items}) == 90
    done = lists.workflows(WorkflowFilter(status=Status.COMPLETED), PageSpec(limit=100))
    assert done.total == 30 and {wf.status for wf in done.items} == {Status.COMPLETED}
    other = lists.workflows(WorkflowFilter(definition="other"), PageSpec(limit=5))
    assert other.total == 18 and {wf.definition for wf in other.items} == {"other"}
    one = lists.workflows(WorkflowFilter(project_id="w7"), PageSpec())
    assert [wf.project_id for wf in one.items] == ["w7"] and one.next_after is None
    stale = lists.workflows(WorkflowFilter(older_than=timedelta(seconds=60)), PageSpec())
    assert stale.total == 31  # updated 60..90 seconds ago
    with pool.connection() as conn:
        conn.execute("INSERT INTO project_tenant VALUES ('w7', 'acme'), ('w8', 'acme')")
    acme = lists.workflows(WorkflowFilter(tenant="acme"), PageSpec())
    assert sorted(wf.project_id for wf in acme.items) == ["w7", "w8"] and acme.total == 2
    assert lists.workflows(WorkflowFilter(tenant="default"), PageSpec(limit=1)).total == 88


def test_ledger_pages_by_seq_either_way_and_by_kind(pool: ConnectionPool, lists: Listings) -> None:
    from store.ledger import Ledger

    kinds = [EventKind.QuestionAsked, EventKind.DecisionRecorded] * 30
    Ledger(pool).append("demo", [NewEvent(k, {"i": i}) for i, k in enumerate(kinds)])
    forward, _ = every_page(lambda s: lists.ledger("demo", None, s), 50, False)
    assert [e.seq for e in forward] == list(range(1, 61))
    backward = lists.ledger("demo", None, PageSpec(limit=10, newest_first=True, after=(20,)))
    assert [e.seq for e in backward.items] == list(range(19, 9, -1))
    assert backward.total == 60 and backward.next_after == (10,)
    asked = lists.ledger("demo", EventKind.QuestionAsked.value, PageSpec(limit=50))
    assert asked.total == 30 and {e.kind for e in asked.items} == {EventKind.QuestionAsked}
    assert lists.ledger_head("demo") == 60 and lists.ledger_head("nobody") == 0


def test_history_pages_by_seq_and_by_event_type(pool: ConnectionPool, lists: Listings) -> None:
    with pool.connection() as conn:
        add_workflows(conn, 1)
        (wf,) = conn.execute("SELECT id FROM workflow").fetchone() or ()
        for seq in range(1, 13):
            kind = "started" if seq == 1 else "step_succeeded"
            conn.execute(
                "INSERT INTO workflow_history (workflow_id, seq, event) VALUES (%s, %s, %s)",
                (wf, seq, Jsonb({"type": kind, "step": str(seq)})),
            )
    first = lists.history(wf, None, PageSpec(limit=5))
    assert [e.seq for e in first.items] == [1, 2, 3, 4, 5] and first.next_after == (5,)
    rest = lists.history(wf, None, PageSpec(limit=50, after=first.next_after))
    assert [e.seq for e in rest.items] == list(range(6, 13)) and rest.next_after is None
    started = lists.history(wf, "started", PageSpec())
    assert started.total == 1 and [e.seq for e in started.items] == [1]


def test_streams_yield_every_row_in_the_order_asked(pool: ConnectionPool, lists: Listings) -> None:
    with pool.connection() as conn:
        add_gates(conn, 2500)  # more than one server-side cursor batch
    streamed = list(lists.stream_gates(GateFilter(kind="approval"), newest_first=True))
    paged = lists.gates(GateFilter(kind="approval"), PageSpec(limit=None, newest_first=True))
    assert gate_ids(streamed) == gate_ids(paged.items) and len(streamed) == 1250


# --- the plans at 100,000 rows ----------------------------------------------------------------


def plan(conn: psycopg.Connection, query: str, params: dict[str, Any]) -> dict[str, Any]:
    row = conn.execute(("EXPLAIN (FORMAT JSON) " + query).encode(), params).fetchone()
    assert row is not None
    value = row[0]
    top: dict[str, Any] = (json.loads(value) if isinstance(value, str) else value)[0]["Plan"]
    return top


def nodes(node: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield node
    for child in node.get("Plans", ()):
        yield from nodes(child)


def page_params(filters: dict[str, Any], after: tuple[Any, Any] | None) -> dict[str, Any]:
    at, id_ = after if after is not None else (None, None)
    return {**filters, "after_at": at, "after_id": id_, "limit": 51}


@pytest.fixture
def big(pool: ConnectionPool) -> Iterator[psycopg.Connection]:
    with pool.connection() as conn:
        add_gates(conn, 100_000)
        add_workflows(conn, 100_000)
        conn.execute(  # one project's 100,000 ledger events of four kinds (digests unchecked)
            "INSERT INTO ledger_head (project_id, last_seq) VALUES ('big', 100000);"
            "INSERT INTO ledger_event (project_id, seq, kind, payload, digest) "
            "SELECT 'big', i, (ARRAY['QuestionAsked', 'AnswerGiven', 'TurnRequested', "
            "'TurnCompleted'])[1 + i % 4], '{}'::jsonb, repeat('0', 64) "
            "FROM generate_series(1, 100000) AS i"
        )
        conn.execute(  # and one workflow's 100,000 history events
            "INSERT INTO workflow_history (workflow_id, seq, event) "
            "SELECT (SELECT id FROM workflow WHERE project_id = 'w1'), i, "
            "jsonb_build_object('type', CASE WHEN i % 2 = 0 THEN 'timer_fired' ELSE 'x' END) "
            "FROM generate_series(1, 100000) AS i"
        )
        for table in ("gate", "workflow", "ledger_event", "workflow_history"):
            conn.execute(f"VACUUM ANALYZE {table}")
        yield conn


GATE_CASES = [
    (GateFilter(), "gate_inbox"),
    (GateFilter(project_id="p1"), "gate_inbox_by_project"),
    (GateFilter(kind="handoff"), "gate_inbox_by_kind"),
    (GateFilter(older_than=timedelta(days=10)), "gate_inbox"),
]
WORKFLOW_CASES = [
    (WorkflowFilter(), "workflow_by_update"),
    (WorkflowFilter(status=Status.COMPLETED), "workflow_by_status_update"),
    (WorkflowFilter(project_id="w77"), "workflow_by_project_update"),
    (WorkflowFilter(definition="other"), "workflow_by_definition_update"),
]


def assert_index_page(top: dict[str, Any], index: str, where: object) -> None:
    scans = [n for n in nodes(top) if "Scan" in n["Node Type"]]
    assert top["Node Type"] == "Limit", (where, top["Node Type"])
    assert [n["Node Type"] for n in scans] in (["Index Scan"], ["Index Only Scan"]), (where, scans)
    assert scans[0]["Index Name"] == index, (where, scans[0]["Index Name"])
    assert not [n for n in nodes(top) if n["Node Type"] == "Sort"], where


def test_each_filtered_page_is_an_index_scan_at_100000_rows(
    big: psycopg.Connection, lists: Listings
) -> None:
    counted = lists.gates(GateFilter(), PageSpec())
    assert (counted.total, counted.total_capped) == (COUNT_CAP, True)  # the count stops
    few = lists.gates(GateFilter(older_than=timedelta(minutes=100_000 - 5_000)), PageSpec())
    assert few.total_capped is False and 4_999 <= few.total <= 5_001
    for newest_first in (False, True):
        gate_page = directed(Q["gate_page"], newest_first=newest_first)
        for where, index in GATE_CASES:
            first = lists.gates(where, PageSpec(newest_first=newest_first))
            for after in (None, first.next_after):  # the first page and a later one
                top = plan(big, gate_page, page_params(gate_params(where), after))
                assert_index_page(top, index, where)
        ledger_page = directed(Q["ledger_page"], newest_first=newest_first)
        for kind, index in ((None, "ledger_event_pkey"), ("AnswerGiven", "ledger_event_by_kind")):
            for seq in (None, 50_000):
                params = {"project_id": "big", "kind": kind, "after_seq": seq, "limit": 51}
                assert_index_page(plan(big, ledger_page, params), index, kind)
        history_page = directed(Q["history_page"], newest_first=newest_first)
        (w1,) = big.execute("SELECT id FROM workflow WHERE project_id = 'w1'").fetchone() or ()
        for seq in (None, 50_000):
            params = {"workflow_id": w1, "kind": None, "after_seq": seq, "limit": 51}
            assert_index_page(plan(big, history_page, params), "workflow_history_pkey", "history")
        workflow_page = directed(Q["workflow_page"], newest_first=newest_first)
        for wf_where, index in WORKFLOW_CASES:
            first_wf = lists.workflows(wf_where, PageSpec(newest_first=newest_first))
            for after in (None, first_wf.next_after):
                top = plan(big, workflow_page, page_params(workflow_params(wf_where), after))
                assert_index_page(top, index, wf_where)
