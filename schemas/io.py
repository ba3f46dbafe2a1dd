"""Atomic artifact writers and checked readers.

Every artifact is written to a temp file in the destination folder and renamed into place, so a
crash never leaves a half-written file and a failed write never clobbers the previous one.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from schemas.errors import UserError


_UMASK = os.umask(0)
os.umask(_UMASK)

# Told of every artifact once it is in place (pipeline.cache records what each stage produced).
_ON_WRITTEN: list[Callable[[Path], None]] = []


def on_artifact_written(hook: Callable[[Path], None]) -> None:
    """Call `hook(path)` after every atomic write in this process."""
    if hook not in _ON_WRITTEN:
        _ON_WRITTEN.append(hook)


def _atomic_write(path: Path, write) -> Path:
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{path}: is a directory; name a file to write")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UserError(f"{path}: cannot be written ({path.parent} is not a directory)") from None
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        write(tmp)
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600; artifacts are ordinary files
        os.replace(tmp, path)
    except BaseException as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UserError(f"no space left to write {path}: free some and run again (it resumes)") from None
        raise
    for hook in _ON_WRITTEN:
        hook(path)
    return path


def write_parquet_atomic(table: pa.Table, path: str | Path, schema: pa.Schema | None = None,
                         compression: str = "snappy") -> Path:
    """Write `table` (cast to `schema` when given) to `path` atomically."""
    if schema is not None:
        table = table.select(schema.names).cast(schema)
    return _atomic_write(Path(path), lambda tmp: pq.write_table(table, tmp, compression=compression))


def write_bytes_atomic(path: str | Path, payload: bytes) -> Path:
    def write(tmp):
        with open(tmp, "wb") as f:
            f.write(payload)

    return _atomic_write(Path(path), write)


def write_text_atomic(path: str | Path, text: str) -> Path:
    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)

    return _atomic_write(Path(path), write)


def write_json_atomic(path: str | Path, obj) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def write_jsonl_atomic(path: str | Path, rows: Iterable[dict]) -> Path:
    return write_text_atomic(path, "".join(json.dumps(r, sort_keys=True, default=str) + "\n" for r in rows))


_RENAME_EXCHANGE = 2  # renameat2(2)'s flag: swap two paths in one step (Linux)


def _exchange(a: Path, b: Path) -> bool:
    """Swap the directory entries `a` and `b` atomically (renameat2 RENAME_EXCHANGE); False where
    the system cannot (not Linux, an old kernel, a file system without it)."""
    import ctypes
    import ctypes.util

    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd = -100
    done = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), _RENAME_EXCHANGE)
    return done == 0


def replace_dir_atomic(target: str | Path, fill: Callable[[Path], None]) -> Path:
    """Write a whole folder at once: `fill(tmp)` writes its files into a temp sibling of `target`,
    which then takes `target`'s place in one rename (an old `target` swapped out in the same step
    where the system can, else renamed away just before, then removed). A kill at any moment leaves
    the old folder or the new one, never a half one; a temp sibling a kill left is removed by the
    next write."""
    import shutil

    target = Path(target)
    parent = target.parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise UserError(f"{target}: cannot be written ({parent} is not a directory)") from None
    if target.exists() and not target.is_dir():
        raise UserError(f"{target}: is a file; a folder belongs there")
    for stale in parent.glob(f".{target.name}.*.swap"):
        shutil.rmtree(stale, ignore_errors=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".swap", dir=parent))
    try:
        fill(tmp)
        os.chmod(tmp, 0o777 & ~_UMASK)  # mkdtemp makes 0700; a decision is an ordinary folder
        if target.is_dir() and _exchange(tmp, target):
            pass  # tmp now holds the old folder
        elif target.is_dir():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".swap", dir=parent))
            os.replace(target, old / "old")
            os.replace(tmp, target)
            tmp = old
        else:
            os.replace(tmp, target)
            return target
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise UserError(f"no space left to write {target}: free some and run again") from None
        raise
    shutil.rmtree(tmp, ignore_errors=True)
    return target


def compact_copy(path: Path) -> bytes:
    """A file's bytes as a committed folder keeps it (a units folder: `decision.units.collect_units`).
    Parquet is re-encoded losslessly for size: zstd at level 19, floats byte-stream split (a
    flash_reinforce unit's per-token logprobs: 4.4 MB instead of the run's 7.0 MB of snappy, which
    the run writes for speed). The table is read back equal, metadata too, before it is kept. Any
    other file is kept as it is."""
    import io

    if path.suffix != ".parquet":
        return path.read_bytes()
    table = pq.read_table(path)
    floats = {f.name: f.name if pa.types.is_floating(f.type) else f"{f.name}.list.element" for f in table.schema
              if pa.types.is_floating(f.type) or (pa.types.is_list(f.type) and pa.types.is_floating(f.type.value_type))}
    buffer = io.BytesIO()
    pq.write_table(table, buffer, compression="zstd", compression_level=19, use_byte_stream_split=list(floats.values()),
                   use_dictionary=[name for name in table.column_names if name not in floats])
    payload = buffer.getvalue()
    back = pq.read_table(io.BytesIO(payload))
    if not (back.equals(table) and back.schema.metadata == table.schema.metadata):
        raise RuntimeError(f"{path}: its zstd copy does not read back equal")  # a pyarrow defect; nothing kept
    return payload


def read_parquet(path: str | Path, schema: pa.Schema | None = None, required: Iterable[str] = ()) -> pa.Table:
    """Read a Parquet artifact; a missing file, unreadable file or missing column is a UserError."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: no such file")
    try:
        table = pq.read_table(path)
    except Exception as e:  # pyarrow raises several types for a corrupt file
        raise UserError(f"{path}: not a readable Parquet file ({type(e).__name__})") from None
    names = list(schema.names) if schema is not None else []
    missing = [c for c in [*names, *required] if c not in table.column_names]
    if missing:
        raise UserError(f"{path}: missing column(s) {', '.join(sorted(set(missing)))}")
    if schema is not None:
        try:
            table = table.select(schema.names).cast(schema)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as e:
            raise UserError(f"{path}: columns do not match the schema ({e})") from None
    return table


