"""The scripted engine answers every kind as a pure function of (script, kind, cycle, attempt,
subject, input), in the result shapes docs/protocol.md gives."""

from __future__ import annotations

import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest

from actors.agents import ROUTES, EngineTask, EngineVerdict, FakeEngine, ScriptedEngine
from actors.agents.scripted import ANSWERS
from actors.worktrees import Workspace
from workflows.protocol.kinds import STEP_KINDS
from workflows.protocol.results import DEPLOY_FAILURES

ENGINE_KINDS = sorted(k for k, v in STEP_KINDS.items() if v.phase is not None)

ROOT = Path(__file__).resolve().parents[2]

SCRIPT: dict[str, Any] = {
    "design": {"questions": [{"id": "audience", "question": "Who?", "answers": ["me", "all"]}]},
    "build": {
        "work_items": [{"id": "api", "title": "HTTP API"}, {"id": "ui", "title": "Web UI"}],
        "verify_failures": 2,
        "ambiguous": ["ui"],
    },
    "review": {"findings": [[{"id": "f1", "text": "Typo", "ambiguous": False}], []]},
    "deploy": {
        "questions": [{"id": "host", "question": "Where?"}],
        "execute_failures": 1,
        "triage": ["infra", "none", "code"],
    },
}


def run(
    kind: str, script: Any = SCRIPT, *, cycle: int = 0, attempt: int = 1, **extra: Any
) -> EngineVerdict:
    step_input = {"engine": {"name": "scripted", "script": script}, "cycle": cycle, **extra}
    task = EngineTask(kind, "demo", cycle, extra.get("subject", ""), attempt, step_input)
    return ScriptedEngine().run(task)


def result(kind: str, script: Any = SCRIPT, **kwargs: Any) -> dict[str, Any]:
    verdict = run(kind, script, **kwargs)
    assert verdict.status == "ok", verdict
    return verdict.result


def test_every_canonical_kind_has_an_answer_and_every_failure_a_route() -> None:
    assert set(ANSWERS) == set(ENGINE_KINDS)
    assert set(ROUTES) == {None, *DEPLOY_FAILURES}


@pytest.mark.parametrize("kind", ENGINE_KINDS)
def test_every_kind_answers_the_same_twice_and_with_no_script(kind: str) -> None:
    extra: dict[str, Any] = {"item": {"id": "main", "title": "main"}, "items": ["main"]}
    assert run(kind, **extra) == run(kind, **extra)
    assert run(kind, None, **extra).status in {"ok", "failed"}


def test_design_interview_asks_the_script_questions_in_cycle_0_until_answered() -> None:
    question = {"id": "audience", "question": "Who?", "answers": ["me", "all"]}
    assert result("design.interview") == {"questions": [question]}
    assert result("design.interview", answers={"audience": "me"}) == {"questions": []}
    assert result("design.interview", cycle=1) == {"questions": []}
    assert result("design.interview", {}) == {"questions": []}


def test_design_interview_asks_the_ambiguity_of_a_later_cycle() -> None:
    asked = result("design.interview", cycle=2, ambiguity="Which colour?")
    assert asked == {
        "questions": [{"id": "ambiguity-2", "question": "Which colour?", "answers": []}]
    }
    answered = result("design.interview", cycle=2, ambiguity="Which?", answers={"ambiguity-2": "x"})
    assert answered == {"questions": []}
    assert result("design.interview", cycle=2, ambiguity=None) == {"questions": []}


def test_deploy_interview_asks_the_deploy_questions() -> None:
    question = {"id": "host", "question": "Where?", "answers": []}
    assert result("deploy.interview", cycle=3) == {"questions": [question]}
    assert result("deploy.interview", answers={"host": "fly"}) == {"questions": []}


@pytest.mark.parametrize(
    ("kind", "key"),
    [
        ("design.research", "notes"),
        ("design.synthesize", "summary"),
        ("design.spec", "spec"),
        ("visual.plan", "plan"),
        ("deploy.design", "plan"),
        ("deploy.synthesize", "summary"),
        ("deploy.spec", "spec"),
        ("review.demo", "demo"),
        ("deploy.demo", "demo"),
    ],
)
def test_text_kinds_give_their_key(kind: str, key: str) -> None:
    got = result(kind, answers={"audience": "teachers"}, branch="vibey/integration")
    assert list(got) == [key]
    assert isinstance(got[key], str)
    assert got[key]


