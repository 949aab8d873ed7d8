"""A three-node RabbitMQ cluster on loopback, for one test: private nodes, own ports and data.

Each node is a :mod:`tests.chaos.private_rabbit` node (its own folder, config, log, AMQP and
distribution ports, picked at random below the ephemeral range) sharing one Erlang cookie;
nodes 2 and 3 join node 1. A node can be SIGKILLed (:meth:`ClusterNode.kill`) and started again
on the same data and port (:meth:`ClusterNode.start`): it rejoins the cluster. Everything is
removed on exit.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from tests.chaos.ports import free_port
from tests.chaos.private_rabbit import (
    PrivateRabbit,
    _advanced_config,
    _await_startup,
    _beam_pid,
    _config,
    _script,
    _stop,
    node_env,
)

# rabbitmqctl boots a VM of its own: seconds on a quiet box, over a minute on a loaded one
# (60 s ran out while other test runs shared the cores).
CTL_TIMEOUT_S = 240.0


@dataclass
class ClusterNode:
    rabbit: PrivateRabbit
    process: subprocess.Popen[bytes] | None = field(default=None)

    @property
    def name(self) -> str:
        return self.rabbit.node

    def start(self) -> None:
        with (self.rabbit.root / "server.out").open("ab") as out:
            self.process = subprocess.Popen(
                [_script("rabbitmq-server")],
                env=self.rabbit.env,
                cwd=self.rabbit.root,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        _await_startup(self.rabbit, self.process)

    def kill(self) -> None:
        """SIGKILL the node's VM and its wrapper: a crash, not a stop."""
        beam = _beam_pid(self.rabbit)
        if beam is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(beam, signal.SIGKILL)
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)
        deadline = time.monotonic() + 20
        while _port_open(self.rabbit.port) and time.monotonic() < deadline:
            time.sleep(0.2)

    def stop(self) -> None:
        _stop(self.rabbit, self.process)


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _node(root: Path, cookie: str, taken: set[int], index: int) -> ClusterNode:
    root.mkdir()
    port, dist_port = free_port(taken), free_port(taken)
    name = f"vibey_c{index}_{uuid.uuid4().hex[:8]}@localhost"
    for folder in ("log", "mnesia"):
        (root / folder).mkdir()
    (root / "rabbitmq.conf").write_text(_config(port, 3_600_000), encoding="utf-8")
    (root / "advanced.config").write_text(_advanced_config(1_000), encoding="utf-8")
    (root / "enabled_plugins").write_text("[].\n", encoding="utf-8")
    (root / "rabbitmq-env.conf").write_text("", encoding="utf-8")
    cookie_file = root / ".erlang.cookie"
    cookie_file.write_text(cookie, encoding="utf-8")
    cookie_file.chmod(0o400)
    rabbit = PrivateRabbit(
        node=name,
        port=port,
        url=f"amqp://guest:guest@127.0.0.1:{port}/",
        root=root,
        log_file=root / "log" / "node.log",
        env=node_env(root, name, port, dist_port),
    )
    return ClusterNode(rabbit)


@contextlib.contextmanager
def rabbit_cluster(size: int = 3) -> Iterator[list[ClusterNode]]:
    """``size`` clustered nodes, all running; removed on exit whatever happened."""
    base = Path(tempfile.mkdtemp(prefix="vibey-cluster-"))
    cookie = secrets.token_hex(16).upper()
    taken: set[int] = set()
    nodes = [_node(base / f"n{i}", cookie, taken, i) for i in range(1, size + 1)]
    try:
        # The nodes boot side by side (a VM each: the boot is mostly waiting), then join one
        # after another.
        with ThreadPoolExecutor(max_workers=size) as booting:
            list(booting.map(ClusterNode.start, nodes))
        for node in nodes[1:]:
            node.rabbit.ctl("stop_app", timeout=CTL_TIMEOUT_S)
            node.rabbit.ctl("join_cluster", nodes[0].name, timeout=CTL_TIMEOUT_S)
            node.rabbit.ctl("start_app", timeout=CTL_TIMEOUT_S)
        status = nodes[0].rabbit.ctl("cluster_status", timeout=CTL_TIMEOUT_S)
        for node in nodes:
            assert node.name in status, status
        yield nodes
    finally:
        with ThreadPoolExecutor(max_workers=size) as stopping:
            list(stopping.map(_stop_quietly, nodes))
        shutil.rmtree(base, ignore_errors=True)


def _stop_quietly(node: ClusterNode) -> None:
    with contextlib.suppress(Exception):
        node.stop()
