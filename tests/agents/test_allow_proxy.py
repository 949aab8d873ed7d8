"""The confinement's allow proxy when the engine hangs up before it is answered.

A CLI that gives up on a refused host (or on a slow upstream) closes its end while the proxy
still has an answer to send; the answer then fails with a broken pipe. That is the engine's
choice, not the proxy's error: the connection's thread ends quietly, the refusal is still
recorded, and nothing escapes the thread (pytest turns an unhandled thread exception into a
failure)."""

from __future__ import annotations

import socket

from actors.agents.confine import AllowProxy


def _hung_up(request: bytes) -> socket.socket:
    """The proxy's end of a connection whose engine sent ``request`` and closed at once."""
    ours, engine = socket.socketpair()
    engine.sendall(request)
    engine.close()
    return ours


def test_a_refusal_to_an_engine_that_hung_up_ends_quietly() -> None:
    proxy = AllowProxy("codex", ["127.0.0.1:9"], ("127.0.0.1", 0))
    proxy._handle(_hung_up(b"CONNECT chatgpt.com:443 HTTP/1.1\r\nHost: chatgpt.com\r\n\r\n"))
    assert proxy.refused == ["chatgpt.com:443"]


def test_a_bad_gateway_to_an_engine_that_hung_up_ends_quietly() -> None:
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    target = f"127.0.0.1:{closed.getsockname()[1]}"  # bound, not listening: refused
    try:
        proxy = AllowProxy("codex", [target], ("127.0.0.1", 0))
        proxy._handle(_hung_up(f"CONNECT {target} HTTP/1.1\r\n\r\n".encode()))
    finally:
        closed.close()
    assert proxy.refused == []


def test_a_hung_up_engine_does_not_stop_the_proxy_answering_the_next() -> None:
    with AllowProxy("codex", [], ("127.0.0.1", 0)) as proxy:
        proxy._handle(_hung_up(b"CONNECT chatgpt.com:443 HTTP/1.1\r\n\r\n"))
        with socket.create_connection(("127.0.0.1", proxy.port), timeout=5) as engine:
            engine.sendall(b"CONNECT api.openai.com:443 HTTP/1.1\r\n\r\n")
            answer = engine.recv(4096)
    assert answer.startswith(b"HTTP/1.1 403 Forbidden")
    assert proxy.refused == ["chatgpt.com:443", "api.openai.com:443"]