def test_design_spec_carries_the_answers() -> None:
    assert "audience: teachers" in result("design.spec", answers={"audience": "teachers"})["spec"]


def test_visual_inventory_lists_screens() -> None:
    assert result("visual.inventory", spec="s") == {"screens": ["home"]}


def test_decompose_gives_the_script_items_or_one_item_per_finding() -> None:
    items = [{"id": "api", "title": "HTTP API"}, {"id": "ui", "title": "Web UI"}]
    assert result("build.decompose", findings=[]) == {"work_items": items}
    assert result("build.decompose", {}) == {"work_items": [{"id": "main", "title": "main"}]}
    fixes = result("build.decompose", findings=[{"id": "f1", "text": "Typo", "ambiguous": False}])
    assert fixes == {"work_items": [{"id": "fix-f1", "title": "Typo"}]}


def test_implement_is_ambiguous_only_in_cycle_0_for_listed_items() -> None:
    ui = {"id": "ui", "title": "Web UI"}
    ambiguous = result("build.implement", item=ui)
    assert ambiguous["status"] == "ambiguous"
    assert ambiguous["item"] == "ui"
    assert "Web UI" in ambiguous["question"]
    assert result("build.implement", item=ui, cycle=1) == {"item": "ui", "status": "done"}
    api = {"id": "api", "title": "HTTP API"}
    assert result("build.implement", item=api) == {"item": "api", "status": "done"}


def test_implement_writes_and_commits_the_item_file_once(tmp_path: Path) -> None:
    worktree = Workspace(tmp_path).worktree("demo", 0, "api")
    item = {"id": "api", "title": "HTTP API"}
    step_input = {"engine": {"name": "scripted", "script": SCRIPT}, "item": item}
    task = EngineTask("build.implement", "demo", 0, "api", 1, step_input, worktree)
    first = ScriptedEngine().run(task).result
    assert (worktree / "src" / "api.txt").read_text() == "HTTP API\ncycle 0\n"
    assert first["branch"] == "vibey/c0/api"
    assert ScriptedEngine().run(task).result == first  # a retry commits nothing new
    log = subprocess.run(
        ["git", "log", "--format=%s"], cwd=worktree, capture_output=True, text=True, check=True
    )
    assert log.stdout.splitlines() == ["vibey: implement api (cycle 0)", "vibey: start"]


def test_verify_fails_its_first_attempts_in_each_cycle() -> None:
    failed = run("build.verify", attempt=2, cycle=1, items=["api"])
    assert failed.status == "failed"
    assert not failed.engine_fault
    assert "2 of 2" in failed.detail
    assert result("build.verify", attempt=3, items=["api"]) == {"passed": True}
    assert result("build.verify", {}, attempt=1) == {"passed": True}


def test_verify_failures_may_be_given_per_cycle() -> None:
    script = {"build": {"verify_failures": [1]}}
    assert run("build.verify", script, cycle=0, attempt=1).status == "failed"
    assert run("build.verify", script, cycle=0, attempt=2).status == "ok"
    assert run("build.verify", script, cycle=1, attempt=1).status == "ok"


def test_integrate_has_the_result_shape() -> None:
    got = result("build.integrate", items=["api", "ui"])
    assert got == {"branch": "vibey/integration", "merged": ["api", "ui"], "commit": ""}


def test_review_collect_and_triage_read_the_round() -> None:
    finding = {"id": "f1", "text": "Typo", "ambiguous": False}
    assert result("review.triage", round=0, feedback=[]) == {"findings": [finding]}
    assert result("review.triage", round=1, feedback=[]) == {"findings": []}
    assert result("review.triage", round=7, feedback=[]) == {"findings": []}
    assert result("review.collect", round=0) == {"feedback": ["Typo"]}
    assert result("review.collect", cycle=1) == {"feedback": []}


def test_deployment_choice_recommends_deploying_when_the_script_deploys() -> None:
    assert result("review.deployment_choice")["recommendation"] == "deploy"
    assert result("review.deployment_choice", {})["recommendation"] == "local"


