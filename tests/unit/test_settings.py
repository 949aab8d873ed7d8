"""vibey.settings: sources, precedence, strictness and every validation error."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic import ValidationError

from actors.worker import WorkerConfig
from vibey.settings import (
    MAX_INTERVAL_SECONDS,
    BusSettings,
    DatabaseNotConfigured,
    DatabaseSettings,
    QueueBackendNotConfigured,
    RabbitMqSettings,
    Settings,
    SettingsError,
    WorkerSettings,
    check_project_ids,
    load_settings,
    replace,
    split_list,
)
from vibey.wiring import worker_config
from workflows.dispatch import DEFAULT_WAIT_TIERS, MAX_PROJECT_ID_CHARS, Lane, WaitTiers
from workflows.job import LeasePolicy
from workflows.protocol.kinds import STEP_KINDS

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
    assert settings.queue.lease == LeasePolicy()
    assert (settings.bus.amqp_url, settings.bus.prefix, settings.bus.vhost) == (None, "vibey", "/")


def test_rabbitmq_and_worker_defaults(empty_dir: Path) -> None:
    settings = load_settings({}, empty_dir)
    rabbitmq, worker = settings.queue.rabbitmq, settings.worker
    assert rabbitmq == RabbitMqSettings()
    assert rabbitmq.wait_tiers == DEFAULT_WAIT_TIERS
    assert rabbitmq.wait_tiers == WaitTiers.from_seconds([1, 5, 30, 120, 600, 3600])
    assert rabbitmq.delivery_limit == 20
    assert rabbitmq.reconcile_interval_seconds == 30
    assert rabbitmq.redispatch_after_seconds == 120
    assert rabbitmq.reclaim_after_seconds == 30
    assert rabbitmq.consumer_timeout_seconds == 21600
    assert rabbitmq.dedicated_projects == ()
    assert rabbitmq.prefetch is None
    assert worker == WorkerSettings()
    assert (worker.processes, worker.threads) == (2, 8)
    assert worker.lanes == ("interactive", "build") == tuple(lane.value for lane in Lane)
    assert worker.handlers == "actors.handlers:build_handlers"


FULL_TOML = f"""
[database]
url = "{PG}"
pool_min = 2
pool_max = 4

[queue]
backend = "postgres"
poll_interval_seconds = 2

[queue.rabbitmq]
wait_tiers_seconds = [1.5, 10]
delivery_limit = 5
reconcile_interval_seconds = 10
redispatch_after_seconds = 60
reclaim_after_seconds = 20
consumer_timeout_seconds = 9000
dedicated_projects = ["gamma"]
prefetch = 3

[bus]
amqp_url = "{AMQP}"
prefix = "tomlprefix"
vhost = "/toml"

