"""``vibey workflow ...``: start, status, cost, list, history, cancel and verify a project's
workflow.

A project has at most one live (running or blocked) workflow; ``status``, ``history``,
``cancel`` and ``verify`` act on it, or on the project's latest when none is live. Read
commands take ``--json`` (shapes: :mod:`vibey.render`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal

from cyclopts import App, Parameter

from vibey import render
from vibey.command_groups import help_of
from vibey.paging import FIRST_PAGE, Listing, Paging, filters_of, ndjson, optional_age
from vibey.render import CommandError, ExitCode

if TYPE_CHECKING:
    from collections.abc import Mapping, Sequence
    from contextlib import AbstractContextManager

    from store.workflow_reads import StartOutcome, Workflow
    from vibey.client import Client
    from vibey.settings import Settings

workflow_app = App(name="workflow", help=help_of("workflow"))

Json = Annotated[bool, Parameter(name="--json", negative=())]
By = Annotated[str | None, Parameter(name="--by")]
# workflows.engine.Status's values, spelled here so that parsing --status imports no engine
# (tests/unit/test_cli_imports.py checks they agree).
StatusName = Literal["running", "blocked", "completed", "failed", "cancelled"]


def _project(project: str) -> str:
    from vibey.settings import check_project_ids

    return check_project_ids([project], "fix the project argument")[0]


def read_script(path: Path) -> dict[str, Any]:
    """A script file: JSON when it ends in ``.json``, else TOML, that the scripted engine
    reads without complaint (docs/protocol.md)."""
    import tomllib

    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CommandError(f"script {path}: not UTF-8 text ({exc.reason})", ExitCode.USAGE) from exc
    except OSError as exc:
        why = exc.strerror or str(exc)
        raise CommandError(f"script {path}: cannot be read ({why})", ExitCode.USAGE) from exc
    try:
        parsed: Any = json.loads(text) if path.suffix.lower() == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        kind = "JSON" if path.suffix.lower() == ".json" else "TOML"
        raise CommandError(
            f"script {path}: not valid {kind} ({render.short(str(exc), 200)})", ExitCode.USAGE
        ) from exc
    if not isinstance(parsed, dict):
        raise CommandError(
            f"script {path}: must hold an object at the top, got {type(parsed).__name__}",
            ExitCode.USAGE,
        )
    from actors.agents.base import ScriptError  # the scripted engine's own reading
    from actors.agents.script import Script

    try:
        Script.parse(parsed)
    except ScriptError as exc:
        raise CommandError(f"script {path}: {exc}", ExitCode.USAGE) from exc
    return parsed


def workflow_input(
    project: str,
    settings: Settings,
    script: Path | None,
    given: str | None = None,
    engines: str | None = None,
) -> dict[str, Any]:
    """``Started.input``: ``--input``'s JSON object with the project, for any definition; else
    (docs/protocol.md) the project and the engine that runs the protocol's steps.

    With a configured roster (``[engines.<id>]``) the steps run on the roster (``{"name":
    "roster", "engines": [ids]}``, narrowed by ``--engines``); a ``--script`` goes along for
    engines that play it (the scripted adapter, the fake CLIs). ``[workflow] review_feedback``
    (on by default) adds ``"review_feedback": true``: REVIEW asks the user."""
    if given is not None:
        if script is not None:
            raise CommandError("--input and --script are exclusive: give one", ExitCode.USAGE)
        return {"project": project, **_json_object(given)}
    protocol = _protocol_input(project, settings, script, engines)
    if settings.workflow.review_feedback:
        protocol["review_feedback"] = True
    return protocol


def _protocol_input(
    project: str, settings: Settings, script: Path | None, engines: str | None
) -> dict[str, Any]:
    if engines is not None or settings.engines:
        from vibey.settings import SettingsError

        wanted = [e.strip() for e in (engines or "").split(",") if e.strip()]
        try:
            roster = settings.roster(wanted)
        except SettingsError as exc:
            raise CommandError(f"{exc}: fix --engines", ExitCode.USAGE) from exc
        if not roster:
            raise CommandError("--engines names no configured engine", ExitCode.USAGE)
        engine: dict[str, Any] = {"name": "roster", "engines": [spec.id for spec in roster]}
        if script is not None:
            engine["script"] = read_script(script)
        return {"project": project, "engine": engine}
    if script is not None:
        return {"project": project, "engine": {"name": "scripted", "script": read_script(script)}}
    if settings.engine.name == "command":
        return {"project": project, "engine": {"name": "command"}}
    return {"project": project, "engine": {"name": "scripted", "script": {}}}


def _json_object(text: str) -> dict[str, Any]:
    """``--input``: a JSON object, inline or ``@FILE``."""
    source = text
    if text.startswith("@"):
        try:
            source = Path(text[1:]).read_text(encoding="utf-8")
        except OSError as exc:
            raise CommandError(f"--input {text}: {exc.strerror}", ExitCode.USAGE) from exc
    try:
        parsed = json.loads(source)
    except ValueError as exc:
        raise CommandError(f"--input is not JSON ({exc}): give an object", ExitCode.USAGE) from exc
    if not isinstance(parsed, dict):
        raise CommandError('--input must be a JSON object, as in {"amount": 120}', ExitCode.USAGE)
    return parsed


def prepare_project(
    settings: Settings,
    project: str,
    repo: str | None,
    branch: str | None,
    test_command: str | None,
) -> None:
    """Imports ``repo`` into the project's workspace and writes its facts (``project.json``:
    the repository, the branch, the test command) for the workers. Without ``repo`` the
    project is a new one: its folder is made here, its empty repository on first use."""
    import shlex

    from actors.worktrees import Workspace, WorkspaceError

    if branch is not None and repo is None:
        raise CommandError("--branch goes with --repo", ExitCode.USAGE)
    workspace = Workspace(Path(settings.engine.workspace))
    what = f"cannot import {repo}" if repo is not None else f"cannot prepare project {project}"
    try:
        if repo is not None:
            source = str(Path(repo).resolve()) if Path(repo).exists() else repo
            workspace.import_repo(project, source, branch)
        folder = workspace.project_dir(project)
        folder.mkdir(parents=True, exist_ok=True)  # a new project: its repository comes later
        facts_file = folder / "project.json"
        facts = json.loads(facts_file.read_text()) if facts_file.is_file() else {}
        facts.update({k: v for k, v in (("repo", repo), ("branch", branch)) if v is not None})
        if test_command is not None:
            facts["test_command"] = shlex.split(test_command)
        facts_file.write_text(json.dumps(facts, indent=2), encoding="utf-8")
    except (WorkspaceError, ValueError, OSError) as exc:
        raise CommandError(f"{what}: {exc}", ExitCode.USAGE) from exc


def _live(client: Client, project: str) -> Workflow:
    workflow = client.status(project)
    if workflow.status.finished:
        raise CommandError(
            f"project {project!r} has no live workflow (its latest, {workflow.id}, is "
            f"{workflow.status.value})"
        )
    return workflow


@workflow_app.command
def start(
    project: str,
    *,
    script: Path | None = None,
    engines: str | None = None,
    repo: str | None = None,
    branch: str | None = None,
    test_command: str | None = None,
    definition: str | None = None,
    input: str | None = None,
    budget_dollars: float | None = None,
    budget_tokens: int | None = None,
    json_output: Json = False,
) -> ExitCode:
    """Start PROJECT's workflow; when one is live already, print it and change nothing.

    Exits 0 either way. For the protocol the workflow input is ``{"project", "engine"}``:
    with engines configured (``[engines.<id>]``) the steps rotate among them (``--engines``
    narrows the roster; ``--script`` goes along); else ``--script`` runs the scripted engine
    on FILE; else ``[engine] name`` chooses (scripted with an empty script by default, or
    command). Any other definition takes ``--input`` (a JSON object, or @FILE) plus the
    project. The first step is committed with the start and dispatched right after it.

    JSON: ``{"workflow": {...}, "created": bool}``.

    Parameters
    ----------
    project
        The project id (no '.', '*', '#' or whitespace).
    script
        The scripted engine's script: TOML, or JSON when it ends in .json (docs/protocol.md).
    engines
        Comma-separated ids of configured engines: this workflow rotates among them only.
    repo
        Import this repository (a path or a URL) as the project's (default: a new empty one).
    branch
        With --repo: the branch to import (it becomes main; default: the default branch).
    test_command
        The project's test command (shell words) build.verify runs in the integrated tree
        (default: detected from the layout: just, make, npm, cargo, go, pytest).
    definition
        The workflow definition to start (default: [workflow] default_definition).
    input
        The workflow's input: a JSON object, or @FILE holding one ("project" is added).
    budget_dollars
        The workflow's budget in dollars (default: [workflow] budget_dollars): once the
        ledger's spend reaches it, the next engine step parks at a budget_exhausted gate.
    budget_tokens
        The workflow's budget in tokens (default: [workflow] budget_tokens), likewise.
    json_output
        Print one JSON object.
    """
    from vibey.client import workflow_client
    from vibey.settings import load_settings
    from workflows.engine import WorkflowError

    settings = load_settings()
    project = _project(project)
    given = workflow_input(project, settings, script, input, engines)
    if repo is not None or test_command is not None:
        prepare_project(settings, project, repo, branch, test_command)
    name = definition or settings.workflow.default_definition

    with workflow_client(settings) as client:
        try:
            client.registry.latest(name)
        except WorkflowError as exc:
            raise CommandError(f"{exc}: fix --definition", ExitCode.USAGE) from exc
        outcome = _started(client, project, name, given, budget_dollars, budget_tokens)
        dispatch = client.publish()
        workflow, describe = outcome.workflow, client.describe(outcome.workflow)
    if json_output:
        render.dump(
            {"workflow": render.workflow_json(workflow, describe), "created": outcome.created}
        )
        return ExitCode.OK
    if outcome.created:
        note = render.dispatch_note(dispatch.rows, dispatch.published, tried=dispatch.tried)
        print(f"started; {note}" if dispatch.rows else "started")
    else:
        print(f"already live since {render.clock(workflow.created_at)}; nothing changed")
    render.print_workflow(workflow, describe)
    return ExitCode.OK


def _started(
    client: Client,
    project: str,
    name: str,
    given: dict[str, Any],
    dollars: float | None,
    tokens: int | None,
) -> StartOutcome:
    """Start with the workflow's budget: the flags', else the input's, else the settings'."""
    from workflows.budget import Budget, BudgetError

    try:
        budget = None if dollars is None and tokens is None else Budget(dollars, tokens)
        return client.start_outcome(project, name, given, budget=budget)
    except BudgetError as exc:
        raise CommandError(f"{exc}: fix --budget-dollars/--budget-tokens", ExitCode.USAGE) from exc


@workflow_app.command
def cost(project: str, *, json_output: Json = False) -> ExitCode:
    """Show what PROJECT's workflow has cost so far: tokens and dollars in total and by
    engine, phase and step, from the ledger's BudgetSpent events, and its budget.

    The live workflow, or the project's latest when none is live. An engine whose CLI reports
    no dollars (Codex, Gemini; aider without a price) shows its tokens and "no price", never
    $0. Exits 1 for a project that never had a workflow.

    JSON: ``{"workflow_id", "project", "total": line, "engines": [line...], "phases":
    [line...], "steps": [line...], "budget": {"budget", "spent", "granted", "reached",
    "open_gate", "problem"}}``; a line is ``{"engine", "phase", "step", "events", "turns",
    "input_tokens", "output_tokens", "tokens", "dollars" (null: no price), "priced",
    "unpriced"}``.

    Parameters
    ----------
    project
        The project id.
    json_output
        Print one JSON object.
    """
    from vibey.settings import load_settings

    with _reader(load_settings()) as client:
        found = client.cost(_project(project))
    if json_output:
        render.dump(found.to_json())
    else:
        render.print_cost(found)
    return ExitCode.OK


@workflow_app.command
def status(project: str, *, json_output: Json = False) -> ExitCode:
    """Show PROJECT's workflow: its phase, what it waits on, its steps.

    The phase diagram with the current phase marked, what it is doing or waits on, its open
    gates (with the command that answers each), and its steps. On the rabbitmq backend, a
    ready step whose queue no worker consumes says "waiting for a worker on <queue>: none is
    consuming" (and the `vibey worker` command that serves it).

    JSON: ``{"workflow": {...}, "gates": [gate...], "steps": [step...],
    "waiting_for_worker": [{"queue", "steps", "command"}]}``.

    Parameters
    ----------
    project
        The project id.
    json_output
        Print one JSON object.
    """
    from vibey.settings import load_settings

    settings = load_settings()
    with _reader(settings) as client:
        workflow = client.status(_project(project))
        describe = client.describe(workflow)
        gates = [
            (g, w) for g, w in client.inbox(workflow.project_id) if g.workflow_id == workflow.id
        ]
        steps = client.steps(workflow.id)
        waiting = _unserved(settings, client, workflow.project_id, steps)
    if json_output:
        render.dump(
            {
                "workflow": render.workflow_json(workflow, describe),
                "gates": [render.gate_json(g, w) for g, w in gates],
                "steps": [render.step_json(s) for s in steps],
                "waiting_for_worker": waiting,
            }
        )
        return ExitCode.OK
    render.print_workflow(workflow, describe)
    if gates:
        print(f"waiting on ({len(gates)}):")
        render.print_gate_lines(gates, indent="  ")
    render.print_steps(steps)
    for item in waiting:
        print(
            f"waiting for a worker on {item['queue']}: none is consuming "
            f"(start one: {item['command']})"
        )
    return ExitCode.OK


def _reader(settings: Settings) -> AbstractContextManager[Client]:
    """A read command's client, checked as :func:`vibey.client.workflow_client` checks (the
    database URL, then the definitions) but holding no relay: nothing here is dispatched."""
    from vibey.client import read_client
    from vibey.wiring import load_registry

    settings.require_database_url()
    return read_client(settings, registry=load_registry(settings))


def _unserved(
    settings: Settings, client: Client, project: str, steps: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """The queues this workflow's ready steps wait in that no consumer serves (rabbitmq)."""
    if settings.queue.backend != "rabbitmq" or settings.bus.amqp_url is None:
        return []
    kinds = [step["kind"] for step in steps if step["state"] == "ready"]
    if not kinds:
        return []
    router = client.router()
    dedicated = router.dedicated(project)
    ready: dict[str, tuple[str, int]] = {}
    for kind in kinds:
        queue, lane = router.queue(kind, project), router.lane(kind).value
        ready[queue] = (lane, ready.get(queue, (lane, 0))[1] + 1)
    from actors.queue_stats import consumer_counts

    counts = consumer_counts(settings.bus.amqp_url, ready)
    return [
        {
            "queue": queue,
            "steps": n,
            "command": f"vibey worker --lanes {lane}"
            + (f" --project {project}" if dedicated else ""),
        }
        for queue, (lane, n) in ready.items()
        if queue in counts and not counts[queue]
    ]


