"""[console]'s live-update settings: read from vibey.toml and the environment, checked, and
what `vibey console` wires from them (the domain events, or the poll alone)."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.event_watch import EventWatch
from vibey.cli_console import event_source
from vibey.settings import MAX_INTERVAL_SECONDS, SettingsError, load_settings

AMQP = "amqp://guest:guest@127.0.0.1:5672/"


def test_the_defaults_follow_the_events_and_poll_slowly_beside_them(tmp_path: Path) -> None:
    console = load_settings({}, tmp_path).console
    assert (console.poll_seconds, console.safety_poll_seconds, console.follow_events) == (
        0.5,
        5.0,
        True,
    )


def test_the_file_and_the_environment_set_them(tmp_path: Path) -> None:
    (tmp_path / "vibey.toml").write_text(
        "[console]\npoll_seconds = 1\nsafety_poll_seconds = 60\nfollow_events = false\n"
    )
    from_file = load_settings({}, tmp_path).console
    assert (from_file.poll_seconds, from_file.safety_poll_seconds) == (1.0, 60.0)
    assert from_file.follow_events is False
    env = {"VIBEY_CONSOLE_SAFETY_POLL": "30", "VIBEY_CONSOLE_FOLLOW_EVENTS": "yes"}
    from_env = load_settings(env, tmp_path).console
    assert (from_env.safety_poll_seconds, from_env.follow_events) == (30.0, True)


@pytest.mark.parametrize("raw", ["0", "-1", "nan", str(MAX_INTERVAL_SECONDS + 1)])
@pytest.mark.parametrize("variable", ["VIBEY_CONSOLE_POLL", "VIBEY_CONSOLE_SAFETY_POLL"])
def test_a_poll_interval_out_of_range_is_an_error_naming_the_console(
    tmp_path: Path, variable: str, raw: str
) -> None:
    with pytest.raises(SettingsError) as caught:
        load_settings({variable: raw}, tmp_path)
    assert variable in str(caught.value) and "[console]" in str(caught.value)


def test_follow_events_is_a_flag(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="VIBEY_CONSOLE_FOLLOW_EVENTS"):
        load_settings({"VIBEY_CONSOLE_FOLLOW_EVENTS": "sometimes"}, tmp_path)


@pytest.mark.parametrize(
    ("env", "why"),
    [
        ({"VIBEY_QUEUE_BACKEND": "postgres", "VIBEY_AMQP_URL": AMQP}, "nothing is published"),
        ({"VIBEY_AMQP_URL": AMQP, "VIBEY_CONSOLE_FOLLOW_EVENTS": "0"}, "turned off"),
        ({}, "no broker to ask"),
    ],
)
def test_the_console_polls_alone_when_no_events_can_arrive(
    tmp_path: Path, env: dict[str, str], why: str
) -> None:
    assert event_source(load_settings(env, tmp_path)) is None, why


def test_on_the_rabbitmq_backend_the_console_watches_its_prefixs_exchange(tmp_path: Path) -> None:
    env = {"VIBEY_AMQP_URL": AMQP, "VIBEY_BUS_PREFIX": "acme"}
    source = event_source(load_settings(env, tmp_path))
    assert isinstance(source, EventWatch) and source.exchange == "acme.events"
