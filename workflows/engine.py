"""The workflow engine's pure core: events, commands, definitions, decide, replay.

A workflow definition is a named, versioned, deterministic state machine::

    decide(state, event, now) -> Decision(state, commands)

The store appends every event to the workflow's history, calls :func:`apply`, and carries out
the commands in the same transaction. Nothing here reads a clock or makes an id: ``now`` is an
argument, and step, gate and timer names are chosen by the definition, so replaying a history
through the same definition reproduces the same states and commands (:func:`replay`).

The engine, not the definition, owns three rules (:func:`apply`):

* a finished workflow (completed, failed, cancelled) absorbs every later event: no commands;
* ``CancelRequested`` cancels a running workflow whatever the definition says;
* the header (phase, cycle, status, completion mode) follows the commands
  (``TransitionPhase``, ``Complete``, ``Fail``), so the store can index it.

Events and commands are frozen dataclasses with a strict JSON codec (:func:`encode_event`,
:func:`decode_event`, :func:`encode_command`, :func:`decode_command`): an unknown type, a
missing or extra field, or a value of the wrong type raises :class:`CodecError`.

Exceptions::

    WorkflowError
    ├── CodecError              a stored event or command that is not exactly one of ours
    ├── UnknownDefinitionError  a definition name/version this process does not have
    └── NonDeterminismError     replay disagrees with what was recorded (``seq`` says where)
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from datetime import datetime, timedelta
from typing import Any, Generic, Protocol, TypeAlias, TypeVar

from workflows.gates import ENGINE_GATES, GateKinds, UnknownGateKindError
from workflows.job import FailureClass, check_kind_name
from workflows.kinds import TIMER, KindConflictError, StepKinds

JsonObject: TypeAlias = Mapping[str, Any]
ON_DEADLINE_ANSWER, ON_DEADLINE_ESCALATE, ON_DEADLINE_FAIL = "answer", "escalate", "fail"
ON_DEADLINE = (ON_DEADLINE_ANSWER, ON_DEADLINE_ESCALATE, ON_DEADLINE_FAIL)


class WorkflowError(Exception):
    """Root of the workflow engine's errors."""


class CodecError(WorkflowError, ValueError):
    pass


class UnknownDefinitionError(WorkflowError):
    def __init__(self, name: str, version: int | None, known: Iterable[str]) -> None:
        which = name if version is None else f"{name} v{version}"
        super().__init__(
            f"workflow definition {which} is not registered here; known: {', '.join(known)}"
        )
        self.name = name
        self.version = version


class NonDeterminismError(WorkflowError):
    def __init__(self, seq: int, detail: str) -> None:
        super().__init__(f"replay diverges at event #{seq}: {detail}")
        self.seq = seq
        self.detail = detail


class Status(enum.StrEnum):
    RUNNING = "running"
    BLOCKED = "blocked"  # decide failed (or replay diverged): waits behind a workflow_error gate
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"

    @property
    def finished(self) -> bool:
        return self in (Status.COMPLETED, Status.FAILED, Status.CANCELLED)


# --- events ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Started:
    input: JsonObject = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepSucceeded:
    step: str
    result: JsonObject = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class StepFailed:
    """The step's job failed for good (its attempts are spent)."""

    step: str
    failure_class: FailureClass
    detail: str


@dataclass(frozen=True, slots=True)
class GateAnswered:
    gate: str
    answer: str
    by: str


@dataclass(frozen=True, slots=True)
class TimerFired:
    timer: str


@dataclass(frozen=True, slots=True)
class CancelRequested:
    by: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class GateExpired:
    """A gate whose deadline passed with ``on_deadline=fail``: the engine fails the workflow
    (the definition never sees it)."""

    gate: str


Event: TypeAlias = (
    Started | StepSucceeded | StepFailed | GateAnswered | TimerFired | CancelRequested | GateExpired
)


# --- commands ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class ScheduleStep:
    """Run a job of ``kind`` (one the definition declares: its lane, lease and default attempts
    are the kind's). ``step`` names it within the workflow, once for all time; ``after`` names
    earlier (or same-decision) steps that must succeed first. ``max_attempts`` ``None`` takes
    the kind's."""

    step: str
    kind: str
    subject: str = ""
    input: JsonObject = field(default_factory=dict)
    after: tuple[str, ...] = ()
    delay: timedelta = timedelta(0)
    cycle: int = 0
    max_attempts: int = 5

    def __post_init__(self) -> None:
        if not self.step:
            raise ValueError("a step needs a name")
        check_kind_name(self.kind)
        if self.delay < timedelta(0):
            raise ValueError("a step's delay must not be negative")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")


