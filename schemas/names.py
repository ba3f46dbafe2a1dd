"""The names a spec may use: gate metrics and envs (with each env's options).

The spec validator (`design.spec`) checks against these; the library takes them from here
(`rl.gates`, `rl.envs`), so a name is added in one place and the spec never imports the library.
(The arm kinds' names are `estimators.registry`'s, the kernel's names `schemas.kernel`'s.)
"""

from __future__ import annotations

from collections.abc import Mapping

# The activation gate's metrics (rl.gates.compute_gate_metrics), the names `gates[].metric` may take.
GATE_METRICS = (
    "executed_group_size_treatment",
    "executed_group_size_baseline",
    "pilot_mean_reward",
    "kernel_effective_neighbors_p10",
    "frac_nonzero_advantage_treatment",
    "baseline_reward_corr",
)

# ---------------------------------------------------------------------------------------------
# envs: `dataset.name` selects one (rl.envs.get_env); `dataset.options` are its keyword options

# reasoning-gym generators (rl/envs/reasoning_gym_env.py holds their configs)
REASONING_GYM_ENV_NAMES = ("rg_basic_arithmetic", "rg_chain_sum", "rg_gsm_symbolic", "rg_countdown", "rg_lcm")
_REASONING_GYM_OPTIONS = ("seed", "n_train", "n_test", "config", "system_prompt", "fewshot")

# name -> the keyword options its constructor takes (None: any); tests/test_envs.py checks these
# against the constructors' signatures
_ENV_OPTIONS: dict[str, tuple[str, ...] | None] = {
    "gsm8k": (),
    "arithmetic": ("seed", "n_train", "n_test", "operand_digits", "system_prompt", "fewshot"),
    **dict.fromkeys(REASONING_GYM_ENV_NAMES, _REASONING_GYM_OPTIONS),
}
ENV_NAMES = tuple(_ENV_OPTIONS)  # the built-in benchmarks

# test items an env holds when its options do not say (`n_test`): GSM8K's test split
_ENV_TEST_ITEMS = {"gsm8k": 1319}

# the envs that read a data directory (`gs1 run --data-dir`, GS1_GSM8K_DIR); the others generate
# their problems and are handed none, so a data directory neither reaches them nor keys their stages
_ENVS_READING_DATA = {"gsm8k"}


def env_reads_data(name: str) -> bool:
    """Whether env `name` reads a data directory (a registered env is taken to, unless declared not)."""
    return name in _ENVS_READING_DATA


def env_data_dir(name: str, data_dir: str | None) -> str | None:
    """The data directory env `name` is handed: `data_dir` if it reads one, else None."""
    return data_dir if env_reads_data(name) else None


def env_test_items(name: str, options: Mapping) -> int | None:
    """How many test items env `name` with these options has (its `n_test` option, else a fixed
    test split's size), or None when only loading it would tell."""
    if "n_test" in options:
        return int(options["n_test"])
    return _ENV_TEST_ITEMS.get(name)


def declare_env(name: str, options: tuple[str, ...] | None, reads_data: bool = True) -> None:
    """Let a spec name env `name` with these keyword options (None: any); `rl.envs.register_env` calls it."""
    _ENV_OPTIONS[name] = None if options is None else tuple(options)
    if reads_data:
        _ENVS_READING_DATA.add(name)
    else:
        _ENVS_READING_DATA.discard(name)


def env_names() -> tuple[str, ...]:
    """Every env a spec's `dataset.name` may take now (built-in and registered)."""
    return tuple(_ENV_OPTIONS)


def env_options(name: str) -> tuple[str, ...] | None:
    """The keyword options env `name` takes (None: any)."""
    return _ENV_OPTIONS[name]


def unknown_env_options(name: str, options: Mapping) -> list[str]:
    """The keys of `options` that env `name` does not take as keyword arguments."""
    accepted = _ENV_OPTIONS[name]
    if accepted is None:
        return []
    return sorted(k for k in options if k not in accepted)
