"""The step handlers of the vibey phase protocol, one per registered job kind.

A worker builds them with :func:`build_handlers` (``actors.handlers:build_handlers``) from a
:class:`HandlerContext`. Each handler reads its job's ``payload["input"]`` (docs/protocol.md),
picks the engine named by ``input["engine"]["name"]`` (``scripted`` or ``command``), runs the
step on it and maps the engine's verdict to the step's outcome (:func:`to_outcome`):

==========================================  =================================================
verdict                                     outcome
==========================================  =================================================
``ok``                                      ``Success({**result, "evidence": evidence})``
``ok`` with a result its kind's schema      ``Failure(engine, the first mismatch)``
refuses (``workflows.schema``)
``capacity``                                ``Defer(60 s, detail, capacity=True)``; after
                                            ``capacity_waits`` (10) ledgered rejections,
                                            ``Park(capacity_exhausted)``
``failed`` by the engine process            ``Failure(engine, detail + stderr tail)``
(exit ≠ 0, timeout, no/malformed verdict)
``failed`` of build.verify, deploy.execute  ``Failure(work, detail)`` — the work is wrong
``failed`` of any other kind                ``Failure(engine, detail)`` — the engine could not
==========================================  =================================================

A step input the handler cannot use (no ``input``, no or an unknown engine, a malformed
script, no engine command configured) is ``Failure(vibey, what to fix)``.

build.implement runs in the item's own git worktree (:class:`actors.worktrees.Workspace`);
whatever the engine left uncommitted there is committed, and the result names the item's
branch and commit. Its engine is picked by rotation among the roster, and an engine out of
credits hands the item to the next one through the no-loss gate (:mod:`actors.handoff`).
build.integrate asks no engine: it merges the cycle's item branches into the integration
branch, serialised per project and cycle by a PostgreSQL transaction-level advisory lock; with
``[project] push`` set it then pushes that branch to the remote's ``push_branch`` (a
fast-forward; a refusal is ``Failure(vibey)``), and the result's ``pushed`` says where
(recorded as ``ArtifactProduced``).

The merge queue (:mod:`workflows.merge_queue`): build.verify and build.integrate merge the
items one at a time in the order of their input (the plan's), and an item that conflicts is
left out and reported in the result's ``conflicts`` (its files, and the items already merged
that changed them), never a failure: a build.verify whose pass met a conflict runs no tests
and no engine (``{"passed": false, "conflicts": […]}``), a build.integrate that met one does
not push. build.resolve runs in the conflicting item's worktree with the integration branch
merged into it (:meth:`actors.worktrees.Workspace.start_resolve`): the engine resolves the
files in conflict, vibey commits the merge once no conflict marker is left (else the attempt
fails, ``Failure(work)``, and the merge is dropped); an item that merges cleanly by then needs
no engine.

Every engine step of a workflow with a budget first asks the ledger what the workflow has
spent (:mod:`workflows.budget`, :mod:`store.cost`): once it reached the budget plus what was
granted, the step parks behind a ``budget_exhausted`` gate instead of running (or, while one
is open, waits behind it). build.integrate drives no engine and is never held.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, suppress
from dataclasses import dataclass, field, replace
from datetime import timedelta
from pathlib import Path
from types import MappingProxyType
from typing import Any

from actors.agents import (
    CommandEngine,
    Engine,
    EngineError,
    EngineTask,
    EngineVerdict,
    ScriptedEngine,
)
from actors.agents.adapters import engine_for
from actors.agents.lease import Held, Holder, WorktreeBusy, WorktreeLease
from actors.agents.roster import AgentSpec
from actors.agents.run_client import RunClient, RunDeferred
from actors.agents.tests_run import TestsRun, find_test_command, run_tests
from actors.handoff import ROSTER, Handoffs
from actors.worktrees import (
    INTEGRATION_BRANCH,
    GitError,
    UnknownBranchError,
    UnresolvedError,
    Workspace,
    WorkspaceError,
    abort_resolve,
    commit_all,
    current_branch,
    finish_resolve,
    head,
)
from store.db import Pool
from store.step_records import PostgresStepRecords, StepRecords
from workflows import schema
from workflows.budget import gate_prompt
from workflows.effort import Attempt, Effort, LadderExhausted, climb, next_rung
from workflows.gates import (
    BUDGET_EXHAUSTED,
    BUDGET_SCHEMA,
    CAPACITY_EXHAUSTED,
    GRANT_SCHEMA,
    LADDER_EXHAUSTED,
    SPEND_EXHAUSTED,
)
from workflows.job import TIMER_KIND, FailureClass
from workflows.kinds import StepKind
from workflows.ledger import UnwritableEvent, engine_events
from workflows.merge_queue import Pass
from workflows.phases import Phase
from workflows.protocol.kinds import (
    BUILD_IMPLEMENT,
    BUILD_INTEGRATE,
    BUILD_RESOLVE,
    BUILD_VERIFY,
    REVIEW_DEMO,
    STEP_KINDS,
)
from workflows.queue import GateRequest, Job, JobRepository
from workflows.steps import Defer, Failure, Handler, Handlers, Outcome, Park, Success

CAPACITY_DELAY = timedelta(seconds=60)
DETAIL_LIMIT = 2000
NO_COMMAND = "no engine command configured: set [engine] command in vibey.toml"
NO_ROSTER = "the workflow runs on the roster but no engine is configured: add [engines.<id>]"
CAPACITY_WAITS = 10  # capacity rejections a job waits through before its gate
BUSY_DELAY = timedelta(seconds=5)  # a workdir busy under another job: look again after
BUDGET_DELAY = timedelta(seconds=5)  # a step waiting behind the workflow's open budget gate
LEASE_GRACE_S = 2.0
INTEGRATED_PHASES: frozenset[str] = frozenset(
    {Phase.REVIEW, Phase.DEPLOY_DESIGN, Phase.DEPLOY_EXECUTE, Phase.DEPLOY_REVIEW}
)


Engines = Engine | Callable[[str], Engine]  # one engine, or a roster's engine by id


class StepInputError(Exception):
    """A step input a handler cannot run: it names what is missing or wrong."""


@dataclass(frozen=True, slots=True)
class HandlerContext:
    """What the handlers need, passed in once. ``engines`` adds or overrides engines by
    name (a test registers a ``FakeEngine``); ``scripted`` and ``command`` are built in.
    ``records`` is what the handlers read (None: :class:`store.step_records.PostgresStepRecords`
    on ``pool``, or nothing without one); the handoff flow writes through ``pool``, and
    records each attempt's engine through ``jobs``, the process's job repository (its graph's,
    :mod:`actors.graph`; None: not recorded)."""

    pool: Pool | None
    workspace: Path
    command: tuple[str, ...] = ()
    command_timeout: timedelta = timedelta(hours=2)
    engines: Mapping[str, Engine] = field(default_factory=dict)
    max_dollars: float | None = None  # spend caps of a bounded BUILD job (None: no cap)
    max_turns: int | None = None
    roster: tuple[AgentSpec, ...] = ()  # the configured engines ([engines.<id>])
    agent_env: Mapping[str, str] = field(default_factory=dict)  # the base they get
    records: StepRecords | None = None
    jobs: JobRepository | None = None
    runs: RunClient | None = None  # service-mode engines' loop services (None: no broker)
    push_remote: str | None = None  # [project] push: build.integrate pushes there (None: not)
    push_branch: str = "vibey/{project}"  # the remote branch; {project} is the project id
    capacity_waits: int = CAPACITY_WAITS  # capacity rejections a job waits through, then parks


def build_handlers(context: HandlerContext) -> Handlers:
    """A handler for each of the protocol's 26 names (an alias shares its kind's handler)."""
    steps = Steps(context)
    kinds = [name for name in STEP_KINDS if name != TIMER_KIND]
    handlers: dict[str, Handler] = dict.fromkeys(kinds, steps.run)
    handlers[BUILD_INTEGRATE] = steps.integrate
    handlers.update({alias: handlers[kind] for alias, kind in STEP_KINDS.aliases.items()})
    return MappingProxyType(handlers)


def to_outcome(name: str, verdict: EngineVerdict) -> Outcome:
    """The step's outcome for an engine's verdict (the table in the module docstring); a
    failure is classed as the kind declares."""
    kind = STEP_KINDS.get_kind(name)
    if verdict.status == "ok":
        try:  # writers are strict: what the engine says it did must be ledger events we know
            engine_events(verdict.evidence)
        except UnwritableEvent as exc:
            return Failure(FailureClass.ENGINE, f"the engine's evidence: {exc}"[:DETAIL_LIMIT])
        wrong = schema.problem(verdict.result, kind.result)
        if wrong is not None:  # the definition would read it: the engine's failure, not ours
            detail = f"{kind.name}'s result does not match its kind's result schema: {wrong}"
            return Failure(FailureClass.ENGINE, detail[:DETAIL_LIMIT], evidence=verdict.evidence)
        return Success({**verdict.result, "evidence": verdict.evidence})
    if verdict.status == "capacity":
        reason = verdict.detail or "the engine reported no capacity"
        return Defer(CAPACITY_DELAY, reason, capacity=True)
    detail = verdict.detail or f"the engine failed {kind.name}"
    evidence = _writable(verdict.evidence)
    if verdict.engine_fault:
        stderr = str(verdict.evidence.get("stderr_tail", "")).strip()
        detail = f"{detail}; stderr: {stderr[-1000:]}" if stderr else detail
        return Failure(FailureClass.ENGINE, detail[:DETAIL_LIMIT], evidence=evidence)
    return Failure(kind.failure_class, detail[:DETAIL_LIMIT], evidence=evidence)


def _writable(evidence: Mapping[str, Any]) -> Mapping[str, Any]:
    """A failed attempt's evidence, kept for the ledger only when it is writable."""
    try:
        engine_events(evidence)
    except UnwritableEvent:
        return {}
    return evidence


