"""Reading step results: the keys the protocol reads, checked (docs/protocol.md, "Results").

Each reader takes the step's name and its result and returns plain values, or raises
:class:`ResultError` naming the step, the key and what was wrong. Keys the protocol does not
read are evidence: they are left alone, never checked and never kept.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeAlias

from workflows.merge_queue import Conflict

JsonObject: TypeAlias = Mapping[str, Any]

DEPLOY_FAILURES: frozenset[str] = frozenset({"infra", "config", "product", "code", "review"})
ROUTES: tuple[str, ...] = ("done", "deploy_execute", "deploy_design", "design", "build", "review")
IMPLEMENT_STATUSES: frozenset[str] = frozenset({"done", "ambiguous"})
DEMO_KEYS: tuple[str, ...] = ("summary", "diff_stat", "how_to_run")
"""What a review.demo result may say (all optional): shown at the review.feedback gate."""


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


def _key(step: str, result: JsonObject, key: str) -> Any:
    if key not in result:
        raise ResultError(step, f"the result has no {key!r}")
    return result[key]


def _text(step: str, value: Any, what: str, *, empty: bool = True) -> str:
    if not isinstance(value, str) or (not empty and not value):
        raise ResultError(step, f"{what} must be a {'' if empty else 'non-empty '}string")
    return value


def _objects(step: str, result: JsonObject, key: str) -> list[JsonObject]:
    value = _key(step, result, key)
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise ResultError(step, f"{key!r} must be a list of objects")
    return value


def questions(step: str, result: JsonObject) -> tuple[Question, ...]:
    """``{"questions": [{"id", "question", "answers": [str]}]}`` (design/deploy.interview)."""
    read = []
    for item in _objects(step, result, "questions"):
        answers = _key(step, item, "answers")
        if not isinstance(answers, list) or not all(isinstance(a, str) and a for a in answers):
            raise ResultError(step, "a question's 'answers' must be a list of non-empty strings")
        read.append(
            Question(
                id=_text(step, _key(step, item, "id"), "a question's 'id'", empty=False),
                question=_text(step, _key(step, item, "question"), "a question's 'question'"),
                answers=tuple(dict.fromkeys(answers)),
            )
        )
    return tuple(read)


def text(step: str, result: JsonObject, key: str) -> str:
    """A string the protocol keeps or shows (``spec``, ``branch``, ``question``)."""
    return _text(step, _key(step, result, key), repr(key))


def work_items(step: str, result: JsonObject) -> list[dict[str, str]]:
    """``{"work_items": [{"id", "title"}]}`` with distinct, non-empty ids (build.decompose)."""
    items = []
    for item in _objects(step, result, "work_items"):
        items.append(
            {
                "id": _text(step, _key(step, item, "id"), "a work item's 'id'", empty=False),
                "title": _text(step, _key(step, item, "title"), "a work item's 'title'"),
            }
        )
    ids = [item["id"] for item in items]
    if len(set(ids)) != len(ids):
        raise ResultError(step, f"work item ids must be distinct, got {ids}")
    return items


def ambiguity(step: str, result: JsonObject) -> str | None:
    """build.implement: ``None`` when done, else the question it could not answer."""
    status = _key(step, result, "status")
    if status not in IMPLEMENT_STATUSES:
        raise ResultError(step, f"'status' must be 'done' or 'ambiguous', got {status!r}")
    if status == "done":
        return None
    return _text(step, _key(step, result, "question"), "an ambiguous item's 'question'")


def passed(step: str, result: JsonObject) -> None:
    """build.verify succeeds only with ``{"passed": true}`` (a failing verify is a Failure)."""
    if _key(step, result, "passed") is not True:
        raise ResultError(step, "'passed' must be true (a failing verify returns Failure(work))")


def conflicts(step: str, result: JsonObject) -> tuple[Conflict, ...]:
    """build.verify and build.integrate: the items of the pass that did not merge,
    ``{"conflicts": [{"item", "files": [str], "against": [str]}]}`` (no key: none)."""
    value = result.get("conflicts", [])
    if not isinstance(value, list) or not all(isinstance(v, Mapping) for v in value):
        raise ResultError(step, "'conflicts' must be a list of objects")
    read = []
    for entry in value:
        item = _text(step, _key(step, entry, "item"), "a conflict's 'item'", empty=False)
        lists = []
        for key in ("files", "against"):
            names = entry.get(key, [])
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ResultError(step, f"a conflict's {key!r} must be a list of strings")
            lists.append(tuple(names))
        read.append(Conflict(item, lists[0], lists[1]))
    return tuple(read)


def feedback(step: str, result: JsonObject) -> list[str]:
    value = _key(step, result, "feedback")
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ResultError(step, "'feedback' must be a list of strings")
    return list(value)


def findings(step: str, result: JsonObject) -> tuple[Finding, ...]:
    """``{"findings": [{"id", "text", "ambiguous": bool}]}`` (review.triage)."""
    read = []
    for item in _objects(step, result, "findings"):
        ambiguous = _key(step, item, "ambiguous")
        if not isinstance(ambiguous, bool):
            raise ResultError(step, "a finding's 'ambiguous' must be true or false")
        read.append(
            Finding(
                id=_text(step, _key(step, item, "id"), "a finding's 'id'"),
                text=_text(step, _key(step, item, "text"), "a finding's 'text'"),
                ambiguous=ambiguous,
            )
        )
    return tuple(read)


def deployed_url(step: str, result: JsonObject) -> str:
    if _key(step, result, "deployed") is not True:
        raise ResultError(step, "'deployed' must be true (a failed deploy returns Failure(work))")
    return text(step, result, "url")


def failure(step: str, result: JsonObject) -> str | None:
    value = _key(step, result, "failure")
    if value is not None and value not in DEPLOY_FAILURES:
        known = ", ".join(sorted(DEPLOY_FAILURES))
        raise ResultError(step, f"'failure' must be null or one of {known}, got {value!r}")
    failure_: str | None = value
    return failure_


def route(step: str, result: JsonObject) -> str:
    value = _key(step, result, "route")
    if value not in ROUTES:
        raise ResultError(step, f"'route' must be one of {', '.join(ROUTES)}, got {value!r}")
    route_: str = value
    return route_