@dataclass(frozen=True, slots=True)
class OpenGate:
    """Ask a person. ``answers`` lists the allowed answers; empty means ``schema`` decides
    (see :func:`check_answer`); both empty accepts any non-empty answer.

    ``deadline`` (after the gate opens) and ``on_deadline`` say what happens when nobody
    answers in time: ``answer`` records ``default`` (validated like any answer, ledgered as
    the default, not a person's), ``escalate`` reports it and keeps waiting, ``fail`` fails
    the workflow. ``reminders`` are the ages at which a ``gate.reminded`` event is sent."""

    gate: str
    kind: str
    question: str
    answers: tuple[str, ...] = ()
    schema: JsonObject = field(default_factory=dict)
    context: JsonObject = field(default_factory=dict)
    evidence: JsonObject = field(default_factory=dict)
    deadline: timedelta | None = None
    on_deadline: str = ON_DEADLINE_ANSWER
    default: str | None = None
    reminders: tuple[timedelta, ...] = ()

    def __post_init__(self) -> None:
        if self.on_deadline not in ON_DEADLINE:
            raise ValueError(f"on_deadline is one of {', '.join(ON_DEADLINE)}")
        if self.deadline is not None:
            if self.deadline <= timedelta(0):
                raise ValueError("a gate's deadline is positive")
            if self.on_deadline == ON_DEADLINE_ANSWER and self.default is None:
                raise ValueError("a gate answered at its deadline needs a default answer")
        if any(r <= timedelta(0) for r in self.reminders):
            raise ValueError("a gate's reminder ages are positive")


@dataclass(frozen=True, slots=True)
class StartTimer:
    timer: str
    delay: timedelta


@dataclass(frozen=True, slots=True)
class TransitionPhase:
    phase: str
    cycle: int


@dataclass(frozen=True, slots=True)
class Complete:
    mode: str


@dataclass(frozen=True, slots=True)
class Fail:
    reason: str


Command: TypeAlias = ScheduleStep | OpenGate | StartTimer | TransitionPhase | Complete | Fail

S = TypeVar("S")


@dataclass(frozen=True, slots=True)
class Decision(Generic[S]):
    state: S
    commands: tuple[Command, ...] = ()


class Definition(Protocol[S]):
    """A workflow definition. ``decide`` must be a pure function of its arguments.

    ``kinds`` declares every step kind it schedules and ``gates`` every gate kind it opens
    (beyond the engine's own, :data:`workflows.gates.ENGINE_GATES`); ``first_phase`` is the
    phase a new workflow starts in (``""``: the definition has no phases)."""

    @property
    def name(self) -> str: ...

    @property
    def version(self) -> int: ...

    @property
    def kinds(self) -> StepKinds: ...

    @property
    def gates(self) -> GateKinds: ...

    @property
    def first_phase(self) -> str: ...

    def initial(self) -> S: ...

    def decide(self, state: S, event: Event, now: datetime) -> Decision[S]: ...

    def encode_state(self, state: S) -> JsonObject: ...

    def decode_state(self, data: JsonObject) -> S: ...

    def describe(self, state: S) -> str:
        """One line: what the workflow is doing or waiting on."""
        ...


# --- the header the store indexes, and the engine's rules ----------------------------------


@dataclass(frozen=True, slots=True)
class Header:
    phase: str = ""
    cycle: int = 0
    status: Status = Status.RUNNING
    completion_mode: str | None = None
    reason: str | None = None


def initial_header(definition: Definition[Any]) -> Header:
    """A new workflow's header: running, in the definition's first phase."""
    return Header(phase=definition.first_phase)


