"""Count the statements and round trips psycopg sends, from threads other than the main one.

A bench's profile run wraps its worker in :func:`counting`: every ``Cursor.execute`` and
each row of an ``executemany`` is a statement; a round trip is a statement outside pipeline
mode, or, in pipeline mode, a wait for results (a fetch that flushes, a sync). The main
thread (the bench's client: its starts and polls) is left out.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import psycopg
from psycopg import _pipeline_base


@dataclass
class Tally:
    statements: int = 0
    round_trips: int = 0
    by_text: Counter[str] = field(default_factory=Counter)

    def top(self, n: int, per: int) -> list[str]:
        """The ``n`` most sent statements, each as calls per unit (``per``) and its start."""
        return [
            f"{count / per:5.2f}  {' '.join(text.split())[:90]}"
            for text, count in self.by_text.most_common(n)
        ]


def _counted() -> bool:
    return threading.current_thread() is not threading.main_thread()


@contextmanager
def counting() -> Iterator[Tally]:
    """Count while the block runs (psycopg's classes patched, restored on exit)."""
    tally = Tally()
    lock = threading.Lock()
    execute, executemany = psycopg.Cursor.execute, psycopg.Cursor.executemany
    fetch, sync = _pipeline_base.BasePipeline._fetch_gen, _pipeline_base.BasePipeline._sync_gen

    def note(query: Any, statements: int, pipelined: bool) -> None:
        if not _counted():
            return
        text = query.decode() if isinstance(query, bytes) else str(query)
        with lock:
            tally.statements += statements
            tally.round_trips += 0 if pipelined else statements
            tally.by_text[text] += statements

    def counted_execute(self: Any, query: Any, params: Any = None, **kw: Any) -> Any:
        note(query, 1, self._conn._pipeline is not None)
        return execute(self, query, params, **kw)

    def counted_executemany(self: Any, query: Any, params_seq: Any, **kw: Any) -> Any:
        rows = list(params_seq)
        note(query, len(rows), self._conn._pipeline is not None)
        return executemany(self, query, rows, **kw)

    def trip(gen: Callable[..., Generator[Any, Any, None]]) -> Callable[..., Any]:
        def wrapped(self: Any, *args: Any, **kw: Any) -> Generator[Any, Any, None]:
            # A sync always waits (for its own result); a fetch waits when it flushes and
            # some result is still to come.
            waits = kw.get("flush", True) and (gen is sync or bool(self.result_queue))
            if waits and _counted():
                with lock:
                    tally.round_trips += 1
            return (yield from gen(self, *args, **kw))

        return wrapped

    psycopg.Cursor.execute = counted_execute  # type: ignore[method-assign,assignment]
    psycopg.Cursor.executemany = counted_executemany  # type: ignore[method-assign]
    _pipeline_base.BasePipeline._fetch_gen = trip(fetch)  # type: ignore[method-assign]
    _pipeline_base.BasePipeline._sync_gen = trip(sync)  # type: ignore[method-assign]
    try:
        yield tally
    finally:
        psycopg.Cursor.execute = execute  # type: ignore[method-assign]
        psycopg.Cursor.executemany = executemany  # type: ignore[method-assign]
        _pipeline_base.BasePipeline._fetch_gen = fetch  # type: ignore[method-assign]
        _pipeline_base.BasePipeline._sync_gen = sync  # type: ignore[method-assign]