[worker]
processes = 3
threads = 4
lanes = ["interactive"]
handlers = "tests.handlers:TOML"
"""

Getter = Callable[[Settings], Any]

# (environment variable, the value it sets, how to read it back, the TOML value it must beat)
OVERRIDES: list[tuple[str, str, Getter, Any]] = [
    ("VIBEY_PG_URL", "postgres://env@db:5432/env", lambda s: s.database.url, PG),
    ("VIBEY_PG_POOL_MIN", "3", lambda s: s.database.pool_min, 2),
    ("VIBEY_PG_POOL_MAX", "9", lambda s: s.database.pool_max, 4),
    ("VIBEY_QUEUE_BACKEND", "rabbitmq", lambda s: s.queue.backend, "postgres"),
    ("VIBEY_QUEUE_POLL_INTERVAL", "0.25", lambda s: s.queue.poll_interval_seconds, 2.0),
    # (the vhost "/toml" is applied to either URL, which names none: compare without it)
    (
        "VIBEY_AMQP_URL",
        "amqps://u:p@mq:5671/",
        lambda s: str(s.bus.amqp_url).rsplit("/", 1)[0] + "/",
        AMQP,
    ),
    ("VIBEY_BUS_PREFIX", "envprefix", lambda s: s.bus.prefix, "tomlprefix"),
    ("VIBEY_BUS_VHOST", "/env", lambda s: s.bus.vhost, "/toml"),
    ("VIBEY_QUEUE_DELIVERY_LIMIT", "7", lambda s: s.queue.rabbitmq.delivery_limit, 5),
    (
        "VIBEY_QUEUE_RECONCILE_INTERVAL",
        "12.5",
        lambda s: s.queue.rabbitmq.reconcile_interval_seconds,
        10.0,
    ),
    (
        "VIBEY_QUEUE_REDISPATCH_AFTER",
        "90",
        lambda s: s.queue.rabbitmq.redispatch_after_seconds,
        60.0,
    ),
    ("VIBEY_QUEUE_RECLAIM_AFTER", "15", lambda s: s.queue.rabbitmq.reclaim_after_seconds, 20.0),
    (
        "VIBEY_QUEUE_CONSUMER_TIMEOUT",
        "7200",
        lambda s: s.queue.rabbitmq.consumer_timeout_seconds,
        9000.0,
    ),
    ("VIBEY_QUEUE_PREFETCH", "4", lambda s: s.queue.rabbitmq.prefetch, 3),
    ("VIBEY_WORKER_PROCESSES", "5", lambda s: s.worker.processes, 3),
    ("VIBEY_WORKER_THREADS", "16", lambda s: s.worker.threads, 4),
    ("VIBEY_WORKER_HANDLERS", "pkg.mod:ENV", lambda s: s.worker.handlers, "tests.handlers:TOML"),
]

# The same for the list-valued settings: comma-separated in the environment.
LIST_OVERRIDES: list[tuple[str, str, Getter, Any, Any]] = [
    (
        "VIBEY_QUEUE_WAIT_TIERS",
        "200, 2,20",
        lambda s: s.queue.rabbitmq.wait_tiers,
        WaitTiers.from_seconds([1.5, 10]),
        WaitTiers.from_seconds([2, 20, 200]),
    ),
    (
        "VIBEY_QUEUE_DEDICATED_PROJECTS",
        "alpha, beta",
        lambda s: s.queue.rabbitmq.dedicated_projects,
        ("gamma",),
        ("alpha", "beta"),
    ),
    ("VIBEY_WORKER_LANES", "build", lambda s: s.worker.lanes, ("interactive",), ("build",)),
    (
        "VIBEY_WORKER_LANES",
        "build,interactive",
        lambda s: s.worker.lanes,
        ("interactive",),
        ("build", "interactive"),
    ),
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


@pytest.mark.parametrize(("variable", "raw", "get", "toml_value", "env_value"), LIST_OVERRIDES)
def test_the_environment_wins_over_toml_for_lists(
    tmp_path: Path, variable: str, raw: str, get: Getter, toml_value: Any, env_value: Any
) -> None:
    write_toml(tmp_path, FULL_TOML)
    assert get(load_settings({}, tmp_path)) == toml_value
    assert get(load_settings({variable: raw}, tmp_path)) == env_value


def test_toml_values_are_read_with_their_types(tmp_path: Path) -> None:
    path = write_toml(tmp_path, FULL_TOML)
    settings = load_settings({}, tmp_path)
    assert settings.config_file == path
    assert settings.database.url == PG
    assert isinstance(settings.queue.poll_interval_seconds, float)
    assert settings.queue.poll_interval_seconds == 2.0
    assert settings.bus.amqp_url == AMQP + "%2Ftoml"  # [bus] vhost fills a URL naming none


def test_an_empty_variable_counts_as_unset(tmp_path: Path) -> None:
    write_toml(tmp_path, FULL_TOML)
    settings = load_settings({"VIBEY_PG_URL": "", "VIBEY_PG_POOL_MAX": ""}, tmp_path)
    assert settings.database.url == PG
    assert settings.database.pool_max == 4


def test_vibey_config_names_the_file_relative_to_cwd(tmp_path: Path) -> None:
    write_toml(tmp_path, "[queue]\npoll_interval_seconds = 7\n")  # ./vibey.toml: ignored
    (tmp_path / "conf").mkdir()
    named = write_toml(tmp_path / "conf", "[queue]\npoll_interval_seconds = 9\n", name="other.toml")
    settings = load_settings({"VIBEY_CONFIG": "conf/other.toml"}, tmp_path)
    assert settings.queue.poll_interval_seconds == 9
    assert settings.config_file == named


def test_a_missing_vibey_config_file_is_an_error(empty_dir: Path) -> None:
    message = settings_error({"VIBEY_CONFIG": "nowhere.toml"}, empty_dir)
    assert "VIBEY_CONFIG" in message
    assert "nowhere.toml" in message


def test_load_settings_defaults_to_the_process_environment_and_cwd(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_toml(tmp_path, "[queue]\npoll_interval_seconds = 6\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("VIBEY_PG_URL", PG)
    settings = load_settings()
    assert settings.database.url == PG
    assert settings.queue.poll_interval_seconds == 6


def test_settings_are_frozen(empty_dir: Path) -> None:
    settings = load_settings({}, empty_dir)
    with pytest.raises(ValidationError, match="frozen"):
        settings.database.url = PG


# --- strictness and validation ----------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ("[databse]\nurl = 'x'\n", "[databse]"),
        ("[database]\nuri = 'postgresql://h/d'\n", "'uri'"),
        ("[queue]\nbackends = 'postgres'\n", "'backends'"),
        ("[bus]\nexchange = 'x'\n", "'exchange'"),
        ("top_level = 1\n", "[top_level]"),
        ("[queue.rabbitmq]\ntiers = [1]\n", "'tiers'"),
        ("[queue.rabbitmq]\nwait_tiers = [1]\n", "'wait_tiers'"),
        ("[queue.rabbit]\nprefetch = 1\n", "'rabbit'"),
        ("[worker]\nthread = 2\n", "'thread'"),
        ("[workers]\nthreads = 2\n", "[workers]"),
    ],
)
def test_unknown_sections_and_keys_are_errors(tmp_path: Path, body: str, named: str) -> None:
    path = write_toml(tmp_path, body)
    message = settings_error({}, tmp_path)
    assert named in message
    assert "known" in message
    assert message.startswith(f"{path}: ")  # the file it is in


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
        ("queue", "lease_seconds = 30", "lease_seconds"),
        ("bus", "prefix = 1", "prefix"),
        ("bus", "amqp_url = false", "amqp_url"),
        ("queue.rabbitmq", "wait_tiers_seconds = '1,5'", "wait_tiers_seconds"),
        ("queue.rabbitmq", "wait_tiers_seconds = [1, '5']", "wait_tiers_seconds"),
        ("queue.rabbitmq", "wait_tiers_seconds = [1, true]", "wait_tiers_seconds"),
        ("queue.rabbitmq", "delivery_limit = 2.5", "delivery_limit"),
        ("queue.rabbitmq", "reconcile_interval_seconds = '30s'", "reconcile_interval_seconds"),
        ("queue.rabbitmq", "redispatch_after_seconds = [120]", "redispatch_after_seconds"),
        ("queue.rabbitmq", "reclaim_after_seconds = false", "reclaim_after_seconds"),
        ("queue.rabbitmq", "consumer_timeout_seconds = '2'", "consumer_timeout_seconds"),
        ("queue.rabbitmq", "dedicated_projects = 'p1'", "dedicated_projects"),
        ("queue.rabbitmq", "dedicated_projects = [1]", "dedicated_projects"),
        ("queue.rabbitmq", "prefetch = true", "prefetch"),
        ("worker", "processes = '2'", "processes"),
        ("worker", "threads = 8.0", "threads"),
        ("worker", "lanes = 'build'", "lanes"),
        ("worker", "handlers = 5", "handlers"),
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
        ("VIBEY_QUEUE_POLL_INTERVAL", "soon"),
        ("VIBEY_QUEUE_LEASE_SECONDS_DEFAULT", "2m"),
        ("VIBEY_QUEUE_DELIVERY_LIMIT", "lots"),
        ("VIBEY_QUEUE_PREFETCH", "1.5"),
        ("VIBEY_QUEUE_RECONCILE_INTERVAL", "30s"),
        ("VIBEY_QUEUE_REDISPATCH_AFTER", "2m"),
        ("VIBEY_QUEUE_RECLAIM_AFTER", "half a minute"),
        ("VIBEY_QUEUE_CONSUMER_TIMEOUT", "2 s"),
        ("VIBEY_QUEUE_WAIT_TIERS", "1,5s,30"),
        ("VIBEY_QUEUE_WAIT_TIERS", "1 5 30"),
        ("VIBEY_WORKER_PROCESSES", "two"),
        ("VIBEY_WORKER_THREADS", "8x"),
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


@pytest.mark.parametrize(
    ("variable", "section", "line"),
    [
        ("VIBEY_QUEUE_MAX_ATTEMPTS", "queue", "max_attempts = 3"),
        ("VIBEY_QUEUE_FIRST_CLAIM_WAIT", "queue.rabbitmq", "first_claim_wait_seconds = 1"),
    ],
)
def test_a_removed_setting_is_an_error_naming_why(
    tmp_path: Path, empty_dir: Path, variable: str, section: str, line: str
) -> None:
    assert "was removed" in settings_error({variable: "3"}, empty_dir)
    assert variable in settings_error({variable: "3"}, empty_dir)
    write_toml(tmp_path, f"[{section}]\n{line}\n")
    message = settings_error({}, tmp_path)
    assert "was removed" in message and "nothing read it" in message


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
    lease = load_settings({}, tmp_path).queue.lease.resolved(STEP_KINDS.canonical)
    assert lease.default == timedelta(seconds=60)
    assert lease.lease_for("design.spec") == timedelta(seconds=60)
    assert lease.lease_for("build.implement") == timedelta(seconds=10)
    assert lease.lease_for("build.decompose") == timedelta(seconds=30.5)
    # An untouched kind keeps its declared lease (the protocol's build.verify: 2 h).
    declared = STEP_KINDS["build.verify"].lease
    assert lease.lease_for("build.verify", declared) == timedelta(hours=2)


def test_the_environment_sets_the_default_lease_over_toml(tmp_path: Path) -> None:
    write_toml(tmp_path, "[queue.lease_seconds]\ndefault = 60\n")
    env = {"VIBEY_QUEUE_LEASE_SECONDS_DEFAULT": "90"}
    assert load_settings(env, tmp_path).queue.lease.default == timedelta(seconds=90)


def test_a_lease_for_what_is_not_a_kind_name_is_an_error(tmp_path: Path) -> None:
    write_toml(tmp_path, '[queue.lease_seconds]\n"Build Teleport" = 10\n')
    message = settings_error({}, tmp_path)
    assert "'Build Teleport'" in message and "not a job kind" in message


def test_an_undeclared_job_kind_in_lease_seconds_fails_the_worker_start(tmp_path: Path) -> None:
    # Which kinds exist is the registered definitions' to say: the worker's wiring checks it.
    from vibey.wiring import worker_config

    write_toml(tmp_path, '[queue.lease_seconds]\n"build.teleport" = 10\n')
    env = {"VIBEY_PG_URL": "postgresql://x@127.0.0.1/x", "VIBEY_AMQP_URL": "amqp://x@127.0.0.1/"}
    with pytest.raises(SettingsError) as caught:
        worker_config(load_settings(env, tmp_path))
    message = str(caught.value)
    assert "'build.teleport'" in message and "\n" not in message
    assert "build.implement" in message  # the declared kinds are listed


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


# --- [queue.rabbitmq] -------------------------------------------------------------------------


def test_a_rabbitmq_key_that_is_not_a_table_is_an_error(tmp_path: Path) -> None:
    write_toml(tmp_path, "[queue]\nrabbitmq = 5\n")
    assert "[queue.rabbitmq] table" in settings_error({}, tmp_path)


def test_the_rabbitmq_table_may_also_be_written_inline(tmp_path: Path) -> None:
    write_toml(tmp_path, "[queue]\nrabbitmq = { delivery_limit = 3 }\n")
    assert load_settings({}, tmp_path).queue.rabbitmq.delivery_limit == 3


def test_wait_tiers_are_sorted_and_may_be_fractional(tmp_path: Path) -> None:
    write_toml(tmp_path, "[queue.rabbitmq]\nwait_tiers_seconds = [30, 1.5, 1]\n")
    tiers = load_settings({}, tmp_path).queue.rabbitmq.wait_tiers
    assert tiers.tiers == (timedelta(seconds=1), timedelta(seconds=1.5), timedelta(seconds=30))
    assert tiers.names == ("w1s", "w1500ms", "w30s")


@pytest.mark.parametrize(
    ("raw", "named"),
    [
        ("0", "positive"),
        ("-1", "positive"),
        ("1,5,1", "more than once"),
        ("0.0005", "whole number of milliseconds"),
        ("nan", "NaN"),
        ("inf", "VIBEY_QUEUE_WAIT_TIERS"),
        ("1e20", "VIBEY_QUEUE_WAIT_TIERS"),
    ],
)
def test_unusable_wait_tiers_are_errors(empty_dir: Path, raw: str, named: str) -> None:
    message = settings_error({"VIBEY_QUEUE_WAIT_TIERS": raw}, empty_dir)
    assert named in message
    assert "fix VIBEY_QUEUE_WAIT_TIERS (or wait_tiers_seconds under [queue.rabbitmq])" in message


def test_an_empty_list_of_wait_tiers_is_an_error(tmp_path: Path) -> None:
    write_toml(tmp_path, "[queue.rabbitmq]\nwait_tiers_seconds = []\n")
    assert "must not be empty" in settings_error({}, tmp_path)


@pytest.mark.parametrize(
    ("variable", "raw"),
    [
        ("VIBEY_QUEUE_WAIT_TIERS", "1,,5"),
        ("VIBEY_QUEUE_WAIT_TIERS", "1,5,"),
        ("VIBEY_QUEUE_DEDICATED_PROJECTS", " ,alpha"),
        ("VIBEY_WORKER_LANES", "build,"),
    ],
)
def test_an_empty_item_in_a_list_variable_is_an_error(
    empty_dir: Path, variable: str, raw: str
) -> None:
    message = settings_error({variable: raw}, empty_dir)
    assert variable in message
    assert "empty item" in message


def test_the_delivery_limit_may_be_zero_but_not_negative(empty_dir: Path) -> None:
    env = {"VIBEY_QUEUE_DELIVERY_LIMIT": "0"}
    assert load_settings(env, empty_dir).queue.rabbitmq.delivery_limit == 0
    message = settings_error({"VIBEY_QUEUE_DELIVERY_LIMIT": "-1"}, empty_dir)
    assert "VIBEY_QUEUE_DELIVERY_LIMIT" in message
    assert "-1" in message


INTERVALS = [
    "VIBEY_QUEUE_RECONCILE_INTERVAL",
    "VIBEY_QUEUE_REDISPATCH_AFTER",
    "VIBEY_QUEUE_RECLAIM_AFTER",
    "VIBEY_QUEUE_CONSUMER_TIMEOUT",
]


@pytest.mark.parametrize("variable", INTERVALS)
@pytest.mark.parametrize("raw", ["-1", "nan", "inf", str(MAX_INTERVAL_SECONDS + 1)])
def test_intervals_must_be_finite_not_negative_and_at_most_a_year(
    empty_dir: Path, variable: str, raw: str
) -> None:
    message = settings_error({variable: raw}, empty_dir)
    assert variable in message
    assert "[queue.rabbitmq]" in message


@pytest.mark.parametrize("variable", INTERVALS)
def test_no_interval_may_be_zero(empty_dir: Path, variable: str) -> None:
    assert "more than 0" in settings_error({variable: "0"}, empty_dir)


def test_an_interval_of_a_year_is_accepted(empty_dir: Path) -> None:
    env = {"VIBEY_QUEUE_REDISPATCH_AFTER": str(MAX_INTERVAL_SECONDS)}
    rabbitmq = load_settings(env, empty_dir).queue.rabbitmq
    assert rabbitmq.redispatch_after_seconds == MAX_INTERVAL_SECONDS


@pytest.mark.parametrize(
    "projects",
    [
        "['a.b']",
        "['a*']",
        "['#']",
        "['a b']",
        '["tab\\there"]',
        "['']",
        f"['{'x' * (MAX_PROJECT_ID_CHARS + 1)}']",
        "['same', 'other', 'same']",
    ],
)
def test_bad_dedicated_projects_are_errors(tmp_path: Path, projects: str) -> None:
    write_toml(tmp_path, f"[queue.rabbitmq]\ndedicated_projects = {projects}\n")
    message = settings_error({}, tmp_path)
    assert "fix VIBEY_QUEUE_DEDICATED_PROJECTS (or dedicated_projects under [queue.rabbitmq])" in (
        message
    )


def test_a_project_id_of_the_longest_length_is_accepted(empty_dir: Path) -> None:
    longest = "p" * MAX_PROJECT_ID_CHARS
    env = {"VIBEY_QUEUE_DEDICATED_PROJECTS": f"{longest},ünïcode-ok_1"}
    projects = load_settings(env, empty_dir).queue.rabbitmq.dedicated_projects
    assert projects == (longest, "ünïcode-ok_1")


def test_check_project_ids_names_the_fix_it_is_given() -> None:
    assert check_project_ids(["a", "b-c"], "fix --project") == ("a", "b-c")
    with pytest.raises(SettingsError, match=r"'a\.b'.*; fix --project$"):
        check_project_ids(["a.b"], "fix --project")


def test_prefetch_is_optional_and_at_least_one(empty_dir: Path) -> None:
    assert load_settings({"VIBEY_QUEUE_PREFETCH": "1"}, empty_dir).queue.rabbitmq.prefetch == 1
    message = settings_error({"VIBEY_QUEUE_PREFETCH": "0"}, empty_dir)
    assert "VIBEY_QUEUE_PREFETCH" in message
    assert "leave it unset" in message


@pytest.mark.parametrize("prefix", ["a*b", "#", "with space", "tab\tin"])
def test_a_bus_prefix_with_a_wildcard_or_whitespace_is_an_error(
    empty_dir: Path, prefix: str
) -> None:
    message = settings_error({"VIBEY_BUS_PREFIX": prefix}, empty_dir)
    assert repr(prefix) in message
    assert "VIBEY_BUS_PREFIX" in message


# --- [worker] ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("variable", "key"), [("PROCESSES", "processes"), ("THREADS", "threads")])
@pytest.mark.parametrize("raw", ["0", "-2"])
def test_processes_and_threads_must_be_at_least_one(
    empty_dir: Path, variable: str, key: str, raw: str
) -> None:
    message = settings_error({f"VIBEY_WORKER_{variable}": raw}, empty_dir)
    assert f"fix --{key}, VIBEY_WORKER_{variable} (or {key} under [worker])" in message
    assert raw in message


@pytest.mark.parametrize(
    ("lanes", "named"),
    [
        ("['fast']", "unknown lane 'fast'"),
        ("['dead']", "unknown lane 'dead'"),
        ("['Build']", "unknown lane 'Build'"),
        ("[]", "at least one lane"),
        ("['build', 'build']", "lanes repeat (build)"),
    ],
)
def test_bad_lanes_are_errors(tmp_path: Path, lanes: str, named: str) -> None:
    write_toml(tmp_path, f"[worker]\nlanes = {lanes}\n")
    message = settings_error({}, tmp_path)
    assert named in message
    assert "fix --lanes, VIBEY_WORKER_LANES (or lanes under [worker])" in message


@pytest.mark.parametrize(
    "handlers",
    ["actors.handlers", "actors.handlers:", ":HANDLERS", "a b:X", "mod:a.b", "1mod:X", "mod::X"],
)
def test_handlers_must_be_module_colon_attribute(empty_dir: Path, handlers: str) -> None:
    message = settings_error({"VIBEY_WORKER_HANDLERS": handlers}, empty_dir)
    assert repr(handlers) in message
    assert "VIBEY_WORKER_HANDLERS" in message


def test_worker_settings_check_what_replace_gives_them() -> None:
    """The CLI's flags reach the settings through ``replace``, and are checked the same way."""
    worker = WorkerSettings()
    assert replace(worker, lanes=("build",)).lanes == ("build",)
    with pytest.raises(SettingsError, match="unknown lane 'x'"):
        replace(worker, lanes=("x",))
    with pytest.raises(SettingsError, match="--threads"):
        replace(worker, threads=0)


