"""The run protocol between a caller (a worker's step) and an engine's loop service (seed 000 §13).

Five messages, each a JSON object with a versioned ``schema``:

==========================  ==========================  ==========================================
schema                      direction                   carries
==========================  ==========================  ==========================================
``vibey.run.request/1``     caller → ``vibey.runs``     what to run: engine, purpose, args (argv
                                                        after the binary), cwd, supersedes, the
                                                        deadline, ``start_by``, ``reply_to``
``vibey.run.accepted/1``    service → ``reply_to``      the run started: instance, pid, when
``vibey.run.progress/1``    service → ``reply_to``      one line of output (advisory only)
``vibey.run.result/1``      service → ``reply_to``      status, exit code, times, a detail
``vibey.run.control/1``     caller → the control        stop or wind_down one run
                            exchange
``vibey.run.status/1``      service → ``reply_to``      in answer to a probe, before its result:
                                                        the instance, the runs it has in flight
                                                        (run id, cwd, started), its last probe
==========================  ==========================  ==========================================

A result's ``status`` is one of :class:`RunStatus`. **A result says how the process ended,
never whether the work is complete and never anything about capacity**: the caller judges
both from the run's own output. So no message has a completion or a capacity field, and the
codec refuses a body that carries one (:data:`FORBIDDEN_FIELDS`: ``resets_at``, ``capacity``,
``completed``...), as it refuses an environment or a binary on a request: those come from
the service's own configuration, never from a message.

:func:`decode` is strict and total: a body that is not exactly one of these messages raises
:class:`RunCodecError` (and nothing else), whose ``reason`` says which rule it broke; unknown
schemas and extra fields are refused, never guessed at. :func:`encode` gives compact canonical
JSON, and ``decode(encode(m)) == m`` for every message.

Nothing here reads a clock: ``now`` is an argument of :func:`is_late`.

Exceptions::

    ValueError
    └── RunCodecError   a body or value that is not a run-protocol message
"""

from __future__ import annotations

import enum
import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from datetime import UTC, datetime
from typing import Any, TypeAlias
from uuid import UUID

MAX_BODY_BYTES = 1024 * 1024
MAX_ARGS = 256
MAX_TEXT_CHARS = 64 * 1024
MAX_DEADLINE_SECONDS = 7 * 24 * 3600.0
REQUEST = "vibey.run.request/1"
ACCEPTED = "vibey.run.accepted/1"
PROGRESS = "vibey.run.progress/1"
RESULT = "vibey.run.result/1"
CONTROL = "vibey.run.control/1"
STATUS = "vibey.run.status/1"
MAX_IN_FLIGHT = 64
# What a message may never carry (a completion claim, a capacity state, or what only the
# service's configuration decides); named in the refusal, so a forged request says why.
FORBIDDEN_FIELDS: frozenset[str] = frozenset(
    {
        "resets_at",
        "capacity",
        "capacity_state",
        "completed",
        "completion",
        "complete",
        "env",
        "environment",
        "binary",
        "executable",
    }
)

_UUID_TEXT = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_ENGINE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,63}")
_SHOWN = 40


class Purpose(enum.StrEnum):
    RUN = "run"
    PROBE = "probe"


class RunStatus(enum.StrEnum):
    """How a run ended (``exit_code`` is set for ``exited`` and may be for the others)."""

    EXITED = "exited"  # the process ran and exited (any code; 75 asks for a wind-down)
    SUPERSEDED = "superseded"  # stopped for a higher attempt of the same run key
    ABANDONED = "abandoned"  # its service went away mid-run, or a drain cut it at the grace
    REJECTED = "rejected"  # never started: late, worktree busy, forged, draining
    DEAD_LETTERED = "dead_lettered"  # the request crashed its service past the delivery limit
    DEADLINE_EXCEEDED = "deadline_exceeded"  # killed at its deadline


class ControlCommand(enum.StrEnum):
    STOP = "stop"
    WIND_DOWN = "wind_down"


