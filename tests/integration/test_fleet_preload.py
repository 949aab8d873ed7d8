"""A worker process forked by the supervisor imports nothing at its start: everything its
runtime's start needs was imported once, by the forkserver (``actors.fleet.PRELOAD``).

A respawn is then a fork and the runtime's connections, not an import of the handlers, the
engines and the protocol in every new process: that import was about 70 ms of CPU of a
respawn's 100 (measured), and a chaos test respawns hundreds of processes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.acceptance.stack import declare_topology
from tests.amqp_fixtures import Amqp

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("backend", ["rabbitmq", "postgres"])
def test_a_forked_worker_process_imports_nothing_at_its_start(
    pg_url: str, amqp: Amqp, backend: str
) -> None:
    declare_topology(pg_url, amqp)  # the amqp fixture cleans it up
    # A fresh interpreter: this test process's forkserver may have started with another preload.
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integration.fleet_probe",
            pg_url,
            amqp.url,
            amqp.prefix,
            backend,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    imported = json.loads(done.stdout.strip().splitlines()[-1])
    assert imported == [], f"imported at the start of a forked worker: {imported}"
