"""One heartbeat thread per worker process, extending the lease of every step that runs.

A step that runs registers its lease (:meth:`Heartbeats.holding`); the thread extends each
registered lease every third of its timeout (at least every 50 ms apart), so a two-hour step
holds its lease however long it takes and loses it (and any settle) as soon as its process
stops beating. A beat the database refuses means the lease was lost (expired and taken over,
or the job was cancelled): that lease is no longer beaten. One thread for the process instead
of one per running step: starting a thread per step cost more than the short steps it beat.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta

from workflows.queue import Job, Lease, Settled

log = logging.getLogger(__name__)

MIN_INTERVAL = timedelta(milliseconds=50)


class Heartbeats:
    """``beat`` is the fenced lease extension (``PostgresJobRepository.heartbeat``)."""

    def __init__(self, *, beat: Callable[[Lease], Settled]) -> None:
        self._beat = beat
        self._wake = threading.Condition()
        self._due: list[tuple[float, int, Job]] = []  # (monotonic due time, serial, job)
        self._held: dict[int, float] = {}  # serial → interval (seconds), while it runs
        self._serials = itertools.count()
        self._thread: threading.Thread | None = None
        self._closed = False

    @contextmanager
    def holding(self, job: Job) -> Iterator[None]:
        """Beat ``job``'s lease until the block ends."""
        interval = max(job.lease_timeout / 3, MIN_INTERVAL).total_seconds()
        with self._wake:
            serial = next(self._serials)
            self._held[serial] = interval
            heapq.heappush(self._due, (time.monotonic() + interval, serial, job))
            self._start()
            self._wake.notify()
        try:
            yield
        finally:
            with self._wake:
                self._held.pop(serial, None)

    def close(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _start(self) -> None:
        if self._thread is None and not self._closed:
            self._thread = threading.Thread(target=self._run, name="heartbeats", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        while True:
            job = self._next_due()
            if job is None:
                return
            serial, lease_job = job
            try:
                applied = self._beat(lease_job.lease).applied
            except Exception:
                log.exception("job %s: heartbeat failed; trying again", lease_job.id)
                applied = True
            with self._wake:
                if not applied:
                    if serial in self._held:  # (a step that just settled is not beaten)
                        log.warning("job %s: heartbeat refused, the lease was lost", lease_job.id)
                    continue
                interval = self._held.get(serial)
                if interval is not None:
                    heapq.heappush(self._due, (time.monotonic() + interval, serial, lease_job))

    def _next_due(self) -> tuple[int, Job] | None:
        """Wait for the next lease to beat (skipping those whose step ended); None: closed."""
        with self._wake:
            while not self._closed:
                while self._due and self._due[0][1] not in self._held:
                    heapq.heappop(self._due)
                if not self._due:
                    self._wake.wait()
                    continue
                due, serial, job = self._due[0]
                left = due - time.monotonic()
                if left > 0:
                    self._wake.wait(left)
                    continue
                heapq.heappop(self._due)
                return serial, job
        return None
