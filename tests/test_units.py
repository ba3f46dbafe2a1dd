"""A sweep run a few units at a time (`gs1 run --units`) and decided from a units folder
(`gs1 decide --spec --units --collect`): interim until every unit is in, then the decision the
flow itself makes from the same units."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

import fixtures.flow_env  # noqa: F401  (registers the token_threshold env)
from fixtures.tiny_model import tiny_model_dir  # noqa: F401
from schemas.artifacts import read_rows
from test_flow import flow_spec

ARMS = ("grpo_gs8", "gs1_kernel", "batch_mean")


def three_arm_spec(repo_root: Path, model_dir: Path) -> dict:
    spec = flow_spec(repo_root, model_dir, steps=2)
    spec["arms"].append({"name": "batch_mean", "advantage": "batch_mean", "group_size": 1, "groups_per_batch": 16,
                         "lr": 1e-3})
    spec["arms"][0]["role"] = "baseline"
    spec["decision_rule"]["seeds"] = [0, 1]
    spec["restoration_preflight"] = None
    return spec


def run_units(spec_path: Path, run_dir: Path, units: list[str] | None):
    from flows.experiment import experiment_in

    return experiment_in(run_dir)(spec_path=str(spec_path), run_dir=str(run_dir), backend="local", units=units,
                                  return_state=True)


def eval_map(path: Path) -> dict[str, float]:
    return {r["item_id"]: float(r["correct"]) for r in map(json.loads, path.open())}


def test_units_run_in_shares_and_the_folder_decides_as_the_flow_does(prefect_harness, tmp_path, repo_root,
                                                                     tiny_model_dir, capsys):
    from gs1.cli import main

    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(three_arm_spec(repo_root, tiny_model_dir)))
    run_dir, units_dir = tmp_path / "run", tmp_path / "units"
    first = [f"{arm}-s0" for arm in ARMS]
    second = [f"{arm}-s1" for arm in ARMS]

    # A first share: the gates pass, seed 0's units train and evaluate, and no decision is made.
    state = run_units(spec_path, run_dir, first)
    assert state.is_completed(), state.message
    assert state.result() == {"units_done": first, "waiting_for": second}
    assert sorted(p.name for p in (run_dir / "eval").iterdir()) == sorted(first)
    assert not (run_dir / "decision").exists()

    assert main(["decide", "--spec", str(spec_path), "--units", str(units_dir), "--collect", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert f"collected 3 unit(s) from {run_dir}" in out and "no decision yet: 3 unit(s) missing" in out
    for unit in first:
        assert sorted(p.name for p in (units_dir / unit).iterdir()) == sorted(
            ["rollouts.parquet", "step_metrics.parquet", "costs.parquet", "final.json", "eval.jsonl", "unit.json"])
        # the committed copy is re-encoded for size (zstd, floats byte-stream split) and holds the same table
        for name in ("rollouts.parquet", "step_metrics.parquet", "costs.parquet"):
            kept, ran = units_dir / unit / name, run_dir / "train" / unit / name
            assert pq.read_table(kept).equals(pq.read_table(ran)), name
            assert pq.read_schema(kept).metadata == pq.read_schema(ran).metadata, name
            columns = pq.ParquetFile(kept).metadata.row_group(0)
            assert {columns.column(c).compression for c in range(columns.num_columns)} == {"ZSTD"}, name
        logprobs = pq.ParquetFile(units_dir / unit / "rollouts.parquet").metadata.row_group(0)
        column = next(logprobs.column(c) for c in range(logprobs.num_columns)
                      if logprobs.column(c).path_in_schema == "sampler_logprobs.list.element")
        assert "BYTE_STREAM_SPLIT" in column.encodings
    assert not (units_dir / "decision").exists()
    # the gates' records of the run the units came from, kept beside them byte for byte
    kept = units_dir / "runs" / "run"
    for record in ("spec/spec.json", "preflight/gate_report.parquet", "gate/gate_report.parquet",
                   "audit/pilot/gate_report.parquet", "feasibility/feasibility.json"):
        assert (kept / record).read_bytes() == (run_dir / record).read_bytes(), record
    assert not (kept / "train").exists() and not (kept / "eval").exists() and not (kept / ".stage-results").exists()
    table = (units_dir / "comparison.md").read_text()
    assert "No decision yet" in table and ", ".join(second) in table
    # the interim difference: seed 0 only, recomputed from the copied eval files
    base = eval_map(units_dir / "grpo_gs8-s0" / "eval.jsonl")
    for arm in ARMS[1:]:
        mine = eval_map(units_dir / f"{arm}-s0" / "eval.jsonl")
        diff = np.mean([mine[i] - base[i] for i in base])
        row = next(line for line in table.splitlines() if line.startswith(f"| {arm} |"))
        assert f"| {diff:+.4f} |" in row and "| interim |" in row
        assert f"{arm} - grpo_gs8 = {diff:+.4f}" in out

    # The second share, then the folder holds every unit: the decision.
    state = run_units(spec_path, run_dir, second)
    assert state.is_completed() and state.result()["waiting_for"] == first
    assert main(["decide", "--spec", str(spec_path), "--units", str(units_dir), "--collect", str(run_dir)]) == 0
    out = capsys.readouterr().out
    assert "every unit is in" in out
    from_units = json.loads((units_dir / "decision" / "decision.json").read_text())
    assert from_units["family"]["m"] == 2 and from_units["seeds"] == [0, 1]
    readme = (units_dir / "README.md").read_text()
    assert readme.count("gs1 decide --units: begin") == 1 and "Units missing (0): none." in readme

    # The flow over the same run directory (every unit cached) reaches the very same decision.
    state = run_units(spec_path, run_dir, None)
    assert state.is_completed(), state.message
    from_flow = json.loads((run_dir / "decision" / "decision.json").read_text())
    assert from_flow == from_units
    costs = read_rows("arm_costs", units_dir / "batch_mean-s1" / "costs.parquet")[0]
    assert costs == read_rows("arm_costs", run_dir / "train" / "batch_mean-s1" / "costs.parquet")[0]


def test_an_unknown_unit_or_a_foreign_run_is_one_line_exit_2(tmp_path, repo_root, tiny_model_dir, capsys):
    from gs1.cli import main

    spec_path = tmp_path / "spec.json"
    spec_path.write_text(json.dumps(three_arm_spec(repo_root, tiny_model_dir)))
    assert main(["run", str(spec_path), "--units", "grpo_gs8-s0,critic-s0", "--run-dir", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no unit 'critic-s0'" in err[0] and "grpo_gs8-s0, grpo_gs8-s1" in err[0]
    assert not (tmp_path / "run").exists()

    # a run directory of another experiment (here: another title's spec) is refused by name
    other = tmp_path / "other"
    (other / "spec").mkdir(parents=True)
    changed = three_arm_spec(repo_root, tiny_model_dir)
    changed["steps"] = 3
    (other / "spec" / "spec.json").write_text(json.dumps(changed))
    assert main(["decide", "--spec", str(spec_path), "--units", str(tmp_path / "units"), "--collect", str(other)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "ran another experiment" in err[0]

    assert main(["decide", "--spec", str(spec_path), "--treatment", "t.jsonl", "--units", "u"]) == 2
    assert "not both" in capsys.readouterr().err


def test_a_run_of_a_spec_with_a_relative_kernel_file_is_collected_with_its_gates_records(tmp_path, repo_root,
                                                                                       tiny_model_dir, capsys):
    """The run keeps its spec as given (`spec/spec.json`), so a hill-climbed arm's relative
    `kernel_file` does not lie beside that copy: it is read from the --spec file's folder, as in
    `results/h200-comparison/spec_revised.json`. A run stopped after its gates (no unit finished)
    still leaves its gates' records in the units folder."""
    from gs1.cli import main

    spec = three_arm_spec(repo_root, tiny_model_dir)
    arm = next(a for a in spec["arms"] if a["name"] == "gs1_kernel")
    arm.pop("kernel")
    arm["kernel_file"] = "kernels/kernel.json"
    (tmp_path / "sweep" / "kernels").mkdir(parents=True)
    (tmp_path / "sweep" / "kernels" / "kernel.json").write_text(json.dumps(
        {"kernel": {"bandwidth": 1.0, "family": "gaussian", "features": ["log_prompt_num_tokens"], "window": 64}}))
    spec_path = tmp_path / "sweep" / "spec.json"
    spec_path.write_text(json.dumps(spec))
    run = tmp_path / "2026-12-03-gates"  # what a run stopped after feasibility leaves
    (run / "spec").mkdir(parents=True)
    (run / "spec" / "spec.json").write_text(spec_path.read_text())
    (run / "feasibility").mkdir()
    (run / "feasibility" / "feasibility.json").write_text('{"status": "feasible"}')
    units_dir = tmp_path / "sweep" / "units"

    assert main(["decide", "--spec", str(spec_path), "--units", str(units_dir), "--collect", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"collected 0 unit(s) from {run}: none finished" in out and "no decision yet: 6 unit(s) missing" in out
    kept = units_dir / "runs" / run.name
    for record in ("spec/spec.json", "feasibility/feasibility.json"):
        assert (kept / record).read_bytes() == (run / record).read_bytes(), record


def _fake_step_metrics(unit, steps: int, admit_rates: list[float] | None, start: float = 1.0e9,
                       step_seconds: float = 2.0) -> list[dict]:
    """Step metrics rows as a trained unit's folder holds them (made up: a fake, no training): its
    first step starts at `start` and each takes `step_seconds`."""
    from schemas.artifacts import STEP_EXTRA_METRICS

    return [{"step": k, "arm": unit.name, "seed": unit.order_seed, "reward_mean": 0.5, "reward_std": 0.5,
             "advantage_abs_mean": 0.5, "frac_nonzero_advantage": 1.0, "baseline_mean": 0.5, "loss": None,
             "num_datums": 64, "num_tokens": 1000, "effective_neighbors_p10": None, "sample_seconds": 1.0,
             "train_seconds": 1.0, "step_seconds": step_seconds, "wall_time": start + (k + 1) * step_seconds,
             **dict.fromkeys(STEP_EXTRA_METRICS),
             "trust_admit_rate": None if admit_rates is None else admit_rates[k]} for k in range(steps)]


def _write_fake_unit(root: Path, unit, correct_I, cost, admit_rates: list[float] | None = None,
                     start: float = 1.0e9, step_seconds: float = 2.0) -> None:
    """A made-up unit folder (a fake, no training): its eval file from the 0/1 outcomes `correct_I`,
    its costs (an ArmCost) and two steps' metrics."""
    from schemas.artifacts import write_artifact

    folder = root / unit.unit
    folder.mkdir()
    (folder / "eval.jsonl").write_text("".join(json.dumps({"item_id": f"i{i}", "correct": bool(c)}) + "\n"
                                               for i, c in enumerate(correct_I)))
    write_artifact("arm_costs", [cost.model_dump()], folder / "costs.parquet")
    write_artifact("step_metrics", _fake_step_metrics(unit, 2, admit_rates, start, step_seconds),
                   folder / "step_metrics.parquet")


def _write_fake_folder(root: Path, plan, missing, n_items: int, rng_seed: int, cost_of) -> dict[str, np.ndarray]:
    """A made-up units folder (a fake, no training): every unit of the plan but `missing`, each with
    random 0/1 outcomes on n_items and the ArmCost `cost_of(unit)`; returns the outcomes by unit."""
    rng = np.random.default_rng(rng_seed)
    outcomes = {}
    for unit in plan.units():
        if unit.unit in missing:
            continue
        outcomes[unit.unit] = rng.integers(0, 2, size=n_items).astype(float)
        _write_fake_unit(root, unit, outcomes[unit.unit], cost_of(unit))
    return outcomes


def _with_items(spec: dict, n_items: int):
    """The spec dict parsed, registering n_items eval items (what the fake units hold)."""
    from design.spec import parse_spec

    spec["eval"]["n_examples"] = n_items
    return parse_spec(spec)


def _fake_standing(spec, plan, root: Path):
    """The fake folder's standing as `gs1 decide --units` reads it: each made-up unit given its proof
    (`decision.units.prove_unit`, again at every call: a test edits the units), the folder checked, and
    the decision written once every unit is in."""
    from decision.units import check_units, prove_unit, units_standing, write_units_decision
    from schemas.layout import UnitsLayout

    folder = UnitsLayout(root)
    for unit in plan.units():
        if folder.unit_dir(unit.unit).is_dir():
            prove_unit(spec, unit, folder.unit_dir(unit.unit), "fake-run", source="made up by the test")
    standing = units_standing(plan, check_units(spec, folder))
    if standing.decision is not None:
        write_units_decision(folder, standing.decision)
    return standing


def five_arm_spec(repo_root: Path, model_dir: Path) -> dict:
    """The three arms, and the two kinds that cost more than a policy: flash_reinforce, critic."""
    spec = three_arm_spec(repo_root, model_dir)
    for kind in ("flash_reinforce", "critic"):
        spec["arms"].append({"name": kind, "advantage": kind, "group_size": 1, "groups_per_batch": 16, "lr": 1e-3})
    return spec


@pytest.mark.parametrize("missing", [(), ("gs1_kernel-s1",)])
def test_the_table_reads_what_the_folder_holds(tmp_path, repo_root, tiny_model_dir, missing):
    """Made-up unit files (a fake units folder, no training): accuracy, the paired difference over
    the common seeds, costs relative to the baseline over those same seeds, the critic's share of
    the model calls and the trust gate's admit rate at each step."""
    from decision.units import standing_markdown
    from design.plan import plan_from_spec
    from schemas.cost import ArmCost
    from schemas.layout import UnitsLayout

    spec = _with_items(five_arm_spec(repo_root, tiny_model_dir), 40)
    plan = plan_from_spec(spec)
    admit = {s: [0.9 - 0.1 * k - 0.01 * s for k in range(2)] for s in (0, 1)}
    rng = np.random.default_rng(3)
    outcomes = {}
    for unit in plan.units():
        if unit.unit in missing:
            continue
        outcomes[unit.unit] = rng.integers(0, 2, size=40).astype(float)
        tokens = 1000 * (1 + len(unit.name)) + unit.order_seed
        critic = unit.name == "critic"
        cost = ArmCost(arm=unit.name, seed=unit.order_seed, unit=unit.unit, steps=2, wall_seconds=10.0 + unit.order_seed,
                       sample_seconds=5.0, train_seconds=5.0, sampler_tokens=tokens, trainer_tokens=tokens // 2,
                       model_calls=12 if critic else 8, critic_seconds=1.0 if critic else None,
                       critic_tokens=300 if critic else None, critic_calls=4 if critic else None)
        rates = admit[unit.order_seed] if unit.name == "flash_reinforce" else None
        _write_fake_unit(tmp_path, unit, outcomes[unit.unit], cost, rates)
    standing = _fake_standing(spec, plan, tmp_path)
    assert standing.missing == missing and standing.complete == (not missing)
    rows = {a.arm: a for a in standing.arms}
    kernel = rows["gs1_kernel"]
    seeds = [0] if missing else [0, 1]
    assert kernel.common_seeds == tuple(seeds)
    want = np.mean([np.mean(outcomes[f"gs1_kernel-s{s}"] - outcomes[f"grpo_gs8-s{s}"]) for s in seeds])
    assert kernel.pair["mean_diff"] == pytest.approx(want, abs=1e-12)
    assert (kernel.pair["verdict"] == "interim") == bool(missing)
    if not missing:  # Holm's verdict, as decision.json holds it
        decision = json.loads((tmp_path / "decision" / "decision.json").read_text())
        assert kernel.pair["verdict"] == next(p for p in decision["comparisons"] if p["arm"] == "gs1_kernel")["verdict"]
    base_tokens = sum(1000 * (1 + len("grpo_gs8")) + s for s in seeds)
    mine_tokens = sum(1000 * (1 + len("gs1_kernel")) + s for s in seeds)
    assert kernel.relative_cost["sampler_tokens"] == pytest.approx(mine_tokens / base_tokens)
    assert rows["batch_mean"].common_seeds == (0, 1)
    assert (tmp_path / "decision" / "decision.json").exists() == (not missing)
    assert rows["critic"].relative_cost["model_calls"] == pytest.approx(1.5)

    table = standing_markdown(plan, standing, UnitsLayout(tmp_path))
    critic_row = next(line for line in table.splitlines() if line.startswith("| critic |"))
    assert "| 24 (1.50x; critic 8) |" in critic_row  # two seeds of 12 calls, 4 of them the critic's
    assert "| 21 s, 5.2 s/step (1.00x) |" in critic_row  # (10 + 11) s over 4 steps, as the baseline's
    assert "critic" not in next(line for line in table.splitlines() if line.startswith("| batch_mean |")).split("|")[-2]
    # accuracy: the mean over the arm's seeds, each seed's beside it when there are two
    batch_acc = [float(np.mean(outcomes[f"batch_mean-s{s}"])) for s in (0, 1)]
    batch_cells = next(line for line in table.splitlines() if line.startswith("| batch_mean |")).split(" | ")
    assert batch_cells[3] == f"{np.mean(batch_acc):.4f} (s0 {batch_acc[0]:.4f}; s1 {batch_acc[1]:.4f})"
    kernel_cells = next(line for line in table.splitlines() if line.startswith("| gs1_kernel |")).split(" | ")
    kernel_acc = [float(np.mean(outcomes[f"gs1_kernel-s{s}"])) for s in seeds]
    assert kernel_cells[3] == (f"{kernel_acc[0]:.4f}" if missing else
                               f"{np.mean(kernel_acc):.4f} (s0 {kernel_acc[0]:.4f}; s1 {kernel_acc[1]:.4f})")
    assert {a.arm: a.admit_rates for a in standing.arms if a.admit_rates} == {
        "flash_reinforce": {s: tuple(admit[s]) for s in (0, 1)}}
    admit_rows = table.split("### Trust gate: admit rate per step", 1)[1].splitlines()
    assert "| step | flash_reinforce-s0 | flash_reinforce-s1 |" in admit_rows
    assert "| 2 | 0.800 | 0.790 |" in admit_rows and "| min | 0.800 | 0.790 |" in admit_rows


def test_wall_time_compares_only_units_that_shared_the_gpu_alike(tmp_path, repo_root, tiny_model_dir):
    """Made-up unit files (a fake units folder, no training): seed 0's grpo_gs8 and gs1_kernel train
    side by side, batch_mean-s0 alone in a later session (at half their step time, as one unit on a
    GPU runs); at seed 1 batch_mean trains beside grpo_gs8 and gs1_kernel alone. A wall-time ratio to
    the baseline is taken over the seeds at which the two trained side by side, naming them, and is
    withheld where there is none; the GPU sharing table says who trained beside whom."""
    from decision.units import standing_markdown
    from design.plan import plan_from_spec
    from schemas.cost import ArmCost
    from schemas.layout import UnitsLayout

    spec = _with_items(three_arm_spec(repo_root, tiny_model_dir), 10)
    plan = plan_from_spec(spec)
    ran = {"grpo_gs8-s0": (1.0e9, 4.0), "gs1_kernel-s0": (1.0e9 + 3.0, 4.2), "batch_mean-s0": (1.0e9 + 3600, 2.0),
           "grpo_gs8-s1": (1.0e9 + 7200, 3.0), "batch_mean-s1": (1.0e9 + 7201, 3.4), "gs1_kernel-s1": (1.0e9 + 9000, 2.0)}
    for unit in plan.units():
        if unit.unit not in ran:
            continue
        start, step_seconds = ran[unit.unit]
        cost = ArmCost(arm=unit.name, seed=unit.order_seed, unit=unit.unit, steps=2, wall_seconds=2 * step_seconds,
                       sample_seconds=1.0, train_seconds=1.0, sampler_tokens=100, trainer_tokens=100, model_calls=8)
        _write_fake_unit(tmp_path, unit, [i % 2 == 0 for i in range(10)], cost, None, start, step_seconds)

    standing = _fake_standing(spec, plan, tmp_path)
    assert {s.unit: s.beside for s in standing.sharing} == {
        "grpo_gs8-s0": ("gs1_kernel-s0",), "grpo_gs8-s1": ("batch_mean-s1",), "gs1_kernel-s0": ("grpo_gs8-s0",),
        "gs1_kernel-s1": (), "batch_mean-s0": (), "batch_mean-s1": ("grpo_gs8-s1",)}
    rows = {a.arm: a for a in standing.arms}
    assert {arm: a.wall_seeds for arm, a in rows.items()} == {"grpo_gs8": (0, 1), "gs1_kernel": (0,),
                                                               "batch_mean": (1,)}
    assert rows["gs1_kernel"].wall_ratio == pytest.approx(8.4 / 8.0)  # seed 0 only: seed 1 ran alone
    assert rows["batch_mean"].wall_ratio == pytest.approx(6.8 / 6.0)
    lines = standing_markdown(plan, standing, UnitsLayout(tmp_path)).splitlines()

    def row(first: str) -> str:
        return next(line for line in lines if line.startswith(f"| {first} |"))

    assert "| 12 s, 3.1 s/step (1.05x at seed 0) |" in row("gs1_kernel")  # 8.4 + 4.0 s over 4 steps
    assert "| 11 s, 2.7 s/step (1.13x at seed 1) |" in row("batch_mean")
    assert "| 14 s, 3.5 s/step (1.00x) |" in row("grpo_gs8")
    assert row("batch_mean-s0") == "| batch_mean-s0 | alone | 2.0 |"
    assert row("grpo_gs8-s0") == "| grpo_gs8-s0 | gs1_kernel-s0 | 4.0 |"
    # the treatment against batch_mean: side by side at no seed (gs1_kernel-s1 trained alone)
    versus = next(v for v in standing.versus if v.arm == "batch_mean")
    secondary = "\n".join(lines).split("against the other arms (secondary)", 1)[1].splitlines()
    assert versus.wall_seeds == () and versus.wall_ratio is None
    assert "| ran apart |" in next(line for line in secondary if line.startswith("| batch_mean |"))


def test_units_that_trained_at_once_on_two_gpus_shared_nothing(tmp_path, repo_root, tiny_model_dir):
    """Made-up unit files (a fake units folder, no training) from one run on two fake GPUs: every
    unit trained at once, seed 0's three units on one GPU and seed 1's on the other (as the engine
    places a seed's units, `LocalServiceClient.place`), and one unit from before devices were kept.
    Only units on one device shared a GPU (the unit with no device is taken to share, as on one GPU);
    each wall-time ratio is over the seeds where the two shared one; the table names each unit's
    device and each device's identity."""
    from decision.units import standing_markdown
    from design.plan import plan_from_spec
    from schemas.cost import ArmCost
    from schemas.layout import UnitsLayout

    spec = _with_items(three_arm_spec(repo_root, tiny_model_dir), 10)
    plan = plan_from_spec(spec)
    gpu = {0: "host/GPU-aaaa", 1: "host/GPU-bbbb"}
    step_seconds = {"grpo_gs8": 4.0, "gs1_kernel": 4.4, "batch_mean": 4.8}
    for unit in plan.units():
        device = None if unit.unit == "batch_mean-s1" else gpu[unit.order_seed]
        seconds = step_seconds[unit.name] + unit.order_seed
        cost = ArmCost(arm=unit.name, seed=unit.order_seed, unit=unit.unit, steps=2, wall_seconds=2 * seconds,
                       sample_seconds=1.0, train_seconds=1.0, sampler_tokens=100, trainer_tokens=100, model_calls=8,
                       device=device)
        _write_fake_unit(tmp_path, unit, [i % 2 == 0 for i in range(10)], cost, None, 1.0e9, seconds)

    standing = _fake_standing(spec, plan, tmp_path)
    sharing = {s.unit: s for s in standing.sharing}
    seed_0 = {"grpo_gs8-s0", "gs1_kernel-s0", "batch_mean-s0"}
    assert {u: set(s.beside) for u, s in sharing.items()} == {
        **{u: seed_0 - {u} | {"batch_mean-s1"} for u in seed_0},
        "grpo_gs8-s1": {"gs1_kernel-s1", "batch_mean-s1"}, "gs1_kernel-s1": {"grpo_gs8-s1", "batch_mean-s1"},
        "batch_mean-s1": seed_0 | {"grpo_gs8-s1", "gs1_kernel-s1"}}
    assert sharing["grpo_gs8-s1"].device == "host/GPU-bbbb" and sharing["batch_mean-s1"].device is None
    rows = {a.arm: a for a in standing.arms}
    assert rows["gs1_kernel"].wall_seeds == (0, 1)
    assert rows["gs1_kernel"].wall_ratio == pytest.approx((8.8 + 10.8) / (8.0 + 10.0))
    lines = standing_markdown(plan, standing, UnitsLayout(tmp_path)).splitlines()
    assert "| grpo_gs8-s0 | GPU 1 | gs1_kernel-s0, batch_mean-s0, batch_mean-s1 | 4.0 |" in lines
    assert "| grpo_gs8-s1 | GPU 2 | gs1_kernel-s1, batch_mean-s1 | 5.0 |" in lines
    assert next(line for line in lines if line.startswith("| batch_mean-s1 | not known |"))
    assert "- GPU 1: `host/GPU-aaaa`" in lines and "- GPU 2: `host/GPU-bbbb`" in lines


@pytest.mark.parametrize("missing", [(), ("gs1_kernel-s1",)])
def test_the_treatment_against_each_other_arm_and_the_plots(tmp_path, repo_root, tiny_model_dir, missing):
    """Made-up unit files (a fake units folder, no training): the treatment minus each arm that is
    not the baseline, paired over the seeds both have (recomputed here in float64 from the eval
    outcomes, the Hoeffding radius from its formula), its costs over the other arm's, the rule's
    power line, and the three plots drawn beside the table (a plot whose data is gone is removed
    and said not drawn)."""
    from decision.units import write_standing
    from design.plan import plan_from_spec
    from schemas.cost import ArmCost
    from schemas.layout import UnitsLayout

    spec = _with_items(five_arm_spec(repo_root, tiny_model_dir), 60)
    plan = plan_from_spec(spec)
    treatment, n_items = plan.run.treatment, 60
    outcomes = _write_fake_folder(tmp_path, plan, missing, n_items, 11, lambda unit: ArmCost(
        arm=unit.name, seed=unit.order_seed, unit=unit.unit, steps=2, wall_seconds=10.0, sample_seconds=5.0,
        train_seconds=5.0, sampler_tokens=1000, trainer_tokens=100 * len(unit.name) + unit.order_seed, model_calls=8))

    folder = UnitsLayout(tmp_path)
    standing = _fake_standing(spec, plan, tmp_path)
    others = [a for a in plan.compared if a not in (plan.run.baseline, treatment)]
    assert [v.arm for v in standing.versus] == others and others  # batch_mean, flash_reinforce, critic
    seeds = [0] if missing else [0, 1]
    alpha = plan.decision.alpha
    radius = 2.0 * np.sqrt(np.log(1.0 / alpha) / (2.0 * n_items))  # differences lie in [-1, 1]
    for v in standing.versus:
        assert v.common_seeds == tuple(seeds)
        per_item = np.mean([outcomes[f"{treatment}-s{s}"] - outcomes[f"{v.arm}-s{s}"] for s in seeds], axis=0)
        assert v.pair["mean_diff"] == pytest.approx(float(np.mean(per_item)), abs=1e-12)
        assert v.pair["lower"] == pytest.approx(float(np.mean(per_item)) - radius, abs=1e-12)
        want_tokens = sum(100 * len(treatment) + s for s in seeds) / sum(100 * len(v.arm) + s for s in seeds)
        assert v.relative_cost["trainer_tokens"] == pytest.approx(want_tokens)
        assert v.wall_seeds == tuple(seeds)  # the fake units' steps all overlap: one run
        if missing:  # one seed: 0/1 outcomes, so the items each arm alone gets right are counted
            mine, theirs = outcomes[f"{treatment}-s0"], outcomes[f"{v.arm}-s0"]
            assert (v.pair["mcnemar"]["b"], v.pair["mcnemar"]["c"]) == (
                int(np.sum((mine == 1) & (theirs == 0))), int(np.sum((mine == 0) & (theirs == 1))))

    markdown = write_standing(plan, standing, folder).read_text()
    table = markdown.split(f"### {treatment} against the other arms (secondary)", 1)[1]
    row = next(line for line in table.splitlines() if line.startswith("| critic |"))
    assert f"| {standing.versus[-1].pair['mean_diff']:+.4f} |" in row
    assert (" / " in row) == bool(missing)  # counts only where an item's outcome is 0/1
    assert f"above {plan.decision.margin + radius:+.4f}" in markdown
    plots = tmp_path / UnitsLayout.PLOTS_FOLDER
    for name in ("units_accuracy", "units_reward", "units_cost"):
        assert (plots / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert f"]({UnitsLayout.PLOTS_FOLDER}/{name}.png)" in markdown
    assert (tmp_path / "README.md").read_text().count(f"]({UnitsLayout.PLOTS_FOLDER}/units_cost.png)") == 1

    # the same standing draws the same bytes (no timestamps in the PNGs)
    before = (plots / "units_reward.png").read_bytes()
    write_standing(plan, standing, folder)
    assert (plots / "units_reward.png").read_bytes() == before
    # step metrics gone (a folder from before they were kept): no reward plot, and no stale one left
    for unit in standing.present:
        folder.step_metrics_path(unit).unlink()
    markdown = write_standing(plan, _fake_standing(spec, plan, tmp_path), folder).read_text()
    assert not (plots / "units_reward.png").exists()
    assert "Training reward per step: not drawn (no unit has step metrics)." in markdown


@pytest.mark.parametrize("missing", [(), ("gs1_kernel-s1",), ("critic-s1",)])
def test_the_answers_lead_the_readme(tmp_path, repo_root, tiny_model_dir, missing):
    """Made-up unit files (a fake units folder, no training): `write_standing` puts the answers
    under the README's title and at the top of comparison.md, with the treatment's difference and
    Hoeffding bounds recomputed here in float64, the verdict once every unit is in, a critic's
    share of its trainer tokens; a second write replaces the block and keeps the hand-written text."""
    from decision.units import ANSWERS_BEGIN, ANSWERS_END, README_BEGIN, write_standing
    from design.plan import plan_from_spec
    from schemas.cost import ArmCost
    from schemas.layout import UnitsLayout

    spec = _with_items(five_arm_spec(repo_root, tiny_model_dir), 50)
    plan = plan_from_spec(spec)
    treatment, baseline, n_items = plan.run.treatment, plan.run.baseline, 50

    def cost_of(unit) -> ArmCost:
        critic = unit.name == "critic"
        return ArmCost(arm=unit.name, seed=unit.order_seed, unit=unit.unit, steps=2, wall_seconds=10.0,
                       sample_seconds=5.0, train_seconds=5.0, sampler_tokens=1000, trainer_tokens=800,
                       model_calls=12 if critic else 8, critic_seconds=3.0 if critic else None,
                       critic_tokens=300 + unit.order_seed if critic else None, critic_calls=4 if critic else None)

    outcomes = _write_fake_folder(tmp_path, plan, missing, n_items, 5, cost_of)
    readme = tmp_path / "README.md"
    readme.write_text("# Hand title\n\nA hand-written paragraph.\n")

    folder = UnitsLayout(tmp_path)
    for _ in range(2):
        comparison = write_standing(plan, _fake_standing(spec, plan, tmp_path), folder).read_text()
    text = readme.read_text()
    assert text.startswith(f"# Hand title\n\n{ANSWERS_BEGIN}\n")
    assert text.count(ANSWERS_BEGIN) == text.count(ANSWERS_END) == text.count(README_BEGIN) == 1
    assert f"{ANSWERS_END}\n\nA hand-written paragraph.\n" in text and text.index("A hand-written") < text.index(README_BEGIN)
    answers = text.split(ANSWERS_BEGIN + "\n", 1)[1].split(ANSWERS_END, 1)[0]
    assert comparison.startswith(answers)
    n_units = len(plan.units())
    assert answers.startswith("## The answers (every unit in: the pre-registered decision)" if not missing else
                              f"## The answers so far ({n_units - 1} of {n_units} units in: interim)")

    seeds = [0] if f"{treatment}-s1" in missing else [0, 1]
    per_item = np.mean([outcomes[f"{treatment}-s{s}"] - outcomes[f"{baseline}-s{s}"] for s in seeds], axis=0)
    radius = 2.0 * np.sqrt(np.log(1.0 / plan.decision.alpha) / (2.0 * n_items))  # differences lie in [-1, 1]
    diff = float(np.mean(per_item))
    line = next(line for line in answers.splitlines() if line.startswith(f"- **Does {treatment} match {baseline}"))
    assert f"{treatment} − {baseline} = **{diff:+.4f} [{diff - radius:+.4f}, {min(diff + radius, 1.0):+.4f}]**" in line
    # the accuracies the difference pairs on: the baseline's over the treatment's seeds only
    base_acc = float(np.mean([outcomes[f"{baseline}-s{s}"] for s in seeds]))
    treat_acc = float(np.mean([outcomes[f"{treatment}-s{s}"] for s in seeds]))
    assert f"{treatment} {treat_acc:.4f} against {baseline} {base_acc:.4f}," in line
    assert ("Not decided yet (interim)" in line) == bool(missing)
    assert ("Decided: **" in line and "Holm p" in line) == (not missing)
    critic_line = next(line for line in answers.splitlines() if line.startswith(f"- **{treatment} and critic**"))
    critic_seeds = [0] if "critic-s1" in missing else [0, 1]
    share = sum(300 + s for s in critic_seeds) / (800 * len(critic_seeds))
    assert (f"its value model: {share:.0%} of its trainer tokens, {4 * len(critic_seeds)} of its "
            f"{12 * len(critic_seeds)} model calls") in critic_line
    assert (f"{len(seeds)} of 2 seeds paired so far" in answers) == bool(missing)
    assert (f"{len(seeds)} of 2 seeds paired (" in answers) == (not missing)
    # each seed's difference beside the average, once there are two
    by_seed = [float(np.mean(outcomes[f"{treatment}-s{s}"] - outcomes[f"{baseline}-s{s}"])) for s in seeds]
    assert (f"(s0 {by_seed[0]:+.4f}, s1 {by_seed[-1]:+.4f}; bootstrap [" in line) == (len(seeds) == 2)
    assert ("(bootstrap [" in line) == (len(seeds) == 1)  # one seed: no seed's difference to set beside it
