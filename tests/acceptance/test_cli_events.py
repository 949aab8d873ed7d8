"""``vibey events tail`` and ``vibey tenant``, driven as a user does, against PostgreSQL."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.acceptance.test_cli_workflow import Cli, tiny_env


@pytest.fixture
def cli(tmp_path: Path, pg_url: str) -> Cli:
    return Cli(tmp_path, tiny_env(pg_url))


def test_events_tail_filters_by_project_type_and_tenant(cli: Cli) -> None:
    cli.ok("tenant", "set", "acme-demo", "acme")
    assert cli.ok("tenant", "show", "acme-demo").stdout == "acme\n"
    assert cli.ok("tenant", "show", "demo").stdout == "default\n"
    cli.ok("workflow", "start", "demo")
    cli.ok("workflow", "start", "acme-demo")
    lines = cli.ok("events", "tail", "--json", "--project", "demo").stdout.splitlines()
    events = [json.loads(line) for line in lines]
    types = [e["event_type"] for e in events]
    assert types[:2] == ["workflow.started", "phase.transitioned"]
    assert {e["project_id"] for e in events} == {"demo"}
    assert all(e["version"] == 1 and e["tenant_id"] == "default" for e in events)
    acme = cli.ok("events", "tail", "--json", "--tenant", "acme").stdout.splitlines()
    assert acme and {json.loads(line)["project_id"] for line in acme} == {"acme-demo"}
    started = cli.ok("events", "tail", "--type", "workflow", "--limit", "5").stdout.splitlines()
    assert len(started) == 2 and all("workflow.started" in line for line in started)
    line = cli.refused(2, "tenant", "set", "demo", "Not A Tenant")
    assert "not a tenant name" in line


def test_a_gate_answered_by_name_before_it_opens_is_refused_and_once_after(cli: Cli) -> None:
    workflow = cli.json("workflow", "start", "demo")["workflow"]["id"]
    line = cli.refused(1, "gate", "answer", f"{workflow}:later", "yes")
    assert "is not open yet" in line and "nothing was recorded" in line
    answered = cli.json("gate", "answer", f"{workflow}:approve", "yes")
    assert answered["gate"]["answer"] == "yes" and answered["gate"]["answer_source"] == "person"
    again = cli.refused(1, "gate", "answer", f"{workflow}:approve", "yes")
    assert "already answered" in again
    shown = cli.json("gate", "show", answered["gate"]["id"])
    assert shown["answered_by"] and shown["deadline_at"] is None
