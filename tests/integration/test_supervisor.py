"""The worker supervisor: a fleet that cannot start backs off; a killed process comes back
at once."""

from __future__ import annotations

import threading
import time

from actors.config import BusSettings, DatabaseSettings
from actors.fleet import RESPAWN_MAX_S, Supervisor
from actors.worker import WorkerConfig
from tests.amqp_fixtures import Amqp


def test_the_respawn_delay_doubles_for_quick_error_exits_only() -> None:
    supervisor = Supervisor(
        WorkerConfig(
            database=DatabaseSettings(url="postgresql://x/y"), bus=BusSettings(amqp_url="amqp://x")
        ),
        processes=1,
    )
    delays = [supervisor._respawn_delay(0, 1, now=1.0) for _ in range(8)]
    assert delays == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, RESPAWN_MAX_S, RESPAWN_MAX_S]
    assert supervisor._respawn_delay(0, -9, now=1.0) == 0.0  # killed by a signal: at once
    assert supervisor._respawn_delay(0, 1, now=1.0) == 0.5  # the streak starts again
    assert supervisor._respawn_delay(0, 1, now=60.0) == 0.0  # it ran a while: no backoff


def test_a_fleet_that_cannot_start_does_not_spin(pg_url: str, amqp: Amqp) -> None:
    # A worker that fails at start: its crash points cannot be imported.
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
        crash_points="tests.nowhere:X",
    )
    supervisor = Supervisor(config, processes=1)
    fleet = threading.Thread(target=supervisor.run, daemon=True)
    started = time.monotonic()
    fleet.start()
    # Wait for the third respawn (an event, not a clock: a loaded box starts slower).
    deadline = started + 90
    while supervisor.respawns < 3 and time.monotonic() < deadline:
        time.sleep(0.02)
    elapsed = time.monotonic() - started
    supervisor.stop()
    fleet.join(timeout=60)
    # Every exit was a quick error exit: the streak the backoff doubles on.
    assert supervisor._failures[0] >= supervisor.respawns >= 3
    # The backoff waited 0.5, 1 and 2 s before them, whatever each start cost; without it
    # the three come a quarter second apart (22 respawns in six seconds when measured).
    assert elapsed >= 0.5 + 1.0 + 2.0, elapsed
