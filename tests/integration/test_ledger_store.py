"""The ledger on PostgreSQL: append/read/verify, gapless seq under concurrent appenders, the
database refusing UPDATE/DELETE/TRUNCATE (to its owner, and to an application role), and
tampering by a superuser found by verify."""

from __future__ import annotations

import dataclasses
import secrets
import threading
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from store.db import transaction
from store.ledger import Ledger, LedgerWriteRefused
from workflows.ledger import (
    EventKind,
    NewEvent,
    UnrecognizedEventKind,
    digest,
    digest_range,
    open_items,
)

PROJECT = "ledger-test"


@pytest.fixture
def ledger(pool: ConnectionPool) -> Ledger:
    return Ledger(pool)


def events(n: int, kind: EventKind = EventKind.ToolInvoked, **extra: object) -> list[NewEvent]:
    return [NewEvent(kind, {"i": i, **extra}) for i in range(n)]


def seqs(url: str, project: str = PROJECT) -> list[int]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT seq FROM ledger_event WHERE project_id = %s ORDER BY seq", (project,)
        ).fetchall()
    return [int(r[0]) for r in rows]


def superuser(url: str, *statements: str) -> None:
    """Run ``statements`` as the superuser the tests connect as, in one transaction."""
    with psycopg.connect(url) as conn:
        for statement in statements:
            conn.execute(statement)


# --- append, read, verify -------------------------------------------------------------------


def test_append_assigns_seqs_in_order_and_read_returns_them(ledger: Ledger) -> None:
    job, workflow = uuid.uuid4(), uuid.uuid4()
    first = ledger.append(
        PROJECT,
        [
            NewEvent(EventKind.QuestionAsked, {"id": "q1", "text": "Who is it for? ✓"}),
            NewEvent(EventKind.AssumptionStated, {"id": "a1", "text": "web first"}),
        ],
        causation_id=str(job),
        correlation_id=str(workflow),
        job_id=job,
        workflow_id=workflow,
    )
    second = ledger.append(PROJECT, [NewEvent(EventKind.AnswerGiven, {"closes": "q1"})])
    assert [e.seq for e in first + second] == [1, 2, 3]
    read = ledger.read(PROJECT)
    assert [dataclasses.replace(e, payload=dict(e.payload)) for e in first + second] == read
    assert read[0].causation_id == str(job) and read[0].job_id == job
    assert read[0].correlation_id == str(workflow) and read[0].workflow_id == workflow
    assert read[2].causation_id is None and read[2].workflow_id is None
    assert [i.id for i in open_items(read)] == ["a1"]
    assert ledger.read(PROJECT, after=1, limit=1) == read[1:2]
    assert ledger.read(PROJECT, after=3) == []
    assert ledger.head(PROJECT) == 3
    result = ledger.verify(PROJECT)
    assert result.ok, result.problem
    assert (result.count, result.last_seq, result.first_bad_seq) == (3, 3, None)
    assert result.range_digest == digest_range(read)


def test_projects_have_their_own_sequences(ledger: Ledger) -> None:
    ledger.append("a", events(2))
    ledger.append("b", events(3))
    ledger.append("a", events(1))
    assert [e.seq for e in ledger.read("a")] == [1, 2, 3]
    assert [e.seq for e in ledger.read("b")] == [1, 2, 3]
    assert ledger.head("nobody") == 0
    assert ledger.read("nobody") == []
    empty = ledger.verify("nobody")
    assert empty.ok and empty.count == 0 and empty.last_seq == 0


def test_the_stored_digest_is_the_documented_one(ledger: Ledger, pg_url: str) -> None:
    ledger.append(PROJECT, [NewEvent(EventKind.BudgetSpent, {"usd": 1.0, "turns": 3})])
    with psycopg.connect(pg_url) as conn:
        kind, payload, stored = conn.execute(
            "SELECT kind, payload, digest FROM ledger_event WHERE project_id = %s", (PROJECT,)
        ).fetchone()  # type: ignore[misc]
    assert stored == digest(kind, payload) == digest("BudgetSpent", {"turns": 3, "usd": 1})


def test_append_on_joins_the_callers_transaction_and_a_rollback_frees_the_seqs(
    ledger: Ledger, pool: ConnectionPool
) -> None:
    ledger.append(PROJECT, events(2))

    class Abandon(Exception):
        pass

    with pytest.raises(Abandon), transaction(pool) as conn:
        written = ledger.append_on(conn, PROJECT, events(3, note="rolled back"))
        assert [e.seq for e in written] == [3, 4, 5]
        raise Abandon
    assert ledger.head(PROJECT) == 2
    again = ledger.append(PROJECT, events(1, note="kept"))
    assert [e.seq for e in again] == [3]
    assert all(e.payload.get("note") != "rolled back" for e in ledger.read(PROJECT))
    assert ledger.verify(PROJECT).ok


def test_appending_nothing_writes_nothing(ledger: Ledger) -> None:
    assert ledger.append(PROJECT, []) == []
    assert ledger.head(PROJECT) == 0


