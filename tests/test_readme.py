"""README's first two commands are the ones CI runs (the test command) and users paste."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _readme_commands() -> list[str]:
    text = (REPO / "README.md").read_text()
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    return [line for line in block.splitlines() if line.strip()]


def test_readme_opens_with_setup_and_run_then_tests():
    run_cmd, test_cmd = _readme_commands()[:2]
    assert run_cmd.endswith("gs1 run")
    assert "pip install" in run_cmd and "pip install" in test_cmd
    assert test_cmd.rstrip().endswith("pytest -q")


def test_ci_runs_readme_test_command_verbatim():
    test_cmd = _readme_commands()[1]
    ci = (REPO / ".ci" / "run").read_text().splitlines()
    assert test_cmd in ci