class Steps:
    """The handlers' shared state: the workspace and the engines."""

    def __init__(self, context: HandlerContext) -> None:
        self.context = context
        self.records = context.records
        if self.records is None and context.pool is not None:
            self.records = PostgresStepRecords(pool=context.pool)
        self.workspace = Workspace(context.workspace)
        self._engines: dict[str, Engine] = {"scripted": ScriptedEngine()}
        if context.command:
            self._engines["command"] = CommandEngine(
                context.command, context.command_timeout, scratch_root=context.workspace
            )
        self._engines.update(context.engines)
        self._roster: dict[str, Engine] = {
            spec.id: engine_for(
                spec,
                worker_env=context.agent_env,
                state_dir=self.workspace.root / ".state",
                context=self._plan_context,
                runs=context.runs,
            )
            for spec in context.roster
        }
        # rotation and handoff: build.implement on any engine, every kind on the roster
        self.handoffs = Handoffs(
            context.pool,
            specs=context.roster,
            agent_env=context.agent_env,
            records=self.records,
            jobs=context.jobs,
        )
        self.leases = WorktreeLease(grace=LEASE_GRACE_S, fence=self._fence)

    def _fence(self, holder: Holder) -> bool:
        """Whether PostgreSQL still grants ``holder``'s job to the claim that started it."""
        if self.records is None:
            return True
        return self.records.lease_held(holder.job_id, holder.owner)

    def run(self, job: Job) -> Outcome:
        step_kind = STEP_KINDS.get_kind(job.kind)
        kind, bounded = step_kind.name, step_kind.bounded is not None
        try:
            step_input = step_input_of(job)
            engine = self._engine(step_input)
            worktree = (
                self._worktree(job, step_input)
                if kind in (BUILD_IMPLEMENT, BUILD_RESOLVE)
                else None
            )
            granted = self._granted(job, step_kind) if bounded else 0
            over = self._over_budget(job) or (self._over_spend_cap(job) if bounded else None)
            if over is not None:
                return over
            effort = _effort(job, step_kind, granted)
            task = EngineTask(
                kind,
                job.project_id,
                job.cycle,
                job.subject,
                job.attempts,
                step_input,
                worktree,
                effort=effort.name,
                workdir=worktree or self._workdir(job.project_id, step_kind),
                job_id=str(job.id),
                stream=self.handoffs.stream_to(job),
            )
            with self._leased(job, task) as leased:
                task, ran = self._work(job, leased, engine)
            if not isinstance(ran, EngineVerdict):  # parked at a handoff gate, or deferred
                return ran
            verdict = self._finished(task, ran)
        except (WorktreeBusy, RunDeferred) as exc:  # neither burns an attempt
            return Defer(BUSY_DELAY, str(exc)[:DETAIL_LIMIT])
        except (StepInputError, EngineError, WorkspaceError) as exc:
            return Failure(FailureClass.VIBEY, str(exc)[:DETAIL_LIMIT])
        outcome = to_outcome(kind, verdict)
        if isinstance(outcome, Failure) and bounded:
            return _park_if_exhausted(job, step_kind, outcome, granted)
        if isinstance(outcome, Defer) and outcome.capacity:
            return self._bounded_wait(job, outcome)
        return outcome

    def _bounded_wait(self, job: Job, wait: Defer) -> Outcome:
        """Capacity waits are bounded in every kind: once the job's ledger holds
        ``capacity_waits`` rejections (this one included) since its last
        ``capacity_exhausted`` answer, it parks
        behind that gate instead of deferring again (an answer refunds the attempt and the
        count starts over)."""
        if self.records is None:
            return wait
        waits = self.records.capacity_waits(job.id, CAPACITY_EXHAUSTED.name)
        if waits < self.context.capacity_waits:
            return wait
        subject = job.payload.get("subject") or job.subject
        prompt = (
            f"{job.kind} of {subject} was refused for capacity {waits} times: {wait.reason[:300]}."
            " Top up the engine's credits or configure another engine, then answer retry."
        )
        context = {"kind": job.kind, "waits": waits, "detail": wait.reason[:1000]}
        return Park(
            GateRequest(
                CAPACITY_EXHAUSTED.name, prompt, CAPACITY_EXHAUSTED.answers, context=context
            )
        )

    def _finished(self, task: EngineTask, verdict: EngineVerdict) -> EngineVerdict:
        """What vibey adds to a success: build.implement's commit on the item's branch,
        build.resolve's merge commit, review.demo's diff stat of the integrated tree."""
        if task.kind == BUILD_RESOLVE and task.worktree is not None:
            return _finish_resolution(task.worktree, task, verdict)
        if verdict.status != "ok":
            return verdict
        if task.kind == BUILD_IMPLEMENT and task.worktree is not None:
            return _finish_implement(task.worktree, task, verdict)
        if task.kind == REVIEW_DEMO and "diff_stat" not in verdict.result:
            stat = self.workspace.diff_stat(task.project_id)
            return replace(verdict, result={**verdict.result, "diff_stat": stat})
        return verdict

    def _attempt(self, job: Job, task: EngineTask, engine: Engines) -> EngineVerdict | Outcome:
        kind = STEP_KINDS.get_kind(task.kind)
        if task.kind == BUILD_IMPLEMENT or not isinstance(engine, Engine):
            return self.handoffs.run(job, task, engine, phase=Phase(kind.phase or Phase.BUILD))
        verdict = engine.run(task)
        if verdict.status == "capacity":  # ledgered now: a deferral writes no evidence
            verdict = self.handoffs.rejected(job, verdict)
        return verdict

    def _work(
        self, job: Job, task: EngineTask, engine: Engines
    ) -> tuple[EngineTask, EngineVerdict | Outcome]:
        """The step's work, holding its workdir's lease: what comes before the engine
        (:meth:`_prepare`), build.verify's tests, then the engine."""
        prepared = self._prepare(task)
        if isinstance(prepared, Success):
            return task, prepared
        tested = self._tests(prepared) if prepared.kind == BUILD_VERIFY else None
        if tested is not None and not tested.passed:
            return prepared, _tests_failed(tested)
        ran = self._attempt(job, prepared, engine)
        if tested is not None and isinstance(ran, EngineVerdict):
            ran = replace(ran, evidence={**ran.evidence, "tests": tested.evidence()})
        return prepared, ran

    def _prepare(self, task: EngineTask) -> EngineTask | Success:
        """Before the engine: build.verify's pass of the merge queue (one that met conflicts
        ends the step: the tests wait for a pass that merges every item) and build.resolve's
        merge of the integration branch (one that is clean ends it: nothing to resolve)."""
        if task.kind == BUILD_VERIFY:
            merged = self._merge_pass(task)
            if merged is not None and merged.conflicts:
                return _conflicted(merged)
        if task.kind == BUILD_RESOLVE:
            files = self._start_resolve(task)
            if not files:
                return self._resolved_cleanly(task)
            return replace(task, input={**task.input, "files": list(files)})
        return task

    def _merge_pass(self, task: EngineTask) -> Pass | None:
        """build.verify verifies the integrated code: a pass of the merge queue merges the
        cycle's items into the integrated tree first (integrate, later, finds them merged).
        An unknown item branch is integrate's to report."""
        items = task.input.get("items")
        if not isinstance(items, list) or not items or not all(isinstance(i, str) for i in items):
            return None
        with self.integration_lock(task.project_id, task.cycle), suppress(UnknownBranchError):
            return self.workspace.merge_queue(task.project_id, task.cycle, items, hold=True)
        return None

    def _start_resolve(self, task: EngineTask) -> tuple[str, ...]:
        """build.resolve: the integration branch merged into the item's worktree, under the
        integration lock (the integrated tree does not move meanwhile); the files in conflict."""
        item = _item_id(task.input)
        with self.integration_lock(task.project_id, task.cycle):
            _, files = self.workspace.start_resolve(task.project_id, task.cycle, item)
        return files

    def _resolved_cleanly(self, task: EngineTask) -> Success:
        assert task.worktree is not None
        result = {
            "resolved": True,
            "item": _item_id(task.input),
            "files": [],
            "attempt": task.attempt,
            "branch": current_branch(task.worktree),
            "commit": head(task.worktree),
        }
        return Success({**result, "evidence": {"clean": True}})

    def _tests(self, task: EngineTask) -> TestsRun | None:
        """The project's own test command, run in the integrated tree (build.verify)."""
        assert task.workdir is not None
        command = find_test_command(self.workspace.project_dir(task.project_id), task.workdir)
        if command is None:
            return None
        env = dict(self.context.agent_env) or None
        return run_tests(command, task.workdir, env=env, lease=task.lease)

    def _roster_engine(self, engine_id: str) -> Engine:
        engine = self._roster.get(engine_id)
        if engine is None:
            raise StepInputError(
                f"engine {engine_id!r} is not configured: add [engines.{engine_id}]"
            )
        return engine

    def _plan_context(self, task: EngineTask) -> Mapping[str, Any]:
        """What a configured engine's plan adds to the step input: the accepted spec and the
        design answers (the workflow's state), and the result its kind must report."""
        context: dict[str, Any] = {"result_schema": dict(STEP_KINDS.get_kind(task.kind).result)}
        if task.kind == BUILD_VERIFY and task.workdir is not None:
            project_dir = self.workspace.project_dir(task.project_id)
            command = find_test_command(project_dir, task.workdir)
            context["test_command"] = " ".join(command) if command else None
        if self.records is None or not task.job_id:
            return context
        plan = self.records.plan_context(task.job_id)
        if plan is not None:
            context.update(spec=plan.spec, answers=plan.answers)
        return context

    @contextmanager
    def _leased(self, job: Job, task: EngineTask) -> Iterator[EngineTask]:
        """The task, holding its workdir's lease for the block (see :mod:`actors.agents.lease`):
        no two attempts ever work in one directory."""
        assert task.workdir is not None
        with self._held(job, task.workdir) as held:
            yield replace(task, lease=held)

    def _held(self, job: Job, directory: Path) -> AbstractContextManager[Held]:
        owner = str(job.lease_token) if job.lease_token is not None else f"local:{job.id}"
        return self.leases.hold(directory, str(job.id), job.attempts, owner)

    def _workdir(self, project: str, kind: StepKind) -> Path:
        """Where a kind's engine works: build.verify, REVIEW and DEPLOY in the integrated tree
        (the code, not a scratch folder), the others in the project's scratch directory."""
        if kind.name == BUILD_VERIFY or kind.phase in INTEGRATED_PHASES:
            return self.workspace.integrated(project)
        scratch = self.workspace.project_dir(project) / "scratch"
        scratch.mkdir(parents=True, exist_ok=True)
        return scratch

    def _over_spend_cap(self, job: Job) -> Park | None:
        """A bounded job whose recorded spend (the ledger's BudgetSpent for it) reached a cap
        plus what answers granted parks before it runs again; its gate grants more."""
        caps = {"max_dollars": self.context.max_dollars, "max_turns": self.context.max_turns}
        if self.records is None or not any(caps.values()):
            return None
        spent = self.records.spent(job.id)
        granted = self.records.spend_granted(job.id, SPEND_EXHAUSTED.name)
        for (bound, cap), used in zip(caps.items(), (spent.dollars, spent.turns), strict=True):
            limit = None if cap is None else cap + granted.get(bound, 0.0)
            if limit is not None and float(used) >= limit:
                return _spend_gate(job, bound, float(used), limit)
        return None

    def _over_budget(self, job: Job) -> Park | Defer | None:
        """An engine step of a workflow whose ledgered spend reached its budget (plus what
        answers granted) does not run (:mod:`workflows.budget`): it parks behind a
        ``budget_exhausted`` gate, or, while the workflow has one open already, waits behind
        that one (deferred: no attempt burned, no second gate). Steps in flight when the
        budget is crossed finish and are counted; only the next to start waits."""
        if self.records is None or job.workflow_id is None:
            return None
        state = self.records.workflow_budget(job.id)
        at = state.reached
        if at is None:
            return None
        if state.open_gate is not None:
            why = f"waits for the answer to the workflow's budget gate {state.open_gate}"
            return Defer(BUDGET_DELAY, why)
        subject = str(job.payload.get("subject") or job.subject)
        context = {
            "kind": job.kind,
            "grant": at.bound,
            "spent": at.spent,
            "limit": at.limit,
            "budget": None if state.budget is None else state.budget.to_json(),
        }
        prompt = gate_prompt(job.kind, subject, at)
        return Park(
            GateRequest(BUDGET_EXHAUSTED.name, prompt, context=context, schema=dict(BUDGET_SCHEMA))
        )

    def _granted(self, job: Job, kind: StepKind) -> int:
        """The attempts granted so far by answers to this job's ladder gates (the record).
        Grants matter only once the ladder's rungs are spent: before that, no query."""
        if job.attempts < len(kind.effort):
            return 0
        if self.records is None:
            return max(0, job.max_attempts - kind.max_attempts)
        return self.records.attempts_granted(job.id, LADDER_EXHAUSTED.name)

    def integrate(self, job: Job) -> Outcome:
        try:
            items = _items(step_input_of(job))
            tree = self.workspace.integrated(job.project_id)
            with self.integration_lock(job.project_id, job.cycle), self._held(job, tree):
                merged = self.workspace.merge_queue(job.project_id, job.cycle, items)
                commit = head(tree)
                pushed = None if merged.conflicts else self._push(job.project_id)
        except (WorktreeBusy, RunDeferred) as exc:  # neither burns an attempt
            return Defer(BUSY_DELAY, str(exc)[:DETAIL_LIMIT])
        except GitError as exc:
            if exc.git_args[:1] != ("push",):
                return Failure(FailureClass.VIBEY, str(exc)[:DETAIL_LIMIT])
            detail = f"the push to {self.context.push_remote} failed: {exc}; fix [project] push"
            return Failure(FailureClass.VIBEY, detail[:DETAIL_LIMIT])
        except (StepInputError, WorkspaceError) as exc:
            return Failure(FailureClass.VIBEY, str(exc)[:DETAIL_LIMIT])
        result: dict[str, Any] = {
            "branch": INTEGRATION_BRANCH,
            "merged": list(merged.merged),
            "commit": commit,
        }
        if merged.conflicts:  # the merge queue resolves them; nothing is pushed meanwhile
            result["conflicts"] = [
                {"item": c.item, "files": list(c.files), "against": list(c.against)}
                for c in merged.conflicts
            ]
        if pushed is not None:
            result["pushed"] = pushed
        return Success({**result, "evidence": {"cycle": job.cycle}})

    def _push(self, project: str) -> dict[str, str] | None:
        """``[project] push``: the integrated branch pushed to its remote branch (a
        fast-forward), as ``{"remote", "branch", "commit"}``; ``None`` when no push is set."""
        remote = self.context.push_remote
        if remote is None:
            return None
        branch = self.context.push_branch.replace("{project}", project)
        commit = self.workspace.push(project, remote, branch)
        return {"remote": remote, "branch": branch, "commit": commit}

    @contextmanager
    def integration_lock(self, project: str, cycle: int) -> Iterator[None]:
        """Held for the whole merge: ``pg_advisory_xact_lock(hashtext('vibey.integrate:' ||
        project), cycle)`` in a transaction on a pooled connection (the records' lock).
        Without records (unit tests) a process-local lock stands in; it serialises nothing
        across processes."""
        if self.records is None:
            with _local_lock(project, cycle):
                yield
            return
        with self.records.integration_lock(project, cycle):
            yield

    def _engine(self, step_input: Mapping[str, Any]) -> Engines:
        name = step_input["engine"]["name"]
        if name == ROSTER:
            if not self._roster:
                raise StepInputError(NO_ROSTER)
            return self._roster_engine
        engine = self._engines.get(name)
        if engine is not None:
            return engine
        if name == "command":
            raise StepInputError(NO_COMMAND)
        known = ", ".join(sorted({*self._engines, "command"}))
        raise StepInputError(f"the step input names engine {name!r}; known engines: {known}")

    def _worktree(self, job: Job, step_input: Mapping[str, Any]) -> Path:
        item = step_input.get("item")
        if not isinstance(item, Mapping) or not isinstance(item.get("id"), str):
            raise StepInputError(f"{job.kind} needs input.item with an id, got {item!r}")
        return self.workspace.worktree(job.project_id, job.cycle, item["id"])


