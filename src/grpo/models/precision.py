"""Which dtype weights are held in, decided from this machine at run time: bfloat16 only where its matrix products
are native (CUDA, or a CPU whose /proc/cpuinfo flags include AVX512-BF16 or AMX-BF16), never by assumption.

    cpu_native_bf16()                        True on a CPU with native bf16 matrix products (GRPO_CPU_BF16 may
                                             say native or none instead: the suite's switch)
    frozen_dtype(cfg, device, dtype)         the dtype weights that never train (LoRA's base, the reference copy)
                                             are computed in
    stores_linears_bf16(cfg, device, dtype)  True when those weights' linear layers are held in bf16 and computed
                                             in float32 (model.frozen_dtype=bfloat16 on a CPU without native bf16)
    store_linears_bf16(model)                does that to a model's linear layers (not its output head)
    float32_linears(model)                   undoes it (a copy that trains every weight: PPO's critic)
    to_dtype_lean(model, dtype)              a model loaded in its file's dtype, converted without the file's pages
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import torch

from grpo.errors import ConfigError

__all__ = ["BF16_FLAGS", "Bf16StoredLinear", "CPU_BF16_ENV", "cpu_bf16_flags", "cpu_native_bf16", "float32_linears",
           "frozen_dtype", "storable_linears", "store_linears_bf16", "stores_linears_bf16", "to_dtype_lean"]


CPU_BF16_ENV = "GRPO_CPU_BF16"  # native | none: decide as if the CPU had (or lacked) native bf16 (tests, docs/guide.md)
BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_bf16_flags(cpuinfo: str | None = None) -> list[str]:
    """The flags of native bf16 matrix products (AVX512-BF16, AMX-BF16) among /proc/cpuinfo's (`cpuinfo`: that
    file's text; tests), in BF16_FLAGS' order; [] when the file cannot be read."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return []
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return [f for f in BF16_FLAGS if f in flags]


def cpu_native_bf16(cpuinfo: str | None = None) -> bool:
    """True when this CPU multiplies bfloat16 natively: AVX512-BF16 or AMX-BF16 among /proc/cpuinfo's flags (read
    at run time, never assumed; elsewhere torch emulates bf16 matrix products, far slower than float32). Every
    `auto` choice that depends on the CPU asks this one function. The environment variable GRPO_CPU_BF16=native
    (or none) answers instead of the flags: the test suite run as if the CPU had (or lacked) native bf16.
    `cpuinfo`: that file's text (tests); the variable is not read then."""
    if cpuinfo is None:
        forced = os.environ.get(CPU_BF16_ENV, "").strip().lower()
        if forced:
            if forced not in ("native", "none"):
                raise ConfigError(f"{CPU_BF16_ENV}={os.environ[CPU_BF16_ENV]!r}: it takes native (decide as if the "
                                  "CPU had native bf16) or none (as if it had not); unset it to read /proc/cpuinfo")
            return forced == "native"
    return bool(cpu_bf16_flags(cpuinfo))


