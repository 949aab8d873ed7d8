"""A workflow budget end to end on the real stack (`vibey worker` on RabbitMQ and PostgreSQL,
driven through the `vibey` command): the scripted engine reporting $1 a turn, and the fake
codex CLI reporting tokens and no dollars.

* with ``--budget-dollars 3`` the workflow parks at a budget_exhausted gate once the ledger's
  spend reaches $3; nothing runs while it waits; a bad answer is refused in one line; granting
  more runs it to DONE, and `vibey workflow cost` shows the ledger's totals;
* ``stop`` abandons it (cancelled);
* on codex (tokens only) ``--budget-tokens`` parks on tokens, and the cost says "no price".
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.stack import Stack, cooperative, declare_topology, stack
from tests.agents.fake_cli import SOURCE, install
from tests.amqp_fixtures import Amqp

BUDGET = "budget_exhausted"
SCRIPT = """
[build]
work_items = [{ id = "api", title = "HTTP API" }, { id = "ui", title = "Web page" }]

[budget]
dollars_per_turn = 1.0
"""


@pytest.fixture
def e2e(pg_url: str, amqp: Amqp, tmp_path: Path) -> Iterator[Stack]:
    declare_topology(pg_url, amqp)  # cleaned up by the amqp fixture
    with stack(pg_url, amqp.url, amqp.prefix, tmp_path) as running:
        yield running


def ledger_spend(pg_url: str, project: str) -> tuple[int, float, int]:
    """The project's workflow's BudgetSpent events, summed here from the rows: how many, the
    dollars, the tokens."""
    with psycopg.connect(pg_url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT e.payload FROM ledger_event e JOIN workflow w ON w.id = e.workflow_id "
            "WHERE w.project_id = %s AND e.kind = 'BudgetSpent'",
            (project,),
        ).fetchall()
    payloads = [row[0] for row in rows]
    dollars = sum(float(p.get("dollars", 0)) for p in payloads)
    tokens = sum(int(p.get("input_tokens", 0)) + int(p.get("output_tokens", 0)) for p in payloads)
    return len(payloads), dollars, tokens


def until_budget(gate: Any) -> str | None:
    return None if gate["kind"] == BUDGET else cooperative(gate)


def budget_gate(e2e: Stack, project: str) -> dict[str, Any]:
    [gate] = [g for g in e2e.open_gates(project) if g["kind"] == BUDGET]
    return dict(gate)


def test_a_dollar_budget_parks_the_workflow_and_more_budget_runs_it_to_done(
    e2e: Stack, pg_url: str, tmp_path: Path
) -> None:
    script = tmp_path / "script.toml"
    script.write_text(SCRIPT)
    e2e.start_worker()
    e2e.vibey("workflow", "start", "spend", "--script", str(script), "--budget-dollars", "3")
    e2e.drive(["spend"], until_budget)
    gate = budget_gate(e2e, "spend")
    events, dollars, _ = ledger_spend(pg_url, "spend")
    # It parked once the ledger's spend reached $3: the steps that crossed it ran and are
    # counted (parallel items may each finish), and the gate says what the ledger says.
    assert dollars >= 3.0 and gate["context"]["limit"] == 3.0
    assert gate["context"]["spent"] == pytest.approx(dollars)
    assert gate["context"]["grant"] == "dollars"
    time.sleep(6)  # longer than a waiting step's look-again delay: nothing ran meanwhile
    assert ledger_spend(pg_url, "spend") == (events, dollars, 0)
    assert e2e.status("spend")["workflow"]["status"] == "running"

    refused = e2e.vibey("gate", "answer", gate["id"], "more please", check=False)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "'<amount> dollars'" in refused.stderr
    e2e.vibey("gate", "answer", gate["id"], "100 dollars", "--by", "e2e")
    final = e2e.drive(["spend"])["spend"]["workflow"]
    assert (final["status"], final["completion_mode"]) == ("completed", "local")

    events, dollars, tokens = ledger_spend(pg_url, "spend")
    cost = e2e.json("workflow", "cost", "spend")
    assert (cost["total"]["events"], cost["total"]["tokens"]) == (events, tokens)
    assert cost["total"]["dollars"] == pytest.approx(dollars) and dollars > 3
    assert [e["engine"] for e in cost["engines"]] == ["scripted"]
    assert sum(p["dollars"] for p in cost["phases"]) == pytest.approx(dollars)
    assert sum(s["events"] for s in cost["steps"]) == events
    assert cost["budget"]["granted"] == {"dollars": 100.0, "tokens": 0}
    assert cost["budget"]["reached"] is None
    text = e2e.vibey("workflow", "cost", "spend").stdout
    assert f"${dollars:,.2f} · " in text.splitlines()[0]
    assert "digests match" in e2e.vibey("ledger", "verify", "spend").stdout


def test_stop_abandons_a_workflow_over_its_budget(e2e: Stack, pg_url: str, tmp_path: Path) -> None:
    script = tmp_path / "script.toml"
    script.write_text(SCRIPT)
    e2e.start_worker()
    e2e.vibey("workflow", "start", "halt", "--script", str(script), "--budget-dollars", "2")
    e2e.drive(["halt"], until_budget)
    gate = budget_gate(e2e, "halt")
    e2e.vibey("gate", "answer", gate["id"], "stop", "--by", "e2e")
    final = e2e.status("halt")["workflow"]
    assert final["status"] == "cancelled" and "budget" in final["reason"]
    assert e2e.open_gates("halt") == []
    assert ledger_spend(pg_url, "halt")[1] >= 2.0


def test_a_tokens_only_engine_is_capped_on_tokens_and_shows_no_price(
    e2e: Stack, pg_url: str, tmp_path: Path
) -> None:
    fakes = install(tmp_path / "bin")
    config = tmp_path / "vibey.toml"
    config.write_text(
        f'[engines.codex]\nadapter = "codex"\nbinary = "{fakes["codex"]}"\n'
        f'timeout_seconds = 120\nread_allow = ["{SOURCE}"]\n'
        'env = { FAKE_SCENARIO = "success" }\n'
    )
    e2e.config = config
    recorded = e2e.vibey("doctor", "--conformance", "--record", "--json", check=False)
    assert recorded.returncode == 0, recorded.stdout + recorded.stderr
    script = tmp_path / "script.toml"
    script.write_text(SCRIPT)
    e2e.start_worker()
    e2e.vibey(
        "workflow", "start", "tok", "--script", str(script), "--budget-tokens", "2000"
    )  # the fake codex reports 1,110 tokens a turn: the second turn crosses 2,000
    e2e.drive(["tok"], until_budget, deadline_s=240)
    gate = budget_gate(e2e, "tok")
    _, dollars, tokens = ledger_spend(pg_url, "tok")
    assert gate["context"]["grant"] == "tokens" and tokens >= 2000
    assert gate["context"]["spent"] == tokens and dollars == 0
    e2e.vibey("gate", "answer", gate["id"], "1000000 tokens", "--by", "e2e")
    final = e2e.drive(["tok"], deadline_s=240)["tok"]["workflow"]
    assert final["status"] == "completed", final

    events, _, tokens = ledger_spend(pg_url, "tok")
    cost = e2e.json("workflow", "cost", "tok")
    assert (cost["total"]["events"], cost["total"]["tokens"]) == (events, tokens)
    assert cost["total"]["dollars"] is None  # no price, never $0
    [codex] = cost["engines"]
    assert (codex["engine"], codex["dollars"], codex["unpriced"]) == ("codex", None, events)
    text = e2e.vibey("workflow", "cost", "tok").stdout
    assert "no price" in text.splitlines()[0] and "$0" not in text
