"""The command groups of ``vibey``, named once: where each lives and its one-line help.

The CLI registers them lazily (cyclopts imports a group's module only when one of its
commands runs, or its own ``--help`` is asked for), so ``vibey --help`` lists them all without
importing any; each group's ``App`` takes its help from here.
"""

from __future__ import annotations

GROUPS: dict[str, tuple[str, str]] = {
    "workflow": (
        "vibey.cli_workflow:workflow_app",
        "Start, inspect, cost, cancel and verify a project's workflow.",
    ),
    "gate": ("vibey.cli_gate:gate_app", "List, show and answer what waits on a person."),
    "ledger": ("vibey.cli_ledger:ledger_app", "Show and verify a project's append-only ledger."),
    "engine": ("vibey.cli_engine:engine_app", "The configured engines: roster, health, rotation."),
    "reconcile": (
        "vibey.cli_ops:reconcile",
        "Run the reconciler alone until SIGTERM or SIGINT (or one pass with --once).",
    ),
    "queue": ("vibey.cli_ops:queue_app", "The dispatch queues: depths, lag and dead letters."),
    "console": (
        "vibey.cli_console:console_app",
        "The web console: workflows, gates, health, live.",
    ),
    "events": (
        "vibey.cli_events:events_app",
        "The domain events: what happened, as consumers see it.",
    ),
    "tenant": (
        "vibey.cli_events:tenant_app",
        "Which tenant a project belongs to (default: default).",
    ),
    "notify": (
        "vibey.cli_events:notify",
        "Run the webhooks of [notify.webhooks.<name>] until SIGTERM or SIGINT.",
    ),
    "project": (
        "vibey.cli_project:project_app",
        "Project routes: which projects have dedicated queues.",
    ),
    "loop-service": (
        "vibey.cli_loop:loop_service",
        "Serve one engine's runs from RabbitMQ until SIGTERM or SIGINT, then drain.",
    ),
}


def help_of(name: str) -> str:
    """A group's one-line help."""
    return GROUPS[name][1]
