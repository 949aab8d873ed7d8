"""Step kinds and gate kinds: declared once, by the definition that uses them."""

from __future__ import annotations

import pickle
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workflows.dispatch import Lane
from workflows.engine import (
    Decision,
    Event,
    Header,
    OpenGate,
    Registry,
    ScheduleStep,
    Started,
    apply,
    check_answer,
)
from workflows.gates import (
    DELIVERY_EXHAUSTED,
    ENGINE_GATES,
    LADDER_EXHAUSTED,
    SPEND_EXHAUSTED,
    GateConflictError,
    GateKind,
    GateKinds,
    Grant,
    UnknownGateKindError,
)
from workflows.gates import check_answer as check_gate_answer
from workflows.job import FailureClass, UnknownJobKindError, valid_kind_name
from workflows.kinds import TIMER, KindConflictError, StepKind, StepKinds
from workflows.phases import Phase
from workflows.protocol import PROTOCOL
from workflows.protocol.kinds import GATE_KINDS, STEP_KINDS

NOW = datetime(2026, 12, 1, tzinfo=UTC)


class Mini:
    """A definition that is not the protocol: its own kinds, its own gate, no phases."""

    name = "mini"
    version = 1
    first_phase = ""

    def __init__(
        self, kinds: StepKinds | None = None, *, schedule: str = "mini.work", gate: str = ""
    ) -> None:
        self.kinds = kinds if kinds is not None else StepKinds([StepKind("mini.work")])
        self.gates = GateKinds([GateKind("mini_ok", answers=("ok", "no"))])
        self._schedule, self._gate = schedule, gate

    def initial(self) -> dict[str, Any]:
        return {}

    def decide(self, state: dict[str, Any], event: Event, now: datetime) -> Decision[Any]:
        commands: list[Any] = [ScheduleStep(step="w", kind=self._schedule)]
        if self._gate:
            commands.append(OpenGate(gate="g", kind=self._gate, question="ok?"))
        return Decision(state, tuple(commands))

    def encode_state(self, state: dict[str, Any]) -> dict[str, Any]:
        return state

    def decode_state(self, data: Any) -> dict[str, Any]:
        return dict(data)

    def describe(self, state: dict[str, Any]) -> str:
        return "mini"


# --- the protocol's declarations ----------------------------------------------------------


def test_the_protocol_declares_the_seed_25_names_build_resolve_and_the_timer() -> None:
    assert len(STEP_KINDS) == 24  # the seed's 22 kinds, build.resolve and the engine's timer
    assert len(STEP_KINDS.names()) == 27
    assert dict(STEP_KINDS.aliases) == {
        "build.plan": "build.decompose",
        "deploy.accept": "deploy.spec",
        "deploy.graph": "deploy.execute",
    }
    assert STEP_KINDS["workflow.timer"] == TIMER


def test_build_lane_is_the_long_unattended_kinds() -> None:
    build = {name for name in STEP_KINDS.names() if STEP_KINDS.get_kind(name).lane is Lane.BUILD}
    assert build == {
        "build.decompose",
        "build.plan",
        "build.implement",
        "build.verify",
        "build.integrate",
        "build.resolve",
        "deploy.execute",
        "deploy.graph",
    }


@given(st.sampled_from(sorted(STEP_KINDS.names())))
def test_an_alias_means_exactly_its_target(name: str) -> None:
    kind = STEP_KINDS.get_kind(name)
    assert STEP_KINDS.canonical(name) == kind.name
    assert STEP_KINDS.canonical(kind.name) == kind.name


@given(st.sampled_from(sorted(STEP_KINDS)))
def test_interactive_phase_kinds_run_in_the_interactive_lane(name: str) -> None:
    kind = STEP_KINDS[name]
    if kind.phase is not None and Phase(kind.phase).interactive:
        assert kind.lane is Lane.INTERACTIVE


def test_the_protocols_attempts_failures_and_ladders() -> None:
    three = {k for k, v in STEP_KINDS.items() if v.max_attempts == 3}
    assert three == {"build.verify", "deploy.execute"}
    work = {k for k, v in STEP_KINDS.items() if v.failure_class is FailureClass.WORK}
    assert work == {"build.verify", "deploy.execute", "build.resolve"}
    assert STEP_KINDS["build.resolve"].max_attempts == 2  # then the merge queue's gate
    bounded = {k: v.bounded for k, v in STEP_KINDS.items() if v.bounded is not None}
    assert bounded == {"build.implement": "max_attempts", "build.verify": "max_rounds"}
    engine = {k for k, v in STEP_KINDS.items() if v.engine}
    assert engine == set(STEP_KINDS) - {"build.integrate", "workflow.timer"}
    assert STEP_KINDS["build.decompose"].result_keys() == ("work_items",)
    assert STEP_KINDS["deploy.execute"].result_keys() == ("deployed", "url")


def test_kinds_and_gate_kinds_pickle_for_worker_processes() -> None:
    assert pickle.loads(pickle.dumps(STEP_KINDS)) == STEP_KINDS
    assert pickle.loads(pickle.dumps(GATE_KINDS)) == GATE_KINDS