def _item_id(step_input: Mapping[str, Any]) -> str:
    item = step_input.get("item")
    if not isinstance(item, Mapping) or not isinstance(item.get("id"), str):
        raise StepInputError(f"build.resolve needs input.item with an id, got {item!r}")
    return str(item["id"])


def _conflicted(merged: Pass) -> Success:
    """A build.verify whose pass met conflicts: what merged and what did not, no tests run."""
    conflicts = [
        {"item": c.item, "files": list(c.files), "against": list(c.against)}
        for c in merged.conflicts
    ]
    result = {"passed": False, "merged": list(merged.merged), "conflicts": conflicts}
    return Success({**result, "evidence": {"merge_queue": {"conflicts": len(conflicts)}}})


def _finish_resolution(worktree: Path, task: EngineTask, verdict: EngineVerdict) -> EngineVerdict:
    """build.resolve: the engine's resolution committed on the item's branch; a failed verdict
    (or a resolution with conflict markers left, :class:`UnresolvedError`) drops the merge."""
    item = _item_id(task.input)
    if verdict.status != "ok":
        abort_resolve(worktree)
        return verdict
    files = [f for f in task.input.get("files") or [] if isinstance(f, str)]
    message = f"vibey: resolve {item}'s merge of {INTEGRATION_BRANCH} (cycle {task.cycle})"
    try:
        commit = finish_resolve(worktree, item, files, message)
    except UnresolvedError as exc:  # the conflict is still there: the work's failure
        abort_resolve(worktree)
        return EngineVerdict("failed", evidence=verdict.evidence, detail=str(exc))
    result = {
        **verdict.result,
        "resolved": True,
        "item": item,
        "files": files,
        "attempt": task.attempt,
        "branch": current_branch(worktree),
        "commit": commit,
    }
    return replace(verdict, result=result)


