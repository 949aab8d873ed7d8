"""aider headless: ``aider --message PROMPT --yes-always --no-stream --no-auto-commits
--no-check-update [effort flags] [args]``.

aider prints human text only. It retries rate limits for about a minute and then gives up —
and has been seen to exit 0 without making the change, so it is judged by the worktree: a
build.implement that changed no file is not a success whatever aider said (the shared rule of
:mod:`actors.agents.cli`). Its tokens and cost come from its "Tokens: 2.3k sent, 1.1k
received. Cost: $0.01 message, $0.02 session." lines; capacity from the known strings.
"""

from __future__ import annotations

import re

from actors.agents import limits
from actors.agents.base import EngineTask
from actors.agents.cli import CliAdapter, Reading
from actors.agents.plans import Plan

TOKENS = re.compile(
    r"Tokens:\s*([\d.]+)(k?)\s*sent,\s*([\d.]+)(k?)\s*received(?:\.\s*Cost:\s*\$([\d.]+))?", re.I
)
APPLIED = re.compile(r"^Applied edit to (.+)$", re.M)
FAILED = re.compile(r"litellm\.\w+Error|Traceback \(most recent call last\)|^Error:", re.M)


class AiderAdapter(CliAdapter):
    adapter = "aider"
    judged_by_worktree = True

    def invocation(self, task: EngineTask, plan: Plan, prompt: str) -> list[str]:
        head = ["--message", prompt, "--yes-always", "--no-stream", "--no-auto-commits"]
        head += ["--no-check-update"]
        return [*head, *self.spec.effort_args(task.effort), *self.spec.args]

    def read(self, stdout: str, stderr: str, returncode: int) -> Reading:
        reading = Reading(text=stdout.strip()[-4000:])
        for match in TOKENS.finditer(stdout):
            reading.turns += 1
            reading.input_tokens += _count(match.group(1), match.group(2))
            reading.output_tokens += _count(match.group(3), match.group(4))
            if match.group(5):
                reading.dollars = (reading.dollars or 0.0) + float(match.group(5))
        reading.files = [path.strip() for path in APPLIED.findall(stdout)]
        said = f"{stdout}\n{stderr}"
        reading.capacity = limits.from_text(said) if FAILED.search(said) or returncode else None
        if reading.capacity is None and returncode != 0:
            reading.error = stderr.strip()[-300:] or f"exit {returncode}"
        return reading


def _count(number: str, unit: str) -> int:
    return int(float(number) * (1000 if unit.lower() == "k" else 1))
