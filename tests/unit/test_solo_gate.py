"""The solo gate: shared steps run together; a solo step runs with nothing else in flight."""

from __future__ import annotations

import threading
import time

from actors.solo import SoloGate


def test_shared_steps_overlap_and_a_solo_step_runs_alone() -> None:
    gate = SoloGate()
    inside: list[str] = []
    overlaps: list[tuple[str, ...]] = []
    lock = threading.Lock()

    def step(name: str, solo: bool) -> None:
        with gate.alone() if solo else gate.shared():
            with lock:
                inside.append(name)
                overlaps.append(tuple(inside))
            time.sleep(0.05)
            with lock:
                inside.remove(name)

    threads = [threading.Thread(target=step, args=(f"s{i}", False)) for i in range(4)]
    threads += [threading.Thread(target=step, args=("solo", True))]
    threads += [threading.Thread(target=step, args=(f"t{i}", False)) for i in range(4)]
    for thread in threads:
        thread.start()
        time.sleep(0.005)
    for thread in threads:
        thread.join(timeout=5)
    assert any(len(seen) > 1 for seen in overlaps)  # shared steps did overlap
    assert ("solo",) in overlaps  # the solo step saw nobody else
    assert all("solo" not in seen or seen == ("solo",) for seen in overlaps)


def test_a_waiting_solo_step_is_served_before_new_shared_ones() -> None:
    gate = SoloGate()
    order: list[str] = []
    release = threading.Event()

    def first() -> None:
        with gate.shared():
            release.wait(5)
            order.append("first")

    def solo() -> None:
        with gate.alone():
            order.append("solo")

    def late() -> None:
        with gate.shared():
            order.append("late")

    runners = [threading.Thread(target=first), threading.Thread(target=solo)]
    for runner in runners:
        runner.start()
        time.sleep(0.05)
    runners.append(threading.Thread(target=late))
    runners[-1].start()
    time.sleep(0.05)
    release.set()
    for runner in runners:
        runner.join(timeout=5)
    assert order == ["first", "solo", "late"]
