"""engine_health on real PostgreSQL: the CHECK credits_never_have_a_deadline refuses a reset
time on spent credits (INSERT and UPDATE, whoever writes them), and the store persists every
capacity state, circuit change, doctor pass and rotation weight through the pure rules."""

from __future__ import annotations

import threading
from collections import Counter
from datetime import UTC, datetime, timedelta

import psycopg
import pytest
from psycopg import errors as pg_errors
from psycopg_pool import ConnectionPool

from store.engine_health import EngineHealthRejected, EngineHealthStore, EngineNotFound
from store.events import EventLog
from workflows.capacity import (
    AuthenticationFailed,
    Available,
    BackoffProbe,
    CreditsExhausted,
    DeadlineProbe,
    WindowExhausted,
)
from workflows.circuit import Circuit, CircuitStatus, Success
from workflows.job import FailureClass
from workflows.phases import Phase
from workflows.rotation import Boundary, RotationPolicy, Trigger

NOW = datetime(2026, 9, 15, 12, 0, tzinfo=UTC)
BUILD = Boundary(Trigger.NEW_WORK_ITEM, Phase.BUILD)
POLICY = RotationPolicy()


@pytest.fixture
def store(pool: ConnectionPool) -> EngineHealthStore:
    return EngineHealthStore(pool=pool)


def ready(
    store: EngineHealthStore,
    engine_id: str,
    weight: int = 1,
    *,
    local: bool = False,
    capabilities: tuple[str, ...] = (),
) -> None:
    """An installed engine whose doctor passed five minutes ago."""
    store.register(engine_id, installed=True, weight=weight, local=local, capabilities=capabilities)
    store.record_doctor(engine_id, passed=True, at=NOW - timedelta(minutes=5))


# -- the database's own layer --------------------------------------------------------------


def refused_constraint(pg_url: str, statement: str) -> str | None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        try:
            conn.execute(statement)
        except pg_errors.CheckViolation as exc:
            return exc.diag.constraint_name
    return None


def test_the_database_refuses_an_insert_of_credits_with_a_reset_time(pg_url: str) -> None:
    constraint = refused_constraint(
        pg_url,
        "INSERT INTO engine_health (engine_id, capacity_state, resets_at) "
        "VALUES ('claude', 'CreditsExhausted', now() + interval '1 hour')",
    )
    assert constraint == "credits_never_have_a_deadline"
    with psycopg.connect(pg_url) as conn:
        assert conn.execute("SELECT count(*) FROM engine_health").fetchone() == (0,)


def test_the_database_refuses_an_update_giving_credits_a_reset_time(pg_url: str) -> None:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO engine_health (engine_id, capacity_state) "
            "VALUES ('claude', 'CreditsExhausted')"
        )
    assert (
        refused_constraint(
            pg_url, "UPDATE engine_health SET resets_at = now() WHERE engine_id = 'claude'"
        )
        == "credits_never_have_a_deadline"
    )
    # Also when a window turns into credits but keeps its reset time.
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO engine_health (engine_id, capacity_state, resets_at) "
            "VALUES ('codex', 'WindowExhausted', now())"
        )
    assert (
        refused_constraint(
            pg_url,
            "UPDATE engine_health SET capacity_state = 'CreditsExhausted' "
            "WHERE engine_id = 'codex'",
        )
        == "credits_never_have_a_deadline"
    )
    with psycopg.connect(pg_url) as conn:
        rows = conn.execute(
            "SELECT engine_id, capacity_state, resets_at IS NULL FROM engine_health ORDER BY 1"
        ).fetchall()
    assert rows == [("claude", "CreditsExhausted", True), ("codex", "WindowExhausted", False)]


@pytest.mark.parametrize(
    ("statement", "constraint"),
    [
        (
            "INSERT INTO engine_health (engine_id, capacity_state, resets_at) "
            "VALUES ('e', 'AuthenticationFailed', now())",
            "resets_at_only_for_windows",
        ),
        (
            "INSERT INTO engine_health (engine_id, capacity_state) VALUES ('e', 'WindowExhausted')",
            "resets_at_only_for_windows",
        ),
        (
            "INSERT INTO engine_health (engine_id, capacity_state) VALUES ('e', 'Exhausted')",
            "engine_health_capacity_state",
        ),
        (
            "INSERT INTO engine_health (engine_id, capacity_state, circuit_state, opened_at, "
            "probe_kind, probe_at) VALUES ('e', 'CreditsExhausted', 'open', now(), 'deadline', "
            "now())",
            "deadline_probes_only_for_windows",
        ),
        (
            "INSERT INTO engine_health (engine_id, circuit_state) VALUES ('e', 'open')",
            "engine_health_open_circuit",
        ),
        ("INSERT INTO engine_health (engine_id, weight) VALUES ('e', -1)", "engine_health_counts"),
        (
            "INSERT INTO engine_health (engine_id, authenticated_at) VALUES ('e', now())",
            "engine_health_authenticated_by_last_doctor",
        ),
    ],
)
def test_the_other_checks(pg_url: str, statement: str, constraint: str) -> None:
    assert refused_constraint(pg_url, statement) == constraint


