"""The Gemini adapter on what Gemini CLI 0.61 really printed (``gemini_0_61/<case>.stdout`` and
``.stderr``, recorded from the pinned binary against ``tests/real_cli/gemini_api.py``): each
fault class read as its message means, from the error channel only; and the engine's Gemini
home (its settings, ``GEMINI_CLI_HOME``)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from actors.agents import gemini_home
from actors.agents.base import EngineTask
from actors.agents.cli import Reading
from actors.agents.gemini import ApiError, GeminiAdapter, api_error, capacity_of, one_line
from actors.agents.limits import UNKNOWN_RESET
from actors.agents.plans import write_plan
from actors.agents.roster import AgentSpec
from workflows.capacity import AuthenticationFailed, CreditsExhausted, WindowExhausted

SAMPLES = Path(__file__).parent / "gemini_0_61"
EXITS = {
    "rate_limit_reset": 173,
    "rate_limit_in_billing_dir": 173,
    "daily_quota": 173,
    "credits": 173,
    "rate_limit": 173,
    "auth": 144,
    "server_error": 244,
    "untrusted": 55,
    "no_auth_type": 41,
    "refused": 1,
}
AT = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)


def adapter(tmp_path: Path, env: dict[str, str] | None = None) -> GeminiAdapter:
    spec = AgentSpec(id="gem", adapter="gemini", env=env or {"GEMINI_API_KEY": "k"})
    return GeminiAdapter(spec, worker_env={}, transcripts=tmp_path / "state" / "transcripts")


def sample(name: str) -> tuple[str, str, int]:
    stdout = (SAMPLES / f"{name}.stdout").read_text()
    stderr = (SAMPLES / f"{name}.stderr").read_text()
    return stdout, stderr, EXITS[name]


def read(tmp_path: Path, name: str) -> Reading:
    return adapter(tmp_path).read(*sample(name))


def result_time(name: str) -> datetime:
    events = [json.loads(line) for line in (SAMPLES / f"{name}.stdout").read_text().splitlines()]
    stamp = next(e["timestamp"] for e in events if e["type"] == "result")
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


# -- each real message -----------------------------------------------------------------------


@pytest.mark.parametrize("name", ["rate_limit_reset", "rate_limit_in_billing_dir"])
def test_a_per_minute_429_with_a_retry_time_is_a_window_at_that_time(
    tmp_path: Path, name: str
) -> None:
    """ "… check your plan and billing details … Please retry in 4.035955417s." with
    RetryableQuotaError, retryDelayMs 4000: a window, not spent credits (the old reading
    matched "billing details" first), also when the step's folder is named billing-api-401."""
    reading = read(tmp_path, name)
    assert isinstance(reading.capacity, WindowExhausted), reading.capacity
    assert reading.capacity.resets_at == result_time(name) + timedelta(seconds=4)
    assert reading.capacity.detail.startswith("RetryableQuotaError (429, retry in 4s): ")


@pytest.mark.parametrize("name", ["daily_quota", "credits"])
def test_a_daily_quota_or_depleted_credits_are_credits_exhausted(tmp_path: Path, name: str) -> None:
    reading = read(tmp_path, name)
    assert isinstance(reading.capacity, CreditsExhausted), reading.capacity
    said = {
        "daily_quota": "TerminalQuotaError (429): You have exhausted your daily quota",
        "credits": "RetryableQuotaError (429): Your prepayment credits are depleted.",
    }
    assert reading.capacity.detail.startswith(said[name])


def test_a_429_that_says_nothing_of_when_is_a_window_of_unknown_reset(tmp_path: Path) -> None:
    reading = read(tmp_path, "rate_limit")
    assert isinstance(reading.capacity, WindowExhausted), reading.capacity
    left = reading.capacity.resets_at - datetime.now(UTC)
    assert UNKNOWN_RESET - timedelta(seconds=30) < left <= UNKNOWN_RESET


def test_an_invalid_api_key_is_an_authentication_failure(tmp_path: Path) -> None:
    """The API's 400 API_KEY_INVALID (exit 144: 400 modulo 256)."""
    reading = read(tmp_path, "auth")
    assert isinstance(reading.capacity, AuthenticationFailed), reading.capacity
    assert reading.capacity.detail == (
        "ApiError (400): API key not valid. Please pass a valid API key."
    )


def test_exit_41_is_an_authentication_failure_that_says_what_is_missing(tmp_path: Path) -> None:
    reading = read(tmp_path, "no_auth_type")
    assert isinstance(reading.capacity, AuthenticationFailed), reading.capacity
    assert reading.capacity.detail.startswith("exit 41 (its authentication is not set up")
    assert reading.capacity.detail.endswith(": Invalid auth method selected.")