@workflow_app.command(name="list")
def list_(
    *,
    status: StatusName | None = None,
    project: str | None = None,
    tenant: str | None = None,
    definition: str | None = None,
    older_than: str | None = None,
    newer_than: str | None = None,
    paging: Paging = FIRST_PAGE,
    json_output: Json = False,
) -> ExitCode:
    """List workflows, most recently updated first (--order oldest: the stalest first).

    50 a page: a line under the table says how many match and the --after that shows the
    next page.

    JSON: ``{"workflows": [{...}, ...], "total": int, "total_capped": bool, "next_cursor":
    str | null}`` (counts stop at 10,000: ``total_capped`` says more match); with --all, one
    workflow object a line (NDJSON).

    Parameters
    ----------
    status
        Only workflows in this status.
    project
        Only this project's workflows (its earlier, finished ones too).
    tenant
        Only the workflows of this tenant's projects (a project not assigned one: default).
    definition
        Only workflows of this definition.
    older_than
        Only workflows not updated for at least this long (45s, 90m, 2h30m, 3d, 1w).
    newer_than
        Only workflows updated less than this long ago.
    json_output
        Print one JSON object.
    """
    from store.listings import WorkflowFilter
    from vibey.client import read_client
    from vibey.settings import load_settings
    from vibey.wiring import load_registry
    from workflows.engine import Status

    where = WorkflowFilter(
        status=None if status is None else Status(status),
        project_id=project,
        tenant=tenant,
        definition=definition,
        older_than=optional_age(older_than, "--older-than"),
        newer_than=optional_age(newer_than, "--newer-than"),
    )
    listing = Listing("workflow list", "workflows", "newest", paging, filters_of(where))
    spec = listing.spec()
    settings = load_settings()
    registry = load_registry(settings)  # first: a bad definition is said before connecting
    with read_client(settings, registry=registry) as client:
        if paging.all and json_output:
            found = client.iter_workflows(where, newest_first=listing.newest_first)
            ndjson(render.workflow_json(wf, client.describe(wf)) for wf in found)
            return ExitCode.OK
        page = client.workflow_page(where, spec)
        items = [(wf, client.describe(wf)) for wf in page.items]
    if json_output:
        listed = [render.workflow_json(wf, d) for wf, d in items]
        render.dump({"workflows": listed, **listing.json_tail(page)})
        return ExitCode.OK
    render.print_workflow_table(items)
    listing.print_footer(page)
    return ExitCode.OK


