"""An order that needs a person's approval: reserve → approval (with a deadline) → charge.

::

    Started ─► orders.reserve ─► gate order_approval (approve | reject) + timer approval.deadline
                                   approve ─► orders.charge ─► Complete("approved")
                                   reject, or the deadline fires first
                                           ─► orders.release (compensation) ─► Complete("rejected")
    a step that fails for good: release what was reserved ─► Fail

Input: ``{"order": str, "amount": int}``. The approval waits an hour (``orders-quick``: two
seconds); an order id starting ``declined-`` has its charge fail, to show the compensation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timedelta
from typing import Any

from workflows.engine import (
    Command,
    Complete,
    Decision,
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
)
from workflows.gates import GateKind, GateKinds
from workflows.job import FailureClass
from workflows.kinds import StepKind, StepKinds
from workflows.queue import Job
from workflows.steps import Failure, Outcome, Success

RESERVE, CHARGE, RELEASE = "orders.reserve", "orders.charge", "orders.release"
APPROVAL = "order_approval"
DEADLINE = "approval.deadline"

KINDS = StepKinds(
    [
        StepKind(RESERVE, max_attempts=3, result={"required": ["reservation"]}),
        StepKind(CHARGE, max_attempts=3, result={"required": ["charge_id"]}),
        StepKind(RELEASE, max_attempts=10, result={"required": ["released"]}),
    ]
)
GATES = GateKinds(
    [
        GateKind(
            APPROVAL,
            answers=("approve", "reject"),
            title="an order waits for approval",
            hint="approve charges it; reject (or the deadline) releases the stock",
        )
    ]
)


@dataclass(frozen=True, slots=True)
class Order:
    stage: str = "new"  # new → reserving → waiting → charging | releasing → done
    order: str = ""
    amount: int = 0
    reservation: str = ""
    decision: str = ""  # approved | rejected | expired | failed
    by: str = ""


class Orders:
    name = "orders"
    version = 1
    kinds = KINDS
    gates = GATES
    first_phase = ""  # no phases: the stage lives in the state

    def initial(self) -> Order:
        return Order()

    def decide(self, state: Order, event: Event, now: datetime) -> Decision[Order]:
        match event:
            case Started(input=given) if state.stage == "new":
                order = Order("reserving", str(given["order"]), int(given["amount"]))
                return Decision(order, (self._step(RESERVE, order),))
            case GateAnswered(gate="approval", answer=answer, by=by) if state.stage == "waiting":
                if answer == "approve":
                    charging = replace(state, stage="charging", decision="approved", by=by)
                    return Decision(charging, (self._step(CHARGE, charging),))
                return self._release(replace(state, decision="rejected", by=by))
            case TimerFired(timer="deadline") if state.stage == "waiting":
                return self._release(replace(state, decision="expired", by="deadline"))
            case StepSucceeded() | StepFailed():
                return self._settled(state, event)
        return Decision(state)

    def _settled(self, state: Order, event: StepSucceeded | StepFailed) -> Decision[Order]:
        done = replace(state, stage="done")
        match event:
            case StepSucceeded(step="reserve", result=result):
                return self._ask(replace(state, reservation=str(result["reservation"])))
            case StepSucceeded(step="charge"):
                return Decision(done, (Complete("approved"),))
            case StepSucceeded(step="release") if state.decision == "failed":
                return Decision(done, (Fail(f"order {state.order}: the charge failed"),))
            case StepSucceeded(step="release"):
                return Decision(done, (Complete(state.decision),))
            case StepFailed(step="reserve", detail=detail):
                return Decision(done, (Fail(f"reserve: {detail}"),))
            case StepFailed(step="charge"):
                return self._release(replace(state, decision="failed"))
        return Decision(state)

    def _step(self, kind: str, state: Order) -> ScheduleStep:
        given = {"order": state.order, "amount": state.amount, "reservation": state.reservation}
        return ScheduleStep(step=kind.removeprefix("orders."), kind=kind, input=given)

    def _ask(self, state: Order) -> Decision[Order]:
        waiting = replace(state, stage="waiting")
        commands: tuple[Command, ...] = (
            OpenGate(
                gate="approval",
                kind=APPROVAL,
                question=f"Approve order {state.order} for {state.amount}?",
                context={"order": state.order, "amount": state.amount},
            ),
            StartTimer("deadline", timedelta(seconds=self.deadline_seconds)),
        )
        return Decision(waiting, commands)

    def _release(self, state: Order) -> Decision[Order]:
        releasing = replace(state, stage="releasing")
        return Decision(releasing, (self._step(RELEASE, releasing),))

    deadline_seconds = 3600

    def encode_state(self, state: Order) -> dict[str, Any]:
        return asdict(state)

    def decode_state(self, data: Mapping[str, Any]) -> Order:
        return Order(**data)

    def describe(self, state: Order) -> str:
        if state.stage == "waiting":
            return f"order {state.order}: waiting for approval"
        return f"order {state.order}: {state.stage}" + (
            f" ({state.decision})" if state.decision else ""
        )


class QuickOrders(Orders):
    """The same flow with a 2-second approval deadline (the deadline path's test)."""

    name = "orders-quick"
    deadline_seconds = 2


ORDERS = Orders()
QUICK_ORDERS = QuickOrders()


def reserve(job: Job) -> Outcome:
    order = job.payload["input"]["order"]
    return Success({"reservation": f"stock-{order}"})


def charge(job: Job) -> Outcome:
    if str(job.payload["input"]["order"]).startswith("declined-"):
        # Retried at once (three attempts, then StepFailed): a declined card stays declined.
        return Failure(FailureClass.WORK, "the card was declined", retry_in=timedelta(0))
    return Success({"charge_id": f"ch-{job.payload['input']['order']}"})


def release(job: Job) -> Outcome:
    return Success({"released": True, "reservation": job.payload["input"]["reservation"]})


HANDLERS = {RESERVE: reserve, CHARGE: charge, RELEASE: release}