class CodecRejection(enum.StrEnum):
    TOO_LARGE = "too_large"
    NOT_UTF8 = "not_utf8"
    NOT_JSON = "not_json"
    DUPLICATE_KEY = "duplicate_key"
    NOT_OBJECT = "not_object"
    UNKNOWN_SCHEMA = "unknown_schema"
    MISSING_FIELD = "missing_field"
    FORBIDDEN_FIELD = "forbidden_field"
    EXTRA_FIELD = "extra_field"
    BAD_FIELD = "bad_field"


class RunCodecError(ValueError):
    """Not a run-protocol message; ``reason`` says which rule it broke, ``field`` which field
    (when one is to blame). The message is one line."""

    def __init__(self, reason: CodecRejection, detail: str, field: str = "") -> None:
        super().__init__(f"not a run-protocol message ({reason}): {' '.join(detail.splitlines())}")
        self.reason = reason
        self.field = field


# --- the messages ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Supersedes:
    """Run ownership: the run key (the job id) and the attempt. A higher attempt of the same
    key stops the lower one before it starts."""

    key: str
    attempt: int

    def __post_init__(self) -> None:
        _text(self.key, "supersedes.key", limit=200, empty=False)
        _count(self.attempt, "supersedes.attempt")


@dataclass(frozen=True, slots=True)
class RunRequest:
    run_id: UUID
    engine: str
    purpose: Purpose
    args: tuple[str, ...]
    cwd: str
    supersedes: Supersedes | None
    deadline_seconds: float
    start_by: datetime
    requested_at: datetime
    reply_to: str
    caller: str = ""

    def __post_init__(self) -> None:
        _uuid(self.run_id, "run_id")
        _engine_id(self.engine)
        object.__setattr__(self, "purpose", _enum(Purpose, self.purpose, "purpose"))
        object.__setattr__(self, "args", _args(self.args))
        _cwd(self.cwd)
        if self.supersedes is not None and not isinstance(self.supersedes, Supersedes):
            raise RunCodecError(CodecRejection.BAD_FIELD, "supersedes must be {key, attempt}")
        object.__setattr__(self, "deadline_seconds", _seconds(self.deadline_seconds))
        object.__setattr__(self, "start_by", _utc(self.start_by, "start_by"))
        object.__setattr__(self, "requested_at", _utc(self.requested_at, "requested_at"))
        _text(self.reply_to, "reply_to", limit=255, empty=False)
        _text(self.caller, "caller", limit=200)


@dataclass(frozen=True, slots=True)
class RunAccepted:
    run_id: UUID
    service_instance: str
    pid: int
    started_at: datetime

    def __post_init__(self) -> None:
        _uuid(self.run_id, "run_id")
        _text(self.service_instance, "service_instance", limit=200)
        _count(self.pid, "pid")
        object.__setattr__(self, "started_at", _utc(self.started_at, "started_at"))


@dataclass(frozen=True, slots=True)
class RunProgress:
    run_id: UUID
    seq: int
    line: str

    def __post_init__(self) -> None:
        _uuid(self.run_id, "run_id")
        _count(self.seq, "seq")
        _text(self.line, "line", limit=MAX_TEXT_CHARS)


@dataclass(frozen=True, slots=True)
class RunResult:
    run_id: UUID
    status: RunStatus
    exit_code: int | None
    started_at: datetime | None
    finished_at: datetime
    detail: str = ""
    service_instance: str = ""

    def __post_init__(self) -> None:
        _uuid(self.run_id, "run_id")
        object.__setattr__(self, "status", _enum(RunStatus, self.status, "status"))
        if self.exit_code is not None:
            _exit_code(self.exit_code)
        if self.started_at is not None:
            object.__setattr__(self, "started_at", _utc(self.started_at, "started_at"))
        object.__setattr__(self, "finished_at", _utc(self.finished_at, "finished_at"))
        _text(self.detail, "detail", limit=MAX_TEXT_CHARS)
        _text(self.service_instance, "service_instance", limit=200)


@dataclass(frozen=True, slots=True)
class RunControl:
    run_id: UUID
    engine: str
    command: ControlCommand

    def __post_init__(self) -> None:
        _uuid(self.run_id, "run_id")
        _engine_id(self.engine)
        object.__setattr__(self, "command", _enum(ControlCommand, self.command, "command"))


