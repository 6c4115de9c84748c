"""Token log-probabilities and entropies from logits, a chunk of positions at a time.

For logits x (N, T, V) and temperature tau, the log-probability of target token y at each position is

    logp_t = x_t[y_t] / tau - logsumexp(x_t / tau)

and the entropy of the distribution is H_t = -sum_v p_v log p_v = logsumexp(z) - sum_v p_v z_v, with z = x / tau.

Both are computed in float32 (float64 for float64 logits) over chunks of `chunk_size` positions (rows of the
flattened (N*T, V) logits), so at most one chunk's float32 log-softmax exists at a time, also in the backward pass:
custom autograd functions save only the logits (in their own dtype) and one float per position, and recompute each
chunk's softmax when the gradient is needed. The gradients are the exact ones,
    d logp_t / d x_t = (onehot(y_t) - softmax(z_t)) / tau,    d H_t / d x_t = -p_t * (log p_t + H_t) / tau.
The gradient with respect to the logits, a tensor of the logits' size and dtype, is the only full-size allocation.
A non-contiguous logits view (e.g. logits[:, :-1]) is copied once, in its own dtype, to flatten it.
Logits of -inf (a banned token) are allowed: they get probability 0 and contribute 0 to the entropy.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.algo._checks import check_number, check_tensor

__all__ = ["token_logprobs", "entropy_from_logits"]


def _flat(logits: Tensor) -> Tensor:
    """(N, T, V) -> (N*T, V): a view when the layout allows it (else one copy, e.g. for logits[:, :-1])."""
    return logits.reshape(-1, logits.shape[-1])


def _compute_dtype(logits: Tensor) -> torch.dtype:
    """float64 stays float64; every narrower float type is computed in float32."""
    return torch.float64 if logits.dtype == torch.float64 else torch.float32


def _chunks(rows: int, chunk_size: int):
    for start in range(0, rows, chunk_size):
        yield start, min(start + chunk_size, rows)


def _zero_at_banned(x: Tensor, logp: Tensor) -> Tensor:
    """x with 0 where logp is -inf (0 * -inf = NaN there); a NaN from NaN logits still shows."""
    return x.where(logp != -torch.inf, 0)


class _TokenLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, temperature: float, chunk_size: int) -> Tensor:
        dtype = _compute_dtype(logits)
        out = torch.empty(logits.shape[0], dtype=dtype, device=logits.device)
        lse = torch.empty_like(out)
        for a, b in _chunks(logits.shape[0], chunk_size):
            z = logits[a:b].to(dtype) / temperature
            lse[a:b] = torch.logsumexp(z, dim=-1)
            out[a:b] = z.gather(-1, targets[a:b, None]).squeeze(-1) - lse[a:b]
        ctx.save_for_backward(logits, targets, lse)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        logits, targets, lse = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for a, b in _chunks(logits.shape[0], ctx.chunk_size):
            g = grad_out[a:b, None].to(lse.dtype)
            p = (logits[a:b].to(lse.dtype) / ctx.temperature - lse[a:b, None]).exp()
            chunk = (-p * g).scatter_add_(-1, targets[a:b, None], g)
            grad[a:b] = chunk / ctx.temperature
        return grad, None, None, None


class _Entropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, logits: Tensor, temperature: float, chunk_size: int) -> Tensor:
        dtype = _compute_dtype(logits)
        out = torch.empty(logits.shape[0], dtype=dtype, device=logits.device)
        for a, b in _chunks(logits.shape[0], chunk_size):
            logp = torch.log_softmax(logits[a:b].to(dtype) / temperature, dim=-1)
            out[a:b] = -_zero_at_banned(logp.exp() * logp, logp).sum(-1)
        ctx.save_for_backward(logits, out)
        ctx.temperature, ctx.chunk_size = temperature, chunk_size
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: Tensor):
        logits, entropy = ctx.saved_tensors
        grad = torch.empty_like(logits)
        for a, b in _chunks(logits.shape[0], ctx.chunk_size):
            logp = torch.log_softmax(logits[a:b].to(entropy.dtype) / ctx.temperature, dim=-1)
            dh = -_zero_at_banned(logp.exp() * (logp + entropy[a:b, None]), logp)
            grad[a:b] = dh * grad_out[a:b, None].to(entropy.dtype) / ctx.temperature
        return grad, None, None


def _check(logits: Tensor, temperature: float, chunk_size: int) -> None:
    check_tensor("logits", logits, ndim=3)
    if not logits.is_floating_point():
        raise ValueError(f"logits must be floating point, got {logits.dtype}")
    check_number("temperature", temperature, low=0.0, low_open=True)
    check_number("chunk_size", chunk_size, low=1, integer=True)


def token_logprobs(logits: Tensor, targets: Tensor, *, temperature: float = 1.0, chunk_size: int = 1024) -> Tensor:
    """log softmax(logits / temperature) gathered at targets, chunked over positions; differentiable.

    logits: (N, T, V), any float dtype.  targets: (N, T) integer token ids in [0, V).
    Returns (N, T) float32 (float64 for float64 logits).  Peak extra memory is one (chunk_size, V) float32 block,
    forward and backward.
    """
    _check(logits, temperature, chunk_size)
    check_tensor("targets", targets, ndim=2)
    if targets.shape != logits.shape[:2]:
        raise ValueError(
            f"targets has shape {tuple(targets.shape)}, but logits has shape {tuple(logits.shape)}; "
            "targets must be logits.shape[:2]"
        )
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise ValueError(f"targets must be an integer tensor of token ids, got {targets.dtype}")
    flat = _TokenLogprob.apply(_flat(logits), targets.reshape(-1).long(), float(temperature), chunk_size)
    return flat.reshape(targets.shape)


def entropy_from_logits(logits: Tensor, *, temperature: float = 1.0, chunk_size: int = 1024) -> Tensor:
    """Entropy of softmax(logits / temperature) at each position, chunked over positions; differentiable.

    logits: (N, T, V).  Returns (N, T) float32 (float64 for float64 logits); masking is the caller's.
    """
    _check(logits, temperature, chunk_size)
    return _Entropy.apply(_flat(logits), float(temperature), chunk_size).reshape(logits.shape[:2])
