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

`hidden_token_logprobs` goes one step further for a plain linear output head: it takes the final hidden states
h (N, T, H) and the head's weight W (V, H) and never forms the (N, T, V) logits at all. Each chunk of rows
computes its logits x = h W^T, keeps two floats per row (the row's max and sum of exponentials), and drops them;
the backward pass recomputes each chunk's logits and turns them into the gradients directly,
    u_t = (onehot(y_t) - softmax(z_t)) * g_t / tau              (chunk, V), g the upstream gradient of logp_t
    dL/dh_t = u_t W,   dL/dW = sum_t u_t^T h_t
so the largest temporaries, forward and backward, are a few (chunk_size, V) blocks. The cost is the head's
matmul twice (forward and recomputed in the backward) instead of keeping its (N, T, V) output.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo.algo._checks import check_number, check_tensor

__all__ = ["token_logprobs", "entropy_from_logits", "hidden_token_logprobs"]


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


# ------------------------------------------------------------------ from hidden states and the head's weight
def _operand(x: Tensor, products: tuple[torch.dtype | None, bool]) -> Tensor:
    """x as the head's products take it: as it is (no product dtype), cast to the product dtype, or (emulated)
    rounded to it and kept in its own dtype."""
    dtype, emulated = products
    if dtype is None or x.dtype == dtype:
        return x
    y = x.to(dtype)
    return y.to(x.dtype) if emulated else y


def _product(a: Tensor, b: Tensor, products: tuple[torch.dtype | None, bool]) -> Tensor:
    """a @ b of operands already prepared by `_operand`, its result rounded to the product dtype when there is one
    (a bf16 unit's output; emulated: a float32 product of rounded operands, then rounded)."""
    out = torch.matmul(a, b)
    return out if products[0] is None else out.to(products[0])


def _head_logits(h: Tensor, weight_op: Tensor, temperature: float, dtype: torch.dtype,
                 products: tuple[torch.dtype | None, bool] = (None, False)) -> Tensor:
    """(c, H) @ (V, H)^T -> (c, V) tempered logits in `dtype`, a fresh tensor the caller may overwrite.
    weight_op: the weight as `_operand` gives it for `products`."""
    z = _product(_operand(h, products), weight_op.t(), products)
    z = z.to(dtype) if z.dtype != dtype else z
    return z.div_(temperature) if temperature != 1.0 else z


def _chunk_stats(z: Tensor, targets: Tensor, with_entropy: bool):
    """z (c, V) tempered logits (overwritten) -> (logp of targets, row max m, s = sum exp(z - m), entropy or None),
    each (c,). logp = (z_y - m) - log s; H = log s - sum_v e_v log e_v / s with e = exp(z - m). Keeping m and s
    apart (not lse = m + log s) keeps the softmax exp(z - m) / s of the backward pass accurate to one rounding of s
    at a vocabulary of 150k (lse rounds at the scale of the largest logit)."""
    m = z.amax(-1, keepdim=True)
    zm = z.sub_(m)
    picked = zm.gather(-1, targets[:, None])[:, 0]
    if not with_entropy:
        s = zm.exp_().sum(-1)  # in place: the chunk's one (c, V) block
        return picked - s.log(), m[:, 0], s, None
    e = zm.exp()
    s = e.sum(-1)
    # sum_v e_v (z_v - m) (finite: z = h W^T has no -inf): a product in place and a tree-reduced sum, 1.5x faster
    # than e log e; a bmm dot product is as fast but accumulates in a row, 100x the rounding over 150k entries
    weighted = zm.mul_(e).sum(-1)
    return picked - s.log(), m[:, 0], s, s.log() - weighted / s


class _HiddenTokenLogprob(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, temperature: float, chunk_size: int,
                with_entropy: bool, weight_grad_in_place: bool, products: tuple[torch.dtype | None, bool]):
        dtype = _compute_dtype(hidden)
        weight_op = _operand(weight, products)  # once, not per chunk
        rows = hidden.shape[0]
        logp = torch.empty(rows, dtype=dtype, device=hidden.device)
        row_max, row_sum = torch.empty_like(logp), torch.empty_like(logp)
        entropy = torch.empty(rows if with_entropy else 0, dtype=dtype, device=hidden.device)
        for a, b in _chunks(rows, chunk_size):
            z = _head_logits(hidden[a:b], weight_op, temperature, dtype, products)
            logp[a:b], row_max[a:b], row_sum[a:b], ent = _chunk_stats(z, targets[a:b], with_entropy)
            del z
            if with_entropy:
                entropy[a:b] = ent
        ctx.save_for_backward(hidden, weight, targets, row_max, row_sum)
        ctx.temperature, ctx.chunk_size, ctx.products = temperature, chunk_size, products
        # the weight itself (saved_tensors gives another Python object, whose .grad is not the parameter's)
        ctx.weight_param = weight if weight_grad_in_place and weight.is_leaf and weight.dtype == dtype else None
        ctx.mark_non_differentiable(entropy)
        return logp, entropy

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_logp: Tensor, _grad_entropy):
        hidden, weight, targets, row_max, row_sum = ctx.saved_tensors
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        tau, dtype = ctx.temperature, row_max.dtype
        grad_h = torch.empty_like(hidden) if need_h else None
        exact = weight.dtype == dtype  # fp32/fp64 weights accumulate in place; narrower ones in float32
        param = ctx.weight_param if need_w else None
        if param is not None:  # straight into .grad: autograd would hold this (V, H) and add it to .grad after
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            grad_w = param.grad
        else:
            grad_w = (torch.zeros_like(weight) if exact else torch.zeros_like(weight, dtype=torch.float32)) \
                if need_w else None
        products = ctx.products
        weight_op = _operand(weight, products)
        for a, b in _chunks(hidden.shape[0], ctx.chunk_size):
            h = hidden[a:b]
            g = grad_logp[a:b].to(dtype) / tau  # (c,)
            # exp(z - m), in place, z recomputed with the forward's products
            u = _head_logits(h, weight_op, tau, dtype, products).sub_(row_max[a:b, None]).exp_()
            u.mul_((-g / row_sum[a:b])[:, None]).scatter_add_(-1, targets[a:b, None], g[:, None])  # (onehot - p) g/tau
            u = u.to(weight.dtype)
            u_op = _operand(u, products)
            if need_h:
                grad_h[a:b] = _product(u_op, weight_op, products)
            if need_w and products[0] is not None:  # the chunk's part a bf16 product, as autocast's linear backward
                grad_w += _product(u_op.t(), _operand(h, products), products)  # makes it; accumulated in float32
            elif need_w and exact:  # in the weight's dtype: accumulated in place, no (V, H) temporary
                grad_w.addmm_(u.t(), h)
            elif need_w:
                grad_w += torch.matmul(u.t(), h)
            del u, u_op
        if param is not None:
            grad_w = None  # already in param.grad
        elif need_w and not exact:
            grad_w = grad_w.to(weight.dtype)
        return grad_h, grad_w, None, None, None, None, None, None


