"""``vibey engine ...``: the configured roster and its health; and the conformance check
``vibey doctor --conformance --engine X [--record]`` runs (:func:`run_conformance`).

``engine list`` shows each ``[engines.<id>]`` engine with its adapter, weight, whether its
binary is found, its last recorded doctor pass, and its circuit and capacity state (with the
reset time of a rate-limit window) from ``engine_health``. ``engine rotate <project>`` asks
that the project's next engine-driven attempt rotate away from the engine it last ran on (the
operator-request boundary).
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any

from cyclopts import App, Parameter

from vibey import render
from vibey.command_groups import help_of
from vibey.render import CommandError, ExitCode
from vibey.settings import Settings, SettingsError, load_settings

engine_app = App(name="engine", help=help_of("engine"))

Json = Annotated[bool, Parameter(name="--json", negative=())]


@engine_app.command(name="list")
def list_(*, json_output: Json = False) -> ExitCode:
    """The roster: adapter, weight, installed, last doctor pass, circuit and capacity, and
    the confinement its runs get (bwrap, landlock, or none and why) with the hosts they may
    reach.

    An engine with invocation = "service" also shows its loop service: the run queue's
    consumers and queued requests, and a probe sent now (2 s to answer) - when, its outcome
    and how long it took - with the answering instance's runs in flight (run id, worktree,
    since when) and the probe it answered before this one. With several instances, one of
    them answers; no answer leaves the runs in flight unknown.

    JSON: ``{"engines": [{"id", "adapter", "binary", "weight", "local", "phases",
    "installed", "last_doctor_at", "authenticated_at", "circuit", "capacity", "resets_at",
    "invocation", "confinement", "network_allow", "service"}, ...]}`` (``service``: null, or
    ``{"consumers", "queued", "probe", "probe_at", "probe_seconds", "instance", "in_flight":
    null | [{"run_id", "cwd", "started_at"}], "previous_probe": null | {"at", "outcome"}}``).

    Parameters
    ----------
    json_output
        Print one JSON object.
    """
    settings = load_settings()
    rows = roster_rows(settings)
    if json_output:
        render.dump({"engines": rows})
        return ExitCode.OK
    if not rows:
        print("no engines configured: add [engines.<id>] tables to vibey.toml (docs/engines.md)")
        return ExitCode.OK
    for row in rows:
        doctor = row["authenticated_at"] or "never passed"
        reset = f" until {row['resets_at']}" if row["resets_at"] else ""
        print(
            f"{row['id']:<16} {row['adapter']:<12} weight {row['weight']:<3} "
            f"{'installed' if row['installed'] else 'NOT INSTALLED':<13} doctor {doctor}  "
            f"circuit {row['circuit']}  {row['capacity']}{reset}"
        )
        print(f"{' ' * 17}confinement: {_confined_line(row)}")
        if row["service"] is not None:
            _print_service(row["service"])
    return ExitCode.OK


@engine_app.command
def rotate(
    project: str,
    *,
    by: Annotated[str | None, Parameter(name="--by")] = None,
    json_output: Json = False,
) -> ExitCode:
    """Rotate the project's engine at its next boundary (an operator request, seed 004).

    The project's next engine-driven attempt picks its engine at the operator-request
    boundary, away from the engine the project last ran on (that one still when no other is
    eligible). Nothing running is interrupted: rotation never happens mid-turn. Asking again
    before that attempt replaces the request.

    JSON: ``{"project", "away_from", "requested_by", "requested_at"}``.

    Parameters
    ----------
    project
        The project whose engine rotates.
    by
        Who asks (default: the current user).
    json_output
        Print one JSON object.
    """
    from vibey.cli_workflow import whoami
    from vibey.client import read_client

    with read_client(load_settings()) as client:
        request = client.rotate_engine(project, by=by or whoami())
    row = {
        "project": request.project_id,
        "away_from": request.away_from,
        "requested_by": request.requested_by,
        "requested_at": render.when(request.requested_at),
    }
    if json_output:
        render.dump(row)
        return ExitCode.OK
    away = f"away from {request.away_from}" if request.away_from else "(no engine has run yet)"
    print(
        f"{project}: its next engine-driven attempt rotates {away}; "
        f"requested by {request.requested_by}"
    )
    return ExitCode.OK


def roster_rows(settings: Settings) -> list[dict[str, Any]]:
    from actors.agents.roster import installed

    healths = _healths(settings)
    rows = []
    for spec in settings.engines:
        health = healths.get(spec.id)
        capacity = health.circuit.capacity if health is not None else None
        rows.append(
            {
                "id": spec.id,
                "adapter": spec.adapter,
                "binary": spec.binary,
                "weight": spec.weight,
                "local": spec.local,
                "phases": sorted(spec.phases),
                "installed": installed(spec, settings.agent_env),
                "last_doctor_at": render.when(health.last_doctor_at) if health else None,
                "authenticated_at": render.when(health.authenticated_at) if health else None,
                "circuit": health.circuit.status.value if health else "unknown",
                "capacity": capacity.kind.value if capacity is not None else "unknown",
                "resets_at": render.when(getattr(capacity, "resets_at", None)),
                "invocation": spec.invocation,
                "confinement": spec.confined(None).mechanism.describe(),
                "network_allow": list(spec.network),
                "service": _service_row(settings, spec) if spec.as_service else None,
            }
        )
    return rows


PROBE_WAIT_S = 2.0


def _confined_line(row: dict[str, Any]) -> str:
    if row["confinement"].startswith("none"):
        return f"NONE{row['confinement'][4:]}: its runs read, write and reach all the worker can"
    return f"{row['confinement']}; network: {', '.join(row['network_allow']) or 'nothing'}"


def _service_row(settings: Settings, spec: Any) -> dict[str, Any]:
    """The loop service of ``spec``: its run queue's consumers and queued requests, and a
    probe sent now: its time, outcome and seconds, and the answering instance's status (its
    runs in flight, the probe it answered before this one). No answer: ``in_flight`` None."""
    import time

    from actors.agents.adapters import CLI_ADAPTERS
    from actors.agents.run_client import EngineQueueSaturated, RunClient
    from actors.runs_topology import RunsTopology

    row: dict[str, Any] = {
        "consumers": None, "queued": None, "probe": "no broker", "probe_at": None,
        "probe_seconds": None, "instance": None, "in_flight": None, "previous_probe": None,
    }  # fmt: skip
    if settings.bus.amqp_url is None:
        return row
    client = RunClient(settings.bus.amqp_url, RunsTopology(settings.bus.prefix, (spec.id,)))
    status = client.queue_status(spec.id)
    if status is None:
        return {**row, "probe": "no run queue: start `vibey loop-service`"}
    row["consumers"], row["queued"] = status
    version = CLI_ADAPTERS[spec.adapter](spec, worker_env={}, transcripts=Path()).version_argv()
    statuses: list[Any] = []
    row["probe_at"] = render.when(datetime.now(UTC))
    began = time.monotonic()
    try:
        result = client.probe(
            spec, Path(settings.engine.workspace), version, PROBE_WAIT_S, statuses.append
        )
    except EngineQueueSaturated:
        return {**row, "probe": f"no answer within {PROBE_WAIT_S:g} s"}
    answer = result.detail.strip().splitlines()[:1] or [result.status.value]
    row["probe"] = f"{result.status.value}: {answer[0][:80]}"
    row["probe_seconds"] = round(time.monotonic() - began, 3)
    if statuses:
        row.update(_status_fields(statuses[-1]))
    return row


def _status_fields(status: Any) -> dict[str, Any]:
    runs = [
        {"run_id": str(r.run_id), "cwd": r.cwd, "started_at": render.when(r.started_at)}
        for r in status.in_flight
    ]
    previous = None
    if status.last_probe_at is not None:
        previous = {"at": render.when(status.last_probe_at), "outcome": status.last_probe}
    return {"instance": status.service_instance, "in_flight": runs, "previous_probe": previous}


def _print_service(service: dict[str, Any]) -> None:
    pad = " " * 17
    consumers = "?" if service["consumers"] is None else service["consumers"]
    queued = "?" if service["queued"] is None else service["queued"]
    runs = service["in_flight"]
    if runs is None:
        flight = "in flight unknown (no answer)"
    else:
        flight = f"{len(runs)} in flight" + (
            f" at {service['instance']}" if service["instance"] else ""
        )
    print(f"{pad}loop service: {consumers} consumer(s), {queued} queued, {flight}")
    for run in runs or []:
        since = f" since {run['started_at']}" if run["started_at"] else " (starting)"
        print(f"{pad}  run {run['run_id']} in {run['cwd']}{since}")
    took = f" in {service['probe_seconds']} s" if service["probe_seconds"] is not None else ""
    at = f" at {service['probe_at']}" if service["probe_at"] else ""
    print(f"{pad}last probe{at}: {service['probe']}{took}")
    if service["previous_probe"]:
        previous = service["previous_probe"]
        print(f"{pad}probe before it: {previous['at']}: {previous['outcome']}")


def _run_client(settings: Settings, specs: Any) -> Any:
    """The loop services' client when an engine checked runs in one (and a broker is set)."""
    engines = tuple(spec.id for spec in specs if spec.as_service)
    if not engines or settings.bus.amqp_url is None:
        return None
    from actors.agents.run_client import RunClient
    from actors.runs_topology import RunsTopology

    return RunClient(settings.bus.amqp_url, RunsTopology(settings.bus.prefix, engines))


