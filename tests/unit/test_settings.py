"""vibey.settings: sources, precedence, strictness and every validation error."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vibey.settings import (
    DatabaseNotConfigured,
    QueueBackendNotConfigured,
    Settings,
    SettingsError,
    load_settings,
)
from workflows.job import LeasePolicy

PG = "postgresql://vibey@127.0.0.1:5432/vibey"
AMQP = "amqp://guest:guest@127.0.0.1:5672/"


@pytest.fixture(scope="module")
def empty_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cwd with no vibey.toml (module-scoped, so hypothesis tests may use it)."""
    return tmp_path_factory.mktemp("no_config")


def write_toml(directory: Path, body: str, name: str = "vibey.toml") -> Path:
    path = directory / name
    path.write_text(body, encoding="utf-8")
    return path


def settings_error(
    env: Mapping[str, str], cwd: Path, expected: type[SettingsError] = SettingsError
) -> str:
    """The message of the SettingsError that loading raises; it must be exactly one line."""
    with pytest.raises(expected) as caught:
        load_settings(env, cwd)
    message = str(caught.value)
    assert message and "\n" not in message, f"not one line: {message!r}"
    return message


# --- sources and precedence -------------------------------------------------------------------


def test_defaults_with_no_file_and_no_environment(empty_dir: Path) -> None:
    settings = load_settings({}, empty_dir)
    assert settings == Settings()
    assert settings.config_file is None
    assert settings.database.url is None
    assert (settings.database.pool_min, settings.database.pool_max) == (1, 10)
    assert settings.queue.backend == "rabbitmq"
    assert settings.queue.poll_interval_seconds == 5.0
    assert settings.queue.max_attempts == 5
    assert settings.queue.lease == LeasePolicy()
    assert (settings.bus.amqp_url, settings.bus.prefix, settings.bus.vhost) == (None, "vibey", "/")


FULL_TOML = f"""
[database]
url = "{PG}"
pool_min = 2
pool_max = 4

[queue]
backend = "postgres"
poll_interval_seconds = 2
max_attempts = 3

[bus]
amqp_url = "{AMQP}"
prefix = "tomlprefix"
vhost = "/toml"
"""

Getter = Callable[[Settings], Any]

# (environment variable, the value it sets, how to read it back, the TOML value it must beat)
OVERRIDES: list[tuple[str, str, Getter, Any]] = [
    ("VIBEY_PG_URL", "postgres://env@db:5432/env", lambda s: s.database.url, PG),
    ("VIBEY_PG_POOL_MIN", "3", lambda s: s.database.pool_min, 2),
    ("VIBEY_PG_POOL_MAX", "9", lambda s: s.database.pool_max, 4),
    ("VIBEY_QUEUE_BACKEND", "rabbitmq", lambda s: s.queue.backend, "postgres"),
    ("VIBEY_QUEUE_POLL_INTERVAL", "0.25", lambda s: s.queue.poll_interval_seconds, 2.0),
    ("VIBEY_QUEUE_MAX_ATTEMPTS", "8", lambda s: s.queue.max_attempts, 3),
    ("VIBEY_AMQP_URL", "amqps://u:p@mq:5671/", lambda s: s.bus.amqp_url, AMQP),
    ("VIBEY_BUS_PREFIX", "envprefix", lambda s: s.bus.prefix, "tomlprefix"),
    ("VIBEY_BUS_VHOST", "/env", lambda s: s.bus.vhost, "/toml"),
]


@pytest.mark.parametrize(("variable", "raw", "get", "toml_value"), OVERRIDES)
def test_environment_wins_over_toml(
    tmp_path: Path, variable: str, raw: str, get: Getter, toml_value: Any
) -> None:
    write_toml(tmp_path, FULL_TOML)
    assert get(load_settings({}, tmp_path)) == toml_value
    overridden = get(load_settings({variable: raw}, tmp_path))
    assert overridden != toml_value
    assert str(overridden) == raw or overridden == type(toml_value)(raw)


