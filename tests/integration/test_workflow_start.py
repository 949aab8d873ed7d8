"""A workflow's start on real PostgreSQL: one round trip and one commit, and what it keeps.

A start sends the workflow's insert, what its first event writes (history, jobs, outbox rows,
domain events) and the COMMIT together, and reads their results after the commit. The round
trips are counted on the wire: a proxy between the pool and PostgreSQL counts the messages
after which the client waits for the server (``Sync``, ``Flush``, a simple ``Query``)."""

from __future__ import annotations

import itertools
import socket
import struct
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest
from psycopg_pool import ConnectionPool

from store.jobs import PostgresJobRepository
from store.pool import open_pool
from store.workflows import WorkflowStore
from tests.tiny_definition import Tiny, TinyState
from workflows.engine import Decision, Definition, Event, Registry, Started, Status
from workflows.steps import Success

WAITS = {b"S", b"H", b"Q"}  # Sync, Flush, Query: the client reads what the server answers
SSL_OR_GSS = {80877103, 80877104}


class Wire:
    """A TCP proxy to PostgreSQL that counts, per message type, what clients send."""

    def __init__(self, host: str, port: int) -> None:
        self._target = (host, port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = self._server.getsockname()[1]
        self._lock = threading.Lock()
        self.sent: dict[bytes, int] = {}
        self.seq: list[bytes] = []
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def waits(self) -> int:
        """Syncs, queries and flushes sent: the times the client waited for the server (a
        flush right after a sync waits with it: psycopg's closing of a pipeline)."""
        with self._lock:
            kinds = self.seq
            after_sync = sum(1 for a, b in itertools.pairwise(kinds) if (a, b) == (b"S", b"H"))
            return sum(1 for kind in kinds if kind in WAITS) - after_sync

    def count(self, kind: bytes) -> int:
        with self._lock:
            return self.sent.get(kind, 0)

    def reset(self) -> None:
        with self._lock:
            self.sent = {}
            self.seq = []

    def close(self) -> None:
        self._server.close()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self._target)
            threading.Thread(target=self._up, args=(client, upstream), daemon=True).start()
            threading.Thread(target=_down, args=(upstream, client), daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket) -> None:
        pending, starting = b"", True
        while data := _recv(client):
            pending += data
            while True:
                if starting:  # untyped: SSL/GSS requests, then the startup message
                    if len(pending) < 8 or len(pending) < struct.unpack("!I", pending[:4])[0]:
                        break
                    size, code = struct.unpack("!II", pending[:8])
                    pending, starting = pending[size:], code in SSL_OR_GSS
                    continue
                if len(pending) < 5 or len(pending) < 1 + struct.unpack("!I", pending[1:5])[0]:
                    break
                kind, size = pending[:1], struct.unpack("!I", pending[1:5])[0]
                with self._lock:
                    self.sent[kind] = self.sent.get(kind, 0) + 1
                    self.seq.append(kind)
                pending = pending[1 + size :]
            upstream.sendall(data)
        upstream.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


def _down(upstream: socket.socket, client: socket.socket) -> None:
    while data := _recv(upstream):
        client.sendall(data)
    client.close()


@pytest.fixture
def wire(pg_url: str) -> Iterator[Wire]:
    parts = urlsplit(pg_url)
    proxy = Wire(parts.hostname or "127.0.0.1", parts.port or 5432)
    yield proxy
    proxy.close()


@pytest.fixture
def counted(pg_url: str, wire: Wire) -> Iterator[ConnectionPool]:
    """A pool like every process's (``store.pool.open_pool``) whose traffic ``wire`` sees."""
    parts = urlsplit(pg_url)
    netloc = parts.netloc.rsplit("@", 1)[0] + f"@127.0.0.1:{wire.port}"
    url = urlunsplit(parts._replace(netloc=netloc, query="sslmode=disable"))
    pool = open_pool(url, min_size=1, max_size=1)
    yield pool
    pool.close()


