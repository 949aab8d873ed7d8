"""Record the vibey protocol's golden histories: ``.venv/bin/python tests/golden/record.py``.

Each scenario drives ``PROTOCOL`` through :func:`workflows.engine.apply` with a :class:`Script`
(results by step name, answers by gate name, steps that fail for good; everything else gets
the cooperative default) and writes ``<scenario>.json``: every event and the commands it made,
then the final header and state. ``tests/unit/test_golden_histories.py`` replays them; a change
to the definition that changes any decision must come with a new definition version, never a
re-recording.

:class:`Run` (the driver) is shared with the unit tests.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from workflows.engine import (
    Command,
    Definition,
    Event,
    GateAnswered,
    Header,
    OpenGate,
    Recorded,
    ScheduleStep,
    Started,
    StartTimer,
    StepFailed,
    StepSucceeded,
    TimerFired,
    apply,
    check_answer,
    encode_commands,
    encode_event,
    initial_header,
)
from workflows.job import FailureClass
from workflows.protocol import PROTOCOL, ProtocolState

HERE = Path(__file__).parent
BASE = datetime(2026, 1, 1, tzinfo=UTC)
ENGINE = {"name": "scripted", "script": {"design": {"questions": []}}}


class DriverError(AssertionError):
    pass


@dataclass
class Run:
    """A workflow driven in memory: the header and state, the history as the store would
    record it, and what the commands asked for (steps, gates, timers), tracked like a store."""

    definition: Definition[ProtocolState] = PROTOCOL
    header: Header = field(default_factory=lambda: initial_header(PROTOCOL))
    state: ProtocolState = field(default_factory=PROTOCOL.initial)
    history: list[Recorded] = field(default_factory=list)
    steps: dict[str, ScheduleStep] = field(default_factory=dict)
    succeeded: set[str] = field(default_factory=set)
    failed: set[str] = field(default_factory=set)
    gates: dict[str, OpenGate] = field(default_factory=dict)
    gate_names: set[str] = field(default_factory=set)
    timers: dict[str, StartTimer] = field(default_factory=dict)

    def send(self, event: Event) -> tuple[Command, ...]:
        seq = len(self.history) + 1
        at = BASE + timedelta(seconds=seq)
        header, decision = apply(self.definition, self.header, self.state, event, at)
        self.history.append(Recorded(seq=seq, event=event, at=at, commands=decision.commands))
        self.header, self.state = header, decision.state
        self._settle(event)
        for command in decision.commands:
            self._track(command)
        return decision.commands

    def _settle(self, event: Event) -> None:
        match event:
            case StepSucceeded(step=step):
                self.succeeded.add(step)
            case StepFailed(step=step):
                self.failed.add(step)
            case GateAnswered(gate=gate, answer=answer) if gate in self.gates:
                if check_answer(self.gates[gate], answer, self.definition.gates) is None:
                    del self.gates[gate]
            case TimerFired(timer=timer):
                self.timers.pop(timer, None)
            case _:
                pass

    def _track(self, command: Command) -> None:
        match command:
            case ScheduleStep(step=step):
                if step in self.steps:
                    raise DriverError(f"step {step} scheduled twice")
                self.steps[step] = command
            case OpenGate(gate=gate):
                if gate in self.gate_names:
                    raise DriverError(f"gate {gate} opened twice")
                self.gate_names.add(gate)
                self.gates[gate] = command
            case StartTimer(timer=timer):
                self.timers[timer] = command
            case _:
                pass

    @property
    def finished(self) -> bool:
        return self.header.status.finished

    def runnable(self) -> list[ScheduleStep]:
        """Steps scheduled, not settled, whose dependencies all succeeded (schedule order)."""
        settled = self.succeeded | self.failed
        return [
            s
            for name, s in self.steps.items()
            if name not in settled and all(dep in self.succeeded for dep in s.after)
        ]

    def scheduled(self, kind: str | None = None) -> list[ScheduleStep]:
        return [s for s in self.steps.values() if kind is None or s.kind == kind]

    def copy(self) -> Run:
        return Run(
            definition=self.definition,
            header=self.header,
            state=self.state,
            history=list(self.history),
            steps=dict(self.steps),
            succeeded=set(self.succeeded),
            failed=set(self.failed),
            gates=dict(self.gates),
            gate_names=set(self.gate_names),
            timers=dict(self.timers),
        )


# --- scripts: what the steps return and the people answer -------------------------------


COOPERATIVE_RESULTS: Mapping[str, Mapping[str, Any]] = {
    "design.interview": {"questions": []},
    "deploy.interview": {"questions": []},
    "build.decompose": {"work_items": [{"id": "main", "title": "The app"}]},
    "build.verify": {"passed": True},
    "review.collect": {"feedback": []},
    "review.triage": {"findings": []},
    "review.deployment_choice": {"question": "Work on deployment?", "recommendation": "local"},
    "deploy.execute": {"deployed": True, "url": "https://demo.example"},
    "deploy.triage": {"failure": None},
    "deploy.route": {"route": "done"},
}


def cooperative_result(step: ScheduleStep) -> dict[str, Any]:
    """A contract-valid result with nothing to ask, fix or route back."""
    match step.kind:
        case "design.spec" | "deploy.spec":
            return {"spec": f"spec of {step.step}"}
        case "visual.plan" | "deploy.design":
            return {"plan": f"plan of {step.step}"}
        case "build.implement":
            return {"item": step.subject, "status": "done", "branch": "b", "commit": "c0"}
        case "build.integrate":
            branch = f"vibey/cycle-{step.cycle}"
            return {"branch": branch, "merged": step.input["items"], "commit": "c1"}
        case kind:
            return dict(COOPERATIVE_RESULTS.get(kind, {"note": f"{kind} done"}))


def cooperative_answer(gate: OpenGate) -> str:
    """accept, no, retry; the first offered answer of a question, or any text."""
    for preferred in ("accept", "no", "retry"):
        if preferred in gate.answers:
            return preferred
    return gate.answers[0] if gate.answers else "ok"


@dataclass(frozen=True)
class Script:
    results: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    answers: Mapping[str, str] = field(default_factory=dict)
    failures: frozenset[str] = frozenset()


COOPERATIVE = Script()


def next_event(run: Run, script: Script) -> Event | None:
    """Answer the oldest open gate, else settle the oldest runnable step, else fire a timer."""
    for name, gate in run.gates.items():
        return GateAnswered(name, script.answers.get(name) or cooperative_answer(gate), "script")
    for step in run.runnable():
        if step.step in script.failures:
            return StepFailed(step.step, FailureClass.WORK, f"{step.step} failed (scripted)")
        result = script.results.get(step.step) or cooperative_result(step)
        return StepSucceeded(step.step, dict(result))
    for timer in run.timers:
        return TimerFired(timer)
    return None


def drive(run: Run, script: Script = COOPERATIVE, *, limit: int = 400) -> Run:
    """Send events until the workflow finishes; raise if it gets stuck or runs too long."""
    for _ in range(limit):
        if run.finished:
            return run
        event = next_event(run, script)
        if event is None:
            raise DriverError(f"stuck: {PROTOCOL.describe(run.state)}")
        run.send(event)
    raise DriverError(f"not finished after {limit} events: {PROTOCOL.describe(run.state)}")


def start(input_: Mapping[str, Any] | None = None) -> Run:
    run = Run()
    run.send(Started(dict(input_ or {"project": "demo", "engine": ENGINE})))
    return run


# --- the scenarios -----------------------------------------------------------------------


def _question(id_: str, text: str, answers: list[str]) -> dict[str, Any]:
    return {"questions": [{"id": id_, "question": text, "answers": answers}]}


def _findings(*findings: tuple[str, str, bool]) -> dict[str, Any]:
    return {"findings": [{"id": i, "text": t, "ambiguous": a} for i, t, a in findings]}


def _items(*ids: str) -> dict[str, Any]:
    return {"work_items": [{"id": i, "title": i.upper()} for i in ids]}


def _conflicts(*ids: str) -> dict[str, Any]:
    """A pass of the merge queue that met conflicts: ``ids`` do not merge over ``api``."""
    conflicts = [{"item": i, "files": ["app.txt"], "against": ["api"]} for i in ids]
    return {"passed": False, "merged": ["api"], "conflicts": conflicts}


SCENARIOS: Mapping[str, Script] = {
    "demo_local": Script(
        results={
            "design.interview.0.0.0": _question("audience", "Who is the app for?", []),
            "build.decompose.0": _items("api", "ui"),
        },
        answers={"design.q.0.audience": "Small teams"},
    ),
    "deployed_visual": Script(
        results={
            "deploy.interview.0.0": _question("region", "Which region?", ["eu", "us"]),
            "deploy.triage.0": {"failure": "infra"},
            "deploy.route.0": {"route": "deploy_execute"},
        },
        answers={
            "design.accept.0.0": "revise",
            "visual.opt_in": "yes",
            "deployment.opt_in": "yes",
            "deploy.q.0.region": "eu",
        },
    ),
    "review_loopbacks": Script(
        results={
            "build.decompose.0": _items("api", "ui"),
            "review.collect.0": {"feedback": ["the button says Sumbit"]},
            "review.triage.0": _findings(("f1", "Button label typo", False)),
            "review.triage.1": _findings(("f2", "Should guests see prices?", True)),
            "build.decompose.2": _items("api", "ui"),
            "build.implement.2.1": {"item": "ui", "status": "ambiguous", "question": "Dark mode?"},
        },
    ),
    "merge_queue": Script(
        results={
            "build.decompose.0": _items("api", "ui", "docs"),
            "build.verify.0": _conflicts("ui", "docs"),
            "build.integrate.0": {"branch": "vibey/integration", **_conflicts("ui", "docs")},
        },
        answers={"build.merge_conflict.0.docs.1": "drop"},
        failures=frozenset({"build.resolve.0.docs.1"}),
    ),
    "step_failure_retry": Script(
        results={"build.decompose.0": _items("api", "ui")},
        failures=frozenset({"design.research.0.0", "build.implement.0.1", "build.verify.0"}),
    ),
}


def record(name: str, script: Script) -> dict[str, Any]:
    run = drive(start(), script)
    return {
        "definition": {"name": PROTOCOL.name, "version": PROTOCOL.version},
        "history": [
            {
                "seq": entry.seq,
                "at": entry.at.isoformat(),
                "event": encode_event(entry.event),
                "commands": encode_commands(entry.commands or ()),
            }
            for entry in run.history
        ],
        "final": {
            "header": encode_header(run.header),
            "state": dict(PROTOCOL.encode_state(run.state)),
        },
    }


def encode_header(header: Header) -> dict[str, Any]:
    return {
        "phase": header.phase,
        "cycle": header.cycle,
        "status": header.status.value,
        "completion_mode": header.completion_mode,
        "reason": header.reason,
    }


def main(argv: list[str]) -> int:
    names = argv or list(SCENARIOS)
    for name in names:
        path = HERE / f"{name}.json"
        text = json.dumps(record(name, SCENARIOS[name]), indent=1, ensure_ascii=False)
        path.write_text(text + "\n", encoding="utf-8")
        print(f"wrote {path.relative_to(HERE.parent.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
