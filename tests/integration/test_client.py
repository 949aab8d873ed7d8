"""``vibey.Client`` for what `vibey workflow` and `vibey gate` do, on the real PostgreSQL: start
(saying whether it created the workflow), describe, steps, the inbox, one gate, an answer by id
or by the gate's name, the one refusal wording, and verify."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from uuid import uuid4

import pytest

from tests.acceptance.tiny_definition import DEFINITIONS, NAME
from vibey.client import AnswerRefused, Client
from vibey.settings import load_settings
from workflows.engine import Registry, Status
from workflows.queue import AnswerStatus


@pytest.fixture
def client(pg_url: str, tmp_path: Path) -> Iterator[Client]:
    settings = load_settings({"VIBEY_PG_URL": pg_url, "VIBEY_QUEUE_BACKEND": "postgres"}, tmp_path)
    registry = Registry(DEFINITIONS)
    with Client(settings, registry=registry, connect_relay=False) as running:
        yield running


def test_start_outcome_says_whether_it_created_the_workflow(client: Client) -> None:
    first = client.start_outcome("tiny-1", NAME)
    again = client.start_outcome("tiny-1", NAME)
    assert first.created and not again.created
    assert again.workflow.id == first.workflow.id
    assert client.start("tiny-1", NAME).id == first.workflow.id
    assert client.describe(first.workflow) == "tiny: answers so far []"
    assert [(s["step"], s["kind"]) for s in client.steps(first.workflow.id)] == [
        ("first", "design.interview")
    ]


def test_the_inbox_and_one_gate(client: Client) -> None:
    run = client.start("tiny-2", NAME)
    inbox = client.inbox("tiny-2")
    assert len(inbox) == 2 and {g.name for g, _ in inbox} == {"approve", "rating"}
    assert all(waited >= 0 for _, waited in inbox)
    assert [g.id for g in client.list_gates("tiny-2")] == [g.id for g, _ in inbox]
    approve = next(g for g, _ in inbox if g.name == "approve")
    shown = client.gate(approve.id)
    assert shown is not None and shown.workflow_id == run.id and shown.answer is None
    assert client.gate(uuid4()) is None


def test_an_answer_by_name_and_the_refusals_share_one_wording(client: Client) -> None:
    run = client.start("tiny-3", NAME)
    with pytest.raises(AnswerRefused) as not_open:
        client.answer(f"{run.id}:later", "yes", by="alice")
    assert not_open.value.outcome.status is AnswerStatus.NOT_OPEN and not not_open.value.invalid
    assert str(not_open.value).startswith(f"gate {run.id}:later is not open yet")

    rating = next(g for g in client.list_gates("tiny-3") if g.name == "rating")
    with pytest.raises(AnswerRefused) as invalid:
        client.answer(rating.id, 9, by="alice")
    assert invalid.value.invalid
    assert str(invalid.value) == (
        f"9 is not an answer to gate {rating.id} (9 is above the maximum 5); valid: an integer 1..5"
    )

    answered = client.answer(f"{run.id}:approve", "no", by="alice")
    assert (answered.name, answered.answer, answered.answered_by) == ("approve", "no", "alice")
    with pytest.raises(AnswerRefused) as twice:
        client.answer(answered.id, "yes", by="bob")
    assert twice.value.outcome.status is AnswerStatus.ALREADY_ANSWERED
    assert f"gate {answered.id} was already answered by alice at " in str(twice.value)
    assert str(twice.value).endswith("('no'); nothing changed")

    unknown = uuid4()
    with pytest.raises(AnswerRefused, match=f"^no gate {unknown}$"):
        client.answer(unknown, "yes", by="alice")
    assert client.status(run.id).status is Status.COMPLETED


def test_verify_replays_the_history(client: Client) -> None:
    run = client.start("tiny-4", NAME)
    client.answer(f"{run.id}:approve", "yes", by="alice")
    checked = client.verify(run.id)
    assert checked.ok and checked.divergence is None and checked.replayed == 2