def test_toml_values_are_read_with_their_types(tmp_path: Path) -> None:
    path = write_toml(tmp_path, FULL_TOML)
    settings = load_settings({}, tmp_path)
    assert settings.config_file == path
    assert settings.database.url == PG
    assert isinstance(settings.queue.poll_interval_seconds, float)
    assert settings.queue.poll_interval_seconds == 2.0
    assert settings.bus.amqp_url == AMQP


def test_an_empty_variable_counts_as_unset(tmp_path: Path) -> None:
    write_toml(tmp_path, FULL_TOML)
    settings = load_settings({"VIBEY_PG_URL": "", "VIBEY_PG_POOL_MAX": ""}, tmp_path)
    assert settings.database.url == PG
    assert settings.database.pool_max == 4


def test_vibey_config_names_the_file_relative_to_cwd(tmp_path: Path) -> None:
    write_toml(tmp_path, "[queue]\nmax_attempts = 7\n")  # ./vibey.toml, which must be ignored
    (tmp_path / "conf").mkdir()
    named = write_toml(tmp_path / "conf", "[queue]\nmax_attempts = 9\n", name="other.toml")
    settings = load_settings({"VIBEY_CONFIG": "conf/other.toml"}, tmp_path)
    assert settings.queue.max_attempts == 9
    assert settings.config_file == named


def test_a_missing_vibey_config_file_is_an_error(empty_dir: Path) -> None:
    message = settings_error({"VIBEY_CONFIG": "nowhere.toml"}, empty_dir)
    assert "VIBEY_CONFIG" in message
    assert "nowhere.toml" in message


def test_load_settings_defaults_to_the_process_environment_and_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_toml(tmp_path, "[queue]\nmax_attempts = 6\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VIBEY_PG_URL", PG)
    settings = load_settings()
    assert settings.database.url == PG
    assert settings.queue.max_attempts == 6


def test_settings_are_frozen(empty_dir: Path) -> None:
    settings = load_settings({}, empty_dir)
    with pytest.raises(dataclasses.FrozenInstanceError):
        settings.database.url = PG  # type: ignore[misc]


# --- strictness and validation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ("[databse]\nurl = 'x'\n", "[databse]"),
        ("[database]\nuri = 'postgresql://h/d'\n", "'uri'"),
        ("[queue]\nbackends = 'postgres'\n", "'backends'"),
        ("[bus]\nexchange = 'x'\n", "'exchange'"),
        ("top_level = 1\n", "[top_level]"),
    ],
)
def test_unknown_sections_and_keys_are_errors(tmp_path: Path, body: str, named: str) -> None:
    write_toml(tmp_path, body)
    message = settings_error({}, tmp_path)
    assert named in message
    assert "known" in message


def test_invalid_toml_is_an_error(tmp_path: Path) -> None:
    path = write_toml(tmp_path, "[database\nurl = \n")
    message = settings_error({}, tmp_path)
    assert str(path) in message


@pytest.mark.parametrize(
    ("section", "line", "key"),
    [
        ("database", "url = 5", "url"),
        ("database", "pool_min = '2'", "pool_min"),
        ("database", "pool_max = 2.5", "pool_max"),
        ("database", "pool_max = true", "pool_max"),
        ("queue", "backend = ['postgres']", "backend"),
        ("queue", "poll_interval_seconds = 'fast'", "poll_interval_seconds"),
        ("queue", "max_attempts = 3.0", "max_attempts"),
        ("queue", "lease_seconds = 30", "lease_seconds"),
        ("bus", "prefix = 1", "prefix"),
        ("bus", "amqp_url = false", "amqp_url"),
    ],
)
def test_wrong_types_in_toml_are_errors(tmp_path: Path, section: str, line: str, key: str) -> None:
    write_toml(tmp_path, f"[{section}]\n{line}\n")
    message = settings_error({}, tmp_path)
    assert key in message
    assert f"[{section}]" in message


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("VIBEY_PG_POOL_MIN", "two"),
        ("VIBEY_PG_POOL_MAX", "1.5"),
        ("VIBEY_QUEUE_MAX_ATTEMPTS", "5 times"),
        ("VIBEY_QUEUE_POLL_INTERVAL", "soon"),
        ("VIBEY_QUEUE_LEASE_SECONDS_DEFAULT", "2m"),
    ],
)
def test_unparseable_numbers_in_the_environment_are_errors(
    empty_dir: Path, variable: str, raw: str
) -> None:
    message = settings_error({variable: raw}, empty_dir)
    assert variable in message
    assert repr(raw) in message


