"""Project the full run from the pilot's measured timings, against the spec's budget.

Pure arithmetic over plain numbers; the feasibility stage records the result in the spec's
`feasibility` / `feasibility_check` shape and fails the gate when the projection is over budget.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class PilotTimings:
    setup_seconds: float  # creating the training client (model load) for one arm
    step_seconds: dict[str, float]  # mean seconds per training step, per arm
    eval_seconds_per_item: float  # greedy decode + grade of one eval item
    gpus: int  # accelerators the run holds (0 on CPU)


@dataclass(frozen=True)
class Projection:
    phases: dict[str, float]  # seconds per phase (setup, train, eval, reserve)
    wall_seconds: float
    gpu_hours: float
    budget_wall_seconds: float
    budget_gpu_hours: float
    recovery_reserve: float
    problems: list[str] = field(default_factory=list)

    @property
    def feasible(self) -> bool:
        return not self.problems

    def as_record(self) -> dict:
        record = asdict(self)
        record["status"] = "feasible" if self.feasible else "over_budget"
        return record


def project_full_run(
    timings: PilotTimings,
    *,
    steps: int,
    n_eval: int,
    budget_gpu_hours: float,
    budget_wall_minutes: float,
    arms_in_parallel: bool,
    recovery_reserve: float = 0.25,
) -> Projection:
    """Wall time and GPU hours of setup + training + eval of every arm, plus a recovery reserve.

    With arms in parallel the training phase lasts as long as the slowest arm; otherwise the
    arms add up. Eval runs once per arm. The reserve (a fraction of the projected time, > 0)
    pays for one failure and resume.
    """
    if recovery_reserve <= 0:
        raise ValueError("recovery_reserve must be positive")
    train_by_arm = {arm: steps * seconds for arm, seconds in timings.step_seconds.items()}
    n_arms = len(train_by_arm)
    train = max(train_by_arm.values()) if arms_in_parallel else sum(train_by_arm.values())
    setup = timings.setup_seconds * (1 if arms_in_parallel else n_arms)
    evaluation = n_eval * timings.eval_seconds_per_item * n_arms
    base = setup + train + evaluation
    reserve = recovery_reserve * base
    wall = base + reserve
    gpu_hours = wall / 3600.0 * timings.gpus
    budget_wall = budget_wall_minutes * 60.0
    problems = []
    if wall > budget_wall:
        problems.append(f"projected wall time {wall / 60:.1f} min exceeds the budget of {budget_wall_minutes:g} min")
    if gpu_hours > budget_gpu_hours:
        problems.append(f"projected {gpu_hours:.2f} GPU hours exceed the budget of {budget_gpu_hours:g}")
    return Projection(
        phases={"setup": setup, "train": train, "eval": evaluation, "reserve": reserve},
        wall_seconds=wall,
        gpu_hours=gpu_hours,
        budget_wall_seconds=budget_wall,
        budget_gpu_hours=budget_gpu_hours,
        recovery_reserve=recovery_reserve,
        problems=problems,
    )