@dataclass(frozen=True, slots=True)
class InFlight:
    """One run a service has in progress (``started_at`` None: admitted, not yet started)."""

    run_id: UUID
    cwd: str
    started_at: datetime | None

    def __post_init__(self) -> None:
        _uuid(self.run_id, "in_flight.run_id")
        _cwd(self.cwd)
        if self.started_at is not None:
            object.__setattr__(self, "started_at", _utc(self.started_at, "in_flight.started_at"))


@dataclass(frozen=True, slots=True)
class ServiceStatus:
    """What a service says of itself in answer to the probe ``run_id``: its runs in flight
    and the probe it answered before this one (``last_probe_at`` None: none yet)."""

    run_id: UUID
    service_instance: str
    at: datetime
    in_flight: tuple[InFlight, ...]
    last_probe_at: datetime | None = None
    last_probe: str = ""

    def __post_init__(self) -> None:
        _uuid(self.run_id, "run_id")
        _text(self.service_instance, "service_instance", limit=200)
        object.__setattr__(self, "at", _utc(self.at, "at"))
        runs = self.in_flight
        if not isinstance(runs, tuple | list) or len(runs) > MAX_IN_FLIGHT:
            raise _bad("in_flight", f"must be at most {MAX_IN_FLIGHT} runs")
        if not all(isinstance(run, InFlight) for run in runs):
            raise _bad("in_flight", "must hold {run_id, cwd, started_at} objects")
        object.__setattr__(self, "in_flight", tuple(runs))
        if self.last_probe_at is not None:
            object.__setattr__(self, "last_probe_at", _utc(self.last_probe_at, "last_probe_at"))
        _text(self.last_probe, "last_probe", limit=500)


Message: TypeAlias = RunRequest | RunAccepted | RunProgress | RunResult | RunControl | ServiceStatus
SCHEMA_OF: Mapping[type[Any], str] = {
    RunRequest: REQUEST,
    RunAccepted: ACCEPTED,
    RunProgress: PROGRESS,
    RunResult: RESULT,
    RunControl: CONTROL,
    ServiceStatus: STATUS,
}
TYPE_OF: Mapping[str, type[Any]] = {schema: cls for cls, schema in SCHEMA_OF.items()}


def is_late(request: RunRequest, now: datetime) -> bool:
    """Whether a service that sees ``request`` at ``now`` must reject it as late."""
    return now > request.start_by


# --- encoding ----------------------------------------------------------------------------


def encode(message: Message) -> bytes:
    """Compact canonical JSON (sorted keys, no spaces, UTF-8) of exactly the message's fields."""
    document: dict[str, Any] = {"schema": SCHEMA_OF[type(message)]}
    for item in fields(message):
        document[item.name] = _to_json(getattr(message, item.name))
    text = json.dumps(
        document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )
    return text.encode("utf-8")


def _to_json(value: object) -> object:
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, tuple):
        return [_to_json(item) for item in value]
    if isinstance(value, InFlight):
        return {item.name: _to_json(getattr(value, item.name)) for item in fields(value)}
    if isinstance(value, Supersedes):
        return {"key": value.key, "attempt": value.attempt}
    return value


# --- decoding ----------------------------------------------------------------------------


def decode(body: bytes) -> Message:
    """The message in ``body``; :class:`RunCodecError` for anything else, never another error."""
    if len(body) > MAX_BODY_BYTES:
        raise RunCodecError(
            CodecRejection.TOO_LARGE, f"{len(body)} bytes; the limit is {MAX_BODY_BYTES}"
        )
    document = _object(_parse(body))
    schema = document.get("schema")
    cls = TYPE_OF.get(schema) if isinstance(schema, str) else None
    if cls is None:
        raise RunCodecError(CodecRejection.UNKNOWN_SCHEMA, f"schema {_show(schema)} is not ours")
    names = {item.name for item in fields(cls)}
    _check_keys(document, names, required=names - _OPTIONAL.get(cls, frozenset()))
    values = {name: _FROM_JSON.get(name, _same)(document[name]) for name in names & document.keys()}
    try:
        message: Message = cls(**values)
    except RunCodecError:
        raise
    except (TypeError, ValueError, OverflowError) as exc:  # a field of the wrong JSON type
        raise RunCodecError(CodecRejection.BAD_FIELD, str(exc)[:200]) from None
    return message


