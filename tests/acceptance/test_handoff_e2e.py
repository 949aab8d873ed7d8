"""Handoff end to end: `vibey worker` on RabbitMQ and PostgreSQL, driven through the `vibey`
command. An engine that runs out of credits mid-BUILD hands its item to the next engine
through the no-loss gate; one whose briefs keep failing escalates to full_transcript, then to
a person, whose `retry` starts a new round and whose `cancel` leaves the item waiting for the
outgoing engine's capacity."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import psycopg

from tests.acceptance.stack import REPO, Stack, cooperative

HANDOFF_SCRIPT = REPO / "ops" / "demo" / "handoff.toml"

FAILING = """
[build]
work_items = [{{ id = "api", title = "HTTP API" }}]

[engines]
roster = [{{ id = "{a}", weight = 2 }}, {{ id = "{b}", weight = 1 }}]

[capacity]
credits_exhausted = [{{ engine = "{a}", item = "api", attempt = 1 }}]

[handoff]
failing_briefs = 5   # four briefs and a full-transcript one fail; a retry's first passes
"""


def sql(pg_url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return conn.execute(query.encode(), params).fetchall()


def ledger(e2e: Stack, project: str) -> list[dict[str, Any]]:
    assert "digests match" in e2e.vibey("ledger", "verify", project).stdout
    events: list[dict[str, Any]] = e2e.every("ledger", "show", project)  # not a page
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    return events


def of_kind(events: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [e["payload"] for e in events if e["kind"] == kind]


def test_an_engine_out_of_credits_mid_build_hands_off_and_the_workflow_completes(
    e2e: Stack, pg_url: str
) -> None:
    e2e.start_worker()
    e2e.vibey("workflow", "start", "relay", "--script", str(HANDOFF_SCRIPT))
    final = e2e.drive(["relay"])["relay"]["workflow"]
    assert (final["status"], final["completion_mode"]) == ("completed", "local")
    events = ledger(e2e, "relay")
    [rejected] = of_kind(events, "CapacityRejected")
    assert (rejected["engine"], rejected["state"]) == ("alpha", "CreditsExhausted")
    assert "resets_at" not in rejected
    [initiated] = of_kind(events, "HandoffInitiated")
    [accepted] = of_kind(events, "HandoffAccepted")
    assert (initiated["from"], initiated["to"]) == ("alpha", "beta")
    assert (accepted["from"], accepted["to"]) == ("alpha", "beta")
    assert (accepted["mode"], accepted["briefs"]) == ("brief", 3)  # two failed the gate
    seqs = {e["kind"]: e["seq"] for e in events if e["kind"].startswith(("Capacity", "Handoff"))}
    assert seqs["CapacityRejected"] < seqs["HandoffInitiated"] < seqs["HandoffAccepted"]
    # Both items were implemented and integrated; alpha's circuit is open, with no reset time.
    implemented = sql(
        pg_url,
        "SELECT payload->'input'->'item'->>'id' AS item, state::text, engine_id FROM job "
        "WHERE kind = 'build.implement' ORDER BY item",
    )
    assert implemented == [("api", "succeeded", "beta"), ("ui", "succeeded", "beta")]
    health = sql(
        pg_url,
        "SELECT engine_id, capacity_state, resets_at, circuit_state FROM engine_health "
        "ORDER BY engine_id",
    )
    assert health == [
        ("alpha", "CreditsExhausted", None, "open"),
        ("beta", "Available", None, "closed"),
    ]
    worktree = e2e.workspace / "relay" / "worktrees" / f"c0-{accepted['item']}"
    assert (worktree / ".vibey" / "handoff" / "ledger.jsonl").is_file()


def _wait_for(
    predicate: Any, what: str, e2e: Stack, timeout: float = 60, state: Any = None
) -> None:
    """Wait for ``predicate``; on a timeout, say what ``state`` reads then and the worker's log."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    seen = f" (found {state()})" if state is not None else ""
    raise AssertionError(f"{what} within {timeout}s{seen}\n{e2e.worker_log()}")