class _NonFinite:
    """What `Infinity`, `-Infinity` or `NaN` parse to here: JSON has no such numbers."""

    def __init__(self, text: str):
        self.text = text


class _Pairs(dict):
    """A JSON object that remembers the keys it was given more than once."""

    def __init__(self, pairs: list[tuple[str, object]]):
        super().__init__(pairs)
        seen: set[str] = set()
        self.duplicates = sorted({k for k, _ in pairs if k in seen or seen.add(k)})


def loads_strict(text: str, source: str) -> object:
    """Parse JSON as the standard defines it: a duplicate key or a non-finite number (`NaN`,
    `Infinity`, which Python's json accepts) is a UserError naming where it is, and so is
    nesting too deep to read. Objects come back as plain dicts."""
    try:
        data = json.loads(text, object_pairs_hook=_Pairs, parse_constant=_NonFinite)
    except json.JSONDecodeError as e:
        raise UserError(f"{source}: not valid JSON (line {e.lineno}, column {e.colno}: {e.msg})") from None
    except RecursionError:
        raise UserError(f"{source}: JSON nested too deeply to read") from None
    problems: list[str] = []
    try:
        data = _plain(data, "", problems)
    except RecursionError:
        raise UserError(f"{source}: JSON nested too deeply to read") from None
    if problems:
        raise UserError(f"{source}: not valid JSON: " + "; ".join(problems))
    return data


def _plain(value, path: str, problems: list[str]):
    where = path or "(top level)"
    if isinstance(value, _NonFinite):
        problems.append(f"{where}: {value.text} is not a JSON number")
        return None
    if isinstance(value, _Pairs):
        problems += [f"{where}: key {k!r} given more than once" for k in value.duplicates]
        return {k: _plain(v, f"{path}.{k}" if path else k, problems) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v, f"{path}.{i}" if path else str(i), problems) for i, v in enumerate(value)]
    return value


def file_sha256(path: Path) -> str:
    """A file's sha256, hex, read in 1 MiB blocks (stage outputs and collected units are proved by it)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
