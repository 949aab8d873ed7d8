"""A small TCP proxy for one test: clients connect to it instead of the server, and the test
cuts every connection (both sockets reset at once) or stalls them (bytes held, sockets open).

Threads, one pair of pumps per connection; :meth:`TcpProxy.cut` closes every live pair,
:meth:`TcpProxy.stall` stops the pumps forwarding for a while (a network that hangs rather
than fails). New connections are accepted throughout, as a real network's would be.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator


class TcpProxy:
    def __init__(self, *, listen_port: int, target: tuple[str, int]) -> None:
        self._target = target
        self._server = socket.create_server(("127.0.0.1", listen_port))
        self.port = int(self._server.getsockname()[1])
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._lock = threading.Lock()
        self._flowing = threading.Event()
        self._flowing.set()
        self._closed = threading.Event()
        self.accepted = 0
        self.cuts = 0
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def cut(self) -> int:
        """Reset every live connection; how many there were."""
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.setsockopt(
                        socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00"
                    )
                    sock.close()
        self.cuts += 1
        return len(pairs)

    def stall(self, seconds: float) -> None:
        """Hold every byte for ``seconds`` (the sockets stay open)."""
        self._flowing.clear()
        time.sleep(seconds)
        self._flowing.set()

    def close(self) -> None:
        """Stop accepting (the port refuses connections from now on) and cut every one."""
        self._closed.set()
        with contextlib.suppress(OSError):  # a blocked accept() returns only on a shutdown
            self._server.shutdown(socket.SHUT_RDWR)
        with contextlib.suppress(OSError):
            self._server.close()
        self.cut()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._server.accept()
                upstream = socket.create_connection(self._target, timeout=5)
            except OSError:
                continue
            upstream.settimeout(None)
            with self._lock:
                self._pairs.append((client, upstream))
            self.accepted += 1
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                self._flowing.wait()
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.close()


@contextlib.contextmanager
def tcp_proxy(*, listen_port: int, target: tuple[str, int]) -> Iterator[TcpProxy]:
    proxy = TcpProxy(listen_port=listen_port, target=target)
    try:
        yield proxy
    finally:
        proxy.close()