def test_briefs_that_keep_failing_escalate_to_full_transcript_then_to_a_person(
    e2e: Stack, pg_url: str, tmp_path: Path
) -> None:
    # Two projects, each on engines of its own (engine_health is shared by every project).
    scripts = {}
    for project, (a, b) in {"retried": ("alpha", "beta"), "held": ("gamma", "delta")}.items():
        scripts[project] = tmp_path / f"{project}.toml"
        scripts[project].write_text(FAILING.format(a=a, b=b))
    e2e.start_worker()
    for project, path in scripts.items():
        e2e.vibey("workflow", "start", project, "--script", str(path))

    def until_handoff_gate(gate: Any) -> str | None:
        return None if gate["kind"] == "handoff" else cooperative(gate)

    e2e.drive(list(scripts), until_handoff_gate)
    gates = {}
    for project, (outgoing, incoming) in (
        ("retried", ("alpha", "beta")),
        ("held", ("gamma", "delta")),
    ):
        [gate] = [g for g in e2e.open_gates(project) if g["kind"] == "handoff"]
        gates[project] = gate
        assert gate["answers"] == ["retry", "cancel"]
        context = gate["context"]
        assert (context["outgoing"], context["incoming"]) == (outgoing, incoming)
        assert [a["mode"] for a in context["attempts"]] == ["brief"] * 4 + ["full_transcript"]
        assert all(a["failed"] for a in context["attempts"])
        assert context["mode"] == "full_transcript" and context["failed_rules"] == ["R6"]
        assert e2e.status(project)["workflow"]["status"] == "running"
        events = ledger(e2e, project)
        assert [p["engine"] for p in of_kind(events, "CapacityRejected")] == [outgoing]
        assert len(of_kind(events, "HandoffInitiated")) == 1
        assert of_kind(events, "HandoffAccepted") == []
    parked = "SELECT state::text FROM job WHERE project_id = %s AND kind = 'build.implement'"
    assert sql(pg_url, parked, "retried") == [("awaiting_human",)]

    # retry: a new round of briefs; its first passes, beta finishes the item.
    e2e.vibey("gate", "answer", gates["retried"]["id"], "retry", "--by", "e2e")
    final = e2e.drive(["retried"])["retried"]["workflow"]
    assert final["status"] == "completed"
    [accepted] = of_kind(ledger(e2e, "retried"), "HandoffAccepted")
    assert (accepted["to"], accepted["mode"], accepted["rounds"], accepted["briefs"]) == (
        "beta",
        "brief",
        2,
        6,
    )

    # cancel: no handoff; the item stays with gamma. It waits for gamma's capacity (credits
    # have no reset time) until gamma's backoff probe, a minute after its credits ran out; on a
    # slow box that probe may come due before the answer, and the item then runs as the probe.
    e2e.vibey("gate", "answer", gates["held"]["id"], "cancel", "--by", "e2e")
    waiting = (
        "SELECT state::text, last_error, engine_id FROM job WHERE project_id = 'held' "
        "AND kind = 'build.implement'"
    )
    _wait_for(
        lambda: sql(pg_url, waiting)[0][0] in ("awaiting_capacity", "succeeded"),
        "the held item waits for capacity (or runs as gamma's probe)",
        e2e,
        timeout=180,  # the answer, a step's claim and gamma's refusal: minutes on a loaded box
        state=lambda: sql(pg_url, waiting),
    )
    [(state, reason, engine)] = sql(pg_url, waiting)
    assert of_kind(ledger(e2e, "held"), "HandoffAccepted") == []
    if state == "succeeded":  # gamma's probe came due first: the item ran on gamma, no handoff
        assert engine == "gamma", (state, reason, engine)
        return
    assert "cancelled by e2e" in reason and "gamma" in reason
    assert e2e.status("held")["workflow"]["status"] == "running"
    e2e.vibey("workflow", "cancel", "held", "--by", "e2e")
    assert e2e.status("held")["workflow"]["status"] == "cancelled"
    assert sql(pg_url, waiting)[0][0] == "cancelled"