@workflow_app.command
def history(
    project: str,
    *,
    kind: str | None = None,
    paging: Paging = FIRST_PAGE,
    json_output: Json = False,
) -> ExitCode:
    """Show PROJECT's workflow history: each event, when, and the commands it decided.

    In seq order (--order newest: the latest first), 50 a page; the cursor is a seq:
    ``--after 50`` continues after event #50.

    JSON: ``{"workflow_id": str, "events": [{"seq", "at", "event", "commands"}, ...],
    "total": int, "total_capped": bool, "next_cursor": str | null}``; with --all, one event
    object a line (NDJSON).

    Parameters
    ----------
    project
        The project id.
    kind
        Only events of this type (started, step_succeeded, gate_answered, ...).
    json_output
        Print one JSON object.
    """
    from vibey.client import read_client
    from vibey.settings import load_settings

    filters = {"kind": kind}
    listing = Listing("workflow history", "events", "oldest", paging, filters, by_seq=True)
    spec = listing.spec()
    with read_client(load_settings()) as client:
        workflow = client.status(_project(project))
        if paging.all and json_output:
            found = client.iter_history(workflow.id, kind=kind, newest_first=listing.newest_first)
            ndjson(render.history_event_json(e) for e in found)
            return ExitCode.OK
        page = client.history_page(workflow.id, spec, kind=kind)
    if json_output:
        shown = render.history_json(workflow, page.items)
        render.dump({**shown, **listing.json_tail(page)})
        return ExitCode.OK
    render.print_history(workflow, page.items, total=page.total)
    listing.print_footer(page)
    return ExitCode.OK


