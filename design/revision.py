"""What identifies an experiment, and how a spec was revised.

    experiment_hash(spec)          # equal for specs that run the same arms on the same data
    field_changes(old, new)        # [FieldChange('activation_gate.checks[pilot_mean_reward].min', 0.95, 0.1), ...]

A run directory is named by the experiment (`runs/<title-slug>-<experiment-hash>/`), not by the
whole spec: what judges the runs (gate bounds, the decision rule, the budget) is left out, so a
spec edited there re-runs, in the same directory, only the stages that read what changed (each
stage's cache key is the slice of the plan it reads). The edit is recorded in that directory
(`spec/revisions/NNN.json`: old and new spec, field by field).
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from pydantic import BaseModel, ConfigDict

from design.spec import ExperimentSpec, hashed_dump

# Top-level spec fields that judge the experiment, or record about it, without changing what runs.
JUDGING_FIELDS = (
    "activation_gate", "decision_rule", "budget", "feasibility", "feasibility_check", "feasibility_required",
    "revisions", "overrides", "notes",
)


def experiment_hash(spec: ExperimentSpec, length: int = 8) -> str:
    """First `length` hex of the sha256 of the canonical spec without its `JUDGING_FIELDS`."""
    identity = {k: v for k, v in hashed_dump(spec).items() if k not in JUDGING_FIELDS}
    identity["pilot"] = {k: v for k, v in identity["pilot"].items() if k != "calibration_wall_minutes"}  # it judges
    text = json.dumps(identity, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


class FieldChange(BaseModel):
    model_config = ConfigDict(frozen=True)

    field: str  # dotted path; list items by what names them (`activation_gate.checks[pilot_mean_reward].min`,
    # `arms[gs1_kernel].lr`), else by index
    old: Any = None  # None when the field was added
    new: Any = None  # None when the field was removed

    @property
    def text(self) -> str:
        return f"{self.field}: {json.dumps(self.old)} -> {json.dumps(self.new)}"


def field_changes(old: Any, new: Any, path: str = "") -> list[FieldChange]:
    """Every leaf that differs between two spec JSON values, in key order."""
    if isinstance(old, dict) and isinstance(new, dict):
        changes = []
        for key in sorted(set(old) | set(new), key=str):
            sub = f"{path}.{key}" if path else str(key)
            changes += field_changes(old.get(key), new.get(key), sub)
        return changes
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        labels = _item_labels(old, new)
        return [c for i, (a, b) in enumerate(zip(old, new)) for c in field_changes(a, b, f"{path}[{labels[i]}]")]
    return [] if old == new else [FieldChange(field=path or "(spec)", old=old, new=new)]


# The key that names an item of a spec list: a gate check by its metric, an arm by its name.
ITEM_NAMES = ("metric", "name")


def _item_labels(old: list, new: list) -> list[str]:
    """How each item of two same-length lists is named in a change: by its metric or name when
    that names the same item in both lists and no other, else by its index."""
    for key in ITEM_NAMES:
        names = [a.get(key) if isinstance(a, dict) else None for a in old]
        if (all(isinstance(n, str) and n for n in names) and len(set(names)) == len(names)
                and names == [b.get(key) if isinstance(b, dict) else None for b in new]):
            return names
    return [str(i) for i in range(len(old))]


class SpecRevision(BaseModel):
    """One edit of a run directory's spec, as `spec/revisions/NNN.json` holds it."""

    model_config = ConfigDict(frozen=True)

    number: int  # 1 for the first edit after the spec the directory started with
    at: str  # ISO time the edited spec was validated
    old_spec_hash: str
    new_spec_hash: str
    changes: tuple[FieldChange, ...]
    old: dict
    new: dict