def test_deploy_execute_fails_its_first_attempts_in_each_round() -> None:
    failed = run("deploy.execute", round=1, attempt=1)
    assert failed.status == "failed"
    assert not failed.engine_fault
    assert result("deploy.execute", round=1, attempt=2) == {
        "deployed": True,
        "url": "https://demo.vibey.invalid/round-1",
    }


def test_deploy_triage_by_round_then_null() -> None:
    triaged = [result("deploy.triage", round=r)["failure"] for r in range(4)]
    assert triaged == ["infra", None, "code", None]


@pytest.mark.parametrize(
    ("failure", "route"),
    [
        (None, "done"),
        ("infra", "deploy_execute"),
        ("config", "deploy_execute"),
        ("design", "deploy_design"),
        ("product", "design"),
        ("code", "build"),
        ("review", "review"),
    ],
)
def test_deploy_route_maps_the_failure(failure: str | None, route: str) -> None:
    assert result("deploy.route", failure=failure) == {"route": route}


@pytest.mark.parametrize(
    ("kind", "script", "extra", "message"),
    [
        ("deploy.route", SCRIPT, {"failure": "weather"}, "weather"),
        ("build.verify", {"build": {"verify_failures": -1}}, {}, "verify_failures"),
        ("deploy.triage", {"deploy": {"triage": ["rain"]}}, {}, "rain"),
        ("design.interview", {"design": {"questions": [{"q": 1}]}}, {}, "design.questions[0]"),
        ("review.triage", {"review": "none"}, {}, "[review]"),
        ("design.interview", ["not", "a", "table"], {}, "table/object"),
        ("build.implement", SCRIPT, {"item": "api"}, "input.item"),
        ("review.triage", SCRIPT, {"round": -1}, "input.round"),
    ],
)
def test_malformed_scripts_and_inputs_raise_script_errors(
    kind: str, script: Any, extra: dict[str, Any], message: str
) -> None:
    from actors.agents import ScriptError

    with pytest.raises(ScriptError, match=message.replace("[", r"\[").replace("]", r"\]")):
        run(kind, script, **extra)


def _script(name: str) -> dict[str, Any]:
    with (ROOT / "ops" / "demo" / name).open("rb") as handle:
        return tomllib.load(handle)


def test_the_demo_script_runs_as_described() -> None:
    demo = _script("demo.toml")
    assert len(result("design.interview", demo)["questions"]) == 1
    assert result("design.interview", demo)["questions"][0]["answers"] == []
    assert len(result("build.decompose", demo)["work_items"]) == 2
    assert [run("build.verify", demo, attempt=a).status for a in (1, 2)] == ["failed", "ok"]
    assert run("build.verify", demo, cycle=1, attempt=1).status == "ok"
    findings = result("review.triage", demo, round=0)["findings"]
    assert len(findings) == 1
    assert not findings[0]["ambiguous"]
    assert result("review.triage", demo, round=1)["findings"] == []
    assert run("deploy.execute", demo, round=0).status == "ok"
    assert result("deploy.triage", demo, round=0)["failure"] is None


def test_the_deploy_script_routes_one_deploy_review_back_to_execute() -> None:
    deploy = _script("deploy.toml")
    assert {k: v for k, v in deploy.items() if k != "deploy"} == {
        k: v for k, v in _script("demo.toml").items() if k != "deploy"
    }
    failure = result("deploy.triage", deploy, round=0)["failure"]
    assert failure == "infra"
    assert result("deploy.route", deploy, failure=failure) == {"route": "deploy_execute"}
    assert result("deploy.triage", deploy, round=1)["failure"] is None


def test_fake_engine_records_tasks_and_answers_from_its_table() -> None:
    refused = EngineVerdict("capacity", detail="busy")
    fake = FakeEngine(verdicts={"design.spec": refused})
    task = EngineTask("design.spec", "demo", 0, "", 1, {})
    assert fake.run(task) is refused
    answered = fake.run(EngineTask("design.research", "demo", 0, "", 1, {}))
    assert answered == EngineVerdict("ok", result={"notes": ""})  # the smallest its schema takes
    assert fake.run(EngineTask("custom.kind", "demo", 0, "", 1, {})) == EngineVerdict("ok")
    assert fake.kinds() == ["design.spec", "design.research", "custom.kind"]