def test_the_store_translates_a_refused_row(store: EngineHealthStore) -> None:
    with pytest.raises(EngineHealthRejected, match="engine_health_counts") as caught:
        store.register("claude", installed=True, weight=-1)
    assert caught.value.constraint == "engine_health_counts"
    with pytest.raises(EngineNotFound):
        store.get("claude")


# -- capacity and circuits through the store -----------------------------------------------


def test_every_capacity_state_round_trips(store: EngineHealthStore, pg_url: str) -> None:
    store.register("claude", installed=True)
    states = [
        WindowExhausted(NOW + timedelta(hours=2), "429"),
        CreditsExhausted("credit balance is too low"),
        AuthenticationFailed("401"),
    ]
    for state in states:
        circuit = store.record_capacity("claude", state, NOW)  # type: ignore[arg-type]
        assert store.get("claude").circuit == circuit
        assert circuit.capacity == state and circuit.is_open
    with psycopg.connect(pg_url) as conn:
        assert conn.execute(
            "SELECT capacity_state, resets_at, probe_kind FROM engine_health"
        ).fetchone() == ("AuthenticationFailed", None, "backoff")


def test_credits_after_a_window_drop_the_reset_time_and_the_deadline(
    store: EngineHealthStore,
) -> None:
    store.register("claude", installed=True)
    window = store.record_capacity("claude", WindowExhausted(NOW + timedelta(hours=1)), NOW)
    assert window.probe == DeadlineProbe(NOW + timedelta(hours=1))
    credits = store.record_capacity("claude", CreditsExhausted(), NOW + timedelta(minutes=1))
    assert isinstance(credits.probe, BackoffProbe)
    stored = store.get("claude").circuit
    assert stored.capacity == CreditsExhausted() and stored == credits


def test_engine_failures_open_after_three_and_work_failures_never(
    store: EngineHealthStore, pool: ConnectionPool
) -> None:
    store.register("claude", installed=True)
    for _ in range(10):
        store.record_outcome("claude", FailureClass.WORK, NOW)
        store.record_outcome("claude", FailureClass.VIBEY, NOW)
    assert store.get("claude").circuit == Circuit("claude")
    statuses = [store.record_outcome("claude", FailureClass.ENGINE, NOW).status for _ in range(3)]
    assert statuses == [CircuitStatus.CLOSED, CircuitStatus.CLOSED, CircuitStatus.OPEN]
    opened = store.get("claude").circuit
    assert opened.capacity == Available() and opened.opened_at == NOW
    store.record_outcome("claude", FailureClass.ENGINE, NOW)  # open already: no second event
    changes = EventLog(pool=pool).recent(event_type="engine.circuit_changed")
    assert [(e.payload["engine_id"], e.payload["from"], e.payload["to"]) for _, e in changes] == [
        ("claude", "closed", "open")
    ]
    assert changes[0][1].routing_key == "default._.engine.circuit_changed"


def test_an_engine_heard_of_before_it_was_registered_is_never_eligible(
    store: EngineHealthStore,
) -> None:
    store.record_outcome("ghost", Success(), NOW)
    ghost = store.get("ghost")
    assert not ghost.installed and ghost.authenticated_at is None
    assert store.select(BUILD, POLICY, NOW).engine_id is None


def test_a_failed_doctor_deauthenticates_and_a_pass_reauthenticates(
    store: EngineHealthStore,
) -> None:
    ready(store, "claude")
    assert store.select(BUILD, POLICY, NOW).engine_id == "claude"
    store.record_doctor("claude", passed=False, at=NOW)
    health = store.get("claude")
    assert (health.last_doctor_at, health.authenticated_at) == (NOW, None)
    assert store.select(BUILD, POLICY, NOW).engine_id is None
    store.record_capacity("claude", AuthenticationFailed("401"), NOW)
    later = NOW + timedelta(seconds=30)
    store.record_doctor("claude", passed=True, at=later)
    # The pass makes the probe due now: the next selection is the probe, half-opening it.
    assert store.select(BUILD, POLICY, later).engine_id == "claude"
    assert store.get("claude").circuit.status is CircuitStatus.HALF_OPEN
    store.record_outcome("claude", Success(), later)
    assert store.get("claude").circuit == Circuit("claude")


# -- rotation through the store ------------------------------------------------------------


