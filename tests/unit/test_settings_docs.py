"""The settings' documentation is derived from their declarations (actors.config): the table
in docs/settings.md is :func:`actors.config.table`, and every settings variable the docs name
is a declared one."""

from __future__ import annotations

import re
from pathlib import Path

from actors.config import keys, table

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
