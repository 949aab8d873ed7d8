"""A loop service whose engine binary is missing from its image is live but never ready.

`vibey loop-service` serves ``/healthz`` (the liveness probe: its heartbeat is fresh) and
``/readyz`` (the readiness probe: live, and the engine's binary is found on the PATH its runs
get). A pod whose image lacks the engine's CLI thus stays out of its Service and its rollout
never completes, instead of taking run requests it can only fail.
"""

from __future__ import annotations

import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.acceptance.test_loop_service_process import ENGINE, Services
from tests.amqp_fixtures import Amqp


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def status(port: int, path: str) -> int | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as answer:
            return int(answer.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except OSError:
        return None  # not listening yet


def settle(port: int, path: str, want: int) -> int | None:
    deadline = time.monotonic() + 30
    seen = status(port, path)
    while seen != want and time.monotonic() < deadline:
        time.sleep(0.3)
        seen = status(port, path)
    return seen


def with_binary(services: Services, tmp_path: Path, binary: str) -> int:
    config = tmp_path / "ready.toml"
    config.write_text(
        f'[engines.{ENGINE}]\nadapter = "claude-code"\nbinary = "{binary}"\n'
        'invocation = "service"\n',
        encoding="utf-8",
    )
    port = free_port()
    services.env |= {"VIBEY_CONFIG": str(config), "VIBEY_METRICS_PORT": str(port)}
    return port


@pytest.fixture
def services(amqp: Amqp, tmp_path: Path) -> Services:
    return Services(amqp, tmp_path)


def test_a_missing_engine_binary_is_live_but_not_ready(services: Services, tmp_path: Path) -> None:
    port = with_binary(services, tmp_path, str(tmp_path / "no-such-claude"))
    try:
        services.start(drain_grace=1.0)
        assert settle(port, "/healthz", 200) == 200, services.log.read_text()[-2000:]
        assert settle(port, "/readyz", 503) == 503
        time.sleep(1.5)
        assert status(port, "/readyz") == 503  # and stays so
    finally:
        services.stop_all()


def test_an_installed_engine_binary_is_ready(services: Services, tmp_path: Path) -> None:
    port = with_binary(services, tmp_path, str(services.spec.binary))
    try:
        services.start(drain_grace=1.0)
        assert settle(port, "/readyz", 200) == 200, services.log.read_text()[-2000:]
        assert status(port, "/healthz") == 200
    finally:
        services.stop_all()
