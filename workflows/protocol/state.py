"""The protocol's state: what it must remember between events, and its strict JSON codec.

The state keeps only what later decisions read: the engine object to copy into step inputs,
the phase and counters that make names unique, the answers, the accepted spec, the steps in
flight and the gates open. Step results are evidence and stay on their jobs.

:func:`encode_state` gives plain JSON; :func:`decode_state` accepts exactly that shape (no
missing or extra keys, no value of the wrong type) and raises :class:`StateCodecError`
otherwise, so ``decode_state(encode_state(s)) == s`` and nothing else decodes. The one
exception is the fields added after states were stored (``review_feedback``, ``plan`` and
``merge``): each is written only when it is not its default, and a state without it decodes
with its default.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any, TypeAlias

from workflows.engine import CodecError
from workflows.merge_queue import MergeQueue
from workflows.phases import Phase

JsonObject: TypeAlias = Mapping[str, Any]
Answers: TypeAlias = tuple[tuple[str, str], ...]
Plan: TypeAlias = tuple[tuple[str, str], ...]
ADDED: frozenset[str] = frozenset({"review_feedback", "plan", "merge"})


class StateCodecError(CodecError):
    """A stored protocol state that is not exactly one :func:`encode_state` wrote."""


@dataclass(frozen=True, slots=True)
class Pending:
    """A step scheduled and not yet settled. ``input`` is the step's input without the engine
    object (added back when it is scheduled again); ``origin`` is the name the protocol first
    gave it, ``retries`` how many times it has been scheduled again since."""

    step: str
    kind: str
    subject: str
    cycle: int
    input: JsonObject
    after: tuple[str, ...] = ()
    origin: str = ""
    retries: int = 0
    max_attempts: int = 5


@dataclass(frozen=True, slots=True)
class Gate:
    """An open gate. ``role`` says what an answer does (``design.q``, ``design.accept``,
    ``visual.opt_in``, ``visual.accept``, ``deployment.opt_in``, ``deploy.q``,
    ``deploy.accept``, ``deploy.signoff``, ``step.failed``, ``build.merge_conflict``);
    ``answers`` are the allowed ones
    (empty: any non-empty text); ``ref`` is the question id of a question gate (the work item of
    a ``build.merge_conflict`` gate); ``failed`` the
    step a ``step.failed`` gate is about and ``note`` why it failed."""

    name: str
    role: str
    answers: tuple[str, ...] = ()
    ref: str = ""
    failed: Pending | None = None
    note: str = ""


@dataclass(frozen=True, slots=True)
class ProtocolState:
    started: bool = False
    engine: JsonObject = field(default_factory=dict)
    soak_seconds: int = 1
    review_feedback: bool = False  # REVIEW asks the user (the workflow input's review_feedback)
    phase: str = Phase.INTAKE.value
    cycle: int = 0
    design_round: int = 0  # DESIGN rounds (revisions) within the cycle
    interviews: int = 0  # interviews in the current design or deploy round
    answers: Answers = ()
    ambiguity: str | None = None  # the open question DESIGN was sent back with
    spec: str = ""
    visual_asked: bool = False
    deployment_asked: bool = False
    items: tuple[str, ...] = ()  # this cycle's work item ids
    ambiguities: tuple[str, ...] = ()  # questions the cycle's implements reported
    branch: str = ""
    review_rounds: int = 0
    deploy_round: int = -1  # -1: no deploy round yet
    deploy_answers: Answers = ()
    url: str = ""
    timer: str | None = None
    pending: tuple[Pending, ...] = ()
    gates: tuple[Gate, ...] = ()
    ended: str | None = None  # "completed <mode>" or "failed: <reason>"
    plan: Plan = ()  # this BUILD cycle's work items (id, title), for the merge queue's intents
    merge: MergeQueue | None = None  # the cycle's merge queue, once an item conflicted


# --- encoding ------------------------------------------------------------------------------


def encode_state(state: ProtocolState) -> dict[str, Any]:
    data = {f.name: getattr(state, f.name) for f in fields(state)}
    data["engine"] = plain_json(state.engine)
    data["answers"] = dict(state.answers)
    data["deploy_answers"] = dict(state.deploy_answers)
    data["items"] = list(state.items)
    data["ambiguities"] = list(state.ambiguities)
    data["pending"] = [_encode_pending(p) for p in state.pending]
    data["gates"] = [_encode_gate(g) for g in state.gates]
    data["plan"] = [{"id": item, "title": title} for item, title in state.plan]
    data["merge"] = None if state.merge is None else _encode_queue(state.merge)
    for name in ADDED:  # added fields, left out at their defaults: older states and the
        if getattr(state, name) == _DEFAULTS[name]:  # golden histories encode as they did
            del data[name]
    return data


_DEFAULTS: dict[str, Any] = {f.name: f.default for f in fields(ProtocolState) if f.name in ADDED}


def _encode_queue(queue: MergeQueue) -> dict[str, Any]:
    data = {f.name: getattr(queue, f.name) for f in fields(queue)}
    for name in ("order", "dropped", "resolving", "parked", "waiting"):
        data[name] = list(data[name])
    data["conflicts"] = dict(queue.conflicts)
    data["resolves"] = dict(queue.resolves)
    return data


def _encode_pending(pending: Pending) -> dict[str, Any]:
    data = {f.name: getattr(pending, f.name) for f in fields(pending)}
    data["input"] = plain_json(pending.input)
    data["after"] = list(pending.after)
    return data


def _encode_gate(gate: Gate) -> dict[str, Any]:
    data = {f.name: getattr(gate, f.name) for f in fields(gate)}
    data["answers"] = list(gate.answers)
    data["failed"] = None if gate.failed is None else _encode_pending(gate.failed)
    return data


def plain_json(value: JsonObject) -> dict[str, Any]:
    """A JSON-only copy (lists, not tuples): what the value reads back as once stored."""
    plain: dict[str, Any] = json.loads(json.dumps(value, allow_nan=False))
    return plain


# --- decoding ------------------------------------------------------------------------------

Decoder: TypeAlias = Callable[[Any], Any]


def _exact(kind: type[Any]) -> Decoder:
    def check(value: Any) -> Any:
        if type(value) is not kind:
            raise StateCodecError(f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    return check


def _optional(decoder: Decoder) -> Decoder:
    def check(value: Any) -> Any:
        return None if value is None else decoder(value)

    return check


def _object(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise StateCodecError(f"expected a JSON object, got {type(value).__name__}")
    return plain_json(value)


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise StateCodecError("expected a list of strings")
    return tuple(value)


def _answers(value: Any) -> Answers:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise StateCodecError("answers are a JSON object of strings")
    return tuple(value.items())


def _plan(value: Any) -> Plan:
    if not isinstance(value, list) or not all(
        isinstance(v, Mapping)
        and set(v) == {"id", "title"}
        and isinstance(v["id"], str)
        and isinstance(v["title"], str)
        for v in value
    ):
        raise StateCodecError("plan is a list of {id, title} objects of strings")
    return tuple((v["id"], v["title"]) for v in value)


def _counts(value: Any) -> tuple[tuple[str, int], ...]:
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and type(v) is int for k, v in value.items()
    ):
        raise StateCodecError("counts are a JSON object of whole numbers")
    return tuple(sorted(value.items()))


def _list_of(decoder: Decoder) -> Decoder:
    def check(value: Any) -> tuple[Any, ...]:
        if not isinstance(value, list):
            raise StateCodecError("expected a list")
        return tuple(decoder(item) for item in value)

    return check


def _record(
    cls: type[Any], decoders: Mapping[str, Decoder], added: frozenset[str] = frozenset()
) -> Decoder:
    """``added``: fields newer than some stored states, which may be missing (the
    dataclass default stands in); every other field must be there."""
    names = {f.name for f in fields(cls)}
    if names != set(decoders):  # pragma: no cover - a programming error, caught at import
        raise TypeError(f"{cls.__name__}: the decoders do not match the fields")

    def check(value: Any) -> Any:
        if not isinstance(value, Mapping):
            raise StateCodecError(f"{cls.__name__} is a JSON object, got {type(value).__name__}")
        extra, missing = set(value) - names, names - set(value) - added
        if extra or missing:
            raise StateCodecError(
                f"{cls.__name__}: unknown {sorted(extra)} / missing {sorted(missing)} field(s)"
            )
        try:
            return cls(**{name: decoders[name](value[name]) for name in decoders if name in value})
        except StateCodecError as exc:
            raise StateCodecError(f"{cls.__name__}: {exc}") from None

    return check


_str, _int, _bool = _exact(str), _exact(int), _exact(bool)

_pending = _record(
    Pending,
    {
        "step": _str,
        "kind": _str,
        "subject": _str,
        "cycle": _int,
        "input": _object,
        "after": _strings,
        "origin": _str,
        "retries": _int,
        "max_attempts": _int,
    },
)
_gate = _record(
    Gate,
    {
        "name": _str,
        "role": _str,
        "answers": _strings,
        "ref": _str,
        "failed": _optional(_pending),
        "note": _str,
    },
)
_merge_queue = _record(
    MergeQueue,
    {
        "order": _strings,
        "max_resolves": _int,
        "dropped": _strings,
        "resolving": _strings,
        "parked": _strings,
        "waiting": _strings,
        "conflicts": _counts,
        "resolves": _counts,
        "passes": _int,
        "in_pass": _bool,
        "pass_conflicted": _bool,
    },
)
_state = _record(
    ProtocolState,
    {
        "started": _bool,
        "engine": _object,
        "soak_seconds": _int,
        "review_feedback": _bool,
        "phase": _str,
        "cycle": _int,
        "design_round": _int,
        "interviews": _int,
        "answers": _answers,
        "ambiguity": _optional(_str),
        "spec": _str,
        "visual_asked": _bool,
        "deployment_asked": _bool,
        "items": _strings,
        "ambiguities": _strings,
        "branch": _str,
        "review_rounds": _int,
        "deploy_round": _int,
        "deploy_answers": _answers,
        "url": _str,
        "timer": _optional(_str),
        "pending": _list_of(_pending),
        "gates": _list_of(_gate),
        "ended": _optional(_str),
        "plan": _plan,
        "merge": _optional(_merge_queue),
    },
    added=ADDED,
)


def decode_state(data: Any) -> ProtocolState:
    state: ProtocolState = _state(data)
    if state.phase not in {p.value for p in Phase}:
        raise StateCodecError(f"ProtocolState: unknown phase {state.phase!r}")
    return state
