"""EventWatch without a broker: it tells nothing, keeps trying with its backoff, and stops."""

from __future__ import annotations

import socket
import threading
import time

from actors.event_watch import EventWatch


def refused_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"amqp://guest:guest@127.0.0.1:{port}/"


def test_without_a_broker_it_never_says_live_keeps_trying_and_stops_at_once() -> None:
    states: list[bool] = []
    watch = EventWatch(url=refused_url(), backoff_s=(0.01,))
    assert watch.exchange == "vibey.events"
    watch.start(on_event=lambda event: None, on_state=states.append)
    time.sleep(0.3)
    deadline = time.monotonic() + 10  # a loaded box may take longer than 0.3 s to fail 4 times
    while watch.attempts <= 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    started = time.monotonic()
    watch.stop()
    assert time.monotonic() - started < 1.0
    assert states == [] and watch.connects == 0 and watch.attempts > 3
    assert not any(t.name == "vibey-event-watch" for t in threading.enumerate())
