"""``vibey workflow ...`` and ``vibey gate ...`` as a user runs them: subprocesses, no worker.

Most tests run the tiny definition (``tests/acceptance/tiny_definition.py``: one step and two
gates at the start) so that gates exist without a worker; a few run the real protocol. Without
``VIBEY_AMQP_URL`` the CLI leaves the dispatch of what it commits to the workers' reconcilers;
the RabbitMQ tests at the end check that it publishes right after the commit when it can.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from actors.capabilities import detect
from actors.config import BusSettings, DatabaseSettings
from actors.worker import WorkerConfig
from store.jobs import PostgresJobRepository
from tests.acceptance.test_cli import Run, clean_env, free_port, vibey
from tests.amqp_fixtures import Amqp
from workflows.dispatch import Lane
from workflows.queue import EnqueueRequest, GateRequest

TINY = "tests.acceptance.tiny_definition:DEFINITIONS"
DRIFTED = "tests.acceptance.tiny_definition:DRIFTED"

WORKFLOW_KEYS = {
    "id",
    "project",
    "definition",
    "version",
    "phase",
    "cycle",
    "status",
    "completion_mode",
    "reason",
    "describe",
    "last_seq",
    "created_at",
    "updated_at",
    "finished_at",
}
GATE_KEYS = {
    "id",
    "project",
    "workflow_id",
    "name",
    "kind",
    "question",
    "answers",
    "schema",
    "context",
    "evidence",
    "opened_at",
    "waited_s",
    "answer",
    "answered_by",
    "answered_at",
    "job_id",
    "deadline_at",
    "on_deadline",
    "default_answer",
    "answer_source",
}
STEP_KEYS = {"step", "kind", "item", "state", "attempts", "max_attempts"}


def tiny_env(pg_url: str, **extra: str) -> dict[str, str]:
    return clean_env(
        VIBEY_PG_URL=pg_url,
        VIBEY_WORKFLOW_DEFINITIONS=TINY,
        VIBEY_WORKFLOW_DEFAULT_DEFINITION="tiny",
        **extra,
    )


class Cli:
    """``vibey`` in one working directory with one environment: each command a process forked
    from one that imported the CLI (tests/cli_fork.py), or, ``forked=False``, a fresh
    interpreter as a user's shell starts it."""

    def __init__(self, cwd: Path, env: dict[str, str], *, forked: bool = True) -> None:
        self.cwd, self.env, self.forked = cwd, env, forked

    def __call__(self, *args: str, **env: str) -> Run:
        return vibey(*args, cwd=self.cwd, env={**self.env, **env}, forked=self.forked)

    def ok(self, *args: str, **env: str) -> Run:
        run = self(*args, **env)
        assert run.code == 0, run.stderr
        assert run.stderr == "", run.stderr
        return run

    def json(self, *args: str, **env: str) -> Any:
        return json.loads(self.ok(*args, "--json", **env).stdout)

    def refused(self, code: int, *args: str, **env: str) -> str:
        """The one stderr line of a run that must exit ``code`` and print nothing else."""
        run = self(*args, **env)
        assert run.code == code, (run.code, run.stdout, run.stderr)
        assert len(run.stderr_lines) == 1, run.stderr
        assert run.stdout == ""
        line = run.stderr_lines[0]
        assert line.startswith("vibey: "), line
        return line

    def gate_named(self, name: str, project: str | None = None) -> dict[str, Any]:
        args = ("gate", "list") + (("--project", project) if project else ())
        gates = [g for g in self.json(*args)["gates"] if g["name"] == name]
        assert len(gates) == 1, gates
        return dict(gates[0])


@pytest.fixture
def cli(tmp_path: Path, pg_url: str) -> Cli:
    return Cli(tmp_path, tiny_env(pg_url))


@pytest.fixture
def exec_cli(tmp_path: Path, pg_url: str) -> Cli:
    """Commands as fresh interpreters: the workflow and gate families each keep tests so."""
    return Cli(tmp_path, tiny_env(pg_url), forked=False)


# --- workflow start ------------------------------------------------------------------------


