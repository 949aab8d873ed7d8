"""`vibey doctor --probe` (the pods' readiness probe) and `vibey reconcile` on both backends."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import psycopg

from tests.acceptance.test_cli import clean_env, vibey
from tests.amqp_fixtures import Amqp


def test_the_probe_prints_nothing_and_says_healthy_by_its_exit_code(
    tmp_path: Path, pg_url: str, empty_pg_url: str
) -> None:
    healthy = vibey(
        "doctor",
        "--probe",
        cwd=tmp_path,
        env=clean_env(VIBEY_PG_URL=pg_url, VIBEY_QUEUE_BACKEND="postgres"),
    )
    assert (healthy.code, healthy.stdout) == (0, "")
    pending = vibey(
        "doctor",
        "--probe",
        cwd=tmp_path,
        env=clean_env(VIBEY_PG_URL=empty_pg_url, VIBEY_QUEUE_BACKEND="postgres"),
    )
    assert (pending.code, pending.stdout) == (1, "")
    no_broker = vibey("doctor", "--probe", cwd=tmp_path, env=clean_env(VIBEY_PG_URL=pg_url))
    assert no_broker.code == 1  # the rabbitmq backend without an AMQP URL


def _expired_lease(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO job (id, project_id, cycle, kind, subject, idempotency_key, state, "
            "attempts, max_attempts, lease_ms, lease_owner, lease_token, lease_expires_at) "
            "VALUES (gen_random_uuid(), 'p', 0, 'design.spec', '', 'k', 'leased', 1, 5, 1000, "
            "'gone', gen_random_uuid(), now() - %s)",
            (timedelta(minutes=1),),
        )


def _states(pg_url: str) -> list[tuple[str, int]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute("SELECT state::text, dispatch_seq FROM job").fetchall()
    return [(state, seq) for state, seq in rows]


def test_reconcile_once_reaps_an_expired_lease_on_the_postgres_backend(
    tmp_path: Path, pg_url: str
) -> None:
    _expired_lease(pg_url)
    env = clean_env(VIBEY_PG_URL=pg_url, VIBEY_QUEUE_BACKEND="postgres")
    run = vibey("reconcile", "--once", cwd=tmp_path, env=env)
    assert run.code == 0, run.stderr
    assert "requeued=1" in run.stdout
    assert _states(pg_url) == [("ready", 0)]


def test_reconcile_once_redispatches_on_the_rabbitmq_backend(
    tmp_path: Path, pg_url: str, amqp: Amqp
) -> None:
    _expired_lease(pg_url)
    env = clean_env(VIBEY_PG_URL=pg_url, VIBEY_AMQP_URL=amqp.url, VIBEY_BUS_PREFIX=amqp.prefix)
    run = vibey("reconcile", "--once", cwd=tmp_path, env=env)
    assert run.code == 0, run.stderr
    assert "requeued=1" in run.stdout
    assert _states(pg_url) == [("ready", 1)]  # a new dispatch generation, with its pointer
