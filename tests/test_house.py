"""The house's bars (docs/contracts.md): what a backend can do is asked of it, never read off its
name; the calibration changes a plan in one place; `tasks/` holds stages. Read from the source
with `ast`, so a bar fails on the line that breaks it."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from rl.backends import BACKENDS, Backend, backend_named
from schemas.errors import UserError
from test_layers import LAYERS

ROOT = Path(__file__).resolve().parents[1]
ROOMS = tuple(room for layer in LAYERS for room in layer)  # the house's rooms, as tests/test_layers.py holds them


def _modules(*rooms: str, skip: tuple[str, ...] = ()) -> list[Path]:
    return sorted(p for room in rooms for p in (ROOT / room).rglob("*.py")
                  if not any(p.relative_to(ROOT).as_posix().startswith(s) for s in skip))


def _where(path: Path, node: ast.AST) -> str:
    return f"{path.relative_to(ROOT)}:{node.lineno}"


def test_no_room_names_a_backend_outside_the_backends():
    """A task, flow, command or library module asks `backend_named(name)` what it can do; the
    names themselves live in `rl/backends` alone (adding a backend touches only it), and in the
    local engine's record of its own numerics (`engine/` is that backend)."""
    names = set(BACKENDS)
    offenders = [_where(p, node) for p in _modules(*ROOMS, skip=("rl/backends/", "engine/"))
                 for node in ast.walk(ast.parse(p.read_text()))
                 if isinstance(node, ast.Constant) and node.value in names]
    assert not offenders, f"a backend's name outside rl/backends: {offenders}"


def test_the_calibration_changes_a_plan_in_one_place():
    """`RunPlan.calibrated` is the one caller of `with_kernel_bandwidth`: the calibration pilot, its
    audit, the revised spec and the runs read the plan it returns."""
    calls = [_where(p, node) for p in _modules(*ROOMS) for node in ast.walk(ast.parse(p.read_text()))
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
             and node.func.attr == "with_kernel_bandwidth"]
    assert len(calls) == 1 and calls[0].startswith("design/plan.py"), calls


def _decorator_name(node: ast.expr) -> str:
    node = node.func if isinstance(node, ast.Call) else node
    return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")


def test_tasks_holds_stages_and_one_module_is_named_report():
    """Every module of `tasks/` defines a Prefect task (the libraries they call live below); the run
    report is the `report` room alone (the CLI's `gs1 report` is `gs1/commands/report.py`)."""
    without = [p.name for p in _modules("tasks") if p.name != "__init__.py"
               and not any(_decorator_name(d) in ("task", "judging_task")
                           for node in ast.walk(ast.parse(p.read_text())) if isinstance(node, ast.FunctionDef)
                           for d in node.decorator_list)]
    assert not without, f"modules of tasks/ that hold no task: {without}"
    named_report = [p.relative_to(ROOT).as_posix() for p in _modules(*ROOMS) if p.stem == "report"]
    assert named_report == ["gs1/commands/report.py"], named_report


class _FakeBackend(Backend):
    """A third backend, as a test names it: what the stages ask, answered without a service."""

    name = "third"
    meters_usage = False

    def lora_options(self, base_model_path):
        return {"adapter_home": base_model_path}


def test_a_third_backend_is_its_class_and_its_line(monkeypatch, tmp_path):
    from gs1.cli import build_parser
    from tasks.spec import checked_request

    monkeypatch.setitem(BACKENDS, "third", _FakeBackend())
    args = build_parser().parse_args(["run", "--backend", "third"])  # the CLI's choices read BACKENDS
    assert args.backend == "third"
    request = checked_request(str(ROOT / "specs" / "demo_local.json"), "third", None)
    assert request.backend == "third"
    assert backend_named("third").devices() == 1 and backend_named("third").lora_options("m") == {"adapter_home": "m"}
    with pytest.raises(UserError, match="must be 'local' or 'tinker' or 'third'"):
        backend_named("fourth")


def test_what_the_two_backends_say_they_can_do():
    local, tinker = backend_named("local"), backend_named("tinker")
    assert local.meters_usage and not tinker.meters_usage
    assert local.lora_options("/m.gguf") == {"base_model_path": "/m.gguf"} and local.lora_options(None) == {}
    assert tinker.lora_options("/m.gguf") == {}  # a hosted service names its models itself
    assert tinker.devices() == 1
    assert tinker.numerics(lambda: pytest.fail("a hosted service is not asked")) == {
        "backend": "tinker", "deterministic": None, "device": None, "dtype": None, "tf32": None,
        "cublas_workspace": None, "torch": None, "decode_attention": None}
