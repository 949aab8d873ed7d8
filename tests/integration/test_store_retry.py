"""Lost connections at the store seam, on a real PostgreSQL: what is retried, what is resolved
by reading the row, and what the step actor does when PostgreSQL does not answer at all."""

from __future__ import annotations

import logging
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from actors import outage
from actors.broker import VibeyBroker
from actors.capabilities import detect
from actors.config import BusSettings, QueueSettings, RabbitMqSettings
from actors.steps import StepResult, StepRunner
from actors.topology import QueueNames
from actors.worker import WorkerConfig
from store import unit_of_work
from store.db import Pool, pipelined_transaction, statement, transaction
from store.dispatch import DispatchRecords
from store.errors import CommitUnknown, ConnectionLost, DatabaseUnavailable
from store.jobs import PostgresJobRepository
from store.pool import open_pool
from store.retry import STORE_ATTEMPTS, retrying
from store.unit_of_work import OutboxRow
from store.workflows import WorkflowStore
from tests.amqp_fixtures import Amqp
from tests.chaos.pg_blips import database_of
from tests.tiny_definition import THREE_STEPS
from workflows.dispatch import WaitTiers, decode, tier_name
from workflows.engine import Registry
from workflows.job import JobState
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Success

P = "proj"
TIERS = WaitTiers((timedelta(seconds=1), timedelta(seconds=5)))
KILL = (
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
    "WHERE datname = %s AND pid <> pg_backend_pid()"
)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def vibey_pool(pg_url: str) -> Iterator[Pool]:
    pool = open_pool(pg_url, min_size=2, max_size=4)
    try:
        yield pool
    finally:
        pool.close()


@pytest.fixture
def dead_pool() -> Iterator[Pool]:
    """A pool whose server never answers (nothing listens on its port)."""
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/gone"
    pool: Pool = ConnectionPool(
        url, min_size=1, open=False, timeout=0.2, kwargs={"autocommit": True, "connect_timeout": 1}
    )
    pool.open(wait=False)
    try:
        yield pool
    finally:
        pool.close()


def kill_backends(pg_url: str) -> int:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(KILL, (database_of(pg_url),)).fetchone()
    return int(row[0]) if row else 0


def live_sessions(pg_url: str) -> int:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()",
            (database_of(pg_url),),
        ).fetchone()
    return int(row[0]) if row else 0


def retries(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "store.retry"]


