"""The plan an engine gets: what the step is, the context it needs, and how to report.

:func:`write_plan` writes ``<workdir>/.vibey/plans/<job>.json`` and ``.md`` (git-ignored) and
builds the prompt that names them. The plan holds the kind, the effort, the step's input (its
work item, findings, answers so far), ``context`` (what the handler adds: the accepted spec,
the design answers, the kind's result schema, the constraints, the test command), and where to
report (``<workdir>/.vibey/verdicts/<job>.json``).

The prompt comes from ``actors/agents/prompts/<kind>.md`` (package data; ``default.md`` for a
kind without one); a project overrides it with ``<workdir>/.vibey-prompts/<kind>.md``. The
templates are ``str.format`` text over the names :func:`_fields` gives.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from actors.agents.base import EngineTask
from actors.agents.lease import vibey_dir

OVERRIDES = ".vibey-prompts"


@dataclass(frozen=True, slots=True)
class Plan:
    json_file: Path
    md_file: Path
    verdict_file: Path
    prompt: str
    data: Mapping[str, Any]


def write_plan(workdir: Path, task: EngineTask, context: Mapping[str, Any], engine_id: str) -> Plan:
    base = vibey_dir(workdir)
    name = task.job_id or f"{task.kind}-{task.subject or 'step'}"
    plans, verdicts = base / "plans", base / "verdicts"
    plans.mkdir(exist_ok=True)
    verdicts.mkdir(exist_ok=True)
    verdict_file = verdicts / f"{name}.json"
    verdict_file.unlink(missing_ok=True)  # an earlier attempt's report is not this one's
    data = {
        "kind": task.kind,
        "engine": engine_id,
        "project": task.project_id,
        "cycle": task.cycle,
        "subject": task.subject,
        "attempt": task.attempt,
        "effort": task.effort,
        "input": dict(task.input),
        **dict(context),
        "report": {"verdict_file": str(verdict_file), "or": "a JSON object as the final message"},
    }
    json_file, md_file = plans / f"{name}.json", plans / f"{name}.md"
    json_file.write_text(json.dumps(data, indent=2, sort_keys=True, default=str), "utf-8")
    md_file.write_text(_markdown(data), encoding="utf-8")
    prompt = _template(workdir, task.kind).format(**_fields(data, json_file, md_file, verdict_file))
    handoff = task.input.get("handoff")
    if isinstance(handoff, Mapping) and isinstance(handoff.get("prompt"), str):
        prompt = f"{handoff['prompt']}\n\n{prompt}"
    return Plan(json_file, md_file, verdict_file, prompt, data)


def _template(workdir: Path, kind: str) -> str:
    override = workdir / OVERRIDES / f"{kind}.md"
    if override.is_file():
        return override.read_text(encoding="utf-8")
    folder = resources.files("actors.agents") / "prompts"
    named = folder / f"{kind}.md"
    return (named if named.is_file() else folder / "default.md").read_text(encoding="utf-8")


def _fields(
    data: Mapping[str, Any], json_file: Path, md_file: Path, verdict: Path
) -> dict[str, Any]:
    test = data.get("test_command")
    return {
        "kind": data["kind"],
        "project": data["project"],
        "cycle": data["cycle"],
        "attempt": data["attempt"],
        "effort": data["effort"] or "STANDARD",
        "subject": data["subject"],
        "plan_md": md_file,
        "plan_json": json_file,
        "verdict_file": verdict,
        "schema": json.dumps(data.get("result_schema") or {"type": "object"}, sort_keys=True),
        "test_command": f" with `{test}`" if test else "",
    }


def _markdown(data: Mapping[str, Any]) -> str:
    lines = [f"# {data['kind']}: {data['subject'] or data['project']}", ""]
    lines += [f"- project: {data['project']}, cycle {data['cycle']}, attempt {data['attempt']}"]
    lines += [f"- effort: {data['effort']}", f"- engine: {data['engine']}", ""]
    for key in ("spec", "answers", "input", "findings", "constraints", "result_schema"):
        if data.get(key):
            value = data[key]
            text = value if isinstance(value, str) else json.dumps(value, indent=2, sort_keys=True)
            lines += [f"## {key}", "", text, ""]
    lines += ["## report", "", f"Write the result to {data['report']['verdict_file']}", ""]
    return "\n".join(lines)
