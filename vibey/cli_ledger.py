"""``vibey ledger ...``: show and verify a project's ledger (``store.ledger``).

Exit codes (:class:`vibey.render.ExitCode`):

* ``show``: 0 listed (nothing after ``--after`` is still 0); 1 the project has no ledger
  (no event was ever appended under that id: a mistyped project, most likely); 2 a bad
  argument; 3 PostgreSQL did not answer.
* ``verify``: 0 every digest matches and seq runs 1..N with the head at N; 1 a problem,
  naming the first bad seq and what is wrong with it, or no ledger for that project (a
  check of a ledger that does not exist does not pass); 2 a bad argument; 3 unavailable.
  With ``--json`` the verification object is printed in both cases.

JSON shapes:

* ledger event: ``{"seq", "kind", "known", "payload", "digest", "causation_id",
  "correlation_id", "job_id", "workflow_id", "recorded_at"}`` (``known`` is false for a kind
  this vibey does not know: listed and verified all the same)
* ``ledger show``: ``{"project", "last_seq", "events": [ledger event...], "total",
  "total_capped", "next_cursor"}`` (``--all --json``: one ledger event a line, NDJSON)
* ``ledger verify``: ``{"project", "ok", "count", "last_seq", "first_bad_seq", "problem",
  "range_digest", "unrecognised"}``
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Annotated, Any

from cyclopts import App, Parameter

from vibey import render
from vibey.command_groups import help_of
from vibey.paging import FIRST_PAGE, Listing, Paging, ndjson
from vibey.render import CommandError, ExitCode

if TYPE_CHECKING:
    from workflows.ledger import LedgerEvent, LedgerVerification

ledger_app = App(name="ledger", help=help_of("ledger"))

Json = Annotated[bool, Parameter(name="--json", negative=())]
PAYLOAD_CHARS = 80


def _project(project: str) -> str:
    from vibey.settings import check_project_ids

    return check_project_ids([project], "fix the project argument")[0]


def _no_ledger(project: str) -> str:
    return (
        f"no ledger events for project {project!r}: nothing was ever appended under that id "
        "(check the project id; `vibey workflow list` shows the projects)"
    )


@ledger_app.command
def show(
    project: str,
    *,
    kind: str | None = None,
    paging: Paging = FIRST_PAGE,
    json_output: Json = False,
) -> ExitCode:
    """List PROJECT's ledger events in seq order: seq, time, kind, digest, payload.

    50 a page (--order newest: the latest first); the cursor is a seq: ``--after 50``
    continues after seq 50. Exits 1 when the project has no ledger at all; an --after past
    the end lists nothing and exits 0. A kind this vibey does not know is listed (and
    marked) all the same.

    JSON: ``{"project", "last_seq", "events": [{"seq", "kind", "known", "payload",
    "digest", "causation_id", "correlation_id", "job_id", "workflow_id", "recorded_at"}],
    "total", "total_capped", "next_cursor"}``; with --all, one event object a line (NDJSON).

    Parameters
    ----------
    project
        The project id.
    kind
        Only events of this kind (QuestionAsked, StepCompleted, ...).
    json_output
        Print one JSON object.
    """
    from vibey.client import read_client
    from vibey.settings import load_settings

    listing = Listing("ledger show", "events", "oldest", paging, {"kind": kind}, by_seq=True)
    spec = listing.spec()
    settings = load_settings()
    project = _project(project)
    with read_client(settings) as client:
        last_seq = client.ledger_head(project)
        if last_seq == 0:
            raise CommandError(_no_ledger(project))
        if paging.all and json_output:
            streamed = client.iter_ledger(project, kind=kind, newest_first=listing.newest_first)
            ndjson(event_json(e) for e in streamed)
            return ExitCode.OK
        page = client.ledger_page(project, spec, kind=kind)
    if json_output:
        events = [event_json(e) for e in page.items]
        render.dump(
            {
                "project": project,
                "last_seq": last_seq,
                "events": events,
                **listing.json_tail(page),
            }
        )
        return ExitCode.OK
    after = 0 if spec.after is None else int(spec.after[0])
    print_events(project, last_seq, page.items, after=after)
    listing.print_footer(page)
    return ExitCode.OK


@ledger_app.command
def verify(project: str, *, json_output: Json = False) -> ExitCode:
    """Recompute every digest of PROJECT's ledger and check its sequence.

    Every stored digest must equal the SHA-256 recomputed from the event's kind and payload,
    seq must run 1..N with no gap or repeat, and the project's head must say N. Exits 0 and
    prints the range digest when all holds; exits 1 naming the first bad seq and what is
    wrong (an altered row, a missing seq, a head that disagrees), or when the project has no
    ledger at all.

    JSON: ``{"project", "ok", "count", "last_seq", "first_bad_seq", "problem",
    "range_digest", "unrecognised"}``, printed whatever the outcome.

    Parameters
    ----------
    project
        The project id.
    json_output
        Print one JSON object.
    """
    from vibey.client import read_client
    from vibey.settings import load_settings

    settings = load_settings()
    project = _project(project)
    with read_client(settings) as client:
        result = client.verify_ledger(project)
    empty = result.ok and result.count == 0
    problem = _no_ledger(project) if empty else result.problem
    if json_output:
        render.dump(verification_json(project, result, problem))
        return ExitCode.FAILURE if problem else ExitCode.OK
    if problem is None:
        print(verified_line(project, result))
        return ExitCode.OK
    if empty:
        raise CommandError(problem)
    raise CommandError(
        f"ledger of {project} fails verification at seq {result.first_bad_seq}: {problem}"
    )


def verified_line(project: str, result: LedgerVerification) -> str:
    n = result.count
    line = (
        f"ledger of {project}: {n} event{'' if n == 1 else 's'}, seq 1..{n}, digests match, "
        f"range digest {result.range_digest}"
    )
    if result.unrecognised:
        line += f" ({result.unrecognised} of kinds this vibey does not know, verified all the same)"
    return line


def verification_json(
    project: str, result: LedgerVerification, problem: str | None
) -> dict[str, Any]:
    return {
        "project": project,
        "ok": problem is None,
        "count": result.count,
        "last_seq": result.last_seq,
        "first_bad_seq": result.first_bad_seq,
        "problem": problem,
        "range_digest": result.range_digest,
        "unrecognised": result.unrecognised,
    }


def event_json(event: LedgerEvent) -> dict[str, Any]:
    return {
        "seq": event.seq,
        "kind": event.kind_name,
        "known": event.recognised,
        "payload": dict(event.payload),
        "digest": event.digest,
        "causation_id": event.causation_id,
        "correlation_id": event.correlation_id,
        "job_id": None if event.job_id is None else str(event.job_id),
        "workflow_id": None if event.workflow_id is None else str(event.workflow_id),
        "recorded_at": render.when(event.recorded_at),
    }


def print_events(project: str, last_seq: int, events: Sequence[LedgerEvent], *, after: int) -> None:
    if not events:
        print(f"ledger of {project}: no events after seq {after} (it ends at seq {last_seq})")
        return
    span = f"seq {events[0].seq}..{events[-1].seq}"
    print(f"ledger of {project}: {span} of {last_seq}")
    width = max(len(e.kind_name) for e in events) + (
        2 if any(not e.recognised for e in events) else 0
    )
    for event in events:
        kind = event.kind_name if event.recognised else f"{event.kind_name} ?"
        at = render.clock(event.recorded_at) if event.recorded_at else "-"
        payload = json.dumps(dict(event.payload), ensure_ascii=False, separators=(",", ":"))
        print(
            f"  #{event.seq:<5} {at}  {kind:<{width}}  {event.digest[:12]}  "
            f"{render.short(payload, PAYLOAD_CHARS)}"
        )
        ids = _ids(event)
        if ids:
            print(f"  {'':<6} {ids}")
    unknown = sum(1 for e in events if not e.recognised)
    if unknown:
        print(
            f"? {unknown} event{'' if unknown == 1 else 's'} of kinds this vibey does not know "
            "(a newer vibey wrote them): listed and verified, skipped by projections"
        )


def _ids(event: LedgerEvent) -> str:
    parts = [
        ("caused by", event.causation_id),
        ("correlation", event.correlation_id),
        ("job", None if event.job_id is None else str(event.job_id)),
        ("workflow", None if event.workflow_id is None else str(event.workflow_id)),
    ]
    shown: list[str] = []
    for label, value in parts:
        if value is not None and all(value not in s for s in shown):
            shown.append(f"{label} {value}")
    return " · ".join(shown)
