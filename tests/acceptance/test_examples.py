"""The example workflows (examples/) end to end on the real stack: a `vibey worker` running
them, driven from Python through ``vibey.Client`` and from the `vibey` command."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.acceptance.stack import REPO, Stack, declare_topology, stack
from tests.amqp_fixtures import Amqp
from vibey.client import AnswerRefused, Client, WaitTimeout, WorkflowFailed
from vibey.settings import load_settings

EXAMPLES = {"VIBEY_WORKFLOW_DEFINITIONS": "examples:DEFINITIONS", "PYTHONPATH": str(REPO)}


@pytest.fixture
def e2e(pg_url: str, amqp: Amqp, tmp_path: Path) -> Iterator[Stack]:
    declare_topology(pg_url, amqp)  # cleaned up by the amqp fixture
    with stack(pg_url, amqp.url, amqp.prefix, tmp_path) as running:
        running.extra_env = dict(EXAMPLES)
        running.start_worker("--handlers", "examples:HANDLERS", threads=4)
        yield running


@pytest.fixture
def client(e2e: Stack) -> Iterator[Client]:
    env = {k: v for k, v in e2e.env.items() if k.startswith("VIBEY_")}
    with Client(load_settings(env, e2e.workspace)) as running:
        yield running


def one_gate(client: Client, project: str, timeout: float = 30) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        gates = client.list_gates(project)
        if gates:
            return str(gates[0].id)
        time.sleep(0.05)
    raise AssertionError(f"no gate opened for {project}")


def test_an_approved_order_is_charged(client: Client, e2e: Stack) -> None:
    run = client.start("shop-1", "orders", {"order": "A-1", "amount": 120})
    gate = one_gate(client, "shop-1")
    with pytest.raises(AnswerRefused, match="valid: approve, reject"):
        client.answer(gate, "maybe", by="test")  # the gate kind's validator
    client.answer(gate, "approve", by="ops")
    done = client.wait(run.id, timeout=30)
    assert (done.completion_mode, done.state["decision"], done.state["by"]) == (
        "approved",
        "approved",
        "ops",
    )
    steps = [e.event.get("step") for e in client.history(run.id) if e.event.get("step")]
    assert steps == ["reserve", "charge"]
    assert done.phase == ""  # a definition without phases


def test_a_rejected_order_is_compensated(client: Client) -> None:
    run = client.start("shop-2", "orders", {"order": "B-2", "amount": 5})
    client.answer(one_gate(client, "shop-2"), "reject", by="ops")
    done = client.wait(run.id, timeout=30)
    assert (done.completion_mode, done.state["stage"]) == ("rejected", "done")
    steps = [e.event.get("step") for e in client.history(run.id) if e.event.get("step")]
    assert steps == ["reserve", "release"]


def test_the_deadline_releases_an_unanswered_order(client: Client) -> None:
    run = client.start("shop-3", "orders-quick", {"order": "C-3", "amount": 7})
    with pytest.raises(WaitTimeout):
        client.wait(run.id, timeout=0.5)  # waiting at its gate
    done = client.wait(run.id, timeout=30)  # the 2 s deadline fires, the stock is released
    assert (done.completion_mode, done.state["by"]) == ("expired", "deadline")


def test_a_failed_charge_releases_the_stock_then_fails(client: Client) -> None:
    run = client.start("shop-4", "orders", {"order": "declined-4", "amount": 9})
    client.answer(one_gate(client, "shop-4"), "approve", by="ops")
    with pytest.raises(WorkflowFailed, match="the charge failed"):
        client.wait(run.id, timeout=60)
    steps = [e.event.get("step") for e in client.history(run.id) if e.event.get("step")]
    assert steps[-1] == "release"


def test_fan_out_then_fan_in(client: Client) -> None:
    run = client.start("fan-1", "fanout", {"items": [1, 2, 3, 4, 5, 6]})
    done = client.wait(run.id, timeout=30)
    assert done.state["total"] == 91
    assert len(done.state["values"]) == 6


def test_the_cli_drives_an_example_too(e2e: Stack) -> None:
    started = e2e.json(
        "workflow",
        "start",
        "shop-9",
        "--definition",
        "orders",
        "--input",
        '{"order": "Z", "amount": 1}',
    )
    assert started["created"] is True
    for _ in range(300):
        gates = e2e.open_gates("shop-9")
        if gates:
            break
        time.sleep(0.1)
    assert gates[0]["kind"] == "order_approval"
    e2e.vibey("gate", "answer", gates[0]["id"], "approve")
    for _ in range(300):
        status = e2e.status("shop-9")["workflow"]
        if status["status"] == "completed":
            break
        time.sleep(0.1)
    assert status["status"] == "completed"
    bad = e2e.vibey(
        "workflow", "start", "shop-10", "--definition", "orders", "--input", "[1]", check=False
    )
    assert bad.returncode == 2 and "JSON object" in bad.stderr
