"""Containment of engine runs with real processes under the real confinement.

A small script runs as an engine's command in project ``alpha``'s worktree. Under bubblewrap
and under Landlock alike it must be refused when it writes outside its worktree, reads
project ``beta``'s worktree, reads the operator's home, reads another process's environment
(the worker's: a marker put there by this test), or opens a socket to a host:port it was
not allowed; and its own work must still land: a file written in its worktree, and requests
to the allowed host (a local server on 127.0.0.1 standing in for the model API), directly
and through vibey's proxy. The same holds for a run a loop service starts
(:class:`actors.agents.run_host.RunHost`), through the same spawn path.
"""

from __future__ import annotations

import http.server
import json
import logging
import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.agents import EngineTask
from actors.agents.adapters import engine_for
from actors.agents.command import CommandEngine
from actors.agents.confine import (
    Confinement,
    ConfinementError,
    _destination,
    bwrap_problem,
    check_endpoint,
    env_endpoints,
    landlock_problem,
)
from actors.agents.lease import WorktreeLease
from actors.agents.roster import AgentSpec, RosterError, parse_roster
from actors.agents.run_host import Active, RunHost
from actors.worktrees import Workspace
from tests.agents.fake_cli import SOURCE, install
from workflows.runs import Purpose, RunRequest, RunStatus

MECHANISMS = [
    pytest.param(
        "bwrap", marks=pytest.mark.skipif(bwrap_problem() is not None, reason=str(bwrap_problem()))
    ),
    pytest.param(
        "landlock",
        marks=pytest.mark.skipif(landlock_problem() is not None, reason=str(landlock_problem())),
    ),
]

# What an engine might try; each attempt's outcome goes to the verdict's result.
PROBE = r"""
import json, os, pathlib, socket, sys, urllib.request
plan = json.loads(pathlib.Path(os.environ["VIBEY_PLAN"]).read_text())
inp = plan["input"]
found = {}
def attempt(name, action):
    try:
        found[name] = ["allowed", repr(action())[:200]]
    except Exception as exc:
        found[name] = ["refused", f"{type(exc).__name__}: {exc}"[:200]]
attempt("write_own", lambda: pathlib.Path("own-work.txt").write_text("done"))
attempt("write_outside", lambda: pathlib.Path(inp["outside"]).write_text("escaped"))
import subprocess
def commit():
    subprocess.run(["git", "add", "own-work.txt"], check=True, capture_output=True)
    identity = ["-c", "user.name=engine", "-c", "user.email=engine@example.com"]
    done = subprocess.run(["git", *identity, "commit", "-m", "own work"], capture_output=True)
    if done.returncode:
        raise OSError(done.stderr.decode()[-200:])
    return "committed"
attempt("git_commit", commit)
attempt("plant_hook", lambda: pathlib.Path(inp["hook"]).write_text("#!/bin/sh\ntouch /escaped\n"))
attempt("write_other_project", lambda: pathlib.Path(inp["other_write"]).write_text("x"))
attempt("read_other_project", lambda: pathlib.Path(inp["other_project"]).read_text())
attempt("read_home", lambda: pathlib.Path(inp["home_secret"]).read_text())
def environs():
    seen = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            data = pathlib.Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if inp["marker"].encode() in data:
            seen.append(pid)
    if seen:
        return seen
    raise PermissionError("no process's environment showed the marker")
attempt("read_environ", environs)
parent = pathlib.Path(f"/proc/{inp['worker_pid']}/environ")
attempt("read_parent_environ", lambda: parent.read_bytes())
def direct(port):
    return lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/direct", timeout=5).read()
attempt("allowed_direct", direct(inp["allowed"]))
attempt("denied_direct", direct(inp["denied"]))
for name in ("NO_PROXY", "no_proxy"):  # through vibey's proxy, loopback or not
    os.environ.pop(name, None)
proxy = urllib.request.build_opener(urllib.request.ProxyHandler({"http": os.environ["HTTP_PROXY"]}))
def proxied(port):
    return lambda: proxy.open(f"http://127.0.0.1:{port}/proxied", timeout=5).read()
attempt("allowed_proxied", proxied(inp["allowed"]))
attempt("denied_proxied", proxied(inp["denied"]))
attempt("remote_socket", lambda: socket.create_connection(("10.255.255.1", 443), timeout=3))
pathlib.Path(os.environ["VIBEY_VERDICT"]).write_text(json.dumps({"status": "ok", "result": found}))
"""


