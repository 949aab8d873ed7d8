"""Dead letters are kept (never only logged), sent outbox rows are pruned in batches, and
`vibey queue stats` / `vibey queue dead` report them, against the real services."""

from __future__ import annotations

import json
from datetime import timedelta
from pathlib import Path

import pika
import psycopg

from actors.capabilities import detect
from actors.config import BusSettings, DatabaseSettings
from actors.reconcile import Reconciler
from actors.relay import Relay, Router
from actors.topology import DETAIL_HEADER, REASON_HEADER
from actors.worker import WorkerConfig
from store.dispatch import DispatchRecords
from store.jobs import PostgresJobRepository
from store.operations import OperationsStore
from tests.acceptance.test_cli import clean_env, vibey
from tests.amqp_fixtures import Amqp
from workflows.dispatch import DEFAULT_WAIT_TIERS
from workflows.queue import EnqueueRequest


def _declared(pg_url: str, amqp: Amqp) -> WorkerConfig:
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))
    connection.close()
    return config


def _dead_letter(amqp: Amqp, body: bytes, headers: dict | None = None) -> None:
    connection = amqp.connect()
    try:
        properties = pika.BasicProperties(delivery_mode=2, headers=headers, message_id="m-1")
        amqp.channel(connection).basic_publish(
            amqp.names.dead_exchange, "shared.interactive.p", body, properties
        )
    finally:
        connection.close()


def test_malformed_dead_letters_are_kept_with_their_reason_and_listed(
    pool, pg_url: str, amqp: Amqp, tmp_path: Path
) -> None:
    _declared(pg_url, amqp)
    _dead_letter(amqp, b'{"schema": "nope"}', {REASON_HEADER: "unknown_schema", DETAIL_HEADER: "d"})
    _dead_letter(amqp, b"\xff not even utf-8")
    records = DispatchRecords(pool=pool, relay_id="r")
    relay = Relay(
        url=amqp.url, records=records, router=Router(names=amqp.names, tiers=DEFAULT_WAIT_TIERS)
    )
    ops = OperationsStore(pool)
    reconciler = Reconciler(
        jobs=PostgresJobRepository(pool=pool, dispatch=True),
        records=records,
        relay=relay,
        url=amqp.url,
        names=amqp.names,
        operations=ops,
    )
    try:
        assert reconciler.drain_dead_letters() == 0  # nothing to park: they name no job
    finally:
        reconciler.stop()
    kept = ops.dead_letters()
    assert [(k.reason, k.detail, k.body) for k in kept] == [
        ("unknown_schema", "d", b'{"schema": "nope"}'),
        ("not_utf8", kept[1].detail, b"\xff not even utf-8"),
    ]
    assert kept[0].queue == amqp.names.dead_queue and kept[0].message_id == "m-1"
    assert kept[0].headers[REASON_HEADER] == "unknown_schema"
    env = clean_env(VIBEY_PG_URL=pg_url, VIBEY_AMQP_URL=amqp.url, VIBEY_BUS_PREFIX=amqp.prefix)
    listed = json.loads(vibey("queue", "dead", "--json", cwd=tmp_path, env=env).stdout)
    assert [d["reason"] for d in listed["dead_letters"]] == ["unknown_schema", "not_utf8"]
    after = vibey("queue", "dead", "--after", str(kept[0].id), cwd=tmp_path, env=env).stdout
    assert "not_utf8" in after and "unknown_schema" not in after
    stats = json.loads(vibey("queue", "stats", "--json", cwd=tmp_path, env=env).stdout)
    assert (stats["dead_queue"], stats["dead_kept"]) == (0, 2)


def test_sent_outbox_rows_past_their_retention_are_pruned_in_batches(pool, pg_url: str) -> None:
    repo = PostgresJobRepository(pool=pool, dispatch=True)
    for n in range(7):
        repo.enqueue(EnqueueRequest(project_id="p", kind="design.spec", subject=str(n)))
    with psycopg.connect(pg_url, autocommit=True) as conn:
        ids = [r[0] for r in conn.execute("SELECT id FROM job_outbox ORDER BY id").fetchall()]
        conn.execute(
            "UPDATE job_outbox SET sent_at = now() - interval '2 days' WHERE id = ANY(%s)",
            (ids[:5],),
        )
        conn.execute("UPDATE job_outbox SET sent_at = now() WHERE id = %s", (ids[5],))
    ops = OperationsStore(pool)
    assert ops.prune_outbox(retention=timedelta(days=1), batch=2) == 5
    with psycopg.connect(pg_url, autocommit=True) as conn:
        left = [r[0] for r in conn.execute("SELECT id FROM job_outbox ORDER BY id").fetchall()]
    assert left == ids[5:]  # the recent sent row and the unsent one stay
    assert ops.prune_outbox(retention=timedelta(days=1)) == 0


def test_queue_stats_reports_depths_consumers_lag_and_the_oldest_ready_job(
    pool, pg_url: str, amqp: Amqp, tmp_path: Path
) -> None:
    config = _declared(pg_url, amqp)
    repo = PostgresJobRepository(pool=pool, dispatch=True)
    job = repo.enqueue(EnqueueRequest(project_id="p", kind="build.implement")).job
    env = clean_env(VIBEY_PG_URL=pg_url, VIBEY_AMQP_URL=amqp.url, VIBEY_BUS_PREFIX=amqp.prefix)
    stats = json.loads(vibey("queue", "stats", "--json", cwd=tmp_path, env=env).stdout)
    queues = {q["name"]: q for q in stats["queues"]}
    build = queues[config.names.work_queue("build")]
    assert (build["exists"], build["ready"], build["consumers"]) == (True, 0, 0)
    assert stats["outbox_unsent"] == 1 and stats["outbox_oldest_s"] >= 0
    assert stats["oldest_ready"]["id"] == str(job.id)
    assert stats["leased_by_lane"] == {"interactive": 0, "build": 0}
    text = vibey("queue", "stats", cwd=tmp_path, env=env).stdout
    assert f"{config.names.work_queue('build')}" in text and "1 unsent" in text
    postgres = clean_env(VIBEY_PG_URL=pg_url, VIBEY_QUEUE_BACKEND="postgres")
    rows = json.loads(vibey("queue", "stats", "--json", cwd=tmp_path, env=postgres).stdout)
    assert [(q["lane"], q["ready"]) for q in rows["queues"]] == [("interactive", 0), ("build", 1)]
