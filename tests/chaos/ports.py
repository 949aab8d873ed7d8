"""Listening ports for the chaos tests' private servers, safe beside tests running in parallel.

A port is picked at random below the kernel's ephemeral range (32768-60999 here): a random pick
keeps two tests started at once apart, and below that range no outgoing connection (of this
test or another) takes a port that a private server listens on again after a restart.
"""

from __future__ import annotations

import random
import socket

LISTEN_PORTS = range(20000, 32000)


def free_port(taken: set[int] | None = None) -> int:
    """A free listening port picked at random from LISTEN_PORTS (not in ``taken``, which it
    joins): tests running side by side do not pick the same one."""
    taken = set() if taken is None else taken
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(LISTEN_PORTS.start, LISTEN_PORTS.stop)
        if port in taken:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        taken.add(port)
        return port
    raise RuntimeError(f"no free port in {LISTEN_PORTS}")
