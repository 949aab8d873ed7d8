"""`curl` against a running worker's metrics endpoint shows the fleet's metrics.

A real `vibey worker` (two Dramatiq processes, the supervisor serving /metrics and /healthz on
VIBEY_METRICS_PORT) runs the demo to its first gate; the scrape then shows the step events of
both processes summed and the state read from PostgreSQL and the dead-letter queue.
"""

from __future__ import annotations

import re
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from actors.capabilities import detect
from actors.config import BusSettings, DatabaseSettings
from actors.worker import WorkerConfig
from tests.acceptance.stack import DEMO_SCRIPT, Stack, stack
from tests.amqp_fixtures import Amqp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def curl(url: str) -> str:
    binary = shutil.which("curl")
    if binary is None:
        pytest.fail("curl is not installed: apt-get install curl", pytrace=False)
    done = subprocess.run([binary, "-sf", url], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, (url, done.returncode, done.stderr)
    return done.stdout


def value(text: str, sample: str) -> float:
    """The value of the first line starting with ``sample`` (name and labels)."""
    for line in text.splitlines():
        if line.startswith(sample):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{sample} not in the scrape:\n{text[:3000]}")


@pytest.fixture
def served(pg_url: str, amqp: Amqp, tmp_path: Path) -> Iterator[tuple[Stack, int]]:
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))
    connection.close()
    port = free_port()
    with stack(pg_url, amqp.url, amqp.prefix, tmp_path) as running:
        running.extra_env["VIBEY_METRICS_PORT"] = str(port)
        yield running, port


def test_a_running_worker_serves_its_metrics(served: tuple[Stack, int]) -> None:
    e2e, port = served
    e2e.start_worker(processes=2, threads=4)
    e2e.vibey("workflow", "start", "demo", "--script", str(DEMO_SCRIPT))
    deadline = time.monotonic() + 90
    while not e2e.open_gates("demo") and time.monotonic() < deadline:
        time.sleep(0.5)
    assert e2e.open_gates("demo"), e2e.worker_log()
    time.sleep(2.5)  # a reconcile pass (VIBEY_QUEUE_RECONCILE_INTERVAL=1) after the gate
    base = f"http://127.0.0.1:{port}"
    assert curl(f"{base}/healthz") == "ok\n"
    text = curl(f"{base}/metrics")
    assert value(text, 'vibey_step_results_total{result="succeeded"}') >= 1
    assert re.search(
        r'vibey_step_duration_seconds_count\{kind="design\.\w+",outcome="success"\}', text
    )
    assert value(text, 'vibey_dispatch_latency_seconds_count{lane="interactive"}') >= 1
    assert value(text, "vibey_reconcile_duration_seconds_count") >= 1
    assert value(text, "vibey_store_up") == 1
    assert value(text, "vibey_broker_up") == 1
    assert value(text, 'vibey_gates_open{kind="question"}') == 1
    assert value(text, 'vibey_gate_oldest_wait_seconds{kind="question"}') >= 0
    assert value(text, "vibey_outbox_unsent") == 0
    assert value(text, "vibey_outbox_oldest_unsent_seconds") == 0
    assert value(text, "vibey_dead_letter_queue_depth") == 0
    assert value(text, "vibey_dead_letters_kept") == 0
    assert 0 <= value(text, "vibey_reconcile_heartbeat_age_seconds") < 30
    assert "# TYPE vibey_jobs gauge" in text and "# TYPE vibey_engine_circuit gauge" in text
