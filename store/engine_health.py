"""Engine health in PostgreSQL: what each engine is, its doctor passes, its capacity state and
circuit, and the rotation that picks among them.

Every capacity state and circuit change is persisted here, in ``engine_health``
(``migrations/0006_engine_health.sql``), through the pure rules of :mod:`workflows.circuit`:
a write locks the engine's row, applies the rule, and saves the result in one transaction.
The table's CHECK ``credits_never_have_a_deadline`` is the last layer that keeps a reset time
off spent credits; a row it refuses raises :class:`EngineHealthRejected` naming it.

:meth:`EngineHealthStore.select` runs :func:`workflows.rotation.rotate` over every engine's
row with the rows locked (in engine-id order), saves the round robin's weights, and moves the
chosen engine's circuit to half-open when its probe was due (the selection is the probe). An
engine rotation has never heard a doctor pass from is never eligible.

Each write comes as ``x(...)``, in a transaction of its own, and ``x_on(conn, ...)``, on the
caller's connection and in its transaction (none writes an outbox row: no unit of work).

Exceptions::

    StoreError
    ├── EngineNotFound         no row for that engine
    └── EngineHealthRejected   the database refused a row (``constraint`` names the CHECK)
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from psycopg import errors as pg_errors
from psycopg.rows import DictRow

from store.db import Conn, Pool, fetch_all, fetch_one, transaction
from store.errors import StoreError
from store.events import emit_on
from store.retry import retried
from store.sql import load
from workflows.capacity import (
    BackoffProbe,
    DeadlineProbe,
    Exhausted,
    detail_of,
    from_columns,
    resets_at_of,
)
from workflows.circuit import (
    CapacityRejected,
    Circuit,
    CircuitStatus,
    Outcome,
    half_open,
    reauthenticated,
    record,
)
from workflows.events import Draft, EventType
from workflows.rotation import (
    Boundary,
    Candidate,
    RotationPolicy,
    RotationState,
    Selection,
    rotate,
)

Q = load("engine_health.sql")

__all__ = [
    "EngineHealth",
    "EngineHealthRejected",
    "EngineHealthStore",
    "EngineNotFound",
    "RotationRequest",
]


@dataclass(frozen=True, slots=True)
class RotationRequest:
    """``vibey engine rotate <project>``: the project's next engine-driven attempt rotates
    away from ``away_from`` (the engine it last ran on; ``None``: none had run)."""

    project_id: str
    away_from: str | None
    requested_by: str
    requested_at: datetime


class EngineNotFound(StoreError):
    def __init__(self, engine_id: str) -> None:
        super().__init__(
            f"no engine_health row for engine {engine_id!r}; register it (or run "
            "`vibey doctor`) first"
        )
        self.engine_id = engine_id


class EngineHealthRejected(StoreError):
    def __init__(self, engine_id: str, constraint: str | None, detail: str) -> None:
        super().__init__(
            f"the database refused engine {engine_id!r}'s health row "
            f"(CHECK {constraint or 'unknown'}): {detail}"
        )
        self.engine_id = engine_id
        self.constraint = constraint


@dataclass(frozen=True, slots=True)
class EngineHealth:
    engine_id: str
    installed: bool
    local: bool
    weight: int
    capabilities: frozenset[str]
    last_doctor_at: datetime | None
    authenticated_at: datetime | None
    circuit: Circuit
    rotation_weight: int | None
    updated_at: datetime

    def candidate(self, now: datetime) -> Candidate:
        """The engine as rotation sees it at ``now``."""
        return Candidate(
            engine_id=self.engine_id,
            weight=self.weight,
            installed=self.installed,
            authenticated_at=self.authenticated_at,
            circuit_admits=self.circuit.admits(now),
            probing=self.circuit.probing(now),
            capabilities=self.capabilities,
            local=self.local,
        )


class EngineHealthStore:
    def __init__(self, *, pool: Pool) -> None:
        self._pool = pool

    # -- reads -----------------------------------------------------------------------------

    @retried("read an engine's health", idempotent=True)
    def get(self, engine_id: str) -> EngineHealth:
        with transaction(self._pool) as conn:
            row = fetch_one(conn, Q["get_one"], {"engine_id": engine_id})
        if row is None:
            raise EngineNotFound(engine_id)
        return health_from_row(row)

    @retried("read the engines' health", idempotent=True)
    def all(self) -> list[EngineHealth]:
        with transaction(self._pool) as conn:
            return [health_from_row(r) for r in fetch_all(conn, Q["get_all"], {})]

    def candidates(self, now: datetime) -> list[Candidate]:
        """Every engine as rotation sees it at ``now``, in engine-id order."""
        return [health.candidate(now) for health in self.all()]

    # -- descriptors and doctor ------------------------------------------------------------

    @retried("register an engine", idempotent=False)
    def register(
        self,
        engine_id: str,
        *,
        installed: bool,
        local: bool = False,
        weight: int = 1,
        capabilities: Collection[str] = (),
    ) -> EngineHealth:
        """Record what an engine is; its capacity, circuit and doctor passes are kept."""
        with transaction(self._pool) as conn:
            return self.register_on(
                conn,
                engine_id,
                installed=installed,
                local=local,
                weight=weight,
                capabilities=capabilities,
            )

    def register_on(
        self,
        conn: Conn,
        engine_id: str,
        *,
        installed: bool,
        local: bool = False,
        weight: int = 1,
        capabilities: Collection[str] = (),
    ) -> EngineHealth:
        params = {
            "engine_id": engine_id,
            "installed": installed,
            "local": local,
            "weight": weight,
            "capabilities": sorted(set(capabilities)),
        }
        with _checked(engine_id):
            row = fetch_one(conn, Q["register"], params)
        assert row is not None  # INSERT … ON CONFLICT DO UPDATE … RETURNING always returns it
        return health_from_row(row)

    @retried("record an engine's doctor run", idempotent=False)
    def record_doctor(self, engine_id: str, *, passed: bool, at: datetime) -> EngineHealth:
        """A doctor run at ``at``: a pass authenticates the engine (and makes a circuit held
        open by a failed login due for its probe); a failure de-authenticates it."""
        with transaction(self._pool) as conn:
            return self.record_doctor_on(conn, engine_id, passed=passed, at=at)

    def record_doctor_on(
        self, conn: Conn, engine_id: str, *, passed: bool, at: datetime
    ) -> EngineHealth:
        health = self._lock(conn, engine_id)
        params = {"engine_id": engine_id, "passed": passed, "at": at}
        with _checked(engine_id):
            conn.execute(Q["save_doctor"].encode(), params)
        circuit = reauthenticated(health.circuit, at) if passed else health.circuit
        return self._save(conn, circuit, before=health.circuit)

    # -- capacity and circuits -------------------------------------------------------------

    @retried("record an engine's outcome", idempotent=False)
    def record_outcome(self, engine_id: str, outcome: Outcome, now: datetime) -> Circuit:
        """One attempt's outcome on the engine's circuit (:func:`workflows.circuit.record`)."""
        with transaction(self._pool) as conn:
            return self.record_outcome_on(conn, engine_id, outcome, now)

    def record_outcome_on(
        self, conn: Conn, engine_id: str, outcome: Outcome, now: datetime
    ) -> Circuit:
        health = self._lock(conn, engine_id)
        circuit = record(health.circuit, outcome, now)
        if circuit == health.circuit:
            return circuit
        return self._save(conn, circuit, before=health.circuit).circuit

    @retried("record an engine's capacity", idempotent=False)
    def record_capacity(self, engine_id: str, state: Exhausted, now: datetime) -> Circuit:
        """A capacity rejection: the circuit opens at once with ``state``."""
        return self.record_outcome(engine_id, CapacityRejected(state), now)

    # -- rotation --------------------------------------------------------------------------

    @retried("select an engine", idempotent=False)
    def select(self, boundary: Boundary, policy: RotationPolicy, now: datetime) -> Selection:
        """Pick the engine for ``boundary`` among every engine's row (see the module
        docstring)."""
        with transaction(self._pool) as conn:
            return self.select_on(conn, boundary, policy, now)

    def select_on(
        self, conn: Conn, boundary: Boundary, policy: RotationPolicy, now: datetime
    ) -> Selection:
        healths = {r["engine_id"]: health_from_row(r) for r in fetch_all(conn, Q["lock_all"], {})}
        state = RotationState(
            tuple(
                (engine_id, health.rotation_weight)
                for engine_id, health in sorted(healths.items())
                if health.rotation_weight is not None
            )
        )
        candidates = [health.candidate(now) for health in healths.values()]
        selection = rotate(candidates, state, boundary, policy, now)
        if selection.engine_id is None:
            return selection
        weights = selection.state.as_dict()
        conn.execute(
            Q["save_rotation"].encode(),
            {"engine_ids": list(weights), "weights": list(weights.values())},
        )
        chosen = healths[selection.engine_id].circuit
        if half_open(chosen, now) != chosen:
            self._save(conn, half_open(chosen, now), before=chosen)
        return selection

    # -- internals -------------------------------------------------------------------------

    def _lock(self, conn: Conn, engine_id: str) -> EngineHealth:
        conn.execute(Q["ensure"].encode(), {"engine_id": engine_id})
        row = fetch_one(conn, Q["lock_one"], {"engine_id": engine_id})
        assert row is not None  # ensured just now, in this transaction
        return health_from_row(row)

    def _save(self, conn: Conn, circuit: Circuit, *, before: Circuit) -> EngineHealth:
        """Save ``circuit``; a change of its status also writes an ``engine.circuit_changed``
        domain event, in the same transaction."""
        with _checked(circuit.engine_id):
            row = fetch_one(conn, Q["save_circuit"], circuit_params(circuit))
        if row is None:
            raise EngineNotFound(circuit.engine_id)
        if before.status is not circuit.status:
            emit_on(conn, "", [circuit_changed(before, circuit)], causation_id=circuit.engine_id)
        return health_from_row(row)

    # -- operator requests -----------------------------------------------------------------

    @retried("request a rotation", idempotent=True)
    def request_rotation(self, project_id: str, *, by: str) -> RotationRequest:
        """Ask that ``project_id``'s next engine-driven attempt rotate away from the engine it
        last ran on (an open request is replaced)."""
        with transaction(self._pool) as conn:
            row = fetch_one(conn, Q["request_rotation"], {"project_id": project_id, "by": by})
        assert row is not None  # INSERT … ON CONFLICT DO UPDATE … RETURNING always returns it
        return _request(row)

    @retried("take a rotation request", idempotent=False)
    def take_rotation(self, project_id: str) -> RotationRequest | None:
        """The project's open rotation request, deleted (``None`` when there is none)."""
        with transaction(self._pool) as conn:
            row = fetch_one(conn, Q["take_rotation"], {"project_id": project_id})
        return None if row is None else _request(row)


