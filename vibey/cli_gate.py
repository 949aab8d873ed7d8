"""``vibey gate ...``: what waits on a person (workflow questions and parked jobs), and the
answer that releases it.

``gate answer`` commits the answer, the workflow's ``GateAnswered`` event, what the
definition decides and the next steps' dispatch in one transaction; it then publishes those
steps at once (see :meth:`vibey.client.Client.flush`). Answering twice changes
nothing and exits 1; an answer the gate does not take exits 2 listing the valid ones.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Annotated

from cyclopts import App, Parameter

from vibey import render
from vibey.command_groups import help_of
from vibey.paging import FIRST_PAGE, Listing, Paging, filters_of, ndjson, optional_age
from vibey.render import CommandError, ExitCode

if TYPE_CHECKING:
    from workflows.queue import Gate

gate_app = App(name="gate", help=help_of("gate"))

Json = Annotated[bool, Parameter(name="--json", negative=())]


def gate_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise CommandError(
            f"{raw!r} is not a gate id: gate ids are UUIDs, as `vibey gate list` shows them",
            ExitCode.USAGE,
        ) from None


@gate_app.command(name="list")
def list_(
    *,
    project: str | None = None,
    tenant: str | None = None,
    kind: str | None = None,
    older_than: str | None = None,
    newer_than: str | None = None,
    paging: Paging = FIRST_PAGE,
    json_output: Json = False,
) -> ExitCode:
    """Everything waiting on a person, across projects, with how long it has waited.

    Workflow questions and jobs parked behind a gate, oldest first (--order newest: the
    newest first), 50 a page: a line under the table says how many match and the --after
    that shows the next page.

    JSON: ``{"gates": [gate, ...], "total": int, "total_capped": bool, "next_cursor": str |
    null}`` (counts stop at 10,000: ``total_capped`` says more match); with --all, one gate
    object a line (NDJSON).

    Parameters
    ----------
    project
        Only this project's gates.
    tenant
        Only the gates of this tenant's projects (a project not assigned one: default).
    kind
        Only gates of this kind (approval, handoff, ...).
    older_than
        Only gates open for at least this long (45s, 90m, 2h30m, 3d, 1w).
    newer_than
        Only gates open for less than this long.
    json_output
        Print one JSON object.
    """
    from store.listings import GateFilter
    from vibey.client import read_client
    from vibey.settings import load_settings

    where = GateFilter(
        project_id=project,
        tenant=tenant,
        kind=kind,
        older_than=optional_age(older_than, "--older-than"),
        newer_than=optional_age(newer_than, "--newer-than"),
    )
    listing = Listing("gate list", "gates", "oldest", paging, filters_of(where))
    spec = listing.spec()
    with read_client(load_settings()) as client:
        if paging.all and json_output:
            streamed = client.iter_gates(where, newest_first=listing.newest_first)
            ndjson(render.gate_json(g, w) for g, w in streamed)
            return ExitCode.OK
        page = client.gate_page(where, spec)
    if json_output:
        gates = [render.gate_json(g, w) for g, w in page.items]
        render.dump({"gates": gates, **listing.json_tail(page)})
        return ExitCode.OK
    render.print_gate_table(page.items)
    listing.print_footer(page)
    return ExitCode.OK


@gate_app.command
def show(gate: str, /, *, json_output: Json = False) -> ExitCode:
    """Show one gate: its question, the answers it takes, and how to answer it.

    Its context and evidence too, and who answered it and when. Exits 1 for an unknown id.

    JSON: a gate object.

    Parameters
    ----------
    gate
        The gate id (a UUID).
    json_output
        Print one JSON object.
    """
    wanted = gate_id(gate)
    from vibey.client import workflow_client
    from vibey.settings import load_settings

    settings = load_settings()
    with workflow_client(settings) as client:
        found = client.gate(wanted)
    if found is None:
        raise CommandError(f"no gate {wanted}")
    waited_s = render.waited(found, datetime.now(UTC))
    if json_output:
        render.dump(render.gate_json(found, waited_s))
    else:
        render.print_gate(found, waited_s)
    return ExitCode.OK


@gate_app.command
def answer(
    gate: str,
    answer: str,
    /,
    *,
    by: Annotated[str | None, Parameter(name="--by")] = None,
    json_output: Json = False,
) -> ExitCode:
    """Answer GATE with ANSWER; the workflow's next steps are dispatched at once.

    The answer, the workflow's decision and its next steps are committed in one
    transaction; the steps are then published to RabbitMQ (when VIBEY_AMQP_URL is set).

    GATE is a gate id, or WORKFLOW_ID:NAME (a workflow's gate by its name, as a link sent
    ahead can name it): a gate the workflow has not opened yet is refused, nothing recorded.

    Exits 1 when the gate is unknown, not open yet or already answered (nothing changes), 2
    when ANSWER is not one the gate takes (the valid ones are listed).

    JSON: ``{"gate": gate, "workflow": workflow | null, "dispatch": {"rows", "published"}}``
    (``workflow`` is null for a parked job's gate; ``rows``: step dispatches committed,
    ``published``: those RabbitMQ confirmed before the command returned).

    Parameters
    ----------
    gate
        The gate id (a UUID), or WORKFLOW_ID:NAME.
    answer
        The answer.
    by
        Who answers (default: your user name).
    json_output
        Print one JSON object.
    """
    gate_id(gate.partition(":")[0])  # a malformed id is a usage error, before any connection
    from vibey.cli_workflow import whoami
    from vibey.client import AnswerRefused, workflow_client
    from vibey.settings import load_settings

    settings = load_settings()
    with workflow_client(settings) as client:
        try:
            answered = client.answer(gate, answer, by=by or whoami())
        except AnswerRefused as refused:
            code = ExitCode.USAGE if refused.invalid else ExitCode.FAILURE
            raise CommandError(str(refused), code) from None
        dispatch = client.publish()
        workflow, describe = None, ""
        if answered.workflow_id is not None:
            workflow = client.status(answered.workflow_id)
            describe = client.describe(workflow)
    waited_s = render.waited(answered, datetime.now(UTC))
    if json_output:
        render.dump(
            {
                "gate": render.gate_json(answered, waited_s),
                "workflow": None if workflow is None else render.workflow_json(workflow, describe),
                "dispatch": {"rows": dispatch.rows, "published": dispatch.published},
            }
        )
        return ExitCode.OK
    print(f"answered {_label(answered)} with {answered.answer!r} as {answered.answered_by}")
    if workflow is not None:
        render.print_workflow(workflow, describe)
    elif answered.job_id is not None:
        print(f"job {answered.job_id} is ready to run again")
    if dispatch.rows:
        print(render.dispatch_note(dispatch.rows, dispatch.published, tried=dispatch.tried))
    return ExitCode.OK


def _label(gate: Gate) -> str:
    return f"gate {gate.id} ({gate.name})" if gate.name else f"gate {gate.id}"