@pytest.mark.parametrize(
    ("raw", "items"),
    [("a", ("a",)), (" a , b ", ("a", "b")), ("a,,b", None), ("a,", None), ("", None)],
)
def test_split_list(raw: str, items: tuple[str, ...] | None) -> None:
    assert split_list(raw) == items


# --- wiring: the settings reach the worker's configuration ------------------------------------

WIRED_TOML = f"""
[database]
url = "{PG}"

[queue.lease_seconds]
default = 45

[queue.rabbitmq]
wait_tiers_seconds = [2, 20]
delivery_limit = 7
reconcile_interval_seconds = 11
redispatch_after_seconds = 99
reclaim_after_seconds = 33
consumer_timeout_seconds = 9000
dedicated_projects = ["big"]
prefetch = 5

[bus]
amqp_url = "{AMQP}"
prefix = "wired"

[worker]
threads = 3
lanes = ["build"]
handlers = "actors.handlers:build_handlers"

[workflow]
definitions = "tests.acceptance.tiny_definition:DEFINITIONS"

[engine]
command = ["my-agent", "--fast"]
timeout_seconds = 600
workspace = "/srv/vibey"
"""


def test_worker_config_maps_every_setting(tmp_path: Path) -> None:
    write_toml(tmp_path, WIRED_TOML)
    settings = load_settings({}, tmp_path)
    config = worker_config(settings, projects=["solo"])
    assert config.model_dump(include=set(Settings.model_fields)) == settings.model_dump()
    assert (config.projects, config.drain_grace) == (("solo",), timedelta(hours=2))
    assert (config.pg_url, config.amqp_url) == (PG, AMQP)
    assert config.queue.lease == LeasePolicy().with_overrides({"default": timedelta(seconds=45)})
    assert config.queue.rabbitmq.wait_tiers == WaitTiers.from_seconds([2, 20])
    topology = config.topology()
    assert (topology.delivery_limit, topology.consumer_timeout) == (7, timedelta(seconds=9000))
    assert topology.dedicated_projects == ("big", "solo")
    assert config.prefetch_by_queue() == {"wired.jobs.build.p.solo": 5}
    assert config.queues() == ["wired.jobs.build.p.solo"]