def test_timing_makes_a_kind_take_its_time_and_bad_timing_is_refused() -> None:
    import time as clock

    from actors.agents import EngineTask, ScriptedEngine
    from actors.agents.base import ScriptError

    script = {"timing": {"step_seconds": {"design.research": 0.2}}}
    task = EngineTask(
        kind="design.research",
        project_id="p",
        cycle=0,
        subject="",
        attempt=1,
        input={"engine": {"name": "scripted", "script": script}, "answers": {}},
    )
    started = clock.monotonic()
    assert ScriptedEngine().run(task).status == "ok"
    assert clock.monotonic() - started >= 0.2
    bad = {"engine": {"name": "scripted", "script": {"timing": {"step_seconds": {"x": -1}}}}}
    import pytest

    with pytest.raises(ScriptError, match="between 0 and 600"):
        ScriptedEngine().run(EngineTask("design.research", "p", 0, "", 1, bad))


# -- rotation rosters, credits and handoff briefs ------------------------------------------

ROSTER: dict[str, Any] = {
    "build": {"work_items": [{"id": "api", "title": "HTTP API"}]},
    "engines": {"roster": [{"id": "alpha", "weight": 2}, {"id": "beta"}]},
    "capacity": {
        "credits_exhausted": [
            {"engine": "alpha", "kind": "build.implement", "item": "api", "attempt": 1}
        ]
    },
    "handoff": {"failing_briefs": 2},
}


def test_a_roster_defaults_to_one_scripted_engine() -> None:
    from actors.agents.script import RosterEngine, Script

    assert Script.parse({}).roster == (RosterEngine("scripted", 1),)
    parsed = Script.parse(ROSTER)
    assert parsed.roster == (RosterEngine("alpha", 2), RosterEngine("beta", 1))
    assert parsed.failing_briefs == 2
    assert parsed.credits_exhausted_for("alpha", "build.implement", "api", 1)
    assert not parsed.credits_exhausted_for("alpha", "build.implement", "api", 2)
    assert not parsed.credits_exhausted_for("beta", "build.implement", "api", 1)
    assert not parsed.credits_exhausted_for("alpha", "build.implement", "ui", 1)
    anywhere = Script.parse({**ROSTER, "capacity": {"credits_exhausted": [{"engine": "beta"}]}})
    assert anywhere.credits_exhausted_for("beta", "build.implement", "ui", 7)


def test_an_engine_out_of_credits_says_so_with_no_reset_time() -> None:
    item = {"id": "api", "title": "HTTP API"}
    spent = run("build.implement", ROSTER, item=item, subject="api", engine_id="alpha")
    assert spent.status == "capacity"
    assert spent.result["capacity"]["state"] == "CreditsExhausted"
    assert "resets_at" not in spent.result["capacity"]
    ledger = spent.evidence["ledger"]
    assert [e["kind"] for e in ledger] == [
        "TurnRequested",
        "TurnCompleted",
        "BudgetSpent",
        "CapacityRejected",
    ]
    assert {e["payload"]["engine"] for e in ledger} == {"alpha"}
    beta = run("build.implement", ROSTER, item=item, subject="api", engine_id="beta")
    assert beta.status == "ok"
    assert beta.evidence["ledger"][0]["payload"]["engine"] == "beta"
    again = run("build.implement", ROSTER, item=item, attempt=2, engine_id="alpha")
    assert again.status == "ok"
    # Without an engine_id the engine is "scripted", as before rosters.
    assert run("build.implement", SCRIPT, item=item).evidence["ledger"][0]["payload"] == {
        "engine": "scripted",
        "kind": "build.implement",
        "subject": "",
        "attempt": 1,
    }


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ({"engines": {"roster": []}}, "one engine or more"),
        ({"engines": {"roster": [{"id": "a"}, {"id": "a"}]}}, "each once"),
        ({"engines": {"roster": [{"weight": 1}]}}, "engines.roster[0] needs an id"),
        ({"engines": {"roster": [{"id": "a", "weight": -1}]}}, "weight must be a whole"),
        ({"capacity": {"credits_exhausted": [{"engine": "ghost"}]}}, "an engine of the roster"),
        (
            {"capacity": {"credits_exhausted": [{"engine": "scripted", "attempt": 0}]}},
            "counts from 1",
        ),
        ({"handoff": {"failing_briefs": -1}}, "handoff.failing_briefs"),
    ],
)
def test_malformed_rosters_and_capacity_are_script_errors(script: Any, message: str) -> None:
    from actors.agents import ScriptError
    from actors.agents.script import Script

    with pytest.raises(ScriptError, match=message.replace("[", r"\[").replace("]", r"\]")):
        Script.parse(script)


