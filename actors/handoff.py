"""Engines inside build.implement: rotation at the boundary, and the handoff on spent credits.

build.implement is the engine-driven BUILD job; its handler (``actors.handlers``) hands every
attempt to :meth:`Handoffs.run`, which:

1. **registers the roster** in ``engine_health`` (the script's ``[engines] roster`` for the
   scripted engine; otherwise the one engine the step input names, weight 1), each with a
   doctor pass at ``now``: an engine vibey runs in its own process or as its configured
   command counts as installed and authenticated when a step asks for it;
2. **selects the engine** at the boundary a new attempt of a work item is
   (``Boundary(Trigger.NEW_WORK_ITEM, Phase.BUILD)``, the BUILD allow-list being the roster;
   ``Trigger.OPERATOR_REQUEST`` away from the project's last engine when an operator ran
   ``vibey engine rotate <project>``, the request taken by this attempt),
   records it on the job (``job.engine_id``) and tells the engine which one it is
   (``input["engine_id"]``). No eligible engine: ``Defer(capacity)``;
3. **runs it and settles its verdict** with :func:`workflows.circuit.settle_verdict`: a
   capacity rejection anywhere in the engine's evidence (a ``CapacityRejected`` ledger entry)
   or a ``capacity`` status outranks a completion claim, so such an attempt is never recorded
   complete; the engine's circuit records the outcome (capacity opens it at once, engine
   failures after three, a success is a success);
4. on **CreditsExhausted** (a ``capacity`` verdict whose ``result["capacity"]`` is
   ``{"state": "CreditsExhausted", "detail": …}``, or that names no state at all: without a
   reset time, nothing waits for one), **hands the item off** through the pure flow of
   :mod:`workflows.handoff`: the outgoing engine writes briefs (``write_brief``, see
   :class:`BriefWriter`; an engine without it counts as dead, so the incoming one synthesises)
   from the project's ledger range (``store.ledger.Ledger.read``), each verified by the
   no-loss gate against that range and ``Spec(work_items=(item,))`` (the item being handed
   off is the remaining work; the spec text has no clauses to derive), up to
   ``1 + MAX_REGENERATIONS`` briefs, then one in ``full_transcript`` mode; on a pass it writes
   the range as JSON lines to ``<worktree>/.vibey/handoff/ledger.jsonl`` (git-ignored there),
   picks the incoming engine by forced rotation (``Trigger.CAPACITY_REJECTION``,
   ``rejected_by`` = outgoing) and runs the same task on it, seeded: ``input["handoff"]``
   carries the brief, the mode, the ledger file and a seed prompt that names the file (the
   range is never inlined). The incoming engine's verdict, settled the same way, is the
   step's; if it runs out of credits too, it hands off in turn (each engine at most once);
5. when no brief passes, **parks** the job: ``Park(GateRequest(kind="handoff", answers=
   ("retry", "cancel")))``, its context naming the failed rules of every brief.

The answer to a handoff gate applies to the attempt that follows it (the gate context's
``attempt`` + 1; a deferral keeps the attempt, so it applies until the attempt ends):

* ``retry``: a new round of briefs (:func:`workflows.handoff.gate_answered`) from the same
  outgoing engine, which is not run again; a pass seeds the incoming engine as above, a
  failure parks again;
* ``cancel``: no handoff. The item waits for the outgoing engine's own capacity: while its
  circuit does not admit work the job is deferred as awaiting capacity (no attempt spent);
  once its probe is due, it runs there, and another capacity rejection defers it again.

Ledger: ``CapacityRejected`` (written by the engine, or added here when its evidence lacks
one), ``HandoffInitiated`` (``{"id": "handoff:<job>:<outgoing>", "from", "to", "item",
"reason"}``) and ``HandoffAccepted`` (the same id, ``"mode"``, ``"briefs"``, ``"rounds"``,
``"ledger_file"``, ``"range_digest"``) travel in the step's ``evidence["ledger"]`` and are
appended in the settle's transaction. When the step will not settle with a success (it parks,
defers, or fails), nothing of its evidence is written, so what the handoffs carried, and any
capacity rejection, is appended here at once instead (its own transaction, with the job's
causation and correlation ids).

Without a pool (unit tests) there is no ``engine_health`` and no ledger: the roster is
selected from scratch each time (every engine authenticated, circuits closed) and the range is
empty; gate answers are read from the ``records`` given
(``store.memory_records.MemoryStepRecords``), and with none, never.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from actors.agents import Engine, EngineError, EngineTask, EngineVerdict
from actors.agents.base import EvidenceSink
from actors.agents.roster import AgentSpec, installed
from actors.agents.script import Script
from store.db import Pool, transaction
from store.engine_health import EngineHealthStore
from store.errors import StoreError
from store.ledger import Ledger
from store.step_records import PostgresStepRecords, StepRecords
from workflows import handoff as flow
from workflows.capacity import CreditsExhausted, Exhausted, encode_state, rejection_from_payload
from workflows.circuit import (
    AttemptFailed,
    CapacityRejected,
    Completed,
    CompletionClaimed,
    OutOfCapacity,
    StepEvent,
    Success,
    Verdict,
    settle_verdict,
)
from workflows.gates import HANDOFF
from workflows.job import FailureClass
from workflows.ledger import LedgerEvent, NewEvent, UnwritableEvent, engine_events
from workflows.noloss import BriefMode, HandoffBrief, RuleFailure, Spec
from workflows.phases import Phase
from workflows.queue import GateRequest, Job, JobRepository
from workflows.rotation import Boundary, Candidate, RotationPolicy, RotationState, Trigger, rotate
from workflows.steps import Defer, Outcome, Park

HANDOFF_GATE = HANDOFF.name
CAPACITY_DELAY = timedelta(seconds=60)
ROSTER = "roster"  # the step input's engine name for the configured roster
REJECTED = "CapacityRejected"

Entry = dict[str, Any]
"""A ledger entry of ``evidence["ledger"]``: ``{"kind": <EventKind name>, "payload": {…}}``."""


@runtime_checkable
class BriefWriter(Protocol):
    """An engine that can write a handoff brief (the scripted engine can)."""

    def write_brief(
        self,
        task: EngineTask,
        ledger_range: Sequence[LedgerEvent],
        spec: Spec,
        *,
        mode: BriefMode,
        number: int,
        fix: tuple[RuleFailure, ...] = (),
    ) -> HandoffBrief: ...


@dataclass(frozen=True, slots=True)
class Member:
    id: str
    weight: int = 1
    spec: AgentSpec | None = None  # a configured engine (None: vibey's own, or `command`)


def roster_of(step_input: Mapping[str, Any], specs: Sequence[AgentSpec] = ()) -> tuple[Member, ...]:
    """The engines a step may rotate among: the script's roster for the scripted engine, the
    configured roster (narrowed to the workflow's ``engine.engines`` when given) for
    ``roster``, else the one engine the input names."""
    engine = step_input["engine"]
    if engine["name"] == "scripted":
        return tuple(Member(e.id, e.weight) for e in Script.parse(engine.get("script")).roster)
    if engine["name"] == ROSTER:
        wanted = engine.get("engines") or [spec.id for spec in specs]
        return tuple(Member(s.id, s.weight, s) for s in specs if s.id in wanted)
    return (Member(str(engine["name"])),)


@dataclass(frozen=True, slots=True)
class Answered:
    answer: str
    by: str
    context: Mapping[str, Any]


@dataclass(frozen=True, slots=True)
class Seeded:
    """A handoff whose brief passed: who takes over, the seeded task, what to record."""

    incoming: str
    task: EngineTask
    entries: list[Entry]
    summary: dict[str, Any]


@dataclass
class _Run:
    """One attempt's state across its handoffs."""

    job: Job
    task: EngineTask
    engines: Callable[[str], Engine]
    roster: tuple[Member, ...]
    clock: Callable[[], datetime]
    phase: Phase = Phase.BUILD
    carried: list[Entry] = field(default_factory=list)
    handoffs: list[dict[str, Any]] = field(default_factory=list)
    rejected: set[str] = field(default_factory=set)

    @property
    def now(self) -> datetime:
        return self.clock()

    @property
    def item(self) -> str:
        item = self.task.input.get("item")
        return str(item["id"]) if isinstance(item, Mapping) else self.task.subject


class Handoffs:
    """Runs build.implement's attempts on the roster's engines (see the module docstring)."""

    def __init__(
        self,
        pool: Pool | None,
        *,
        specs: Sequence[AgentSpec] = (),
        agent_env: Mapping[str, str] = {},
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        policy: RotationPolicy | None = None,
        records: StepRecords | None = None,
        jobs: JobRepository | None = None,
    ) -> None:
        """``records``: where gate answers are read (None: PostgreSQL on ``pool``, or none
        without one). ``jobs``: the process's job repository (its graph's,
        :mod:`actors.graph`), on which each attempt's engine is recorded (None: not
        recorded)."""
        self._pool = pool
        self._specs = tuple(specs)
        self._agent_env = dict(agent_env)
        self._clock = clock
        self._policy = policy or RotationPolicy()
        self._health = EngineHealthStore(pool=pool) if pool is not None else None
        self._ledger = Ledger(pool) if pool is not None else None
        self._jobs = jobs
        if records is None and pool is not None:
            records = PostgresStepRecords(pool=pool)
        self._records = records

    def run(
        self,
        job: Job,
        task: EngineTask,
        engine: Engine | Callable[[str], Engine],
        *,
        phase: Phase = Phase.BUILD,
    ) -> EngineVerdict | Outcome:
        """The attempt's verdict (the handler maps it to the outcome as for any engine), or
        the outcome itself when the job parks behind a handoff gate or waits for capacity.
        ``engine``: one engine for every roster member, or the engine of each member's id."""
        if task.workdir is None and task.worktree is None:
            raise EngineError(f"{task.kind} runs in a directory; job {job.id} has none")
        engines = (lambda _id: engine) if isinstance(engine, Engine) else engine
        roster = roster_of(task.input, self._specs)
        run = _Run(job, task, engines, roster, self._clock, phase)
        self._ready(run)
        answered = self._answered(job)
        if answered is not None and answered.answer == "cancel":
            return self._wait(run, answered)
        if answered is not None:
            outgoing = str(answered.context["outgoing"])
            return self._hand_off(run, outgoing, resumed=answered.context)
        chosen = self._select_new(run)
        if chosen is None:
            ids = ", ".join(m.id for m in run.roster)
            return Defer(CAPACITY_DELAY, f"no engine of {ids} is eligible now", capacity=True)
        return self._attempt_from(run, chosen, task)

    def _select_new(self, run: _Run) -> str | None:
        """A new attempt's engine: the NEW_WORK_ITEM boundary, or, when an operator asked
        (``vibey engine rotate <project>``, taken here), the OPERATOR_REQUEST boundary away
        from the engine the project last ran on (that one still, if no other is eligible)."""
        request = None if self._health is None else self._health.take_rotation(run.job.project_id)
        if request is None:
            return self._select(run, Boundary(Trigger.NEW_WORK_ITEM, run.phase))
        boundary = Boundary(Trigger.OPERATOR_REQUEST, run.phase)
        away = request.away_from
        if away is not None and away not in run.rejected:
            run.rejected.add(away)
            try:
                chosen = self._select(run, boundary)
            finally:
                run.rejected.discard(away)
            if chosen is not None:
                return chosen
        return self._select(run, boundary)

    # -- one engine after another -----------------------------------------------------------

    def _attempt_from(self, run: _Run, engine_id: str, task: EngineTask) -> EngineVerdict | Outcome:
        verdict = self._attempt(run, engine_id, task)
        if not _credits(verdict):
            return self._finish(run, verdict)
        run.carried += _entries(verdict)
        return self._hand_off(run, engine_id, why=verdict.detail)

    def _hand_off(
        self,
        run: _Run,
        outgoing: str,
        resumed: Mapping[str, Any] | None = None,
        why: str = "",
    ) -> EngineVerdict | Outcome:
        run.rejected.add(outgoing)
        step = self._handoff(run, outgoing, resumed)
        if isinstance(step, Seeded):
            run.carried += step.entries
            run.handoffs.append(step.summary)
            return self._attempt_from(run, step.incoming, step.task)
        if isinstance(step, Park):
            return step
        why = why or f"engine {outgoing} ran out of credits"
        detail = f"{why}; no other engine is eligible to take over"
        self._append(run, run.carried)
        return Defer(CAPACITY_DELAY, detail, capacity=True)

    def _attempt(self, run: _Run, engine_id: str, task: EngineTask) -> EngineVerdict:
        """Run ``task`` on roster engine ``engine_id``, settle its verdict, record it on the
        engine's circuit."""
        if self._jobs is not None and run.job.lease_owner is not None:
            self._jobs.assign(run.job.lease, engine_id=engine_id)  # fenced: a lost lease, no-op
        engine = run.engines(engine_id)
        verdict = engine.run(replace(task, input={**task.input, "engine_id": engine_id}))
        settled, verdict = settle(engine_id, verdict)
        if self._health is not None:
            now = run.now  # when it ended: an engine may work for hours
            if isinstance(settled, OutOfCapacity):
                self._health.record_capacity(engine_id, settled.state, now)
            elif isinstance(settled, Completed):
                self._health.record_outcome(engine_id, Success(), now)
            else:
                self._health.record_outcome(engine_id, FailureClass.ENGINE, now)
        return verdict

    def _finish(self, run: _Run, verdict: EngineVerdict) -> EngineVerdict:
        """The last engine's verdict is the step's, carrying what the handoffs recorded."""
        if verdict.status != "ok":  # no success settles, so no evidence is written: now
            if run.carried or verdict.status == "capacity":
                self._append(run, run.carried + _entries(verdict))
            return verdict
        if not run.carried:
            return verdict
        ledger = run.carried + _entries(verdict)
        evidence = {**verdict.evidence, "ledger": ledger, "handoffs": run.handoffs}
        return replace(verdict, evidence=evidence)

    # -- the handoff ------------------------------------------------------------------------

    def _handoff(
        self, run: _Run, outgoing: str, resumed: Mapping[str, Any] | None
    ) -> Seeded | Park | None:
        """Briefs through the gate (:mod:`workflows.handoff`): seeded, parked, or ``None``
        when no engine can take over."""
        forced = Boundary(Trigger.CAPACITY_REJECTION, run.phase, rejected_by=outgoing)
        incoming = self._select(run, forced, preview=True)
        if incoming is None:
            return None
        ledger_range = self._range(run.job.project_id)
        spec = Spec(work_items=(run.item,))
        worktree = str(run.task.worktree or run.task.workdir)
        handoff, action = flow.start(outgoing=outgoing, incoming=incoming, worktree=worktree)
        written, log = 0, []
        if resumed is not None:  # a person answered `retry`: a new round of briefs
            rounds = int(resumed.get("rounds", 1))
            waiting = replace(
                handoff, stage=flow.Stage.AWAITING_HUMAN, mode="full_transcript", rounds=rounds
            )
            handoff, action = flow.gate_answered(waiting, "retry")
            written, log = int(resumed.get("briefs", 0)), list(resumed.get("attempts", []))
        while isinstance(action, flow.WriteBrief):
            written += 1
            author, mode = action.author, action.mode
            brief = self._brief(run, action, written, ledger_range, spec)
            if brief is None:
                why = f"engine {author} wrote no brief (it cannot write one)"
                handoff, action = flow.brief_missing(handoff, why, author_dead=True)
                failed = ["no brief"]
            else:
                handoff, action = flow.brief_written(handoff, brief, ledger_range, spec)
                passed = isinstance(action, flow.SeedIncoming)
                failed = [] if passed else [f.rule.value for f in handoff.failures]
            log.append({"brief": written, "by": author, "mode": mode, "failed": failed})
        initiated = {
            "id": f"handoff:{run.job.id}:{outgoing}",
            "from": outgoing,
            "to": incoming,
            "item": run.item,
            "reason": "CreditsExhausted",
        }
        first = [] if resumed is not None else [_entry("HandoffInitiated", initiated)]
        if isinstance(action, flow.SeedIncoming):
            return self._seed(run, handoff, action, ledger_range, first, log)
        if isinstance(action, flow.OpenHumanGate):
            self._append(run, run.carried + first)
            context = {
                "outgoing": outgoing,
                "incoming": incoming,
                "item": run.item,
                "attempt": run.job.attempts,
                "rounds": handoff.rounds,
                "briefs": written,
                "mode": handoff.mode,
                "failed_rules": sorted({f.rule.value for f in action.failures}),
                "failures": [
                    {"rule": f.rule.value, "detail": f.detail[:300]} for f in action.failures
                ],
                "attempts": log,
                "ledger_file": handoff.ledger_file,
            }
            return Park(GateRequest(HANDOFF_GATE, action.prompt, action.answers, context=context))
        return None  # Abandon comes only from a `cancel` answer, which _wait handles

    def _seed(
        self,
        run: _Run,
        handoff: flow.Handoff,
        action: flow.SeedIncoming,
        ledger_range: Sequence[LedgerEvent],
        first: list[Entry],
        log: list[Any],
    ) -> Seeded | None:
        """The gate passed: the range goes to the worktree's ledger file, forced rotation
        picks the incoming engine, and the task is seeded with the brief."""
        path = Path(action.ledger_file)
        write_range(path, ledger_range)
        forced = Boundary(Trigger.CAPACITY_REJECTION, run.phase, rejected_by=handoff.outgoing)
        incoming = self._select(run, forced)
        if incoming is None:
            return None
        brief = action.brief
        prompt = seed_prompt(handoff.outgoing, run.item, brief, str(path), len(ledger_range))
        seed = {
            "from": handoff.outgoing,
            "to": incoming,
            "mode": action.mode,
            "prompt": prompt,
            "ledger_file": str(path),
            "brief": brief_json(brief),
        }
        accepted = {
            "id": f"handoff:{run.job.id}:{handoff.outgoing}",
            "from": handoff.outgoing,
            "to": incoming,
            "item": run.item,
            "mode": action.mode,
            "briefs": log[-1]["brief"] if log else 0,
            "rounds": handoff.rounds,
            "ledger_file": str(path),
            "range_digest": brief.range_digest,
        }
        entries = [{**e, "payload": {**e["payload"], "to": incoming}} for e in first]
        summary = {"from": handoff.outgoing, "to": incoming, "mode": action.mode, "briefs": log}
        task = replace(run.task, input={**run.task.input, "handoff": seed})
        return Seeded(incoming, task, [*entries, _entry("HandoffAccepted", accepted)], summary)

    def _brief(
        self,
        run: _Run,
        action: flow.WriteBrief,
        number: int,
        ledger_range: Sequence[LedgerEvent],
        spec: Spec,
    ) -> HandoffBrief | None:
        author = run.engines(action.author)
        if not isinstance(author, BriefWriter):
            return None
        task = replace(run.task, input={**run.task.input, "engine_id": action.author})
        return author.write_brief(
            task, ledger_range, spec, mode=action.mode, number=number, fix=action.fix
        )

    # -- a cancelled handoff ----------------------------------------------------------------

    def _wait(self, run: _Run, answered: Answered) -> EngineVerdict | Outcome:
        """``cancel``: no other engine takes the item; it waits for the outgoing engine."""
        outgoing = str(answered.context["outgoing"])
        why = (
            f"the handoff of {run.item} from {outgoing} was cancelled by {answered.by}: "
            f"it waits for {outgoing}'s capacity"
        )
        boundary = Boundary(Trigger.OPERATOR_REQUEST, run.phase)
        chosen = self._select(run, boundary, allowed=frozenset({outgoing}))
        if chosen is None:
            return Defer(CAPACITY_DELAY, why, capacity=True)
        verdict = self._attempt(run, chosen, run.task)
        if verdict.status == "capacity":
            self._append(run, _entries(verdict))
            again = f"{why}; it refused again: {verdict.detail}"
            return Defer(CAPACITY_DELAY, again, capacity=True)
        return verdict

    def stream_to(self, job: Job) -> EvidenceSink | None:
        """Where a job's engine streams its evidence while it runs: appended to the ledger
        at once, with the job's causation (``None`` without a ledger). A store error is a
        refusal: the entries then go with the verdict."""
        if self._ledger is None:
            return None

        def sink(entries: Sequence[Mapping[str, Any]]) -> bool:
            try:
                self._append_for(job, [dict(e) for e in entries])
            except StoreError:
                return False
            return True

        return sink

    def rejected(self, job: Job, verdict: EngineVerdict) -> EngineVerdict:
        """A capacity verdict of an engine run outside the roster (one engine, any kind),
        settled as :func:`settle` does and its rejection appended to the ledger now: a step
        that defers writes no evidence, and the ledgered rejections bound its waits."""
        engine = str(job.payload.get("input", {}).get("engine", {}).get("name", "engine"))
        _, settled = settle(engine, verdict)
        self._append_for(job, _entries(settled))
        return settled

    # -- engine_health, the ledger, the gate ------------------------------------------------

    def _ready(self, run: _Run) -> None:
        """The roster in engine_health (one transaction, rows in engine-id order). vibey's
        own engines (scripted, `command`) count as installed with a doctor pass at ``now``; a
        configured engine is registered as it is (installed when its binary is found) and is
        eligible only with a recorded conformance pass within the TTL (`vibey doctor
        --conformance --engine <id> --record`)."""
        if self._pool is None or self._health is None:
            return
        now = run.now
        with transaction(self._pool) as conn:
            for member in sorted(run.roster, key=lambda m: m.id):
                spec = member.spec
                if spec is None:
                    self._health.register_on(conn, member.id, installed=True, weight=member.weight)
                    self._health.record_doctor_on(conn, member.id, passed=True, at=now)
                    continue
                self._health.register_on(
                    conn,
                    member.id,
                    installed=installed(spec, self._agent_env),
                    local=spec.local,
                    weight=spec.weight,
                    capabilities=spec.capabilities,
                )

    def _select(
        self,
        run: _Run,
        boundary: Boundary,
        *,
        allowed: frozenset[str] | None = None,
        preview: bool = False,
    ) -> str | None:
        """The engine rotation picks at ``boundary`` among the roster (less the engines that
        refused in this attempt), or among ``allowed``. ``preview``: who it would pick, with
        nothing saved."""
        members = [m for m in run.roster if m.spec is None or m.spec.allows(run.phase.value)]
        ids = allowed if allowed is not None else frozenset(m.id for m in members)
        ids = ids - (run.rejected if allowed is None else frozenset())
        policy = replace(self._policy, allow_lists={run.phase: ids})
        now = run.now
        if self._health is None:
            candidates = [Candidate(m.id, m.weight, authenticated_at=now) for m in run.roster]
            return rotate(candidates, RotationState(), boundary, policy, now).engine_id
        if not preview:
            return self._health.select(boundary, policy, now).engine_id
        healths = self._health.all()
        state = RotationState(
            tuple(
                (h.engine_id, h.rotation_weight) for h in healths if h.rotation_weight is not None
            )
        )
        candidates = [h.candidate(now) for h in healths]
        return rotate(candidates, state, boundary, policy, now).engine_id

    def _range(self, project: str) -> list[LedgerEvent]:
        return [] if self._ledger is None else self._ledger.read(project)

    def _append(self, run: _Run, entries: Sequence[Entry]) -> None:
        """Append ``entries`` now, for a step that will not settle with a success (whose
        evidence is therefore never written)."""
        self._append_for(run.job, entries)

    def _append_for(self, job: Job, entries: Sequence[Entry]) -> None:
        if self._ledger is None or not entries:
            return
        events: list[NewEvent] = []
        for entry in entries:
            try:
                events += engine_events({"ledger": [entry]})
            except UnwritableEvent:
                continue  # writers are strict: what this vibey may not write is left out
        workflow = None if job.workflow_id is None else str(job.workflow_id)
        self._ledger.append(
            job.project_id,
            events,
            causation_id=str(job.id),
            correlation_id=workflow,
            job_id=job.id,
            workflow_id=job.workflow_id,
        )

    def _answered(self, job: Job) -> Answered | None:
        """The handoff gate answered just before this attempt (its context's ``attempt`` is
        the one before), if any."""
        if self._records is None:
            return None
        row = self._records.last_answer(job.id, HANDOFF_GATE)
        if row is None or not isinstance(row.context, Mapping):
            return None
        context = row.context
        if context.get("attempt") != job.attempts - 1 or "outgoing" not in context:
            return None
        return Answered(row.answer, row.by, context)


# -- settling one engine's attempt ---------------------------------------------------------


def settle(engine_id: str, verdict: EngineVerdict) -> tuple[Verdict, EngineVerdict]:
    """How ``engine_id``'s attempt settles (:func:`workflows.circuit.settle_verdict` over its
    events), and the verdict to go on with: when it met a capacity rejection, a ``capacity``
    verdict naming the state in ``result["capacity"]``, with a ``CapacityRejected`` in its
    evidence, whatever the engine claimed."""
    rejections = _rejections(verdict)
    events: list[StepEvent] = [CapacityRejected(state) for state in rejections]
    if verdict.status == "ok":
        events.append(CompletionClaimed(verdict.detail))
    elif verdict.status == "failed":
        events.append(AttemptFailed(FailureClass.ENGINE, verdict.detail))
    settled = settle_verdict(events)
    if not isinstance(settled, OutOfCapacity):
        return settled, verdict
    state = settled.state
    ledger = _entries(verdict)
    if not any(e.get("kind") == REJECTED for e in ledger):
        ledger.append(_entry(REJECTED, {**encode_state(state), "engine": engine_id}))
    detail = verdict.detail or f"engine {engine_id}: {state.kind.value}"
    if verdict.status != "capacity":
        detail = (
            f"engine {engine_id} said {verdict.status} but reported a capacity rejection "
            f"({state.kind.value}): a capacity rejection outranks a completion claim"
        )
    evidence = {**verdict.evidence, "ledger": ledger}
    return settled, EngineVerdict(
        "capacity", result={"capacity": encode_state(state)}, evidence=evidence, detail=detail
    )


def _rejections(verdict: EngineVerdict) -> list[Exhausted]:
    found = [
        rejection_from_payload(e["payload"])
        for e in _entries(verdict)
        if e.get("kind") == REJECTED and isinstance(e.get("payload"), Mapping)
    ]
    if verdict.status == "capacity":
        named = verdict.result.get("capacity")
        if isinstance(named, Mapping):
            found.append(rejection_from_payload(named))
        elif not found:  # no state named: without a reset time, nothing waits for one
            found.append(CreditsExhausted(detail=verdict.detail or "no capacity state named"))
    return found


def _credits(verdict: EngineVerdict) -> bool:
    named = verdict.result.get("capacity")
    return (
        verdict.status == "capacity"
        and isinstance(named, Mapping)
        and isinstance(rejection_from_payload(named), CreditsExhausted)
    )


def _entries(verdict: EngineVerdict) -> list[Entry]:
    ledger = verdict.evidence.get("ledger")
    if not isinstance(ledger, list):
        return []
    return [dict(e) for e in ledger if isinstance(e, Mapping)]


def _entry(kind: str, payload: Mapping[str, Any]) -> Entry:
    return {"kind": kind, "payload": dict(payload)}


# -- what the incoming engine gets ---------------------------------------------------------


def write_range(path: Path, ledger_range: Sequence[LedgerEvent]) -> None:
    """The range as JSON lines (``seq``, ``kind``, ``payload``, ``digest``), in seq order, in
    a directory git ignores (its ``.gitignore`` says ``*``), so no branch ever carries it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.parent / ".gitignore").write_text("*\n", encoding="utf-8")
    lines = [
        json.dumps(
            {"seq": e.seq, "kind": e.kind_name, "payload": dict(e.payload), "digest": e.digest},
            sort_keys=True,
            ensure_ascii=False,
        )
        for e in ledger_range
    ]
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")


def seed_prompt(
    outgoing: str, item: str, brief: HandoffBrief, ledger_file: str, events: int
) -> str:
    """The prompt that seeds the incoming engine. It names the ledger file; it never inlines
    the range."""
    head = (
        f"You are taking over build.implement of work item {item!r} from engine {outgoing}, "
        "which ran out of credits."
    )
    where = f"{events} ledger events, range digest {brief.range_digest}, in {ledger_file}"
    if brief.mode == "full_transcript":
        return (
            f"{head} No summary passed the no-loss gate, so work from the full range: the "
            f"{where} (JSON lines, one event a line). Read that file first; it is not repeated "
            "here."
        )
    text = json.dumps(brief_json(brief), indent=2, sort_keys=True)
    return (
        f"{head} The brief below passed the no-loss gate; the range it covers is the {where} "
        f"(JSON lines).\n\nBrief:\n{text}"
    )


def brief_json(brief: HandoffBrief) -> dict[str, Any]:
    data = asdict(brief)
    data["budget"] = {"dollars": str(brief.budget.dollars), "turns": brief.budget.turns}
    loaded: dict[str, Any] = json.loads(json.dumps(data))
    return loaded
