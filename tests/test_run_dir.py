"""`--run-dir` takes only a gs1 run directory (issue 47, defect 3): a user's own folder, a file or
a folder gs1 cannot read is refused with one line and exit 2, nothing in it touched; a new or
empty folder, one gs1 marked, or one an earlier gs1 made (its lock file or stage results) is
taken and marked; the lock file goes when the run ends, and removing it never lets two runs in.
"""

from __future__ import annotations

import os

import pytest

from gs1.cli import main
from gs1.run_control import LOCK_FILE, run_dir_lock
from schemas.errors import UserError
from schemas.layout import RUN_DIR_MARKER, RunLayout


def _tree(root):
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


def test_a_users_own_folder_is_refused_untouched(tmp_path, capsys):
    mine = tmp_path / "mine"
    (mine / "spec").mkdir(parents=True)
    (mine / "spec" / "spec.json").write_text('{"my": "own spec"}')
    (mine / "notes.txt").write_text("mine")
    before = _tree(mine)
    rc = main(["run", "--run-dir", str(mine)])
    err = capsys.readouterr().err
    assert rc == 2 and len(err.splitlines()) == 1, err
    assert "not a gs1 run directory" in err and "notes.txt, spec" in err
    assert _tree(mine) == before


def test_a_file_is_refused(tmp_path, capsys):
    f = tmp_path / "run"
    f.write_text("a file")
    assert main(["run", "--run-dir", str(f)]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "is a file, not a folder" in err
    assert f.read_text() == "a file"


@pytest.mark.parametrize("made", ["new", "empty", "marked", "earlier gs1 (lock file)", "earlier gs1 (stage results)"])
def test_a_gs1_run_directory_is_taken_and_marked(tmp_path, made):
    run_dir = tmp_path / "run"
    if made != "new":
        run_dir.mkdir()
    extra = {"marked": RUN_DIR_MARKER, "earlier gs1 (lock file)": LOCK_FILE}.get(made)
    if extra:
        (run_dir / extra).write_text("")
    if made == "earlier gs1 (stage results)":
        (run_dir / ".stage-results").mkdir()
    with run_dir_lock(run_dir):
        assert (run_dir / LOCK_FILE).is_file()
    assert (run_dir / RUN_DIR_MARKER).is_file()
    assert not (run_dir / LOCK_FILE).exists()  # gone with the run


def test_a_held_directory_stays_held_until_released(tmp_path):
    run_dir = tmp_path / "run"
    with run_dir_lock(run_dir):
        with pytest.raises(UserError, match=f"in use by another gs1 run \\(pid {os.getpid()} "):
            with run_dir_lock(run_dir):
                pass
    with run_dir_lock(run_dir):  # released: the next run takes it
        pass


def test_a_lock_taken_on_a_removed_file_is_retaken(tmp_path, monkeypatch):
    """The holder removes the lock file as it ends; a run that opened the old file just before
    then locks a file no longer at the path: it must notice and lock the one there."""
    import gs1.run_control as rc

    run_dir = tmp_path / "run"
    run_dir.mkdir()
    real_open, opened = os.open, []

    def open_then_lose_it(path, *a, **kw):
        fd = real_open(path, *a, **kw)
        if not opened:  # the first open: the file is removed (and remade by a third run) behind it
            opened.append(path)
            os.unlink(path)
            (run_dir / LOCK_FILE).write_text("")
        return fd

    monkeypatch.setattr(rc.os, "open", open_then_lose_it)
    with run_dir_lock(run_dir):
        assert len(opened) == 1
        st, held = os.stat(run_dir / LOCK_FILE), (run_dir / LOCK_FILE).read_text()
        assert str(os.getpid()) in held  # the holder record is in the file at the path
    assert st.st_size > 0


def test_claim_refuses_before_writing(tmp_path):
    other = tmp_path / "other"
    other.mkdir()
    (other / "data.csv").write_text("x")
    with pytest.raises(UserError, match="not a gs1 run directory"):
        RunLayout(other).claim()
    assert sorted(p.name for p in other.iterdir()) == ["data.csv"]
