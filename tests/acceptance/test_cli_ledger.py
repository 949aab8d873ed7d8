"""``vibey ledger show|verify`` as a user runs them: subprocesses against the test's database.

The events are appended through the store (as the step handlers do); the tampering is a
superuser's, with the append-only trigger disabled for the moment of the change."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import psycopg
import pytest
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool

from store.ledger import Ledger
from tests.acceptance.test_cli import clean_env, free_port, vibey
from tests.acceptance.test_cli_workflow import Cli
from workflows.ledger import EventKind, NewEvent, digest, digest_range

EVENT_KEYS = {
    "seq",
    "kind",
    "known",
    "payload",
    "digest",
    "causation_id",
    "correlation_id",
    "job_id",
    "workflow_id",
    "recorded_at",
}
VERIFY_KEYS = {
    "project",
    "ok",
    "count",
    "last_seq",
    "first_bad_seq",
    "problem",
    "range_digest",
    "unrecognised",
}
JOB, WORKFLOW = uuid.uuid4(), uuid.uuid4()


@pytest.fixture
def cli(tmp_path: Path, pg_url: str) -> Cli:
    return Cli(tmp_path, clean_env(VIBEY_PG_URL=pg_url))


@pytest.fixture
def ledger(pool: ConnectionPool) -> Ledger:
    ledger = Ledger(pool)
    ledger.append(
        "demo",
        [
            NewEvent(EventKind.QuestionAsked, {"id": "q1", "text": "Who is the app for?"}),
            NewEvent(EventKind.DecisionRecorded, {"id": "d1", "text": "a web app, déjà vu"}),
        ],
        causation_id=str(JOB),
        correlation_id=str(WORKFLOW),
        job_id=JOB,
        workflow_id=WORKFLOW,
    )
    ledger.append("demo", [NewEvent(EventKind.AnswerGiven, {"closes": "q1", "text": "devs"})])
    ledger.append(
        "demo", [NewEvent(EventKind.PhaseTransitioned, {"from": "design", "to": "build"})]
    )
    return ledger


def tamper(url: str, statement: str) -> None:
    with psycopg.connect(url) as conn:
        conn.execute("ALTER TABLE ledger_event DISABLE TRIGGER ledger_event_append_only")
        conn.execute(statement)
        conn.execute("ALTER TABLE ledger_event ENABLE TRIGGER ledger_event_append_only")


# --- show -----------------------------------------------------------------------------------


def test_show_lists_the_events_in_seq_order(cli: Cli, ledger: Ledger) -> None:
    out = cli.ok("ledger", "show", "demo").stdout.splitlines()
    assert out[0] == "ledger of demo: seq 1..4 of 4"
    rows = [line for line in out if line.startswith("  #")]
    assert [re.split(r"\s+", r.strip())[0] for r in rows] == ["#1", "#2", "#3", "#4"]
    assert "QuestionAsked" in rows[0] and '"text":"Who is the app for?"' in rows[0]
    assert "déjà vu" in rows[1]
    assert f"caused by {JOB}" in out[2] and f"correlation {WORKFLOW}" in out[2]
    stored = ledger.read("demo")
    assert stored[2].digest[:12] in rows[2]


def test_show_json_pages_with_after_and_limit(cli: Cli, ledger: Ledger) -> None:
    shown = cli.json("ledger", "show", "demo", "--after", "1", "--limit", "2")
    assert shown["project"] == "demo" and shown["last_seq"] == 4
    assert [e["seq"] for e in shown["events"]] == [2, 3]
    first = shown["events"][0]
    assert set(first) == EVENT_KEYS
    assert first["kind"] == "DecisionRecorded" and first["known"] is True
    assert first["payload"] == {"id": "d1", "text": "a web app, déjà vu"}
    assert first["digest"] == digest("DecisionRecorded", first["payload"])
    assert first["job_id"] == str(JOB) and first["workflow_id"] == str(WORKFLOW)
    assert shown["events"][1]["causation_id"] is None
    past = cli.json("ledger", "show", "demo", "--after", "4")
    assert past["events"] == [] and past["last_seq"] == 4
    assert (
        "no events after seq 4 (it ends at seq 4)"
        in cli.ok("ledger", "show", "demo", "--after", "4").stdout
    )


def test_show_of_a_project_without_a_ledger_exits_1(cli: Cli, ledger: Ledger) -> None:
    line = cli.refused(1, "ledger", "show", "demo2")
    assert "no ledger events for project 'demo2'" in line


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("--after", "-1"), "--after must be 0 or more"),
        (("--limit", "0"), "--limit must be at least 1"),
    ],
)
def test_show_refuses_a_bad_range_with_exit_2(cli: Cli, args: tuple[str, ...], words: str) -> None:
    assert words in cli.refused(2, "ledger", "show", "demo", *args)


def test_a_bad_project_id_exits_2(cli: Cli) -> None:
    assert "fix the project argument" in cli.refused(2, "ledger", "verify", "two words")


def test_show_marks_a_kind_this_vibey_does_not_know(cli: Cli, ledger: Ledger, pg_url: str) -> None:
    payload = {"note": "from a newer vibey"}
    with psycopg.connect(pg_url) as conn:
        conn.execute("UPDATE ledger_head SET last_seq = 5 WHERE project_id = 'demo'")
        conn.execute(
            "INSERT INTO ledger_event (project_id, seq, kind, payload, digest) "
            "VALUES ('demo', 5, 'HandoffRevoked', %s, %s)",
            (Jsonb(payload), digest("HandoffRevoked", payload)),
        )
    out = cli.ok("ledger", "show", "demo").stdout
    assert "HandoffRevoked ?" in out
    assert "1 event of kinds this vibey does not know" in out
    event = cli.json("ledger", "show", "demo", "--after", "4")["events"][0]
    assert (event["kind"], event["known"]) == ("HandoffRevoked", False)
    verified = cli.ok("ledger", "verify", "demo").stdout
    assert "5 events, seq 1..5, digests match" in verified
    assert "(1 of kinds this vibey does not know, verified all the same)" in verified


# --- verify ---------------------------------------------------------------------------------


def test_verify_passes_and_prints_the_range_digest(cli: Cli, ledger: Ledger) -> None:
    expected = digest_range(ledger.read("demo"))
    run = cli.ok("ledger", "verify", "demo")
    assert run.stdout.strip() == (
        f"ledger of demo: 4 events, seq 1..4, digests match, range digest {expected}"
    )
    result = cli.json("ledger", "verify", "demo")
    assert set(result) == VERIFY_KEYS
    assert result == {
        "project": "demo",
        "ok": True,
        "count": 4,
        "last_seq": 4,
        "first_bad_seq": None,
        "problem": None,
        "range_digest": expected,
        "unrecognised": 0,
    }


def test_a_row_a_superuser_altered_fails_verify_naming_its_seq(
    cli: Cli, ledger: Ledger, pg_url: str
) -> None:
    tamper(
        pg_url,
        "UPDATE ledger_event SET payload = jsonb_set(payload, '{text}', '\"nobody\"') "
        "WHERE project_id = 'demo' AND seq = 3",
    )
    line = cli.refused(1, "ledger", "verify", "demo")
    assert line.startswith("vibey: ledger of demo fails verification at seq 3: ")
    assert "AnswerGiven event does not match its digest" in line
    run = cli("ledger", "verify", "demo", "--json")
    assert run.code == 1 and run.stderr == ""
    result = json.loads(run.stdout)
    assert (result["ok"], result["first_bad_seq"], result["count"]) == (False, 3, 4)
    assert "the row was altered" in result["problem"]


def test_a_row_a_superuser_removed_fails_verify_naming_the_gap(
    cli: Cli, ledger: Ledger, pg_url: str
) -> None:
    tamper(pg_url, "DELETE FROM ledger_event WHERE project_id = 'demo' AND seq = 2")
    line = cli.refused(1, "ledger", "verify", "demo")
    assert "at seq 2: seq 2 missing: the next stored event is seq 3" in line


def test_a_removed_tail_fails_verify_against_the_head(
    cli: Cli, ledger: Ledger, pg_url: str
) -> None:
    tamper(pg_url, "DELETE FROM ledger_event WHERE project_id = 'demo' AND seq = 4")
    line = cli.refused(1, "ledger", "verify", "demo")
    assert "at seq 4: ledger_head.last_seq is 4 but only 3 events are stored" in line


def test_verify_of_a_project_without_a_ledger_exits_1(cli: Cli, ledger: Ledger) -> None:
    assert "no ledger events for project 'nobody'" in cli.refused(1, "ledger", "verify", "nobody")
    run = cli("ledger", "verify", "nobody", "--json")
    assert run.code == 1
    result = json.loads(run.stdout)
    assert (result["ok"], result["count"], result["first_bad_seq"]) == (False, 0, None)


def test_verify_without_postgresql_exits_3(tmp_path: Path) -> None:
    url = f"postgresql://vibey:secret@127.0.0.1:{free_port()}/vibey"
    run = vibey("ledger", "verify", "demo", cwd=tmp_path, env=clean_env(VIBEY_PG_URL=url))
    assert run.code == 3, run.stderr
    assert len(run.stderr_lines) == 1 and "did not answer" in run.stderr