def test_worker_config_defaults_follow_the_settings_defaults(empty_dir: Path) -> None:
    settings = load_settings({"VIBEY_PG_URL": PG, "VIBEY_AMQP_URL": AMQP}, empty_dir)
    built = WorkerConfig(database=DatabaseSettings(url=PG), bus=BusSettings(amqp_url=AMQP))
    assert worker_config(settings) == built


def test_the_worker_without_an_amqp_url_names_both_fixes_before_anything_else(
    empty_dir: Path,
) -> None:
    settings = load_settings({}, empty_dir)  # no database URL either: the AMQP URL comes first
    with pytest.raises(QueueBackendNotConfigured) as caught:
        worker_config(settings, projects=["bad.id"])
    assert "export VIBEY_AMQP_URL=" in str(caught.value)
    assert "VIBEY_QUEUE_BACKEND=postgres" in str(caught.value)


def test_the_worker_on_the_postgres_backend_needs_no_amqp_url(empty_dir: Path) -> None:
    settings = load_settings(
        {"VIBEY_QUEUE_BACKEND": "postgres", "VIBEY_PG_URL": PG, "VIBEY_QUEUE_POLL_INTERVAL": "2"},
        empty_dir,
    )
    config = worker_config(settings, projects=["acme"])
    assert config.queue.backend == "postgres"
    assert config.amqp_url == ""
    assert config.projects == ("acme",)
    assert config.queue.poll_interval_seconds == 2


