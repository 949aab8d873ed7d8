"""A workflow's budget (workflows/budget.py): the gate's answers, what they grant, when a bound
is reached; and the handler that parks an engine step once it is (actors/handlers.py, over
``MemoryStepRecords``; the ledger's queries run in tests/integration/test_workflow_cost.py)."""

from __future__ import annotations

import re
import uuid
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.agents import FakeEngine
from actors.handlers import BUDGET_DELAY, HandlerContext, Steps
from store.cost import BudgetState, CostLine
from store.memory import ManualClock, MemoryJobRepository
from store.memory_records import MemoryStepRecords
from workflows.budget import (
    ANSWER_PATTERN,
    STOP,
    Budget,
    BudgetError,
    Spend,
    budget_of,
    granted,
    parse_answer,
    reached,
    with_budget,
)
from workflows.gates import BUDGET_EXHAUSTED, ENGINE_GATES, Grant
from workflows.queue import EnqueueRequest, Job
from workflows.steps import Defer, Park, Success

P = "shop"

dollars = st.decimals(min_value="0.01", max_value="99999", places=2).map(str)
tokens = st.integers(min_value=1, max_value=10**12).map(str)


@given(st.one_of(dollars.map(lambda d: f"{d} dollars"), tokens.map(lambda t: f"{t} tokens")))
def test_every_grant_answer_is_accepted_and_grants_what_it_names(answer: str) -> None:
    grant = parse_answer(answer)
    assert isinstance(grant, Spend)
    amount, unit = answer.split(" ")
    assert (grant.dollars if unit == "dollars" else grant.tokens) == pytest.approx(float(amount))
    assert ENGINE_GATES.problem(BUDGET_EXHAUSTED.name, answer) is None


@given(st.text(max_size=30))
def test_the_gate_refuses_exactly_what_parse_answer_refuses(answer: str) -> None:
    """The gate's schema (every answer path) and the parser agree on every string."""
    problem = ENGINE_GATES.problem(BUDGET_EXHAUSTED.name, answer)
    parsed = parse_answer(answer)
    assert (problem is None) == (parsed is not None)
    assert (re.fullmatch(ANSWER_PATTERN, answer) is not None) == (parsed is not None)


@pytest.mark.parametrize(
    "answer", ["0 dollars", "0.00 dollars", "-5 dollars", "5", "5 tokens ", "1.5 tokens", "Stop"]
)
def test_a_bad_answer_is_a_one_line_refusal_naming_the_answers(answer: str) -> None:
    problem = ENGINE_GATES.problem(BUDGET_EXHAUSTED.name, answer)
    assert problem is not None and "\n" not in problem
    assert "'<amount> dollars'" in problem and "'stop'" in problem


def test_stop_grants_nothing_and_the_gate_refunds_the_parked_claim() -> None:
    assert parse_answer("stop") == STOP
    assert granted(["stop", "2 dollars", "not an answer", "0.5 dollars", "100 tokens"]) == Spend(
        2.5, 100
    )
    assert ENGINE_GATES[BUDGET_EXHAUSTED.name].grant is Grant.REFUND


@given(
    cap=st.floats(min_value=0.01, max_value=1e6),
    spent=st.floats(min_value=0, max_value=2e6),
    grant=st.floats(min_value=0, max_value=1e6),
)
def test_dollars_are_reached_once_the_spend_reaches_the_budget_plus_the_grants(
    cap: float, spent: float, grant: float
) -> None:
    at = reached(Budget(dollars=cap), Spend(dollars=spent), Spend(dollars=grant))
    if spent >= cap + grant:
        assert at is not None and at.bound == "dollars" and at.limit == cap + grant
    elif spent < cap + grant - 1e-6:
        assert at is None


@given(cap=st.integers(1, 10**9), spent=st.integers(0, 2 * 10**9), grant=st.integers(0, 10**9))
def test_tokens_are_reached_exactly_at_the_budget_plus_the_grants(
    cap: int, spent: int, grant: int
) -> None:
    at = reached(Budget(tokens=cap), Spend(tokens=spent), Spend(tokens=grant))
    assert (at is not None) == (spent >= cap + grant)
    assert reached(None, Spend(1e9, 10**12), Spend()) is None