def _tests_failed(tested: TestsRun) -> EngineVerdict:
    detail = f"the project's tests failed ({' '.join(tested.command)}): {tested.output_tail[-800:]}"
    return EngineVerdict("failed", evidence={"tests": tested.evidence()}, detail=detail)


def _effort(job: Job, kind: StepKind, granted: int) -> Effort:
    """This attempt's rung of its kind's effort ladder (seed 004): BUILD and DEPLOY_EXECUTE
    climb after failures; the bounded kinds run granted attempts at the top."""
    if kind.bounded is None:
        return climb(kind.effort, max(0, job.attempts - 1))
    step = next_rung(kind.effort, max(0, job.attempts - 1), granted)
    return step.effort if isinstance(step, Attempt) else step.top


def _park_if_exhausted(job: Job, kind: StepKind, failure: Failure, granted: int) -> Outcome:
    """Bounded ladders park, they do not loop: a failure that exhausts the effort ladder (and
    whatever was granted) parks the job behind a gate whose answer grants more attempts."""
    after = next_rung(kind.effort, job.attempts, granted)
    if not isinstance(after, LadderExhausted):
        return failure
    bound, subject = kind.bounded, job.payload.get("subject") or job.subject
    prompt = (
        f"{kind.name} of {subject} failed at the top of its effort "
        f"ladder ({after.top.name}) after {job.attempts} attempts: {failure.detail[:300]}. "
        f"Answer with a number to grant that many more attempts ({bound}); they run at "
        f"{after.top.name}. Or cancel the workflow."
    )
    context = {
        "kind": kind.name,
        "attempts": job.attempts,
        "granted": granted,
        "grant": bound,
        "effort": after.top.name,
        "failure_class": failure.failure_class.value,
        "detail": failure.detail[:1000],
    }
    return Park(
        GateRequest(LADDER_EXHAUSTED.name, prompt, context=context, schema=dict(GRANT_SCHEMA))
    )


