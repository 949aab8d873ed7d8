"""Step results: the shape each kind's result is declared in, and the readers of the keys the
protocol reads (docs/protocol.md, "Results").

Each shape below is the JSON schema of a kind's result, declared here once: the kind registry
(:mod:`workflows.protocol.kinds`) gives it to its :class:`~workflows.kinds.StepKind`, so the
engines are asked for exactly it and the worker checks a verdict against it before the step
settles; the readers check a result against the same shape before they read it. Each reader
takes the step's name and its result and returns plain values, or raises :class:`ResultError`
naming the step, the key and what was wrong. Keys the protocol does not read are evidence: they
are left alone, never checked and never kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from workflows.merge_queue import Conflict
from workflows.schema import problem

JsonObject: TypeAlias = Mapping[str, Any]

DEPLOY_FAILURES: frozenset[str] = frozenset(
    {"infra", "config", "design", "product", "code", "review"}
)
"""What deploy.triage may name: the execution (infra, config), the deployment's design, the
product's design, the code, or the review. deploy.route sends each where it is mended."""
ROUTES: tuple[str, ...] = ("done", "deploy_execute", "deploy_design", "design", "build", "review")
IMPLEMENT_STATUSES: tuple[str, ...] = ("done", "ambiguous")
DEMO_KEYS: tuple[str, ...] = ("summary", "diff_stat", "how_to_run")
"""What a review.demo result may say (all optional): shown at the review.feedback gate."""


# --- the shapes ------------------------------------------------------------------------------

TEXT: JsonObject = {"type": "string"}
BOOLEAN: JsonObject = {"type": "boolean"}


def shape(**keys: JsonObject) -> dict[str, Any]:
    """An object that must carry ``keys``, each of its schema."""
    return {"type": "object", "required": sorted(keys), "properties": dict(keys)}


def array(items: JsonObject) -> dict[str, Any]:
    return {"type": "array", "items": items}


NOTHING = shape()  # a result the protocol does not read
QUESTIONS = shape(questions=array(shape(id=TEXT, question=TEXT, answers=array(TEXT))))
NOTES = shape(notes=TEXT)
SUMMARY = shape(summary=TEXT)
SPEC = shape(spec=TEXT)
PLAN = shape(plan=TEXT)
WORK_ITEMS = shape(work_items=array(shape(id=TEXT, title=TEXT)))
IMPLEMENTED = shape(status={"enum": list(IMPLEMENT_STATUSES)})
VERIFIED = shape(passed=BOOLEAN)
RESOLVED = shape(resolved=BOOLEAN)
INTEGRATED = shape(branch=TEXT)
FEEDBACK = shape(feedback=array(TEXT))
FINDINGS = shape(findings=array(shape(id=TEXT, text=TEXT, ambiguous=BOOLEAN)))
CHOICE = shape(question=TEXT, recommendation=TEXT)
DEPLOYED = shape(deployed=BOOLEAN, url=TEXT)
TRIAGED = shape(failure={"type": ["string", "null"]})
ROUTED = shape(route=TEXT)


# --- the readers -----------------------------------------------------------------------------


class ResultError(ValueError):
    """A step result without a key the protocol reads, or with a value of the wrong shape."""

    def __init__(self, step: str, detail: str) -> None:
        super().__init__(
            f"step {step}: {detail}; see docs/protocol.md for the result its kind must return"
        )
        self.step = step


@dataclass(frozen=True, slots=True)
class Question:
    id: str
    question: str
    answers: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class Finding:
    id: str
    text: str
    ambiguous: bool


def shaped(step: str, result: JsonObject, schema: JsonObject) -> JsonObject:
    """``result``, once it matches ``schema``; :class:`ResultError` naming the first mismatch."""
    wrong = problem(result, schema)
    if wrong is not None:
        raise ResultError(step, wrong)
    return result


def _named(step: str, value: str, what: str) -> str:
    if not value:
        raise ResultError(step, f"{what} must be a non-empty string")
    return value


