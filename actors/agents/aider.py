"""aider headless: ``aider --message PROMPT --read PLAN --yes-always --no-pretty --no-stream
--edit-format diff --no-auto-commits --no-dirty-commits --no-gitignore --no-analytics
--no-check-update --no-show-release-notes --no-show-model-warnings --no-detect-urls
--chat-history-file … --input-history-file … --model-settings-file … [effort] [args]``.

aider prints human text only. What the flags are for:

* ``--no-pretty``: without it aider renders its reply as markdown even into a pipe, and the
  fences of the reported JSON block are gone;
* ``--edit-format diff``: SEARCH/REPLACE blocks. An unknown model gets ``whole``, where every
  fenced block after a line is a file listing, so the reported ```` ```json ```` block is
  taken for a file and the edits are refused; ``diff`` applies only its marked blocks and
  leaves the JSON block alone, with every model (``args`` may name another format);
* ``--read PLAN``: the plan's markdown goes into the chat, read-only (aider reads no file a
  prompt merely names);
* ``--no-gitignore``: aider would add ``.aider*`` to ``.gitignore``, which lands on the
  integration branch; its files are excluded through the repository's ``info/exclude``
  instead (never committed), and its chat and input histories go to ``.vibey/aider/``.
  Outside a repository ``--no-git`` instead: aider would offer to make one, and
  ``--yes-always`` accept;
* ``--no-analytics``, ``--no-check-update``, ``--no-show-release-notes``,
  ``--no-show-model-warnings``, ``--no-detect-urls``: nothing that asks, or reaches the
  network, in a headless run (``--yes-always`` would answer yes to the analytics question
  and to opening the links of an error in a browser: ``BROWSER`` is ``true`` unless the
  engine's ``env`` names one);
* ``--model-settings-file`` (unless ``args`` give one): ``aider/extra_params`` with
  ``max_retries: 0``, so the OpenAI SDK under litellm does not retry (and sleep out
  ``retry-after``) beneath aider's own retry loop.

**Its result** is the last fenced ```` ```json ```` block of its replies (what precedes its
last ``Tokens: …`` line), or the verdict file. **Its errors** are litellm's exceptions, one
record each, ``litellm.<Name>Error: <Name>Error: <Provider>Exception - <the provider's
message>``, wrapped at the console's width (``COLUMNS`` is set wide); classification reads
those records only (at the start of a line, outside the fenced blocks of a reply), never the
model's text, file names or paths:

* ``RateLimitError`` "You exceeded your current quota" / ``insufficient_quota``, an
  ``APIError`` "insufficient credits": credits spent (OpenAI sends these as 429 too);
* ``AuthenticationError`` ("Incorrect API key provided"): authentication;
* ``RateLimitError`` otherwise: a window, reset at "Please try again in 20s / 1m30s / 350ms"
  (``limits.UNKNOWN_RESET`` when it names none).

aider retries a rate limit itself (0.25 s doubling to 32 s, about 64 s, hard-coded) and then
exits 0 without the change. A run here is stopped at the first capacity record
(``Reading.decided``: its class does not change by waiting), and, since aider has been seen to
exit 0 without making the change, it is judged by the worktree (the shared rule of
:mod:`actors.agents.cli`). Its tokens and cost come from its "Tokens: 2.3k sent, 1.1k
received. Cost: $0.01 message, $0.02 session." lines.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from actors.agents import limits
from actors.agents.base import EngineTask
from actors.agents.cli import CliAdapter, Reading
from actors.agents.plans import Plan
from actors.agents.roster import AgentSpec
from workflows.capacity import AuthenticationFailed, CreditsExhausted, Exhausted

TOKENS = re.compile(
    r"^Tokens:\s*([\d.]+)(k?)\s*sent,\s*([\d.]+)(k?)\s*received(?:\.\s*Cost:\s*\$([\d.]+))?",
    re.I | re.M,
)
APPLIED = re.compile(r"^Applied edit to (.+?)\s*$", re.M)
RECORD = re.compile(r"^litellm\.(\w+Error|Timeout):\s")
"""The first line of an error record: aider prints ``str(exc)`` of litellm's exception."""
FENCE = re.compile(r"^\s*```")
RECORD_END = re.compile(r"^\s*$|^Retrying in [\d.]+ seconds|^The API provider|^litellm\.")
CREDITS = re.compile(
    r"exceeded your current quota|insufficient_quota|insufficient credits|"
    r"credit balance is too low|billing_hard_limit_reached",
    re.I,
)
AUTH = re.compile(r"incorrect api key|invalid api key|invalid x-api-key|invalid_api_key", re.I)
RESET = re.compile(r"(?:try again in|retry after)\s+((?:\d+(?:\.\d+)?(?:ms|h|m|s))+)", re.I)
_UNIT = re.compile(r"(\d+(?:\.\d+)?)(ms|h|m|s)")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}
STATE_DIR = "aider"  # under <workdir>/.vibey/
SETTINGS = "- name: aider/extra_params\n  extra_params:\n    max_retries: 0\n"
EXTRA_ENV: Mapping[str, str] = {
    "COLUMNS": "4096",
    "BROWSER": "true",
    "GIT_CONFIG_COUNT": "2",
    "GIT_CONFIG_KEY_0": "user.name",
    "GIT_CONFIG_VALUE_0": "vibey",
    "GIT_CONFIG_KEY_1": "user.email",
    "GIT_CONFIG_VALUE_1": "vibey@localhost",
}
"""Set unless the engine's ``env`` says: a wide console keeps paths and messages on one line,
no browser opens for the links of an error, and git names an author (without one aider
writes "Your Name" into the repository's ``.git/config``, read-only in a confined run, and
crashes)."""


