"""Gate metrics computed from logged rollouts. Filled in by the estimators issue."""

GATE_METRICS = (
    "executed_group_size_treatment",
    "executed_group_size_baseline",
    "pilot_mean_reward",
    "kernel_effective_neighbors_p10",
    "frac_nonzero_advantage_treatment",
    "baseline_reward_corr",
)
