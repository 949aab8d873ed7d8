"""Codex's real failure messages (codex 0.171, as the real binary printed them against the
tier's Responses API server, tests/real_cli/test_codex.py) classified from its error channel
only, and its usage-limit reset (a local clock time) parsed (actors/agents/limits.py
``clock_reset``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.agents import limits
from actors.agents.codex import CodexAdapter
from actors.agents.roster import AgentSpec
from workflows.capacity import (
    AuthenticationFailed,
    CreditsExhausted,
    WindowExhausted,
)

ZONES = ("UTC", "America/New_York", "Europe/Berlin", "Asia/Kolkata", "Australia/Lord_Howe")
PLUS = (
    "You’ve hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), visit "
    "https://chatgpt.com/settings/usage to purchase more credits or try again at {}."
)


def adapter(tmp_path: Path, zone: str = "America/New_York") -> CodexAdapter:
    spec = AgentSpec(id="codex", adapter="codex", env={"TZ": zone})
    return CodexAdapter(spec, worker_env={}, transcripts=tmp_path)


def failed(message: str, *before: dict[str, Any]) -> str:
    """A run that failed with ``message``, as ``codex exec --json`` prints it."""
    events = [
        {"type": "thread.started", "thread_id": "t"},
        {"type": "turn.started"},
        *before,
        {"type": "error", "message": message},
        {"type": "turn.failed", "error": {"message": message}},
    ]
    return "\n".join(json.dumps(e) for e in events) + "\n"


def codex_clock(at: datetime, now: datetime) -> str:
    """codex-rs ``format_retry_timestamp``: ``%-I:%M %p`` on the local day it prints on, else
    ``%b %-d<suffix>, %Y %-I:%M %p``."""
    clock = f"{at.hour % 12 or 12}:{at.minute:02d} {'AM' if at.hour < 12 else 'PM'}"
    if at.date() == now.date():
        return clock
    suffix = "th" if 11 <= at.day <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(at.day % 10, "th")
    return f"{at.strftime('%b')} {at.day}{suffix}, {at.year} {clock}"


# -- the clock time ----------------------------------------------------------------------------


@settings(max_examples=500)
@given(
    st.datetimes(datetime(2020, 1, 1), datetime(2035, 1, 1), timezones=st.just(UTC)),
    st.timedeltas(timedelta(seconds=1), timedelta(days=9)),
    st.sampled_from(ZONES),
)
def test_a_clock_reset_reads_back_the_minute_codex_printed(
    at: datetime, ahead: timedelta, zone_name: str
) -> None:
    zone = ZoneInfo(zone_name)
    reset = at + ahead
    printed = codex_clock(reset.astimezone(zone), at.astimezone(zone))
    parsed = limits.clock_reset(PLUS.format(printed), at, zone)
    assert parsed is not None and parsed.tzinfo is not None
    minute = reset.replace(second=0, microsecond=0)
    wall = parsed.astimezone(zone).replace(tzinfo=None)
    assert wall == minute.astimezone(zone).replace(tzinfo=None, second=0, microsecond=0)
    if parsed != minute:  # only a wall time a DST change repeats is ambiguous, by its shift
        assert abs(parsed - minute) <= timedelta(hours=1)
        assert zone.utcoffset(wall.replace(fold=0)) != zone.utcoffset(wall.replace(fold=1))


@given(
    st.datetimes(datetime(2020, 1, 1), datetime(2035, 1, 1), timezones=st.just(UTC)),
    st.integers(1, 12),
    st.integers(0, 59),
    st.sampled_from(["AM", "PM"]),
    st.sampled_from(ZONES),
)
def test_a_time_of_day_is_its_next_occurrence(
    at: datetime, hour: int, minute: int, half: str, zone_name: str
) -> None:
    zone = ZoneInfo(zone_name)
    parsed = limits.clock_reset(f"Try again at {hour}:{minute:02d} {half}.", at, zone)
    assert parsed is not None
    assert at - limits.CLOCK_GRACE <= parsed < at + timedelta(hours=25)
    local = parsed.astimezone(zone)
    assert (
        (local.hour % 12 or 12, local.minute) == (hour, minute)
        or local.fold
        or (
            zone.utcoffset(local.replace(tzinfo=None)) != local.utcoffset()  # a skipped hour
        )
    )


def test_a_clock_time_a_minute_past_is_today() -> None:
    at = datetime(2026, 12, 3, 8, 15, 40, tzinfo=UTC)
    assert limits.clock_reset("try again at 8:15 AM.", at, UTC) == at.replace(second=0)
    assert limits.clock_reset("try again at 8:13 AM.", at, UTC) == datetime(
        2026, 12, 4, 8, 13, tzinfo=UTC
    )


@pytest.mark.parametrize("text", ["Try again later.", "try again at 13:15 PM", "at 8:15 AM"])
def test_no_clock_time_no_reset(text: str) -> None:
    assert limits.clock_reset(text) is None


# -- the real messages -------------------------------------------------------------------------


def test_a_usage_limit_is_a_window_until_its_local_clock_time(tmp_path: Path) -> None:
    now = datetime.now(UTC)
    reset = (now + timedelta(hours=3)).replace(second=0, microsecond=0)
    zone = ZoneInfo("America/New_York")
    message = PLUS.format(codex_clock(reset.astimezone(zone), now.astimezone(zone)))
    reading = adapter(tmp_path).read(failed(message), "", 1)
    assert isinstance(reading.capacity, WindowExhausted)
    assert reading.capacity.resets_at == reset
    assert reading.error is None


def test_a_usage_limit_on_another_day_carries_its_date(tmp_path: Path) -> None:
    message = "You've hit your usage limit. Try again at Dec 4th, 2030 8:15 AM."
    reading = adapter(tmp_path, "Europe/Berlin").read(failed(message), "", 1)
    assert isinstance(reading.capacity, WindowExhausted)
    assert reading.capacity.resets_at == datetime(2030, 12, 4, 7, 15, tzinfo=UTC)


def test_a_rate_limit_in_the_stream_is_a_window_until_the_apis_reset(tmp_path: Path) -> None:
    message = (
        "rate limit exceeded: Rate limit reached for gpt-5.5 in organization org-vibeytest on "
        "tokens per min (TPM): Limit 30000, Used 29500, Requested 1500. Please try again in "
        "20s. Visit https://platform.openai.com/account/rate-limits to learn more."
    )
    before = datetime.now(UTC)
    reading = adapter(tmp_path).read(failed(message), "", 1)
    assert isinstance(reading.capacity, WindowExhausted)
    assert before + timedelta(seconds=20) <= reading.capacity.resets_at
    assert reading.capacity.resets_at <= datetime.now(UTC) + timedelta(seconds=20)


@pytest.mark.parametrize(
    "message",
    [
        "You've hit your usage limit. Try again later.",
        "You’ve hit your usage limit. Upgrade to Plus to continue using Codex "
        "(https://chatgpt.com/explore/plus).",
        "exceeded retry limit, last status: 429 Too Many Requests, request id: req_vibey_test",
    ],
)
def test_a_limit_without_a_time_is_a_window_of_unknown_reset(tmp_path: Path, message: str) -> None:
    before = datetime.now(UTC)
    reading = adapter(tmp_path).read(failed(message), "", 1)
    assert isinstance(reading.capacity, WindowExhausted)
    assert reading.capacity.resets_at >= before + limits.UNKNOWN_RESET


@pytest.mark.parametrize(
    "message",
    [
        "Quota exceeded. Check your plan and billing details.",
        "Your workspace is out of credits. Add credits to continue.",
        "You hit your spend cap set in your workspace. Increase your spend cap to continue.",
        "To use Codex with your ChatGPT plan, upgrade to Plus: https://chatgpt.com/explore/plus.",
    ],
)
def test_spent_credits(tmp_path: Path, message: str) -> None:
    reading = adapter(tmp_path).read(failed(message), "", 1)
    assert isinstance(reading.capacity, CreditsExhausted)
    assert reading.capacity.detail == message


@pytest.mark.parametrize(
    "message",
    [
        "unexpected status 401 Unauthorized: Incorrect API key provided: sk-no************0000. "
        "You can find your API key at https://platform.openai.com/account/api-keys., url: "
        "http://127.0.0.1:4011/billing-api/v1/responses, request id: req_vibey_test",
        "Your access token could not be refreshed because your refresh token was revoked. "
        "Please log out and sign in again.",
    ],
)
def test_a_failed_login_is_authentication(tmp_path: Path, message: str) -> None:
    reading = adapter(tmp_path).read(failed(message), "", 1)
    assert isinstance(reading.capacity, AuthenticationFailed), reading
    assert "billing" not in reading.capacity.detail


def test_a_refused_schema_is_an_engine_error_not_capacity(tmp_path: Path) -> None:
    error = {
        "message": "Invalid schema for response_format 'codex_output_schema': In context=(), "
        "'additionalProperties' is required to be supplied and to be false.",
        "type": "invalid_request_error",
        "param": "text.format.schema",
        "code": "invalid_json_schema",
    }
    reading = adapter(tmp_path).read(failed(json.dumps({"error": error})), "", 1)
    assert reading.capacity is None
    assert reading.error is not None and "invalid_json_schema" in reading.error


def test_names_outside_the_error_channel_change_nothing(tmp_path: Path) -> None:
    """A 400 under a base URL naming billing; a project, a command, a file and a message that
    say "billing", "401", "usage limit": none of them is a capacity state (item 7)."""
    work = [
        {
            "type": "item.completed",
            "item": {"type": "command_execution", "command": "cat billing-api/401.txt"},
        },
        {
            "type": "item.completed",
            "item": {
                "type": "file_change",
                "status": "completed",
                "changes": [{"path": "/p/billing-api/401/usage limit.md", "kind": "add"}],
            },
        },
        {
            "type": "item.completed",
            "item": {"type": "agent_message", "text": "Quota exceeded? 401? usage limit 429"},
        },
    ]
    message = (
        'unexpected status 400 Bad Request: {"error": {"message": "bad"}}, url: '
        "https://proxy.example/billing/401/429/v1/responses, request id: req_1"
    )
    reading = adapter(tmp_path).read(failed(message, *work), "", 1)
    assert reading.capacity is None and reading.error is not None
    ok = [*work, {"type": "turn.completed", "usage": {"input_tokens": 1, "output_tokens": 1}}]
    done = "\n".join(json.dumps(e) for e in ok) + "\n"
    reading = adapter(tmp_path).read(done, "", 0)
    assert reading.capacity is None and reading.error is None


def test_a_retry_notice_before_a_completed_turn_is_no_failure(tmp_path: Path) -> None:
    events = [
        {"type": "turn.started"},
        {"type": "error", "message": "Reconnecting... 1/5 (stream disconnected before completion)"},
        {"type": "item.completed", "item": {"type": "agent_message", "text": "{}"}},
        {"type": "turn.completed", "usage": {"input_tokens": 3, "output_tokens": 2}},
    ]
    reading = adapter(tmp_path).read("\n".join(json.dumps(e) for e in events), "", 0)
    assert reading.capacity is None and reading.error is None and reading.turns == 1


def test_stderr_counts_only_its_error_lines_when_stdout_is_empty(tmp_path: Path) -> None:
    noise = "Reading additional input from stdin...\nworkspace: /srv/billing-api (401 files)\n"
    reading = adapter(tmp_path).read("", noise, 1)
    assert reading.capacity is None and reading.malformed == "no events on stdout"
    reading = adapter(tmp_path).read(
        "", noise + "Error: Quota exceeded. Check your plan and billing details.\n", 1
    )
    assert isinstance(reading.capacity, CreditsExhausted)


def test_a_failed_file_change_is_no_edit(tmp_path: Path) -> None:
    item = {
        "type": "file_change",
        "status": "failed",
        "changes": [{"path": "/w/src/a.txt", "kind": "add"}],
    }
    reading = adapter(tmp_path).read(json.dumps({"type": "item.completed", "item": item}), "", 0)
    assert reading.files == []


def test_a_codex_home_under_the_temporary_directory_is_refused(tmp_path: Path) -> None:
    spec = AgentSpec(
        id="codex",
        adapter="codex",
        env={"CODEX_HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path)},
    )
    problem = CodexAdapter(spec, worker_env={}, transcripts=tmp_path).home_problem()
    assert problem is not None and "under the temporary directory" in problem
    elsewhere = AgentSpec(id="c", adapter="codex", env={"CODEX_HOME": "/srv/codex-home"})
    assert CodexAdapter(elsewhere, worker_env={}, transcripts=tmp_path).home_problem() is None