# --- registries ---------------------------------------------------------------------------


def test_a_kind_declared_twice_alike_is_one_kind() -> None:
    registry = Registry([PROTOCOL, Mini(StepKinds([STEP_KINDS["design.spec"]]), schedule="x")])
    assert registry.kinds["design.spec"] == STEP_KINDS["design.spec"]
    assert "mini_ok" in registry.gates and "approval" in registry.gates


def test_a_kind_declared_twice_differently_fails_at_load_in_one_line() -> None:
    other = replace(STEP_KINDS["design.spec"], lease=timedelta(minutes=9))
    with pytest.raises(KindConflictError) as raised:
        Registry([PROTOCOL, Mini(StepKinds([other]))])
    message = str(raised.value)
    assert "\n" not in message
    assert "mini v1" in message and "'design.spec'" in message and "lease" in message


def test_an_alias_that_names_another_kind_is_a_conflict() -> None:
    with pytest.raises(KindConflictError, match="alias"):
        StepKinds([StepKind("a.b"), StepKind("c.d", aliases=("a.b",))])
    with pytest.raises(KindConflictError, match="alias"):
        STEP_KINDS.merged([StepKind("x.y", aliases=("build.plan",))])


def test_a_gate_kind_declared_twice_differently_fails_at_load() -> None:
    with pytest.raises(GateConflictError):
        GATE_KINDS.merged([GateKind("approval", answers=("maybe",))])


@given(st.text(max_size=12))
def test_kind_names_are_dotted_lowercase_words(name: str) -> None:
    if valid_kind_name(name):
        StepKind(name)
    else:
        with pytest.raises(ValueError, match="not a kind name"):
            StepKind(name)


def test_a_bounded_kind_needs_a_ladder() -> None:
    with pytest.raises(ValueError, match="ladder"):
        StepKind("a.b", bounded="max_attempts")


# --- the engine takes kinds from the definition ---------------------------------------------


def test_a_definition_schedules_only_the_kinds_it_declares() -> None:
    _, decision = apply(Mini(), Header(), {}, Started(), NOW)
    assert decision.commands == (ScheduleStep(step="w", kind="mini.work"),)
    with pytest.raises(UnknownJobKindError, match=r"mini\.other"):
        apply(Mini(schedule="mini.other"), Header(), {}, Started(), NOW)


def test_an_alias_is_recorded_as_its_kind() -> None:
    mini = Mini(STEP_KINDS, schedule="build.plan")
    _, decision = apply(mini, Header(), {}, Started(), NOW)
    assert decision.commands == (ScheduleStep(step="w", kind="build.decompose"),)


def test_a_definition_opens_only_gate_kinds_it_or_the_engine_declares() -> None:
    for gate in ("mini_ok", "workflow_error"):
        apply(Mini(gate=gate), Header(), {}, Started(), NOW)
    with pytest.raises(UnknownGateKindError, match="approval"):
        apply(Mini(gate="approval"), Header(), {}, Started(), NOW)


def test_the_first_phase_is_the_definitions() -> None:
    from workflows.engine import initial_header

    assert initial_header(PROTOCOL).phase == "intake"
    assert initial_header(Mini()).phase == ""


# --- gate kinds: one validator, grants ------------------------------------------------------


@pytest.mark.parametrize(
    ("answer", "problem"),
    [("3", None), ("0", "below"), ("51", "above"), ("x", "not an integer"), (" 3", "integer")],
)
def test_a_ladder_gate_takes_a_number_from_1_to_50(answer: str, problem: str | None) -> None:
    found = ENGINE_GATES.problem(LADDER_EXHAUSTED.name, answer)
    assert (found is None) if problem is None else (problem in str(found))


def test_the_gate_instance_narrows_its_kind() -> None:
    gate = OpenGate(gate="g", kind="approval", question="?", answers=("accept", "revise"))
    assert check_answer(gate, "accept", GATE_KINDS) is None
    assert "valid: accept, revise" in str(check_answer(gate, "yes", GATE_KINDS))
    opt_in = OpenGate(gate="o", kind="opt_in", question="?")
    assert check_answer(opt_in, "yes", GATE_KINDS) is None
    assert check_answer(opt_in, "perhaps", GATE_KINDS) is not None


@given(st.integers(min_value=1, max_value=50))
def test_what_each_engine_gate_grants(number: int) -> None:
    assert LADDER_EXHAUSTED.attempts_granted(str(number)) == number
    assert DELIVERY_EXHAUSTED.attempts_granted("anything") == 1
    assert SPEND_EXHAUSTED.attempts_granted(str(number)) == 1  # the parked claim's attempt
    assert ENGINE_GATES["handoff"].attempts_granted("retry") == 0
    assert ENGINE_GATES["workflow_error"].grant is Grant.NONE


@given(st.text(max_size=20))
def test_a_free_answer_is_any_non_empty_text(answer: str) -> None:
    assert (check_gate_answer(answer) is None) == bool(answer.strip())