def apply(
    definition: Definition[S], header: Header, state: S, event: Event, now: datetime
) -> tuple[Header, Decision[S]]:
    """One event through the engine's rules and the definition. Raises whatever ``decide``
    raises, and :class:`~workflows.job.UnknownJobKindError` or
    :class:`~workflows.gates.UnknownGateKindError` for a step or gate of a kind the definition
    does not declare (the store turns that into a blocked workflow, never a crash loop). A
    step scheduled under an alias is recorded under its canonical kind."""
    ruled = engine_rule(header, event)
    if ruled is not None:
        return ruled, Decision(state)
    decision = definition.decide(state, event, now)
    decision = Decision(decision.state, _declared(definition, decision.commands))
    return follow(header, decision.commands), decision


def _gate_declared(definition: Definition[Any], kind: str) -> bool:
    return kind in definition.gates or kind in ENGINE_GATES


def _declared(definition: Definition[Any], commands: Iterable[Command]) -> tuple[Command, ...]:
    checked: list[Command] = []
    for command in commands:
        if isinstance(command, ScheduleStep):
            canonical = definition.kinds.canonical(command.kind)
            if canonical != command.kind:
                command = replace(command, kind=canonical)
        elif isinstance(command, OpenGate):
            if not _gate_declared(definition, command.kind):
                raise UnknownGateKindError(command.kind, [*definition.gates, *ENGINE_GATES])
            _check_default(definition, command)
        checked.append(command)
    return tuple(checked)


def _check_default(definition: Definition[Any], gate: OpenGate) -> None:
    """A gate's default answer is an answer to it (checked before anything is written)."""
    if gate.default is None:
        return
    problem = check_answer(gate, gate.default, definition.gates.merged(ENGINE_GATES.values()))
    if problem is not None:
        raise ValueError(f"gate {gate.gate}: its default answer is refused: {problem}")


def engine_rule(header: Header, event: Event) -> Header | None:
    """The new header when the engine decides ``event`` without the definition (a finished
    workflow absorbs it; a cancel cancels), else ``None``."""
    if header.status.finished:
        return header
    if isinstance(event, CancelRequested):
        why = f"cancelled by {event.by}" + (f": {event.reason}" if event.reason else "")
        return replace(header, status=Status.CANCELLED, reason=why)
    if isinstance(event, GateExpired):
        why = f"gate {event.gate} passed its deadline (on_deadline=fail)"
        return replace(header, status=Status.FAILED, reason=why)
    return None


def follow(header: Header, commands: Iterable[Command]) -> Header:
    for command in commands:
        match command:
            case TransitionPhase(phase=phase, cycle=cycle):
                header = replace(header, phase=phase, cycle=cycle)
            case Complete(mode=mode):
                header = replace(header, status=Status.COMPLETED, completion_mode=mode)
            case Fail(reason=reason):
                header = replace(header, status=Status.FAILED, reason=reason)
            case _:
                pass
    return header


# --- answers -----------------------------------------------------------------------------


def check_answer(gate: OpenGate, answer: str, gates: GateKinds = ENGINE_GATES) -> str | None:
    """``None`` when ``answer`` is acceptable for ``gate``, else what is wrong (one line): the
    gate's own answers or schema, else its kind's (from ``gates``)."""
    return gates.problem(gate.kind, answer, answers=gate.answers, schema=gate.schema)


# --- replay ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Recorded:
    """One history entry as stored: the event, when, and (if applied) the commands it made."""

    seq: int
    event: Event
    at: datetime
    commands: tuple[Command, ...] | None


@dataclass(frozen=True, slots=True)
class Replayed(Generic[S]):
    header: Header
    state: S
    applied: int  # the last seq replayed


def replay(definition: Definition[S], history: Sequence[Recorded], *, upto: int) -> Replayed[S]:
    """Run ``history`` (events with seq <= ``upto``) through ``definition`` from its initial
    state. Raises :class:`NonDeterminismError` where a recorded decision differs."""
    header, state, last = initial_header(definition), definition.initial(), 0
    for entry in history:
        if entry.seq > upto:
            break
        if entry.seq != last + 1:
            raise NonDeterminismError(entry.seq, f"history has a gap after #{last}")
        try:
            header, decision = apply(definition, header, state, entry.event, entry.at)
        except Exception as exc:
            raise NonDeterminismError(entry.seq, f"decide raised {exc!r}") from exc
        if entry.commands is not None and tuple(entry.commands) != decision.commands:
            raise NonDeterminismError(
                entry.seq,
                f"recorded commands {_brief(entry.commands)} but the definition now gives "
                f"{_brief(decision.commands)}",
            )
        state, last = decision.state, entry.seq
    return Replayed(header=header, state=state, applied=last)


