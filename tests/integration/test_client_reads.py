"""``vibey.Client`` for what the list and show commands read and the routine writes beside them
(`gate list`, `workflow list`/`history`, `ledger show`/`verify`, `events tail`, `tenant`,
`project dedicate`/`undedicate`/`list`, `engine list`/`rotate`, `queue stats`/`dead`), on the
real PostgreSQL; and that a read command's client assembles no graph and loads neither pika
nor Dramatiq."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from store.ledger import Ledger
from store.listings import GateFilter, PageSpec, WorkflowFilter
from store.operations import OperationsStore
from store.workflow_reads import WorkflowNotFound
from tests.acceptance.tiny_definition import DEFINITIONS, NAME
from vibey.client import Client, read_client
from vibey.settings import Settings, load_settings
from workflows.engine import Registry, Status
from workflows.ledger import EventKind, NewEvent

TINY = "tests.acceptance.tiny_definition:DEFINITIONS"


@pytest.fixture
def settings(pg_url: str, tmp_path: Path) -> Settings:
    env = {
        "VIBEY_PG_URL": pg_url,
        "VIBEY_QUEUE_BACKEND": "postgres",
        "VIBEY_WORKFLOW_DEFINITIONS": TINY,
    }
    return load_settings(env, tmp_path)


@pytest.fixture
def client(settings: Settings) -> Iterator[Client]:
    with Client(settings, registry=Registry(DEFINITIONS), connect_relay=False) as running:
        yield running


def test_a_read_client_assembles_no_graph_and_loads_no_broker_client(pg_url: str) -> None:
    probe = (
        "import sys\n"
        "from vibey.client import read_client\n"
        "from vibey.settings import load_settings\n"
        "with read_client(load_settings()) as client:\n"
        "    page = client.gate_page()\n"
        "    client.routes(), client.events(limit=1), client.ledger_head('p')\n"
        "    print(page.total, client._graph is None)\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pika', 'dramatiq')))\n"
    )
    env = {**os.environ, "VIBEY_PG_URL": pg_url, "VIBEY_QUEUE_BACKEND": "postgres"}
    done = subprocess.run(
        [sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["0 True", "[]"]


def test_gates_page_by_filter_and_stream_whole(client: Client) -> None:
    for project in ("pg-1", "pg-2", "pg-3"):
        client.start(project, NAME)  # two open gates each: approve and rating
    first = client.gate_page(page=PageSpec(limit=4))
    assert (len(first.items), first.total, first.total_capped) == (4, 6, False)
    assert first.next_after is not None and all(waited >= 0 for _, waited in first.items)
    rest = client.gate_page(page=PageSpec(limit=4, after=first.next_after))
    assert len(rest.items) == 2 and rest.next_after is None
    paged = [g.id for g, _ in first.items + rest.items]
    assert paged == [g.id for g, _ in client.iter_gates()]  # the same order, oldest first
    assert [g.id for g, _ in client.iter_gates(newest_first=True)] == paged[::-1]
    only = client.gate_page(GateFilter(project_id="pg-2", kind="approval"))
    assert [(g.project_id, g.name) for g, _ in only.items] == [("pg-2", "approve")]


def test_workflows_page_and_the_history_of_one(client: Client) -> None:
    runs = [client.start(f"wf-{n}", NAME) for n in range(3)]
    client.answer(f"{runs[0].id}:approve", "no", by="alice")  # a no completes it
    newest = client.workflow_page(page=PageSpec(limit=2, newest_first=True))
    assert newest.total == 3 and len(newest.items) == 2 and newest.next_after is not None
    assert newest.items[0].id == runs[0].id  # answered last: the most recently updated
    done = client.workflow_page(WorkflowFilter(status=Status.COMPLETED))
    assert [w.id for w in done.items] == [runs[0].id]
    assert {w.id for w in client.iter_workflows()} == {r.id for r in runs}
    assert client.describe(client.status("wf-1")) == "tiny: answers so far []"

    history = client.history_page(runs[0].id)
    assert [e.seq for e in history.items] == [1, 2] and history.total == 2  # started, answered
    answers = client.history_page(runs[0].id, kind="gate_answered")
    assert [e.seq for e in answers.items] == [2]
    assert [e.seq for e in client.iter_history(runs[0].id, newest_first=True)] == [2, 1]
    with pytest.raises(WorkflowNotFound, match="has no workflow"):
        client.status("no-such-project")


def test_the_ledger_pages_and_verifies(client: Client) -> None:
    spent = [NewEvent(EventKind.BudgetSpent, {"engine": "codex", "turns": n}) for n in (1, 2, 3)]
    Ledger(client._pool).append("led-1", spent)
    Ledger(client._pool).append("led-1", [NewEvent(EventKind.AnswerGiven, {"answer": "yes"})])
    assert client.ledger_head("led-1") == 4 and client.ledger_head("nobody") == 0
    page = client.ledger_page("led-1", PageSpec(limit=2))
    assert [e.seq for e in page.items] == [1, 2] and (page.total, page.next_after) == (4, (2,))
    spends = client.ledger_page("led-1", PageSpec(newest_first=True), kind="BudgetSpent")
    assert [e.seq for e in spends.items] == [3, 2, 1]
    assert [e.seq for e in client.iter_ledger("led-1")] == [1, 2, 3, 4]
    assert [e.seq for e in client.iter_ledger("led-1", kind="AnswerGiven")] == [4]
    verified = client.verify_ledger("led-1")
    assert verified.ok and verified.count == 4 and verified.range_digest
    with client._pool.connection() as conn:  # an altered row (the table is append-only)
        conn.execute("ALTER TABLE ledger_event DISABLE TRIGGER ledger_event_append_only")
        conn.execute(
            "UPDATE ledger_event SET payload = '{}' WHERE project_id = 'led-1' AND seq = 2"
        )
        conn.execute("ALTER TABLE ledger_event ENABLE TRIGGER ledger_event_append_only")
    tampered = client.verify_ledger("led-1")
    assert not tampered.ok and tampered.first_bad_seq == 2
    empty = client.verify_ledger("nobody")
    assert empty.ok and empty.count == 0


def test_events_and_tenants(client: Client) -> None:
    client.start("ev-1", NAME)
    client.start("ev-2", NAME)
    mine = client.events(project="ev-1", limit=100)
    assert mine and {e.project_id for _, e in mine} == {"ev-1"}
    seqs = [seq for seq, _ in mine]
    assert seqs == sorted(seqs)
    assert client.events(project="ev-1", after=seqs[-1]) == []
    assert client.tenant("ev-2") == "default"
    client.set_tenant("ev-2", "acme")
    assert client.tenant("ev-2") == "acme"
    client.start("ev-2", NAME)  # its live workflow: nothing new; then a gate opens for it
    gates = client.events(event_type="gate", limit=100)
    assert gates and all(e.event_type.value.startswith("gate.") for _, e in gates)
    assert client.events(tenant="nobody-here") == []


def test_project_routes_engine_rotation_and_dead_letters(settings: Settings) -> None:
    with read_client(settings) as client:  # what a CLI command holds: writes on the pool too
        routes_rotation_and_dead_letters(client)
        assert client._graph is None


def routes_rotation_and_dead_letters(client: Client) -> None:
    assert client.routes() == []
    assert client.dedicate("rt-1", by="ops") is True
    assert client.dedicate("rt-1", by="ops") is False  # idempotent
    [route] = client.routes()
    assert (route.project_id, route.dedicated_by) == ("rt-1", "ops")
    assert client.undedicate("rt-1") is True and client.undedicate("rt-1") is False
    assert client.routes() == []

    assert client.engine_health() == []
    request = client.rotate_engine("rt-1", by="ops")
    assert (request.project_id, request.away_from, request.requested_by) == ("rt-1", None, "ops")

    assert client.dead_letters() == []
    ops = OperationsStore(client._pool)
    kept = [
        ops.keep_dead_letter(queue="q", routing_key="k", reason="malformed", body=b"x%d" % n)
        for n in range(3)
    ]
    assert [d.id for d in client.dead_letters()] == kept
    assert [d.body for d in client.dead_letters(after=kept[0], limit=1)] == [b"x1"]


def test_queue_stats_on_the_postgres_backend(client: Client) -> None:
    client.start("qs-1", NAME)  # its first step waits to be claimed
    stats = client.queue_stats()
    assert stats.backend == "postgres" and stats.dead_queue is None
    assert stats.oldest_ready is not None and stats.oldest_ready["project_id"] == "qs-1"
    assert sum(q.ready or 0 for q in stats.queues) == 1
