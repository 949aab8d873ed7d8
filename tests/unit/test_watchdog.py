"""The watchdog's staleness check, its backoff, and /healthz answering it."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from actors.agents.watchdog import Backoff, Heartbeat, heartbeat_age
from actors.metrics import MetricsServer


def test_a_beat_is_fresh_and_grows_stale(tmp_path: Path) -> None:
    path = tmp_path / "beat.json"
    assert heartbeat_age(path) == float("inf")
    started = time.monotonic() - 5
    assert 5 <= heartbeat_age(path, since=started) < 6  # no beat yet: counted from the start
    beat = Heartbeat(path, every=10)
    beat.beat([7, 3, 7])
    assert heartbeat_age(path) < 1
    assert json.loads(path.read_text())["groups"] == [3, 7]
    path.write_text(json.dumps({"monotonic": time.monotonic() - 100}))
    beat.beat()  # within `every` of the last: not written
    assert 100 <= heartbeat_age(path) < 101
    beat.beat(force=True)
    assert heartbeat_age(path) < 1


def test_the_backoff_doubles_to_its_bound() -> None:
    backoff = Backoff(first=1, most=30)
    assert [backoff.delay(n) for n in (1, 2, 3, 5, 6, 20)] == [1, 2, 4, 16, 30, 30]


def test_healthz_answers_503_while_unhealthy() -> None:
    healthy = [True]
    server = MetricsServer(port=0, host="127.0.0.1", healthy=lambda: healthy[0]).start()
    url = f"http://127.0.0.1:{server.port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=5) as answer:
            assert answer.status == 200
        healthy[0] = False
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(url, timeout=5)
        assert refused.value.code == 503
        refused.value.close()
    finally:
        server.stop()
