"""The `local` backend: tinker's client surface over torch + transformers + peft, in process.

    service = make_service_client("local", device=None, dtype=None, cache_dir=None)
    tc = service.create_lora_training_client(base_model, rank=32, seed=0).result()
    sc = tc.save_weights_and_get_sampling_client().result()
    resp = sc.sample(prompt, num_samples, types.SamplingParams(...)).result()

Every call returns a future (`LocalFuture`: `.result()`, `await`, `.future()`); values in and
out are real `tinker.types`. Client-creating calls return a `LocalClientFuture`, usable as the
client too, as tinker 0.38's are.

Modules: `engine` (the base: model, worker, request queue and gather, adapters), `sampler` (the
`Sampler` protocol the engine decodes, scores and embeds through, and `GeneratorSampler` over
`engine/generate.py`), `learner` (forward_backward, microbatches, compiled layers, the
non-finite checks), `clients` (tinker's client classes), `settings` (`EngineSettings`, `LoraSpec`,
the learner's rules, the compile cache).

Execution: one *base* per (model, device) (`engine._Base`): the model loaded once, its tokenizer, and
one worker thread that runs every device job of every client in submission order (forward,
forward_backward, optim_step, save/load, sample batches). Each training client is a LoRA adapter
on that base (`_Adapter`: a named peft adapter with its own float32 weights; the client's AdamW
state is over those alone), so each added arm costs its adapter, optimizer state and
activations, never another model. Training stays per adapter: a client's forward_backward makes
its adapter peft's active one, and the others get no gradient. Sampling clients are snapshots
of an adapter's weights (`lora_bank.AdapterWeights`, copied at save time), so later optim steps
never change an existing sampling client.

Batching: `sample` and `compute_logprobs` only queue a request. The queue is flushed into
the sampler's batched generation (left-padded rows, one prefill per distinct (adapter, prompt) shared by its
samples, which also gives `include_prompt_logprobs`, then one decode step per token with a KV
cache) when a caller first waits on any queued future (`.result()`, `await`, `.future()`), or
when `max_batch_rows` rows are queued. A batch may hold rows of many adapters: each row carries
its adapter and the adapter bank (`engine/lora_bank.py`) adds every row's own LoRA addon
inside the one (captured, compiled) decode step, in the bank's decode form (`bank_decode`). On CUDA
(`batch_across_clients`) a batch takes every client's requests queued when it starts -- every
arm's and seed's step samples, held-out and eval requests -- and a flush first waits for the
other sampling training clients still in their step to queue theirs and wait on them
(`engine._Base._gather`: a client is in its step from the return of its samples until it next waits on
samples), so arms in parallel threads step together. On the CPU a batch holds one sampling client's requests alone:
its composition depends only on that client's submission order, so seeded runs are bit-identical
whatever the other threads do. A loop that submits every request of a step before awaiting any
(as the cookbook's does) gets one batch per step. `batch_window_s > 0` also waits that long
after a flush is asked for (thread-per-rollout callers).

Devices: with several GPUs and `device="cuda"`, each new client goes to the GPU of the clients
with its `user_metadata["placement"]` key (a run's units of one seed), else to the GPU holding the
fewest live adapters (`LocalServiceClient.place`), one base on each GPU it uses. The compiled
decode step is one per process (`engine.generate`), its kernels kept on disk between processes
(`compile_cache_dir`).

Numerics: fp32 on CPU, bf16 on CUDA (LoRA weights and AdamW state stay fp32); override with
`dtype=`. Loss "importance_sampling" is exactly `-sum_t exp(lp_t - sampler_lp_t) * A_t` over
every position of every datum, no normalisation; "cross_entropy" is `-sum_t w_t * lp_t`.
The learner never holds a microbatch's full-vocabulary logits: it runs the decoder, then the
LM head a chunk of tokens at a time, keeping each target token's logprob
(`token_logprobs.target_logprobs`, recomputed in backward). Each adapted projection adds the
trained adapter's LoRA through `lora_bank.LoraAddon` (peft's float32 arithmetic, fewer passes;
`learner_lora="fused-base"` the same in the base's dtype: through the compiled layers on an
H100 (torch 2.11) it got no LoRA gradient at all, results/h200-engine/h100-s28, and warns there;
`learner_lora="peft"` runs peft's own path). On CUDA those float32 matmuls, and the adapter
bank's in decode, run as TF32 (`use_tf32`; `GS1_TF32=0`: IEEE float32).
The decoder layers are gradient-checkpointed
(`gradient_checkpointing=True`: one more decoder forward, one hidden state per layer kept) where
a microbatch's activations would crowd the machine's memory on the CPU (`checkpoint_learner`),
or, on CUDA, where even a microbatch cut to fit the GPU's share would be under 4,096 tokens
(`learner_memory`: a card that must cut trains smaller microbatches unchecked); otherwise they
keep their activations, and on CUDA they run through
torch.compile (`compile_learner`, from a client's third forward_backward: one graph for every
layer and shape; a failed compile falls back to the eager layers).
The learner right-pads each microbatch and passes no attention mask: under causal attention
that is exact, and it keeps training off the masked SDPA kernels of the cuDNN backward defect
(`engine/attention.py`; a CUDA engine also turns cuDNN attention off process-wide and
refuses to start when the defect's reproduction gives a non-finite gradient through the
learner's attention). Each microbatch's logprobs, loss and accumulated LoRA gradient are checked
after its backward: the first non-finite one drops the call's gradients, makes the next
`optim_step` refuse, writes a dump (`_dump_nonfinite`: adapter and optimizer state, datums,
microbatch layout, settings, versions) and raises `NonFiniteStep` naming the microbatch, the
datum and the token (`HiddenStateGradients`); `gs1 replay` reruns the dump (`engine/replay.py`).
Gradients accumulate over forward_backward calls until `optim_step`, which runs
torch.optim.AdamW with the AdamParams' lr, (beta1, beta2), eps, weight_decay, and clips the
global grad norm when `grad_clip_norm > 0`.

Paths: `save_state`, `save_weights_for_sampler` write real directories under
`<cache_dir>/runs/<model_id>/{state,sampler_weights}/<name>/` (a peft adapter directory plus,
for state, `optimizer.pt`) and return their absolute path; loaders take that path, with or
without a `local://` prefix. `cache_dir` defaults to `$GS1_LOCAL_CACHE` or a fresh temp dir.

Sampled logprobs are those of the distribution sampled from (temperature-scaled; see
`engine.generate`); at temperature 1 they equal the learner's logprobs.
"""

from __future__ import annotations

from engine.clients import (
    META_FILE,
    NONFINITE_DATUMS,
    NONFINITE_LAYOUT,
    NONFINITE_SETTINGS,
    LocalSamplingClient,
    LocalServiceClient,
    LocalTrainingClient,
    datum_from_tensors,
    datum_tensors,
    usage_lines,
)
from engine.learner import Microbatch
from engine.settings import (
    EngineSettings,
    LearnerMemory,
    LoraSpec,
    checkpoint_learner,
    compile_cache_dir,
    learner_activation_bytes,
    learner_memory,
    pin_compile_cache,
    use_tf32,
)

__all__ = [
    "META_FILE", "NONFINITE_DATUMS", "NONFINITE_LAYOUT", "NONFINITE_SETTINGS", "EngineSettings",
    "LearnerMemory", "LocalSamplingClient", "LocalServiceClient", "LocalTrainingClient", "LoraSpec", "Microbatch",
    "checkpoint_learner", "compile_cache_dir", "datum_from_tensors", "datum_tensors", "learner_activation_bytes",
    "learner_memory", "pin_compile_cache", "use_tf32", "usage_lines",
]
