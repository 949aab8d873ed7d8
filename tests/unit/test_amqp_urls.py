"""Several AMQP URLs (one per cluster node): settings, redaction, pika parameters."""

from __future__ import annotations

from pathlib import Path

import pytest

from actors.amqp import parameters, split_urls, with_query
from store.pool import redact
from vibey.settings import SettingsError, load_settings

A = "amqp://vibey:pw@10.0.0.1:5672/"
B = "amqp://vibey:pw@10.0.0.2:5672/"


def test_settings_take_several_urls_and_apply_the_vhost_to_each(tmp_path: Path) -> None:
    settings = load_settings({"VIBEY_AMQP_URL": f"{A}; {B}", "VIBEY_BUS_VHOST": "v"}, tmp_path)
    assert settings.bus.amqp_url == f"{A}v;{B}v"


def test_a_bad_url_among_several_is_refused(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="separated by ';'"):
        load_settings({"VIBEY_AMQP_URL": f"{A};http://x"}, tmp_path)


def test_every_password_is_redacted() -> None:
    assert redact(f"{A};{B}") == "amqp://vibey:***@10.0.0.1:5672/;amqp://vibey:***@10.0.0.2:5672/"


def test_parameters_one_per_node_in_order_with_the_query_on_each() -> None:
    url = with_query(f"{A};{B}", "heartbeat=30")
    assert split_urls(url) == [f"{A}?heartbeat=30", f"{B}?heartbeat=30"]
    params = parameters(url, timeout=2)
    assert [p.host for p in params] == ["10.0.0.1", "10.0.0.2"]
    assert all(p.heartbeat == 30 and p.connection_attempts == 1 for p in params)
