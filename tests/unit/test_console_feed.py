"""The console's change feed: the domain events move it (handed off from their own thread
into the loop), the poll of the change marker is the fallback, and every stream is woken."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime
from uuid import uuid4

from tests.console_fake import FakeEvents
from vibey.console.app import _sse_change
from vibey.console.feed import Change, ChangeFeed
from workflows.events import DomainEvent, EventType

NEVER = 3600.0  # a poll so slow that only the event path can explain a change


def gate_opened(workflow_id: str = "wf-1") -> DomainEvent:
    return DomainEvent(
        event_id=uuid4(),
        event_type=EventType.GATE_OPENED,
        timestamp=datetime.now(UTC),
        tenant_id="default",
        project_id="demo",
        correlation_id=workflow_id,
        causation_id=None,
        payload={"gate": "ship.approval"},
    )


def test_each_stream_gets_each_new_marker_once() -> None:
    async def scenario() -> tuple[list[str], list[str]]:
        feed = ChangeFeed(lambda: "", interval=60)
        feed.polled("a")
        after_a = feed.marker
        first, second = feed.changes(None), feed.changes(after_a)
        got_first = [await anext(first)]
        waiting = asyncio.ensure_future(anext(second))
        await asyncio.sleep(0)
        assert not waiting.done()  # the marker is what it has seen: it waits
        feed.polled("a")  # the same read: nobody is woken
        await asyncio.sleep(0)
        assert not waiting.done()
        feed.polled("b")
        got_second = [await asyncio.wait_for(waiting, 1)]
        got_first.append(await asyncio.wait_for(anext(first), 1))
        return (
            [c.marker for c in got_first if c is not None],
            [c.marker for c in got_second if c is not None],
        )

    firsts, seconds = asyncio.run(scenario())
    assert len(set(firsts)) == 2 and seconds == firsts[1:]


def test_a_failed_read_keeps_the_last_marker_and_polling_goes_on() -> None:
    reads: list[str | Exception] = ["m1", RuntimeError("the database is away"), "m2"]

    def read() -> str:
        value = reads.pop(0)
        if isinstance(value, Exception):
            raise value
        return value

    async def scenario() -> list[Change | None]:
        feed = ChangeFeed(read, interval=0.01)
        task = asyncio.create_task(feed.run())
        stream = feed.changes(None)
        seen = [await asyncio.wait_for(anext(stream), 2), await asyncio.wait_for(anext(stream), 2)]
        task.cancel()
        return seen

    first, second = asyncio.run(scenario())
    assert first is not None and second is not None and first.marker != second.marker
    assert first.event_type is None and second.event_type is None  # the poll saw them


def test_an_event_from_another_thread_wakes_a_stream_with_its_type() -> None:
    async def scenario() -> tuple[Change | None, int]:
        reads = 0

        def read() -> str:
            nonlocal reads
            reads += 1
            return "unchanged"

        feed = ChangeFeed(read, interval=NEVER, safety_interval=NEVER)
        task = asyncio.create_task(feed.run())
        source = FakeEvents()
        feed.listen(source)
        await asyncio.sleep(0.05)
        stream = feed.changes(feed.marker)  # has seen the first read
        waiting = asyncio.ensure_future(anext(stream))
        await asyncio.to_thread(source.connect)  # each call back comes from a thread of its own
        await asyncio.to_thread(source.emit, gate_opened())
        got = await asyncio.wait_for(waiting, 1)
        for _ in range(200):  # the read the connect asked for runs on a thread of its own
            if reads >= 2:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.05)  # and no other follows it
        task.cancel()
        return got, reads

    got, reads = asyncio.run(scenario())
    assert got is not None and got.event_type == "gate.opened" and got.workflow_id == "wf-1"
    assert reads == 2  # the first read, and one when the events began to arrive; no more


def test_the_poll_is_slow_while_events_arrive_and_fast_again_when_they_stop() -> None:
    async def scenario() -> list[tuple[bool, float, int]]:
        reads = 0

        def read() -> str:
            nonlocal reads
            reads += 1
            return str(reads)

        feed = ChangeFeed(read, interval=0.5, safety_interval=NEVER)
        task = asyncio.create_task(feed.run())
        source = FakeEvents()
        feed.listen(source)
        await asyncio.sleep(0.05)
        states = [(feed.live, feed.poll_interval, reads)]
        await asyncio.to_thread(source.connect)
        await asyncio.sleep(0.05)
        states.append((feed.live, feed.poll_interval, reads))  # read at once on the switch
        await asyncio.sleep(0.7)
        states.append((feed.live, feed.poll_interval, reads))  # no fast read since
        await asyncio.to_thread(source.drop)
        await asyncio.sleep(0.05)
        states.append((feed.live, feed.poll_interval, reads))  # read at once again
        await asyncio.sleep(0.6)
        states.append((feed.live, feed.poll_interval, reads))  # and at the fast pace
        task.cancel()
        return states

    assert asyncio.run(scenario()) == [
        (False, 0.5, 1),
        (True, NEVER, 2),
        (True, NEVER, 2),
        (False, 0.5, 3),
        (False, 0.5, 4),
    ]


def test_a_safety_interval_below_the_poll_interval_is_the_poll_interval() -> None:
    feed = ChangeFeed(lambda: "", interval=2.0, safety_interval=0.5)
    feed.events_live(True)
    assert feed.poll_interval == 2.0


def test_a_refused_body_still_wakes_the_streams() -> None:
    async def scenario() -> Change | None:
        feed = ChangeFeed(lambda: "", interval=NEVER)
        feed.polled("x")
        stream = feed.changes(feed.marker)
        waiting = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(0)
        feed.event(None)
        return await asyncio.wait_for(waiting, 1)

    got = asyncio.run(scenario())
    assert got is not None and got.event_type is None


def test_the_stream_sends_the_marker_and_the_event_as_json() -> None:
    text = _sse_change(Change("ab12.7", "phase.transitioned", "wf-9"))
    head, data = text.rstrip("\n").split("\n")
    assert head == "event: change" and text.endswith("\n\n")
    assert json.loads(data.removeprefix("data: ")) == {
        "marker": "ab12.7",
        "event_type": "phase.transitioned",
        "workflow_id": "wf-9",
    }
