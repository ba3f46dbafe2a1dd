"""Advantage estimators (float64 numpy). Filled in by the estimators issue."""

# Spec `advantage` name -> estimator id.
ADVANTAGE_ESTIMATORS = {
    "group_mean": "grpo",
    "kernel_cross_prompt_baseline": "gs1_kernel",
    "batch_mean": "batch_mean",
    "leave_one_out": "rloo",
}
