"""The paired decisions and the units behind them: a family decision's record and its files
(`records`), and a units folder collected, proved, read and decided (`units`). No Prefect here:
the decision stage (`tasks/gates.py`) and `gs1 decide` call it."""