def hidden_token_logprobs(hidden: Tensor, weight: Tensor, targets: Tensor, *, temperature: float = 1.0,
                          chunk_size: int = 256, with_entropy: bool = False, weight_grad_in_place: bool = False,
                          product_dtype: torch.dtype | None = None,
                          emulated: bool = False) -> tuple[Tensor, Tensor | None]:
    """log softmax(hidden @ weight^T / temperature) at targets, without the (N, T, V) logits; differentiable.

    hidden: (N, T, H) final hidden states (after the last norm), any float dtype; weight: (V, H) the output head's
    weight (a linear head without bias), same dtype; targets: (N, T) integer ids in [0, V).
    Returns (logp (N, T), entropy (N, T) or None): float32 (float64 for float64 inputs). logp carries gradients to
    hidden and weight (recomputing each chunk's logits in the backward pass); the entropy of the tempered
    distribution is computed in the same pass when `with_entropy` and carries no gradient.
    Peak extra memory: a few (chunk_size, V) float32 blocks, forward and backward (plus a float32 (V, H)
    gradient accumulator when the weight is narrower than float32; with product_dtype, the weight as it takes it, a
    (V, H) bf16 copy (float32 when emulated), and one chunk's weight-gradient product of the same size).
    weight_grad_in_place: a leaf weight in the compute dtype gets its gradient added straight into `weight.grad`
    (created as zeros when None) and none is returned to autograd, which would hold a (V, H) tensor and then add it
    to .grad (a second one with a tied embedding: 1 GiB at 0.5B); the gradient is the same. Only for a plain
    backward() whose .grad nobody hooks: DDP's gradient hooks would not see it.
    product_dtype: None, or the dtype the head's products take their operands in and round their results to
    (bfloat16 under bf16 compute, models/compute.py): the logits (c, V) of forward and backward alike, the gradient
    to hidden, and each chunk's part of the weight's gradient (a (V, H) product in bf16, as autocast's linear
    backward makes it, added into a float32 accumulator); the log-softmax and its gradient stay in float32.
    emulated: operands rounded to product_dtype and multiplied in float32 (bf16's roundings on a CPU
    without native bf16). Autocast does not reach a custom backward, hence the explicit argument.
    """
    check_tensor("hidden", hidden, ndim=3)
    check_tensor("weight", weight, ndim=2)
    check_tensor("targets", targets, ndim=2)
    if not hidden.is_floating_point() or hidden.dtype != weight.dtype:
        raise ValueError(f"hidden ({hidden.dtype}) and weight ({weight.dtype}) must share one floating-point dtype")
    if weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"weight has shape {tuple(weight.shape)}; it must be (vocab, {hidden.shape[-1]}) for hidden "
                         f"of shape {tuple(hidden.shape)}")
    if targets.shape != hidden.shape[:2]:
        raise ValueError(f"targets has shape {tuple(targets.shape)}, but hidden has shape {tuple(hidden.shape)}; "
                         "targets must be hidden.shape[:2]")
    if targets.is_floating_point() or targets.dtype == torch.bool:
        raise ValueError(f"targets must be an integer tensor of token ids, got {targets.dtype}")
    check_number("temperature", temperature, low=0.0, low_open=True)
    check_number("chunk_size", chunk_size, low=1, integer=True)
    flat = hidden.reshape(-1, hidden.shape[-1])
    logp, entropy = _HiddenTokenLogprob.apply(flat, weight, targets.reshape(-1).long(), float(temperature),
                                              int(chunk_size), bool(with_entropy), bool(weight_grad_in_place),
                                              (product_dtype, bool(emulated)))
    return logp.view(targets.shape), entropy.view(targets.shape) if with_entropy else None
