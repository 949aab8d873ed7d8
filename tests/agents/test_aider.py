"""The aider adapter: its command line (headless, its files kept out of git), and aider's real
output, as aider 0.86.2 printed it against the provider's real error bodies
(tests/real_cli/openai_chat_api.py), read by the adapter: each fault class from litellm's
exception records only, never from paths, file names or the model's own text."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from actors.agents.aider import AiderAdapter, classify, error_records
from actors.agents.base import EngineTask
from actors.agents.cli import Reading
from actors.agents.limits import UNKNOWN_RESET
from actors.agents.plans import Plan, write_plan
from actors.agents.roster import AgentSpec
from workflows.capacity import AuthenticationFailed, CreditsExhausted, WindowExhausted

BANNER = """\
Aider v0.86.2
Model: openai/vibey-test-model with diff edit format
Git repo: .git with 1 files
Repo-map: using 1024 tokens, auto refresh

"""
# Wrapped at 80 columns, as aider printed them into a pipe without COLUMNS (its trailing
# spaces left out).
RATE_LIMIT = """\
litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit reached for
vibey-test-model in organization org-vibeytest on requests per min (RPM): Limit
3, Used 3, Requested 1. Please try again in 20s. Visit
https://platform.openai.com/account/rate-limits to learn more. You can increase
your rate limit by adding a payment method to your account at
https://platform.openai.com/account/billing.
The API provider has rate limited you. Try again later or check your quotas.
Retrying in 0.2 seconds...
"""
QUOTA = """\
litellm.RateLimitError: RateLimitError: OpenAIException - You exceeded your
current quota, please check your plan and billing details. For more information
on this error, read the docs:
https://platform.openai.com/docs/guides/error-codes/api-errors.
The API provider has rate limited you. Try again later or check your quotas.
Retrying in 0.2 seconds...
"""
BAD_KEY = """\
litellm.AuthenticationError: AuthenticationError: OpenAIException - Incorrect
API key provided: sk-vibey*****-key. You can find your API key at
https://platform.openai.com/account/api-keys.
The API provider is not able to authenticate you. Check your API key.

https://platform.openai.com/account/api-keys

"""
NO_RESET = (
    "litellm.RateLimitError: RateLimitError: OpenAIException - Rate limit reached for "
    "vibey-test-model in organization org-vibeytest on tokens per min (TPM).\n"
    "The API provider has rate limited you. Try again later or check your quotas.\n"
    "Retrying in 0.2 seconds...\n"
)
SERVER_ERROR = """\
litellm.InternalServerError: InternalServerError: OpenAIException - The server had an error
The API provider's servers are down or overloaded.
Retrying in 0.2 seconds...
"""
SUCCESS = """\
I will make the change.

billing-api/401.txt
```
<<<<<<< SEARCH
=======
insufficient_quota: 401 Unauthorized, rate limit, invalid api key
>>>>>>> REPLACE
```

```json
{"status": "done"}
```

Tokens: 1.2k sent, 56 received. Cost: $0.0029 message, $0.0029 session.