def _range() -> list[Any]:
    from workflows.ledger import EventKind, LedgerEvent, NewEvent

    new = [
        NewEvent(EventKind.QuestionAsked, {"id": "q1", "question": "Which database?"}),
        NewEvent(EventKind.DecisionRecorded, {"id": "d1", "decision": "PostgreSQL"}),
        NewEvent(EventKind.FindingRaised, {"id": "finding:f1", "text": "slow"}),
        NewEvent(EventKind.ArtifactProduced, {"id": "design.spec.0.0", "artifact": "spec"}),
        NewEvent(EventKind.BudgetSpent, {"turns": 3, "dollars": 1.5}),
    ]
    return [LedgerEvent("demo", n, e.kind, e.payload, e.digest) for n, e in enumerate(new, start=1)]


def test_a_scripted_brief_passes_the_gate_after_its_failing_ones() -> None:
    from workflows.noloss import Rule, Spec, verify

    events, spec = _range(), Spec(work_items=("api",))
    step_input = {"engine": {"name": "scripted", "script": ROSTER}, "engine_id": "alpha"}
    task = EngineTask("build.implement", "demo", 0, "api", 1, step_input)
    engine = ScriptedEngine()
    briefs = [engine.write_brief(task, events, spec, mode="brief", number=n) for n in (1, 2, 3)]
    reports = [verify(brief, events, spec) for brief in briefs]
    assert [r.failed_rules for r in reports] == [{Rule.R2}, {Rule.R2}, frozenset()]
    good = briefs[2]
    assert [i.id for i in good.open_questions] == ["q1"]
    assert good.open_questions[0].text == "Which database?"
    assert [i.id for i in good.remaining_work] == ["api"]
    assert str(good.budget.dollars) == "1.5" and good.budget.turns == 3
    # In full_transcript mode the closures are waived: a failing brief names a stale range.
    stale = engine.write_brief(task, events, spec, mode="full_transcript", number=1)
    assert verify(stale, events, spec).failed_rules == {Rule.R6}
    fine = engine.write_brief(task, events, spec, mode="full_transcript", number=3)
    assert verify(fine, events, spec).passed


def test_a_seeded_engine_reads_the_ledger_file_its_seed_names(tmp_path: Path) -> None:
    from actors.agents import ScriptError

    ledger = tmp_path / ".vibey" / "handoff" / "ledger.jsonl"
    ledger.parent.mkdir(parents=True)
    ledger.write_text('{"seq": 1}\n{"seq": 2}\n')
    seed = {"from": "alpha", "mode": "full_transcript", "ledger_file": str(ledger)}
    item = {"id": "api", "title": "HTTP API"}
    seeded = run(
        "build.implement",
        ROSTER,
        item=item,
        engine_id="beta",
        handoff={**seed, "prompt": f"read {ledger} first"},
    )
    assert seeded.evidence["seed"] == {**seed, "ledger_events": 2}
    with pytest.raises(ScriptError, match="not there"):
        run("build.implement", ROSTER, item=item, handoff={**seed, "prompt": "nothing named"})


def test_the_handoff_demo_script_runs_as_described() -> None:
    from actors.agents.script import RosterEngine, Script
    from workflows.noloss import Spec, verify

    relay = _script("handoff.toml")
    parsed = Script.parse(relay)
    assert parsed.roster == (RosterEngine("alpha", 2), RosterEngine("beta", 1))
    assert parsed.failing_briefs == 2
    item = {"id": "ui", "title": "Web page"}
    assert run("build.implement", relay, item=item, engine_id="alpha").status == "capacity"
    assert run("build.implement", relay, item=item, engine_id="beta").status == "ok"
    events, spec = _range(), Spec(work_items=("ui",))
    step_input = {"engine": {"name": "scripted", "script": relay}, "engine_id": "alpha"}
    task = EngineTask("build.implement", "relay", 0, "ui", 1, step_input)
    passed = [
        verify(
            ScriptedEngine().write_brief(task, events, spec, mode="brief", number=n), events, spec
        ).passed
        for n in (1, 2, 3)
    ]
    assert passed == [False, False, True]
