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

``FAKE_EDIT`` (``path|old|new``) is an edit build.implement makes before it reports;
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

ROOT = Path(__file__).resolve().parents[2]
RESET = 1_900_000_000  # 2030-03-17: a reset time the tests can recognise


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
        p.add_argument("--yes-always", action="store_true")
        p.add_argument("--no-stream", action="store_true")
        p.add_argument("--no-auto-commits", action="store_true")
        p.add_argument("--no-check-update", action="store_true")
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


def _span(event: str) -> None:
    state = os.environ.get("FAKE_STATE")
    if state:
        span = {"event": event, "pid": os.getpid(), "cwd": os.getcwd(), "at": time.time()}
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
    before = set(_files())
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
    started = {"type": "thread.started", "thread_id": "th-1"}
    if _common(scenario, started):
        return
    emit(started)
    emit({"type": "turn.started"})
    fail = {
        "window": "You've hit your usage limit. Upgrade or try again at 2030-03-17T17:46:40Z.",
        "credits": "Quota exceeded. Check your plan and billing details.",
        "auth": "unexpected status 401 Unauthorized: Missing bearer authentication",
    }
    if scenario in fail:
        emit({"type": "error", "message": fail[scenario]})
        emit({"type": "turn.failed", "error": {"message": fail[scenario]}})
        sys.exit(1)
    result, files = (
        work(plan_of(args.prompt)) if scenario == "success" else ({"status": "done"}, [])
    )
    if files:
        changes = [{"path": f, "kind": "add"} for f in files]
        emit({"type": "item.completed", "item": {"type": "file_change", "changes": changes}})
    command = {"type": "command_execution", "command": "ls", "exit_code": 0, "status": "completed"}
    emit({"type": "item.completed", "item": command})
    pause()
    message = json.dumps(result)
    emit({"type": "item.completed", "item": {"type": "agent_message", "text": message}})
    usage = {"input_tokens": 900, "cached_input_tokens": 0, "output_tokens": 210}
    emit({"type": "turn.completed", "usage": usage})
    if args.last:
        Path(args.last).write_text(message)


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
    print("Aider v9.9.9 (fake)\nMain model: fake with diff edit format", flush=True)
    if scenario in ("hang", "crash"):
        if scenario == "hang":
            time.sleep(600)
        os.kill(os.getpid(), signal.SIGKILL)
    if scenario == "garbage":
        print("\x00\x01 nothing to see", flush=True)
        return
    fail = {
        "window": "litellm.RateLimitError: rate limit exceeded. Please try again in 60s",
        "credits": "litellm.BadRequestError: Your credit balance is too low to access the API",
        "auth": "litellm.AuthenticationError: invalid x-api-key",
    }
    if scenario in fail:
        print(fail[scenario], flush=True)
        sys.exit(1)
    result, files = (
        work(plan_of(args.prompt)) if scenario == "success" else ({"status": "done"}, [])
    )
    for path in files:
        print(f"Applied edit to {path}")
    pause()
    print("Tokens: 2.3k sent, 1.1k received. Cost: $0.01 message, $0.02 session.")
    print(fenced(result))