def _healths(settings: Settings) -> dict[str, Any]:
    if settings.database.url is None:
        return {}
    from vibey.client import read_client

    with read_client(settings) as client:
        return {h.engine_id: h for h in client.engine_health()}


def run_conformance(engine: str | None, *, record: bool, json_output: bool) -> ExitCode:
    """``vibey doctor --conformance``: the adapter's checks against the binary of ``engine``
    (every configured engine when None); with ``record``, each result is written to
    engine_health (only a recorded pass within its TTL makes an engine eligible)."""
    settings = load_settings()
    try:
        specs = settings.roster([engine] if engine else [])
    except SettingsError as exc:
        raise CommandError(f"{exc}: fix --engine", ExitCode.USAGE) from exc
    if not specs:
        raise CommandError("no engines configured: add [engines.<id>] tables to vibey.toml")
    from actors.agents.conformance import check
    from actors.agents.conformance import record as save

    runs, root = _run_client(settings, specs), Path(settings.engine.workspace).resolve()
    results = [check(spec, worker_env=settings.agent_env, runs=runs, root=root) for spec in specs]
    if record:
        from store.pool import open_pool

        pool = open_pool(settings.require_database_url(), min_size=1, max_size=1, name="vibey-cli")
        try:
            for spec, result in zip(specs, results, strict=True):
                save(pool, spec, result, datetime.now(UTC), settings.agent_env)
        finally:
            pool.close()
    _print_conformance(results, record=record, json_output=json_output)
    return ExitCode.OK if all(r.passed for r in results) else ExitCode.FAILURE


def _print_conformance(results: list[Any], *, record: bool, json_output: bool) -> None:
    if json_output:
        render.dump(
            {
                "recorded": record,
                "engines": [
                    {
                        "id": r.engine_id,
                        "passed": r.passed,
                        "checks": [
                            {"name": c.name, "passed": c.passed, "detail": c.detail}
                            for c in r.checks
                        ],
                    }
                    for r in results
                ],
            }
        )
        return
    for result in results:
        verdict = "passed" if result.passed else "FAILED"
        print(f"{result.engine_id}: conformance {verdict}{' (recorded)' if record else ''}")
        for c in result.checks:
            print(f"  {'ok ' if c.passed else 'NO '} {c.name}: {c.detail}")
