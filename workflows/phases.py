"""The phases of the vibey protocol (seed 004)."""

from __future__ import annotations

import enum


class Phase(enum.StrEnum):
    """INTAKE → DESIGN → [VISUAL_DESIGN] → BUILD ⇄ REVIEW → [DEPLOY_DESIGN → DEPLOY_EXECUTE →
    DEPLOY_REVIEW] → DONE."""

    INTAKE = "intake"
    DESIGN = "design"
    VISUAL_DESIGN = "visual_design"
    BUILD = "build"
    REVIEW = "review"
    DEPLOY_DESIGN = "deploy_design"
    DEPLOY_EXECUTE = "deploy_execute"
    DEPLOY_REVIEW = "deploy_review"
    DONE = "done"

    @property
    def interactive(self) -> bool:
        """Interactive phases talk to the user through gates; the others run unattended."""
        return self in _INTERACTIVE


_INTERACTIVE = frozenset(
    {Phase.DESIGN, Phase.VISUAL_DESIGN, Phase.REVIEW, Phase.DEPLOY_DESIGN, Phase.DEPLOY_REVIEW}
)
