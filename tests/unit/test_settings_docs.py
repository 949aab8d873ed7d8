"""The settings' documentation is derived from their declarations (actors.config): the table
in docs/settings.md is :func:`actors.config.table`, and every settings variable the docs name
is a declared one."""

from __future__ import annotations

import json
import re
from pathlib import Path

from actors.config import Settings, keys, table
from actors.declare import Key
from vibey.settings import load_settings

ROOT = Path(__file__).resolve().parents[2]
START = "<!-- settings table: generated from actors/config.py -->\n"
END = "<!-- end of the settings table -->\n"
NOT_SETTINGS = {"VIBEY_PG_BINDIR"}  # `just up`'s (ops/), read by no vibey process


def test_the_docs_table_lists_exactly_the_declared_settings() -> None:
    text = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    documented = text.split(START, 1)[1].split(END, 1)[0]
    assert documented == table(), (
        "docs/settings.md is stale: paste the output of "
        "python -c 'import actors.config as c; print(c.table(), end=\"\")' between its markers"
    )
    rows = [line for line in documented.splitlines() if line.startswith("| `[")]
    assert len(rows) == len(list(keys()))


def test_every_settings_variable_the_docs_name_is_declared() -> None:
    declared = {key.env for key in keys() if key.env is not None}
    families = {variable.split("_")[1] for variable in declared}  # PG, QUEUE, BUS, ...
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = {
        variable
        for path in docs
        for variable in re.findall(r"VIBEY_[A-Z0-9_]*[A-Z0-9]", path.read_text(encoding="utf-8"))
        if variable.split("_")[1] in families
    }
    assert named - declared - NOT_SETTINGS == set()


def test_a_key_has_one_variable_and_each_variable_one_key() -> None:
    variables = [key.env for key in keys() if key.env is not None]
    assert len(variables) == len(set(variables)) == len(list(keys()))


def _toml_value(value: object) -> str:
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(value)


def _variable_text(key: Key, value: object) -> str:
    if key.name == "command":  # shell words
        return " ".join(str(v) for v in value)  # type: ignore[attr-defined]
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


# Each key with a value other than its default, as the file and the environment write it.
CHANGED: dict[str, object] = {
    "database.url": "postgresql://other@db:5432/x",
    "queue.backend": "postgres",
    "queue.lease_seconds": {"default": 77.0},
    "queue.rabbitmq.wait_tiers_seconds": (2.0, 20.0),
    "queue.rabbitmq.dedicated_projects": ("alpha",),
    "bus.amqp_url": "amqp://h:5672/team",
    "bus.vhost": "team",
    "worker.lanes": ("build",),
    "worker.handlers": "pkg.mod:H",
    "workflow.definitions": "pkg.defs:D",
    "engine.name": "command",
    "engine.command": ("agent", "--go"),
    "console.host": "127.0.0.2",
    "console.password_hash": "scrypt$1$1$1$s$d",
    "console.token_hash": "scrypt$1$1$1$s$t",
    "tracing.otlp_endpoint": "http://collector:4318/v1/traces",
}


def _changed(key: Key) -> object:
    dotted = ".".join(key.path())
    if dotted in CHANGED:
        return CHANGED[dotted]
    default = key.field.default
    if isinstance(default, bool):
        return not default
    if isinstance(default, int | float):
        return type(default)(default + 1)
    if default is None:  # an optional number or text
        wanted = key.kind.wanted if key.kind is not None else ""
        return {"an integer": 3, "a number": 3.5}.get(wanted, "x")
    assert isinstance(default, str), dotted
    return default + "x"


def _read(settings: object, key: Key) -> object:
    for part in key.path():
        settings = getattr(settings, part)
    return settings


def test_every_declared_key_is_read_from_the_file_and_from_its_variable(tmp_path: Path) -> None:
    """What adding a setting takes is its declaration: both readers are derived from it."""
    values = {key: _changed(key) for key in keys()}
    tables: dict[str, list[str]] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            for item, seconds in value.items():
                tables.setdefault(f"{key.table}.{key.name}", []).append(f"{item} = {seconds}")
        else:
            tables.setdefault(key.table, []).append(f"{key.name} = {_toml_value(value)}")
    body = "".join(f"[{table}]\n" + "\n".join(lines) + "\n" for table, lines in tables.items())
    (tmp_path / "vibey.toml").write_text(body, encoding="utf-8")
    from_file = load_settings({}, tmp_path)
    env = {
        str(key.env): _variable_text(key, value["default"] if isinstance(value, dict) else value)
        for key, value in values.items()
    }
    from_env = load_settings(env, tmp_path / "nowhere")
    for key, value in values.items():
        for settings in (from_file, from_env):
            assert _read(settings, key) == value, key.name
            assert _read(settings, key) != _read(Settings(), key), key.name
