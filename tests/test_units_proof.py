"""Issue 47: a units folder decides only from units that carry their proof, and a refused folder
gets nothing written (`gs1 decide --spec --units`). Fast tier: made-up run directories
(`fixtures.units_folder`), no model, no flow."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from fixtures.units_folder import N_ITEMS, fake_run, small_comparison_spec, snapshot
from gs1.cli import main


@pytest.fixture
def collected(tmp_path) -> tuple[Path, Path]:
    """(spec file, units folder) with all six units collected from one made-up run and decided."""
    spec = small_comparison_spec(tmp_path / "spec")
    run = fake_run(tmp_path / "run-a", spec)
    units = tmp_path / "units"
    assert main(["decide", "--spec", str(spec), "--units", str(units), "--collect", str(run)]) == 0
    assert (units / "decision" / "decision.json").is_file()
    return spec, units


def _cut(path: Path, keep: int) -> None:
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:keep]))


def _flip(path: Path) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    path.write_text("".join(json.dumps({**r, "correct": not r["correct"]}) + "\n" for r in rows[:10]) +
                    "".join(json.dumps(r) + "\n" for r in rows[10:]))


DAMAGES = {
    # what was done to the folder -> (how, what the one line names)
    "flipped correct values": (lambda u: _flip(u / "gs1_kernel-s0" / "eval.jsonl"), "gs1_kernel-s0"),
    "rollouts deleted": (lambda u: (u / "gs1_kernel-s1" / "rollouts.parquet").unlink(), "gs1_kernel-s1"),
    "costs deleted": (lambda u: (u / "batch_mean-s0" / "costs.parquet").unlink(), "batch_mean-s0"),
    "another arm's eval": (lambda u: shutil.copy(u / "grpo_gs8-s0" / "eval.jsonl", u / "gs1_kernel-s0" / "eval.jsonl"),
                           "gs1_kernel-s0"),
    "another seed's eval": (lambda u: shutil.copy(u / "gs1_kernel-s1" / "eval.jsonl", u / "gs1_kernel-s0" / "eval.jsonl"),
                            "gs1_kernel-s0"),
    "every eval cut to 45 items": (lambda u: [_cut(p, 45) for p in sorted(u.glob("*/eval.jsonl"))], "grpo_gs8-s0"),
    "another unit's folder": (lambda u: (shutil.rmtree(u / "gs1_kernel-s0"),
                                         shutil.copytree(u / "gs1_kernel-s1", u / "gs1_kernel-s0")), "gs1_kernel-s0"),
    "proof deleted": (lambda u: (u / "grpo_gs8-s1" / "unit.json").unlink(), "grpo_gs8-s1"),
}


@pytest.mark.parametrize("damage", list(DAMAGES))
def test_a_damaged_unit_is_named_in_one_line_and_no_decision_is_written(collected, damage, capsys):
    """Each damage of issue 47 (defect 1, and defect 2's deleted costs): exit 2, one line naming
    the unit, and nothing in the folder written: no decision (the old one removed first, so a
    write would show), no comparison, no README."""
    spec, units = collected
    how, unit = DAMAGES[damage]
    how(units)
    shutil.rmtree(units / "decision")
    before = snapshot(units)
    capsys.readouterr()
    assert main(["decide", "--spec", str(spec), "--units", str(units)]) == 2, damage
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("gs1: error: ") and f"unit {unit}" in err[0], (damage, err)
    assert not (units / "decision").exists(), damage
    assert snapshot(units) == before, damage
    # the secondary reading of the same folder is refused alike
    assert main(["decide", "--spec", str(spec), "--units", str(units), "--rule", "paired_score"]) == 2
    assert snapshot(units) == before and not (units / "readings").exists()


def test_the_proof_names_what_collect_copied(collected):
    """unit.json: the source run, the experiment's identity, arm, seed, item count and ids, and
    each copied file's sha256."""
    import hashlib

    from design.revision import experiment_hash
    from design.spec import load_spec
    from schemas.unit_proof import UnitProof

    spec, units = collected
    proof = UnitProof.model_validate_json((units / "gs1_kernel-s1" / "unit.json").read_text())
    assert (proof.unit, proof.arm, proof.seed, proof.items) == ("gs1_kernel-s1", "gs1_kernel", 1, N_ITEMS)
    assert proof.source_run == "run-a" and proof.experiment_hash == experiment_hash(load_spec(spec))
    assert set(proof.files) == {"eval.jsonl", "rollouts.parquet", "step_metrics.parquet", "costs.parquet", "final.json"}
    for name, digest in proof.files.items():
        assert hashlib.sha256((units / "gs1_kernel-s1" / name).read_bytes()).hexdigest() == digest


def test_a_folder_of_fewer_items_than_the_spec_registers_is_refused(tmp_path, capsys):
    """A run that scored 45 of the spec's 48 items, collected with its proof intact: refused."""
    spec = small_comparison_spec(tmp_path / "spec")
    run = fake_run(tmp_path / "run", spec, n_items=45)
    units = tmp_path / "units"
    assert main(["decide", "--spec", str(spec), "--units", str(units), "--collect", str(run)]) == 2
    err = capsys.readouterr().err
    assert "45 eval items" in err and "48" in err
    assert not (units / "decision").exists() and not (units / "comparison.md").exists()


def test_a_unit_that_fails_is_refused_while_the_folder_is_interim_too(tmp_path, capsys):
    """Units missing (no decision yet) and one present unit damaged: still refused, no table."""
    spec = small_comparison_spec(tmp_path / "spec")
    run = fake_run(tmp_path / "run", spec, units=["grpo_gs8-s0", "gs1_kernel-s0"])
    units = tmp_path / "units"
    assert main(["decide", "--spec", str(spec), "--units", str(units), "--collect", str(run)]) == 0
    assert "no decision yet: 4 unit(s) missing" in capsys.readouterr().out
    _flip(units / "gs1_kernel-s0" / "eval.jsonl")
    before = snapshot(units)
    assert main(["decide", "--spec", str(spec), "--units", str(units)]) == 2
    assert "unit gs1_kernel-s0" in capsys.readouterr().err
    assert snapshot(units) == before


def test_a_decision_replaces_the_old_one_whole(collected):
    """A second decide writes the decision folder anew: no file of the old one is left beside it,
    and no temporary folder is left in the units folder."""
    spec, units = collected
    (units / "decision" / "stale.txt").write_text("old")
    assert main(["decide", "--spec", str(spec), "--units", str(units)]) == 0
    assert sorted(p.name for p in (units / "decision").iterdir()) == [
        "comparisons.parquet", "decision.json", "decision.md", "decision.parquet"]
    assert not [p for p in units.iterdir() if p.name.startswith(".")]


def test_the_committed_units_folders_carry_their_proofs():
    """results/h200-comparison: every unit's proof verifies against the spec it was decided under."""
    from decision.units import check_units
    from design.spec import load_spec
    from schemas.layout import UnitsLayout

    root = Path(__file__).resolve().parents[1] / "results" / "h200-comparison"
    checked = check_units(load_spec(root / "spec_revised.json"), UnitsLayout(root))
    assert not checked.missing and len(checked.present) == 12
    assert {len(items) for items in checked.evals.values()} == {1319}