def _brief(commands: Iterable[Command]) -> str:
    return "[" + ", ".join(_one(c) for c in commands) + "]"


def _one(command: Command) -> str:
    match command:
        case ScheduleStep(step=step):
            return f"schedule {step}"
        case OpenGate(gate=gate):
            return f"gate {gate}"
        case StartTimer(timer=timer):
            return f"timer {timer}"
        case TransitionPhase(phase=phase, cycle=cycle):
            return f"phase {phase}/{cycle}"
        case Complete(mode=mode):
            return f"complete {mode}"
        case Fail(reason=reason):
            return f"fail {reason!r}"


class Registry:
    """The definitions a process can run, by name and version; the newest starts new ones."""

    def __init__(self, definitions: Iterable[Definition[Any]] = ()) -> None:
        self._by_key: dict[tuple[str, int], Definition[Any]] = {}
        self._kinds = StepKinds([TIMER])
        self._gates = ENGINE_GATES
        for definition in definitions:
            self.add(definition)

    def add(self, definition: Definition[Any]) -> None:
        """Register ``definition``; a kind or gate kind it declares differently from one
        already registered raises :class:`KindConflictError` (one line: which and how)."""
        key = (definition.name, definition.version)
        if key in self._by_key:
            raise ValueError(f"definition {key[0]} v{key[1]} is registered twice")
        try:
            kinds = self._kinds.merged(definition.kinds.values())
            gates = self._gates.merged(definition.gates.values())
        except ValueError as exc:
            raise KindConflictError(f"definition {key[0]} v{key[1]}: {exc}") from None
        self._by_key[key] = definition
        self._kinds, self._gates = kinds, gates

    @property
    def kinds(self) -> StepKinds:
        """Every step kind the registered definitions declare, and the engine's timer."""
        return self._kinds

    @property
    def gates(self) -> GateKinds:
        """Every gate kind the registered definitions declare, and the engine's own."""
        return self._gates

    def get(self, name: str, version: int) -> Definition[Any]:
        try:
            return self._by_key[(name, version)]
        except KeyError:
            raise UnknownDefinitionError(name, version, self.known()) from None

    def latest(self, name: str) -> Definition[Any]:
        versions = [v for (n, v) in self._by_key if n == name]
        if not versions:
            raise UnknownDefinitionError(name, None, self.known())
        return self._by_key[(name, max(versions))]

    def known(self) -> list[str]:
        return [f"{n} v{v}" for (n, v) in sorted(self._by_key)]


# --- the strict codec --------------------------------------------------------------------

_EVENTS: Mapping[str, type[Any]] = {
    "started": Started,
    "step_succeeded": StepSucceeded,
    "step_failed": StepFailed,
    "gate_answered": GateAnswered,
    "timer_fired": TimerFired,
    "cancel_requested": CancelRequested,
    "gate_expired": GateExpired,
}
_COMMANDS: Mapping[str, type[Any]] = {
    "schedule_step": ScheduleStep,
    "open_gate": OpenGate,
    "start_timer": StartTimer,
    "transition_phase": TransitionPhase,
    "complete": Complete,
    "fail": Fail,
}
# Fields added after histories were recorded: encoded only when not at their default, read
# as their default when absent, so recorded histories (and the golden ones) stay as they are.
_OPTIONAL: Mapping[type[Any], frozenset[str]] = {
    OpenGate: frozenset({"deadline", "on_deadline", "default", "reminders"}),
}
_EVENT_TAGS = {cls: tag for tag, cls in _EVENTS.items()}
_COMMAND_TAGS = {cls: tag for tag, cls in _COMMANDS.items()}


def _json_object(value: Any) -> dict[str, Any]:
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise CodecError(f"expected a JSON object, got {type(value).__name__}")
    try:
        decoded: dict[str, Any] = json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise CodecError(f"not JSON-serialisable: {exc}") from None
    return decoded


def _strings(value: Any) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise CodecError("expected a list of strings")
    return tuple(value)