def circuit_changed(before: Circuit, after: Circuit) -> Draft:
    payload = {
        "engine_id": after.engine_id,
        "from": before.status.value,
        "to": after.status.value,
        "capacity": after.capacity.kind.value,
        "consecutive_failures": after.consecutive_failures,
    }
    return Draft(EventType.ENGINE_CIRCUIT_CHANGED, payload)


@contextmanager
def _checked(engine_id: str) -> Iterator[None]:
    try:
        yield
    except pg_errors.CheckViolation as exc:
        detail = exc.diag.message_primary or str(exc)
        raise EngineHealthRejected(engine_id, exc.diag.constraint_name, detail) from exc


def circuit_params(circuit: Circuit) -> dict[str, object]:
    """The columns a circuit (and the capacity state it holds) is stored in."""
    probe = circuit.probe
    return {
        "engine_id": circuit.engine_id,
        "capacity_state": circuit.capacity.kind.value,
        "resets_at": resets_at_of(circuit.capacity),
        "capacity_detail": detail_of(circuit.capacity),
        "circuit_state": circuit.status.value,
        "consecutive_failures": circuit.consecutive_failures,
        "opened_at": circuit.opened_at,
        "probes": circuit.probes,
        "probe_kind": None if probe is None else _probe_kind(probe),
        "probe_at": None if probe is None else probe.at,
    }


