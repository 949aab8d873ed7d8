"""Every list command pages the same way, run as a user runs it: 50 a page with a footer line,
``--after`` the cursor it prints, ``--json`` with ``total`` and ``next_cursor``, ``--all --json``
as NDJSON, ``--order`` and the filters."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.acceptance.test_cli_workflow import GATE_KEYS, WORKFLOW_KEYS, Cli, tiny_env

FOOTER = re.compile(r"^(\d+) of ([\d,]+) (\w+) shown — `--limit N`, `--all`(.*)$")


@pytest.fixture
def cli(tmp_path: Path, pg_url: str) -> Cli:
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO gate (id, project_id, kind, prompt, opened_at) "
            "SELECT gen_random_uuid(), 'p' || (i % 3), "
            "CASE WHEN i % 2 = 0 THEN 'approval' ELSE 'handoff' END, 'question ' || i, "
            "now() - i * interval '1 minute' FROM generate_series(1, 120) AS i"
        )
        conn.execute(
            "INSERT INTO workflow (id, project_id, definition, version, phase, state, status, "
            "updated_at) SELECT gen_random_uuid(), 'w' || i, 'tiny', 1, 'design', "
            '\'{"stage": "new", "answers": []}\'::jsonb, \'blocked\', '
            "now() - i * interval '1 second' FROM generate_series(1, 60) AS i"
        )
    return Cli(tmp_path, tiny_env(pg_url))


def next_after(stdout: str) -> tuple[re.Match[str], str | None]:
    match = FOOTER.match(stdout.splitlines()[-1])
    assert match is not None, stdout.splitlines()[-1]
    cursor = re.search(r"`--after (\S+)` \(next page\)", match.group(4))
    return match, None if cursor is None else cursor.group(1)


def gate_rows(stdout: str) -> list[str]:
    lines = stdout.splitlines()
    assert lines[0].startswith("GATE ")
    return [line.split()[0] for line in lines[1:] if not FOOTER.match(line)]


def test_gate_list_pages_50_at_a_time_with_the_cursor_its_footer_prints(cli: Cli) -> None:
    seen: list[str] = []
    args: tuple[str, ...] = ()
    shown = []
    while True:
        out = cli.ok("gate", "list", *args).stdout
        seen += gate_rows(out)
        match, cursor = next_after(out)
        shown.append(int(match.group(1)))
        assert match.group(2) == "120" and match.group(3) == "gates"
        if cursor is None:
            assert "(this was the last page)" in match.group(4)
            break
        args = ("--after", cursor)
    assert shown == [50, 50, 20]
    assert len(set(seen)) == 120
    everything = cli.ok("gate", "list", "--all").stdout
    assert gate_rows(everything) == seen and not FOOTER.match(everything.splitlines()[-1])


def test_gate_list_json_carries_total_and_next_cursor_and_all_streams_ndjson(cli: Cli) -> None:
    first = cli.json("gate", "list", "--limit", "100", "--order", "newest")
    assert set(first) == {"gates", "total", "total_capped", "next_cursor"}
    assert (first["total"], first["total_capped"]) == (120, False)
    assert len(first["gates"]) == 100 and set(first["gates"][0]) == GATE_KEYS
    rest = cli.json("gate", "list", "--order", "newest", "--after", first["next_cursor"])
    assert len(rest["gates"]) == 20 and rest["next_cursor"] is None
    waited = [g["waited_s"] for g in first["gates"] + rest["gates"]]
    assert waited == sorted(waited)  # newest first: the shortest wait first
    lines = cli.ok("gate", "list", "--all", "--json", "--kind", "handoff").stdout.splitlines()
    streamed = [json.loads(line) for line in lines]
    assert len(streamed) == 60 and {g["kind"] for g in streamed} == {"handoff"}


def test_gate_list_filters_by_project_kind_and_age(cli: Cli) -> None:
    got = cli.json("gate", "list", "--project", "p1", "--kind", "approval", "--older-than", "1h")
    gates = got["gates"]
    assert got["total"] == len(gates) == 10 and got["next_cursor"] is None
    assert {(g["project"], g["kind"]) for g in gates} == {("p1", "approval")}
    assert min(g["waited_s"] for g in gates) >= 3600
    assert cli.json("gate", "list", "--newer-than", "10m")["total"] == 9


def test_a_cursor_of_other_filters_or_a_bad_flag_is_refused_with_exit_2(cli: Cli) -> None:
    cursor = cli.json("gate", "list", "--kind", "handoff", "--limit", "5")["next_cursor"]
    assert "another --order or other filters" in cli.refused(
        2, "gate", "list", "--kind", "approval", "--after", cursor
    )
    assert "is not a cursor" in cli.refused(2, "gate", "list", "--after", "garbage")
    assert "is not a duration" in cli.refused(2, "gate", "list", "--older-than", "soon")
    assert "--all lists every row" in cli.refused(2, "workflow", "list", "--all", "--after", "x")


def test_workflow_list_pages_the_same_way(cli: Cli) -> None:
    first = cli.json("workflow", "list", "--limit", "25")
    assert first["total"] == 60 and set(first["workflows"][0]) == WORKFLOW_KEYS
    projects = [w["project"] for w in first["workflows"]]
    assert projects == [f"w{i}" for i in range(1, 26)]  # most recently updated first
    second = cli.json("workflow", "list", "--limit", "25", "--after", first["next_cursor"])
    assert second["workflows"][0]["project"] == "w26"
    stale = cli.ok("workflow", "list", "--order", "oldest", "--limit", "3").stdout.splitlines()
    assert stale[1].startswith("w60 ") and FOOTER.match(stale[-1])
    lines = cli.ok("workflow", "list", "--all", "--json").stdout.splitlines()
    assert len(lines) == 60 and all(json.loads(line)["status"] == "blocked" for line in lines)


def test_history_and_ledger_page_by_seq(cli: Cli) -> None:
    cli.ok("workflow", "start", "demo")
    history = cli.json("workflow", "history", "demo", "--limit", "1")
    assert history["total"] == 1 and history["next_cursor"] is None
    assert cli.json("workflow", "history", "demo", "--kind", "gate_answered")["events"] == []
    with psycopg.connect(cli.env["VIBEY_PG_URL"], autocommit=True) as conn:
        conn.execute(
            "INSERT INTO ledger_head (project_id, last_seq) VALUES ('led', 70);"
            "INSERT INTO ledger_event (project_id, seq, kind, payload, digest) "
            "SELECT 'led', i, CASE WHEN i % 7 = 0 THEN 'AnswerGiven' ELSE 'QuestionAsked' END, "
            "'{}'::jsonb, repeat('0', 64) FROM generate_series(1, 70) AS i"
        )
    page: Any = cli.json("ledger", "show", "led")
    assert [e["seq"] for e in page["events"]] == list(range(1, 51))
    assert (page["total"], page["next_cursor"]) == (70, "50")
    tail = cli.ok("ledger", "show", "led", "--after", "50").stdout.splitlines()
    assert tail[0] == "ledger of led: seq 51..70 of 70"
    latest = cli.json("ledger", "show", "led", "--order", "newest", "--limit", "3")
    assert [e["seq"] for e in latest["events"]] == [70, 69, 68]
    answers = cli.ok("ledger", "show", "led", "--all", "--json", "--kind", "AnswerGiven")
    assert [json.loads(line)["seq"] for line in answers.stdout.splitlines()] == list(
        range(7, 71, 7)
    )


def test_a_read_command_loads_neither_dramatiq_pika_nor_rich(cli: Cli) -> None:
    # The settings' declarations (actors.config, actors.declare) read the engine roster with
    # its pure parser (actors.agents.roster, the adapters' catalog and the confinement settings
    # it holds) and the webhook tables (actors.webhook_spec): the standard library and
    # pydantic alone. No other part of actors may load.
    light = (
        "('actors', 'actors.agents', 'actors.agents.roster', 'actors.agents.confine', "
        "'actors.agents.catalog', 'actors.config', 'actors.declare', 'actors.webhook_spec')"
    )
    probe = (
        "import sys; from vibey.cli import main; code = main(['gate', 'list', '--limit', '1']); "
        "print(code, sorted(m for m in sys.modules if m.split('.')[0] in "
        f"('dramatiq', 'pika', 'rich', 'actors') and m not in {light}))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], env=cli.env, capture_output=True, text=True, check=True
    )
    assert done.stdout.splitlines()[-1] == "0 []", done.stdout
