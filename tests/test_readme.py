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


def test_readme_names_the_fast_tier_and_the_faults_commands_with_registered_markers():
    import re
    import tomllib

    blocks = (REPO / "README.md").read_text().split("```bash\n")
    second = blocks[2].split("```", 1)[0]  # the block right below the opening one
    commands = [line.split("#", 1)[0].strip() for line in second.splitlines() if line.strip()]
    assert commands[:2] == ['pytest -m "not slow"', "pytest -m faults tests/test_faults.py"]
    assert (REPO / "tests" / "test_faults.py").is_file()
    # a marker the commands select on that pytest does not know would select nothing (or, with
    # --strict-markers, be an error): each must be registered
    ini = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    registered = {m.split(":", 1)[0].strip() for m in ini["markers"]}
    for command in commands:
        expression = re.search(r"-m (\"[^\"]+\"|\S+)", command).group(1).strip('"')
        assert set(re.findall(r"\w+", expression)) - {"not", "and", "or"} <= registered, command