def _probe_kind(probe: BackoffProbe | DeadlineProbe) -> str:
    return "deadline" if isinstance(probe, DeadlineProbe) else "backoff"


def circuit_from_row(row: DictRow) -> Circuit:
    probes = int(row["probes"])
    kind, at = row["probe_kind"], row["probe_at"]
    probe: BackoffProbe | DeadlineProbe | None = None
    if kind == "deadline":
        probe = DeadlineProbe(at=at)
    elif kind == "backoff":
        probe = BackoffProbe(at=at, attempt=probes + 1)
    return Circuit(
        engine_id=row["engine_id"],
        status=CircuitStatus(row["circuit_state"]),
        consecutive_failures=int(row["consecutive_failures"]),
        capacity=from_columns(row["capacity_state"], row["resets_at"], row["capacity_detail"]),
        opened_at=row["opened_at"],
        probes=probes,
        probe=probe,
    )


def health_from_row(row: DictRow) -> EngineHealth:
    return EngineHealth(
        engine_id=row["engine_id"],
        installed=bool(row["installed"]),
        local=bool(row["local"]),
        weight=int(row["weight"]),
        capabilities=frozenset(row["capabilities"]),
        last_doctor_at=row["last_doctor_at"],
        authenticated_at=row["authenticated_at"],
        circuit=circuit_from_row(row),
        rotation_weight=row["rotation_weight"],
        updated_at=row["updated_at"],
    )


def _request(row: Mapping[str, Any]) -> RotationRequest:
    return RotationRequest(
        project_id=row["project_id"],
        away_from=row["away_from"],
        requested_by=row["requested_by"],
        requested_at=row["requested_at"],
    )
