"""Write the proofs (`<unit>/unit.json`, `schemas.unit_proof.UnitProof`) of a units folder whose units
were committed before `gs1 decide --collect` wrote proofs (issue 47). Run once, from the
repository root:

    python scripts/prove_committed_units.py results/h200-comparison results/h200-comparison/spec_revised.json

Each unit is traced to the run that made it through the run's gates' records the folder keeps
(`runs/<run>/times.txt`: `gs1 run --units a,b,...`), and the experiment identity is that run's own
spec (`runs/<run>/spec/spec.json`), which must be the folder's spec's. The run's train/ and eval/
files are not in the repository, so the hashes are of the files as committed, and the proof says
so in its `source`. A unit no kept run names, or a run of another experiment, stops the script
with nothing written.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

SOURCE = ("committed before proofs (issue 47): hashed as committed; the run's train/ and eval/ files are not in "
          "the repository, its gates' records are in runs/{run}/")


def main() -> int:
    from decision.units import _ran_spec, prove_unit
    from design.plan import plan_from_spec
    from design.revision import experiment_hash
    from design.spec import load_spec
    from schemas.layout import RunLayout, UnitsLayout

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("units", type=Path)
    parser.add_argument("spec", type=Path)
    args = parser.parse_args()
    folder, spec = UnitsLayout(args.units), load_spec(args.spec)
    identity = experiment_hash(spec)
    made_by: dict[str, str] = {}
    for record in sorted((folder.root / "runs").glob("*/times.txt")):
        run = record.parent.name
        ran = experiment_hash(_ran_spec(RunLayout(record.parent).spec_json, args.spec.resolve().parent))
        if ran != identity:
            raise SystemExit(f"runs/{run}: ran another experiment ({ran}, the spec's is {identity})")
        for names in re.findall(r"gs1 run --units (\S+):", record.read_text()):
            for unit in names.split(","):
                made_by.setdefault(unit, run)
    units = plan_from_spec(spec).units()
    unknown = [u.unit for u in units if u.unit not in made_by]
    if unknown:
        raise SystemExit(f"no kept run names unit(s) {', '.join(unknown)}")
    for unit in units:
        run = made_by[unit.unit]
        proof = prove_unit(spec, unit, folder.unit_dir(unit.unit), run, SOURCE.format(run=run))
        print(f"{unit.unit}: from {run}, {proof.items} items, {len(proof.files)} files")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