billing-api/401.txt
Applied edit to billing-api/401.txt
"""


def read(stdout: str, returncode: int = 0) -> Reading:
    spec = AgentSpec(id="aider", adapter="aider")
    adapter = AiderAdapter(spec, worker_env={}, transcripts=Path("/nonexistent"))
    return adapter.read(BANNER + stdout, "Warning: Input is not a terminal (fd=0).", returncode)


def test_a_rate_limit_with_a_reset_is_a_window_at_that_reset_not_credits() -> None:
    """Its message ends with ".../account/billing": a pattern over the whole output read it as
    spent credits."""
    before = datetime.now(UTC)
    capacity = read(RATE_LIMIT).capacity
    assert isinstance(capacity, WindowExhausted)
    assert before + timedelta(seconds=20) <= capacity.resets_at
    assert capacity.resets_at <= datetime.now(UTC) + timedelta(seconds=20)
    assert capacity.detail.startswith("litellm.RateLimitError: RateLimitError: OpenAIException")


def test_a_rate_limit_without_a_reset_waits_the_unknown_reset() -> None:
    capacity = read(NO_RESET).capacity
    assert isinstance(capacity, WindowExhausted)
    left = capacity.resets_at - datetime.now(UTC)
    assert UNKNOWN_RESET - timedelta(seconds=5) < left <= UNKNOWN_RESET


def test_spent_quota_is_credits_though_it_comes_as_a_rate_limit() -> None:
    capacity = read(QUOTA).capacity
    assert isinstance(capacity, CreditsExhausted)
    assert "You exceeded your current quota" in capacity.detail  # unwrapped to one line


def test_an_incorrect_key_is_authentication() -> None:
    capacity = read(BAD_KEY).capacity
    assert isinstance(capacity, AuthenticationFailed)
    assert "Incorrect API key provided" in capacity.detail


def test_a_server_error_is_no_capacity_state_and_a_fault_when_it_was_the_last_word() -> None:
    reading = read(SERVER_ERROR)
    assert reading.capacity is None
    assert "InternalServerError" in (reading.error or "")


def test_an_error_aider_recovered_from_is_no_fault() -> None:
    reading = read(SERVER_ERROR + SUCCESS)
    assert reading.capacity is None and reading.error is None


def test_paths_file_names_and_the_model_s_text_never_classify() -> None:
    """A project named billing-api, a file 401.txt, and a reply that quotes every pattern."""
    reading = read(SUCCESS)
    assert reading.capacity is None and reading.error is None
    assert reading.files == ["billing-api/401.txt"]
    assert reading.input_tokens == 1200 and reading.output_tokens == 56
    assert reading.dollars == 0.0029
    assert '```json\n{"status": "done"}\n```' in reading.text


def test_a_record_still_being_printed_is_not_complete() -> None:
    partial = RATE_LIMIT.split("\n", 2)
    assert error_records(partial[0] + "\n" + partial[1], complete=True) == []
    assert len(error_records(RATE_LIMIT, complete=True)) == 1


@given(
    hours=st.integers(0, 3),
    minutes=st.integers(0, 59),
    seconds=st.decimals(0, 59, places=1),
    millis=st.integers(1, 999),
)
def test_openai_reset_durations_read_in_every_unit(
    hours: int, minutes: int, seconds: Decimal, millis: int
) -> None:
    """ "Please try again in 1h2m3.5s" / "6m0s" / "350ms": Go's duration format."""
    text = "".join(f"{n}{unit}" for n, unit in ((hours, "h"), (minutes, "m"), (seconds, "s")) if n)
    total = hours * 3600 + minutes * 60 + float(seconds)
    if not text:
        text, total = f"{millis}ms", millis / 1000
    message = f"Rate limit reached for m on tokens. Please try again in {text}. Visit x."
    record = error_records(f"litellm.RateLimitError: RateLimitError: {message}\n\n")[0]
    before = datetime.now(UTC)
    state = classify(record)
    assert isinstance(state, WindowExhausted)
    wanted = timedelta(seconds=total)
    assert before + wanted - timedelta(seconds=1) <= state.resets_at
    assert state.resets_at <= datetime.now(UTC) + wanted + timedelta(seconds=1)


# -- the command line ------------------------------------------------------------------------


def plan_in(workdir: Path) -> Plan:
    task = EngineTask("build.implement", "demo", 0, "a1", 1, {"item": {"id": "a1"}}, workdir)
    return write_plan(workdir, task, {}, "aider")


def git(workdir: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=workdir, capture_output=True, text=True, check=True)
    return done.stdout


