"""A private PostgreSQL server for one test: its own port, data folder, socket folder and log.

Used where a test must stop and start the database under a running fleet; the shared server
is never touched. The server runs from this machine's PostgreSQL binaries
(``/usr/lib/postgresql/<major>/bin``), as the ``postgres`` user when the test runs as root
(``initdb`` refuses root), with ``trust`` authentication on 127.0.0.1 only, fsync off (a test
server: nothing here must survive a power cut) and a temporary folder of its own.

:func:`private_postgres` yields a :class:`PrivatePostgres` (its URL, ``stop()``, ``start()``);
on exit (and on any error) it stops the server with ``pg_ctl stop -m immediate``, kills the
postmaster by its pid (``postmaster.pid``) if that fails, and removes the folder.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg

from tests.chaos.ports import free_port

PG_BIN_ROOT = Path("/usr/lib/postgresql")
START_TIMEOUT_S = 60
RUN_AS = "postgres"  # initdb and postgres refuse to run as root


def _bin(name: str) -> str:
    for major in sorted(PG_BIN_ROOT.glob("*/bin"), reverse=True):
        if (major / name).exists():
            return str(major / name)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed; a private PostgreSQL server needs it")
    return found


def _as_owner(argv: list[str]) -> list[str]:
    return ["runuser", "-u", RUN_AS, "--", *argv] if os.geteuid() == 0 else argv


@dataclass
class PrivatePostgres:
    port: int
    folder: Path

    @property
    def data(self) -> Path:
        return self.folder / "data"

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def url_for(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _ctl(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = _as_owner([_bin("pg_ctl"), "-D", str(self.data), *args])
        return subprocess.run(
            argv, capture_output=True, text=True, timeout=START_TIMEOUT_S + 30, check=check
        )

    def start(self) -> None:
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} "
            "-c fsync=off -c max_connections=100"
        )
        self._ctl(
            "-o",
            options,
            "-l",
            str(self.folder / "server.log"),
            "-w",
            "-t",
            str(START_TIMEOUT_S),
            "start",
        )

    def stop(self, mode: str = "fast") -> None:
        self._ctl("-m", mode, "-w", "stop")

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def answers(self) -> bool:
        try:
            with psycopg.connect(self.url, connect_timeout=2):
                return True
        except psycopg.OperationalError:
            return False


def _init(folder: Path) -> None:
    if os.geteuid() == 0:
        owner = pwd.getpwnam(RUN_AS)
        os.chown(folder, owner.pw_uid, owner.pw_gid)
    argv = [
        _bin("initdb"),
        "-D",
        str(folder / "data"),
        "-U",
        "postgres",
        "--auth=trust",
        "--no-sync",
        "-E",
        "UTF8",
        "--locale=C.UTF-8",
    ]
    subprocess.run(_as_owner(argv), capture_output=True, text=True, timeout=120, check=True)


@contextlib.contextmanager
def private_postgres(port: int | None = None) -> Iterator[PrivatePostgres]:
    """A server on ``port``, or on a free one (``tests/chaos/ports.py``) kept across restarts."""
    port = free_port() if port is None else port
    folder = Path(tempfile.mkdtemp(prefix="vibey-pg-"))
    server = PrivatePostgres(port=port, folder=folder)
    try:
        _init(folder)
        server.start()
        yield server
    finally:
        pid = server.pid()
        with contextlib.suppress(subprocess.SubprocessError, OSError):
            server._ctl("-m", "immediate", "-w", "stop", check=False)
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            for _ in range(50):
                try:
                    os.kill(pid, 0)
                except ProcessLookupError:
                    break
                time.sleep(0.1)
        shutil.rmtree(folder, ignore_errors=True)
