"""The console's phase diagram: the current phase lit, every loop-back drawn, the ones taken
counted, and the cycle shown."""

from __future__ import annotations

import xml.etree.ElementTree as ET

from vibey.console.diagram import LOOP_BACKS, PLACES, PhasePath, phases_entered, render
from workflows.phases import Phase

NS = {"s": "http://www.w3.org/2000/svg"}


def parse(svg: str) -> ET.Element:
    return ET.fromstring(svg)  # well-formed XML, or this raises


def lit(root: ET.Element) -> list[str]:
    return [g.get("data-phase", "") for g in root.iter() if g.get("data-current") == "true"]


def edge(root: ET.Element, a: str, b: str) -> ET.Element:
    found = [
        g for g in root.iter(f"{{{NS['s']}}}g") if g.get("data-from") == a and g.get("data-to") == b
    ]
    assert len(found) == 1, (a, b, len(found))
    return found[0]


def test_the_current_phase_is_the_one_lit() -> None:
    root = parse(render(PhasePath("build", cycle=0, entered=("design", "build"))))
    assert lit(root) == ["build"]
    assert root.get("data-phase") == "build" and root.get("data-status") == "running"
    phases = {g.get("data-phase") for g in root.iter() if "phase" in (g.get("class") or "")}
    assert set(PLACES) <= phases  # every protocol phase is drawn


def test_every_loop_back_is_drawn_and_an_untaken_one_is_marked_so() -> None:
    root = parse(render(PhasePath("design", entered=("design",))))
    for a, b in LOOP_BACKS:
        g = edge(root, a, b)
        assert g.get("data-taken") == "0"
        assert g.get("class") == "edge loop untaken"


def test_loop_backs_taken_are_counted_with_the_cycle() -> None:
    entered = ("design", "build", "review", "build", "review", "design", "build", "review")
    root = parse(render(PhasePath("review", cycle=2, entered=entered)))
    back = edge(root, "review", "build")
    assert back.get("data-taken") == "1" and "taken" in (back.get("class") or "").split()
    assert "×1" in "".join(back.itertext())
    assert edge(root, "review", "design").get("data-taken") == "1"
    assert edge(root, "build", "review").get("data-taken") == "3"
    assert edge(root, "build", "design").get("data-taken") == "0"
    text = "".join(root.itertext())
    assert "cycle 2 · 2 loop-backs" in text


def test_a_finished_workflow_lights_done_and_visited_phases_are_marked() -> None:
    entered = ("design", "build", "review", "done")
    root = parse(render(PhasePath("done", cycle=0, status="completed", entered=entered)))
    assert lit(root) == ["done"]
    classes = {
        g.get("data-phase"): g.get("class") or "" for g in root.iter() if g.get("data-phase")
    }
    assert "visited" in classes[Phase.REVIEW]
    assert "visited" not in classes[Phase.DEPLOY_DESIGN]
    assert "completed" in classes[Phase.DONE]


def test_a_phase_waiting_at_a_gate_says_so() -> None:
    svg = render(PhasePath("design", waiting=True))
    assert "waits at a gate" in svg
    assert "waits at a gate" not in render(PhasePath("design"))


def test_the_compact_diagram_has_no_counts_but_the_same_lit_phase() -> None:
    entered = ("design", "build", "review", "build")
    svg = render(PhasePath("build", cycle=1, entered=entered), compact=True)
    assert lit(parse(svg)) == ["build"] and "×1" not in svg


def test_another_definitions_phases_are_a_chain_with_the_current_lit() -> None:
    root = parse(render(PhasePath("ship", cycle=0, entered=("plan", "ship"))))
    assert lit(root) == ["ship"]
    assert [g.get("data-phase") for g in root.iter() if g.get("data-phase")][1:] == [
        "plan",
        "ship",
    ]


def test_names_are_escaped() -> None:
    svg = render(PhasePath("<script>", entered=("<script>",)))
    assert "<script>" not in svg.replace("<svg", "")
    parse(svg)


def test_phases_entered_reads_the_transition_commands() -> None:
    commands = [
        {"type": "schedule_step", "step": "x"},
        {"type": "transition_phase", "phase": "build", "cycle": 1},
        "not a command",
    ]
    assert phases_entered(commands) == ["build"]
