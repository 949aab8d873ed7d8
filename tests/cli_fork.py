"""``vibey`` commands for the tests, each a process forked from one that imported the CLI once.

A ``vibey`` process spends most of its CPU importing (cyclopts, pydantic and the settings'
declarations, psycopg, the store): about 0.35 s on a quiet box, for a command that then runs
for a few milliseconds. The end-to-end tests run thousands of them. :class:`ForkedCli` runs a
server (``python -m tests.cli_fork``) that imports the CLI's modules once and forks a child per
command; the child takes the caller's stdin, stdout and stderr (passed over a UNIX socket),
working directory, environment and arguments, runs :func:`vibey.launch.main` and exits with its
code, as the console script does. Each command is still a process of its own, with its own
exit code and output; what it no longer pays is the interpreter's start and the imports.

Nothing here stands in for the console script itself: the tests of the entry point, the
import budget and ``--version`` (tests/acceptance/test_cli.py, tests/unit/test_cli_imports.py)
still run ``vibey`` as a fresh interpreter.
"""

from __future__ import annotations

import atexit
import gc
import importlib
import json
import locale
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

# What the server imports before it forks (what the commands the tests run import first).
PRELOAD = (
    "vibey.launch",
    "vibey.cli",
    "vibey.cli_gate",
    "vibey.cli_workflow",
    "vibey.cli_ledger",
    "vibey.cli_events",
    "vibey.client",
    "vibey.client_reads",
    "vibey.settings",
    "store.listings",
    "store.workflow_reads",
    "store.jobs",
    "store.workflows",
    "workflows.protocol",
)
PACKET = 1 << 20  # a request (arguments, environment) fits one packet


class ForkedCli:
    """The client of one server, started on first use; safe to share across threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._server: subprocess.Popen[bytes] | None = None
        self._dir = tempfile.mkdtemp(prefix="vibey-cli-fork-")
        self._path = str(Path(self._dir) / "socket")

    def _started(self) -> str:
        with self._lock:
            if self._server is None or self._server.poll() is not None:
                os.makedirs(self._dir, exist_ok=True)
                with _suppress_oserror():
                    os.unlink(self._path)  # a server that died left it
                self._server = subprocess.Popen(
                    [sys.executable, "-m", "tests.cli_fork", self._path],
                    stdin=subprocess.PIPE,  # its end: the server stops when this process does
                    stdout=subprocess.PIPE,
                    cwd=Path(__file__).resolve().parents[1],
                )
                assert self._server.stdout is not None
                ready = self._server.stdout.readline()
                assert ready == b"ready\n", f"the CLI fork server did not start: {ready!r}"
                atexit.register(self.close)
            return self._path

    def run(
        self, args: Sequence[str], *, cwd: Path | str, env: Mapping[str, str], timeout: float
    ) -> subprocess.CompletedProcess[str]:
        """``vibey ARGS`` in ``cwd`` with exactly ``env``, its output captured (as
        ``subprocess.run(..., capture_output=True, text=True, timeout=timeout)`` would)."""
        request = json.dumps({"args": list(args), "cwd": str(cwd), "env": dict(env)}).encode()
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        stdin = os.open(os.devnull, os.O_RDONLY)
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as conn:
            try:
                conn.connect(self._started())
                socket.send_fds(conn, [request], [stdin, out_w, err_w])
            finally:
                for fd in (stdin, out_w, err_w):
                    os.close(fd)
            try:
                pid = int(conn.recv(64))
                out, err, code = _collect(conn, out_r, err_r, pid, timeout, args)
            finally:
                os.close(out_r)
                os.close(err_r)
        return subprocess.CompletedProcess(["vibey", *args], code, out, err)

    def close(self) -> None:
        with self._lock:
            server, self._server = self._server, None
        if server is not None and server.poll() is None:
            assert server.stdin is not None
            server.stdin.close()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        if server is not None and server.stdout is not None:
            server.stdout.close()
        with _suppress_oserror():
            os.unlink(self._path)
        with _suppress_oserror():
            os.rmdir(self._dir)


_SHARED: ForkedCli | None = None
_SHARED_LOCK = threading.Lock()


def forked_cli() -> ForkedCli:
    """This test process's one client (its server starts on the first command)."""
    global _SHARED
    with _SHARED_LOCK:
        if _SHARED is None:
            _SHARED = ForkedCli()
        return _SHARED