@dataclass(frozen=True, slots=True)
class ErrorRecord:
    """One litellm exception aider printed: its class name and its text, unwrapped."""

    name: str
    text: str
    at: int  # where it starts in the output


class AiderAdapter(CliAdapter):
    adapter = "aider"
    judged_by_worktree = True

    def __init__(self, spec: AgentSpec, **kwargs: Any) -> None:
        super().__init__(spec, **kwargs)
        # A wide console keeps paths and messages on one line; no browser opens headless.
        extra = {k: v for k, v in EXTRA_ENV.items() if not k.startswith("GIT_CONFIG")}
        if "GIT_CONFIG_COUNT" not in self._env:
            extra = dict(EXTRA_ENV)
        self._env = {**extra, **self._env}

    def invocation(self, task: EngineTask, plan: Plan, prompt: str) -> list[str]:
        state = plan.json_file.parent.parent / STATE_DIR
        state.mkdir(exist_ok=True)
        workdir = plan.json_file.parents[2]
        head = ["--message", prompt, "--read", str(plan.md_file), "--yes-always"]
        if _exclude_aider_files(workdir):
            head += ["--no-gitignore"]
        else:  # not a repository: aider would offer to make one, and --yes-always accept
            head += ["--no-git"]
        head += ["--no-pretty", "--no-stream", "--edit-format", "diff"]
        head += ["--no-auto-commits", "--no-dirty-commits"]
        head += ["--no-analytics", "--no-check-update", "--no-show-release-notes"]
        head += ["--no-show-model-warnings", "--no-detect-urls"]
        head += ["--chat-history-file", str(state / "chat.history.md")]
        head += ["--input-history-file", str(state / "input.history")]
        if "--model-settings-file" not in self.spec.args:
            settings = state / "model.settings.yml"
            settings.write_text(SETTINGS, encoding="utf-8")
            head += ["--model-settings-file", str(settings)]
        return [*head, *self.spec.effort_args(task.effort), *self.spec.args]

    def read(self, stdout: str, stderr: str, returncode: int) -> Reading:
        tokens = list(TOKENS.finditer(stdout))
        replies = stdout[: tokens[-1].start()] if tokens else stdout
        reading = Reading(text=replies.strip())
        for match in tokens:
            reading.turns += 1
            reading.input_tokens += _count(match.group(1), match.group(2))
            reading.output_tokens += _count(match.group(3), match.group(4))
            if match.group(5):
                reading.dollars = (reading.dollars or 0.0) + float(match.group(5))
        reading.files = list(dict.fromkeys(p.strip() for p in APPLIED.findall(stdout)))
        records = error_records(stdout)
        reading.capacity = next((c for c in map(classify, records) if c is not None), None)
        if reading.capacity is not None:
            # Decided once the record is whole: aider's retries would only wait out a class
            # that waiting does not change (vibey's circuit does the waiting), so the run stops.
            whole = error_records(stdout, complete=True)
            reading.decided = any(classify(record) is not None for record in whole)
            return reading
        if records and (not tokens or records[-1].at > tokens[-1].start()):
            # aider gave up after its retries (and exits 0): the last request failed.
            reading.error = f"litellm.{records[-1].name}: {records[-1].text}"[:300]
        elif returncode != 0:
            reading.error = stderr.strip()[-300:] or f"exit {returncode}"
        return reading