def test_exit_55_is_a_failure_named_as_the_untrusted_folder(tmp_path: Path) -> None:
    reading = read(tmp_path, "untrusted")
    assert reading.capacity is None
    assert reading.error is not None
    assert reading.error.startswith("exit 55 (the folder is not trusted")
    assert "Gemini CLI is not running in a trusted directory." in reading.error
    assert "\x1b" not in reading.error


def test_a_server_error_is_an_engine_failure_with_its_http_status(tmp_path: Path) -> None:
    reading = read(tmp_path, "server_error")
    assert reading.capacity is None
    assert reading.error == (
        "exit 244 (an API error, HTTP 500): ApiError (500): Internal error encountered."
    )


def test_a_connection_error_under_paths_with_401_and_billing_stays_a_failure(
    tmp_path: Path,
) -> None:
    """Its prompt names /tmp/billing-api/401/plan.md and it ran in billing-api-401/: neither
    is the error channel."""
    reading = read(tmp_path, "refused")
    assert reading.capacity is None
    assert reading.error == (
        "exit 1 (a general or API error): Error: exception TypeError: fetch failed sending request"
    )


@pytest.mark.parametrize("name", sorted(EXITS))
def test_every_detail_is_one_clean_line_never_a_dict(tmp_path: Path, name: str) -> None:
    reading = read(tmp_path, name)
    detail = reading.capacity.detail if reading.capacity is not None else reading.error
    assert detail is not None
    assert "\n" not in detail and len(detail) <= 300
    assert "{'" not in detail and "': " not in detail


# -- the error channel only ------------------------------------------------------------------

_WORDS = st.sampled_from(
    ["billing-api", "401", "429", "quota", "RESOURCE_EXHAUSTED", "API key not valid", "credits"]
)


@settings(max_examples=60, deadline=None)
@given(
    words=st.lists(_WORDS | st.text(max_size=12), max_size=6), name=st.sampled_from(sorted(EXITS))
)
def test_prompts_paths_and_tool_output_never_change_the_class(
    tmp_path_factory: pytest.TempPathFactory, words: list[str], name: str
) -> None:
    """Whatever the user's prompt, the edited paths and the tools' output say, a run reads as
    its error channel says."""
    stdout, stderr, code = sample(name)
    noise = "/".join(words) or "x"
    extra = [
        {"type": "message", "role": "user", "content": f"see /w/{noise}/.vibey/plans/p.json"},
        {"type": "tool_use", "tool_name": "write_file", "parameters": {"file_path": f"/{noise}"}},
        {"type": "tool_result", "status": "success", "output": noise},
    ]
    lines = stdout.splitlines()
    noisy = "\n".join(lines[:1] + [json.dumps(e) for e in extra] + lines[1:]) + "\n"
    tmp = tmp_path_factory.mktemp("g")
    plain, mixed = adapter(tmp).read(stdout, stderr, code), adapter(tmp).read(noisy, stderr, code)
    assert type(mixed.capacity) is type(plain.capacity)
    assert (mixed.error is None) is (plain.error is None)


def test_a_success_with_alarming_words_in_its_text_is_a_success(tmp_path: Path) -> None:
    events = [
        {"type": "init", "session_id": "s"},
        {"type": "message", "role": "user", "content": "fix the 401 in billing-api"},
        {"type": "message", "role": "assistant", "content": "The 429 quota is", "delta": True},
        {"type": "message", "role": "assistant", "content": " fixed.", "delta": True},
        {"type": "result", "status": "success", "stats": {"input_tokens": 3, "output_tokens": 2}},
    ]
    stdout = "".join(json.dumps(e) + "\n" for e in events)
    reading = adapter(tmp_path).read(stdout, "RESOURCE_EXHAUSTED API key not valid 401", 0)
    assert reading.capacity is None and reading.error is None
    assert reading.text == "The 429 quota is fixed."
    assert (reading.input_tokens, reading.output_tokens) == (3, 2)


# -- the structured parts, before any words --------------------------------------------------


def test_a_long_retry_the_cli_made_terminal_is_still_a_window() -> None:
    """Past 300 s the CLI calls a RetryInfo 429 terminal, but it keeps the delay."""
    error = ApiError("TerminalQuotaError", "quota. Suggested retry after 3600s.", 429, 3600.0)
    state = capacity_of(error, AT)
    assert isinstance(state, WindowExhausted)
    assert state.resets_at == AT + timedelta(hours=1)


