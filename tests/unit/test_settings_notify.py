"""[notify.webhooks.<name>] in vibey.toml: read, checked, the secret overridable."""

from __future__ import annotations

from pathlib import Path

import pytest

from vibey.settings import SettingsError, load_settings

TOML = """
[notify.webhooks.ops]
url = "https://hooks.example/vibey"
events = ["gate.opened", "workflow"]
secret = "from-file"

[notify.webhooks.chat]
url = "http://127.0.0.1:9/h"
secret = "k"
max_attempts = 3
"""


def test_webhooks_are_read_in_name_order_and_the_environment_wins(tmp_path: Path) -> None:
    (tmp_path / "vibey.toml").write_text(TOML)
    env = {"VIBEY_NOTIFY_WEBHOOK_OPS_SECRET": "from-env"}
    chat, ops = load_settings(env, tmp_path).webhooks
    assert (ops.name, ops.url, ops.events, ops.secret) == (
        "ops",
        "https://hooks.example/vibey",
        ("gate.opened", "workflow"),
        "from-env",
    )
    assert ops.wants("workflow.completed") and not ops.wants("gate.answered")
    assert (chat.events, chat.max_attempts, chat.secret) == (("gate.opened",), 3, "k")
    assert load_settings({}, tmp_path / "nowhere").webhooks == ()


@pytest.mark.parametrize(
    ("toml", "message"),
    [
        ('[notify.webhooks.a]\nsecret = "k"\n', "url"),
        ('[notify.webhooks.a]\nurl = "ftp://x"\nsecret = "k"\n', "url"),
        ('[notify.webhooks.a]\nurl = "https://x"\n', "secret"),
        ('[notify.webhooks.a]\nurl = "https://x"\nsecret = "k"\nevents = "gate"\n', "events"),
        ('[notify.mail]\nto = "x"\n', "notify.webhooks"),
    ],
)
def test_a_bad_webhook_table_says_what_to_fix(tmp_path: Path, toml: str, message: str) -> None:
    (tmp_path / "vibey.toml").write_text(toml)
    with pytest.raises(SettingsError, match=message):
        load_settings({}, tmp_path)