@given(pool_min=st.integers(-3, 40), pool_max=st.integers(-3, 40))
def test_pool_sizes_are_accepted_exactly_when_ordered_and_not_negative(
    empty_dir: Path, pool_min: int, pool_max: int
) -> None:
    env = {"VIBEY_PG_POOL_MIN": str(pool_min), "VIBEY_PG_POOL_MAX": str(pool_max)}
    if 0 <= pool_min <= pool_max and pool_max >= 1:
        database = load_settings(env, empty_dir).database
        assert (database.pool_min, database.pool_max) == (pool_min, pool_max)
    else:
        message = settings_error(env, empty_dir)
        assert f"pool_min={pool_min}" in message
        assert f"pool_max={pool_max}" in message


@given(pool_min=st.integers(0, 1000), pool_max=st.integers(0, 1000))
def test_pool_sizes_from_toml_follow_the_same_rule(
    tmp_path_factory: pytest.TempPathFactory, pool_min: int, pool_max: int
) -> None:
    directory = tmp_path_factory.mktemp("pool")
    write_toml(directory, f"[database]\npool_min = {pool_min}\npool_max = {pool_max}\n")
    valid = pool_min <= pool_max and pool_max >= 1
    if valid:
        assert load_settings({}, directory).database.pool_max == pool_max
    else:
        settings_error({}, directory)


@pytest.mark.parametrize("backend", ["redis", "Postgres", "rabbit", "sqs"])
def test_an_unknown_queue_backend_is_an_error(tmp_path: Path, backend: str) -> None:
    message = settings_error({"VIBEY_QUEUE_BACKEND": backend}, tmp_path)
    assert repr(backend) in message
    assert "rabbitmq, postgres" in message
    write_toml(tmp_path, f"[queue]\nbackend = '{backend}'\n")
    assert repr(backend) in settings_error({}, tmp_path)


@pytest.mark.parametrize(
    "url",
    [
        "mysql://root:hunter2@db/app",
        "postgresql+psycopg://u:hunter2@h/d",
        "sqlite:///vibey.db",
        "hunter2@127.0.0.1:5432/db",
    ],
)
def test_a_database_url_must_be_postgresql(empty_dir: Path, url: str) -> None:
    message = settings_error({"VIBEY_PG_URL": url}, empty_dir)
    assert "postgresql://" in message
    assert "hunter2" not in message  # never echo a password


@pytest.mark.parametrize("url", ["postgresql://u@h:5432/d", "postgres://u:p@h/d"])
def test_both_postgresql_schemes_are_accepted(empty_dir: Path, url: str) -> None:
    assert load_settings({"VIBEY_PG_URL": url}, empty_dir).require_database_url() == url


def test_an_amqp_url_must_be_amqp(empty_dir: Path) -> None:
    message = settings_error({"VIBEY_AMQP_URL": "http://guest:hunter2@mq/"}, empty_dir)
    assert "amqp://" in message
    assert "hunter2" not in message


@pytest.mark.parametrize("raw", ["0", "-1", "nan", "inf"])
def test_the_poll_interval_must_be_positive_and_finite(empty_dir: Path, raw: str) -> None:
    assert "VIBEY_QUEUE_POLL_INTERVAL" in settings_error(
        {"VIBEY_QUEUE_POLL_INTERVAL": raw}, empty_dir
    )


def test_max_attempts_must_be_at_least_one(empty_dir: Path) -> None:
    assert "VIBEY_QUEUE_MAX_ATTEMPTS" in settings_error(
        {"VIBEY_QUEUE_MAX_ATTEMPTS": "0"}, empty_dir
    )


def test_an_empty_bus_prefix_is_an_error(tmp_path: Path) -> None:
    write_toml(tmp_path, "[bus]\nprefix = ''\n")
    assert "prefix" in settings_error({}, tmp_path)