def questions(step: str, result: JsonObject) -> tuple[Question, ...]:
    """:data:`QUESTIONS`, with non-empty ids and answers (design/deploy.interview)."""
    read = []
    for item in shaped(step, result, QUESTIONS)["questions"]:
        answers = item["answers"]
        if not all(answers):
            raise ResultError(step, "a question's 'answers' must be a list of non-empty strings")
        read.append(
            Question(
                id=_named(step, item["id"], "a question's 'id'"),
                question=item["question"],
                answers=tuple(dict.fromkeys(answers)),
            )
        )
    return tuple(read)


def text(step: str, result: JsonObject, key: str) -> str:
    """A string the protocol keeps or shows (``spec``, ``branch``, ``question``)."""
    value: str = shaped(step, result, shape(**{key: TEXT}))[key]
    return value


def work_items(step: str, result: JsonObject) -> list[dict[str, str]]:
    """:data:`WORK_ITEMS` with distinct, non-empty ids (build.decompose)."""
    items = [
        {"id": _named(step, item["id"], "a work item's 'id'"), "title": item["title"]}
        for item in shaped(step, result, WORK_ITEMS)["work_items"]
    ]
    ids = [item["id"] for item in items]
    if len(set(ids)) != len(ids):
        raise ResultError(step, f"work item ids must be distinct, got {ids}")
    return items


def ambiguity(step: str, result: JsonObject) -> str | None:
    """build.implement (:data:`IMPLEMENTED`): ``None`` when done, else the question it could
    not answer."""
    if shaped(step, result, IMPLEMENTED)["status"] == "done":
        return None
    if not isinstance(result.get("question"), str):
        raise ResultError(step, "an ambiguous item's 'question' must be a string")
    question: str = result["question"]
    return question


def passed(step: str, result: JsonObject) -> None:
    """build.verify succeeds only with ``{"passed": true}`` (a failing verify is a Failure)."""
    if shaped(step, result, VERIFIED)["passed"] is not True:
        raise ResultError(step, "'passed' must be true (a failing verify returns Failure(work))")


CONFLICTS: JsonObject = {
    "type": "object",
    "properties": {
        "conflicts": array(
            {
                "type": "object",
                "required": ["item"],
                "properties": {"item": TEXT, "files": array(TEXT), "against": array(TEXT)},
            }
        )
    },
}
"""What vibey's own build.verify and build.integrate add to their results (no key: none)."""


def conflicts(step: str, result: JsonObject) -> tuple[Conflict, ...]:
    """build.verify and build.integrate: the items of the pass that did not merge
    (:data:`CONFLICTS`)."""
    return tuple(
        Conflict(
            _named(step, entry["item"], "a conflict's 'item'"),
            tuple(entry.get("files", ())),
            tuple(entry.get("against", ())),
        )
        for entry in shaped(step, result, CONFLICTS).get("conflicts", ())
    )


def feedback(step: str, result: JsonObject) -> list[str]:
    return list(shaped(step, result, FEEDBACK)["feedback"])


def findings(step: str, result: JsonObject) -> tuple[Finding, ...]:
    """:data:`FINDINGS` (review.triage)."""
    return tuple(
        Finding(id=item["id"], text=item["text"], ambiguous=item["ambiguous"])
        for item in shaped(step, result, FINDINGS)["findings"]
    )


def deployed_url(step: str, result: JsonObject) -> str:
    if shaped(step, result, DEPLOYED)["deployed"] is not True:
        raise ResultError(step, "'deployed' must be true (a failed deploy returns Failure(work))")
    url: str = result["url"]
    return url


def failure(step: str, result: JsonObject) -> str | None:
    value = shaped(step, result, TRIAGED)["failure"]
    if value is not None and value not in DEPLOY_FAILURES:
        known = ", ".join(sorted(DEPLOY_FAILURES))
        raise ResultError(step, f"'failure' must be null or one of {known}, got {value!r}")
    failure_: str | None = value
    return failure_


def route(step: str, result: JsonObject) -> str:
    value = shaped(step, result, ROUTED)["route"]
    if value not in ROUTES:
        raise ResultError(step, f"'route' must be one of {', '.join(ROUTES)}, got {value!r}")
    route_: str = value
    return route_