def frozen_dtype(cfg, device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype weights that never train (LoRA's base, the reference copy) are computed in: model.frozen_dtype;
    auto is bfloat16 where its matrix products are native (CUDA, a CPU with cpu_native_bf16), else the policy's
    `dtype`. bfloat16 on a CPU without native bf16 (and a float32 policy) computes in float32 from linear layers
    held in bfloat16 (stores_linears_bf16): there torch emulates bf16 products, 16-77x slower than float32
    (bench/results/bf16_matmul.json)."""
    name = cfg.model.frozen_dtype
    if name == "auto":
        return torch.bfloat16 if _native_bf16(device) and dtype != torch.float16 else dtype
    if stores_linears_bf16(cfg, device, dtype):
        return dtype
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


def stores_linears_bf16(cfg, device: torch.device, dtype: torch.dtype) -> bool:
    """True when the frozen weights' linear layers are held in bfloat16 and computed in float32: model.frozen_dtype
    is bfloat16, on a CPU without native bf16, for a float32 policy. Half their bytes (a Qwen2.5-1.5B LoRA base:
    6.2 GB -> 3.6 GB), the values of a bf16 model file exactly, for a cast per product (`Bf16StoredLinear`)."""
    return cfg.model.frozen_dtype == "bfloat16" and dtype == torch.float32 and not _native_bf16(device)


def _native_bf16(device: torch.device) -> bool:
    return device.type == "cuda" or (device.type == "cpu" and cpu_native_bf16())


class _Bf16WeightLinear(torch.autograd.Function):
    """y = x W^T + b with W held in bfloat16 and multiplied in x's dtype. Backward saves W itself (the bf16
    parameter), never the float32 copy autograd would keep for F.linear(x, W.float()); W gets no gradient."""

    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(weight)
        return torch.nn.functional.linear(x, weight.to(x.dtype), None if bias is None else bias.to(x.dtype))

    @staticmethod
    def backward(ctx, grad_out):
        (weight,) = ctx.saved_tensors
        grad_x = grad_out @ weight.to(grad_out.dtype) if ctx.needs_input_grad[0] else None
        grad_bias = grad_out.reshape(-1, grad_out.shape[-1]).sum(0) if ctx.needs_input_grad[2] else None
        return grad_x, None, grad_bias


class Bf16StoredLinear(torch.nn.Linear):
    """A frozen linear layer whose weight is held in bfloat16 (2 bytes per value) and cast to the input's dtype
    for each product: on a CPU without native bf16 the cast costs ~4% of a training forward's product (4096 rows)
    and ~3x a decoding step's (32 rows), where the product is bound by memory."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.weight.requires_grad:  # the Function gives the weight no gradient: never train it silently
            raise RuntimeError("a Bf16StoredLinear's weight is frozen (held in bf16); to train the layer, make it a "
                               "float32 nn.Linear first (models/precision.py float32_linears)")
        return _Bf16WeightLinear.apply(x, self.weight, self.bias)

    def _apply(self, fn, recurse=True):
        """.to(device, dtype), .float(), ...: the weight moves but stays bfloat16 (one layer's copy at a time), so
        a model converted after its linear layers were held (models/loading.py) never holds them in float32."""
        super()._apply(fn, recurse)
        if self.weight.dtype != torch.bfloat16:
            self.weight.data = self.weight.data.to(torch.bfloat16)
        return self

    @classmethod
    def holding(cls, linear: torch.nn.Linear) -> Bf16StoredLinear:
        """`linear`'s weight in bf16, frozen; its bias (the same parameter) as it is."""
        layer = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, device="meta")
        layer.weight = torch.nn.Parameter(linear.weight.detach().to(torch.bfloat16), requires_grad=False)
        layer.bias = linear.bias
        return layer

    def as_float32(self) -> torch.nn.Linear:
        """A plain nn.Linear of this layer's values, its weight in float32 (exact) and trainable."""
        layer = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None, device="meta")
        layer.weight = torch.nn.Parameter(self.weight.detach().float())
        layer.bias = self.bias
        return layer


def storable_linears(model: torch.nn.Module) -> list[tuple[torch.nn.Module, str, torch.nn.Linear]]:
    """(parent, attribute, layer) of each nn.Linear of `model` but its output head (tied to the input embedding in
    most small models; the chunked log-prob head multiplies it in the compute dtype, algo/logprobs.py)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    return _children(model, lambda m: isinstance(m, torch.nn.Linear) and m is not head
                     and not isinstance(m, Bf16StoredLinear))


def _children(model: torch.nn.Module, select) -> list[tuple[torch.nn.Module, str, torch.nn.Module]]:
    """(parent, attribute, module) of each submodule of `model` that `select` takes, listed before any is replaced."""
    return [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
            if select(child)]


def float32_linears(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with each Bf16StoredLinear replaced by a plain float32 nn.Linear of the same values (bf16 -> float32
    is exact), trainable again: for a copy that trains all its weights (PPO's critic from the policy)."""
    for parent, name, held in _children(model, lambda m: isinstance(m, Bf16StoredLinear)):
        setattr(parent, name, held.as_float32())
    return model


def store_linears_bf16(model: torch.nn.Module) -> torch.nn.Module:
    """`model` with its linear layers but the head (storable_linears) held in bfloat16 and computed in float32,
    frozen; the rest (embeddings, norms, biases) as it was. One layer at a time: each weight is freed as its bf16
    copy is made (a bf16 weight is kept as it is: a model loaded from a bf16 file is held before it is converted,
    so its linear layers are never float32)."""
    for parent, name, linear in storable_linears(model):
        setattr(parent, name, Bf16StoredLinear.holding(linear))
    return model


def to_dtype_lean(model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`model` (loaded with dtype="auto": its tensors still views of the memory-mapped file) in `dtype`, with the
    peak near the larger of the two copies rather than their sum.

    Why: from_pretrained(dtype=float32) of a bfloat16 file reads every tensor through the file's mapping, whose
    pages stay resident until the last view is gone, while the float32 copies are made: the Qwen2.5-1.5B shape
    peaked at 9.45 GB for 6.4 GB of weights. Copying the tensors out of the mapping first (the mapping is then
    released) and converting one parameter at a time peaked at 6.5 GB."""
    params = list(model.parameters())
    if all(p.dtype == dtype for p in params):
        return model
    with torch.no_grad():
        for p in params:
            p.data = p.data.clone()  # out of the file's mapping
    gc.collect()
    model.to(dtype)  # one parameter at a time: each old copy is freed as its new one is made
    model.config.dtype = dtype
    return model