def store_on(pool: ConnectionPool, *definitions: Definition[Any]) -> WorkflowStore:
    jobs = PostgresJobRepository(pool=pool, dispatch=True)
    return WorkflowStore(pool=pool, jobs=jobs, registry=Registry(definitions or [Tiny()]))


class RaisesAtStart(Tiny):
    """Tiny, but its first decision raises: the start blocks the workflow."""

    name = "raises-at-start"

    def decide(self, state: TinyState, event: Event, now: datetime) -> Decision[TinyState]:
        if isinstance(event, Started):
            raise RuntimeError("no first step")
        return super().decide(state, event, now)


def test_a_start_is_one_round_trip_and_one_commit(counted: ConnectionPool, wire: Wire) -> None:
    store = store_on(counted)
    store.start("warm", definition="tiny")  # the pool's connection is open
    wire.reset()
    started = store.start("p1", definition="tiny")
    assert started.created and started.workflow.last_seq == 1
    assert (wire.waits, wire.count(b"S")) == (1, 1)
    wire.reset()
    batch = store.start_many([(f"b{n}", {"n": n}) for n in range(25)], definition="tiny")
    assert [o.created for o in batch] == [True] * 25
    assert (wire.waits, wire.count(b"S")) == (1, 1)  # one for the whole batch


def test_a_start_that_finds_the_live_workflow_changes_nothing_and_leaves_the_pool_idle(
    counted: ConnectionPool, wire: Wire
) -> None:
    store = store_on(counted)
    first = store.start("p1", definition="tiny")
    wire.reset()
    again = store.start("p1", definition="tiny", input={"other": True})
    assert not again.created and again.workflow.id == first.workflow.id
    assert again.workflow.input == {} and wire.waits <= 4  # as many as before one-trip starts
    with counted.connection() as conn:  # its aborted transaction was rolled back
        assert conn.info.transaction_status.name == "IDLE"
        rows = conn.execute("SELECT count(*) FROM workflow_history").fetchone()
    assert rows == (1,)


def test_the_read_back_of_a_start_is_the_row_it_committed(pool: ConnectionPool) -> None:
    store = store_on(pool)
    started = store.start("p1", definition="tiny", input={"k": [1, 2]}).workflow
    assert store.get(started.id) == started  # stamps, header, state, seqs: as stored


def test_a_first_decision_with_waiting_steps_releases_them_in_order(pool: ConnectionPool) -> None:
    jobs = PostgresJobRepository(pool=pool)
    store = WorkflowStore(pool=pool, jobs=jobs, registry=Registry([Tiny(chain=True)]))
    store.start("chain", definition="tiny")
    for step in ("a", "b", "c"):
        [job] = jobs.claim("chain", owner="t", limit=5)  # only the step whose turn it is
        assert job.step == step
        assert store.settle(job, Success({})).applied


def test_a_first_decision_that_raises_blocks_the_workflow_once(pool: ConnectionPool) -> None:
    store = store_on(pool, RaisesAtStart())
    first = store.start("p1", definition="raises-at-start")
    assert first.created and first.workflow.status is Status.BLOCKED
    assert "no first step" in (first.workflow.reason or "")
    [gate] = [g for g, _ in store.inbox("p1")]
    assert gate.kind == "workflow_error"
    again = store.start_many([("p1", {}), ("p2", {})], definition="raises-at-start")
    assert [o.created for o in again] == [False, True]
    assert again[0].workflow.id == first.workflow.id
    assert again[1].workflow.status is Status.BLOCKED


def test_start_many_gives_a_project_named_twice_the_workflow_its_first_start_made(
    pool: ConnectionPool,
) -> None:
    store = store_on(pool)
    live = store.start("live", definition="tiny").workflow
    batch = [("x", {"n": 1}), ("live", {}), ("x", {"n": 2})]
    outcomes = store.start_many(batch, definition="tiny")
    assert [o.created for o in outcomes] == [True, False, False]
    assert outcomes[1].workflow.id == live.id
    assert outcomes[2].workflow.id == outcomes[0].workflow.id
    assert store.history(outcomes[0].workflow.id)[0].event == {
        "type": "started",
        "input": {"n": 1},
    }
