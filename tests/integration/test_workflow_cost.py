"""A workflow's cost and budget on the real PostgreSQL: ``Client.cost`` (store/cost.py) against
the ledger's BudgetSpent events summed here independently, the `vibey workflow cost` command
and the console's workflow page showing the same figures, and the budget_exhausted gate a
handler opens, its refusals, its grants and its ``stop``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from starlette.testclient import TestClient

from actors.handlers import HandlerContext, build_handlers
from store.ledger import Ledger
from vibey.client import AnswerRefused, Client
from vibey.console.app import create_app
from vibey.console.data import StoreData
from vibey.settings import ConsoleSettings, load_settings
from workflows.budget import Budget
from workflows.engine import Status
from workflows.gates import BUDGET_EXHAUSTED
from workflows.ledger import EventKind, NewEvent
from workflows.steps import Defer, Park

P = "costly"
SCRIPTED = {"name": "scripted", "script": {}}


def env(pg_url: str, **extra: str) -> dict[str, str]:
    return {"VIBEY_PG_URL": pg_url, "VIBEY_QUEUE_BACKEND": "postgres", **extra}


@pytest.fixture
def client(pg_url: str, tmp_path: Path) -> Iterator[Client]:
    with Client(load_settings(env(pg_url), tmp_path), connect_relay=False) as running:
        yield running


def cli(pg_url: str, cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    environ = {
        k: v for k, v in __import__("os").environ.items() if not k.startswith("VIBEY_")
    } | env(pg_url)
    return subprocess.run(
        [sys.executable, "-m", "vibey", *args],
        cwd=cwd,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def jobs_of(pg_url: str, workflow: UUID) -> list[tuple[UUID, str, str]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT id, step, payload->'input'->>'phase' FROM job WHERE workflow_id = %s "
            "ORDER BY created_at, step",
            (workflow,),
        ).fetchall()
    return [(r[0], r[1], r[2]) for r in rows]


def spend(
    client: Client, job: UUID | None, workflow: UUID, project: str = P, **payload: Any
) -> None:
    Ledger(client._pool).append(
        project,
        [NewEvent(EventKind.BudgetSpent, payload)],
        job_id=job,
        workflow_id=workflow,
    )


def independent_sums(client: Client, workflow: UUID) -> dict[str, Any]:
    """The workflow's BudgetSpent events read back one by one and added up here."""
    events = [
        e
        for e in Ledger(client._pool).read(P)
        if e.kind is EventKind.BudgetSpent and e.workflow_id == workflow
    ]
    by_engine: dict[str, dict[str, Any]] = {}
    for e in events:
        line = by_engine.setdefault(e.payload["engine"], {"tokens": 0, "dollars": None})
        line["tokens"] += e.payload.get("input_tokens", 0) + e.payload.get("output_tokens", 0)
        if "dollars" in e.payload:
            line["dollars"] = (line["dollars"] or 0) + e.payload["dollars"]
    return {
        "events": len(events),
        "turns": sum(e.payload.get("turns", 0) for e in events),
        "tokens": sum(line["tokens"] for line in by_engine.values()),
        "dollars": sum(line["dollars"] or 0 for line in by_engine.values()),
        "engines": by_engine,
    }