def error_records(stdout: str, *, complete: bool = False) -> list[ErrorRecord]:
    """The litellm exceptions aider printed, each unwrapped to one line (a record runs from
    its ``litellm.<Name>Error:`` line to a blank line, aider's own follow-up line or the
    next record); a line inside a fenced block of a reply (an edit quoting such a line) is
    none. ``complete``: only records whose end has been printed."""
    records: list[ErrorRecord] = []
    lines = stdout.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    index, fenced = 0, False
    while index < len(lines):
        line = lines[index]
        if FENCE.match(line) or TOKENS.match(line):
            fenced = bool(FENCE.match(line)) and not fenced  # a reply ends at its Tokens line
        start = None if fenced else RECORD.match(line)
        if start is None:
            index += 1
            continue
        end = index + 1
        while end < len(lines) and not RECORD_END.match(lines[end]):
            end += 1
        if complete and (end >= len(lines) or not lines[end].endswith("\n")):
            break
        text = " ".join(line.strip() for line in lines[index:end])
        records.append(ErrorRecord(start.group(1), text[start.end() :].strip(), offsets[index]))
        index = end
    return records


def classify(record: ErrorRecord) -> Exhausted | None:
    """The capacity state one error record names, if any (see the module docstring)."""
    detail = f"litellm.{record.name}: {record.text}"[:300]
    if CREDITS.search(record.text):
        return CreditsExhausted(detail=detail)
    if record.name == "AuthenticationError" or AUTH.search(record.text):
        return AuthenticationFailed(detail=detail)
    if record.name == "RateLimitError":
        return limits.window(detail, _reset(record.text))
    return None


def _reset(text: str) -> datetime | None:
    """The reset time in OpenAI's words ("Please try again in 20s", "1m30.5s", "350ms")."""
    match = RESET.search(text)
    if match is None:
        return None
    seconds = sum(float(n) * _SECONDS[unit] for n, unit in _UNIT.findall(match.group(1)))
    return limits.now() + timedelta(seconds=seconds)


def _exclude_aider_files(workdir: Path) -> bool:
    """``.aider*`` in the repository's ``info/exclude`` (local, never committed): aider's
    repo-map cache lives at the repository's root. False when ``workdir`` is no repository."""
    done = subprocess.run(
        ["git", "rev-parse", "--git-path", "info/exclude"],
        cwd=workdir,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return False
    exclude = Path(done.stdout.strip())
    exclude = exclude if exclude.is_absolute() else workdir / exclude
    lines = exclude.read_text(encoding="utf-8").splitlines() if exclude.is_file() else []
    if ".aider*" not in lines:
        exclude.parent.mkdir(parents=True, exist_ok=True)
        with exclude.open("a", encoding="utf-8") as file:
            file.write("\n.aider*\n" if lines and lines[-1] else ".aider*\n")
    return True


def _count(number: str, unit: str) -> int:
    return int(float(number) * (1000 if unit.lower() == "k" else 1))
