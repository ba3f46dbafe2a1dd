"""The offline kernel hill-climb: collect rollout logs, then search kernel baselines by G_eff.

Entry points:
- `collect.run_collection(CollectSettings)`: N prompts x K rollouts with every candidate feature
  (`gs1 collect`, the `collect_logs` flow)
- `data.load_log(path)`: a rollout log as a `RolloutLog`
- `climb.analyse(log, ...)` -> `HillclimbReport`; `climb.transfer(logs, ...)` -> `TransferReport`
  (`gs1 hillclimb`); `climb.KernelRecipe`, `climb.spec_recipe`
- `outputs.write_hillclimb`, `outputs.write_transfer`: the Parquet, markdown, JSON and PNG files
- `geff.g_eff`: the variance-equivalent group size a baseline is judged by

Modules import their neighbours directly (`hillclimb.climb`, ...); nothing is re-exported here,
so `import hillclimb.geff` stays light.
"""