def test_selection_rotates_by_weight_and_skips_open_circuits(store: EngineHealthStore) -> None:
    ready(store, "claude", weight=3)
    ready(store, "codex", weight=1)
    chosen = [store.select(BUILD, POLICY, NOW).engine_id for _ in range(8)]
    assert Counter(chosen) == {"claude": 6, "codex": 2}
    store.record_capacity("claude", CreditsExhausted(), NOW)
    assert {store.select(BUILD, POLICY, NOW).engine_id for _ in range(3)} == {"codex"}
    forced = Boundary(Trigger.CAPACITY_REJECTION, Phase.BUILD, rejected_by="codex")
    assert store.select(forced, POLICY, NOW).engine_id is None


def test_a_due_credits_probe_half_opens_the_chosen_engine(store: EngineHealthStore) -> None:
    ready(store, "claude")
    circuit = store.record_capacity("claude", CreditsExhausted(), NOW)
    assert circuit.probe is not None
    assert store.select(BUILD, POLICY, NOW).engine_id is None
    due = circuit.probe.at
    assert store.select(BUILD, POLICY, due).engine_id == "claude"
    assert store.get("claude").circuit.status is CircuitStatus.HALF_OPEN
    reopened = store.record_capacity("claude", CreditsExhausted(), due)
    assert reopened.probes == 1 and isinstance(reopened.probe, BackoffProbe)


def test_concurrent_selections_keep_the_weights_exact(store: EngineHealthStore) -> None:
    ready(store, "claude", weight=2)
    ready(store, "codex", weight=1)
    ready(store, "gemini", weight=1)
    chosen: list[str | None] = []
    lock = threading.Lock()

    def select_many() -> None:
        for _ in range(10):
            engine = store.select(BUILD, POLICY, NOW).engine_id
            with lock:
                chosen.append(engine)

    threads = [threading.Thread(target=select_many) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    # 40 selections over a period of 4: exactly 10 periods, whatever the interleaving.
    assert Counter(chosen) == {"claude": 20, "codex": 10, "gemini": 10}
    weights = {h.engine_id: h.rotation_weight for h in store.all()}
    assert weights == {"claude": 0, "codex": 0, "gemini": 0}


def test_candidates_reflect_the_rows(store: EngineHealthStore) -> None:
    ready(store, "qwenloop", local=True, capabilities=("git", "local"))
    store.register("claude", installed=False)
    by_id = {c.engine_id: c for c in store.candidates(NOW)}
    assert by_id["qwenloop"].local and by_id["qwenloop"].capabilities == {"git", "local"}
    assert not by_id["claude"].installed and by_id["claude"].authenticated_at is None
    assert store.select(BUILD, POLICY, NOW).engine_id is None  # local, switched off
    on = RotationPolicy(local_on=frozenset({"qwenloop"}))
    assert store.select(BUILD, on, NOW).engine_id == "qwenloop"


def test_an_engine_limited_again_and_again_backs_off_and_the_steps_go_to_the_healthy_one(
    store: EngineHealthStore,
) -> None:
    """Two engines, claude (weight 3) rate-limited with a 4 s reset every time it runs: every
    step goes to codex except claude's probes, one per back-off (4 s, then 30 s, then 60 s:
    never sooner, however short the reset it names), and none joins a probe in flight; a
    success starts the back-off over."""
    ready(store, "claude", weight=3)
    ready(store, "codex", weight=1)
    second = timedelta(seconds=1)

    def limited(at: datetime) -> datetime:
        circuit = store.record_capacity("claude", WindowExhausted(at + 4 * second), at)
        assert circuit.is_open and circuit.probe is not None
        return circuit.probe.at

    def steps(start: datetime, end: datetime) -> list[str | None]:
        """A step a second from ``start`` to ``end`` (excluded)."""
        count = int((end - start) / second)
        return [store.select(BUILD, POLICY, start + n * second).engine_id for n in range(count)]

    assert store.select(BUILD, POLICY, NOW).engine_id == "claude"
    due = limited(NOW)
    assert due == NOW + 4 * second  # the first window: the CLI's own reset
    assert set(steps(NOW, due)) == {"codex"}
    for wait in (30, 60):
        assert store.select(BUILD, POLICY, due).engine_id == "claude"  # its probe
        assert store.get("claude").circuit.status is CircuitStatus.HALF_OPEN
        # the probe runs for 3 s: no other step joins it
        assert steps(due + second, due + 3 * second) == ["codex", "codex"]
        at = due + 3 * second
        due = limited(at)
        assert due == at + wait * second
        assert set(steps(at, due)) == {"codex"}  # not re-picked before its back-off passed
    assert store.select(BUILD, POLICY, due).engine_id == "claude"
    store.record_outcome("claude", Success(), due)  # the probe that succeeds closes it
    assert store.get("claude").circuit == Circuit("claude")
    assert limited(due) == due + 4 * second  # and the back-off starts over
