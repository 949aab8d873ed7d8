"""The phase diagram: an SVG of the protocol's phases with the current one lit, every
loop-back drawn (bold, with how often it was taken, once taken) and the cycle counted.

Pure: a :class:`PhasePath` (the phase, the cycle, the phases passed through in order) in, SVG
text out. The layout is the one in docs/protocol.md: the product phases on the top row, the
deploy phases below; loop-backs arc above the top row and below the bottom one. A workflow
whose phases are not the protocol's gets a plain chain of the phases it passed through.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html import escape
from itertools import pairwise

from workflows.phases import Phase

NODE_W, NODE_H = 112, 40
STEP_X, LEFT = 132, 16
ROW_Y = (64, 176)
WIDTH = LEFT * 2 + STEP_X * 6 + NODE_W
HEIGHT = 268

# Where each phase is drawn: (column, row).
PLACES: dict[str, tuple[int, int]] = {
    Phase.INTAKE: (0, 0),
    Phase.DESIGN: (1, 0),
    Phase.VISUAL_DESIGN: (2, 0),
    Phase.BUILD: (3, 0),
    Phase.REVIEW: (4, 0),
    Phase.DONE: (6, 0),
    Phase.DEPLOY_DESIGN: (4, 1),
    Phase.DEPLOY_EXECUTE: (5, 1),
    Phase.DEPLOY_REVIEW: (6, 1),
}
FORWARD: tuple[tuple[str, str], ...] = (
    (Phase.INTAKE, Phase.DESIGN),
    (Phase.DESIGN, Phase.VISUAL_DESIGN),
    (Phase.VISUAL_DESIGN, Phase.BUILD),
    (Phase.DESIGN, Phase.BUILD),
    (Phase.BUILD, Phase.REVIEW),
    (Phase.REVIEW, Phase.DONE),
    (Phase.REVIEW, Phase.DEPLOY_DESIGN),
    (Phase.REVIEW, Phase.DEPLOY_EXECUTE),
    (Phase.DEPLOY_DESIGN, Phase.DEPLOY_EXECUTE),
    (Phase.DEPLOY_EXECUTE, Phase.DEPLOY_REVIEW),
    (Phase.DEPLOY_REVIEW, Phase.DONE),
)
# The protocol's loop-backs (docs/protocol.md, "Loop-backs"): each starts a new cycle or round.
LOOP_BACKS: tuple[tuple[str, str], ...] = (
    (Phase.BUILD, Phase.DESIGN),
    (Phase.REVIEW, Phase.BUILD),
    (Phase.REVIEW, Phase.DESIGN),
    (Phase.DEPLOY_REVIEW, Phase.DEPLOY_DESIGN),
    (Phase.DEPLOY_REVIEW, Phase.DEPLOY_EXECUTE),
    (Phase.DEPLOY_REVIEW, Phase.REVIEW),
    (Phase.DEPLOY_REVIEW, Phase.BUILD),
    (Phase.DEPLOY_REVIEW, Phase.DESIGN),
)


@dataclass(frozen=True, slots=True)
class PhasePath:
    """Where a workflow is (``phase``, ``cycle``, ``status``) and the phases it entered in
    order (``entered``: from its history's transitions; may be empty)."""

    phase: str
    cycle: int = 0
    status: str = "running"
    entered: tuple[str, ...] = ()
    waiting: bool = False  # a gate of it is open

    def moves(self) -> Counter[tuple[str, str]]:
        """How often each move from one phase to another was made."""
        path = [Phase.INTAKE.value, *self.entered]
        return Counter((a, b) for a, b in pairwise(path) if a != b)

    def visited(self) -> set[str]:
        return {Phase.INTAKE.value, *self.entered, self.phase}


def phases_entered(commands: Iterable[object]) -> list[str]:
    """The phases of the ``transition_phase`` commands among a history's encoded commands."""
    out: list[str] = []
    for command in commands:
        if isinstance(command, dict) and command.get("type") == "transition_phase":
            out.append(str(command.get("phase")))
    return out


def render(path: PhasePath, *, compact: bool = False) -> str:
    """The diagram as an ``<svg>`` element (``compact``: smaller, without move counts)."""
    if not {path.phase, *path.entered} <= set(PLACES):
        return _chain(path)
    moves = path.moves()
    parts = [_edge(a, b, moves[(a, b)], back=False, counts=not compact) for a, b in FORWARD]
    parts += [_edge(a, b, moves[(a, b)], back=True, counts=not compact) for a, b in LOOP_BACKS]
    parts += [_node(p, path) for p in PLACES]
    loops = sum(moves[edge] for edge in LOOP_BACKS)
    parts.append(
        f'<text class="cycles" x="{WIDTH - LEFT}" y="{HEIGHT - 8}" text-anchor="end">'
        f"cycle {path.cycle} · {loops} loop-back{'' if loops == 1 else 's'}</text>"
    )
    return _svg(path, WIDTH, HEIGHT, parts, compact)


def _svg(path: PhasePath, width: int, height: int, parts: Sequence[str], compact: bool) -> str:
    scale = 0.55 if compact else 1.0
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" class="phases" role="img" '
        f'viewBox="0 0 {width} {height}" width="{width * scale:.0f}" '
        f'height="{height * scale:.0f}" data-phase="{escape(path.phase)}" '
        f'data-cycle="{path.cycle}" data-status="{escape(path.status)}">'
        f"<title>phase {escape(path.phase)}, cycle {path.cycle}, {escape(path.status)}</title>"
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="9" '
        'markerHeight="9" markerUnits="userSpaceOnUse" orient="auto-start-reverse">'
        '<path d="M0,0 L10,5 L0,10 z" '
        'fill="context-stroke"/></marker></defs>' + "".join(parts) + "</svg>"
    )


