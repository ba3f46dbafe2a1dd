"""Benchmarks as envs: problems, prompts (cookbook renderer), reward and grade (cookbook grader).

`get_env(name, data_dir=None, **kw)` returns one by name; `ENV_NAMES` lists the names a spec's
`dataset.name` may take.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from pathlib import Path

from rl.envs.base import Env, Problem, make_prompt_id, parse_prompt_id
from schemas.errors import UserError
from schemas.names import (ENV_NAMES, REASONING_GYM_ENV_NAMES, declare_env, env_data_dir, env_names,
                           unknown_env_options)

# name -> "module:class"; modules load on demand (GSM8K pulls in `datasets`). The names (and each
# env's options) a spec may use are schemas.names'; this maps them to their implementations.
_ENVS: dict[str, str | Callable[..., Env]] = {
    "gsm8k": "rl.envs.gsm8k:Gsm8kEnv",
    "arithmetic": "rl.envs.arithmetic:ArithmeticEnv",
}


def _reasoning_gym_factory(name: str) -> Callable[..., Env]:
    def make(data_dir=None, *, seed: int = 0, n_train: int | None = None, n_test: int = 256, config: dict | None = None,
             system_prompt: str = "default", fewshot: int = 0):
        try:  # on first use: reasoning_gym is slow to import
            from rl.envs.reasoning_gym_env import make_reasoning_gym_env
        except ModuleNotFoundError as e:
            if e.name != "reasoning_gym":
                raise
            raise UserError(f"dataset {name}: needs the reasoning-gym package, which is not installed here "
                            f"(in the gs1 checkout: pip install -e '.[reasoning-gym]')") from None
        return make_reasoning_gym_env(name, data_dir, seed=seed, n_train=n_train, n_test=n_test, config=config,
                                      system_prompt=system_prompt, fewshot=fewshot)

    make.__name__ = make.__qualname__ = f"make_{name}"
    make.__doc__ = f"The reasoning-gym env {name!r} (ReasoningGymEnv's keyword options)."
    return make


for _name in REASONING_GYM_ENV_NAMES:
    _ENVS[_name] = _reasoning_gym_factory(_name)


def register_env(name: str, target: str | Callable[..., Env], reads_data: bool = True) -> None:
    """Add an env: `"module:Class"` or a callable, called as `target(data_dir, **kw)`; a spec may
    then name it, with the keyword options the target takes. `reads_data=False`: it generates its
    problems, and is handed no data directory."""
    _ENVS[name] = target
    declare_env(name, accepted_options(name), reads_data)


def _target(name: str) -> Callable[..., Env]:
    target = _ENVS[name]
    if isinstance(target, str):
        module, attr = target.split(":")
        target = getattr(importlib.import_module(module), attr)
    return target


def accepted_options(name: str) -> tuple[str, ...] | None:
    """The keyword options env `name`'s constructor takes (None: any, it has **kw)."""
    params = inspect.signature(_target(name)).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return None
    return tuple(n for n, p in params.items() if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and n != "data_dir")


def get_env(name: str, data_dir: str | Path | None = None, **kw) -> Env:
    """The env called `name`; `data_dir` is a local copy of its data (GSM8K), handed only to an env
    that reads one (`schemas.names.env_reads_data`); kw go to the env."""
    if name not in _ENVS:
        raise UserError(f"unknown dataset {name!r} (known: {', '.join(_ENVS)})")
    return _target(name)(env_data_dir(name, data_dir), **kw)


__all__ = [
    "ENV_NAMES", "REASONING_GYM_ENV_NAMES", "Env", "Problem", "accepted_options", "env_names", "get_env",
    "make_prompt_id", "parse_prompt_id", "register_env", "unknown_env_options",
]