@workflow_app.command
def cancel(
    project: str,
    *,
    by: By = None,
    reason: str = "",
    json_output: Json = False,
) -> ExitCode:
    """Cancel PROJECT's live workflow: its unfinished steps stop, its open gates close, and
    the engine processes working in its workspace on this machine are stopped (SIGTERM to
    each one's process group, then SIGKILL after a grace).

    Exits 1 when the project has no live workflow. JSON: ``{"workflow": {...}}``.

    Parameters
    ----------
    project
        The project id.
    by
        Who cancels (default: your user name).
    reason
        Why, recorded in the history.
    json_output
        Print one JSON object.
    """
    from vibey.client import workflow_client
    from vibey.settings import load_settings

    settings = load_settings()
    with workflow_client(settings) as client:
        workflow = _live(client, _project(project))
        cancelled = client.cancel(workflow.id, by=by or whoami(), reason=reason)
        describe = client.describe(cancelled)
    from actors.agents.lease import stop_all
    from actors.worktrees import Workspace

    stop_all(Workspace(Path(settings.engine.workspace)).project_dir(cancelled.project_id))
    if json_output:
        render.dump({"workflow": render.workflow_json(cancelled, describe)})
    else:
        print(f"cancelled workflow {cancelled.id} of project {cancelled.project_id}")
        render.print_workflow(cancelled, describe)
    return ExitCode.OK