def test_the_worker_needs_a_database_url(empty_dir: Path) -> None:
    with pytest.raises(DatabaseNotConfigured):
        worker_config(load_settings({"VIBEY_AMQP_URL": AMQP}, empty_dir))


@pytest.mark.parametrize(
    ("env", "projects", "named"),
    [
        ({}, ["a.b"], "fix --project"),
        ({}, ["p", "p"], "project ids repeat"),
        ({"VIBEY_BUS_PREFIX": "x" * 250}, [], "longer than 255 bytes"),
        ({}, ["ü" * 120], "longer than 255 bytes"),  # 120 characters, 240 bytes
        ({"VIBEY_WORKER_HANDLERS": "no_such_module_here:HANDLERS"}, [], "no_such_module_here"),
        ({"VIBEY_WORKER_HANDLERS": "actors.handlers:NOPE"}, [], "NOPE"),
    ],
)
def test_what_cannot_run_is_refused_before_a_worker_starts(
    empty_dir: Path, env: dict[str, str], projects: list[str], named: str
) -> None:
    settings = load_settings({"VIBEY_PG_URL": PG, "VIBEY_AMQP_URL": AMQP, **env}, empty_dir)
    with pytest.raises(SettingsError) as caught:
        worker_config(settings, projects=projects)
    message = str(caught.value)
    assert named in message
    assert "\n" not in message