# --- leases -----------------------------------------------------------------------------------


def test_lease_overrides_reach_the_lease_policy(tmp_path: Path) -> None:
    write_toml(
        tmp_path,
        "[queue.lease_seconds]\n"
        "default = 60\n"
        '"build.implement" = 10\n'
        '"build.plan" = 30.5\n',  # an alias: stored under build.decompose
    )
    lease = load_settings({}, tmp_path).queue.lease
    assert lease.default == timedelta(seconds=60)
    assert lease.lease_for("design.spec") == timedelta(seconds=60)
    assert lease.lease_for("build.implement") == timedelta(seconds=10)
    assert lease.lease_for("build.decompose") == timedelta(seconds=30.5)
    assert lease.lease_for("build.verify") == timedelta(hours=2)  # untouched shipped default


def test_the_environment_sets_the_default_lease_over_toml(tmp_path: Path) -> None:
    write_toml(tmp_path, "[queue.lease_seconds]\ndefault = 60\n")
    env = {"VIBEY_QUEUE_LEASE_SECONDS_DEFAULT": "90"}
    assert load_settings(env, tmp_path).queue.lease.default == timedelta(seconds=90)


def test_an_unknown_job_kind_in_lease_seconds_is_an_error(tmp_path: Path) -> None:
    write_toml(tmp_path, '[queue.lease_seconds]\n"build.teleport" = 10\n')
    message = settings_error({}, tmp_path)
    assert "'build.teleport'" in message
    assert "build.implement" in message  # the registered kinds are listed


@pytest.mark.parametrize("value", ["0", "-5", "'long'", "3000000"])
def test_a_lease_must_be_a_positive_number_that_fits_lease_ms(tmp_path: Path, value: str) -> None:
    write_toml(tmp_path, f'[queue.lease_seconds]\n"build.verify" = {value}\n')
    assert "build.verify" in settings_error({}, tmp_path)


def test_an_unquoted_dotted_kind_gets_a_hint(tmp_path: Path) -> None:
    write_toml(tmp_path, "[queue.lease_seconds]\nbuild.verify = 10\n")
    assert "quote" in settings_error({}, tmp_path)


# --- the requirements commands state ----------------------------------------------------------


def test_require_database_url_names_the_fix(empty_dir: Path) -> None:
    settings = load_settings({}, empty_dir)
    with pytest.raises(DatabaseNotConfigured) as caught:
        settings.require_database_url()
    assert isinstance(caught.value, SettingsError)
    assert str(caught.value) == (
        "VIBEY_PG_URL is not set: export VIBEY_PG_URL=postgresql://USER@HOST:5432/DB "
        "(or run `just up`, which writes .env)"
    )


def test_require_database_url_returns_the_configured_url(empty_dir: Path) -> None:
    assert load_settings({"VIBEY_PG_URL": PG}, empty_dir).require_database_url() == PG


def test_require_amqp_url_names_both_fixes(empty_dir: Path) -> None:
    settings = load_settings({}, empty_dir)
    with pytest.raises(QueueBackendNotConfigured) as caught:
        settings.require_amqp_url()
    message = str(caught.value)
    assert isinstance(caught.value, SettingsError)
    assert "\n" not in message
    assert "export VIBEY_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/" in message
    assert 'backend = "postgres" under [queue] in vibey.toml' in message
    assert "VIBEY_QUEUE_BACKEND=postgres" in message


def test_require_amqp_url_returns_the_configured_url(empty_dir: Path) -> None:
    assert load_settings({"VIBEY_AMQP_URL": AMQP}, empty_dir).require_amqp_url() == AMQP


def test_require_amqp_url_on_the_postgres_backend_does_not_suggest_it_again(
    empty_dir: Path,
) -> None:
    settings = load_settings({"VIBEY_QUEUE_BACKEND": "postgres"}, empty_dir)
    with pytest.raises(QueueBackendNotConfigured) as caught:
        settings.require_amqp_url()
    assert "VIBEY_AMQP_URL" in str(caught.value)
    assert "VIBEY_QUEUE_BACKEND" not in str(caught.value)