def decode_request(body: bytes) -> RunRequest:
    """A request, or :class:`RunCodecError` (another message is refused too)."""
    message = decode(body)
    if not isinstance(message, RunRequest):
        raise RunCodecError(CodecRejection.UNKNOWN_SCHEMA, f"a {SCHEMA_OF[type(message)]}")
    return message


_OPTIONAL: Mapping[type[Any], frozenset[str]] = {
    RunRequest: frozenset({"caller"}),
    RunResult: frozenset({"detail", "service_instance"}),
    ServiceStatus: frozenset({"last_probe_at", "last_probe"}),
}


def _check_keys(document: Mapping[str, object], names: set[str], required: set[str]) -> None:
    keys = set(document) - {"schema"}
    if forbidden := sorted(keys & FORBIDDEN_FIELDS):
        raise RunCodecError(
            CodecRejection.FORBIDDEN_FIELD,
            f"a run-protocol message may not carry {forbidden[0]!r}",
            forbidden[0],
        )
    if missing := sorted(required - keys):
        raise RunCodecError(
            CodecRejection.MISSING_FIELD, f"missing field(s): {', '.join(missing)}", missing[0]
        )
    if extra := sorted(keys - names):
        shown = ", ".join(_show(key) for key in extra[:5])
        raise RunCodecError(CodecRejection.EXTRA_FIELD, f"unexpected field(s): {shown}", extra[0])


def _same(value: object) -> object:
    return value


def _uuid_from(value: object) -> UUID:
    if not isinstance(value, str) or not _UUID_TEXT.fullmatch(value):
        raise RunCodecError(
            CodecRejection.BAD_FIELD, f"run_id must be a canonical UUID, got {_show(value)}"
        )
    return UUID(value)


def _time_from(name: str) -> Callable[[object], object]:
    def parse(value: object) -> object:
        if value is None and name in ("started_at", "last_probe_at"):
            return None
        if isinstance(value, str) and value.isascii() and len(value) <= 64:
            try:
                parsed = datetime.fromisoformat(value)
            except ValueError:
                pass
            else:
                if parsed.utcoffset() is not None:
                    return parsed
        raise RunCodecError(
            CodecRejection.BAD_FIELD, f"{name} must be an ISO 8601 time with an offset", name
        )

    return parse


