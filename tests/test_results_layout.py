"""`results/` holds what programs produced, never the programs (issue 22, item 9): those live under
`scripts/` or `benchmarks/`, and each results folder's README names the program that made it."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "results"
PROGRAM_SUFFIXES = (".py", ".sh")
# A repository path to a program, as the docs spell it (`scripts/h200/x.sh`, benchmarks/engine_speed.py);
# the look-behind keeps a longer path's tail (`.wt-engine/benchmarks/engine_speed.py`) from counting.
PROGRAM_PATH = re.compile(r"(?<![\w./-])((?:scripts|benchmarks|results|tools|tests)/[\w./-]+\.(?:py|sh))\b")


def _docs() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted(RESULTS.rglob("README.md")),
            *sorted((REPO / "scripts").rglob("*.md")), *sorted((REPO / "benchmarks").rglob("*.md"))]


def test_no_program_lives_under_results():
    programs = [p.relative_to(REPO).as_posix() for p in RESULTS.rglob("*")
                if p.is_file() and p.suffix in PROGRAM_SUFFIXES and "__pycache__" not in p.parts]
    assert programs == [], f"programs belong under scripts/ or benchmarks/, not results/: {programs}"


def test_every_results_folder_has_a_readme_naming_an_existing_program():
    folders = sorted(d for d in RESULTS.iterdir() if d.is_dir())
    assert folders, "results/ has no folders to check"
    problems = []
    for folder in folders:
        readme = folder / "README.md"
        if not readme.is_file():
            problems.append(f"{folder.name}: no README.md")
            continue
        named = [m for m in PROGRAM_PATH.findall(readme.read_text()) if m.startswith(("scripts/", "benchmarks/"))]
        if not any((REPO / m).is_file() for m in named):
            problems.append(f"{folder.name}: README names no program under scripts/ or benchmarks/")
    assert problems == []


def test_every_program_path_the_docs_name_exists():
    # catches a reference left behind by a move (the old results/<x>/<y>.py path, say)
    missing = sorted({f"{doc.relative_to(REPO)}: {m}" for doc in _docs() for m in PROGRAM_PATH.findall(doc.read_text())
                      if not (REPO / m).is_file()})
    assert missing == []


def test_the_path_pattern_sees_moved_and_stale_paths():
    # the checks above are only as good as the pattern: it must find what a README writes
    text = "run `bash scripts/h200/gsm8k_device_run.sh`, then python results/ui/make_states.py --rss; " \
           "cp .wt-engine/benchmarks/engine_speed.py there"  # a longer path's tail is not a repository path
    assert PROGRAM_PATH.findall(text) == ["scripts/h200/gsm8k_device_run.sh", "results/ui/make_states.py"]
