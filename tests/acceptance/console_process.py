"""`vibey console` as a subprocess for the acceptance tests: started on a free port, waited
for on /healthz, stopped by its process group."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from tests.acceptance.stack import VIBEY


@dataclass
class Console:
    url: str
    proc: subprocess.Popen[bytes]
    log: Path

    @property
    def port(self) -> int:
        return int(self.url.rstrip("/").rsplit(":", 1)[1])

    def feed(self) -> str | None:
        """What feeds its pages (/healthz's X-Vibey-Feed: events or poll); None if it is down."""
        try:
            with urllib.request.urlopen(f"{self.url}healthz", timeout=2) as answer:
                return str(answer.headers.get("X-Vibey-Feed"))
        except OSError:
            return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def wait_healthy(console: Console, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if console.proc.poll() is not None:
            raise AssertionError(f"vibey console exited: {console.log.read_text()[-3000:]}")
        with suppress(OSError), urllib.request.urlopen(f"{console.url}healthz", timeout=2) as r:
            if r.read() == b"ok":
                return
        time.sleep(0.2)
    raise AssertionError(f"vibey console not up in {timeout}s: {console.log.read_text()[-3000:]}")


@contextmanager
def console_process(env: Mapping[str, str], cwd: Path, log: Path) -> Iterator[Console]:
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [VIBEY, "console", "--port", str(port)],
            env=dict(env),
            cwd=cwd,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    running = Console(f"http://127.0.0.1:{port}/", proc, log)
    try:
        wait_healthy(running)
        yield running
    finally:
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def wait_feed(console: Console, wanted: str, timeout: float = 30) -> None:
    """Until /healthz says ``wanted`` (events or poll) feeds the pages."""
    deadline = time.monotonic() + timeout
    while (seen := console.feed()) != wanted:
        if time.monotonic() > deadline:
            raise AssertionError(
                f"the console's feed is {seen}, not {wanted}, after {timeout}s: "
                f"{console.log.read_text()[-3000:]}"
            )
        time.sleep(0.1)
