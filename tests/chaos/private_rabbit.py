"""A private RabbitMQ node for one test: its own port, config, data folder and log.

Used where a test needs broker settings the shared node must not have, e.g. a short
``consumer_timeout``. The node runs from this machine's RabbitMQ binaries (3.10 here), as the
current user, with ``HOME`` set to its temp folder (so its Erlang cookie is its own), no plugins,
its own ``rabbitmq-env.conf`` (the system one names the main node) and a free AMQP port and
distribution port. It registers with the machine's ``epmd`` like any node (and, as any node
does, starts one when none runs; that daemon is shared and outlives the node).

:func:`private_rabbit` yields a :class:`PrivateRabbit` with the AMQP URL; on exit (and on any
error) it stops the node with ``rabbitmqctl -n <node> stop``, kills it by pid (the VM's pid file
and the wrapper's process group) if that fails or anything outlives it, and removes the temp
folder.

RabbitMQ checks ``consumer_timeout`` on the channel tick (``channel_tick_interval``, 60 s by
default), so a 10 s timeout would fire anywhere between 10 s and 70 s. The node sets the tick
to 1 s in ``advanced.config`` so the timeout fires when it says (facts note C.7: closed at
10.0 s; A.4: 11.1 s and 24.2 s for a delivery held 25 s).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pika
import pika.exceptions

from tests.chaos.ports import free_port

RABBITMQ_BIN = Path("/usr/lib/rabbitmq/bin")  # the unwrapped scripts: no `su rabbitmq`
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 60.0


def _script(name: str) -> str:
    local = RABBITMQ_BIN / name
    if local.exists():
        return str(local)
    found = shutil.which(name)
    if found is None:
        raise RuntimeError(f"{name} is not installed; a private RabbitMQ node needs it")
    return found


@dataclass(frozen=True)
class PrivateRabbit:
    node: str
    port: int
    url: str
    root: Path
    log_file: Path
    env: dict[str, str]

    def ctl(self, *args: str, timeout: float = 60.0) -> str:
        """``rabbitmqctl -n <node> ARGS...`` → stdout; RuntimeError when it fails."""
        done = subprocess.run(
            [_script("rabbitmqctl"), "-n", self.node, "-q", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"rabbitmqctl {' '.join(args)} on {self.node}: "
                f"{(done.stderr or done.stdout).strip()[:500]}"
            )
        return done.stdout

    def log_text(self) -> str:
        """The node's log so far ('' before the node wrote one)."""
        try:
            return self.log_file.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""


def _config(port: int, consumer_timeout_ms: int) -> str:
    return (
        f"listeners.tcp.local = 127.0.0.1:{port}\n"
        f"consumer_timeout = {consumer_timeout_ms}\n"
        "loopback_users.guest = true\n"
        "log.file.level = info\n"
        "log.console = false\n"
    )


def _advanced_config(channel_tick_ms: int) -> str:
    return f"[{{rabbit, [{{channel_tick_interval, {channel_tick_ms}}}]}}].\n"


def node_env(root: Path, node: str, port: int, dist_port: int) -> dict[str, str]:
    """The environment of a private node whose files all live under ``root``."""
    return {
        **{k: v for k, v in os.environ.items() if not k.startswith(("RABBITMQ_", "ERL_"))},
        "HOME": str(root),  # the Erlang cookie lives here, for the node and rabbitmqctl
        "RABBITMQ_NODENAME": node,
        "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
        "RABBITMQ_NODE_PORT": str(port),
        "RABBITMQ_DIST_PORT": str(dist_port),
        "RABBITMQ_CONFIG_FILE": str(root / "rabbitmq.conf"),
        "RABBITMQ_ADVANCED_CONFIG_FILE": str(root / "advanced.config"),
        "RABBITMQ_CONF_ENV_FILE": str(root / "rabbitmq-env.conf"),
        "RABBITMQ_ENABLED_PLUGINS_FILE": str(root / "enabled_plugins"),
        "RABBITMQ_MNESIA_BASE": str(root / "mnesia"),
        "RABBITMQ_LOG_BASE": str(root / "log"),
        "RABBITMQ_LOGS": str(root / "log" / "node.log"),
        "RABBITMQ_PID_FILE": str(root / "node.pid"),
        "ERL_EPMD_ADDRESS": "127.0.0.1",
        "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": "-kernel inet_dist_use_interface {127,0,0,1}",
    }


