"""``vibey workflow ...``: start, status, list, history, cancel and verify a project's workflow.

A project has at most one live (running or blocked) workflow; ``status``, ``history``,
``cancel`` and ``verify`` act on it, or on the project's latest when none is live. Read
commands take ``--json`` (shapes: :mod:`vibey.render`).
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path
from typing import Annotated, Any

from cyclopts import App, Parameter

from store.workflow_reads import Workflow
from store.workflows import WorkflowStore
from vibey import render
from vibey.render import CommandError, ExitCode
from vibey.settings import Settings, check_project_ids, load_settings
from workflows.engine import Status, WorkflowError

workflow_app = App(
    name="workflow",
    help="Start, inspect, cancel and verify a project's workflow.",
)

Json = Annotated[bool, Parameter(name="--json", negative=())]
By = Annotated[str | None, Parameter(name="--by")]


def _project(project: str) -> str:
    return check_project_ids([project], "fix the project argument")[0]


def read_script(path: Path) -> dict[str, Any]:
    """A script file: JSON when it ends in ``.json``, else TOML, that the scripted engine
    reads without complaint (docs/protocol.md)."""
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
    from actors.engines.base import ScriptError  # the scripted engine's own reading
    from actors.engines.script import Script

    try:
        Script.parse(parsed)
    except ScriptError as exc:
        raise CommandError(f"script {path}: {exc}", ExitCode.USAGE) from exc
    return parsed


def workflow_input(
    project: str, settings: Settings, script: Path | None, given: str | None = None
) -> dict[str, Any]:
    """``Started.input``: ``--input``'s JSON object with the project, for any definition; else
    (docs/protocol.md) the project and the engine that runs the protocol's steps."""
    if given is not None:
        if script is not None:
            raise CommandError("--input and --script are exclusive: give one", ExitCode.USAGE)
        return {"project": project, **_json_object(given)}
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


def _live(store: WorkflowStore, project: str) -> Workflow:
    workflow = store.for_project(project)
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
    definition: str | None = None,
    input: str | None = None,
    json_output: Json = False,
) -> ExitCode:
    """Start PROJECT's workflow; when one is live already, print it and change nothing.

    Exits 0 either way. For the protocol the workflow input is ``{"project", "engine"}``:
    ``--script`` runs the scripted engine on FILE; without it, ``[engine] name`` chooses
    (scripted with an empty script by default, or command). Any other definition takes
    ``--input`` (a JSON object, or @FILE) plus the project. The first step is committed with
    the start and dispatched right after it.

    JSON: ``{"workflow": {...}, "created": bool}``.

    Parameters
    ----------
    project
        The project id (no '.', '*', '#' or whitespace).
    script
        The scripted engine's script: TOML, or JSON when it ends in .json (docs/protocol.md).
    definition
        The workflow definition to start (default: [workflow] default_definition).
    input
        The workflow's input: a JSON object, or @FILE holding one ("project" is added).
    json_output
        Print one JSON object.
    """
    settings = load_settings()
    project = _project(project)
    given = workflow_input(project, settings, script, input)
    name = definition or settings.workflow.default_definition
    from vibey.wiring import workflow_client

    with workflow_client(settings) as client:
        try:
            client.store.registry.latest(name)
        except WorkflowError as exc:
            raise CommandError(f"{exc}: fix --definition", ExitCode.USAGE) from exc
        outcome = client.store.start(project, definition=name, input=given)
        dispatch = client.publish()
        workflow, describe = outcome.workflow, client.store.describe(outcome.workflow)
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


@workflow_app.command
def status(project: str, *, json_output: Json = False) -> ExitCode:
    """Show PROJECT's workflow: its phase, what it waits on, its steps.

    The phase diagram with the current phase marked, what it is doing or waits on, its open
    gates (with the command that answers each), and its steps.

    JSON: ``{"workflow": {...}, "gates": [gate...], "steps": [step...]}``.

    Parameters
    ----------
    project
        The project id.
    json_output
        Print one JSON object.
    """
    settings = load_settings()
    from vibey.wiring import workflow_client

    with workflow_client(settings) as client:
        store = client.store
        workflow = store.for_project(_project(project))
        describe = store.describe(workflow)
        gates = [
            (g, w) for g, w in store.inbox(workflow.project_id) if g.workflow_id == workflow.id
        ]
        steps = store.steps(workflow.id)
    if json_output:
        render.dump(
            {
                "workflow": render.workflow_json(workflow, describe),
                "gates": [render.gate_json(g, w) for g, w in gates],
                "steps": [render.step_json(s) for s in steps],
            }
        )
        return ExitCode.OK
    render.print_workflow(workflow, describe)
    if gates:
        print(f"waiting on ({len(gates)}):")
        render.print_gate_lines(gates, indent="  ")
    render.print_steps(steps)
    return ExitCode.OK


@workflow_app.command(name="list")
def list_(
    *,
    status: Status | None = None,
    project: str | None = None,
    limit: int = 100,
    json_output: Json = False,
) -> ExitCode:
    """List workflows, most recently updated first.

    JSON: ``{"workflows": [{...}, ...]}``.

    Parameters
    ----------
    status
        Only workflows in this status.
    project
        Only this project's workflows (its earlier, finished ones too).
    limit
        At most this many.
    json_output
        Print one JSON object.
    """
    settings = load_settings()
    if limit < 1:
        raise CommandError(f"--limit must be at least 1, got {limit}", ExitCode.USAGE)
    from vibey.wiring import workflow_client

    with workflow_client(settings) as client:
        store = client.store
        found = store.listing(status=status, project_id=project, limit=limit)
        items = [(wf, store.describe(wf)) for wf in found]
    if json_output:
        render.dump({"workflows": [render.workflow_json(wf, d) for wf, d in items]})
    else:
        render.print_workflow_table(items)
    return ExitCode.OK


@workflow_app.command
def history(project: str, *, json_output: Json = False) -> ExitCode:
    """Show PROJECT's workflow history: each event, when, and the commands it decided.

    JSON: ``{"workflow_id": str, "events": [{"seq", "at", "event", "commands"}, ...]}``.

    Parameters
    ----------
    project
        The project id.
    json_output
        Print one JSON object.
    """
    settings = load_settings()
    from vibey.wiring import workflow_client

    with workflow_client(settings) as client:
        workflow = client.store.for_project(_project(project))
        entries = client.store.history(workflow.id)
    if json_output:
        render.dump(render.history_json(workflow, entries))
    else:
        render.print_history(workflow, entries)
    return ExitCode.OK


@workflow_app.command
def cancel(
    project: str,
    *,
    by: By = None,
    reason: str = "",
    json_output: Json = False,
) -> ExitCode:
    """Cancel PROJECT's live workflow: its unfinished steps stop, its open gates close.

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
    settings = load_settings()
    from vibey.wiring import workflow_client

    with workflow_client(settings) as client:
        workflow = _live(client.store, _project(project))
        cancelled = client.store.cancel(workflow.id, by=by or whoami(), reason=reason)
        describe = client.store.describe(cancelled)
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
    settings = load_settings()
    from vibey.wiring import workflow_client

    with workflow_client(settings) as client:
        workflow = client.store.for_project(_project(project))
        result = client.store.verify(workflow.id, block=not no_block)
    if json_output:
        render.dump({"ok": result.ok, "replayed": result.replayed, "divergence": result.divergence})
        return ExitCode.OK if result.ok else ExitCode.FAILURE
    if result.ok:
        print(f"replay reproduces the stored state ({result.replayed} events)")
        return ExitCode.OK
    blocked = result.workflow.status is Status.BLOCKED and not no_block
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