def test_the_writer_refuses_an_unrecognised_kind(ledger: Ledger) -> None:
    ledger.append(PROJECT, events(1))
    forged = NewEvent(EventKind.ToolInvoked, {})
    object.__setattr__(forged, "kind", UnrecognizedEventKind("FromTheFuture"))
    with pytest.raises(LedgerWriteRefused, match="read, never written"):
        ledger.append(PROJECT, [*events(1), forged])
    stored = ledger.read(PROJECT)
    with pytest.raises(LedgerWriteRefused, match="not a NewEvent"):
        ledger.append(PROJECT, stored)  # type: ignore[arg-type]
    with pytest.raises(LedgerWriteRefused, match="project id"):
        ledger.append("", events(1))
    assert ledger.head(PROJECT) == 1  # nothing of the refused batches was written
    assert len(ledger.read(PROJECT)) == 1


def test_a_kind_a_newer_vibey_wrote_is_read_kept_and_verified(ledger: Ledger, pg_url: str) -> None:
    ledger.append(PROJECT, [NewEvent(EventKind.QuestionAsked, {"id": "q"})])
    payload = {"closes": "q", "note": "a newer vibey's kind"}
    # What a newer vibey's append does, by hand: head and event in one transaction.
    with psycopg.connect(pg_url) as conn:
        conn.execute("UPDATE ledger_head SET last_seq = 2 WHERE project_id = %s", (PROJECT,))
        conn.execute(
            "INSERT INTO ledger_event (project_id, seq, kind, payload, digest) "
            "VALUES (%s, 2, 'QuestionWithdrawn', %s, %s)",
            (PROJECT, Jsonb(payload), digest("QuestionWithdrawn", payload)),
        )
    ledger.append(PROJECT, events(1))
    read = ledger.read(PROJECT)
    assert [e.seq for e in read] == [1, 2, 3]
    assert read[1].kind == UnrecognizedEventKind("QuestionWithdrawn")
    assert read[1].payload == payload
    result = ledger.verify(PROJECT)
    assert result.ok and result.count == 3 and result.unrecognised == 1
    assert result.range_digest == digest_range(read) != digest_range([read[0], read[2]])
    assert [i.id for i in open_items(read)] == ["q"]  # its "closes" is not understood


# --- concurrency ----------------------------------------------------------------------------


def test_concurrent_appenders_on_one_project_leave_no_gap(ledger: Ledger, pg_url: str) -> None:
    threads, rounds = 12, 25
    barrier = threading.Barrier(threads)

    def appender(worker: int) -> list[int]:
        barrier.wait(timeout=10)
        got: list[int] = []
        for r in range(rounds):
            batch = [
                NewEvent(EventKind.TurnCompleted, {"w": worker, "r": r, "j": j})
                for j in range(1 + (worker + r) % 3)
            ]
            got += [e.seq for e in ledger.append(PROJECT, batch)]
        return got

    with ThreadPoolExecutor(threads) as pool:
        results = list(pool.map(appender, range(threads)))
    assigned = sorted(s for seqs_ in results for s in seqs_)
    total = sum(1 + (w + r) % 3 for w in range(threads) for r in range(rounds))
    assert assigned == list(range(1, total + 1))  # no seq handed out twice, none skipped
    assert seqs(pg_url) == assigned
    # a batch takes consecutive seqs, in its order: (w, r, j) follows (w, r, j - 1)
    stored = {e.seq: e.payload for e in ledger.read(PROJECT)}
    for seq, payload in stored.items():
        if payload["j"] > 0:
            before = stored[seq - 1]
            assert (before["w"], before["r"], before["j"]) == (
                payload["w"],
                payload["r"],
                payload["j"] - 1,
            )
    result = ledger.verify(PROJECT)
    assert result.ok and result.count == total


def test_a_transaction_holding_the_head_makes_the_next_appender_wait(
    ledger: Ledger, pool: ConnectionPool
) -> None:
    ledger.append(PROJECT, events(1))
    started, done = threading.Event(), threading.Event()
    got: list[int] = []

    def second() -> None:
        started.set()
        got.extend(e.seq for e in ledger.append(PROJECT, events(1, who="second")))
        done.set()

    with transaction(pool) as conn:
        held = ledger.append_on(conn, PROJECT, events(2, who="first"))
        worker = threading.Thread(target=second)
        worker.start()
        started.wait(5)
        assert not done.wait(0.5)  # blocked on the head row
        ledger.append(PROJECT + "-other", events(1))  # another project does not wait
    worker.join(10)
    assert [e.seq for e in held] == [2, 3] and got == [4]


# --- append-only, in the database -----------------------------------------------------------


@pytest.mark.parametrize(
    "statement",
    [
        "UPDATE ledger_event SET payload = '{\"forged\": true}' WHERE seq = 1",
        "DELETE FROM ledger_event WHERE seq = 1",
        "TRUNCATE ledger_event",
        "UPDATE ledger_head SET last_seq = 1",
        "DELETE FROM ledger_head",
        "TRUNCATE ledger_head",
    ],
)
def test_the_database_refuses_to_change_the_ledger_even_for_its_owner(
    ledger: Ledger, pg_url: str, statement: str
) -> None:
    ledger.append(PROJECT, events(2))
    with pytest.raises(pg_errors.RaiseException, match=r"append-only|only moves forward|never"):
        superuser(pg_url, statement)
    assert seqs(pg_url) == [1, 2]
    assert ledger.verify(PROJECT).ok