@contextlib.contextmanager
def private_rabbit(
    *, consumer_timeout_ms: int = 10_000, channel_tick_ms: int = 1_000
) -> Iterator[PrivateRabbit]:
    """Start a throwaway node; yield it once it accepts AMQP connections; always remove it."""
    root = Path(tempfile.mkdtemp(prefix="vibey-rabbit-"))
    taken: set[int] = set()
    port, dist_port = free_port(taken), free_port(taken)
    node = f"vibey_t{uuid.uuid4().hex[:10]}@localhost"
    (root / "log").mkdir()
    (root / "mnesia").mkdir()
    (root / "rabbitmq.conf").write_text(_config(port, consumer_timeout_ms), encoding="utf-8")
    (root / "advanced.config").write_text(_advanced_config(channel_tick_ms), encoding="utf-8")
    (root / "enabled_plugins").write_text("[].\n", encoding="utf-8")
    (root / "rabbitmq-env.conf").write_text("", encoding="utf-8")
    log_file = root / "log" / "node.log"
    env = node_env(root, node, port, dist_port)
    rabbit = PrivateRabbit(
        node=node,
        port=port,
        url=f"amqp://guest:guest@127.0.0.1:{port}/",
        root=root,
        log_file=log_file,
        env=env,
    )
    process: subprocess.Popen[bytes] | None = None
    try:
        with (root / "server.out").open("wb") as out:
            process = subprocess.Popen(
                [_script("rabbitmq-server")],
                env=env,
                cwd=root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group: killable as a whole
            )
        _await_startup(rabbit, process)
        yield rabbit
    finally:
        _stop(rabbit, process)
        shutil.rmtree(root, ignore_errors=True)


def _await_startup(rabbit: PrivateRabbit, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_S
    params = pika.URLParameters(rabbit.url)
    params.connection_attempts = 1
    params.socket_timeout = 2
    while True:
        if process.poll() is not None:
            raise RuntimeError(
                f"private RabbitMQ node {rabbit.node} exited with {process.returncode}: "
                f"{_tail(rabbit.root / 'server.out')} {_tail(rabbit.log_file)}"
            )
        try:
            # A bare TCP probe first: pika logs every refused attempt at ERROR.
            socket.create_connection(("127.0.0.1", rabbit.port), timeout=2).close()
            pika.BlockingConnection(params).close()
            return
        except (pika.exceptions.AMQPError, OSError):
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"private RabbitMQ node {rabbit.node} did not accept AMQP on port {rabbit.port} "
                f"within {START_TIMEOUT_S:.0f} s: {_tail(rabbit.log_file)}"
            )
        time.sleep(0.5)


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-chars:]
    except FileNotFoundError:
        return ""


def _beam_pid(rabbit: PrivateRabbit) -> int | None:
    try:
        return int((rabbit.root / "node.pid").read_text(encoding="utf-8").strip())
    except (FileNotFoundError, ValueError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop(rabbit: PrivateRabbit, process: subprocess.Popen[bytes] | None) -> None:
    """A graceful stop by SIGTERM (the ``rabbitmq-server`` wrapper passes it to the VM, which
    stops the node as ``rabbitmqctl stop`` would, without booting a VM of rabbitmqctl's own);
    ``rabbitmqctl stop`` when there is no wrapper; whatever outlives it is killed by pid (the
    VM from the pid file, and the wrapper's process group)."""
    beam = _beam_pid(rabbit)
    if process is not None and process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            _kill(beam, process)
            process.wait(timeout=10)
    elif beam is not None and _alive(beam):
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired, OSError):
            rabbit.ctl("stop", timeout=STOP_TIMEOUT_S)
    _kill(beam, process)  # whatever is left of the group (a no-op after a clean stop)
    deadline = time.monotonic() + 10
    while beam is not None and _alive(beam) and time.monotonic() < deadline:
        time.sleep(0.1)


def _kill(beam: int | None, process: subprocess.Popen[bytes] | None) -> None:
    if beam is not None and _alive(beam):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(beam, signal.SIGKILL)
    if process is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