def _box(phase: str) -> tuple[float, float]:
    col, row = PLACES[phase]
    return LEFT + col * STEP_X, ROW_Y[row]


def _node(phase: str, path: PhasePath) -> str:
    x, y = _box(phase)
    current = phase == path.phase
    classes = ["phase"]
    if phase in path.visited():
        classes.append("visited")
    if current:
        classes.append(f"current {path.status}")
        if path.waiting:
            classes.append("waiting")
    lit = ' data-current="true"' if current else ""
    label = phase.replace("_", " ").upper()
    badge = ""
    if current and path.waiting:
        badge = f'<text class="badge" x="{x + NODE_W / 2}" y="{y + NODE_H + 14}" ' + (
            'text-anchor="middle">waits at a gate</text>'
        )
    return (
        f'<g class="{" ".join(classes)}" data-phase="{escape(phase)}"{lit}>'
        f'<rect x="{x}" y="{y}" width="{NODE_W}" height="{NODE_H}" rx="8"/>'
        f'<text x="{x + NODE_W / 2}" y="{y + NODE_H / 2 + 4}" text-anchor="middle">'
        f"{escape(label)}</text>{badge}</g>"
    )


def _edge(a: str, b: str, taken: int, *, back: bool, counts: bool) -> str:
    d, lx, ly = _route(a, b, back)
    kind = "loop" if back else "forward"
    state = "taken" if taken else "untaken"
    label = ""
    if taken and counts and (back or taken > 1):
        label = f'<text class="count" x="{lx}" y="{ly}" text-anchor="middle">×{taken}</text>'
    return (
        f'<g class="edge {kind} {state}" data-from="{a}" data-to="{b}" data-taken="{taken}">'
        f'<path d="{d}" marker-end="url(#arrow)"/>{label}</g>'
    )


def _route(a: str, b: str, back: bool) -> tuple[str, float, float]:
    """The path of the arrow from ``a`` to ``b`` and where its count goes."""
    (ax, ay), (bx, by) = _box(a), _box(b)
    (acol, arow), (bcol, brow) = PLACES[a], PLACES[b]
    if back:
        return _loop(ax, ay, bx, by, up=arow == 0) if arow == brow else _climb(ax, ay, bx, by)
    if arow != brow:  # between the rows
        top, bottom = (ay + NODE_H, by) if arow < brow else (ay, by + NODE_H)
        mid = (top + bottom) / 2
        return f"M{ax + NODE_W / 2},{top} L{bx + NODE_W / 2},{bottom}", (ax + bx) / 2, mid
    if bcol - acol == 1 or (a, b) == (Phase.REVIEW, Phase.DONE):  # the next along the row
        y = ay + NODE_H / 2
        return f"M{ax + NODE_W},{y} L{bx - 2},{y}", (ax + NODE_W + bx) / 2, y - 6
    y, mx = ay + NODE_H, (ax + bx + NODE_W) / 2  # a skip along the row (DESIGN → BUILD)
    return f"M{ax + NODE_W * 0.75},{y} Q{mx},{y + 40} {bx + NODE_W * 0.25},{y + 2}", mx, y + 30


def _loop(ax: float, ay: float, bx: float, by: float, *, up: bool) -> tuple[str, float, float]:
    """A loop-back along a row: an arc above the top row, or below the bottom one."""
    span = abs(ax - bx) / STEP_X
    edge_y = ay if up else ay + NODE_H
    lift = (14 + 16 * span) * (-1 if up else 1)
    sx, ex = ax + NODE_W * 0.4, bx + NODE_W * 0.6
    d = f"M{sx},{edge_y} C{sx},{edge_y + lift} {ex},{edge_y + lift} {ex},{edge_y - 2 * (up - 0.5)}"
    return d, (sx + ex) / 2, edge_y + lift * 0.75 + (4 if up else 10)


def _climb(ax: float, ay: float, bx: float, by: float) -> tuple[str, float, float]:
    """From the deploy row back up to a product phase, out of the left side of DEPLOY_REVIEW."""
    sx, sy = ax, ay + NODE_H * 0.7
    ex, ey = bx + NODE_W * 0.5, by + NODE_H
    d = f"M{sx},{sy} C{sx - 60},{sy + 30} {ex},{ey + 70} {ex},{ey + 2}"
    return d, (sx + ex) / 2, sy + 34


def _chain(path: PhasePath) -> str:
    """A workflow of another definition: its phases in the order entered, the current lit."""
    phases = list(dict.fromkeys([*path.entered, path.phase]))
    step = NODE_W + 24
    width = LEFT * 2 + step * len(phases)
    parts: list[str] = []
    for i, phase in enumerate(phases):
        x = LEFT + i * step
        current = phase == path.phase
        lit = ' data-current="true"' if current else ""
        classes = f"phase visited{' current ' + path.status if current else ''}"
        parts.append(
            f'<g class="{classes}" data-phase="{escape(phase)}"{lit}>'
            f'<rect x="{x}" y="20" width="{NODE_W}" height="{NODE_H}" rx="8"/>'
            f'<text x="{x + NODE_W / 2}" y="{20 + NODE_H / 2 + 4}" text-anchor="middle">'
            f"{escape(phase.upper())}</text></g>"
        )
        if i:
            parts.append(
                f'<g class="edge forward taken"><path d="M{x - 24},40 L{x - 2},40" '
                'marker-end="url(#arrow)"/></g>'
            )
    parts.append(f'<text class="cycles" x="{LEFT}" y="92">cycle {path.cycle}</text>')
    return _svg(path, width, 100, parts, compact=False)
