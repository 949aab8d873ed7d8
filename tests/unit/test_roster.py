"""The [engines.<id>] roster: parsing, checks, effort projection, the engine's environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from actors.agents.roster import EFFORT_LEVELS, AgentSpec, RosterError, parse_roster
from vibey.settings import SettingsError, load_settings


def test_a_table_per_engine_in_id_order() -> None:
    specs = parse_roster(
        {
            "zeta": {"adapter": "aider", "weight": 0},
            "alpha": {
                "adapter": "claude-code",
                "args": ["--model", "x"],
                "phases": ["BUILD", "review"],
                "effort": {"HIGH": ["--max-turns", "80"]},
                "env": {"KEY": "v"},
                "timeout_seconds": 60,
            },
        },
        "vibey.toml",
    )
    assert [s.id for s in specs] == ["alpha", "zeta"]
    alpha = specs[0]
    assert (alpha.binary, alpha.args, alpha.phases) == (
        "claude",
        ("--model", "x"),
        frozenset({"build", "review"}),
    )
    assert alpha.allows("build") and not alpha.allows("design")
    assert specs[1].allows("design")  # no list: every phase


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"adapter": "claud"}, "adapter must be one of"),
        ({"adapter": "codex", "colour": "red"}, "unknown key 'colour'"),
        ({"adapter": "codex", "weight": -1}, "weight must be a whole number"),
        ({"adapter": "codex", "phases": ["bild"]}, "unknown phase 'bild'"),
        ({"adapter": "codex", "effort": {"HUGE": []}}, "unknown effort level 'HUGE'"),
        ({"adapter": "codex", "env": {"A": 1}}, "env must be a table"),
        ({"adapter": "codex", "timeout_seconds": 0}, "timeout_seconds must be more than 0"),
        ({"adapter": "command"}, "the command adapter needs binary"),
        ("claude", "must be a table"),
    ],
)
def test_a_bad_table_is_one_line_naming_the_fix(body: object, message: str) -> None:
    with pytest.raises(RosterError, match=message):
        parse_roster({"x": body}, "vibey.toml")


def test_settings_read_the_roster_and_refuse_a_bad_one(tmp_path: Path) -> None:
    (tmp_path / "vibey.toml").write_text('[engines.c]\nadapter = "codex"\nweight = 2\n')
    settings = load_settings({"PATH": "/usr/bin", "VIBEY_PG_URL": "postgresql://x/y"}, tmp_path)
    assert [(s.id, s.weight) for s in settings.engines] == [("c", 2)]
    assert settings.agent_env == {"PATH": "/usr/bin"}  # never the orchestrator's own
    assert settings.roster(["c"]) == settings.engines
    with pytest.raises(SettingsError, match="unknown engine 'd'; configured engines: c"):
        settings.roster(["d"])
    (tmp_path / "vibey.toml").write_text('[engines.c]\nadapter = "codex"\nbogus = 1\n')
    with pytest.raises(SettingsError, match=r"\[engines.c\]: unknown key 'bogus'"):
        load_settings({}, tmp_path)


def test_the_old_engine_keys_still_work(tmp_path: Path) -> None:
    (tmp_path / "vibey.toml").write_text('[engine]\nname = "command"\ncommand = ["agent"]\n')
    settings = load_settings({}, tmp_path)
    assert (settings.engine.name, settings.engine.command, settings.engines) == (
        "command",
        ("agent",),
        (),
    )


levels = st.dictionaries(
    st.sampled_from(EFFORT_LEVELS), st.tuples(st.text(min_size=1, max_size=5)), max_size=5
)


@given(levels, st.sampled_from(EFFORT_LEVELS))
def test_effort_saturates(effort: dict[str, tuple[str, ...]], level: str) -> None:
    spec = AgentSpec(id="e", adapter="codex", effort=effort)
    flags = spec.effort_args(level)
    if not effort:
        assert flags == ()
        return
    rank = EFFORT_LEVELS.index(level)
    at_or_below = [lv for lv in EFFORT_LEVELS[: rank + 1] if lv in effort]
    expected = at_or_below[-1] if at_or_below else next(lv for lv in EFFORT_LEVELS if lv in effort)
    assert flags == effort[expected]


def test_the_catalog_names_every_cli_adapter_and_what_the_roster_reads_of_it() -> None:
    from actors.agents.adapters import CLI_ADAPTERS
    from actors.agents.catalog import ADAPTERS, CATALOG, RUN_VERBS, SERVICE_ADAPTERS

    assert {a.name for a in CATALOG if a.binary} == set(CLI_ADAPTERS)
    assert all(cls.adapter == name for name, cls in CLI_ADAPTERS.items())
    assert ADAPTERS == ("claude-code", "codex", "gemini", "aider", "command", "scripted")
    assert SERVICE_ADAPTERS == tuple(CLI_ADAPTERS) == tuple(RUN_VERBS)
    (codex,) = parse_roster({"c": {"adapter": "codex"}}, "vibey.toml")
    assert codex.binary == "codex"
    assert codex.network == ("api.openai.com:443", "chatgpt.com:443")


def test_the_roster_phases_and_levels_are_the_effort_ladders() -> None:
    from actors.agents.roster import PHASES
    from workflows.effort import Effort

    assert EFFORT_LEVELS == ("TRIVIAL", "LOW", "STANDARD", "HIGH", "MAX")
    assert PHASES == (
        "design",
        "visual_design",
        "build",
        "review",
        "deploy_design",
        "deploy_execute",
        "deploy_review",
    )
    assert len(EFFORT_LEVELS) == len(Effort)