@pytest.fixture
def app_role(pg_url: str) -> Iterator[tuple[str, str]]:
    """A login role with what an application needs to append, and no more: its name and URL.
    Dropped (with its grants) when the test ends."""
    name = f"vibey_app_{secrets.token_hex(4)}"
    password = secrets.token_hex(12)
    role = sql.Identifier(name)
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(role, sql.Literal(password))
        )
        admin.execute(sql.SQL("GRANT USAGE ON SCHEMA public TO {}").format(role))
        admin.execute(sql.SQL("GRANT SELECT, INSERT ON ledger_event TO {}").format(role))
        admin.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE ON ledger_head TO {}").format(role))
    parts = urlsplit(pg_url)
    netloc = f"{name}:{password}@{parts.hostname}" + (f":{parts.port}" if parts.port else "")
    try:
        yield name, urlunsplit(parts._replace(netloc=netloc))
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s",
                (name,),
            )
            admin.execute(sql.SQL("DROP OWNED BY {}").format(role))
            admin.execute(sql.SQL("DROP ROLE {}").format(role))


def as_role(url: str, statement: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute(statement)


def test_the_application_role_appends_but_cannot_update_delete_or_truncate(
    app_role: tuple[str, str], pg_url: str
) -> None:
    name, url = app_role
    with ConnectionPool(url, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
        app = Ledger(pool)
        assert [e.seq for e in app.append(PROJECT, events(3))] == [1, 2, 3]
        assert app.verify(PROJECT).ok
    denied = [
        "UPDATE ledger_event SET payload = '{}' WHERE seq = 2",
        "DELETE FROM ledger_event WHERE seq = 2",
        "TRUNCATE ledger_event",
        "DELETE FROM ledger_head",
        "ALTER TABLE ledger_event DISABLE TRIGGER ledger_event_append_only",
    ]
    for statement in denied:
        with pytest.raises(pg_errors.InsufficientPrivilege):
            as_role(url, statement)
    # Granted by mistake, the privileges still meet the trigger.
    superuser(pg_url, f"GRANT UPDATE, DELETE, TRUNCATE ON ledger_event TO {name}")
    for statement in denied[:3]:
        with pytest.raises(pg_errors.RaiseException, match="append-only"):
            as_role(url, statement)
    assert seqs(pg_url) == [1, 2, 3]


# --- tampering by a superuser is found ------------------------------------------------------


def tamper(url: str, *statements: str) -> None:
    superuser(
        url,
        "ALTER TABLE ledger_event DISABLE TRIGGER ledger_event_append_only",
        *statements,
        "ALTER TABLE ledger_event ENABLE TRIGGER ledger_event_append_only",
    )


def test_an_altered_row_is_found_and_named(ledger: Ledger, pg_url: str) -> None:
    ledger.append(PROJECT, events(5))
    before = ledger.verify(PROJECT)
    tamper(
        pg_url,
        "UPDATE ledger_event SET payload = jsonb_set(payload, '{i}', '99') "
        f"WHERE project_id = '{PROJECT}' AND seq = 3",
    )
    after = ledger.verify(PROJECT)
    assert (after.ok, after.first_bad_seq, after.count) == (False, 3, 5)
    assert "does not match its digest" in str(after.problem)
    assert after.range_digest != before.range_digest


def test_a_removed_row_is_a_gap_and_a_removed_tail_disagrees_with_the_head(
    ledger: Ledger, pg_url: str
) -> None:
    ledger.append(PROJECT, events(6))
    tamper(pg_url, f"DELETE FROM ledger_event WHERE project_id = '{PROJECT}' AND seq = 2")
    middle = ledger.verify(PROJECT)
    assert (middle.ok, middle.first_bad_seq) == (False, 2)
    assert "seq 2 missing" in str(middle.problem)
    ledger.append("tail", events(4))
    tamper(pg_url, "DELETE FROM ledger_event WHERE project_id = 'tail' AND seq >= 3")
    tail = ledger.verify("tail")
    assert (tail.ok, tail.first_bad_seq, tail.count) == (False, 3, 2)
    assert "seq 3..4 removed" in str(tail.problem)


def test_a_rewritten_row_with_a_matching_digest_changes_the_range_digest(
    ledger: Ledger, pg_url: str
) -> None:
    """A superuser who rewrites payload and digest together passes the per-row check; the
    range digest (what a handoff brief records, R6) is what tells."""
    ledger.append(PROJECT, events(4))
    recorded = ledger.verify(PROJECT).range_digest
    forged = {"i": 42}
    tamper(
        pg_url,
        f"UPDATE ledger_event SET payload = '{{\"i\": 42}}', "
        f"digest = '{digest('ToolInvoked', forged)}' WHERE project_id = '{PROJECT}' AND seq = 2",
    )
    result = ledger.verify(PROJECT)
    assert result.ok
    assert result.range_digest != recorded