def test_start_prints_the_workflow_and_a_second_start_changes_nothing(exec_cli: Cli) -> None:
    first = exec_cli.ok("workflow", "start", "demo")
    assert first.stdout.startswith("started; 1 step committed; the workers' reconcilers")
    assert "INTAKE → *DESIGN* → [VISUAL_DESIGN]" in first.stdout
    assert "tiny: answers so far []" in first.stdout

    again = exec_cli.ok("workflow", "start", "demo")
    assert again.stdout.startswith("already live since ")
    assert "nothing changed" in again.stdout.splitlines()[0]

    created = exec_cli.json("workflow", "start", "demo")
    assert created["created"] is False
    assert set(created) == {"workflow", "created"}
    listed = exec_cli.json("workflow", "list")["workflows"]
    assert [w["id"] for w in listed] == [created["workflow"]["id"]]


def test_start_json_has_the_documented_shape(cli: Cli) -> None:
    out = cli.json("workflow", "start", "demo")
    assert out["created"] is True
    workflow = out["workflow"]
    assert set(workflow) == WORKFLOW_KEYS
    assert workflow["project"] == "demo"
    assert (workflow["definition"], workflow["version"]) == ("tiny", 1)
    assert (workflow["phase"], workflow["cycle"], workflow["status"]) == ("design", 0, "running")
    assert workflow["last_seq"] == 1
    assert workflow["finished_at"] is None
    uuid.UUID(workflow["id"])
    again = cli.json("workflow", "start", "demo")
    assert (again["created"], again["workflow"]["id"]) == (False, workflow["id"])


def test_start_stores_the_engine_in_the_workflow_input(cli: Cli, tmp_path: Path) -> None:
    cli.ok("workflow", "start", "plain")
    started = cli.json("workflow", "history", "plain")["events"][0]["event"]
    assert started["input"] == {"project": "plain", "engine": {"name": "scripted", "script": {}}}

    toml = tmp_path / "script.toml"
    toml.write_text('[build]\nwork_items = [{ id = "api", title = "HTTP API" }]\n')
    cli.ok("workflow", "start", "scripted", "--script", str(toml))
    started = cli.json("workflow", "history", "scripted")["events"][0]["event"]
    script = {"build": {"work_items": [{"id": "api", "title": "HTTP API"}]}}
    assert started["input"]["engine"] == {"name": "scripted", "script": script}

    as_json = tmp_path / "script.json"
    as_json.write_text(json.dumps({"review": {"findings": [[]]}}))
    cli.ok("workflow", "start", "json", "--script", str(as_json))
    engine = cli.json("workflow", "history", "json")["events"][0]["event"]["input"]["engine"]
    assert engine["script"] == {"review": {"findings": [[]]}}

    command = cli.ok(
        "workflow", "start", "cmd", VIBEY_ENGINE_NAME="command", VIBEY_ENGINE_COMMAND="agent --go"
    )
    assert command.code == 0
    engine = cli.json("workflow", "history", "cmd")["events"][0]["event"]["input"]["engine"]
    assert engine == {"name": "command"}


@pytest.mark.parametrize(
    ("name", "body", "problem"),
    [
        ("broken.toml", "[build\nwork_items = 1\n", "not valid TOML"),
        ("broken.json", '{"build": ', "not valid JSON"),
        ("list.json", "[1, 2]", "must hold an object at the top, got list"),
        ("items.toml", "[build]\nwork_items = 1\n", "build.work_items must be a list, got int"),
        ("binary.toml", b"\xff\xfe\x00".decode("latin-1"), "not UTF-8 text (invalid start byte)"),
    ],
)
def test_a_bad_script_file_exits_2_naming_the_file(
    cli: Cli, tmp_path: Path, name: str, body: str, problem: str
) -> None:
    path = tmp_path / name
    path.write_text(body, encoding="latin-1")
    line = cli.refused(2, "workflow", "start", "demo", "--script", str(path))
    assert f"script {path}: {problem}" in line
    assert cli.json("workflow", "list")["workflows"] == []


