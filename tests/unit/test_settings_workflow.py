"""vibey.settings ``[workflow]`` and ``[engine]``: defaults, sources, checks, and the wiring."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.test_settings import AMQP, PG, settings_error, write_toml
from vibey.settings import EngineSettings, SettingsError, WorkflowSettings, load_settings
from vibey.wiring import load_registry, worker_config
from workflows.budget import Budget


@pytest.fixture
def empty_dir(tmp_path: Path) -> Path:
    return tmp_path


def test_defaults(empty_dir: Path) -> None:
    settings = load_settings({}, empty_dir)
    assert settings.workflow == WorkflowSettings()
    assert settings.workflow.definitions == "workflows.protocol:DEFINITIONS"
    assert settings.workflow.default_definition == "vibey-protocol"
    assert settings.engine == EngineSettings()
    assert settings.engine.name == "scripted"
    assert settings.engine.command == ()
    assert settings.engine.timeout_seconds == 7200
    assert settings.engine.workspace == ".vibey/work"


def test_toml_values_and_the_environment_over_them(tmp_path: Path) -> None:
    write_toml(
        tmp_path,
        """
[workflow]
definitions = "pkg.defs:ALL"
default_definition = "mine"

[engine]
name = "command"
command = ["agent", "--plan", "with space"]
timeout_seconds = 60
workspace = "/tmp/work"
""",
    )
    settings = load_settings({}, tmp_path)
    assert settings.workflow == WorkflowSettings(
        definitions="pkg.defs:ALL", default_definition="mine"
    )
    assert settings.engine == EngineSettings(
        name="command",
        command=("agent", "--plan", "with space"),
        timeout_seconds=60.0,
        workspace="/tmp/work",
    )
    env = {
        "VIBEY_WORKFLOW_DEFINITIONS": "other.defs:X",
        "VIBEY_WORKFLOW_DEFAULT_DEFINITION": "theirs",
        "VIBEY_ENGINE_NAME": "scripted",
        "VIBEY_ENGINE_COMMAND": "run-agent --model 'big one'",
        "VIBEY_ENGINE_TIMEOUT": "90.5",
        "VIBEY_ENGINE_WORKSPACE": "ws",
    }
    settings = load_settings(env, tmp_path)
    assert settings.workflow == WorkflowSettings(
        definitions="other.defs:X", default_definition="theirs"
    )
    assert settings.engine == EngineSettings(
        name="scripted",
        command=("run-agent", "--model", "big one"),
        timeout_seconds=90.5,
        workspace="ws",
    )


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"VIBEY_WORKFLOW_DEFINITIONS": "no_colon"}, "VIBEY_WORKFLOW_DEFINITIONS"),
        ({"VIBEY_WORKFLOW_DEFINITIONS": "a b:X"}, "VIBEY_WORKFLOW_DEFINITIONS"),
        ({"VIBEY_WORKFLOW_DEFAULT_DEFINITION": "  "}, "VIBEY_WORKFLOW_DEFAULT_DEFINITION"),
        ({"VIBEY_ENGINE_NAME": "magic"}, "'magic' is not one of scripted, command"),
        ({"VIBEY_ENGINE_NAME": "command"}, "the command engine needs a command"),
        ({"VIBEY_ENGINE_COMMAND": "agent 'unclosed"}, "VIBEY_ENGINE_COMMAND is not a command"),
        ({"VIBEY_ENGINE_TIMEOUT": "0"}, "VIBEY_ENGINE_TIMEOUT"),
        ({"VIBEY_ENGINE_TIMEOUT": "nan"}, "VIBEY_ENGINE_TIMEOUT"),
        ({"VIBEY_ENGINE_TIMEOUT": "1e12"}, "at most"),
        ({"VIBEY_ENGINE_TIMEOUT": "soon"}, "VIBEY_ENGINE_TIMEOUT must be a number of seconds"),
        ({"VIBEY_ENGINE_WORKSPACE": " "}, "VIBEY_ENGINE_WORKSPACE"),
    ],
)
def test_bad_values_are_one_line_errors(empty_dir: Path, env: dict[str, str], named: str) -> None:
    assert named in settings_error(env, empty_dir)


@pytest.mark.parametrize(
    ("section", "line", "key"),
    [
        ("workflow", "definitions = 5", "definitions"),
        ("workflow", "default_definition = ['a']", "default_definition"),
        ("engine", "name = 1", "name"),
        ("engine", "command = 'agent --x'", "command"),
        ("engine", "command = ['agent', 1]", "command"),
        ("engine", "timeout_seconds = '60'", "timeout_seconds"),
        ("engine", "workspace = false", "workspace"),
        ("engine", "timeout = 60", "'timeout'"),
        ("workflow", "definition = 'x'", "'definition'"),
    ],
)
def test_wrong_types_and_unknown_keys_in_toml_are_errors(
    tmp_path: Path, section: str, line: str, key: str
) -> None:
    write_toml(tmp_path, f"[{section}]\n{line}\n")
    message = settings_error({}, tmp_path)
    assert key in message
    assert f"[{section}]" in message


def test_the_worker_gets_the_engine_and_the_definitions(empty_dir: Path) -> None:
    env = {
        "VIBEY_PG_URL": PG,
        "VIBEY_AMQP_URL": AMQP,
        "VIBEY_WORKFLOW_DEFINITIONS": "tests.acceptance.tiny_definition:DEFINITIONS",
        "VIBEY_ENGINE_COMMAND": "agent --go",
        "VIBEY_ENGINE_TIMEOUT": "30",
        "VIBEY_ENGINE_WORKSPACE": "/w",
    }
    config = worker_config(load_settings(env, empty_dir))
    assert config.workflow.definitions == "tests.acceptance.tiny_definition:DEFINITIONS"
    assert config.engine.command == ("agent", "--go")
    assert config.engine.timeout_seconds == 30
    assert config.engine.workspace == "/w"
    assert config.workflow.archive_after_seconds == 30 * 86400  # the default window


def test_the_workflow_retention_comes_from_the_settings_and_must_be_positive(
    tmp_path: Path,
) -> None:
    write_toml(tmp_path, "[workflow]\narchive_after_seconds = 3600\n")
    env = {"VIBEY_PG_URL": PG, "VIBEY_AMQP_URL": AMQP}
    assert worker_config(load_settings(env, tmp_path)).workflow.archive_after_seconds == 3600
    env["VIBEY_WORKFLOW_ARCHIVE_AFTER"] = "0"
    message = settings_error(env, tmp_path)
    assert "VIBEY_WORKFLOW_ARCHIVE_AFTER" in message and "[workflow]" in message


@pytest.mark.parametrize(
    ("path", "named"),
    [
        ("no_such_module_here:DEFS", "ModuleNotFoundError"),
        ("tests.acceptance.tiny_definition:NOPE", "AttributeError"),
        ("tests.acceptance.tiny_definition:NAME", "AttributeError"),  # a str, not definitions
    ],
)
def test_definitions_that_cannot_load_are_refused_before_a_worker_starts(
    empty_dir: Path, path: str, named: str
) -> None:
    settings = load_settings(
        {"VIBEY_PG_URL": PG, "VIBEY_AMQP_URL": AMQP, "VIBEY_WORKFLOW_DEFINITIONS": path},
        empty_dir,
    )
    for attempt in (lambda: worker_config(settings), lambda: load_registry(settings)):
        with pytest.raises(SettingsError, match=named) as caught:
            attempt()
        message = str(caught.value)
        assert "fix VIBEY_WORKFLOW_DEFINITIONS (or definitions under [workflow])" in message
        assert "\n" not in message


def test_load_registry_registers_the_named_definitions(empty_dir: Path) -> None:
    env = {"VIBEY_WORKFLOW_DEFINITIONS": "tests.acceptance.tiny_definition:DEFINITIONS"}
    assert load_registry(load_settings(env, empty_dir)).known() == ["tiny v1"]


def test_spend_caps_reach_the_worker_and_bad_ones_are_refused(empty_dir: Path) -> None:
    env = {
        "VIBEY_PG_URL": PG,
        "VIBEY_AMQP_URL": AMQP,
        "VIBEY_ENGINE_MAX_DOLLARS": "12.5",
        "VIBEY_ENGINE_MAX_TURNS": "40",
    }
    settings = load_settings(env, empty_dir)
    assert (settings.engine.max_dollars, settings.engine.max_turns) == (12.5, 40)
    config = worker_config(settings)
    assert (config.engine.max_dollars, config.engine.max_turns) == (12.5, 40)
    assert load_settings({}, empty_dir).engine.max_dollars is None
    with pytest.raises(SettingsError, match="VIBEY_ENGINE_MAX_TURNS"):
        load_settings({"VIBEY_ENGINE_MAX_TURNS": "0"}, empty_dir)
    with pytest.raises(SettingsError, match="VIBEY_ENGINE_MAX_TURNS must be an integer"):
        load_settings({"VIBEY_ENGINE_MAX_TURNS": "many"}, empty_dir)


@pytest.mark.parametrize(
    ("url", "vhost", "expected"),
    [
        ("amqp://g:g@h:5672/", "team", "amqp://g:g@h:5672/team"),
        ("amqp://g:g@h:5672", "a/b", "amqp://g:g@h:5672/a%2Fb"),
        ("amqp://g:g@h:5672/x", "/", "amqp://g:g@h:5672/x"),
        ("amqp://g:g@h:5672/x", "x", "amqp://g:g@h:5672/x"),
    ],
)
def test_the_bus_vhost_applies_to_a_url_that_names_none(
    empty_dir: Path, url: str, vhost: str, expected: str
) -> None:
    settings = load_settings({"VIBEY_AMQP_URL": url, "VIBEY_BUS_VHOST": vhost}, empty_dir)
    assert settings.bus.amqp_url == expected


def test_a_url_naming_another_vhost_than_the_bus_is_an_error(empty_dir: Path) -> None:
    env = {"VIBEY_AMQP_URL": "amqp://g:g@h:5672/x", "VIBEY_BUS_VHOST": "y"}
    with pytest.raises(SettingsError, match="names vhost 'x' but the bus vhost is 'y'"):
        load_settings(env, empty_dir)


def test_the_default_workflow_budget_comes_from_toml_or_the_environment(tmp_path: Path) -> None:
    assert load_settings({}, tmp_path).workflow.budget() is None
    write_toml(tmp_path, "[workflow]\nbudget_dollars = 25\nbudget_tokens = 400000\n")
    assert load_settings({}, tmp_path).workflow.budget() == Budget(dollars=25.0, tokens=400000)
    env = {"VIBEY_WORKFLOW_BUDGET_DOLLARS": "7.5", "VIBEY_WORKFLOW_BUDGET_TOKENS": "1000"}
    assert load_settings(env, tmp_path).workflow.budget() == Budget(dollars=7.5, tokens=1000)


@pytest.mark.parametrize(
    ("env", "named"),
    [
        ({"VIBEY_WORKFLOW_BUDGET_DOLLARS": "0"}, "VIBEY_WORKFLOW_BUDGET_DOLLARS"),
        ({"VIBEY_WORKFLOW_BUDGET_DOLLARS": "-2"}, "more than 0"),
        ({"VIBEY_WORKFLOW_BUDGET_DOLLARS": "nan"}, "more than 0"),
        (
            {"VIBEY_WORKFLOW_BUDGET_DOLLARS": "lots"},
            "VIBEY_WORKFLOW_BUDGET_DOLLARS must be a number",
        ),
        ({"VIBEY_WORKFLOW_BUDGET_TOKENS": "0"}, "VIBEY_WORKFLOW_BUDGET_TOKENS"),
        (
            {"VIBEY_WORKFLOW_BUDGET_TOKENS": "1.5"},
            "VIBEY_WORKFLOW_BUDGET_TOKENS must be an integer",
        ),
    ],
)
def test_a_bad_default_budget_is_a_one_line_error(
    empty_dir: Path, env: dict[str, str], named: str
) -> None:
    error = settings_error(env, empty_dir)
    assert named in error and "\n" not in error