def test_the_invocation_keeps_aider_headless_and_its_files_out_of_git(tmp_path: Path) -> None:
    workdir = tmp_path / "repo"
    workdir.mkdir()
    git(workdir, "init", "-q")
    plan = plan_in(workdir)
    spec = AgentSpec(id="aider", adapter="aider", args=("--model", "openai/m"))
    adapter = AiderAdapter(spec, worker_env={}, transcripts=tmp_path / "t")
    argv = adapter.invocation(plan_task(), plan, plan.prompt)
    assert argv[:2] == ["--message", plan.prompt]  # the loop service's run verb comes first
    for flag in ("--no-pretty", "--no-gitignore", "--no-analytics", "--no-check-update"):
        assert flag in argv
    assert argv[argv.index("--edit-format") + 1] == "diff"
    assert argv[argv.index("--read") + 1] == str(plan.md_file)
    assert argv[-2:] == ["--model", "openai/m"]  # the engine's args last: they win
    settings = Path(argv[argv.index("--model-settings-file") + 1])
    assert "max_retries: 0" in settings.read_text()
    assert adapter.environment["COLUMNS"] == "4096" and adapter.environment["BROWSER"] == "true"
    # aider's own files (its repo-map cache at the root) are ignored, and only once
    (workdir / ".aider.tags.cache.v4").mkdir()
    (workdir / ".aider.tags.cache.v4" / "cache.db").write_text("x")
    adapter.invocation(plan_task(), plan, plan.prompt)
    assert git(workdir, "status", "--porcelain", "--untracked-files=all") == ""
    assert (workdir / ".git" / "info" / "exclude").read_text().count(".aider*") == 1
    assert not (workdir / ".gitignore").exists()


def test_outside_a_repository_aider_is_told_there_is_no_git(tmp_path: Path) -> None:
    plan = plan_in(tmp_path)
    adapter = AiderAdapter(
        AgentSpec(id="aider", adapter="aider"), worker_env={}, transcripts=tmp_path
    )
    argv = adapter.invocation(plan_task(), plan, plan.prompt)
    assert "--no-git" in argv and "--no-gitignore" not in argv


def test_a_model_settings_file_of_the_engine_s_own_is_left_alone(tmp_path: Path) -> None:
    plan = plan_in(tmp_path)
    spec = AgentSpec(id="aider", adapter="aider", args=("--model-settings-file", "mine.yml"))
    argv = AiderAdapter(spec, worker_env={}, transcripts=tmp_path).invocation(
        plan_task(), plan, plan.prompt
    )
    assert argv.count("--model-settings-file") == 1 and argv[-1] == "mine.yml"
    env = AiderAdapter(
        AgentSpec(id="aider", adapter="aider", env={"COLUMNS": "80"}),
        worker_env={},
        transcripts=tmp_path,
    ).environment
    assert env["COLUMNS"] == "80"  # the engine's env wins


def plan_task() -> EngineTask:
    return EngineTask("build.implement", "demo", 0, "a1", 1, {"item": {"id": "a1"}})


def test_an_edit_that_quotes_an_error_line_is_no_error_record() -> None:
    quoted = "fixtures/log.txt\n```\n<<<<<<< SEARCH\n=======\n" + QUOTA + ">>>>>>> REPLACE\n```\n"
    reading = read(quoted + "\nTokens: 1.2k sent, 56 received.\n")
    assert reading.capacity is None and reading.error is None
    # after the reply, aider's own records count again
    assert isinstance(
        read(quoted + "\nTokens: 1k sent, 5 received.\n" + QUOTA).capacity, CreditsExhausted
    )


def test_a_whole_capacity_record_decides_the_run_and_stops_aider_s_retries() -> None:
    assert read(QUOTA).decided and read(BAD_KEY).decided and read(RATE_LIMIT).decided
    first_line = QUOTA.splitlines(keepends=True)[0]
    assert not read(first_line).decided  # its end not printed yet (a wrapped record)
    assert not read(SERVER_ERROR).decided and not read(SUCCESS).decided
