"""The report's colours, shared by the plots and the page (its static styles are in
templates/report.css)."""

from __future__ import annotations

from report.model import RunData

VERDICT_COLOURS = {"noninferior": "#1a7f37", "inferior": "#cf222e", "inconclusive": "#9a6700"}
STOPPED_COLOUR = "#cf222e"
PENDING_COLOUR = "#57606a"
ROLE_COLOURS = {"treatment": "#0969da", "baseline": "#e16f24"}
OTHER_COLOURS = ["#8250df", "#1a7f37", "#bf3989", "#57606a"]


def verdict_colour(verdict: str) -> str:
    return VERDICT_COLOURS.get(verdict, PENDING_COLOUR)


def colour_for(arm: str, role: str, others: list[str]) -> str:
    """Treatment blue, baseline orange; an arm without a role its own colour, by its place in
    `others` (the arms without a role, in arm order)."""
    if role:
        return ROLE_COLOURS[role]
    return OTHER_COLOURS[others.index(arm) % len(OTHER_COLOURS)]


def arm_colour(data: RunData, arm: str) -> str:
    """Treatment blue, baseline orange; any other arm its own colour, in arm order."""
    return colour_for(arm, data.role(arm), [a for a in data.arm_names if not data.role(a)])
