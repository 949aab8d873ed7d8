"""The vibey phase protocol end to end: real Dramatiq workers (`vibey worker`) on RabbitMQ and
PostgreSQL, driven through the `vibey` command in subprocesses, as a person would."""

from __future__ import annotations

import itertools
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.stack import DEMO_SCRIPT, REPO, Stack, cooperative, declare_topology, stack
from tests.amqp_fixtures import Amqp

DEPLOY_SCRIPT = REPO / "ops" / "demo" / "deploy.toml"


@pytest.fixture
def e2e(pg_url: str, amqp: Amqp, tmp_path: Path) -> Iterator[Stack]:
    declare_topology(pg_url, amqp)  # cleaned up by the amqp fixture
    with stack(pg_url, amqp.url, amqp.prefix, tmp_path) as running:
        yield running


def phases(e2e: Stack, project: str) -> list[str]:
    """The phases the workflow went through, in order, from its history."""
    seen: list[str] = []
    for entry in e2e.every("workflow", "history", project):  # every event, not a page
        for command in entry["commands"] or []:
            if command["type"] == "transition_phase":
                seen.append(command["phase"])
    return seen


def write_script(tmp: Path, text: str) -> Path:
    path = tmp / "script.toml"
    path.write_text(text)
    return path


def sql(pg_url: str, query: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        return conn.execute(query.encode()).fetchall()


def assert_each_step_committed_once(pg_url: str, project: str) -> None:
    """No double commit: one job per step name, and one recorded result per step."""
    dupes = sql(
        pg_url,
        "SELECT h.event->>'step', count(*) FROM workflow_history h JOIN workflow w "
        f"ON w.id = h.workflow_id WHERE w.project_id = '{project}' "
        "AND h.event->>'type' = 'step_succeeded' GROUP BY 1 HAVING count(*) > 1",
    )
    assert dupes == [], f"steps with more than one recorded success: {dupes}"
    unsettled = sql(
        pg_url,
        "SELECT step, state::text FROM job WHERE project_id = "
        f"'{project}' AND state NOT IN ('succeeded', 'cancelled', 'failed')",
    )
    assert unsettled == [], f"unfinished steps after the workflow finished: {unsettled}"


def test_the_demo_runs_to_done_locally(e2e: Stack, pg_url: str) -> None:
    e2e.start_worker()
    started = e2e.json("workflow", "start", "demo", "--script", str(DEMO_SCRIPT))
    assert started["created"] is True
    again = e2e.json("workflow", "start", "demo", "--script", str(DEMO_SCRIPT))
    assert again["created"] is False and again["workflow"]["id"] == started["workflow"]["id"]
    final = e2e.drive(["demo"])["demo"]["workflow"]
    assert (final["status"], final["completion_mode"]) == ("completed", "local")
    seen = phases(e2e, "demo")
    assert seen[0] == "design" and seen[-1] == "done"
    assert "build" in seen and "review" in seen and "deploy_design" not in seen
    assert e2e.json("workflow", "verify", "demo")["ok"] is True
    assert_each_step_committed_once(pg_url, "demo")
    # The ledger: written in the settles' and answers' transactions, gapless, verifiable.
    assert "digests match" in e2e.vibey("ledger", "verify", "demo").stdout
    events = e2e.every("ledger", "show", "demo")  # every event, not a page
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    kinds = {e["kind"] for e in events}
    for kind in (
        "SessionSeeded",
        "PhaseTransitioned",
        "QuestionAsked",
        "AnswerGiven",
        "TurnRequested",
        "TurnCompleted",
        "BudgetSpent",
        "FindingRaised",
        "FindingResolved",
        "ArtifactProduced",
        "VerdictRendered",
        "DeploymentDeclined",
        "VisualDesignDeclined",
        "DecisionRecorded",
    ):
        assert kind in kinds, (kind, sorted(kinds))
    asked = {e["payload"]["id"] for e in events if e["kind"] == "QuestionAsked"}
    answered = {e["payload"]["closes"] for e in events if e["kind"] == "AnswerGiven"}
    assert asked == answered, "every question asked was answered"


def test_a_run_that_opts_into_deployment_ends_deployed(e2e: Stack, pg_url: str) -> None:
    e2e.start_worker()
    e2e.vibey("workflow", "start", "shop", "--script", str(DEPLOY_SCRIPT))
    final = e2e.drive(["shop"], lambda g: cooperative(g, deploy=True, visual=True))["shop"]
    wf = final["workflow"]
    assert (wf["status"], wf["completion_mode"]) == ("completed", "deployed")
    seen = phases(e2e, "shop")
    for phase in ("visual_design", "deploy_design", "deploy_execute", "deploy_review"):
        assert phase in seen, seen
    # deploy.toml's triage says "infra" once: DEPLOY_REVIEW routes back to DEPLOY_EXECUTE.
    assert seen.count("deploy_execute") == 2, seen
    assert_each_step_committed_once(pg_url, "shop")


def test_both_loop_backs_out_of_review(e2e: Stack, tmp_path: Path) -> None:
    script = write_script(
        tmp_path,
        """
[build]
work_items = [{ id = "core", title = "Core" }]

[review]
findings = [
  [{ id = "f1", text = "Rename the button", ambiguous = false }],
  [{ id = "f2", text = "Who may delete a board?", ambiguous = true }],
  [],
]
""",
    )
    e2e.start_worker()
    e2e.vibey("workflow", "start", "loops", "--script", str(script))
    final = e2e.drive(["loops"])["loops"]["workflow"]
    assert final["status"] == "completed"
    seen = phases(e2e, "loops")
    review_then = [b for a, b in itertools.pairwise(seen) if a == "review"]
    assert "build" in review_then, seen  # every finding unambiguous: the fast path
    assert "design" in review_then, seen  # an ambiguous finding: back to DESIGN


def test_a_bounded_build_failure_parks_at_a_gate(e2e: Stack, tmp_path: Path, pg_url: str) -> None:
    script = write_script(tmp_path, "[build]\nverify_failures = 99\n")
    e2e.start_worker()
    e2e.vibey("workflow", "start", "stuck", "--script", str(script))

    def until_parked(gate: Any) -> str | None:
        return None if gate["kind"] == "ladder_exhausted" else cooperative(gate)

    e2e.drive(["stuck"], until_parked)
    status = e2e.status("stuck")
    assert status["workflow"]["status"] == "running"
    [gate] = [g for g in e2e.open_gates("stuck") if g["kind"] == "ladder_exhausted"]
    assert gate["context"]["grant"] == "max_rounds" and gate["context"]["effort"] == "HIGH"
    verify = "SELECT state::text, attempts, max_attempts FROM job WHERE kind = 'build.verify'"
    assert sql(pg_url, verify) == [("awaiting_human", 3, 3)]
    assert sql(pg_url, "SELECT count(*) FROM job WHERE state = 'leased'") == [(0,)]
    # Not a number: exit 2, nothing changed.
    refused = e2e.vibey("gate", "answer", gate["id"], "lots", check=False)
    assert refused.returncode == 2 and "integer" in refused.stderr
    # Two more rounds at the top of the ladder; still failing, it parks again.
    e2e.vibey("gate", "answer", gate["id"], "2", "--by", "e2e")
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and sql(pg_url, verify)[0][1] < 5:
        time.sleep(0.5)
    time.sleep(1)
    assert sql(pg_url, verify) == [("awaiting_human", 5, 5)]
    [again] = [g for g in e2e.open_gates("stuck") if g["kind"] == "ladder_exhausted"]
    assert again["context"]["granted"] == 2
    e2e.vibey("workflow", "cancel", "stuck", "--by", "e2e")
    assert e2e.status("stuck")["workflow"]["status"] == "cancelled"
    assert sql(pg_url, verify) == [("cancelled", 5, 5)]


def test_a_verify_ladder_exhausts_parks_is_granted_two_rounds_and_succeeds(
    e2e: Stack, tmp_path: Path, pg_url: str
) -> None:
    script = write_script(tmp_path, "[build]\nverify_failures = [4]\n")
    e2e.start_worker()
    e2e.vibey("workflow", "start", "grant", "--script", str(script))
    final = e2e.drive(["grant"])["grant"]["workflow"]  # answers the ladder gate with "2"
    assert (final["status"], final["completion_mode"]) == ("completed", "local")
    verify = "SELECT attempts, max_attempts FROM job WHERE kind = 'build.verify' AND cycle = 0"
    assert sql(pg_url, verify) == [(5, 5)]
    grants = sql(pg_url, "SELECT answer FROM gate WHERE kind = 'ladder_exhausted'")
    assert grants == [("2",)]


def test_twenty_workflows_at_once(e2e: Stack, pg_url: str) -> None:
    e2e.start_worker(processes=2)
    projects = [f"p{n:02d}" for n in range(20)]
    started = time.monotonic()
    for project in projects:
        e2e.vibey("workflow", "start", project, "--script", str(DEMO_SCRIPT))
    done = e2e.drive(projects, deadline_s=300)
    wall = time.monotonic() - started
    assert {p: d["workflow"]["status"] for p, d in done.items()} == dict.fromkeys(
        projects, "completed"
    )
    steps = sql(pg_url, "SELECT count(*) FROM job WHERE state = 'succeeded'")[0][0]
    print(f"\n20 demo workflows: {steps} durable steps in {wall:.1f}s, gates answered by CLI")
    for project in projects:
        assert_each_step_committed_once(pg_url, project)


def test_a_worker_sigkilled_mid_build_loses_nothing(
    e2e: Stack, tmp_path: Path, pg_url: str
) -> None:
    config = tmp_path / "vibey.toml"
    # Short leases so the reaper takes the killed worker's steps back within seconds; the
    # heartbeat keeps a live step's lease however long it runs.
    config.write_text('[queue.lease_seconds]\ndefault = 3\n"build.implement" = 3\n')
    e2e.config = config
    script = write_script(
        tmp_path,
        """
[build]
work_items = [{ id = "a", title = "A" }, { id = "b", title = "B" }, { id = "c", title = "C" }]

[timing]
step_seconds = { "build.implement" = 10 }
""",
    )
    first = e2e.start_worker(processes=2, threads=4)
    e2e.vibey("workflow", "start", "crash", "--script", str(script))

    def implementing(status: Any) -> bool:
        return any(
            s["kind"] == "build.implement" and s["state"] == "leased" for s in status["steps"]
        )

    e2e.drive(["crash"], until=implementing)
    # SIGKILL to the whole process group, mid-step: each takes 10 s, room for a slow status
    # read on a loaded box between seeing the step leased and the kill.
    e2e.kill_worker(first)
    e2e.start_worker(processes=2, threads=4)
    final = e2e.drive(["crash"], deadline_s=240)["crash"]["workflow"]
    assert (final["status"], final["completion_mode"]) == ("completed", "local")
    retried = sql(
        pg_url, "SELECT count(*) FROM job WHERE kind = 'build.implement' AND attempts > 1"
    )
    assert retried[0][0] >= 1, "no implement step was caught by the kill"
    assert e2e.json("workflow", "verify", "crash")["ok"] is True
    assert_each_step_committed_once(pg_url, "crash")
    merged = sql(pg_url, "SELECT result->'merged' FROM job WHERE kind = 'build.integrate'")
    assert sorted(merged[0][0]) == ["a", "b", "c"]


def test_a_thousand_workflows_parked_at_gates_hold_no_message_and_no_lease(
    e2e: Stack, pg_url: str, amqp: Amqp
) -> None:
    from psycopg_pool import ConnectionPool

    from store.jobs import PostgresJobRepository
    from store.workflows import WorkflowStore
    from workflows.engine import Registry
    from workflows.protocol import DEFINITIONS

    e2e.start_worker(processes=2)
    script = {"design": {"questions": [{"id": "who", "question": "Who is it for?"}]}}
    with ConnectionPool(pg_url, min_size=1, max_size=4, kwargs={"autocommit": True}) as pool:
        jobs = PostgresJobRepository(pool=pool, dispatch=True)  # the fleet's relay sends
        store = WorkflowStore(pool=pool, jobs=jobs, registry=Registry(DEFINITIONS))
        for n in range(1000):
            engine = {"name": "scripted", "script": script}
            store.start(f"park{n:04d}", definition="vibey-protocol", input={"engine": engine})
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        waiting = sql(pg_url, "SELECT count(*) FROM gate WHERE answered_at IS NULL")[0][0]
        if waiting == 1000:
            break
        time.sleep(1)
    assert waiting == 1000, e2e.worker_log()
    time.sleep(2)  # let the last acks and the outbox settle
    assert sql(pg_url, "SELECT count(*) FROM job WHERE state = 'leased'") == [(0,)]
    assert sql(pg_url, "SELECT count(*) FROM job_outbox WHERE sent_at IS NULL") == [(0,)]
    names = amqp.names
    queues = [names.work_queue(lane) for lane in ("interactive", "build")]
    queues += [names.tier_queue(t) for t in ("w1s", "w5s", "w30s", "w2m", "w10m", "w1h")]
    connection = amqp.connect()
    try:
        channel = connection.channel()
        depths = {q: channel.queue_declare(q, passive=True).method.message_count for q in queues}
    finally:
        connection.close()
    assert sum(depths.values()) == 0, depths
    started = time.monotonic()
    listed = e2e.json("gate", "list")  # the first page, and how many wait
    took = time.monotonic() - started
    assert len(listed["gates"]) == 50 and listed["total"] == 1000
    assert len({g["id"] for g in e2e.every("gate", "list")}) == 1000  # --all: every gate
    print(f"\n1,000 parked workflows: 0 messages, 0 leases; `vibey gate list --json` {took:.2f}s")


def test_a_spend_cap_parks_a_verify_and_a_grant_lets_it_finish(
    e2e: Stack, tmp_path: Path, pg_url: str
) -> None:
    config = tmp_path / "vibey.toml"
    config.write_text("[engine]\nmax_dollars = 2\n")
    e2e.config = config
    script = write_script(
        tmp_path, "[build]\nverify_failures = [2]\n\n[budget]\ndollars_per_turn = 1.0\n"
    )
    e2e.start_worker()
    e2e.vibey("workflow", "start", "spend", "--script", str(script))

    def until_capped(gate: Any) -> str | None:
        return None if gate["kind"] == "spend_exhausted" else cooperative(gate)

    e2e.drive(["spend"], until_capped)
    [gate] = [g for g in e2e.open_gates("spend") if g["kind"] == "spend_exhausted"]
    assert gate["context"]["grant"] == "max_dollars"
    assert (gate["context"]["spent"], gate["context"]["limit"]) == (2, 2)
    # Two failed attempts' spend is in the ledger, written with their nacks.
    spent = sql(
        pg_url,
        "SELECT sum((e.payload->>'dollars')::numeric) FROM ledger_event e JOIN job j "
        "ON j.id = e.job_id WHERE e.kind = 'BudgetSpent' AND j.kind = 'build.verify'",
    )
    assert spent == [(2,)]
    e2e.vibey("gate", "answer", gate["id"], "3", "--by", "e2e")
    final = e2e.drive(["spend"])["spend"]["workflow"]
    assert (final["status"], final["completion_mode"]) == ("completed", "local")
    assert "digests match" in e2e.vibey("ledger", "verify", "spend").stdout
