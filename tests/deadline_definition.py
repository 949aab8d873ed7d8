"""A definition whose one gate has a deadline, for the gate-deadline tests.

Started → gate ``approve`` (approval: yes/no; deadline, on_deadline, default, reminders as
configured) → yes: Complete("local"); no: Fail. Its ledger hook records each answer as an
``AnswerGiven`` naming who gave it (the protocol's way), so a default shows as the default's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any

from workflows.engine import (
    Command,
    Complete,
    Decision,
    Event,
    Fail,
    GateAnswered,
    JsonObject,
    OpenGate,
    Started,
)
from workflows.gates import GateKind, GateKinds
from workflows.kinds import StepKinds
from workflows.ledger import EventKind, NewEvent


class Deadlined:
    name = "deadlined"
    version = 1
    kinds = StepKinds()
    gates = GateKinds([GateKind("approval", answers=("yes", "no"))])
    first_phase = "waiting"

    def __init__(
        self,
        *,
        deadline: timedelta | None = timedelta(seconds=2),
        on_deadline: str = "answer",
        default: str | None = "yes",
        reminders: tuple[timedelta, ...] = (),
    ) -> None:
        self._gate = OpenGate(
            "approve",
            "approval",
            "Ship it?",
            ("yes", "no"),
            evidence={"report": "all green"},
            deadline=deadline,
            on_deadline=on_deadline,
            default=default,
            reminders=reminders,
        )

    def initial(self) -> str:
        return "new"

    def decide(self, state: str, event: Event, now: datetime) -> Decision[str]:
        match event:
            case Started():
                return Decision("waiting", (self._gate,))
            case GateAnswered(answer="yes"):
                return Decision("done", (Complete("local"),))
            case GateAnswered(answer="no"):
                return Decision("refused", (Fail("refused"),))
        return Decision(state)

    def encode_state(self, state: str) -> JsonObject:
        return {"stage": state}

    def decode_state(self, data: JsonObject) -> str:
        return str(data["stage"])

    def describe(self, state: str) -> str:
        return state

    def ledger_events(
        self, event: Event, commands: Sequence[Command], open_findings: Callable[[], Any]
    ) -> list[NewEvent]:
        if isinstance(event, GateAnswered):
            payload = {"closes": event.gate, "answer": event.answer, "by": event.by}
            return [NewEvent(EventKind.AnswerGiven, payload)]
        return []