def test_the_cost_is_the_ledgers_by_engine_phase_and_step_in_client_cli_and_console(
    client: Client, pg_url: str, tmp_path: Path
) -> None:
    run = client.start(P, input={"project": P, "engine": SCRIPTED}, budget=Budget(dollars=2))
    assert run.input["budget"] == {"dollars": 2.0}
    [(job, step, phase), *_] = jobs_of(pg_url, run.id)
    spend(
        client,
        job,
        run.id,
        engine="claude",
        turns=2,
        input_tokens=1000,
        output_tokens=200,
        dollars=0.75,
    )
    spend(client, job, run.id, engine="codex", turns=1, input_tokens=5000, output_tokens=700)
    spend(
        client,
        None,
        run.id,
        engine="claude",
        turns=1,
        input_tokens=10,
        output_tokens=5,
        dollars=0.5,
    )
    other = client.start("elsewhere", input={"project": "elsewhere", "engine": SCRIPTED})
    spend(client, None, other.id, "elsewhere", engine="claude", turns=9, dollars=99.0)

    cost = client.cost(P)
    want = independent_sums(client, run.id)
    assert (cost.total.events, cost.total.turns) == (want["events"], want["turns"]) == (3, 4)
    assert cost.total.tokens == want["tokens"] == 6915
    assert cost.total.dollars == pytest.approx(want["dollars"]) == 1.25
    engines = {line.engine: line for line in cost.engines}
    assert engines["claude"].dollars == pytest.approx(want["engines"]["claude"]["dollars"])
    assert engines["codex"].dollars is None and want["engines"]["codex"]["dollars"] is None
    assert engines["codex"].price == "no price" and engines["codex"].tokens == 5700
    assert cost.total.price == "$1.25 + 1 run with no price"
    phases = {line.phase: line for line in cost.phases}
    assert set(phases) == {phase, None}  # None: the event of no job
    assert phases[phase].tokens == 6900
    assert [(line.phase, line.step) for line in cost.steps if line.step] == [(phase, step)]
    # Its budget: $1.25 of $2 spent, not reached yet.
    assert cost.budget.budget == Budget(dollars=2)
    assert cost.budget.spent.dollars == pytest.approx(1.25) and cost.budget.reached is None

    shown = cli(pg_url, tmp_path, "workflow", "cost", P, "--json")
    assert shown.returncode == 0, shown.stderr
    figures = json.loads(shown.stdout)
    assert figures == json.loads(json.dumps(cost.to_json()))
    assert figures["total"]["dollars"] == pytest.approx(want["dollars"])
    assert figures["total"]["tokens"] == want["tokens"]
    text = cli(pg_url, tmp_path, "workflow", "cost", P)
    assert text.returncode == 0, text.stderr
    assert "$1.25 + 1 run with no price · 6,915 tokens · 4 turns" in text.stdout
    assert "no price" in next(
        ln for ln in text.stdout.splitlines() if ln.strip().startswith("codex")
    )
    assert "budget $1.25 of $2.00" in text.stdout

    data = StoreData(settings=client.settings, client=client, pool=client._pool)
    detail = data.workflow(run.id)
    assert detail is not None and detail.cost == cost
    page = console_page(data, run.id)
    total = re.search(r'<p id="cost-total" ([^>]*)>', page, re.DOTALL)
    assert total is not None, page
    shown_total = dict(re.findall(r'data-([a-z]+)="([^"]*)"', total.group(1)))
    assert float(shown_total["dollars"]) == pytest.approx(want["dollars"])
    assert int(shown_total["tokens"]) == want["tokens"]
    assert float(shown_total["turns"]) == want["turns"]
    assert "$1.25 + 1 run with no price" in page
    codex = re.search(r'<tr class="cost-engine">.*?codex.*?</tr>', page, re.DOTALL)
    assert codex is not None and "no price" in codex.group(0) and "$0" not in codex.group(0)
    assert "budget $1.25 of $2.00" in page


def console_page(data: StoreData, workflow: UUID) -> str:
    """The console's workflow page on the real store, as an anonymous reader."""
    app = create_app(settings=ConsoleSettings(anonymous_read=True), data=data)
    with TestClient(app) as web:
        response = web.get(f"/workflows/{workflow}")
    assert response.status_code == 200, response.text
    return response.text


def test_an_unknown_project_and_a_bad_budget_are_one_line_errors(
    pg_url: str, tmp_path: Path
) -> None:
    missing = cli(pg_url, tmp_path, "workflow", "cost", "nobody")
    assert missing.returncode == 1 and missing.stdout == ""
    assert missing.stderr.count("\n") == 1 and "nobody" in missing.stderr
    bad = cli(pg_url, tmp_path, "workflow", "start", "p1", "--budget-dollars", "-3")
    assert bad.returncode == 2 and bad.stdout == "", bad.stderr
    assert bad.stderr.count("\n") == 1 and "--budget-dollars" in bad.stderr
    nothing = cli(pg_url, tmp_path, "workflow", "list", "--json")
    assert json.loads(nothing.stdout)["workflows"] == []  # nothing was started
    started = cli(pg_url, tmp_path, "workflow", "start", "p1", "--budget-tokens", "5000", "--json")
    assert started.returncode == 0, started.stderr
    figures = json.loads(cli(pg_url, tmp_path, "workflow", "cost", "p1", "--json").stdout)
    assert figures["budget"]["budget"] == {"tokens": 5000}
    assert figures["total"] == {**figures["total"], "events": 0, "dollars": None, "tokens": 0}


def test_the_settings_default_budget_applies_when_start_gives_none(
    pg_url: str, tmp_path: Path
) -> None:
    settings = load_settings(env(pg_url, VIBEY_WORKFLOW_BUDGET_DOLLARS="7.5"), tmp_path)
    with Client(settings, connect_relay=False) as running:
        run = running.start(P, input={"project": P, "engine": SCRIPTED})
        assert run.input["budget"] == {"dollars": 7.5}
        given = running.start(
            "q", input={"project": "q", "engine": SCRIPTED}, budget=Budget(tokens=9)
        )
        assert given.input["budget"] == {"tokens": 9}
        batch = running.start_many(
            [
                ("r1", {"project": "r1", "engine": SCRIPTED}),
                ("r2", {"project": "r2", "engine": SCRIPTED, "budget": {"tokens": 5}}),
            ]
        )
        assert [w.input["budget"] for w in batch] == [{"dollars": 7.5}, {"tokens": 5}]