def _exact(kind: type[Any]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if type(value) is not kind:
            raise CodecError(f"expected {kind.__name__}, got {type(value).__name__}")
        return value

    return check


def _duration_in(value: Any) -> timedelta:
    if type(value) is not int or value < 0:
        raise CodecError("a duration is a non-negative integer of microseconds")
    return timedelta(microseconds=value)


def _optional_duration_in(value: Any) -> timedelta | None:
    return None if value is None else _duration_in(value)


def _optional_str_in(value: Any) -> str | None:
    return None if value is None else _exact(str)(value)


def _durations_in(value: Any) -> tuple[timedelta, ...]:
    if not isinstance(value, list | tuple):
        raise CodecError("expected a list of durations")
    return tuple(_duration_in(v) for v in value)


def _failure_class_in(value: Any) -> FailureClass:
    try:
        return FailureClass(value)
    except ValueError:
        raise CodecError(f"unknown failure class {value!r}") from None


# Field decoders by annotation (the modules use postponed annotations: these are strings).
_DECODE: Mapping[str, Callable[[Any], Any]] = {
    "str": _exact(str),
    "int": _exact(int),
    "JsonObject": _json_object,
    "tuple[str, ...]": _strings,
    "timedelta": _duration_in,
    "FailureClass": _failure_class_in,
    "timedelta | None": _optional_duration_in,
    "str | None": _optional_str_in,
    "tuple[timedelta, ...]": _durations_in,
}


def _encode_value(value: Any) -> Any:
    if isinstance(value, timedelta):
        return value // timedelta(microseconds=1)
    if isinstance(value, FailureClass):
        return value.value
    if isinstance(value, tuple):
        return [_encode_value(v) for v in value]
    if isinstance(value, Mapping):
        return _json_object(value)
    return value


def _encode(value: Any, tags: Mapping[type[Any], str]) -> dict[str, Any]:
    tag = tags.get(type(value))
    if tag is None:
        raise CodecError(f"{type(value).__name__} is not a workflow event or command")
    optional = _OPTIONAL.get(type(value), frozenset())
    body = {
        f.name: _encode_value(getattr(value, f.name))
        for f in fields(value)
        if f.name not in optional or getattr(value, f.name) != _default_of(f)
    }
    return {"type": tag, **body}


def _default_of(spec: Any) -> Any:
    return spec.default if spec.default_factory is MISSING else spec.default_factory()


def _decode(data: Any, types: Mapping[str, type[Any]], what: str) -> Any:
    if not isinstance(data, Mapping):
        raise CodecError(f"a {what} is a JSON object, got {type(data).__name__}")
    tag = data.get("type")
    cls = types.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise CodecError(f"unknown {what} type {tag!r}; known: {', '.join(types)}")
    spec = {f.name: str(f.type) for f in fields(cls)}
    extra = set(data) - set(spec) - {"type"}
    if extra:
        raise CodecError(f"{what} {tag}: unknown field(s) {', '.join(sorted(extra))}")
    missing = set(spec) - set(data) - _OPTIONAL.get(cls, frozenset())
    if missing:
        raise CodecError(f"{what} {tag}: missing field(s) {', '.join(sorted(missing))}")
    try:
        values = {
            name: _DECODE[annotation](data[name])
            for name, annotation in spec.items()
            if name in data
        }
        return cls(**values)
    except CodecError as exc:
        raise CodecError(f"{what} {tag}: {exc}") from None
    except ValueError as exc:  # a constructor's own check (unknown kind, bad bounds)
        raise CodecError(f"{what} {tag}: {exc}") from None


def encode_event(event: Event) -> dict[str, Any]:
    return _encode(event, _EVENT_TAGS)


def decode_event(data: Any) -> Event:
    event: Event = _decode(data, _EVENTS, "event")
    return event


def encode_command(command: Command) -> dict[str, Any]:
    return _encode(command, _COMMAND_TAGS)


def decode_command(data: Any) -> Command:
    command: Command = _decode(data, _COMMANDS, "command")
    return command


def encode_commands(commands: Iterable[Command]) -> list[dict[str, Any]]:
    return [encode_command(c) for c in commands]


def decode_commands(data: Any) -> tuple[Command, ...]:
    if not isinstance(data, list):
        raise CodecError("recorded commands are a JSON list")
    return tuple(decode_command(item) for item in data)
