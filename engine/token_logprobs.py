"""Each target token's log-probability under the LM head, a chunk of tokens at a time, so a
microbatch's full-vocabulary logits never exist at once (forward or backward).

    lp_N = target_logprobs(hidden_N_D, targets_N, head_fn, head_params, chunk_rows, acc_dtype)

Forward, per chunk of c rows: logits_c = head_fn(hidden_c) in the model's dtype, upcast to
`acc_dtype`; keep only logsumexp(logits_c) and the target's logit, lp = logit[target] - lse.
Backward, per chunk: the logits are recomputed from the saved hidden states, d lp / d logits =
onehot(target) - softmax is formed in place in one c x V buffer (softmax = exp(logits - lse)),
and that goes back through `head_fn` by autograd -- so a head with trainable parameters (LoRA
on the LM head, `train_unembed`) gets its gradient as well as the hidden states. The math is
that of `log_softmax(head(h).to(acc)).gather(target)` and its autograd, in the same dtypes.

Why our own rather than Liger Kernel's fused linear cross-entropy (liger-kernel 0.8.5 installs
here and would travel to the GPU image as a pure-Python wheel): its kernels are Triton, CUDA
only, so the CPU tests could not run the code the H200 runs; the loss here is not a cross-
entropy but any function of per-token logprobs (importance sampling needs exp(lp - lp_old),
i.e. a per-token upstream gradient, which Liger reaches only through its newest
reduction="none" recompute path); and the work is the head matmul (cuBLAS either way) --
fusing the softmax pass into it saves a few percent of a training step, not memory.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch


class _TargetLogprobs(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden_N_D, targets_N, head_fn, chunk_rows, acc_dtype, *head_params):
        N = hidden_N_D.shape[0]
        lse_N = torch.empty(N, dtype=acc_dtype, device=hidden_N_D.device)
        lp_N = torch.empty(N, dtype=acc_dtype, device=hidden_N_D.device)
        with torch.no_grad():
            for a in range(0, N, chunk_rows):
                b = min(N, a + chunk_rows)
                logits = head_fn(hidden_N_D[a:b]).to(acc_dtype)
                lse_N[a:b] = torch.logsumexp(logits, dim=-1)
                lp_N[a:b] = logits.gather(1, targets_N[a:b, None]).squeeze(1) - lse_N[a:b]
                del logits
        ctx.save_for_backward(hidden_N_D, targets_N, lse_N)
        ctx.head_fn, ctx.chunk_rows, ctx.acc_dtype = head_fn, chunk_rows, acc_dtype
        ctx.head_params = head_params  # leaves (parameters): no need to version-check them
        return lp_N

    @staticmethod
    def backward(ctx, grad_lp_N):
        hidden_N_D, targets_N, lse_N = ctx.saved_tensors
        want_h = ctx.needs_input_grad[0]
        want_p = [i for i in range(len(ctx.head_params)) if ctx.needs_input_grad[5 + i]]
        grad_h = torch.empty_like(hidden_N_D) if want_h else None
        grad_p: list[torch.Tensor | None] = [None] * len(ctx.head_params)
        N, c = hidden_N_D.shape[0], ctx.chunk_rows
        for a in range(0, N, c):
            b = min(N, a + c)
            g_c = grad_lp_N[a:b].to(ctx.acc_dtype)
            h_c = hidden_N_D[a:b].detach().requires_grad_(want_h)
            with torch.enable_grad():
                z = ctx.head_fn(h_c)
            # d lp / d logits = (onehot(target) - softmax) * upstream, built in place in one buffer
            g = z.detach().to(ctx.acc_dtype).sub_(lse_N[a:b, None]).exp_().mul_(-g_c[:, None])
            g.scatter_add_(1, targets_N[a:b, None], g_c[:, None])
            wrt = ([h_c] if want_h else []) + [ctx.head_params[i] for i in want_p]
            if not wrt:
                break
            grads = list(torch.autograd.grad(z, wrt, g.to(z.dtype), allow_unused=True))
            del z, g
            if want_h:
                grad_h[a:b] = grads.pop(0)
            for i, gp in zip(want_p, grads):
                if gp is not None:
                    grad_p[i] = gp if grad_p[i] is None else grad_p[i] + gp
        return (grad_h, None, None, None, None, *grad_p)


def target_logprobs(hidden_N_D: torch.Tensor, targets_N: torch.Tensor,
                    head_fn: Callable[[torch.Tensor], torch.Tensor],
                    head_params: Sequence[torch.Tensor], chunk_rows: int,
                    acc_dtype: torch.dtype) -> torch.Tensor:
    """log_softmax(head_fn(hidden).to(acc_dtype))[n, targets[n]] for each row n: [N], acc_dtype.

    `head_params`: the tensors `head_fn` reads that may need a gradient (its trainable ones);
    frozen weights need not be listed."""
    return _TargetLogprobs.apply(hidden_N_D, targets_N, head_fn, max(1, int(chunk_rows)),
                                 acc_dtype, *head_params)


def lm_head_fn(model) -> Callable[[torch.Tensor], torch.Tensor]:
    """hidden states (the decoder's final-norm output) -> the logits `model` itself returns:
    its output embedding, then the logit scaling / final soft-capping some architectures apply
    after it (Cohere's `logit_scale`, Gemma-2's `final_logit_softcapping`)."""
    head = model.get_output_embeddings()
    cfg = model.config
    scale = getattr(cfg, "logit_scale", None)
    cap = getattr(cfg, "final_logit_softcapping", None)
    if scale in (None, 1, 1.0) and cap is None:
        return head

    def fn(h: torch.Tensor) -> torch.Tensor:
        z = head(h)
        if scale not in (None, 1, 1.0):
            z = z * scale
        if cap is not None:
            z = torch.tanh(z / cap) * cap
        return z

    return fn
