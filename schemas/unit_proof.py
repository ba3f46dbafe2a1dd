"""A collected unit's proof (`<units_dir>/<unit>/unit.json`, `schemas.layout.UnitsLayout.proof_json`):
what `gs1 decide --collect` copied into a units folder and where from, so that every later read of
the folder can tell the unit is the one the run made (`decision.units.check_units`).

    unit, arm, seed      the unit's folder name, its arm and its decision seed (the spec's unit)
    source_run           the run directory's folder name it was copied from (its gates' records
                         are kept in `<units_dir>/runs/<source_run>/`)
    source               how the proof was made: by `--collect`, or written afterwards for units
                         committed before proofs existed (then the hashes are of the files as committed)
    experiment_hash      the identity of the spec the run ran (`design.revision.experiment_hash`)
    items                the number of eval items in its eval file
    item_ids_sha256      sha256 of its eval items' ids, sorted, one a line (`item_ids_digest`)
    files                file name -> sha256 of each file copied (eval.jsonl and the train files)
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

PROOF_FILE = "unit.json"
COLLECTED = "collected by gs1 decide --collect"


class UnitProof(BaseModel):
    """What a unit folder holds and where it came from; written once, checked on every read."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    version: Literal[1] = 1
    unit: str
    arm: str
    seed: int  # the decision seed (the prompt order's); 0 in a single-seed spec
    source_run: str
    source: str = COLLECTED
    experiment_hash: str
    items: int = Field(ge=1)
    item_ids_sha256: str
    files: dict[str, str]  # name -> sha256 hex


def item_ids_digest(item_ids: Iterable[str]) -> str:
    """sha256 of the item ids, sorted, one a line: equal for two units scored on the same items."""
    return hashlib.sha256("".join(f"{i}\n" for i in sorted(item_ids)).encode("utf-8")).hexdigest()
