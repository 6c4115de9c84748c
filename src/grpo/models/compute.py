"""The precision the training forwards and backwards compute in (model.compute_dtype), decided at run time.

    compute = resolve_compute(cfg, device, weights_dtype)   "weights" | "bfloat16" | "bfloat16_emulated"
    with compute_context(compute, device):                   the policy's (and pi_old's, pi_ref's) forward
        logp = ...                                           the backward runs in what the forward recorded
    head_products()                                          inside the block: how the chunked log-prob head
                                                             multiplies (models/forward.py passes it to algo)

"weights": every product in the weights' dtype (float32 on the CPU, bfloat16 on CUDA with model.dtype=auto).
"bfloat16": float32 master weights (the optimizer's), products in bfloat16 (`torch.autocast`): matmuls, linear
    layers and attention take bf16 operands and give bf16 results, as every framework's mixed precision does; the
    log-softmax, the loss and the optimizer stay float32. Where bf16 products are native (a CPU with AVX512-BF16 or
    AMX, models/precision.py cpu_native_bf16) that is what model.compute_dtype=auto picks for float32 weights.
"bfloat16_emulated": the same roundings without native bf16: each product's operands rounded to bf16 and
    multiplied in float32 (a product of two bf16 values is exact in float32, and native bf16 units accumulate in
    float32 too), its result rounded to bf16 and returned as a bf16 tensor, so what follows runs as under autocast.
    Slower than float32; it answers, on a CPU without native bf16, how a run learns with bf16 compute
    (grpo.bench.precision_learning).

Generation (rollouts, evaluation) is not affected: it runs in the weights' dtype.
"""

from __future__ import annotations

import contextlib
import contextvars
import logging

import torch
from torch.overrides import TorchFunctionMode

from grpo.errors import ConfigError

log = logging.getLogger("grpo.models")

__all__ = ["COMPUTE_MODES", "Bf16Emulation", "compute_context", "head_products", "resolve_compute"]

COMPUTE_MODES = ("weights", "bfloat16", "bfloat16_emulated")
_HEAD = contextvars.ContextVar("grpo_head_products", default=None)
_warned: list[str] = []  # the slow-emulation warning, once a process


def resolve_compute(cfg, device: torch.device, dtype: torch.dtype) -> str:
    """model.compute_dtype for weights of `dtype` on `device` (one of COMPUTE_MODES); ConfigError for a mix that
    has no meaning (bf16 compute of float16 weights, float32 compute of bf16 weights).

    auto: "bfloat16" when model.dtype=auto gave float32 weights on a CPU with native bf16 products, else "weights"
    (an explicit model.dtype=float32 keeps float32 compute; CUDA's auto weights are bf16 already)."""
    from grpo.models.precision import cpu_native_bf16

    name = cfg.model.compute_dtype
    if name == "auto":
        native = device.type == "cpu" and cpu_native_bf16()
        return "bfloat16" if native and cfg.model.dtype == "auto" and dtype == torch.float32 else "weights"
    if name == "float32":
        if dtype != torch.float32:
            raise ConfigError(f"model.compute_dtype=float32 with {_name(dtype)} weights: float32 compute needs float32 "
                              "weights (model.dtype=float32)")
        return "weights"
    if dtype == torch.bfloat16 and name == "bfloat16":
        return "weights"  # bf16 weights compute in bf16 already
    if dtype != torch.float32:
        raise ConfigError(f"model.compute_dtype={name} with {_name(dtype)} weights: bf16 compute keeps float32 master "
                          "weights (model.dtype=float32, or auto on the CPU)")
    if name == "bfloat16_emulated" and cfg.model.gradient_checkpointing is True:
        raise ConfigError("model.compute_dtype=bfloat16_emulated with model.gradient_checkpointing=true: the layers "
                          "recomputed in the backward would run outside the emulation; turn checkpointing off (or "
                          "use bfloat16)")
    if name == "bfloat16" and device.type == "cpu" and not cpu_native_bf16() and not _warned:
        _warned.append(name)
        log.warning("model.compute_dtype=bfloat16 on a CPU without native bf16 (no avx512_bf16 or amx_bf16 in "
                    "/proc/cpuinfo): torch emulates bf16 matrix products there, far slower than float32 "
                    "(bench/results/bf16_matmul.json); bfloat16_emulated gives the same roundings faster")
    return name


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