def test_a_missing_script_file_exits_2(cli: Cli, tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.toml"
    line = cli.refused(2, "workflow", "start", "demo", "--script", str(missing))
    assert line == f"vibey: script {missing}: cannot be read (No such file or directory)"


def test_start_refuses_a_bad_project_id_and_an_unknown_definition(cli: Cli) -> None:
    line = cli.refused(2, "workflow", "start", "a.b")
    assert "project id 'a.b' cannot be a word of a routing key" in line
    assert line.endswith("fix the project argument")
    line = cli.refused(2, "workflow", "start", "demo", "--definition", "nope")
    assert "workflow definition nope is not registered here; known: tiny v1" in line
    assert cli.json("workflow", "list")["workflows"] == []


# --- status, list, history -----------------------------------------------------------------


def test_status_shows_the_phase_the_gates_and_the_steps(cli: Cli) -> None:
    cli.ok("workflow", "start", "demo")
    out = cli.json("workflow", "status", "demo")
    assert set(out) == {"workflow", "gates", "steps", "waiting_for_worker"}
    assert out["waiting_for_worker"] == []  # no AMQP URL: not asked
    assert set(out["workflow"]) == WORKFLOW_KEYS
    assert [set(g) for g in out["gates"]] == [GATE_KEYS, GATE_KEYS]
    assert sorted(g["name"] for g in out["gates"]) == ["approve", "rating"]
    assert out["steps"] == [
        {
            "step": "first",
            "kind": "design.interview",
            "item": "s1",
            "state": "ready",
            "attempts": 0,
            "max_attempts": 5,
        }
    ]
    approve = next(g for g in out["gates"] if g["name"] == "approve")
    assert approve["answers"] == ["yes", "no"]
    assert approve["context"] == {"why": "a test"}
    assert approve["workflow_id"] == out["workflow"]["id"]
    assert approve["job_id"] is None

    human = cli.ok("workflow", "status", "demo").stdout
    assert "phase:   INTAKE → *DESIGN* → [VISUAL_DESIGN] → BUILD ⇄ REVIEW" in human
    assert "status:  running, cycle 0, 1 events" in human
    assert f"vibey gate answer {approve['id']} yes   (or: no)" in human
    assert "waiting on (2):" in human
    assert "first  design.interview  s1    ready  0/5" in human


def test_list_filters_by_status_and_project(cli: Cli) -> None:
    cli.ok("workflow", "start", "one")
    cli.ok("workflow", "start", "two")
    cli.ok("workflow", "cancel", "two")
    everything = cli.json("workflow", "list")["workflows"]
    assert sorted(w["project"] for w in everything) == ["one", "two"]
    assert all(set(w) == WORKFLOW_KEYS for w in everything)
    running = cli.json("workflow", "list", "--status", "running")["workflows"]
    assert [w["project"] for w in running] == ["one"]
    only_two = cli.json("workflow", "list", "--project", "two")["workflows"]
    assert [(w["project"], w["status"]) for w in only_two] == [("two", "cancelled")]
    table = cli.ok("workflow", "list").stdout.splitlines()
    assert table[0].split() == ["PROJECT", "STATUS", "PHASE/CYCLE", "UPDATED", "WORKFLOW", "NOW"]
    assert len(table) == 3
    assert cli.ok("workflow", "list", "--project", "none").stdout == "no workflows\n"
    assert "Invalid value" in cli.refused(2, "workflow", "list", "--status", "sleeping")


def test_history_lists_the_started_event_with_its_commands(cli: Cli) -> None:
    started = cli.json("workflow", "start", "demo")["workflow"]
    out = cli.json("workflow", "history", "demo")
    assert out["workflow_id"] == started["id"]
    [event] = out["events"]
    assert set(event) == {"seq", "at", "event", "commands"}
    assert event["seq"] == 1
    assert event["event"]["type"] == "started"
    assert [c["type"] for c in event["commands"]] == [
        "transition_phase",
        "schedule_step",
        "open_gate",
        "open_gate",
    ]
    human = cli.ok("workflow", "history", "demo").stdout
    assert "#1" in human
    assert "started (engine scripted)" in human
    assert "→ phase design/0, schedule first, ask approve, ask rating" in human


def test_an_unknown_project_exits_1_with_one_line(cli: Cli) -> None:
    for command in ("status", "history", "verify", "cancel"):
        line = cli.refused(1, "workflow", command, "ghost")
        assert line == (
            "vibey: project 'ghost' has no workflow; start one with `vibey workflow start ghost`"
        )


# --- gates ---------------------------------------------------------------------------------


def test_gate_list_and_show(cli: Cli) -> None:
    assert cli.ok("gate", "list").stdout == "nothing is waiting\n"
    cli.ok("workflow", "start", "demo")
    gates = cli.json("gate", "list")["gates"]
    assert [g["name"] for g in gates] == ["approve", "rating"] or [g["name"] for g in gates] == [
        "rating",
        "approve",
    ]
    assert all(set(g) == GATE_KEYS for g in gates)
    assert all(g["waited_s"] >= 0 for g in gates)
    assert cli.json("gate", "list", "--project", "other")["gates"] == []

    table = cli.ok("gate", "list").stdout.splitlines()
    assert table[0].split() == ["GATE", "PROJECT", "KIND", "WAITED", "ANSWERS", "QUESTION"]
    approve_row = next(line for line in table if "approve:" in line)
    assert "yes, no" in approve_row
    rating_row = next(line for line in table if "rating:" in line)
    assert "an integer 1..5" in rating_row

    approve = cli.gate_named("approve")
    shown = cli.json("gate", "show", approve["id"])
    assert set(shown) == GATE_KEYS
    assert (shown["id"], shown["question"], shown["answer"]) == (
        approve["id"],
        "Ship the tiny thing?",
        None,
    )
    human = cli.ok("gate", "show", approve["id"]).stdout
    assert f"gate {approve['id']}  open, waited" in human
    assert f"answer:   vibey gate answer {approve['id']} yes   (or: no)" in human
    assert 'context:  {"why": "a test"}' in human


def test_gate_answer_commits_and_the_workflow_moves_on(exec_cli: Cli) -> None:
    workflow = exec_cli.json("workflow", "start", "demo")["workflow"]
    approve = exec_cli.gate_named("approve")
    out = exec_cli.json("gate", "answer", approve["id"], "yes", "--by", "alice")
    assert set(out) == {"gate", "workflow", "dispatch"}
    assert set(out["gate"]) == GATE_KEYS
    assert (out["gate"]["answer"], out["gate"]["answered_by"]) == ("yes", "alice")
    assert out["gate"]["answered_at"] is not None
    assert out["workflow"]["id"] == workflow["id"]
    assert (out["workflow"]["phase"], out["workflow"]["last_seq"]) == ("build", 2)
    # "second" waits on "first": it is not claimable, so no pointer is written yet.
    assert out["dispatch"] == {"rows": 0, "published": 0}

    status = exec_cli.json("workflow", "status", "demo")
    assert [s["step"] for s in status["steps"]] == ["first", "second"]
    assert [g["name"] for g in status["gates"]] == ["rating"]
    events = exec_cli.json("workflow", "history", "demo")["events"]
    assert events[-1]["event"] == {
        "type": "gate_answered",
        "gate": "approve",
        "answer": "yes",
        "by": "alice",
    }
    assert "*BUILD*" in exec_cli.ok("workflow", "status", "demo").stdout


def test_gate_answer_in_human_form_defaults_by_to_the_user(cli: Cli) -> None:
    cli.ok("workflow", "start", "demo")
    rating = cli.gate_named("rating")
    run = cli.ok("gate", "answer", rating["id"], "4")
    assert run.stdout.startswith(f"answered gate {rating['id']} (rating) with '4' as ")
    shown = cli.json("gate", "show", rating["id"])
    assert shown["answer"] == "4"
    assert shown["answered_by"]


def test_answering_twice_exits_1_and_changes_nothing(exec_cli: Cli) -> None:
    exec_cli.ok("workflow", "start", "demo")
    approve = exec_cli.gate_named("approve")
    exec_cli.ok("gate", "answer", approve["id"], "no", "--by", "alice")
    before = exec_cli.json("workflow", "history", "demo")
    line = exec_cli.refused(1, "gate", "answer", approve["id"], "yes", "--by", "bob")
    answered_at = exec_cli.json("gate", "show", approve["id"])["answered_at"]
    stamp = answered_at[:19].replace("T", " ") + "Z"
    assert line == (
        f"vibey: gate {approve['id']} was already answered by alice at {stamp} ('no'); "
        "nothing changed"
    )
    assert exec_cli.json("workflow", "history", "demo") == before
    assert exec_cli.json("workflow", "status", "demo")["workflow"]["status"] == "completed"


def test_an_answer_outside_the_allowed_set_exits_2_listing_the_valid_ones(cli: Cli) -> None:
    cli.ok("workflow", "start", "demo")
    approve, rating = cli.gate_named("approve"), cli.gate_named("rating")
    line = cli.refused(2, "gate", "answer", approve["id"], "maybe")
    assert line == f"vibey: maybe is not an answer to gate {approve['id']}; valid: yes, no"
    line = cli.refused(2, "gate", "answer", rating["id"], "9")
    assert line == (
        f"vibey: 9 is not an answer to gate {rating['id']} (9 is above the maximum 5); "
        "valid: an integer 1..5"
    )
    assert cli.json("gate", "show", approve["id"])["answer"] is None
    assert len(cli.json("workflow", "history", "demo")["events"]) == 1


def test_unknown_and_malformed_gate_ids(cli: Cli) -> None:
    unknown = str(uuid.uuid4())
    for args in (("show", unknown), ("answer", unknown, "yes")):
        assert cli.refused(1, "gate", *args) == f"vibey: no gate {unknown}"
    for args in (("show", "nope"), ("answer", "nope", "yes")):
        line = cli.refused(2, "gate", *args)
        assert (
            line
            == "vibey: 'nope' is not a gate id: gate ids are UUIDs, as `vibey gate list` shows them"
        )


def test_a_parked_jobs_gate_is_listed_and_answered(cli: Cli, pg_url: str) -> None:
    with ConnectionPool(pg_url, min_size=1, max_size=2, kwargs={"autocommit": True}) as pool:
        jobs = PostgresJobRepository(pool=pool)
        job = jobs.enqueue(EnqueueRequest(project_id="parked", kind="design.spec")).job
        [claimed] = jobs.claim("parked", owner="test")
        request = GateRequest(kind="review", prompt="Look at this?", answers=("ok", "again"))
        gate_id = jobs.park(claimed.lease, request).gate_id
        assert gate_id is not None
        [gate] = cli.json("gate", "list", "--project", "parked")["gates"]
        assert (gate["id"], gate["job_id"], gate["workflow_id"], gate["name"]) == (
            str(gate_id),
            str(job.id),
            None,
            None,
        )
        line = cli.refused(2, "gate", "answer", str(gate_id), "nah")
        assert line.endswith("valid: ok, again")
        out = cli.json("gate", "answer", str(gate_id), "ok", "--by", "carol")
        assert out["workflow"] is None
        assert out["gate"]["job_id"] == str(job.id)
        released = jobs.get(job.id)
        assert released is not None
        assert released.state.value == "ready"
    human = cli.ok("gate", "show", str(gate_id)).stdout
    assert f"for:      parked job {job.id}" in human
    assert "answered: ok by carol at" in human


# --- cancel and verify ---------------------------------------------------------------------


def test_cancel_cancels_the_live_workflow_and_then_exits_1(cli: Cli) -> None:
    cli.ok("workflow", "start", "demo")
    out = cli.json("workflow", "cancel", "demo", "--by", "dave", "--reason", "enough")
    assert out["workflow"]["status"] == "cancelled"
    assert out["workflow"]["reason"] == "cancelled by dave: enough"
    assert out["workflow"]["finished_at"] is not None
    status = cli.json("workflow", "status", "demo")
    assert status["workflow"]["status"] == "cancelled"
    assert status["gates"] == []
    assert [s["state"] for s in status["steps"]] == ["cancelled"]
    line = cli.refused(1, "workflow", "cancel", "demo")
    assert line.startswith("vibey: project 'demo' has no live workflow (its latest, ")
    assert line.endswith("is cancelled)")
    assert cli.ok("gate", "list").stdout == "nothing is waiting\n"
    # A new start after a finished one is a new workflow.
    again = cli.json("workflow", "start", "demo")
    assert again["created"] is True
    assert again["workflow"]["id"] != out["workflow"]["id"]


def test_verify_reproduces_the_stored_state(cli: Cli) -> None:
    cli.ok("workflow", "start", "demo")
    cli.ok("gate", "answer", cli.gate_named("approve")["id"], "yes")
    run = cli.ok("workflow", "verify", "demo")
    assert run.stdout == "replay reproduces the stored state (2 events)\n"
    assert cli.json("workflow", "verify", "demo") == {
        "ok": True,
        "replayed": 2,
        "divergence": None,
    }


def test_a_divergence_exits_1_and_blocks_unless_told_not_to(cli: Cli) -> None:
    cli.ok("workflow", "start", "demo")
    drifted = {"VIBEY_WORKFLOW_DEFINITIONS": DRIFTED}
    run = cli("workflow", "verify", "demo", "--no-block", "--json", **drifted)
    assert run.code == 1, run.stderr
    report = json.loads(run.stdout)
    assert (report["ok"], report["replayed"]) == (False, 1)
    assert report["divergence"].startswith("replay diverges at event #1: recorded commands")
    assert cli.json("workflow", "status", "demo")["workflow"]["status"] == "running"

    line = cli.refused(1, "workflow", "verify", "demo", **drifted)
    assert line.startswith("vibey: replay diverges at event #1")
    assert line.endswith(
        "the workflow is blocked behind a workflow_error gate (see `vibey gate list`)"
    )
    status = cli.json("workflow", "status", "demo")
    assert status["workflow"]["status"] == "blocked"
    assert "workflow_error" in [g["kind"] for g in status["gates"]]
    error_gate = next(g for g in status["gates"] if g["kind"] == "workflow_error")
    assert error_gate["answers"] == ["retry", "cancel"]


# --- errors, settings, completion ----------------------------------------------------------


def test_unloadable_definitions_exit_2(cli: Cli) -> None:
    line = cli.refused(2, "workflow", "list", VIBEY_WORKFLOW_DEFINITIONS="no_such_module:DEFS")
    assert "the workflow definitions 'no_such_module:DEFS' cannot be loaded" in line
    assert line.endswith("fix VIBEY_WORKFLOW_DEFINITIONS (or definitions under [workflow])")


def test_no_database_exits_2_and_one_that_does_not_answer_exits_3(tmp_path: Path) -> None:
    bare = Cli(tmp_path, clean_env(VIBEY_WORKFLOW_DEFINITIONS=TINY))
    assert "VIBEY_PG_URL is not set" in bare.refused(2, "workflow", "list")
    gone = f"postgresql://vibey:hunter2@127.0.0.1:{free_port()}/vibey"
    line = bare.refused(3, "gate", "list", VIBEY_PG_URL=gone)
    assert "PostgreSQL at" in line and "did not answer after 5 attempts" in line
    assert "hunter2" not in line


def test_completion_prints_a_script_and_installs_one(tmp_path: Path) -> None:
    cli = Cli(tmp_path, clean_env(HOME=str(tmp_path)))
    script = cli.ok("completion", "bash").stdout
    assert script.startswith("# Bash completion for vibey")
    for word in ("workflow", "gate", "answer", "--definition"):
        assert word in script
    assert "compdef" in cli.ok("completion", "zsh").stdout
    assert cli("completion", "tcsh").code == 2
    target = tmp_path / "vibey.bash"
    cli.ok("--install-completion", "--shell", "bash", "-o", str(target))
    assert target.read_text() == script


# --- the real protocol ---------------------------------------------------------------------


def test_the_protocol_starts_in_design_with_its_first_interview(
    tmp_path: Path, pg_url: str
) -> None:
    cli = Cli(tmp_path, clean_env(VIBEY_PG_URL=pg_url))
    script = tmp_path / "demo.toml"
    script.write_text(
        '[design]\nquestions = [{ id = "audience", question = "Who?", answers = [] }]\n'
    )
    out = cli.json("workflow", "start", "demo", "--script", str(script))
    workflow = out["workflow"]
    assert (workflow["definition"], workflow["phase"], workflow["status"]) == (
        "vibey-protocol",
        "design",
        "running",
    )
    status = cli.json("workflow", "status", "demo")
    assert [s["kind"] for s in status["steps"]] == ["design.interview"]
    assert status["gates"] == []
    assert "*DESIGN*" in cli.ok("workflow", "status", "demo").stdout
    assert cli.ok("workflow", "verify", "demo").stdout.startswith("replay reproduces")
    cancelled = cli.json("workflow", "cancel", "demo")["workflow"]
    assert cancelled["status"] == "cancelled"


# --- publishing right after the commit -------------------------------------------------------


def outbox(pg_url: str) -> list[tuple[Any, ...]]:
    with psycopg.connect(pg_url) as conn:
        return conn.execute(
            "SELECT claimed_by, sent_at IS NOT NULL FROM job_outbox ORDER BY id"
        ).fetchall()


def test_start_publishes_the_first_step_at_once(cli: Cli, pg_url: str, amqp: Amqp) -> None:
    config = WorkerConfig(
        database=DatabaseSettings(url=pg_url),
        bus=BusSettings(amqp_url=amqp.url, prefix=amqp.prefix),
    )
    connection = amqp.connect()
    config.topology().declare(amqp.channel(connection), detect(connection))
    env = {"VIBEY_AMQP_URL": amqp.url, "VIBEY_BUS_PREFIX": amqp.prefix}
    run = cli.ok("workflow", "start", "demo", **env)
    assert run.stdout.startswith("started; 1 step dispatched\n")
    [(claimed_by, sent)] = outbox(pg_url)
    assert sent is True
    assert claimed_by.startswith("vibey-cli:")
    queue = amqp.names.work_queue(Lane.INTERACTIVE.value)
    declared = amqp.channel(connection).queue_declare(queue, passive=True)
    assert declared.method.message_count == 1


def test_without_the_topology_the_rows_are_left_to_the_reconcilers(
    cli: Cli, pg_url: str, amqp: Amqp
) -> None:
    env = {"VIBEY_AMQP_URL": amqp.url, "VIBEY_BUS_PREFIX": amqp.prefix}
    run = cli.ok("workflow", "start", "demo", **env)
    assert "1 step committed, 0 dispatched now; the workers' reconcilers" in run.stdout
    assert outbox(pg_url) == [(None, False)]  # unclaimed: the next drain takes it


def test_a_broker_that_does_not_answer_delays_start_a_little(cli: Cli, pg_url: str) -> None:
    env = {"VIBEY_AMQP_URL": f"amqp://guest:guest@127.0.0.1:{free_port()}/"}
    run = cli.ok("workflow", "start", "demo", **env)
    assert "0 dispatched now" in run.stdout
    assert outbox(pg_url) == [(None, False)]


def test_the_postgres_backend_writes_no_pointers(cli: Cli, pg_url: str) -> None:
    run = cli.ok("workflow", "start", "demo", VIBEY_QUEUE_BACKEND="postgres")
    assert run.stdout.startswith("started\n")
    assert outbox(pg_url) == []


# --- engine rotate and review feedback -------------------------------------------------------


def test_engine_rotate_records_an_operator_request_for_the_project(cli: Cli) -> None:
    asked = cli.json("engine", "rotate", "shop", "--by", "ops")
    assert (asked["project"], asked["away_from"], asked["requested_by"]) == ("shop", None, "ops")
    line = cli.ok("engine", "rotate", "shop").stdout
    assert line.startswith("shop: its next engine-driven attempt rotates (no engine has run yet)")


def test_start_asks_for_review_feedback_unless_unattended(cli: Cli) -> None:
    cli.ok("workflow", "start", "asks", VIBEY_WORKFLOW_REVIEW_FEEDBACK="true")
    started = cli.json("workflow", "history", "asks")["events"][0]["event"]
    assert started["input"]["review_feedback"] is True
    cli.ok("workflow", "start", "quiet")  # the tests' environment says false
    started = cli.json("workflow", "history", "quiet")["events"][0]["event"]
    assert "review_feedback" not in started["input"]
