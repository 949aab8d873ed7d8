"""The console's change feed: one reader, every stream woken when the marker moves."""

from __future__ import annotations

import asyncio

from vibey.console.feed import ChangeFeed


def test_each_stream_gets_each_new_marker_once() -> None:
    async def scenario() -> tuple[list[str | None], list[str | None]]:
        feed = ChangeFeed(lambda: "", interval=60)
        feed.publish("a")
        first, second = feed.changes(None), feed.changes("a")
        got_first = [await anext(first)]
        waiting = asyncio.ensure_future(anext(second))
        await asyncio.sleep(0)
        assert not waiting.done()  # "a" is what it has seen: it waits
        feed.publish("a")  # the same marker: nobody is woken
        await asyncio.sleep(0)
        assert not waiting.done()
        feed.publish("b")
        got_second = [await asyncio.wait_for(waiting, 1)]
        got_first.append(await asyncio.wait_for(anext(first), 1))
        return got_first, got_second

    assert asyncio.run(scenario()) == (["a", "b"], ["b"])


def test_a_failed_read_keeps_the_last_marker_and_polling_goes_on() -> None:
    reads: list[str | Exception] = ["m1", RuntimeError("the database is away"), "m2"]

    def read() -> str:
        value = reads.pop(0)
        if isinstance(value, Exception):
            raise value
        return value

    async def scenario() -> list[str | None]:
        feed = ChangeFeed(read, interval=0.01)
        task = asyncio.create_task(feed.run())
        seen: list[str | None] = []
        stream = feed.changes(None)
        seen.append(await asyncio.wait_for(anext(stream), 2))
        seen.append(await asyncio.wait_for(anext(stream), 2))
        task.cancel()
        return seen

    assert asyncio.run(scenario()) == ["m1", "m2"]
