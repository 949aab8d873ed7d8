"""The web console in a real browser: Playwright drives Debian's headless Chromium against
`vibey console`, a real `vibey worker`, PostgreSQL and RabbitMQ. The demo waits at its first
gate; every gate is answered in the page's form, and the phase diagram moves to DONE without
the page ever being reloaded.

Screenshots of the main pages are saved in the test's folder, and into
``$VIBEY_SCREENSHOTS_DIR`` when it is set (docs/console/ is made that way).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.acceptance.console_process import Console, console_process, wait_feed
from tests.acceptance.stack import DEMO_SCRIPT, Stack
from vibey.console.auth import hash_secret

CHROMIUM = "/usr/bin/chromium"
PASSWORD = "a password for the browser test"
DONE_WITHIN_S = 240.0
SCREENSHOTS = ("workflows", "workflow", "gates", "health", "done")


@pytest.fixture
def console(e2e: Stack, tmp_path: Path) -> Iterator[Console]:
    env = e2e.env | {"VIBEY_CONSOLE_PASSWORD_HASH": hash_secret(PASSWORD)}
    with console_process(env, e2e.workspace.parent, tmp_path / "console.log") as running:
        yield running


@pytest.fixture
def browser() -> Iterator[Any]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"no {CHROMIUM}: install it with `apt-get install -y chromium` (.ci/run does)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        try:
            yield launched
        finally:
            launched.close()


def answer_in_page(page: Any) -> str:
    """Answer the first open gate on the page as a cooperative person: decline the opt-ins,
    accept or retry, grant two attempts, and write a sentence for a free question."""
    gate = page.locator("#gates article.gate").first
    name = gate.get_attribute("data-gate-name") or ""
    kind = gate.get_attribute("data-kind") or ""
    buttons = [b.get_attribute("value") for b in gate.locator("button[name=answer]").all()]
    if name in ("visual.opt_in", "deployment.opt_in"):
        choice = "no"
    elif kind == "ladder_exhausted":
        choice = "2"
    else:
        choice = next((a for a in ("accept", "retry", "yes") if a in buttons), "")
        choice = choice or (buttons[0] if buttons else "")
    if choice and choice in buttons:
        gate.locator(f"button[name=answer][value='{choice}']").click()
    else:
        field = gate.locator("[name=answer]")
        field.fill(
            choice or "Small teams who want a shared todo list they can edit from a browser."
        )
        gate.locator("button[type=submit]").click()
    return f"{name or kind}={choice or 'text'}"


# Every phase the diagram showed, in order, as the live updates swap it in.
WATCH_PHASES = """() => {
  const now = () => document.querySelector('#summary svg.phases')?.dataset.phase;
  window.__phases = [now()];
  new MutationObserver(() => {
    const p = now();
    if (p && window.__phases[window.__phases.length - 1] !== p) window.__phases.push(p);
  }).observe(document.body, { subtree: true, childList: true, attributes: true });
}"""


def phase_of(page: Any) -> tuple[str, str]:
    svg = page.locator("#summary svg.phases")
    return svg.get_attribute("data-phase") or "", svg.get_attribute("data-status") or ""


def shoot(page: Any, folder: Path, name: str, *, full_page: bool = True) -> None:
    page.screenshot(path=str(folder / f"{name}.png"), full_page=full_page)


def test_every_demo_gate_is_answered_in_the_browser_and_the_diagram_reaches_done(
    e2e: Stack, console: Console, browser: Any, tmp_path: Path
) -> None:
    wait_feed(console, "events")  # the pages are woken by the domain events
    e2e.start_worker()
    started = e2e.json("workflow", "start", "demo", "--script", str(DEMO_SCRIPT))
    workflow_id = started["workflow"]["id"]
    shots = tmp_path / "screenshots"
    shots.mkdir()

    page = browser.new_page(viewport={"width": 1280, "height": 900})
    page.set_default_timeout(30_000)
    page.goto(console.url)
    assert "/login" in page.url  # no anonymous access when a password is configured
    page.fill("input[name=username]", "admin")
    page.fill("input[name=password]", PASSWORD)
    page.click("form.login button[type=submit]")
    page.wait_for_url(console.url)

    # The demo waits at its first gate (DESIGN's question): on the overview, then its page.
    page.locator("article.workflow[data-project=demo]").wait_for()
    demo = page.locator("article.workflow[data-project=demo]")
    demo.locator("svg.phases[data-phase=design] g.phase.current.waiting").wait_for()
    assert "waiting on gate design.q.0.audience" in demo.inner_text()
    shoot(page, shots, "workflows")
    page.goto(f"{console.url}gates")
    page.locator("#inbox article.gate").first.wait_for()
    assert "Who is the app for" in page.locator("#inbox").inner_text()
    shoot(page, shots, "gates")
    page.goto(f"{console.url}health")
    page.locator("#queues table, #queues p.bad").first.wait_for()
    shoot(page, shots, "health")

    page.goto(f"{console.url}workflows/{workflow_id}")
    page.locator("#gates article.gate").first.wait_for()
    assert phase_of(page) == ("design", "running")
    assert page.locator("svg.phases [data-current=true]").get_attribute("data-phase") == "design"
    shoot(page, shots, "workflow")
    page.evaluate("window.__notReloaded = true")  # gone if the page is ever loaded again
    page.evaluate(WATCH_PHASES)

    answered: list[str] = []
    deadline = time.monotonic() + DONE_WITHIN_S
    while phase_of(page) != ("done", "completed"):
        assert time.monotonic() < deadline, (
            f"not done in {DONE_WITHIN_S}s: {phase_of(page)}, answered {answered}\n"
            f"{e2e.worker_log()}"
        )
        if page.locator("#gates article.gate").count():
            before = page.locator("#gates article.gate").first.get_attribute("data-gate")
            answered.append(answer_in_page(page))
            page.wait_for_function(  # the answered gate leaves the page (a live update)
                "id => !document.querySelector(`#gates article.gate[data-gate='${id}']`)",
                arg=before,
            )
            assert page.locator(".flash.error").count() == 0, page.locator("#flash").inner_text()
        else:
            page.wait_for_timeout(200)
        assert page.evaluate("window.__notReloaded === true"), "the page was reloaded"

    shoot(page, shots, "done", full_page=False)
    phases_seen = page.evaluate("window.__phases")
    assert phases_seen[0] == "design" and phases_seen[-1] == "done", phases_seen
    assert "build" in phases_seen and "review" in phases_seen, phases_seen
    assert answered[0].startswith("design.q.0.audience"), answered
    # The demo's review finds one issue: REVIEW → BUILD was taken once, and counted.
    loop = page.locator("svg.phases g.edge.loop[data-from=review][data-to=build]")
    assert loop.get_attribute("data-taken") == "1"
    assert "taken" in (loop.get_attribute("class") or "").split()
    assert page.locator("#verify.ok").count() == 1  # the ledger verifies
    final = e2e.status("demo")["workflow"]
    assert (final["status"], final["completion_mode"]) == ("completed", "local")
    # Every answer was recorded as the console's signed-in person, through the gate path.
    ledger = e2e.every("ledger", "show", "demo")
    given = [e for e in ledger if e["kind"] == "AnswerGiven"]
    assert len(given) == len(answered), (answered, given)
    assert {e["payload"]["by"] for e in given} == {"admin@console"}
    # The page's cost is the ledger's: its BudgetSpent events of this workflow, summed here.
    spent = [e for e in ledger if e["kind"] == "BudgetSpent" and e["workflow_id"] == workflow_id]
    page.reload()  # the cost section as it stands now that the workflow is done
    total = page.locator("#cost #cost-total")
    assert int(total.get_attribute("data-events") or -1) == len(spent) > 0
    assert float(total.get_attribute("data-turns") or -1) == sum(
        e["payload"].get("turns", 0) for e in spent
    )
    assert float(total.get_attribute("data-dollars") or -1) == sum(
        e["payload"].get("dollars", 0) for e in spent
    )
    tokens = sum(
        e["payload"].get("input_tokens", 0) + e["payload"].get("output_tokens", 0) for e in spent
    )
    assert int(total.get_attribute("data-tokens") or -1) == tokens
    assert page.locator("#cost tr.cost-engine").count() == 1  # the scripted engine

    target = os.environ.get("VIBEY_SCREENSHOTS_DIR")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        for name in SCREENSHOTS:
            shutil.copy(shots / f"{name}.png", Path(target) / f"{name}.png")
