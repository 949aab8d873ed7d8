"""Shared and solo steps in one worker process.

A job whose last attempt died with its process (its lease expired) runs *solo*: with nothing
else in flight in the process. If it is the one that kills its process, it dies alone and only
its own attempts are charged; the jobs that merely ran beside it the first time are not taken
down with it again. Ordinary steps hold the gate shared; a solo step waits for them to finish
and holds it alone. A waiting solo step is served before new shared ones (no starvation), at
the price of the process's other threads idling while it runs — solo steps only follow crashes.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager


class SoloGate:
    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._shared = 0
        self._alone = False
        self._waiting_alone = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._cond:
            while self._alone or self._waiting_alone:
                self._cond.wait()
            self._shared += 1
        try:
            yield
        finally:
            with self._cond:
                self._shared -= 1
                self._cond.notify_all()

    @contextmanager
    def alone(self) -> Iterator[None]:
        with self._cond:
            self._waiting_alone += 1
            while self._alone or self._shared:
                self._cond.wait()
            self._waiting_alone -= 1
            self._alone = True
        try:
            yield
        finally:
            with self._cond:
                self._alone = False
                self._cond.notify_all()