def park_over_budget(client: Client, pg_url: str, tmp_path: Path) -> tuple[UUID, Any]:
    """A workflow with a $1 budget whose ledger says $1 spent: its first step's handler parks it."""
    run = client.start(P, input={"project": P, "engine": SCRIPTED}, budget=Budget(dollars=1))
    [(job_id, _, _), *_] = jobs_of(pg_url, run.id)
    spend(client, job_id, run.id, engine="scripted", turns=1, dollars=1.0)
    [job] = client.jobs.claim(P, owner="test")
    handlers = build_handlers(HandlerContext(pool=client._pool, workspace=tmp_path))
    outcome = handlers[job.kind](job)
    assert isinstance(outcome, Park), outcome
    assert outcome.gate.kind == BUDGET_EXHAUSTED.name
    assert client.jobs.park(job.lease, outcome.gate).applied
    again = handlers[job.kind](job)  # the next engine step waits behind the open gate
    assert isinstance(again, Defer) and "budget gate" in again.reason
    [gate] = client.list_gates(P)
    return run.id, gate


def test_a_budget_gate_refuses_a_bad_answer_and_a_grant_lets_the_step_run(
    client: Client, pg_url: str, tmp_path: Path
) -> None:
    workflow, gate = park_over_budget(client, pg_url, tmp_path)
    assert gate.kind == BUDGET_EXHAUSTED.name and gate.context["spent"] == 1.0
    with pytest.raises(AnswerRefused, match="'<amount> dollars'") as refused:
        client.answer(gate.id, "lots", by="test")
    assert "\n" not in str(refused.value)
    line = cli(pg_url, tmp_path, "gate", "answer", str(gate.id), "0 dollars")
    assert line.returncode == 2 and line.stdout == "" and line.stderr.count("\n") == 1
    assert line.stderr.count("'<amount> dollars'") == 1, line.stderr  # said once
    client.answer(gate.id, "2.50 dollars", by="test")
    state = client.cost(workflow).budget
    assert state.granted.dollars == 2.5 and state.reached is None and state.open_gate is None
    assert client.status(workflow).status is Status.RUNNING
    [job] = client.jobs.claim(P, owner="test")  # re-readied by the answer
    handlers = build_handlers(HandlerContext(pool=client._pool, workspace=tmp_path))
    assert not isinstance(handlers[job.kind](job), Park | Defer)


def test_stop_abandons_the_workflow(client: Client, pg_url: str, tmp_path: Path) -> None:
    workflow, gate = park_over_budget(client, pg_url, tmp_path)
    client.answer(gate.id, "stop", by="ann")
    done = client.status(workflow)
    assert done.status is Status.CANCELLED and "budget" in (done.reason or "")
    with psycopg.connect(pg_url, autocommit=True) as conn:
        states = conn.execute(
            "SELECT DISTINCT state::text FROM job WHERE workflow_id = %s", (workflow,)
        ).fetchall()
    assert {s for (s,) in states} <= {"cancelled", "succeeded"}, states
    assert client.list_gates(P) == []
    assert uuid.UUID(str(gate.id))


spent_event = st.fixed_dictionaries(
    {
        "engine": st.sampled_from(["claude", "codex", "gemini"]),
        "turns": st.integers(0, 5),
        "input_tokens": st.integers(0, 10**6),
        "output_tokens": st.integers(0, 10**5),
    },
    optional={"dollars": st.decimals(min_value=0, max_value=50, places=2).map(float)},
)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(payloads=st.lists(spent_event, max_size=12), on_job=st.lists(st.booleans(), min_size=12))
def test_the_cost_always_adds_up_to_the_ledgers_events(
    client: Client, pg_url: str, payloads: list[dict[str, Any]], on_job: list[bool]
) -> None:
    project = f"p{uuid.uuid4().hex[:12]}"
    run = client.start(project, input={"project": project, "engine": SCRIPTED}, budget=Budget(1))
    [(job, _, phase), *_] = jobs_of(pg_url, run.id)
    for payload, attached in zip(payloads, on_job, strict=False):
        spend(client, job if attached else None, run.id, project, **payload)
    cost = client.cost(run.id)
    tokens = sum(p["input_tokens"] + p["output_tokens"] for p in payloads)
    priced = [p["dollars"] for p in payloads if "dollars" in p]
    assert (cost.total.events, cost.total.tokens) == (len(payloads), tokens)
    assert cost.total.turns == sum(p["turns"] for p in payloads)
    assert cost.total.priced == len(priced)
    assert cost.total.dollars == (pytest.approx(sum(priced)) if priced else None)
    for line in cost.engines:
        mine = [p for p in payloads if p["engine"] == line.engine]
        dollars = [p["dollars"] for p in mine if "dollars" in p]
        assert line.events == len(mine) and line.unpriced == len(mine) - len(dollars)
        assert line.dollars == (pytest.approx(sum(dollars)) if dollars else None)
    assert sum(line.events for line in cost.engines) == len(payloads)
    assert sum(line.tokens for line in cost.phases) == sum(line.tokens for line in cost.steps)
    assert {line.phase for line in cost.phases} <= {phase, None}
    assert cost.budget.spent.tokens == tokens
    assert cost.budget.spent.dollars == pytest.approx(sum(priced))