def test_a_per_day_quota_id_is_credits_even_with_a_retry_time() -> None:
    """The API's body as the result passes it through (no stderr record): its QuotaFailure
    quota id decides, not its retry time."""
    body = {
        "error": {
            "code": 429,
            "message": "You exceeded your current quota, please check your plan and billing "
            "details.\nPlease retry in 31.5s.",
            "status": "RESOURCE_EXHAUSTED",
            "details": [
                {
                    "@type": "type.googleapis.com/google.rpc.QuotaFailure",
                    "violations": [{"quotaId": "GenerateRequestsPerDayPerProjectPerModel"}],
                },
                {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "31s"},
            ],
        }
    }
    error = api_error("", f"[API Error: {json.dumps(body)}]")
    assert error is not None and error.quota_ids == ("GenerateRequestsPerDayPerProjectPerModel",)
    assert error.retry_seconds == 31.0
    assert isinstance(capacity_of(error, AT), CreditsExhausted)


def test_a_per_minute_quota_id_without_a_retry_is_a_minute_window() -> None:
    error = ApiError("ApiError", "quota", 429, None, "RESOURCE_EXHAUSTED", ("PerMinuteFreeTier",))
    state = capacity_of(error, AT)
    assert isinstance(state, WindowExhausted) and state.resets_at == AT + timedelta(seconds=60)


def test_model_capacity_is_a_window_not_credits() -> None:
    error = ApiError("TerminalQuotaError", "No capacity: MODEL_CAPACITY_EXHAUSTED", 429)
    assert isinstance(capacity_of(error, AT), WindowExhausted)


def test_an_error_that_is_neither_quota_nor_key_has_no_capacity_meaning() -> None:
    assert capacity_of(ApiError("ApiError", "Model not found", 404), AT) is None


@given(st.text(max_size=400))
def test_one_line_is_one_line_within_its_limit(text: str) -> None:
    flat = one_line(text)
    assert "\n" not in flat and "\r" not in flat and len(flat) <= 300


# -- the engine's Gemini home ----------------------------------------------------------------


def test_the_adapter_runs_with_its_own_home_and_trusts_the_step_folder(tmp_path: Path) -> None:
    gem = adapter(tmp_path, {"GEMINI_API_KEY": "k", "GOOGLE_GEMINI_BASE_URL": "http://x"})
    home = Path(gem.environment["GEMINI_CLI_HOME"])
    assert home == tmp_path / "state" / "gemini" / "gem"
    written = json.loads((home / ".gemini" / "settings.json").read_text())
    assert written["security"]["auth"]["selectedType"] == "gemini-api-key"
    assert written["general"]["maxAttempts"] == gemini_home.MAX_ATTEMPTS
    task = EngineTask("design.research", "p", 0, "s", 1, {}, None, workdir=tmp_path / "step")
    (tmp_path / "step").mkdir()
    plan = write_plan(tmp_path / "step", task, {}, "gem")
    argv = gem.invocation(task, plan, plan.prompt)
    assert argv[0] == "-p" and "--skip-trust" in argv and "--yolo" in argv
    assert not (tmp_path / "step" / ".gemini").exists()


def test_a_home_of_the_users_own_is_left_alone(tmp_path: Path) -> None:
    own = tmp_path / "mine"
    gem = adapter(tmp_path, {"GEMINI_CLI_HOME": str(own)})
    assert gem.environment["GEMINI_CLI_HOME"] == str(own)
    assert not own.exists() and not (tmp_path / "state" / "gemini").exists()


@pytest.mark.parametrize(
    ("env", "selected"),
    [
        ({"GEMINI_API_KEY": "k"}, "gemini-api-key"),
        ({"GEMINI_API_KEY": "k", "GOOGLE_GENAI_USE_VERTEXAI": "true"}, "vertex-ai"),
        ({"GOOGLE_GEMINI_BASE_URL": "http://x"}, None),
    ],
)
def test_the_auth_type_follows_the_engines_environment(
    env: dict[str, str], selected: str | None
) -> None:
    written = gemini_home.settings(env)
    assert written.get("security", {}).get("auth", {}).get("selectedType") == selected


def test_the_settings_file_is_rewritten_only_when_it_changes(tmp_path: Path) -> None:
    path = gemini_home.write_settings(tmp_path, {"a": 1})
    before = path.stat().st_mtime_ns
    assert gemini_home.write_settings(tmp_path, {"a": 1}) == path
    assert path.stat().st_mtime_ns == before
    gemini_home.write_settings(tmp_path, {"a": 2})
    assert json.loads(path.read_text()) == {"a": 2}
    assert [p.name for p in path.parent.iterdir()] == ["settings.json"]