def _spend_gate(job: Job, bound: str, used: float, limit: float) -> Park:
    unit = "dollars" if bound == "max_dollars" else "turns"
    prompt = (
        f"{job.kind} of {job.payload.get('subject') or job.subject} reached its spend cap: "
        f"{used:g} of {limit:g} {unit}. Answer with a number to grant that many more {unit} "
        f"({bound}). Or cancel the workflow."
    )
    context = {"kind": job.kind, "grant": bound, "spent": used, "limit": limit}
    return Park(
        GateRequest(SPEND_EXHAUSTED.name, prompt, context=context, schema=dict(GRANT_SCHEMA))
    )


def step_input_of(job: Job) -> Mapping[str, Any]:
    """The job's step input, with an ``engine`` object that has a ``name``."""
    step_input = job.payload.get("input")
    if not isinstance(step_input, Mapping):
        raise StepInputError(
            f"job {job.id} ({job.kind}) has no input object in its payload; the protocol "
            "schedules steps with payload {workflow_id, step, subject, input}"
        )
    engine = step_input.get("engine")
    if not isinstance(engine, Mapping) or not isinstance(engine.get("name"), str):
        raise StepInputError(
            f"job {job.id} ({job.kind}): input.engine must be an object with a name "
            '("scripted" or "command"), got ' + repr(engine)
        )
    return step_input


def _items(step_input: Mapping[str, Any]) -> list[str]:
    items = step_input.get("items")
    if not isinstance(items, list) or not all(isinstance(item, str) for item in items):
        raise StepInputError(f"build.integrate needs input.items, a list of ids; got {items!r}")
    return list(items)


def _finish_implement(worktree: Path, task: EngineTask, verdict: EngineVerdict) -> EngineVerdict:
    """Commits what the engine left uncommitted; the result names the branch and commit."""
    item = task.input["item"]["id"]
    commit = commit_all(worktree, f"vibey: implement {item} (cycle {task.cycle})")
    branch = current_branch(worktree)
    result = {"status": "done", **verdict.result, "item": item, "branch": branch, "commit": commit}
    return replace(verdict, result=result)


_LOCAL_GUARD = threading.Lock()
_LOCAL_LOCKS: dict[tuple[str, int], threading.Lock] = {}


def _local_lock(project: str, cycle: int) -> threading.Lock:
    with _LOCAL_GUARD:
        return _LOCAL_LOCKS.setdefault((project, cycle), threading.Lock())
