"""Which dtype weights are held in, decided from this machine at run time: bfloat16 only where its matrix products
are native (CUDA, or a CPU whose /proc/cpuinfo flags include AVX512-BF16 or AMX-BF16), never by assumption.

    cpu_native_bf16()                 True on a CPU with native bf16 matrix products
    frozen_dtype(cfg, device, dtype)  the dtype of weights that never train (LoRA's base, the reference copy)
    to_dtype_lean(model, dtype)       a model loaded in its file's dtype, converted without the file's pages
"""

from __future__ import annotations

import gc
from pathlib import Path

import torch

__all__ = ["cpu_native_bf16", "frozen_dtype", "to_dtype_lean"]


def cpu_native_bf16(cpuinfo: str | None = None) -> bool:
    """True when this CPU multiplies bfloat16 natively: AVX512-BF16 or AMX-BF16 among /proc/cpuinfo's flags (read
    at run time, never assumed; elsewhere torch emulates bf16 matrix products, far slower than float32).
    `cpuinfo`: that file's text (tests)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return False
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines() if line.startswith("flags")), [])
    return "avx512_bf16" in flags or "amx_bf16" in flags


def frozen_dtype(cfg, device: torch.device, dtype: torch.dtype) -> torch.dtype:
    """The dtype of weights that never train (LoRA's base, the reference copy): model.frozen_dtype; auto is
    bfloat16 where its matrix products are native (CUDA, a CPU with cpu_native_bf16), else the policy's `dtype`."""
    name = cfg.model.frozen_dtype
    if name == "auto":
        native = device.type == "cuda" or (device.type == "cpu" and cpu_native_bf16())
        return torch.bfloat16 if native and dtype != torch.float16 else dtype
    return {"float32": torch.float32, "bfloat16": torch.bfloat16}[name]


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