def test_connections_killed_while_idle_are_never_handed_out(
    vibey_pool: Pool, pg_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = PostgresJobRepository(pool=vibey_pool)
    job = store.enqueue(EnqueueRequest(project_id=P, kind="design.interview")).job
    assert kill_backends(pg_url) >= 2  # both idle pooled connections
    # pg_terminate_backend only signals: wait until the killed sessions are gone, so that
    # the connections are dead (not dying) when a caller asks for one.
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and live_sessions(pg_url) > 0:
        time.sleep(0.05)
    caplog.set_level(logging.WARNING)
    for _ in range(5):
        assert store.get(job.id) is not None
    assert retries(caplog) == [], "a dead connection reached a caller"


def test_a_connection_lost_before_the_commit_is_retried_and_wrote_nothing(
    vibey_pool: Pool, caplog: pytest.LogCaptureFixture
) -> None:
    with transaction(vibey_pool) as conn:
        conn.execute("CREATE TABLE scratch (n int)")
    calls: list[int] = []

    def write() -> int:
        calls.append(1)
        with transaction(vibey_pool) as conn:
            conn.execute("INSERT INTO scratch VALUES (1)")
            if len(calls) == 1:  # the server ends this session mid-transaction
                conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")
        return len(calls)

    caplog.set_level(logging.WARNING)
    assert retrying(write, what="write scratch", idempotent=False) == 2
    assert any(f"write scratch: attempt 1/{STORE_ATTEMPTS} failed" in m for m in retries(caplog))
    with statement(vibey_pool) as conn:
        assert conn.execute("SELECT count(*) FROM scratch").fetchone() == (1,)


def test_a_statement_cut_off_in_flight_is_not_repeated_unless_it_is_idempotent(
    vibey_pool: Pool,
) -> None:
    calls: list[int] = []

    def suicide() -> None:
        calls.append(1)
        with statement(vibey_pool) as conn:  # autocommit: the statement commits by itself
            conn.execute("SELECT pg_terminate_backend(pg_backend_pid())")

    with pytest.raises(CommitUnknown, match="may have landed"):
        retrying(suicide, what="a write", idempotent=False)
    assert len(calls) == 1
    with pytest.raises(DatabaseUnavailable, match=f"did not answer after {STORE_ATTEMPTS}"):
        retrying(suicide, what="a read", idempotent=True)
    assert len(calls) == 1 + STORE_ATTEMPTS


def test_past_its_attempts_a_call_says_postgresql_did_not_answer(dead_pool: Pool) -> None:
    store = PostgresJobRepository(pool=dead_pool)
    with pytest.raises(DatabaseUnavailable) as raised:
        store.get(uuid.uuid4())
    assert str(raised.value).startswith(
        f"PostgreSQL did not answer after {STORE_ATTEMPTS} attempts (read a job)"
    )
    assert isinstance(raised.value.__cause__, ConnectionLost)


def test_a_claim_cut_off_is_adopted_only_by_the_owner_it_landed_for(vibey_pool: Pool) -> None:
    store = PostgresJobRepository(pool=vibey_pool, dispatch=True, relay_id="r")
    records = DispatchRecords(pool=vibey_pool, relay_id="r")
    job = store.enqueue(EnqueueRequest(project_id=P, kind="design.interview")).job
    claimed = records.claim_pointer(job_id=job.id, project_id=P, seq=job.dispatch_seq, owner="w1")
    assert claimed is not None
    adopted = outage.adopt_claim(store, job_id=job.id, seq=job.dispatch_seq, owner="w1")
    assert adopted is not None and adopted.lease_token == claimed.lease_token
    assert outage.adopt_claim(store, job_id=job.id, seq=job.dispatch_seq, owner="w2") is None
    stale = job.dispatch_seq + 1
    assert outage.adopt_claim(store, job_id=job.id, seq=stale, owner="w1") is None


def test_a_settle_cut_off_is_resolved_from_the_row(vibey_pool: Pool) -> None:
    store = PostgresJobRepository(pool=vibey_pool)
    store.enqueue(EnqueueRequest(project_id=P, kind="design.interview"))
    store.enqueue(EnqueueRequest(project_id=P, kind="design.interview", subject="2"))
    first, second = store.claim(P, owner="w", limit=2)
    calls: list[str] = []

    def landed_then_cut() -> str:  # the ack committed; its answer never came back
        calls.append("landed")
        assert store.ack(first.lease).applied
        raise CommitUnknown("cut off")

    assert outage.settle_resolved(store, first, "succeeded", landed_then_cut) == "succeeded"
    assert calls == ["landed"], "a settle that landed was run again"

    def cut_then_landed() -> str:  # first try never reached the server; the second lands
        calls.append("try")
        if calls.count("try") == 1:
            raise CommitUnknown("cut off")
        return "succeeded" if store.ack(second.lease).applied else "stale"

    assert outage.settle_resolved(store, second, "succeeded", cut_then_landed) == "succeeded"
    assert calls.count("try") == 2
    settled = [store.get(j.id) for j in (first, second)]
    assert [j.state for j in settled if j is not None] == [JobState.SUCCEEDED] * 2


class ClaimCutOff(DispatchRecords):
    """A claim that lands, then loses its connection before the commit's answer comes back."""

    def claim_pointer(self, *, job_id: UUID, project_id: str, seq: int, owner: str) -> Job | None:
        super().claim_pointer(job_id=job_id, project_id=project_id, seq=seq, owner=owner)
        raise CommitUnknown("the connection broke while the claim's commit was in flight")


class DownForAWhile(PostgresJobRepository):
    """The reads that resolve a cut-off commit find PostgreSQL down ``outage`` times first."""

    def __init__(self, *, outage: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.outage = outage

    def get(self, job_id: UUID) -> Job | None:
        if self.outage > 0:
            self.outage -= 1
            raise DatabaseUnavailable("PostgreSQL did not answer after 3 attempts (read a job)")
        return super().get(job_id)


@pytest.mark.parametrize("outage_reads", [0, 3])
def test_a_claim_cut_off_while_postgresql_is_down_is_resolved_when_it_answers(
    vibey_pool: Pool, monkeypatch: pytest.MonkeyPatch, outage_reads: int
) -> None:
    """The claim landed, and the read that says so fails for a while: the step waits for the
    read and runs, instead of sending its pointer away from a lease nobody would use until it
    expired (two minutes, the stall seen when a database stopped mid-run)."""
    monkeypatch.setattr(outage, "SETTLE_PAUSE_S", 0.01)
    jobs = DownForAWhile(outage=outage_reads, pool=vibey_pool, dispatch=True, relay_id="r")
    job = jobs.enqueue(EnqueueRequest(project_id=P, kind="design.interview")).job
    ran: list[UUID] = []

    def handler(claimed: Job) -> Success:
        ran.append(claimed.id)
        return Success()

    runner = StepRunner(
        jobs=jobs,
        records=ClaimCutOff(pool=vibey_pool, relay_id="r"),
        broker=None,
        names=QueueNames("t"),
        tiers=TIERS,
        handlers={"design.interview": handler},
        owner="w",
    )
    try:
        result = runner.run(
            job_id=str(job.id),
            project_id=P,
            seq=job.dispatch_seq,
            kind="design.interview",
            routing_key=f"shared.interactive.{P}",
        )
    finally:
        runner.close()
    assert jobs.outage == 0
    assert result is StepResult.SUCCEEDED, result
    assert ran == [job.id]
    row = jobs.get(job.id)
    assert row is not None and row.state is JobState.SUCCEEDED


def test_a_settle_cut_off_while_postgresql_is_down_is_read_again_not_given_up(
    vibey_pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outage, "SETTLE_PAUSE_S", 0.01)
    jobs = DownForAWhile(outage=3, pool=vibey_pool)
    jobs.enqueue(EnqueueRequest(project_id=P, kind="design.interview"))
    (claimed,) = jobs.claim(P, owner="w", limit=1)
    calls: list[str] = []

    def landed_then_cut() -> str:
        calls.append("landed")
        assert jobs.ack(claimed.lease).applied
        raise CommitUnknown("cut off")

    assert outage.settle_resolved(jobs, claimed, "succeeded", landed_then_cut) == "succeeded"
    assert calls == ["landed"] and jobs.outage == 0


def test_past_its_patience_the_read_of_a_cut_off_claim_gives_up(
    vibey_pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(outage, "SETTLE_PATIENCE", timedelta(seconds=0.05))
    monkeypatch.setattr(outage, "SETTLE_PAUSE_S", 0.01)
    jobs = DownForAWhile(outage=10_000, pool=vibey_pool)
    with pytest.raises(DatabaseUnavailable):
        outage.adopt_claim(jobs, job_id=uuid.uuid4(), seq=1, owner="w")
    assert 0 < 10_000 - jobs.outage < 100


def test_a_commit_cut_off_while_postgresql_is_down_hands_its_pointers_on(
    vibey_pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Whether the commit landed cannot be read: its pointers go to the relay anyway (a claim
    drops one that did not land), not to a reclaim half a minute or more later."""

    def down(_pool: Pool, _ids: list[int], _keys: list[str]) -> list[dict[str, Any]]:
        raise DatabaseUnavailable("PostgreSQL did not answer after 5 attempts")

    monkeypatch.setattr(unit_of_work, "unsent_rows", down)
    published: list[OutboxRow] = []
    units = unit_of_work.Units(pool=vibey_pool, publish=published.extend)
    job_id = uuid.uuid4()
    pointer = {
        "id": 1,
        "key": "k",
        "job_id": str(job_id),
        "project_id": P,
        "dispatch_seq": 1,
        "kind": "design.interview",
        "not_before": datetime.now(UTC).isoformat(),
        "solo": False,
    }
    with pytest.raises(CommitUnknown), units.begin() as unit:
        unit.wrote_json([pointer])
        raise CommitUnknown("the connection broke while the commit was in flight")
    assert [p.job_id for p in published] == [job_id]


def test_a_start_whose_commit_landed_but_whose_answer_was_lost_hands_its_first_pointer_on(
    vibey_pool: Pool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A start's first jobs' outbox rows come back only with its COMMIT's answer
    (``read_after_commit``). When that answer is lost with the connection but the commit
    landed, the rows are read by their keys and go to the relay now: they were written
    claimed by this relay, so a drain would take them only after ``reclaim_after``."""
    real = pipelined_transaction

    @contextmanager
    def landed_then_cut(pool: Pool) -> Iterator[Any]:
        with real(pool) as conn:
            yield conn
        raise CommitUnknown("the connection broke while the commit was in flight")

    def lost(_unit: unit_of_work.UnitOfWork) -> None:
        raise psycopg.OperationalError("the connection is lost")

    monkeypatch.setattr(unit_of_work, "pipelined_transaction", landed_then_cut)
    monkeypatch.setattr(unit_of_work.UnitOfWork, "read_unread", lost)
    published: list[OutboxRow] = []
    jobs = PostgresJobRepository(
        pool=vibey_pool, dispatch=True, relay_id="r", after_commit=published.extend
    )
    store = WorkflowStore(pool=vibey_pool, jobs=jobs, registry=Registry(THREE_STEPS))
    with pytest.raises(CommitUnknown):
        store.start(P, definition="three-steps")
    with statement(vibey_pool) as conn:
        rows = conn.execute(
            "SELECT o.key, o.claimed_by FROM job_outbox o JOIN job j ON j.id = o.job_id"
            " WHERE j.project_id = %s AND o.sent_at IS NULL",
            (P,),
        ).fetchall()
    assert rows and all(by == "r" for _, by in rows)  # it landed, held by this relay
    assert sorted(p.key for p in published) == sorted(key for key, _ in rows)


def test_a_step_whose_database_does_not_answer_waits_in_a_tier(dead_pool: Pool, amqp: Amqp) -> None:
    config = WorkerConfig(
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
        queue=QueueSettings(rabbitmq=RabbitMqSettings(wait_tiers_seconds=TIERS.seconds)),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))
    broker = VibeyBroker(
        url=amqp.url, dead_exchange=amqp.names.dead_exchange, declare=lambda _: None
    )
    runner = StepRunner(
        jobs=PostgresJobRepository(pool=dead_pool, dispatch=True, relay_id="r"),
        records=DispatchRecords(pool=dead_pool, relay_id="r"),
        broker=broker,
        names=amqp.names,
        tiers=TIERS,
        handlers={},
        owner="w",
    )
    job_id = uuid.uuid4()
    try:
        result = runner.run(
            job_id=str(job_id),
            project_id=P,
            seq=7,
            kind="design.interview",
            routing_key=f"shared.interactive.{P}",
        )
    finally:
        broker.close()
    assert result is StepResult.WAITED
    channel = amqp.channel(connection)
    method, _properties, body = channel.basic_get(
        amqp.names.tier_queue(tier_name(TIERS.smallest)), auto_ack=True
    )
    assert method is not None, "the pointer was dropped"
    envelope = decode(body)
    assert (envelope.job_id, envelope.dispatch_seq) == (job_id, 7)
    connection.close()


def test_a_re_delay_whose_broker_connection_died_reconnects_and_loses_nothing(
    dead_pool: Pool, amqp: Amqp
) -> None:
    """A thread that waited on PostgreSQL past the broker's heartbeat timeout finds its
    connection gone: the re-delay opens a new one instead of dropping the pointer."""
    config = WorkerConfig(
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
        queue=QueueSettings(rabbitmq=RabbitMqSettings(wait_tiers_seconds=TIERS.seconds)),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))
    broker = VibeyBroker(
        url=amqp.url, dead_exchange=amqp.names.dead_exchange, declare=lambda _: None
    )
    broker.channel.connection.close()  # what the broker's heartbeat timeout does to it
    job_id = uuid.uuid4()
    try:
        outage.wait_out(
            broker,
            amqp.names,
            TIERS,
            job_id=job_id,
            project_id=P,
            seq=3,
            kind="design.interview",
            routing_key=f"shared.interactive.{P}",
        )
    finally:
        broker.close()
    channel = amqp.channel(connection)
    method, _properties, body = channel.basic_get(
        amqp.names.tier_queue(tier_name(TIERS.smallest)), auto_ack=True
    )
    assert method is not None, "the pointer was dropped"
    assert decode(body).job_id == job_id
    connection.close()