def test_a_budget_is_positive_and_travels_in_the_input() -> None:
    bads: list[Any] = [
        {"dollars": 0},
        {"dollars": -1},
        {"tokens": 1.5},
        {"dollars": "5"},
        {"x": 1},
        [],
    ]
    for bad in bads:
        with pytest.raises(BudgetError):
            Budget.from_json(bad)
    given_input = with_budget({"project": P}, Budget(dollars=5, tokens=1000))
    assert given_input == {"project": P, "budget": {"dollars": 5.0, "tokens": 1000}}
    assert budget_of(given_input) == Budget(5.0, 1000)
    assert with_budget({"project": P}, None) == {"project": P}
    assert budget_of({"budget": {"tokens": 1000.0}}) == Budget(tokens=1000)  # as jsonb keeps it


def test_a_line_with_no_dollars_says_no_price_never_zero() -> None:
    assert CostLine(events=2, input_tokens=10, output_tokens=5).price == "no price"
    assert CostLine(events=2, dollars=1.5, priced=2).price == "$1.50"
    assert CostLine(events=3, dollars=0.0, priced=1).price == "$0.00 + 2 runs with no price"


# -- the handler ------------------------------------------------------------------------------


@pytest.fixture
def jobs() -> MemoryJobRepository:
    return MemoryJobRepository(clock=ManualClock())


@pytest.fixture
def records(jobs: MemoryJobRepository) -> MemoryStepRecords:
    return MemoryStepRecords(jobs)


def claimed(jobs: MemoryJobRepository, kind: str, **kw: Any) -> Job:
    payload = {"input": {"engine": {"name": "fake"}, "cycle": 0, "phase": "build"}}
    request = EnqueueRequest(
        project_id=P, kind=kind, subject="s", payload=payload, workflow_id=uuid.uuid4(), step=kind
    )
    jobs.enqueue(request)
    [job] = jobs.claim(P, owner="worker", kinds=[kind])
    return job


def handlers(tmp_path: Path, records: MemoryStepRecords, fake: FakeEngine) -> Steps:
    return Steps(
        HandlerContext(pool=None, workspace=tmp_path, engines={"fake": fake}, records=records)
    )


def test_an_engine_step_parks_once_the_workflow_spent_its_budget(
    tmp_path: Path, jobs: MemoryJobRepository, records: MemoryStepRecords
) -> None:
    fake = FakeEngine()
    job = claimed(jobs, "design.research")
    records.budgets[job.id] = BudgetState(Budget(dollars=3), Spend(dollars=3.0))
    outcome = handlers(tmp_path, records, fake).run(job)
    assert isinstance(outcome, Park), outcome
    assert outcome.gate.kind == BUDGET_EXHAUSTED.name
    assert outcome.gate.context["grant"] == "dollars"
    assert (outcome.gate.context["spent"], outcome.gate.context["limit"]) == (3.0, 3.0)
    assert "stop" in outcome.gate.prompt
    assert fake.tasks == []  # it never ran


def test_below_the_budget_or_with_a_grant_the_step_runs(
    tmp_path: Path, jobs: MemoryJobRepository, records: MemoryStepRecords
) -> None:
    fake = FakeEngine()
    job = claimed(jobs, "design.research")
    records.budgets[job.id] = BudgetState(Budget(dollars=3, tokens=100), Spend(2.99, 99))
    assert isinstance(handlers(tmp_path, records, fake).run(job), Success)
    records.budgets[job.id] = BudgetState(Budget(dollars=3), Spend(dollars=4), Spend(dollars=2))
    assert isinstance(handlers(tmp_path, records, fake).run(job), Success)
    assert len(fake.tasks) == 2


def test_while_a_budget_gate_is_open_the_next_engine_step_waits_behind_it(
    tmp_path: Path, jobs: MemoryJobRepository, records: MemoryStepRecords
) -> None:
    fake = FakeEngine()
    job = claimed(jobs, "design.research")
    gate = uuid.uuid4()
    records.budgets[job.id] = BudgetState(Budget(tokens=10), Spend(tokens=12), open_gate=gate)
    outcome = handlers(tmp_path, records, fake).run(job)
    assert isinstance(outcome, Defer) and not outcome.capacity, outcome
    assert outcome.delay == BUDGET_DELAY and str(gate) in outcome.reason
    assert fake.tasks == []