def _args_from(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise RunCodecError(CodecRejection.BAD_FIELD, "args must be an array of strings", "args")
    return tuple(value)  # each element is checked by the constructor


def _supersedes_from(value: object) -> Supersedes | None:
    if value is None:
        return None
    if not isinstance(value, dict) or set(value) != {"key", "attempt"}:
        raise RunCodecError(
            CodecRejection.BAD_FIELD, "supersedes must be null or {key, attempt}", "supersedes"
        )
    return Supersedes(value["key"], value["attempt"])


def _in_flight_from(value: object) -> tuple[InFlight, ...]:
    if not isinstance(value, list) or len(value) > MAX_IN_FLIGHT:
        raise RunCodecError(
            CodecRejection.BAD_FIELD, f"in_flight must be at most {MAX_IN_FLIGHT} runs", "in_flight"
        )
    runs = []
    for run in value:
        if not isinstance(run, dict) or set(run) != {"run_id", "cwd", "started_at"}:
            raise RunCodecError(
                CodecRejection.BAD_FIELD,
                "in_flight must hold {run_id, cwd, started_at} objects",
                "in_flight",
            )
        started = _time_from("started_at")(run["started_at"])
        runs.append(InFlight(_uuid_from(run["run_id"]), run["cwd"], started))  # type: ignore[arg-type]
    return tuple(runs)


def _deadline_from(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RunCodecError(
            CodecRejection.BAD_FIELD, "deadline_seconds must be a number", "deadline_seconds"
        )
    return float(value)


_FROM_JSON: Mapping[str, Callable[[object], object]] = {
    "run_id": _uuid_from,
    "args": _args_from,
    "supersedes": _supersedes_from,
    "deadline_seconds": _deadline_from,
    "start_by": _time_from("start_by"),
    "requested_at": _time_from("requested_at"),
    "started_at": _time_from("started_at"),
    "finished_at": _time_from("finished_at"),
    "at": _time_from("at"),
    "last_probe_at": _time_from("last_probe_at"),
    "in_flight": _in_flight_from,
}


class _DuplicateKeyError(Exception):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    document = dict(pairs)
    if len(document) != len(pairs):
        raise _DuplicateKeyError()
    return document


def _no_constants(name: str) -> object:
    raise ValueError(f"{name} is not a JSON value")


def _parse(body: bytes) -> object:
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise RunCodecError(CodecRejection.NOT_UTF8, f"byte {exc.start} is not UTF-8") from None
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constants)
    except _DuplicateKeyError:
        raise RunCodecError(CodecRejection.DUPLICATE_KEY, "a key appears twice") from None
    except (ValueError, RecursionError) as exc:
        raise RunCodecError(CodecRejection.NOT_JSON, str(exc)[:200]) from None


def _object(document: object) -> dict[str, object]:
    if not isinstance(document, dict):
        raise RunCodecError(CodecRejection.NOT_OBJECT, f"{_show(document)} is not an object")
    return document


# --- field checks (construction and decoding alike) ---------------------------------------


def _bad(name: str, detail: str) -> RunCodecError:
    return RunCodecError(CodecRejection.BAD_FIELD, f"{name} {detail}", name)


def _uuid(value: object, name: str) -> None:
    if not isinstance(value, UUID):
        raise _bad(name, f"must be a UUID, got {_show(value)}")


def _engine_id(value: object) -> None:
    if not isinstance(value, str) or not _ENGINE_ID.fullmatch(value):
        raise _bad("engine", f"must be an engine id (letters, digits, - and _), got {_show(value)}")


def _text(value: object, name: str, *, limit: int, empty: bool = True) -> None:
    if not isinstance(value, str) or (not empty and not value) or len(value) > limit:
        raise _bad(name, f"must be a string of at most {limit} characters, got {_show(value)}")
    if "\x00" in value or not _utf8(value):
        raise _bad(name, "holds a NUL or a lone surrogate")


def _utf8(value: str) -> bool:
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _count(value: object, name: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**63:
        raise _bad(name, f"must be a whole number at least 0, got {_show(value)}")


def _exit_code(value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not -255 <= value <= 255:
        raise _bad("exit_code", f"must be null or an integer from -255 to 255, got {_show(value)}")


def _enum(cls: type[enum.StrEnum], value: object, name: str) -> Any:
    if isinstance(value, str) and value in cls._value2member_map_:
        return cls(value)
    choices = ", ".join(member.value for member in cls)
    raise _bad(name, f"must be one of {choices}, got {_show(value)}")


def _args(value: object) -> tuple[str, ...]:
    if not isinstance(value, tuple | list) or len(value) > MAX_ARGS:
        raise _bad("args", f"must be at most {MAX_ARGS} strings")
    for arg in value:
        _text(arg, "args", limit=MAX_TEXT_CHARS)
    return tuple(value)


def _cwd(value: object) -> None:
    _text(value, "cwd", limit=4096, empty=False)
    assert isinstance(value, str)
    parts = value.split("/")
    if not value.startswith("/") or ".." in parts or "." in parts:
        raise _bad("cwd", f"must be an absolute path without . or .. parts, got {_show(value)}")


def _seconds(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad("deadline_seconds", f"must be a number, got {_show(value)}")
    if not (math.isfinite(value) and 0 < value <= MAX_DEADLINE_SECONDS):
        raise _bad("deadline_seconds", f"must be more than 0 and at most {MAX_DEADLINE_SECONDS:g}")
    return float(value)


def _utc(value: object, name: str) -> datetime:
    if not isinstance(value, datetime) or value.utcoffset() is None:
        raise _bad(name, f"must be a timezone-aware time, got {_show(value)}")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise _bad(name, "is out of range in UTC") from None


def _show(value: object) -> str:
    """A short, one-line description of an untrusted value."""
    if value is None or isinstance(value, bool | int | float):
        return repr(value)[:_SHOWN]
    if isinstance(value, str):
        return repr(value[:_SHOWN]) + ("..." if len(value) > _SHOWN else "")
    return type(value).__name__