@contextlib.contextmanager
def compute_context(compute: str, device: torch.device):
    """The block's forwards compute as `compute` says (see the module docstring); their backward follows what was
    recorded. Nests: an inner "weights" block switches autocast off."""
    if compute not in COMPUTE_MODES:
        raise ValueError(f"compute must be one of {COMPUTE_MODES}, got {compute!r}")
    token = _HEAD.set(None if compute == "weights" else compute)
    try:
        if compute == "bfloat16":
            with torch.autocast(device.type, dtype=torch.bfloat16):
                yield
        elif compute == "bfloat16_emulated":  # autocast on: code that switches it off (rotary angles) is seen
            with torch.autocast(device.type, dtype=torch.bfloat16), Bf16Emulation(device.type):
                yield
        else:
            with torch.autocast(device.type, enabled=False):
                yield
    finally:
        _HEAD.reset(token)


def head_products() -> tuple[torch.dtype | None, bool]:
    """(the dtype the chunked log-prob head's products take their operands in, None for its inputs'; emulated)
    for the compute_context the caller is in. The head is an autograd.Function whose backward runs outside the
    block, so it is told explicitly rather than left to autocast."""
    mode = _HEAD.get()
    return (None, False) if mode is None else (torch.bfloat16, mode == "bfloat16_emulated")


def _round(x):
    """A float32 tensor rounded to bf16 values, kept float32 (exact: every bf16 value is a float32 value)."""
    if isinstance(x, torch.Tensor) and x.dtype in (torch.float32, torch.bfloat16):
        return x.to(torch.bfloat16).float()
    return x


class Bf16Emulation(TorchFunctionMode):
    """Within the block (and inside a bf16 torch.autocast, which it relies on: where code switches autocast off,
    such as transformers' rotary angles, products stay float32), the products autocast runs in bf16 (matmul,
    linear, attention) take operands rounded to bf16, multiply in float32 with autocast off, and return their
    result rounded, as a bf16 tensor. The casts are recorded by autograd, so the backward's gradients are rounded
    where autocast's would be (its products run in float32)."""

    PRODUCTS = {torch.nn.functional.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm,
                torch.Tensor.mm, torch.bmm, torch.Tensor.bmm, torch.addmm, torch.Tensor.addmm, torch.baddbmm,
                torch.Tensor.baddbmm, torch.addbmm, torch.einsum, torch.nn.functional.scaled_dot_product_attention}

    def __init__(self, device_type: str = "cpu"):
        super().__init__()
        self.device_type = device_type

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if (func not in self.PRODUCTS or not torch.is_autocast_enabled(self.device_type)
                or any(isinstance(a, torch.Tensor) and a.dtype == torch.float64 for a in args)):  # as autocast
            return func(*args, **kwargs)
        with torch.autocast(self.device_type, enabled=False):
            if func is torch.nn.functional.scaled_dot_product_attention:
                out = _attention(*args, **kwargs)
            else:
                out = func(*(_round(a) for a in args), **{k: _round(v) for k, v in kwargs.items()})
        return out.to(torch.bfloat16) if isinstance(out, torch.Tensor) and out.is_floating_point() else out


def _attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """scaled_dot_product_attention with the roundings of torch's CPU kernel for bf16 (FlashAttentionKernel.cpp):
    bf16 q, k, v; the scores, their softmax's max and sum in float32; exp(score - max) rounded to bf16 for the
    product with v, which accumulates in float32; the output rounded to bf16. (N, heads, L, d) in and out."""
    if dropout_p:
        raise ValueError("bfloat16_emulated: attention dropout is not emulated")
    q, k, v = _round(query), _round(key), _round(value)
    if enable_gqa and k.shape[-3] != q.shape[-3]:
        k = k.repeat_interleave(q.shape[-3] // k.shape[-3], dim=-3)
        v = v.repeat_interleave(q.shape[-3] // v.shape[-3], dim=-3)
    scores = torch.matmul(q, k.transpose(-2, -1)) * (scale if scale is not None else q.shape[-1] ** -0.5)
    L, S = scores.shape[-2:]
    if is_causal:
        scores = scores.masked_fill(~torch.ones(L, S, dtype=torch.bool, device=q.device).tril(), -torch.inf)  # as torch
    if attn_mask is not None:
        scores = scores.masked_fill(~attn_mask, -torch.inf) if attn_mask.dtype == torch.bool \
            else scores + attn_mask.float()
    top = scores.amax(-1, keepdim=True).detach().clamp(min=torch.finfo(torch.float32).min)
    e = (scores - top).exp()
    total = e.sum(-1, keepdim=True).clamp(min=torch.finfo(torch.float32).tiny)  # a row with no key (left padding): 0
    return torch.matmul(e.to(torch.bfloat16).float(), v) / total
