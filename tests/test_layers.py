"""The layer rule of docs/contracts.md ("Import rules"), read from the source with `ast`.

Every `import` and `from ... import` of every module of the layered packages counts, at the top
of the module or inside a function (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The rooms, bottom to top (docs/contracts.md, "Import rules"): a room may import its own package
# and the floors below it, never one above, and two rooms of one floor never import each other.
# The ground is `schemas` (errors, names, the kernel spec, layouts, artifact tables, IO); the arm
# kinds (`estimators`, with the kernels and the float64 references) and the decision rules
# (`rules`) stand on it; the experiment spec, its arms and its plan (`design`) are validated by
# them; the local engine (`engine`) needs only the ground; the library (`rl`) and the run report
# (`report`) use all of those; above them the offline kernel research (`hillclimb`), the decisions
# and their units (`decision`) and how a stage runs on Prefect (`pipeline`); then the Prefect
# tasks (the stages), the flows and the CLI.
LAYERS = (("schemas",), ("estimators", "rules"), ("design",), ("engine",), ("rl", "report"),
          ("hillclimb", "decision", "pipeline"), ("tasks",), ("flows",), ("gs1",))
# outside packages a room must not import (the library runs and is tested without Prefect)
FORBIDDEN = {room: {"prefect"} for room in ("schemas", "estimators", "rules", "design", "engine", "rl", "report",
                                            "hillclimb", "decision")}
# the arm kinds import neither torch nor prefect, even lazily (tinker and the cookbook only inside
# the function that is the GRPO reference: the cookbook's own code)
PURE = {"estimators": {"prefect", "torch", "transformers", "peft"},
        "rules": {"prefect", "torch", "transformers", "peft", "tinker", "tinker_cookbook"}}

# (importing module, imported module) pairs that still point up, each with who removes it. An
# entry that no longer occurs fails the test too, so this list only shrinks.
ALLOWED_UPWARD: set[tuple[str, str]] = set()


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_local_module(dotted: str, root: Path = ROOT) -> bool:
    path = root.joinpath(*dotted.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def imported_modules(path: Path, root: Path = ROOT) -> set[str]:
    """Every module `path` imports, anywhere in it: `from a import b` is a.b when that is a module
    of this repository, else a."""
    name = module_name(path, root)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolve against the importing module's package
                parts = package.split(".")
                anchor = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if is_local_module(f"{base}.{alias.name}", root) else base)
    return found


def layered_modules(root: Path = ROOT) -> list[Path]:
    packages = {name.split(".")[0] for layer in LAYERS for name in layer}
    return sorted(p for package in packages for p in (root / package).rglob("*.py"))


def layer_of(module: str) -> int | None:
    room = module.split(".")[0]
    return next((i for i, layer in enumerate(LAYERS) if room in layer), None)


def upward_imports(root: Path = ROOT) -> set[tuple[str, str]]:
    """(importer, imported) pairs where the imported module sits on a higher floor, or in another
    room of the same floor."""
    pairs = set()
    for path in layered_modules(root):
        importer = module_name(path, root)
        for imported in imported_modules(path, root):
            if layer_of(imported) is None:
                continue
            up = layer_of(imported) > layer_of(importer)
            sideways = layer_of(imported) == layer_of(importer) and imported.split(".")[0] != importer.split(".")[0]
            if up or sideways:
                pairs.add((importer, imported))
    return pairs


def test_the_rule_reads_real_imports():
    # the reader sees top-level, function-level and relative imports (else the rule checks nothing)
    assert {"pydantic", "schemas.errors", "schemas.kernel"} <= imported_modules(ROOT / "design/spec.py")
    assert "hillclimb.geff" in imported_modules(ROOT / "hillclimb/climb.py")  # from hillclimb import geff
    # imported inside a function: `gs1 hillclimb` loads the search only when it runs
    assert "hillclimb.climb" in imported_modules(ROOT / "gs1/commands/hillclimb.py")
    assert "gs1.commands" in imported_modules(ROOT / "gs1/cli.py")
    assert len(layered_modules()) > 40


def test_an_upward_import_is_found_wherever_it_hides(tmp_path):
    files = {
        "schemas/__init__.py": "",
        "schemas/names.py": "def late():\n    from rl import envs\n",  # function-level, upward
        "rl/__init__.py": "",
        "rl/envs/__init__.py": "from . import base\nfrom ..stats import mean\n",  # relative, downward
        "rl/envs/base.py": "import tasks.common as common\n",  # upward two layers
        "rl/stats.py": "import numpy\nfrom schemas.names import late\n",
        "report/__init__.py": "",
        "report/page.py": "from rl import stats\n",  # sideways: another room of the same floor
        "tasks/__init__.py": "",
        "tasks/common.py": "from gs1 import cli\n",  # upward
        "gs1/__init__.py": "",
        "gs1/cli.py": "from tasks.common import x\n",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert imported_modules(tmp_path / "rl/envs/__init__.py", tmp_path) == {"rl.envs.base", "rl.stats"}
    assert upward_imports(tmp_path) == {
        ("schemas.names", "rl.envs"), ("rl.envs.base", "tasks.common"), ("tasks.common", "gs1.cli"),
        ("report.page", "rl.stats"),
    }


def test_every_import_points_down():
    upward = upward_imports()
    unexpected = sorted(upward - ALLOWED_UPWARD)
    assert not unexpected, "imports from a lower layer up to a higher one:\n" + "\n".join(f"{a} -> {b}" for a, b in unexpected)
    stale = sorted(ALLOWED_UPWARD - upward)
    assert not stale, "allowed upward imports that are gone (delete them from ALLOWED_UPWARD): " + str(stale)


def test_schemas_and_rl_never_import_prefect():
    bad = [
        (module_name(p), m)
        for p in layered_modules()
        for m in imported_modules(p)
        if m.split(".")[0] in FORBIDDEN.get(module_name(p).split(".")[0], ())
    ]
    assert not bad, bad


def test_the_arm_kinds_import_no_model_code():
    bad = [(module_name(p), m) for p in layered_modules() for prefix, forbidden in PURE.items()
           if module_name(p).startswith(prefix) for m in imported_modules(p) if m.split(".")[0] in forbidden]
    assert not bad, bad
    assert layer_of("estimators.critic") == 1 and layer_of("rl.loop") == layer_of("rl") == 4


def test_every_room_is_a_package_of_its_own():
    """Each room has its `__init__.py` (a namespace package would merge same-named folders on the
    path, and the stage cache's library digest finds a room by its package file)."""
    rooms = [room for layer in LAYERS for room in layer]
    assert not [room for room in rooms if not (ROOT / room / "__init__.py").is_file()]


def test_no_script_shadows_a_room():
    """A script run as `python benchmarks/x.py` has its own folder first on the import path, so a
    `benchmarks/engine.py` would be what `import engine` finds there (and a flow file Prefect loads
    by path likewise): no file beside a script is named for a room."""
    rooms = {room for layer in LAYERS for room in layer}
    beside_scripts = [p for folder in ("benchmarks", "scripts", "flows") for p in (ROOT / folder).rglob("*.py")]
    assert not [p.relative_to(ROOT).as_posix() for p in beside_scripts if p.stem in rooms]


# Rooms whose code is not part of what a cached stage computed (pipeline/cache.py's LIBRARY): the
# report draws from records every time it runs, and the pipeline is the Prefect wiring (its cache
# policies among it). Every other room below the stages is in LIBRARY.
NOT_IN_THE_STAGE_CACHE_KEY = {"report", "pipeline"}
PACKAGED_BESIDE_THE_ROOMS = {"deployments"}  # Prefect's deployment files (YAML), no Python room


def test_the_package_list_and_the_stage_cache_follow_the_floor_table():
    """The rooms are listed twice outside this table: pyproject's packages (what `pip install`
    ships) and the stage cache's LIBRARY (a change there reruns the stages). A room added to
    LAYERS and missed in either would install without its code, or leave stale cached stages."""
    import tomllib

    from pipeline.cache import LIBRARY

    rooms = {room for layer in LAYERS for room in layer}
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    packaged = {name.rstrip("*") for name in include}
    assert packaged == rooms | PACKAGED_BESIDE_THE_ROOMS, packaged ^ (rooms | PACKAGED_BESIDE_THE_ROOMS)
    stages = LAYERS.index(("tasks",))
    below_the_stages = {room for layer in LAYERS[:stages] for room in layer}
    assert set(LIBRARY) == below_the_stages - NOT_IN_THE_STAGE_CACHE_KEY
    # the digest's order is the table's, floor by floor: a reordering alone does not rerun stages
    assert list(LIBRARY) == [room for layer in LAYERS[:stages] for room in layer if room in LIBRARY]