class Recorder(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        body = b"model api says hi"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def servers() -> Iterator[tuple[http.server.ThreadingHTTPServer, http.server.ThreadingHTTPServer]]:
    """Two local servers: the allowed model API, and one the engine may not reach."""
    made = []
    for _ in range(2):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
        server.paths = []  # type: ignore[attr-defined]
        threading.Thread(target=server.serve_forever, daemon=True).start()
        made.append(server)
    yield made[0], made[1]
    for server in made:
        server.shutdown()
        server.server_close()


@pytest.fixture
def home_secret() -> Iterator[Path]:
    """A file in the operator's home (removed afterwards)."""
    path = Path.home() / f".vibey-confinement-test-{uuid.uuid4().hex}"
    path.write_text("the operator's secret")
    yield path
    path.unlink(missing_ok=True)


@pytest.fixture
def marker() -> Iterator[str]:
    """A process outside the sandbox whose environment holds a secret, as a worker's holds
    the database URL (/proc/<pid>/environ shows a process's initial environment)."""
    value = f"postgresql://vibey:{uuid.uuid4().hex}@db/vibey"
    env = {**os.environ, "VIBEY_PG_URL": value}
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    yield value
    holder.kill()
    holder.wait()


def projects(tmp_path: Path) -> tuple[Path, Path]:
    workspace = Workspace(tmp_path / "work")
    mine = workspace.worktree("alpha", 0, "core")
    theirs = workspace.worktree("beta", 0, "core")
    (theirs / "secret.txt").write_text("beta's code")
    return mine, theirs


def probe_input(tmp_path: Path, theirs: Path, home: Path, marker: str, ports: tuple[int, int]):
    return {
        "outside": str(tmp_path / "escaped.txt"),
        "other_project": str(theirs / "secret.txt"),
        "other_write": str(theirs / "planted.txt"),
        "hook": str(theirs.parents[1] / "repo" / ".git" / "hooks" / "post-commit").replace(
            "/beta/", "/alpha/"
        ),
        "home_secret": str(home),
        "marker": marker,
        "worker_pid": os.getpid(),
        "allowed": ports[0],
        "denied": ports[1],
    }


def found_hook(mine: Path) -> str:
    return str(mine.parents[1] / "repo" / ".git" / "hooks" / "post-commit")


def assert_contained(
    found: dict[str, list[str]], tmp_path: Path, mine: Path, theirs: Path, mode: str
) -> None:
    refused = [
        "plant_hook",
        "write_other_project",
        "read_other_project",
        "read_home",
        "read_environ",
        "read_parent_environ",
        "denied_direct",
        "denied_proxied",
        "remote_socket",
    ]
    if mode == "landlock":  # no PID namespace: the kernel's ptrace rules decide (docs)
        refused = [name for name in refused if "environ" not in name]
    for name in refused:
        assert found[name][0] == "refused", (name, found[name])
    for name in ("write_own", "git_commit", "allowed_direct", "allowed_proxied"):
        assert found[name][0] == "allowed", (name, found[name])
    assert "model api says hi" in found["allowed_proxied"][1]
    assert "403" in found["denied_proxied"][1]
    # bubblewrap: a write to /tmp lands in the run's private /tmp; Landlock refuses it
    assert not (tmp_path / "escaped.txt").exists()
    assert not (theirs / "planted.txt").exists()
    assert (mine / "own-work.txt").read_text() == "done"
    last = subprocess.run(["git", "log", "-1", "--format=%s"], cwd=mine, capture_output=True)
    assert last.stdout.decode().strip() == "own work"  # its commit is on its branch
    assert not Path(found_hook(mine)).exists()


@pytest.mark.parametrize("mode", MECHANISMS)
def test_a_confined_run_is_refused_outside_its_worktree_and_its_own_work_lands(
    mode: str,
    tmp_path: Path,
    servers: Any,
    home_secret: Path,
    marker: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    allowed, denied = servers
    ports = (allowed.server_address[1], denied.server_address[1])
    mine, theirs = projects(tmp_path)
    confinement = Confinement(
        "probe", mode, network=(f"127.0.0.1:{ports[0]}",), homes=tmp_path / "homes"
    )
    engine = CommandEngine(
        [sys.executable, "-c", PROBE],
        timedelta(seconds=60),
        env={"PATH": os.environ["PATH"]},
        confinement=confinement,
    )
    step_input = probe_input(tmp_path, theirs, home_secret, marker, ports)
    task = EngineTask("build.implement", "alpha", 0, "core", 1, step_input, mine)
    with caplog.at_level(logging.WARNING):
        verdict = engine.run(task)
    assert verdict.status == "ok", (verdict.detail, verdict.evidence)
    assert_contained(verdict.result, tmp_path, mine, theirs, mode)
    assert allowed.paths == ["/direct", "/proxied"]  # the model API's requests landed
    assert denied.paths == []  # nothing reached the other server
    assert f"127.0.0.1:{ports[1]}: not in its network_allow" in caplog.text


@pytest.mark.parametrize("mode", MECHANISMS)
def test_a_loop_service_run_is_confined_the_same_way(
    mode: str, tmp_path: Path, servers: Any, home_secret: Path, marker: str
) -> None:
    """The service path: RunHost starts the engine's binary with the request's arguments."""
    allowed, denied = servers
    ports = (allowed.server_address[1], denied.server_address[1])
    mine, theirs = projects(tmp_path)
    agent = tmp_path / "bin" / "agent"
    agent.parent.mkdir()
    plan = tmp_path / "plan.json"  # the probe's input, read-only to it
    plan.write_text(
        json.dumps({"input": probe_input(tmp_path, theirs, home_secret, marker, ports)})
    )
    agent.write_text(f"#!{sys.executable}\n" + PROBE.replace("VIBEY_VERDICT", "VERDICT_FILE"))
    agent.chmod(0o755)
    env = {"VIBEY_PLAN": str(plan), "VERDICT_FILE": str(mine / "verdict.json")}
    spec = AgentSpec(
        "svc", "claude-code", binary=str(agent), env=env, confinement=mode,
        network_allow=(f"127.0.0.1:{ports[0]}",), read_allow=(str(plan),),
        invocation="service",
    )  # fmt: skip
    adapter = engine_for(spec, worker_env=dict(os.environ), state_dir=tmp_path / "state")
    host = RunHost(adapter, root=tmp_path / "work", instance="test")  # type: ignore[arg-type]
    now = datetime.now(UTC)
    request = RunRequest(
        uuid.uuid4(), "svc", Purpose.RUN, ("-p", "go"), str(mine), None, 60.0,
        now + timedelta(seconds=60), now, "reply",
    )  # fmt: skip
    result = host.execute(Active(request), lambda active: None)
    assert result.status is RunStatus.EXITED and result.exit_code == 0, result.detail
    found = json.loads((mine / "verdict.json").read_text())["result"]
    assert_contained(found, tmp_path, mine, theirs, mode)
    assert (tmp_path / "state" / "homes" / "svc" / "alpha").is_dir()  # its own HOME


def test_turning_it_off_is_loud_and_runs_unconfined(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    script = (
        "import json, os, pathlib\n"
        "pathlib.Path(os.environ['VIBEY_VERDICT']).write_text(json.dumps("
        "{'status': 'ok', 'result': {'pids': len([p for p in os.listdir('/proc') "
        "if p.isdigit()])}}))\n"
    )
    engine = CommandEngine(
        [sys.executable, "-c", script],
        timedelta(seconds=30),
        confinement=Confinement("loose", "none"),
    )
    with caplog.at_level(logging.WARNING):
        verdict = engine.run(EngineTask("build.verify", "alpha", 0, "v", 1, {}, tmp_path))
    assert verdict.status == "ok"
    assert verdict.result["pids"] > 5  # it sees the machine's processes
    assert "engine loose runs UNCONFINED (off by setting)" in caplog.text


def test_an_explicit_mechanism_that_is_missing_refuses_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("actors.agents.confine.bwrap_problem", lambda: "bwrap is not installed")
    confinement = Confinement("strict", "bwrap")
    assert (
        confinement.describe() == "none (unavailable: bwrap is not installed); the run is refused"
    )
    engine = CommandEngine(
        [sys.executable, "-c", "print('ran')"], timedelta(seconds=30), confinement=confinement
    )
    verdict = engine.run(EngineTask("build.verify", "alpha", 0, "v", 1, {}, tmp_path))
    assert verdict.engine_fault
    assert "unavailable: bwrap is not installed" in verdict.detail
    refused = pytest.raises(ConfinementError, match='set confinement = "auto"')
    with refused, confinement.enter(["true"], cwd=tmp_path, env={}):
        pass


def test_credentials_reach_the_engine_only_through_its_env(tmp_path: Path) -> None:
    """A run of a (fake) CLI with a key in its env: no file vibey leaves in the worktree, its
    plans, verdicts or diagnostics, nor the engine's HOME, carries it."""
    key = f"sk-ant-{uuid.uuid4().hex}"
    fakes = install(tmp_path / "bin")
    spec = AgentSpec(
        "claude", "claude-code", binary=str(fakes["claude"]),
        env={"ANTHROPIC_API_KEY": key, "FAKE_SCENARIO": "success"}, read_allow=(SOURCE,),
    )  # fmt: skip
    engine = engine_for(spec, worker_env=dict(os.environ), state_dir=tmp_path / "state")
    workdir = Workspace(tmp_path / "work").worktree("alpha", 0, "core")
    step_input = {"item": {"id": "core", "title": "Core"}, "engine": {"name": "roster"}}
    with WorktreeLease().hold(workdir, "job-1", 1, "claim-1") as held:
        task = EngineTask(
            "build.implement", "alpha", 0, "core", 1, step_input, workdir,
            workdir=workdir, lease=held,
        )  # fmt: skip
        verdict = engine.run(task)
    assert verdict.status == "ok", verdict.detail
    written = [p for p in workdir.rglob("*") if p.is_file() and ".git" not in p.parts]
    assert any(".vibey" in p.parts for p in written)  # vibey did write its plan there
    for path in [*written, *(tmp_path / "state" / "homes").rglob("*")]:
        if path.is_file():
            assert key not in path.read_text(errors="replace"), path
    assert key not in (workdir / ".git").read_text()


def test_the_roster_reads_the_confinement_keys() -> None:
    body = {
        "adapter": "codex",
        "env": {"OPENAI_BASE_URL": "http://127.0.0.1:8080/v1"},
        "read_allow": ["/srv/docs"],
    }
    (spec,) = parse_roster({"codex": body}, "vibey.toml")
    assert spec.confinement == "auto"
    assert spec.network == ("api.openai.com:443", "chatgpt.com:443", "127.0.0.1:8080")
    assert spec.read_allow == ("/srv/docs",)
    (spec,) = parse_roster({"c": {**body, "network_allow": ["Example.COM:8443"]}}, "x")
    assert spec.network == ("example.com:8443",)
    for bad, says in (
        ({"confinement": "chroot"}, "confinement must be one of auto, bwrap, landlock, none"),
        ({"network_allow": ["example.com"]}, "host:port"),
        ({"write_allow": ["relative/dir"]}, "absolute paths"),
    ):
        with pytest.raises(RosterError, match=says):
            parse_roster({"c": {"adapter": "aider", **bad}}, "x")


HOSTS = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?(\.[a-z]{2,6}){0,2}", fullmatch=True)
PORTS = st.integers(1, 65535)


@given(HOSTS, PORTS, st.from_regex(r"(/[a-z0-9]{0,8}){0,3}", fullmatch=True))
def test_the_proxy_reads_the_destination_it_checks(host: str, port: int, path: str) -> None:
    """Whatever form the request takes, the host:port the proxy checks is the one it would
    connect to, and a plain request is passed on in origin form."""
    assert _destination(f"CONNECT {host}:{port} HTTP/1.1\r\n\r\n".encode()) == (
        f"{host}:{port}",
        None,
    )
    head = f"GET http://{host}:{port}{path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()
    target, rewritten = _destination(head)
    assert target == check_endpoint(f"{host}:{port}")
    assert rewritten is not None
    assert rewritten.startswith(f"GET {path or '/'} HTTP/1.1\r\nHost: {host}".encode())


@given(HOSTS, PORTS, st.sampled_from(["http", "https"]))
def test_base_urls_in_env_are_allowed_endpoints(host: str, port: int, scheme: str) -> None:
    env = {"ANTHROPIC_BASE_URL": f"{scheme}://{host}:{port}/v1", "OTHER": f"http://{host}:1"}
    assert env_endpoints(env) == (f"{host}:{port}",)
    default = 443 if scheme == "https" else 80
    assert env_endpoints({"OPENAI_API_BASE": f"{scheme}://{host}"}) == (f"{host}:{default}",)


def test_doctor_and_engine_list_say_which_confinement_each_engine_runs_under(
    tmp_path: Path,
) -> None:
    config = tmp_path / "vibey.toml"
    config.write_text(
        '[engines.claude]\nadapter = "claude-code"\n'
        'env = { ANTHROPIC_BASE_URL = "http://127.0.0.1:8089" }\n'
        '[engines.loose]\nadapter = "aider"\nconfinement = "none"\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("VIBEY_")}
    env["VIBEY_CONFIG"] = str(config)
    vibey = Path(sys.executable).with_name("vibey")
    listed = subprocess.run(
        [str(vibey), "engine", "list", "--json"], env=env, capture_output=True, text=True
    )
    rows = {row["id"]: row for row in json.loads(listed.stdout)["engines"]}
    expected = "bwrap" if bwrap_problem() is None else "landlock"
    assert rows["claude"]["confinement"] == expected
    assert rows["claude"]["network_allow"] == ["api.anthropic.com:443", "127.0.0.1:8089"]
    assert rows["loose"]["confinement"] == "none (off by setting)"
    doctor = subprocess.run([str(vibey), "doctor"], env=env, capture_output=True, text=True)
    lines = doctor.stdout.splitlines()
    assert (
        f"confinement claude: ok: {expected}; network: api.anthropic.com:443, 127.0.0.1:8089"
        in lines
    )
    assert any(
        line.startswith("confinement loose: PROBLEM: none (off by setting)") for line in lines
    )
    text = subprocess.run([str(vibey), "engine", "list"], env=env, capture_output=True, text=True)
    assert "confinement: NONE (off by setting)" in text.stdout


def test_a_base_url_in_codex_config_is_allowed_as_the_run_starts(tmp_path: Path) -> None:
    home = tmp_path / "codex-home"
    spec = AgentSpec("codex", "codex", env={"CODEX_HOME": str(home)})
    assert spec.network == ("api.openai.com:443", "chatgpt.com:443")
    home.mkdir()
    (home / "config.toml").write_text(
        'model_provider = "local"\n[model_providers.local]\nname = "local"\n'
        'base_url = "http://127.0.0.1:8765/v1"\nwire_api = "responses"\n'
    )
    allowed: tuple[str, ...] = spec.network  # read again: the config is new
    assert allowed == ("api.openai.com:443", "chatgpt.com:443", "127.0.0.1:8765")
    assert spec.confined(None).network[-1] == "127.0.0.1:8765"
