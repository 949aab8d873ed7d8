"""The vibey protocol by example: whole runs, each loop-back, each deploy route, step failures,
stale events, malformed results, names, inputs, the state codec and ``describe``."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from tests.golden.record import (
    COOPERATIVE,
    ENGINE,
    Run,
    Script,
    cooperative_result,
    drive,
    next_event,
    start,
)
from workflows.engine import (
    CancelRequested,
    Complete,
    Event,
    Fail,
    GateAnswered,
    OpenGate,
    ScheduleStep,
    Started,
    StartTimer,
    StepFailed,
    StepSucceeded,
    TimerFired,
    TransitionPhase,
)
from workflows.job import FailureClass
from workflows.protocol import (
    DEFINITIONS,
    PROTOCOL,
    ProtocolState,
    ResultError,
    StateCodecError,
    decode_state,
)
from workflows.protocol.kinds import STEP_KINDS

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def until(run: Run, stop: Any, script: Script = COOPERATIVE) -> Run:
    """Drive ``run`` (like :func:`drive`) until ``stop(run)`` holds."""
    for _ in range(400):
        if stop(run):
            return run
        event = next_event(run, script)
        assert event is not None, PROTOCOL.describe(run.state)
        run.send(event)
    raise AssertionError("never reached")


def step(run: Run, name: str) -> ScheduleStep:
    return run.steps[name]


def succeed(run: Run, name: str, result: dict[str, Any] | None = None) -> tuple[Any, ...]:
    return run.send(StepSucceeded(name, cooperative_result(step(run, name)) | (result or {})))


def phases(run: Run) -> list[tuple[str, int]]:
    return [
        (c.phase, c.cycle)
        for e in run.history
        for c in e.commands or ()
        if isinstance(c, TransitionPhase)
    ]


def items(*ids: str) -> dict[str, Any]:
    return {"work_items": [{"id": i, "title": i} for i in ids]}


# --- whole runs ----------------------------------------------------------------------------


def test_the_definition_is_registered_by_name_and_version() -> None:
    assert DEFINITIONS == (PROTOCOL,)
    assert (PROTOCOL.name, PROTOCOL.version) == ("vibey-protocol", 1)
    assert PROTOCOL.initial() == ProtocolState()


def test_a_demo_run_completes_locally() -> None:
    script = Script(
        results={
            "design.interview.0.0.0": {
                "questions": [
                    {"id": "audience", "question": "Who?", "answers": []},
                    {"id": "colour", "question": "Colour?", "answers": ["red", "blue"]},
                ]
            },
            "design.interview.0.0.1": {
                "questions": [{"id": "colour", "question": "Colour?", "answers": ["red", "blue"]}]
            },
            "build.decompose.0": items("api", "ui"),
        },
        answers={"design.q.0.audience": "Teams", "design.q.0.colour": "blue"},
    )
    run = drive(start(), script)
    assert (run.header.status.value, run.header.completion_mode) == ("completed", "local")
    assert phases(run) == [("design", 0), ("build", 0), ("review", 0), ("done", 0)]
    assert list(run.steps) == [
        "design.interview.0.0.0",
        "design.interview.0.0.1",
        "design.interview.0.0.2",
        "design.research.0.0",
        "design.synthesize.0.0",
        "design.spec.0.0",
        "build.decompose.0",
        "build.implement.0.0",
        "build.implement.0.1",
        "build.verify.0",
        "build.integrate.0",
        "review.demo.0",
        "review.collect.0",
        "review.triage.0",
        "review.deployment_choice.0",
    ]
    assert run.gate_names == {
        "design.q.0.audience",
        "design.q.0.colour",
        "design.accept.0.0",
        "visual.opt_in",
        "deployment.opt_in",
    }
    assert step(run, "design.interview.0.0.2").input["answers"] == {
        "audience": "Teams",
        "colour": "blue",
    }
    assert run.history[-1].commands == (TransitionPhase("done", 0), Complete("local"))


def test_every_step_input_carries_engine_cycle_phase_and_its_kind_keys() -> None:
    run = drive(start(), Script(results={"build.decompose.0": items("api")}))
    for scheduled in run.steps.values():
        assert scheduled.input["engine"] == ENGINE
        assert scheduled.input["cycle"] == scheduled.cycle == 0
        assert scheduled.input["phase"] == STEP_KINDS[scheduled.kind].phase
    assert step(run, "build.decompose.0").input["spec"] == "spec of design.spec.0.0"
    assert step(run, "build.decompose.0").input["findings"] == []
    implement = step(run, "build.implement.0.0")
    assert (implement.subject, implement.input["item"]) == ("api", {"id": "api", "title": "api"})
    assert step(run, "build.verify.0").input["items"] == ["api"]
    assert step(run, "build.integrate.0").after == ("build.verify.0",)
    assert step(run, "review.demo.0").input["branch"] == "vibey/cycle-0"
    assert step(run, "review.triage.0").input["feedback"] == []
    assert step(run, "review.triage.0").input["round"] == 0


def test_design_research_synthesize_and_spec_are_one_chained_decision() -> None:
    run = start()
    commands = succeed(run, "design.interview.0.0.0")
    assert [(c.step, c.after) for c in commands if isinstance(c, ScheduleStep)] == [
        ("design.research.0.0", ()),
        ("design.synthesize.0.0", ("design.research.0.0",)),
        ("design.spec.0.0", ("design.synthesize.0.0",)),
    ]


def test_max_attempts_are_three_for_verify_and_execute_and_five_for_the_rest() -> None:
    run = drive(start(), Script(answers={"deployment.opt_in": "yes"}))
    attempts = {s.kind: s.max_attempts for s in run.steps.values()}
    assert attempts.pop("build.verify") == 3
    assert attempts.pop("deploy.execute") == 3
    assert set(attempts.values()) == {5}


def test_a_run_with_visual_design_and_deployment_completes_deployed() -> None:
    script = Script(
        results={
            "deploy.interview.0.0": {
                "questions": [{"id": "region", "question": "Where?", "answers": ["eu", "us"]}]
            }
        },
        answers={"visual.opt_in": "yes", "deployment.opt_in": "yes", "deploy.q.0.region": "us"},
    )
    run = drive(start({"engine": ENGINE, "deploy_soak_seconds": 30}), script)
    assert (run.header.status.value, run.header.completion_mode) == ("completed", "deployed")
    assert phases(run) == [
        ("design", 0),
        ("visual_design", 0),
        ("build", 0),
        ("review", 0),
        ("deploy_design", 0),
        ("deploy_execute", 0),
        ("deploy_review", 0),
        ("done", 0),
    ]
    assert step(run, "visual.plan.0").after == ("visual.inventory.0",)
    assert step(run, "deploy.interview.0.0").after == ("deploy.design.0",)
    assert step(run, "deploy.interview.0.1").input["answers"] == {"region": "us"}
    assert step(run, "deploy.spec.0").after == ("deploy.synthesize.0",)
    assert step(run, "deploy.execute.0").input["round"] == 0
    timer = next(c for e in run.history for c in e.commands or () if isinstance(c, StartTimer))
    assert timer == StartTimer("deploy.soak.0", timedelta(seconds=30))
    assert step(run, "deploy.route.0").input["failure"] is None
    assert {"visual.accept.0", "deploy.accept.0", "deploy.signoff.0"} <= run.gate_names


def test_the_visual_opt_in_is_asked_once() -> None:
    script = Script(
        results={"review.triage.0": {"findings": [{"id": "f", "text": "?", "ambiguous": True}]}}
    )
    run = drive(start(), script)
    assert "design.accept.1.0" in run.gate_names
    assert [g for g in run.gate_names if g.startswith("visual")] == ["visual.opt_in"]


def test_revising_the_spec_starts_a_new_design_round_in_the_same_cycle() -> None:
    run = drive(start(), Script(answers={"design.accept.0.0": "revise"}))
    assert "design.interview.0.1.0" in run.steps
    assert "design.accept.0.1" in run.gate_names
    assert phases(run)[:2] == [("design", 0), ("build", 0)]


# --- loop-backs ----------------------------------------------------------------------------


def test_review_findings_all_unambiguous_go_back_to_build() -> None:
    finding = {"id": "f1", "text": "typo", "ambiguous": False}
    run = drive(start(), Script(results={"review.triage.0": {"findings": [finding]}}))
    assert phases(run) == [
        ("design", 0),
        ("build", 0),
        ("review", 0),
        ("build", 1),
        ("review", 1),
        ("done", 1),
    ]
    assert step(run, "build.decompose.1").input["findings"] == [finding]
    assert step(run, "build.decompose.1").input["cycle"] == 1
    assert step(run, "review.triage.1").input["round"] == 1


def test_an_ambiguous_finding_goes_back_to_design() -> None:
    findings = [
        {"id": "f1", "text": "typo", "ambiguous": False},
        {"id": "f2", "text": "who pays?", "ambiguous": True},
    ]
    run = drive(start(), Script(results={"review.triage.0": {"findings": findings}}))
    assert phases(run)[3] == ("design", 1)
    assert step(run, "design.interview.1.0.0").input["ambiguity"] == "typo\nwho pays?"
    assert "visual.opt_in" in run.gate_names and "design.accept.1.0" in run.gate_names


def test_build_to_design_on_ambiguity() -> None:
    run = until(
        start(),
        lambda r: "build.implement.0.1" in r.steps,
        Script(results={"build.decompose.0": items("api", "ui")}),
    )
    ambiguous = {"status": "ambiguous", "question": "Dark mode?"}
    assert succeed(run, "build.implement.0.1", ambiguous) == ()  # api is still running
    assert run.state.ambiguities == ("Dark mode?",)
    commands = succeed(run, "build.implement.0.0")
    assert commands[0] == TransitionPhase("design", 1)
    interview = commands[1]
    assert isinstance(interview, ScheduleStep)
    assert interview.step == "design.interview.1.0.0"
    assert interview.input["ambiguity"] == "Dark mode?"
    assert not run.scheduled("build.verify")
    drive(run)
    assert "build.verify.1" in run.steps and run.header.completion_mode == "local"


def test_decompose_with_no_work_items_goes_straight_to_verify() -> None:
    run = drive(start(), Script(results={"build.decompose.0": {"work_items": []}}))
    assert not run.scheduled("build.implement")
    assert step(run, "build.verify.0").input["items"] == []
    assert run.header.completion_mode == "local"


# --- DEPLOY_* ------------------------------------------------------------------------------

DEPLOYING = Script(
    results={"deploy.triage.0": {"failure": "product"}},
    answers={"deployment.opt_in": "yes"},
)


def at_route() -> Run:
    return until(start(), lambda r: "deploy.route.0" in {s.step for s in r.runnable()}, DEPLOYING)


def scheduled_in(commands: tuple[Any, ...]) -> list[str]:
    return [c.step for c in commands if isinstance(c, ScheduleStep)]


@pytest.mark.parametrize(
    ("route", "phase", "steps"),
    [
        ("deploy_execute", ("deploy_execute", 0), ["deploy.execute.1"]),
        ("deploy_design", ("deploy_design", 0), ["deploy.design.1", "deploy.interview.1.0"]),
        ("design", ("design", 1), ["design.interview.1.0.0"]),
        ("build", ("build", 1), ["build.decompose.1"]),
        ("review", ("review", 1), ["review.demo.1", "review.collect.1"]),
    ],
)
def test_deploy_review_routes_back(route: str, phase: tuple[str, int], steps: list[str]) -> None:
    run = at_route()
    assert step(run, "deploy.route.0").input["failure"] == "product"
    commands = succeed(run, "deploy.route.0", {"route": route})
    assert commands[0] == TransitionPhase(*phase)
    assert scheduled_in(commands) == steps
    drive(run)
    assert (run.header.status.value, run.header.completion_mode) == ("completed", "deployed")
    assert any(s.startswith("deploy.execute.") and s != "deploy.execute.0" for s in run.steps)


def test_routes_back_to_design_and_build_say_why() -> None:
    design = at_route()
    succeed(design, "deploy.route.0", {"route": "design"})
    assert "product" in step(design, "design.interview.1.0.0").input["ambiguity"]
    build = at_route()
    succeed(build, "deploy.route.0", {"route": "build"})
    (finding,) = step(build, "build.decompose.1").input["findings"]
    assert finding["id"] == "deploy.0" and finding["ambiguous"] is False
    assert "product" in finding["text"]


def test_route_done_asks_for_signoff_and_a_reject_starts_a_new_deploy_round() -> None:
    run = at_route()
    (gate,) = succeed(run, "deploy.route.0", {"route": "done"})
    assert isinstance(gate, OpenGate)
    assert (gate.gate, gate.kind, gate.answers) == (
        "deploy.signoff.0",
        "approval",
        ("accept", "reject"),
    )
    assert gate.context == {"url": "https://demo.example"}
    commands = run.send(GateAnswered("deploy.signoff.0", "reject", "me"))
    assert commands[0] == TransitionPhase("deploy_design", 0)
    assert scheduled_in(commands) == ["deploy.design.1", "deploy.interview.1.0"]


def test_revising_the_deploy_spec_starts_a_new_round_in_the_same_phase() -> None:
    run = drive(start(), Script(answers={"deployment.opt_in": "yes", "deploy.accept.0": "revise"}))
    assert {"deploy.accept.0", "deploy.accept.1", "deploy.signoff.1"} <= run.gate_names
    assert "deploy.execute.0" not in run.steps and "deploy.execute.1" in run.steps
    assert phases(run).count(("deploy_design", 0)) == 1


def test_the_soak_timer_starts_the_deploy_review() -> None:
    run = until(start(), lambda r: bool(r.timers), DEPLOYING)
    assert run.state.phase == "deploy_execute"
    assert PROTOCOL.describe(run.state) == "deploy_execute cycle 0: waiting on timer deploy.soak.0"
    commands = run.send(TimerFired("deploy.soak.0"))
    assert commands[0] == TransitionPhase("deploy_review", 0)
    assert scheduled_in(commands) == ["deploy.demo.0", "deploy.triage.0"]
    assert run.send(TimerFired("deploy.soak.0")) == ()


def test_declining_deployment_completes_locally_without_deploy_steps() -> None:
    run = drive(start())
    assert run.history[-1].commands == (TransitionPhase("done", 0), Complete("local"))
    assert not [s for s in run.steps if s.startswith("deploy.")]


# --- step failures -------------------------------------------------------------------------


def failing(name: str) -> Run:
    return until(start(), lambda r: name in {s.step for s in r.runnable()})


def test_a_failed_step_opens_a_gate_and_retry_schedules_it_again_with_its_dependents() -> None:
    run = failing("design.research.0.0")
    (gate,) = run.send(StepFailed("design.research.0.0", FailureClass.ENGINE, "engine down"))
    assert isinstance(gate, OpenGate)
    assert gate.gate == "step.failed.design.research.0.0"
    assert (gate.kind, gate.answers) == ("step_failed", ("retry", "abandon"))
    assert gate.context["failure_class"] == "engine" and gate.context["detail"] == "engine down"
    commands = run.send(GateAnswered(gate.gate, "retry", "me"))
    assert [(c.step, c.after) for c in commands if isinstance(c, ScheduleStep)] == [
        ("design.research.0.0.retry1", ()),
        ("design.synthesize.0.0.retry1", ("design.research.0.0.retry1",)),
        ("design.spec.0.0.retry1", ("design.synthesize.0.0.retry1",)),
    ]
    again, first = step(run, "design.research.0.0.retry1"), step(run, "design.research.0.0")
    assert (again.kind, again.subject, again.input) == (first.kind, first.subject, first.input)
    assert succeed(run, "design.synthesize.0.0") == ()  # the old dependents are stale
    drive(run)
    assert run.header.completion_mode == "local"


def test_a_retried_step_that_fails_again_is_retried_under_the_next_name() -> None:
    run = failing("build.verify.0")
    run.send(StepFailed("build.verify.0", FailureClass.WORK, "tests fail"))
    run.send(GateAnswered("step.failed.build.verify.0", "retry", "me"))
    run.send(StepFailed("build.verify.0.retry1", FailureClass.WORK, "tests fail"))
    commands = run.send(GateAnswered("step.failed.build.verify.0.retry1", "retry", "me"))
    assert scheduled_in(commands) == ["build.verify.0.retry2", "build.integrate.0.retry2"]
    assert step(run, "build.verify.0.retry2").max_attempts == 3
    drive(run)
    assert run.header.completion_mode == "local"


def test_a_failed_implement_holds_the_cycle_until_it_is_retried() -> None:
    run = until(
        start(),
        lambda r: "build.implement.0.1" in r.steps,
        Script(results={"build.decompose.0": items("api", "ui")}),
    )
    run.send(StepFailed("build.implement.0.0", FailureClass.WORK, "does not build"))
    assert succeed(run, "build.implement.0.1") == ()
    commands = run.send(GateAnswered("step.failed.build.implement.0.0", "retry", "me"))
    assert scheduled_in(commands) == ["build.implement.0.0.retry1"]
    assert step(run, "build.implement.0.0.retry1").subject == "api"
    assert scheduled_in(succeed(run, "build.implement.0.0.retry1")) == [
        "build.verify.0",
        "build.integrate.0",
    ]


def test_abandoning_a_failed_step_fails_the_workflow_and_it_absorbs_later_events() -> None:
    run = failing("review.collect.0")
    run.send(StepFailed("review.collect.0", FailureClass.VIBEY, "bug"))
    (fail,) = run.send(GateAnswered("step.failed.review.collect.0", "abandon", "ana"))
    assert isinstance(fail, Fail)
    assert fail.reason == "review.collect.0 failed for good (vibey: bug); abandoned by ana"
    assert run.header.status.value == "failed"
    assert PROTOCOL.describe(run.state).startswith("review cycle 0: failed: review.collect.0")
    assert run.send(StepSucceeded("review.demo.0", {})) == ()


# --- stale and unknown events --------------------------------------------------------------


def test_stale_and_unknown_events_change_nothing() -> None:
    run = until(start(), lambda r: "design.accept.0.0" in r.gates)
    before = run.state
    stale: list[Event] = [
        StepSucceeded("design.interview.0.0.0", {"questions": []}),  # settled already
        StepSucceeded("build.decompose.7", {}),  # never scheduled
        StepFailed("design.spec.0.0", FailureClass.WORK, "late"),
        GateAnswered("visual.opt_in", "yes", "me"),  # not open
        GateAnswered("design.accept.0.0", "maybe", "me"),  # not one of its answers
        GateAnswered("design.accept.0.0", "", "me"),
        TimerFired("deploy.soak.0"),
        Started({"engine": {"name": "other"}}),  # started already
    ]
    for event in stale:
        assert run.send(event) == ()
        assert run.state == before


def test_a_late_result_from_an_earlier_cycle_is_ignored() -> None:
    findings = {"findings": [{"id": "f", "text": "t", "ambiguous": False}]}
    run = until(
        start(),
        lambda r: "build.decompose.1" in r.steps,
        Script(results={"review.triage.0": findings}),
    )
    before = run.state
    assert run.send(StepSucceeded("build.implement.0.0", {"status": "ambiguous"})) == ()
    assert run.send(StepSucceeded("review.triage.0", findings)) == ()
    assert run.state == before


def test_a_free_text_question_takes_any_non_empty_answer() -> None:
    run = start()
    question = {"id": "who", "question": "Who?", "answers": []}
    (gate,) = succeed(run, "design.interview.0.0.0", {"questions": [question]})
    assert isinstance(gate, OpenGate)
    assert (gate.gate, gate.kind, gate.answers, gate.question) == (
        "design.q.0.who",
        "question",
        (),
        "Who?",
    )
    assert run.send(GateAnswered("design.q.0.who", "   ", "me")) == ()
    assert scheduled_in(run.send(GateAnswered("design.q.0.who", "teachers", "me"))) == [
        "design.interview.0.0.1"
    ]


def test_an_interview_asking_an_answered_question_again_moves_on() -> None:
    run = start()
    question = {"id": "who", "question": "Who?", "answers": ["me", "you"]}
    succeed(run, "design.interview.0.0.0", {"questions": [question]})
    run.send(GateAnswered("design.q.0.who", "you", "me"))
    commands = succeed(run, "design.interview.0.0.1", {"questions": [question]})
    assert scheduled_in(commands)[0] == "design.research.0.0"


def test_cancel_is_final() -> None:
    run = start()
    assert run.send(CancelRequested("me", "no longer needed")) == ()
    assert run.header.status.value == "cancelled"
    assert run.send(StepSucceeded("design.interview.0.0.0", {"questions": []})) == ()
    assert PROTOCOL.decide(run.state, CancelRequested("me"), NOW).commands == ()


# --- what raises ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "result", "message"),
    [
        ("design.interview.0.0.0", {}, "missing 'questions'"),
        (
            "design.interview.0.0.0",
            {"questions": [{"id": "", "question": "?", "answers": []}]},
            "'id'",
        ),
        ("design.interview.0.0.0", {"questions": [{"id": "a", "question": "?"}]}, "'answers'"),
        ("design.interview.0.0.0", {"questions": "none"}, "expected array, got string"),
    ],
)
def test_a_malformed_result_raises_a_clear_value_error(
    name: str, result: dict[str, Any], message: str
) -> None:
    run = start()
    with pytest.raises(ResultError, match=message) as caught:
        PROTOCOL.decide(run.state, StepSucceeded(name, result), NOW)
    assert isinstance(caught.value, ValueError)
    assert name in str(caught.value)


@pytest.mark.parametrize(
    ("kind", "result", "message"),
    [
        ("build.decompose", {"work_items": [{"id": "a", "title": "A"}] * 2}, "distinct"),
        ("build.implement", {"status": "stuck"}, "result.status: 'stuck' is not one of"),
        ("build.implement", {"status": "ambiguous"}, "'question'"),
        ("build.verify", {"passed": False}, "'passed' must be true"),
        ("build.integrate", {"merged": []}, "'branch'"),
        (
            "review.triage",
            {"findings": [{"id": "f", "text": "t", "ambiguous": "no"}]},
            "ambiguous: expected boolean",
        ),
        ("deploy.execute", {"deployed": True}, "'url'"),
        ("deploy.triage", {"failure": "gremlins"}, "'failure'"),
        ("deploy.route", {"route": "elsewhere"}, "'route'"),
    ],
)
def test_results_of_each_kind_are_checked(kind: str, result: dict[str, Any], message: str) -> None:
    run = until(
        start(),
        lambda r: any(s.kind == kind for s in r.runnable()),
        Script(answers={"deployment.opt_in": "yes"}),
    )
    name = next(s.step for s in run.runnable() if s.kind == kind)
    with pytest.raises(ResultError, match=message):
        PROTOCOL.decide(run.state, StepSucceeded(name, result), NOW)


@pytest.mark.parametrize(
    "given",
    [
        {},
        {"engine": "scripted"},
        {"engine": {}, "deploy_soak_seconds": -1},
        {"engine": {}, "deploy_soak_seconds": True},
    ],
)
def test_a_start_without_an_engine_object_or_with_a_bad_soak_raises(given: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=r"engine|deploy_soak_seconds"):
        PROTOCOL.decide(PROTOCOL.initial(), Started(given), NOW)


# --- the state codec and describe ----------------------------------------------------------


def test_the_state_round_trips_through_json_at_every_event() -> None:
    script = Script(answers={"deployment.opt_in": "yes", "visual.opt_in": "yes"})
    run = start()
    while not run.finished:
        encoded = json.loads(json.dumps(PROTOCOL.encode_state(run.state)))
        assert PROTOCOL.decode_state(encoded) == run.state
        event = next_event(run, script)
        assert event is not None
        run.send(event)


def test_a_failed_step_gate_round_trips() -> None:
    run = failing("design.spec.0.0")
    run.send(StepFailed("design.spec.0.0", FailureClass.CAPACITY, "x" * 2000))
    (gate,) = run.state.gates
    assert gate.failed is not None and len(gate.note) < 600
    assert decode_state(json.loads(json.dumps(PROTOCOL.encode_state(run.state)))) == run.state


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d.pop("spec"),
        lambda d: d.update(extra=1),
        lambda d: d.update(cycle="0"),
        lambda d: d.update(cycle=True),
        lambda d: d.update(started=1),
        lambda d: d.update(phase="limbo"),
        lambda d: d.update(answers=[["a", "b"]]),
        lambda d: d.update(pending=[{"step": "x"}]),
        lambda d: d["pending"][0].update(after="design.research.0.0"),
        lambda d: d.update(gates={}),
    ],
)
def test_decoding_a_state_is_strict(change: Any) -> None:
    run = until(start(), lambda r: "design.spec.0.0" in r.steps)
    data = json.loads(json.dumps(PROTOCOL.encode_state(run.state)))
    change(data)
    with pytest.raises(StateCodecError):
        PROTOCOL.decode_state(data)


def test_describe_says_what_the_workflow_waits_on() -> None:
    assert PROTOCOL.describe(PROTOCOL.initial()) == "not started"
    run = start()
    assert PROTOCOL.describe(run.state) == "design cycle 0: running design.interview"
    run = until(run, lambda r: "design.accept.0.0" in r.gates)
    assert PROTOCOL.describe(run.state) == "design cycle 0: waiting on gate design.accept.0.0"
    run = until(
        run,
        lambda r: "build.implement.0.1" in r.steps,
        Script(results={"build.decompose.0": items("api", "ui")}),
    )
    assert PROTOCOL.describe(run.state) == "build cycle 0: running build.implement ×2"
    run.send(StepFailed("build.implement.0.0", FailureClass.WORK, "no"))
    assert PROTOCOL.describe(run.state) == (
        "build cycle 0: waiting on gate step.failed.build.implement.0.0; running build.implement"
    )
    drive(run)
    assert PROTOCOL.describe(run.state) == "done cycle 0: completed local"