@workflow_app.command
def verify(project: str, *, no_block: bool = False, json_output: Json = False) -> ExitCode:
    """Replay PROJECT's workflow history and compare it with the stored state.

    Exits 0 when the replay reproduces it, 1 on a divergence, which (unless --no-block)
    blocks a running workflow behind a workflow_error gate: answer it retry or cancel.

    JSON: ``{"ok": bool, "replayed": int, "divergence": str | null}``.

    Parameters
    ----------
    project
        The project id.
    no_block
        Only report a divergence; leave the workflow as it is.
    json_output
        Print one JSON object.
    """
    from vibey.client import workflow_client
    from vibey.settings import load_settings

    settings = load_settings()
    with workflow_client(settings) as client:
        workflow = client.status(_project(project))
        result = client.verify(workflow.id, block=not no_block)
    if json_output:
        render.dump({"ok": result.ok, "replayed": result.replayed, "divergence": result.divergence})
        return ExitCode.OK if result.ok else ExitCode.FAILURE
    if result.ok:
        print(f"replay reproduces the stored state ({result.replayed} events)")
        return ExitCode.OK
    blocked = result.workflow.status.value == "blocked" and not no_block
    note = (
        "; the workflow is blocked behind a workflow_error gate (see `vibey gate list`)"
        if blocked
        else ""
    )
    raise CommandError(f"{result.divergence}{note}")


def whoami() -> str:
    """The OS user name, for ``--by``."""
    import getpass

    try:
        return getpass.getuser()
    except (OSError, KeyError):  # no user name in this environment
        return "unknown"
