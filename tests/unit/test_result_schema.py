"""A step kind's declared result schema is checked when its step settles: a result that does
not match fails the attempt as the engine's, naming the kind and the first mismatch, and no
success reaches the definition."""

from __future__ import annotations

from typing import Any

import pytest

from actors.agents import EngineVerdict
from actors.handlers import to_outcome
from workflows.job import FailureClass
from workflows.protocol.kinds import STEP_KINDS
from workflows.schema import minimal, problem
from workflows.steps import Failure, Success

FINDINGS = STEP_KINDS.get_kind("review.triage").result


@pytest.mark.parametrize(
    ("value", "schema", "wrong"),
    [
        ({}, {"type": "object", "required": ["passed"]}, "result: missing 'passed'"),
        ({"passed": "yes"}, STEP_KINDS.get_kind("build.verify").result, "expected boolean"),
        ({"status": "maybe"}, STEP_KINDS.get_kind("build.implement").result, "not one of"),
        (
            {"findings": [{"id": "f", "text": "t", "ambiguous": "no"}]},
            FINDINGS,
            "result.findings[0].ambiguous: expected boolean, got string",
        ),
        ({"failure": 3}, STEP_KINDS.get_kind("deploy.triage").result, "expected string or null"),
        ({"n": True}, {"properties": {"n": {"type": "integer"}}}, "expected integer, got boolean"),
        ([], {"type": "object"}, "expected object, got array"),
    ],
)
def test_a_mismatch_names_its_path(value: Any, schema: dict[str, Any], wrong: str) -> None:
    found = problem(value, schema)
    assert found is not None and wrong in found, found


def test_what_the_schema_does_not_name_is_allowed() -> None:
    assert problem({"passed": True, "notes": 1}, STEP_KINDS.get_kind("build.verify").result) is None
    assert problem({"failure": None}, STEP_KINDS.get_kind("deploy.triage").result) is None


@pytest.mark.parametrize("kind", sorted(STEP_KINDS))
def test_every_kind_accepts_its_smallest_result(kind: str) -> None:
    schema = STEP_KINDS.get_kind(kind).result
    assert problem(minimal(schema), schema) is None


def test_a_result_that_does_not_match_fails_the_attempt_with_a_clear_reason() -> None:
    outcome = to_outcome("build.verify", EngineVerdict("ok", result={"passed": "yes"}))
    assert isinstance(outcome, Failure)
    assert outcome.failure_class is FailureClass.ENGINE
    assert outcome.detail == (
        "build.verify's result does not match its kind's result schema: "
        "result.passed: expected boolean, got string"
    )


def test_an_alias_is_checked_as_its_kind() -> None:
    outcome = to_outcome("build.plan", EngineVerdict("ok", result={"work_items": [{"id": 1}]}))
    assert isinstance(outcome, Failure)
    assert "build.decompose's result" in outcome.detail


def test_a_matching_result_succeeds() -> None:
    outcome = to_outcome("build.verify", EngineVerdict("ok", result={"passed": True}))
    assert isinstance(outcome, Success)
    assert outcome.result["passed"] is True
