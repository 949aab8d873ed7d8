"""Fake coding-agent CLIs: ``claude``, ``codex``, ``gemini`` and ``aider`` as their adapters
call them, printing each CLI's real output format (docs/engines.md; the formats are in the
notes the adapters cite).

A test writes an executable per CLI (:func:`install`) that runs :func:`main` with the CLI's
name. Each takes that CLI's real headless flags and refuses others (exit 2, as an argument
parser would), reads the plan the prompt names, and plays ``FAKE_SCENARIO`` (from the engine's
own ``env``):

``success``  does the step's work as the scripted engine would (build.implement edits and
             commits ``src/<item>.txt`` in its worktree) and reports the result
``window``   hits a rate-limit window with a reset time (``FAKE_RESET``, an epoch)
``credits``  runs out of credits (no reset time)
``auth``     fails authentication (claude: after its retries, ``FAKE_RETRY_DELAY`` s apart)
``crash``    dies mid-stream (SIGKILL)
``hang``     prints its first event and hangs
``garbage``  prints what is not its format, exits 0
``noop``     says it succeeded, changed nothing, exits 0

A step input's ``fake_sleep`` (seconds) makes the run sleep before it plays, and its
``fake_exit`` makes it exit with that status then (75: a wind-down). With
``FAKE_STATE`` set, every run appends ``start`` and ``end`` spans (pid, cwd, time) to
``$FAKE_STATE/spans.jsonl`` (a SIGTERM ends the span too; a SIGKILLed run has no ``end``):
the tests count overlaps with them.

A fake imports vibey from this checkout, so an engine that runs one confined (the default)
lists :data:`SOURCE` in its ``read_allow``, and the ``FAKE_STATE`` directory in its
``write_allow``.

A confined run's span carries its PID namespace (``ns``): :func:`span_key` tells runs apart,
:func:`host_pid` finds the process from outside.

``FAKE_EDIT`` (``path|old|new``) is an edit build.implement makes before it reports;
``FAKE_SHARED`` (``path|item,item…``) makes build.implement of each listed item rewrite the
first line of ``path`` with its title (two listed items conflict on that line), and
``FAKE_RESOLVE=fail`` makes build.resolve give up (it reports a failure, the conflict left);
otherwise build.resolve keeps both sides, as the scripted engine does;
``FAKE_PAUSE`` (seconds) is how long it waits between its work's events and its report.
``FAKE_SCENARIO`` may also be ``credits-after:N``: success for the first N runs of this engine
(counted in ``FAKE_STATE``, a directory), credits after; or ``credits-on:KIND``: credits spent
for steps of KIND, success for the others. Every run appends its scenario to
``$FAKE_STATE/runs.log`` when ``FAKE_STATE`` is set.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from workflows.strict_schema import encode, strict_problem, with_failure_report

ROOT = Path(__file__).resolve().parents[2]
SOURCE = str(ROOT)  # a confined fake reads vibey from here: its engine's read_allow
RESET = 1_900_000_000  # 2030-03-17: a reset time the tests can recognise
AIDER_FLAGS = (
    "--yes-always",
    "--no-pretty",
    "--no-stream",
    "--no-auto-commits",
    "--no-dirty-commits",
    "--no-gitignore",
    "--no-git",
    "--no-analytics",
    "--no-check-update",
    "--no-show-release-notes",
    "--no-show-model-warnings",
    "--no-detect-urls",
)


def install(directory: Path) -> dict[str, Path]:
    """Writes the four fake executables into ``directory``; their paths by CLI name."""
    directory.mkdir(parents=True, exist_ok=True)
    paths = {}
    for cli in ("claude", "codex", "gemini", "aider"):
        path = directory / cli
        path.write_text(
            f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(ROOT)!r})\n"
            f"from tests.agents.fake_cli import main\nmain({cli!r})\n"
        )
        path.chmod(0o755)
        paths[cli] = path
    return paths


def parser(cli: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=cli, add_help=False)
    if cli == "claude":
        p.add_argument("-p", "--print", dest="prompt", required=True)
        p.add_argument("--output-format", choices=["text", "json", "stream-json"], default="text")
        p.add_argument("--verbose", action="store_true")
        p.add_argument("--permission-mode", choices=["acceptEdits", "bypassPermissions"])
        p.add_argument("--max-turns", type=int)
        p.add_argument("--model")
    elif cli == "codex":
        p.add_argument("command", choices=["exec"])
        p.add_argument("--json", action="store_true")
        p.add_argument("--sandbox", choices=["read-only", "workspace-write", "danger-full-access"])
        p.add_argument("--skip-git-repo-check", action="store_true")
        p.add_argument("--output-schema")
        p.add_argument("-o", "--output-last-message", dest="last")
        p.add_argument("-m", "--model")
        p.add_argument("prompt")
    elif cli == "gemini":
        p.add_argument("-p", "--prompt", dest="prompt", required=True)
        p.add_argument("--output-format", choices=["text", "json", "stream-json"], default="text")
        p.add_argument("--yolo", action="store_true")
        p.add_argument("--skip-trust", action="store_true")
        p.add_argument("-m", "--model")
    else:
        p.add_argument("--message", dest="prompt", required=True)
        p.add_argument("--read", action="append")
        p.add_argument("--edit-format", choices=["diff", "whole", "udiff", "diff-fenced"])
        for value in ("--chat-history-file", "--input-history-file", "--model-settings-file"):
            p.add_argument(value)
        for flag in AIDER_FLAGS:
            p.add_argument(flag, action="store_true")
        p.add_argument("--model")
    p.add_argument("--version", action="store_true")
    return p


def main(cli: str) -> None:
    if sys.argv[1:] == ["--version"]:
        print(f"{cli} 9.9.9 (fake)")
        return
    args = parser(cli).parse_args()
    if cli == "claude" and args.output_format == "stream-json" and not args.verbose:
        sys.exit("Error: When using --print, --output-format=stream-json requires --verbose")
    scenario = _scenario(cli, getattr(args, "prompt", ""))
    play = {"claude": claude, "codex": codex, "gemini": gemini, "aider": aider}[cli]
    _span("start")
    signal.signal(signal.SIGTERM, _stopped)
    try:
        _pause(getattr(args, "prompt", ""))
        play(scenario, args)
    finally:
        _span("end")


def _stopped(signum: int, frame: object) -> None:
    """A stop (a supersede, a drain, the service gone): the span ends now, as the run does."""
    _span("end")
    os._exit(128 + signum)


def _pid_ns(pid: int | str = "self") -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def span_key(span: dict[str, Any]) -> tuple[str, int]:
    """What tells runs apart: a confined run's pid is its own PID namespace's number."""
    return span.get("ns", ""), int(span["pid"])


def host_pid(span: dict[str, Any]) -> int | None:
    """The process a span names, as this process's /proc numbers it (a confined run records
    the number its PID namespace gave it); None when it is gone."""
    if span.get("ns", "") in ("", _pid_ns()):
        return int(span["pid"])
    for name in filter(str.isdigit, os.listdir("/proc")):
        if _pid_ns(name) != span["ns"]:
            continue
        try:
            with open(f"/proc/{name}/status") as status:
                line = next(x for x in status if x.startswith("NSpid:"))
        except (OSError, StopIteration):
            continue
        if int(line.split()[-1]) == span["pid"]:
            return int(name)
    return None


def _span(event: str) -> None:
    state = os.environ.get("FAKE_STATE")
    if state:
        span = {"event": event, "pid": os.getpid(), "ns": _pid_ns(), "cwd": os.getcwd()}
        span["at"] = time.time()
        with (Path(state) / "spans.jsonl").open("a") as spans:
            spans.write(json.dumps(span) + "\n")


def _pause(prompt: str) -> None:
    if re.search(r"\.vibey/plans/", prompt):
        step_input = plan_of(prompt)["input"]
        seconds = float(step_input.get("fake_sleep", 0))
        if seconds > 0:
            time.sleep(seconds)
        if "fake_exit" in step_input:
            sys.exit(int(step_input["fake_exit"]))


def _scenario(cli: str, prompt: str) -> str:
    scenario = os.environ.get("FAKE_SCENARIO", "success")
    if scenario.startswith("credits-on:"):  # credits spent for one kind only
        kind = re.search(r"\.vibey/plans/", prompt) and plan_of(prompt)["kind"]
        scenario = "credits" if kind == scenario.partition(":")[2] else "success"
    state = os.environ.get("FAKE_STATE")
    if state:
        Path(state).mkdir(parents=True, exist_ok=True)
    if scenario.startswith("credits-after:"):
        limit = int(scenario.partition(":")[2])
        counter = Path(state or ".") / f"{cli}-{os.environ.get('FAKE_ID', cli)}.count"
        runs = int(counter.read_text()) if counter.exists() else 0
        counter.write_text(str(runs + 1))
        scenario = "success" if runs < limit else "credits"
    if state:
        with (Path(state) / "runs.log").open("a") as log:
            log.write(f"{os.environ.get('FAKE_ID', cli)} {scenario} {os.getcwd()}\n")
    return scenario


# -- the step's work -------------------------------------------------------------------------


def plan_of(prompt: str) -> dict[str, Any]:
    match = re.search(r"(\S+/\.vibey/plans/\S+\.json)", prompt)
    if match is None:
        sys.exit("fake: the prompt names no plan file")
    data: dict[str, Any] = json.loads(Path(match.group(1).rstrip(").,")).read_text())
    return data


def work(plan: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """The scripted engine's answer for the plan's step (and the files it wrote)."""
    from actors.agents import EngineTask, ScriptedEngine

    kind = plan["kind"]
    if kind == "build.resolve":
        return resolve_work(plan)
    before = set(_files())
    shared_edit(plan)
    edit = os.environ.get("FAKE_EDIT")  # "path|old|new": the fix a real agent would make
    if kind == "build.implement" and edit:
        path, old, new = edit.split("|")
        target = Path.cwd() / path
        if target.is_file() and old in target.read_text():
            target.write_text(target.read_text().replace(old, new))
    task = EngineTask(
        kind,
        plan["project"],
        plan["cycle"],
        plan["subject"],
        plan["attempt"],
        plan["input"],
        Path.cwd() if kind == "build.implement" else None,
        effort=plan.get("effort"),
    )
    verdict = ScriptedEngine().run(task)
    if verdict.status == "failed":
        return {"status": "failed", "detail": verdict.detail}, []
    return dict(verdict.result), sorted(set(_files()) - before) or _touched(kind, plan)


def shared_edit(plan: dict[str, Any]) -> None:
    """``FAKE_SHARED`` (``path|item,item``): a listed item's build.implement rewrites the first
    line of ``path`` with its title, so two listed items edit the same line of one file."""
    shared = os.environ.get("FAKE_SHARED")
    item = plan["input"].get("item") or {}
    if plan["kind"] != "build.implement" or not shared or not isinstance(item, dict):
        return
    path, _, listed = shared.partition("|")
    if item.get("id") not in listed.split(","):
        return
    target = Path.cwd() / path
    lines = target.read_text().splitlines(keepends=True) if target.is_file() else []
    target.write_text("".join([f"{item.get('title', item['id'])}\n", *lines[1:]]))


def resolve_work(plan: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """build.resolve in the item's worktree (the cwd): ``FAKE_RESOLVE=fail`` gives up, leaving
    the conflict; otherwise both sides are kept (the scripted engine's resolution)."""
    from actors.agents import EngineTask, ScriptedEngine

    files = [f for f in plan["input"].get("files") or [] if isinstance(f, str)]
    if os.environ.get("FAKE_RESOLVE") == "fail":
        return {"status": "failed", "detail": f"cannot reconcile {', '.join(files)}"}, []
    task = EngineTask(
        plan["kind"],
        plan["project"],
        plan["cycle"],
        plan["subject"],
        plan["attempt"],
        plan["input"],
        Path.cwd(),
        effort=plan.get("effort"),
    )
    verdict = ScriptedEngine().run(task)
    return dict(verdict.result), files


def _files() -> list[str]:
    here = Path.cwd()
    return [
        str(p.relative_to(here))
        for p in here.rglob("*")
        if ".git" not in p.parts and ".vibey" not in p.parts and p.is_file()
    ]


def _touched(kind: str, plan: dict[str, Any]) -> list[str]:
    item = plan["input"].get("item")
    return [f"src/{item['id']}.txt"] if kind == "build.implement" and item else []


def fenced(result: dict[str, Any]) -> str:
    return f"Done.\n```json\n{json.dumps(result)}\n```"


def emit(event: dict[str, Any]) -> None:
    print(json.dumps(event), flush=True)


def pause() -> None:
    """``FAKE_PAUSE`` seconds between the work's events and the final report, as a real agent
    takes its time (what was printed so far is flushed first)."""
    sys.stdout.flush()
    time.sleep(float(os.environ.get("FAKE_PAUSE", "0")))


def _common(scenario: str, first: dict[str, Any]) -> bool:
    """The scenarios every CLI plays alike; True when it played one."""
    if scenario == "garbage":
        print("<<< this is not the format >>>\n\x00\x01 garbage", flush=True)
        return True
    if scenario in ("hang", "crash"):
        emit(first)
        if scenario == "hang":
            time.sleep(600)
        os.kill(os.getpid(), signal.SIGKILL)
    return False


# -- claude ----------------------------------------------------------------------------------


def claude(scenario: str, args: argparse.Namespace) -> None:
    init = {"type": "system", "subtype": "init", "session_id": "s-1", "tools": ["Write"]}
    if _common(scenario, init):
        return
    emit(init)
    reset = int(os.environ.get("FAKE_RESET", RESET))
    fail = {  # Claude Code 2.1's own words (a subscription's window; an API key's errors)
        "window": ("rate_limit", f"You've hit your 5-hour limit · resets {_when(reset)}", 429),
        "credits": ("billing_error", "Credit balance is too low", 400),
        "auth": ("authentication_failed", "Invalid API key · Fix external API key", 401),
    }
    if scenario in fail:
        error, text, status = fail[scenario]
        if scenario == "window":
            info = {"status": "rejected", "resetsAt": reset, "rateLimitType": "five_hour"}
            emit({"type": "rate_limit_event", "rate_limit_info": info})
        if scenario == "auth":  # it retries a 401 ten times, FAKE_RETRY_DELAY s apart
            _claude_retries(error, status)
        message = {"content": [{"type": "text", "text": text}]}
        emit({"type": "assistant", "message": message, "error": error, "api_error_status": status})
        emit({**_claude_result(text, is_error=True), "api_error_status": status})
        sys.exit(1)
    result, files = (
        work(plan_of(args.prompt)) if scenario == "success" else ({"status": "done"}, [])
    )
    for path in files:  # Claude Code's edit tools take absolute paths
        write = {"file_path": str(Path.cwd() / path), "content": "…"}
        tool = {"type": "tool_use", "id": "t1", "name": "Write", "input": write}
        emit({"type": "assistant", "message": {"content": [tool]}})
    pause()
    emit(_claude_result(fenced(result), is_error=False))


def _when(epoch: int) -> str:
    """A reset as Claude Code writes it: ``Mar 17, 2030, 5:46pm (UTC)``."""
    at = datetime.fromtimestamp(epoch, UTC)
    hour, half = at.hour % 12 or 12, "am" if at.hour < 12 else "pm"
    return f"{at:%b} {at.day}, {at.year}, {hour}:{at:%M}{half} (UTC)"


def _claude_retries(error: str, status: int, retries: int = 10) -> None:
    delay = float(os.environ.get("FAKE_RETRY_DELAY", "0"))
    for attempt in range(1, retries + 1):
        retry = {"type": "system", "subtype": "api_retry", "attempt": attempt}
        retry |= {"max_retries": retries, "retry_delay_ms": int(delay * 1000)}
        emit({**retry, "error": error, "error_status": status, "session_id": "s-1"})
        time.sleep(delay)


def _claude_result(text: str, *, is_error: bool) -> dict[str, Any]:
    return {
        "type": "result",
        "subtype": "error_during_execution" if is_error else "success",
        "is_error": is_error,
        "num_turns": 3,
        "result": text,
        "session_id": "s-1",
        "total_cost_usd": 0.042,
        "usage": {"input_tokens": 1200, "output_tokens": 340, "cache_read_input_tokens": 0},
    }


# -- codex -----------------------------------------------------------------------------------


def codex(scenario: str, args: argparse.Namespace) -> None:
    """codex 0.171 as the real one behaves behind the Responses API (tests/real_cli): a
    non-strict ``--output-schema`` is refused as the API refuses it, the answer is of the
    strict schema's shape, and its failures are the real messages (a usage limit's reset a
    local clock time, in the process's ``TZ``)."""
    started = {"type": "thread.started", "thread_id": "th-1"}
    if _common(scenario, started):
        return
    emit(started)
    emit({"type": "turn.started"})
    refused = _codex_schema_refusal(args.output_schema)
    reset = datetime.fromtimestamp(int(os.environ.get("FAKE_RESET", RESET)), UTC).astimezone()
    fail = {
        "window": "You’ve hit your usage limit. Upgrade to Pro (https://chatgpt.com/explore/pro), "
        "visit https://chatgpt.com/settings/usage to purchase more credits or try again at "
        f"{_codex_clock(reset)}.",
        "credits": "Quota exceeded. Check your plan and billing details.",
        "auth": "unexpected status 401 Unauthorized: Incorrect API key provided: sk-***9. You "
        "can find your API key at https://platform.openai.com/account/api-keys., url: "
        "https://api.openai.com/v1/responses, request id: req_1",
    }
    message = refused or fail.get(scenario)
    if message:
        emit({"type": "error", "message": message})
        emit({"type": "turn.failed", "error": {"message": message}})
        sys.exit(1)
    plan = plan_of(args.prompt) if scenario == "success" else None
    result, files = work(plan) if plan else ({"status": "done"}, [])
    if files:
        changes = [{"path": str(Path.cwd() / f), "kind": "add"} for f in files]
        item = {"type": "file_change", "changes": changes, "status": "completed"}
        emit({"type": "item.completed", "item": item})
    command = {"type": "command_execution", "command": "ls", "exit_code": 0, "status": "completed"}
    emit({"type": "item.completed", "item": command})
    pause()
    declared = (plan or {}).get("result_schema") or {"type": "object"}
    answer = json.dumps(encode(result, with_failure_report(declared)))
    emit({"type": "item.completed", "item": {"type": "agent_message", "text": answer}})
    usage = {"input_tokens": 900, "cached_input_tokens": 0, "output_tokens": 210}
    emit({"type": "turn.completed", "usage": usage})
    if args.last:
        Path(args.last).write_text(answer)


def _codex_schema_refusal(path: str | None) -> str | None:
    """The API's 400 for a schema outside the strict subset, as Codex reports it."""
    if not path:
        return None
    found = strict_problem(json.loads(Path(path).read_text()))
    if found is None:
        return None
    error = {
        "message": f"Invalid schema for response_format 'codex_output_schema': {found}",
        "type": "invalid_request_error",
        "param": "text.format.schema",
        "code": "invalid_json_schema",
    }
    return json.dumps({"error": error})


def _codex_clock(at: datetime) -> str:
    """A reset as Codex prints it (codex-rs ``format_retry_timestamp``): "8:15 AM" today,
    "Dec 4th, 2026 8:15 AM" another day, in local time."""
    clock = f"{at.hour % 12 or 12}:{at.minute:02d} {'AM' if at.hour < 12 else 'PM'}"
    if at.date() == datetime.now(at.tzinfo).date():
        return clock
    day = at.day
    suffix = "th" if 11 <= day <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(day % 10, "th")
    return f"{at.strftime('%b')} {day}{suffix}, {at.year} {clock}"


# -- gemini ----------------------------------------------------------------------------------


def gemini(scenario: str, args: argparse.Namespace) -> None:
    if not (args.skip_trust or os.environ.get("GEMINI_CLI_TRUST_WORKSPACE") == "true"):
        print(f"\x1b[31m{GEMINI_UNTRUSTED}\x1b[0m", file=sys.stderr)  # as 0.61 refuses it
        sys.exit(55)
    init = {"type": "init", "session_id": "g-1", "model": "gemini-2.5-pro"}
    if _common(scenario, init):
        return
    emit(init)
    emit({"type": "message", "role": "user", "content": args.prompt})
    if scenario in GEMINI_FAULTS:
        kind, message, props, status = GEMINI_FAULTS[scenario]
        print(_gemini_record(kind, message, props), file=sys.stderr)
        error = {"type": "unknown", "message": f"[API Error: {message}]"}
        emit({"type": "result", "status": "error", "error": error, "stats": _gemini_stats(0)})
        sys.exit(status % 256)  # 0.61 exits with the API error's HTTP status
    result, files = (
        work(plan_of(args.prompt)) if scenario == "success" else ({"status": "done"}, [])
    )
    for path in files:
        parameters = {"file_path": str(Path.cwd() / path), "content": "..."}
        emit(
            {
                "type": "tool_use",
                "tool_name": "write_file",
                "tool_id": "w1",
                "parameters": parameters,
            }
        )
        emit({"type": "tool_result", "tool_id": "w1", "status": "success"})
    pause()
    emit({"type": "message", "role": "assistant", "content": fenced(result), "delta": True})
    emit({"type": "result", "status": "success", "stats": _gemini_stats(950)})


GEMINI_UNTRUSTED = (
    "Gemini CLI is not running in a trusted directory. To proceed, either use `--skip-trust`, "
    "set the `GEMINI_CLI_TRUST_WORKSPACE=true` environment variable, or trust this directory "
    "in interactive mode."
)
_KEY = "API key not valid. Please pass a valid API key."
GEMINI_FAULTS: dict[str, tuple[str, str, str, int]] = {
    # a 429 whose RetryInfo says 3600 s: past 300 s the CLI makes it terminal, with the delay
    "window": (
        "TerminalQuotaError",
        "You exceeded your current quota, please check your plan and billing details.\n"
        "Suggested retry after 3600s.",
        "  retryDelayMs: 3600000,\n  status: 429",
        429,
    ),
    "credits": (
        "TerminalQuotaError",
        "You have exhausted your daily quota on this model.",
        "  status: 429",
        429,
    ),
    "auth": (
        "_ApiError",
        json.dumps(
            {
                "error": {
                    "code": 400,
                    "message": _KEY,
                    "status": "INVALID_ARGUMENT",
                    "details": [
                        {
                            "@type": "type.googleapis.com/google.rpc.ErrorInfo",
                            "reason": "API_KEY_INVALID",
                            "domain": "googleapis.com",
                        }
                    ],
                }
            }
        ),
        "  status: 400",
        400,
    ),
}


def _gemini_record(kind: str, message: str, props: str) -> str:
    """The error record 0.61 writes on stderr when the chat turn fails: the class and its
    message, the stack, the error's own fields."""
    return (
        "Error when talking to Gemini API Full report available at: "
        f"/tmp/gemini-client-error-Turn.run-sendMessageStream.json {kind}: {message}\n"
        "    at retryWithBackoff (file:///gemini/bundle/chunk.js:1:1) {\n"
        f"{props}\n}}"
    )


def _gemini_stats(tokens: int) -> dict[str, Any]:
    return {
        "total_tokens": tokens,
        "input_tokens": tokens * 8 // 10,
        "output_tokens": tokens - tokens * 8 // 10,
        "cached": 0,
        "duration_ms": 1200,
        "tool_calls": 1 if tokens else 0,
    }


# -- aider -----------------------------------------------------------------------------------


def aider(scenario: str, args: argparse.Namespace) -> None:
    """aider 0.86 with ``--no-pretty``: its banner, litellm's exception text for an API error
    (then "Retrying in …" for a retried one; aider exits 0 either way), the reply verbatim,
    its "Tokens:" line and "Applied edit to" per file."""
    print(f"Aider v9.9.9 (fake)\nModel: openai/fake with {args.edit_format} edit format")
    print("Git repo: .git with 1 files\nRepo-map: using 1024 tokens, auto refresh\n", flush=True)
    if scenario in ("hang", "crash"):
        if scenario == "hang":
            time.sleep(600)
        os.kill(os.getpid(), signal.SIGKILL)
    if scenario == "garbage":
        print("\x00\x01 nothing to see", flush=True)
        return
    exception = "OpenAIException - Error code: 429"
    fail = {
        "window": f"RateLimitError: RateLimitError: {exception} - Rate limit reached for fake "
        "in organization org-fake on requests per min (RPM): Limit 3, Used 3, Requested 1. "
        "Please try again in 60s. Visit https://platform.openai.com/account/rate-limits to "
        "learn more. You can increase your rate limit by adding a payment method to your "
        "account at https://platform.openai.com/account/billing.",
        "credits": f"RateLimitError: RateLimitError: {exception} - You exceeded your current "
        "quota, please check your plan and billing details. For more information on this "
        "error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
        "auth": "AuthenticationError: AuthenticationError: OpenAIException - Incorrect API key "
        "provided: sk-fake. You can find your API key at "
        "https://platform.openai.com/account/api-keys.",
    }
    if scenario in fail:
        print(f"litellm.{fail[scenario]}")
        if scenario == "auth":
            print("The API provider is not able to authenticate you. Check your API key.")
        else:
            print("The API provider has rate limited you. Try again later or check your quotas.")
            print("Retrying in 0.2 seconds...")
        return
    result, files = (
        work(plan_of(args.prompt)) if scenario == "success" else ({"status": "done"}, [])
    )
    print("I will make the change.\n")
    for path in files:
        print(f"{path}\n```\n<<<<<<< SEARCH\n=======\nthe new text\n>>>>>>> REPLACE\n```\n")
    print(fenced(result))
    print("\nTokens: 2.3k sent, 1.1k received. Cost: $0.01 message, $0.02 session.\n")
    for path in files:
        print(f"Applied edit to {path}", flush=True)
    pause()