def _collect(
    conn: socket.socket, out_r: int, err_r: int, pid: int, timeout: float, args: Sequence[str]
) -> tuple[str, str, int]:
    """The child's stdout, stderr (read to their end) and exit code."""
    chunks: dict[int, list[bytes]] = {out_r: [], err_r: []}
    code: int | None = None
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(out_r, selectors.EVENT_READ)
        selector.register(err_r, selectors.EVENT_READ)
        selector.register(conn, selectors.EVENT_READ)
        while selector.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                with _suppress_oserror():
                    os.kill(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(["vibey", *args], timeout)
            for key, _ in selector.select(left):
                if key.fileobj is conn:
                    code = int(conn.recv(64))
                    selector.unregister(conn)
                    continue
                fd = int(key.fd)
                data = os.read(fd, 65536)
                if data:
                    chunks[fd].append(data)
                else:
                    selector.unregister(fd)
    assert code is not None
    return _text(chunks[out_r]), _text(chunks[err_r]), code


def _text(chunks: list[bytes]) -> str:
    """As ``subprocess.run(..., text=True)`` decodes: the locale's encoding, newlines
    translated."""
    text = b"".join(chunks).decode(locale.getpreferredencoding(False))
    return text.replace("\r\n", "\n").replace("\r", "\n")


class _suppress_oserror:
    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, value: Any, tb: Any) -> bool:
        return kind is not None and issubclass(kind, OSError)


# --- the server ---------------------------------------------------------------------------------


def _serve(path: str) -> tuple[dict[str, Any], list[int]] | None:
    """Accept requests until stdin closes; in a forked child, return its request."""
    for module in PRELOAD:
        importlib.import_module(module)
    assert threading.active_count() == 1, "the CLI's imports started a thread: no fork is safe"
    gc.freeze()  # a child's collections skip what was imported: its pages stay shared
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    waiting: dict[int, socket.socket] = {}
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(wake_r, selectors.EVENT_READ)
    selector.register(sys.stdin.fileno(), selectors.EVENT_READ)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                message, fds, _flags, _addr = socket.recv_fds(conn, PACKET, 3)
                pid = os.fork()
                if pid == 0:  # the child: let go of the server, run the command
                    signal.set_wakeup_fd(-1)
                    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                    selector.close()
                    for own in (listener, conn, *waiting.values()):
                        own.close()
                    os.close(wake_r)
                    os.close(wake_w)
                    return json.loads(message), fds
                _started_child(pid, conn, fds, waiting)
            elif key.fd == wake_r:
                os.read(wake_r, 4096)
                _reap(waiting)
            elif not os.read(sys.stdin.fileno(), 4096):  # the tests' process let go
                while waiting:
                    _reap(waiting, block=True)
                return None


def _started_child(
    pid: int, conn: socket.socket, fds: list[int], waiting: dict[int, socket.socket]
) -> None:
    """The server's side of a fork: the child has the caller's ends, the caller its pid."""
    for fd in fds:
        os.close(fd)
    conn.send(b"%d" % pid)
    waiting[pid] = conn


def _reap(waiting: dict[int, socket.socket], *, block: bool = False) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, 0 if block else os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = waiting.pop(pid, None)
        if conn is not None:
            with _suppress_oserror():
                conn.send(b"%d" % os.waitstatus_to_exitcode(status))
            conn.close()


def _child(request: dict[str, Any], fds: list[int]) -> int:
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = ["vibey", *request["args"]]
    from vibey.launch import main

    return main(request["args"])


if __name__ == "__main__":
    served = _serve(sys.argv[1])
    sys.exit(0 if served is None else _child(*served))
